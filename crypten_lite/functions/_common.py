"""Helpers shared by the function modules: scales, public operands, batched products."""

from __future__ import annotations

from typing import Sequence

import torch

from .. import encoding
from ..cryptensor import CrypTensor, _unify, default_precision
from ..mpc import beaver, primitives, truncation
from ..session import current


def rank0() -> bool:
    return current().rank == 0


def public_share(encoded: torch.Tensor) -> torch.Tensor:
    """A public encoded tensor as a share: rank 0 holds it, the others zero."""
    return encoded if rank0() else torch.zeros_like(encoded)


def as_private(x, like: CrypTensor) -> CrypTensor:
    """x if private, else a public CrypTensor at like's scale."""
    if isinstance(x, CrypTensor):
        return x
    t = torch.as_tensor(x)
    if t.is_floating_point() or like.dtype.is_floating_point:
        prec = like.precision if like.precision > 0 else default_precision()
        dtype = like.dtype if like.dtype.is_floating_point else torch.float32
        return CrypTensor._public(t.double(), prec, dtype)
    return CrypTensor._public(t.long(), 0, torch.int64)


def diff_share(x: CrypTensor, y) -> torch.Tensor:
    """Shares of x - y at a common scale (any scale keeps the sign); y private or public."""
    if isinstance(y, CrypTensor):
        p = max(x.precision, y.precision)
        return x._rescaled(p, x.dtype) - y._rescaled(p, y.dtype)
    t = torch.as_tensor(y)
    p = x.precision
    if t.is_floating_point() and p == 0:
        p = default_precision()
    enc = encoding.encode(t, p)
    xs = x._rescaled(p, x.dtype)
    return xs - public_share(enc)


def float_view(x: CrypTensor) -> CrypTensor:
    """x as a float CrypTensor (integers and bools are rescaled, exactly)."""
    return x if x.dtype.is_floating_point else x.float()


def truncate(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Shares of x / 2^bits (the core protocol: local for 2 parties, dealer-assisted otherwise)."""
    return truncation.truncate(x, bits)


def beaver_mul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Elementwise Beaver product of shares (one round)."""
    return beaver.beaver("mul", x, y)


def mul_shares(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
    """Untruncated products of several pairs of shares in ONE Beaver round."""
    shapes = [torch.broadcast_shapes(a.shape, b.shape) for a, b in pairs]
    xs = [torch.broadcast_to(a, s).reshape(-1) for (a, _), s in zip(pairs, shapes)]
    ys = [torch.broadcast_to(b, s).reshape(-1) for (_, b), s in zip(pairs, shapes)]
    z = beaver_mul(torch.cat(xs), torch.cat(ys))
    out, off = [], 0
    for s, t in zip(shapes, xs):
        out.append(z[off:off + t.numel()].view(s))
        off += t.numel()
    return out


def mul_trunc(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], bits: int) -> list[torch.Tensor]:
    """Products of several pairs, each truncated by `bits`, in one Beaver (+ one truncation)."""
    prods = mul_shares(pairs)
    if bits == 0:
        return prods
    flat = truncate(torch.cat([p.reshape(-1) for p in prods]), bits)
    out, off = [], 0
    for p in prods:
        out.append(flat[off:off + p.numel()].view(p.shape))
        off += p.numel()
    return out


def powers(x: torch.Tensor, degree: int, prec: int) -> dict[int, torch.Tensor]:
    """Shares of x^1..x^degree (all at `prec`) in ceil(log2 degree) product rounds."""
    pw = {1: x}
    have = 1
    while have < degree:
        top = min(2 * have, degree)
        new = list(range(have + 1, top + 1))
        prods = mul_trunc([(pw[have], pw[k - have]) for k in new], prec)
        pw.update(zip(new, prods))
        have = top
    return pw


def poly_share(x: torch.Tensor, coeffs: Sequence[float], prec: int) -> torch.Tensor:
    """Shares of sum_k coeffs[k] x^k (x and the result at `prec`), one final truncation."""
    degree = len(coeffs) - 1
    pw = powers(x, degree, prec) if degree >= 1 else {}
    acc = torch.zeros_like(x)
    for k in range(1, degree + 1):
        acc = acc + pw[k] * int(round(coeffs[k] * (1 << prec)))
    acc = truncate(acc, prec)
    if rank0():
        acc = acc + int(round(coeffs[0] * (1 << prec)))
    return acc


def new_like(x: CrypTensor, share: torch.Tensor, precision: int | None = None,
             dtype: torch.dtype | None = None, names="same") -> CrypTensor:
    """A CrypTensor from a share, with x's scale/dtype/names unless given."""
    return CrypTensor(share, x.precision if precision is None else precision,
                      x.dtype if dtype is None else dtype,
                      x._names if names == "same" else names)


def unify_names(a, b):
    return _unify(a, b)


def bool_tensor(share: torch.Tensor, names=None) -> CrypTensor:
    return CrypTensor(share, 0, torch.bool, names)
