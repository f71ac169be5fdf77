"""Beaver multiplication for every bilinear op: mul, matmul, conv1d/2d, conv_transpose2d.

Protocol (a la [Bea91]); x, y shared, op bilinear:

1. Get a triple ([a], [b], [c = op(a, b)]) from the provider, a of x's shape, b of y's.
2. Open e = x - a and d = y - b together: ONE round, each party sends |x| + |y| ring elements
   to every peer (2 parties, mul of n: 16n bytes sent per party).
3. [z] = [c] + op(e, [b]) + op([a], d) + op(e, d), the public term added by rank 0 only.

Square uses a pair ([a], [a^2]): open e = x - a (one value), [x^2] = [c] + 2e[a] + e^2.
The result is at the sum of the operands' scales; the caller truncates.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..provider.correlations import TRIPLE_OPS
from ..session import current
from . import truncation
from .primitives import open_differences


def beaver(op: str, x: torch.Tensor, y: torch.Tensor, params: Sequence[int] = (),
           local_shift: int = 0) -> torch.Tensor:
    """Shares of op(x, y) from shares of x and y (one round). `local_shift` (2 parties,
    truncation=local only): the result truncated by that many bits, as
    truncation.truncate(..., owned=True) would, here range by range as it is made."""
    s = current()
    fn = TRIPLE_OPS[op]
    triple = s.provider.get("triple", [x.shape, y.shape], op, params)
    a, b = triple[0], triple[1]
    if op == "mul" and x.shape == y.shape == a.shape == b.shape:
        return _mul_by_ranges(s.rank, triple, x, y, local_shift)
    e, d = open_differences([(x, a), (y, b)])
    c = triple.corrected()[2]
    if op == "mul":  # elementwise: c + e b made fresh in one pass, the other products added in place
        z = torch.addcmul(c, e, b)
        z.addcmul_(a, d)
        if s.rank == 0:
            z.addcmul_(e, d)
        return _shift(z, s.rank, local_shift)
    z = fn(e, b, params)  # a fresh tensor: the other terms are added into it in place
    z += fn(a, d, params)
    z += c
    if s.rank == 0:
        z += fn(e, d, params)
    return _shift(z, s.rank, local_shift)


def _shift(z: torch.Tensor, rank: int, bits: int) -> torch.Tensor:
    """Local truncation of a fresh product (or of a range of it) in place: truncation._local,
    owned (looked up at each call: benchmarks/truncation_audit.py records it there)."""
    return truncation._local(z, bits, True) if bits else z


def _mul_by_ranges(rank: int, triple, x: torch.Tensor, y: torch.Tensor, shift: int = 0) -> torch.Tensor:
    """beaver("mul") of operands of one shape, recombined range by range as the opening's
    ranges are summed (open_differences' on_range: while the rest of the peer's message is on
    the wire, where the transport streams): z = c + e b, then z += a d (+ e d on rank 0) once
    d's range is in (e, the opening's first half, always comes before d of the same
    elements). The same terms as the general form, in one fresh tensor, each range
    truncated locally by `shift` bits as soon as it is complete."""
    a, b = triple[0].reshape(-1), triple[1].reshape(-1)
    n = a.numel()
    z = torch.empty(x.shape, dtype=torch.int64)
    zf = z.view(-1)
    c: list[torch.Tensor] = []

    def on_range(start: int, end: int, total: torch.Tensor) -> None:
        if not c:  # the dealer's correction, once, when the first range is in
            c.append(triple.corrected()[2].reshape(-1))
        lo, hi = start, min(end, n)
        if lo < hi:
            torch.addcmul(c[0][lo:hi], total[lo:hi], b[lo:hi], out=zf[lo:hi])
        lo, hi = max(start, n), end
        if lo < hi:
            d, out = total[lo:hi], zf[lo - n:hi - n]
            if rank == 0:  # (a + e) d in one product: e's range of the opening is used no more
                out.addcmul_(total[lo - n:hi - n].add_(a[lo - n:hi - n]), d)
            else:
                out.addcmul_(a[lo - n:hi - n], d)
            _shift(out, rank, shift)  # this range of the product is complete

    open_differences([(x, triple[0]), (y, triple[1])], on_range=on_range)
    return z


def square(x: torch.Tensor) -> torch.Tensor:
    """Shares of x * x (one round, one opened value)."""
    s = current()
    pair = s.provider.get("square", [x.shape])
    a = pair[0]
    (e,) = open_differences([(x, a)])
    c = pair.corrected()[1]
    z = e * a
    z.add_(z).add_(c)  # c + 2 e a, in one fresh tensor
    if s.rank == 0:
        z.addcmul_(e, e)
    return z
