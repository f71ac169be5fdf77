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
from .primitives import open_differences


def beaver(op: str, x: torch.Tensor, y: torch.Tensor, params: Sequence[int] = ()) -> torch.Tensor:
    """Shares of op(x, y) from shares of x and y (one round)."""
    s = current()
    fn = TRIPLE_OPS[op]
    triple = s.provider.get("triple", [x.shape, y.shape], op, params)
    a, b = triple[0], triple[1]
    e, d = open_differences([(x, a), (y, b)])
    c = triple.corrected()[2]
    if op == "mul":  # elementwise: c + e b made fresh in one pass, the other products added in place
        z = torch.addcmul(c, e, b)
        z.addcmul_(a, d)
        if s.rank == 0:
            z.addcmul_(e, d)
        return z
    z = fn(e, b, params)  # a fresh tensor: the other terms are added into it in place
    z += fn(a, d, params)
    z += c
    if s.rank == 0:
        z += fn(e, d, params)
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
