"""floor, ceil and trunc of float CrypTensors, exactly (protocol.round_exact).

floor(x) = round_exact(x - 1/2 ulp-of-integer, precision): 6 rounds between 2 parties, no
+-1 error. trunc (toward zero, like torch's float -> int cast) takes floor(x) and
-floor(-x) in one rounding call and selects by [x < 0] with the B2A fold: 13 rounds.
"""

from __future__ import annotations

import torch

from ..cryptensor import CrypTensor, _record
from ..mpc import protocol
from ._common import public_share


def _floor_ints(share: torch.Tensor, prec: int) -> torch.Tensor:
    """Integer shares of floor(x) for x at `prec` (exact, |x| < 2^61 encoded)."""
    if prec == 0:
        return share
    return protocol.round_exact(share - public_share(torch.full_like(share, 1 << (prec - 1))), prec)


def _float_out(x: CrypTensor, ints: torch.Tensor, op: str) -> CrypTensor:
    out = CrypTensor(ints << x.precision, x.precision, x.dtype, x._names)
    return _record(out, op, (x,))


def floor(x: CrypTensor) -> CrypTensor:
    """Largest integer <= x (exact), in x's dtype."""
    if not x.dtype.is_floating_point:
        return x
    return _float_out(x, _floor_ints(x.share, x.precision), "floor")


def ceil(x: CrypTensor) -> CrypTensor:
    """Smallest integer >= x (exact), in x's dtype."""
    if not x.dtype.is_floating_point:
        return x
    return _float_out(x, -_floor_ints(-x.share, x.precision), "ceil")


def _trunc_ints(x: CrypTensor) -> torch.Tensor:
    flat = x.share.reshape(-1)
    n = flat.numel()
    both = _floor_ints(torch.cat([flat, -flat]), x.precision)
    down, up = both[:n], -both[n:]                  # floor(x), ceil(x)
    words = protocol.msb_words(flat)                  # [x < 0]
    (pick,) = protocol.finish((), [(words, (n,), up - down)])[1]
    return (down + pick).view(x.shape)


def trunc(x: CrypTensor) -> CrypTensor:
    """x rounded toward zero (exact), in x's dtype."""
    if not x.dtype.is_floating_point:
        return x
    return _float_out(x, _trunc_ints(x), "trunc")


def trunc_toward_zero(x: CrypTensor) -> CrypTensor:
    """The float -> int64 cast (CrypTensor.to calls it as _trunc_toward_zero)."""
    return CrypTensor(_trunc_ints(x), 0, torch.int64, x._names)
