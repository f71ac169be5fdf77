"""Truncation of fixed-point shares: divide by 2^bits after a product.

local (2 parties, [MZ17] SecureML): party 0 computes x_0 >> bits, party 1 -((-x_1) >> bits).
   No communication. The result is off by at most 1 ulp, except that with probability
   |x| / 2^64 per element (x the untruncated value; x_1 is uniform, and the signed sum
   x_0 + x_1 overflows) the shares straddle the wrap and the result is catastrophically
   wrong. Products of values below 2^k in magnitude at 16 fractional bits have
   |x| < 2^(k+32): e.g. 2^-22 for values below 2^10, 2^-32 for 1. Use
   CRYPTEN_LITE_TRUNCATION=exact to rule this out at the price of one round; protocol.
   truncate_exact does so for single products at a large scale (LayerNorm's last one).
   benchmarks/truncation_audit.py measures a workload's expected failures per call site.

exact (any number of parties, dealer-assisted, one round; a la [EGK+20] with a public wrap
   correction): requires |x| < 2^62.
   1. Dealer: r uniform, shares [r], [rt = r >> bits], [m = msb(r)] (logical shifts).
   2. Parties: x' = x + 2^62 (so 0 <= x' < 2^63); open c = x' + r mod 2^64 (one round).
   3. w = m * (1 - msb(c)) is the wrap of x' + r (x' < 2^63), linear in [m].
   4. [x' >> bits] = (c >> bits) - [rt] + 2^(64-bits) [w], then subtract 2^(62-bits).
   Error at most 1 ulp, never catastrophic; the opened c is uniform (r is) so reveals nothing.
"""

from __future__ import annotations

import torch

from ..provider.correlations import logical_shift
from ..session import current
from .primitives import open_

BIAS_BITS = 62


def truncate(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Shares of x / 2^bits (rounded down, +-1 ulp)."""
    if bits == 0:
        return x
    s = current()
    if s.world_size == 2 and s.config.truncation == "local":
        return x >> bits if s.rank == 0 else -((-x) >> bits)
    return truncate_exact(x, bits)


def truncate_exact(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Dealer-assisted truncation (one round), exact up to 1 ulp for |x| < 2^62."""
    s = current()
    pair = s.provider.get("trunc", [x.shape], params=[bits])
    r = pair[0]
    biased = x + (1 << BIAS_BITS) if s.rank == 0 else x
    c = open_(biased + r)
    _, rt, m = pair.corrected()
    c_msb = logical_shift(c, 63)
    wrap = (1 - c_msb) * m
    out = -rt + (wrap << (64 - bits))
    if s.rank == 0:
        out += logical_shift(c, bits) - (1 << (BIAS_BITS - bits))
    return out
