"""Helpers shared by the function modules: scales, public operands, batched products."""

from __future__ import annotations

from typing import Sequence

import torch

from .. import encoding
from ..cryptensor import CrypTensor, _unify, default_precision
from ..mpc import protocol
from ..session import current


def rank0() -> bool:
    """Whether this party adds public terms under the additive scheme (rank 0). Prefer
    public_share / add_public / xor_public: they are right under every protocol."""
    return protocol.is_lead()


def public_share(encoded: torch.Tensor) -> torch.Tensor:
    """The trivial sharing of a public encoded tensor (protocol.public_share)."""
    return protocol.public_share(encoded)


add_public = protocol.add_public
xor_public = protocol.xor_public


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
    """Shares of x / 2^bits (protocol.truncate: local for 2 additive parties, one round else)."""
    return protocol.truncate(x, bits)


def beaver_mul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Elementwise product of shares (one round: Beaver, or the replicated product)."""
    return protocol.mul("mul", x, y)


def _flat_pairs(pairs):
    shapes = [torch.broadcast_shapes(a.shape, b.shape) for a, b in pairs]
    xs = [torch.broadcast_to(a, s).reshape(-1) for (a, _), s in zip(pairs, shapes)]
    ys = [torch.broadcast_to(b, s).reshape(-1) for (_, b), s in zip(pairs, shapes)]
    return shapes, xs, torch.cat(xs), torch.cat(ys)


def _split(z: torch.Tensor, shapes, xs) -> list[torch.Tensor]:
    out, off = [], 0
    for s, t in zip(shapes, xs):
        out.append(z[off:off + t.numel()].view(s))
        off += t.numel()
    return out


def mul_shares(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
    """Untruncated products of several pairs of shares in ONE round."""
    shapes, xs, x, y = _flat_pairs(pairs)
    return _split(beaver_mul(x, y), shapes, xs)


def mul_trunc(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], bits: int) -> list[torch.Tensor]:
    """Products of several pairs, each truncated by `bits`: one Beaver round (+ one
    truncation) under additive, ONE round in all under rss (protocol.mul_trunc)."""
    if bits == 0:
        return mul_shares(pairs)
    shapes, xs, x, y = _flat_pairs(pairs)
    return _split(protocol.mul_trunc("mul", x, y, (), bits), shapes, xs)


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
    return add_public(truncate(acc, prec), int(round(coeffs[0] * (1 << prec))))


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


def all_pairs_winners(beats: torch.Tensor, g: int) -> torch.Tensor:
    """Binary shares (rows, g) of which of g candidates beats all others, from the shared bits
    `beats` (rows, g(g-1)/2) of the pairs torch.triu_indices(g, g, 1) in order, where a pair
    (i, j)'s bit is [j strictly beats i]. Candidate a wins against b < a iff pair (b, a)'s
    bit is set and against b > a iff pair (a, b)'s is not (so ties go to the first index);
    the AND of its g - 1 wins costs ceil(log2(g - 1)) rounds."""
    i, j = torch.triu_indices(g, g, 1)
    pair = torch.full((g, g), -1, dtype=torch.long)
    pair[i, j] = torch.arange(i.numel())
    pair[j, i] = torch.arange(i.numel())
    others = torch.stack([torch.cat([torch.arange(a), torch.arange(a + 1, g)]) for a in range(g)])
    cand = torch.arange(g).unsqueeze(1).expand(g, g - 1)
    wins = protocol.xor_public(beats[:, pair[cand, others]], (others > cand).long())
    return protocol.and_reduce_bits(wins)
