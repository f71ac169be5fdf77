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

from typing import Sequence

import torch

from ..provider.correlations import logical_shift
from ..session import current
from .parallel import opened_sums
from .primitives import open_

BIAS_BITS = 62


def truncate(x: torch.Tensor, bits: int, owned: bool = False) -> torch.Tensor:
    """Shares of x / 2^bits (rounded down, +-1 ulp). `owned`: x is the caller's fresh
    tensor, used no more (a product's result): local truncation then happens in it."""
    if bits == 0:
        return x
    if is_local():
        return _local(x, bits, owned)
    return truncate_exact(x, bits)


def is_local() -> bool:
    """Whether truncation is local here (2 parties, truncation=local): free, no round."""
    s = current()
    return s.world_size == 2 and s.config.truncation == "local"


def _local(x: torch.Tensor, bits: int, owned: bool = False) -> torch.Tensor:
    if current().rank == 0:
        return x.bitwise_right_shift_(bits) if owned else x >> bits
    return x.neg_().bitwise_right_shift_(bits).neg_() if owned else -((-x) >> bits)


def _local_many(items):
    return [_local(x, b) if b else x for x, b in items]


def truncate_exact(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Dealer-assisted truncation (one round), exact up to 1 ulp for |x| < 2^62."""
    return truncate_exact_many([(x, bits)])[0]


def truncate_many(items: Sequence[tuple[torch.Tensor, int]]) -> list[torch.Tensor]:
    """truncate for several (x, bits): the exact ones' openings in ONE round."""
    if is_local():
        return _local_many(items)
    return truncate_exact_many(items)


def truncate_exact_many(items: Sequence[tuple[torch.Tensor, int]]) -> list[torch.Tensor]:
    """truncate_exact for several (x, bits), their openings in one round."""
    pairs, masked = _mask(items)
    if masked is None:
        return [x for x, _ in items]
    return _finish(items, pairs, open_(masked))


def truncate_many_gen(items: Sequence[tuple[torch.Tensor, int]]):
    """truncate_many as a protocol in rounds (mpc.parallel): the local truncation yields
    nothing, the exact one its one opening (so that it can ride in another protocol's round)."""
    if is_local():
        return _local_many(items)
    pairs, masked = _mask(items)
    if masked is None:
        return [x for x, _ in items]
    return _finish(items, pairs, opened_sums((yield masked)))


def _mask(items):
    """The dealer pairs of the items that truncate, and x + 2^62 + r of all of them (flat)."""
    s = current()
    pairs, masked = [], []
    for x, bits in items:
        if bits == 0:
            pairs.append(None)
            continue
        pair = s.provider.get("trunc", [x.shape], params=[bits])
        biased = x + (1 << BIAS_BITS) if s.rank == 0 else x
        pairs.append(pair)
        masked.append((biased + pair[0]).reshape(-1))
    if not masked:
        return pairs, None
    return pairs, (torch.cat(masked) if len(masked) > 1 else masked[0])


def _finish(items, pairs, c_flat: torch.Tensor) -> list[torch.Tensor]:
    s = current()
    out, off = [], 0
    for (x, bits), pair in zip(items, pairs):
        if pair is None:
            out.append(x)
            continue
        c = c_flat[off:off + x.numel()].view(x.shape)
        off += x.numel()
        _, rt, m = pair.corrected()
        c_msb = logical_shift(c, 63)
        wrap = (1 - c_msb) * m
        y = -rt + (wrap << (64 - bits))
        if s.rank == 0:
            y += logical_shift(c, bits) - (1 << (BIAS_BITS - bits))
        out.append(y)
    return out
