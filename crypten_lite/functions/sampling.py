"""Secret random values: rand (uniform in [0, 1)) and bernoulli.

rand: `precision` secret random bits per element as binary shares, made with no
communication (protocol.random_words): under the additive protocol every party draws its XOR
share from its own cryptographic PRG (a fresh seed), under rss the three components come from
the pairwise PRG streams; either way the XOR is a uniform bit string that no coalition
missing a party knows. One B2A turns the bits into arithmetic shares, summed with public
weights 2^j into a fixed-point value (additive: 1 round, 2 + 1/8 bytes per bit per party with
the dealer at 2 parties; rss: 2 rounds, 8 1/6 bytes per bit per party).
bernoulli(p) = [rand < p]: rand plus one comparison.
"""

from __future__ import annotations

import torch

from ..cryptensor import CrypTensor, _shape_arg, default_precision
from ..mpc import circuits, protocol


def rand(*sizes, precision: int | None = None) -> CrypTensor:
    """A secret CrypTensor of uniform values in [0, 1) on a 2^-precision grid (one B2A:
    1 round additive, 2 under rss)."""
    shape = tuple(_shape_arg(sizes))
    p = default_precision() if precision is None else int(precision)
    n = 1
    for s in shape:
        n *= s
    mine = protocol.random_words(n)                      # binary shares of 64 bits per element
    bits = ((mine.unsqueeze(1) >> torch.arange(p)) & 1).reshape(-1)
    arith = protocol.b2a(circuits.pack_bits(bits), n * p).view(n, p) if n * p else \
        protocol.public_share(torch.zeros(n, p, dtype=torch.int64))
    share = (arith << torch.arange(p)).sum(1).view(shape)
    return CrypTensor(share, p, torch.float32)


def bernoulli(x: CrypTensor) -> CrypTensor:
    """1 with probability x (elementwise), else 0, in x's dtype: [rand < x]."""
    return rand(tuple(x.shape), precision=x.precision or None).lt(x).to(
        x.dtype if x.dtype.is_floating_point else torch.float32)


def weighted_index(x: CrypTensor, dim=None) -> CrypTensor:
    """A one-hot along `dim` (flattened x if None), drawn with probabilities x / sum(x).

    x >= 0. With c = cumsum(x) and r = rand * c[-1]: the one-hot is [c > r] minus the same
    shifted by one (CrypTen's weighted_index): rand, one product, one comparison.
    """
    if dim is None:
        return weighted_index(x.reshape(-1), 0).reshape(x.shape)
    d = x._dim(dim) % max(1, x.dim())
    n = x.shape[d]
    c = x.cumsum(d)
    total = c.narrow(d, n - 1, 1)
    above = c.gt(rand(tuple(total.shape), precision=x.precision or None).mul(total))
    zero = torch.zeros(tuple(above.shape[:d]) + (1,) + tuple(above.shape[d + 1:]), dtype=torch.int64)
    from ..cryptensor import cat
    shifted = cat([zero, above.narrow(d, 0, n - 1)], d)
    return above.sub(shifted).to(x.dtype if x.dtype.is_floating_point else torch.float32)


def weighted_sample(x: CrypTensor, dim=None) -> tuple[CrypTensor, CrypTensor]:
    """(the sampled value, its one-hot): x * weighted_index(x, dim) summed along dim."""
    index = weighted_index(x, dim)
    return x.mul(index).sum(dim), index
