"""Conversions between arithmetic and binary sharing; the MSB (x < 0); exact rounding.

MSB of x = sum_i x_i mod 2^64 (``msb_words``), rounds for 2 parties:
  1. (1 round) View each arithmetic share as a binary-shared operand held by its owner:
     s = x_0 with bit 63 := 0 (party 0), c = x_1 with bit 63 := 1 (party 1). Each owner opens
     its operand masked by dealer randomness (8 bytes per element, one word each way) and
     the parties get XOR shares of (G, P) of the 32 2-bit groups from the dealer's mask
     products (kind ``binary_monomials``, circuits.expand_terms).
  2. (3 rounds) circuits.carry_trees, radix 4: 32 -> 8 -> 2 -> 1 groups with lane packing,
     each level one masked polynomial round (binary.PolyRounds; its correlations requested
     up front); 7 + 1.75 + 0.25 bytes per element per party.
  3. msb = s_63 ^ c_63 ^ carry (local).
  With N > 2 parties a carry-save layer per 3 operands (one masked round each layer,
  the majority of the owners' words) first reduces the N shares to two xor-shared
  operands, which level 1 then opens from every party.

B2A of bits (``finish``), a la [DSZ15] with a dealer bit (kind ``bit``):
  open c = b ^ r (one round, bits packed 64 per word); [b] = c + [r] - 2 c [r].
Bit times value (``finish`` muls, kind ``bit_mul``): in the same round open e = v - a too;
  [v b] = c [v] + (1 - 2c)(e [r] + [a r]): B2A folded into the product, no truncation.

Exact rounding (``round_exact``): floor((x + 2^(k-1)) / 2^k) with no +-1 error, a la
[EGK+20] with an exact borrow: open c = x + 2^62 + r, borrow = [c mod 2^k < r mod 2^k]
from r's xor-shared low bits by a carry tree (c is public), wrap from msb(r).
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..provider.correlations import broadcast_shape, logical_shift
from ..session import current
from . import circuits
from .binary import PolyJob, PolyRounds, and_many, eval_polys, lead_of, provider_get, xor_polys
from .primitives import open_
from .parallel import drive, opened_sums, opened_xors

# ----------------------------------------------------------------------------- MSB


def _reduce_operands(flat: torch.Tensor) -> list[tuple[torch.Tensor, int]]:
    """Every party's share as an owned binary operand, carry-save reduced to two operands."""
    s = current()
    ops = [(flat if s.rank == r else torch.zeros_like(flat), r) for r in range(s.world_size)]
    while len(ops) > 2:
        groups = [ops[i:i + 3] for i in range(0, len(ops) - len(ops) % 3, 3)]
        rest = ops[len(groups) * 3:]
        jobs = [PolyJob([g[0][0], g[1][0], g[2][0]], [g[0][1], g[1][1], g[2][1]], [circuits.MAJ3])
                for g in groups]
        majs = eval_polys(jobs)
        ops = list(rest)
        for g, (maj,) in zip(groups, majs):
            total, carry = circuits.csa(g[0][0], g[1][0], g[2][0], maj)
            ops += [(total, -1), (carry, -1)]
    if len(ops) == 1:  # a session of one party: its share and a zero operand
        ops.append((torch.zeros_like(flat), 0))
    return ops


def msb_words(x: torch.Tensor) -> torch.Tensor:
    """Packed XOR shares (64 elements per word, row-major) of msb(x) for an arithmetic share x."""
    s = current()
    flat = x.reshape(-1)
    (sv, so), (cv, co) = _reduce_operands(flat)
    top = circuits.pack_bits(((sv ^ cv) >> 63) & 1)
    # Pad bit 63 (s_63 := 0, c_63 := 1) on whoever holds the operands' shares.
    sv = sv & circuits.LOW63
    if co == -1:
        cv = (cv & circuits.LOW63) ^ (lead_of(cv) & circuits.TOP)
    else:
        cv = (cv & circuits.LOW63) | (circuits.TOP if s.rank == co else 0)
    planes = circuits.group2_planes(sv, cv)
    job = PolyJob(planes, [so, so, co, co], [circuits.GROUP2_G, circuits.GROUP2_P])
    poly_fn = PolyRounds([[level] for level in circuits.carry_plan(planes[0].numel(), 32)])
    (g, p), = eval_polys([job])
    return circuits.msb_from_group2(g, p, top, poly_fn=poly_fn)


def and_bits(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """AND of 0/1-valued XOR shares (int64, any shape), packed for the wire (one round)."""
    shape = broadcast_shape(x.shape, y.shape)
    x, y = torch.broadcast_to(x, shape).reshape(-1), torch.broadcast_to(y, shape).reshape(-1)
    (z,) = and_many([(circuits.pack_bits(x), circuits.pack_bits(y))])
    return circuits.unpack_bits(z, x.numel()).view(shape)


def not_bits(x: torch.Tensor) -> torch.Tensor:
    """NOT of 0/1-valued XOR shares (rank 0 flips)."""
    return x ^ 1 if current().rank == 0 else x


def _and_groups(x: torch.Tensor) -> torch.Tensor:
    """One round: AND of each run of (up to) four entries along the last axis of 0/1 XOR
    shares, as masked polynomials (xor_polys) on the bits packed 64 per word."""
    k = x.shape[-1]
    lead = x.shape[:-1]
    full, rest = divmod(k, 4)
    jobs, plan = [], []
    if full:
        body = x[..., :4 * full].reshape(*lead, full, 4)
        jobs.append(([circuits.pack_bits(body[..., j].reshape(-1)) for j in range(4)], [circuits.AND4]))
        plan.append(full)
    if rest > 1:
        tail = x[..., 4 * full:]
        inputs = [circuits.pack_bits(tail[..., j].reshape(-1)) for j in range(rest)]
        jobs.append((inputs, [[tuple(range(rest))]]))
        plan.append(1)
    outs = xor_polys(jobs) if jobs else []
    parts = []
    for (words,), m in zip(outs, plan):
        count = m
        for d in lead:
            count *= d
        parts.append(circuits.unpack_bits(words, count).view(*lead, m))
    if rest == 1:
        parts.append(x[..., 4 * full:])
    return torch.cat(parts, -1) if len(parts) > 1 else parts[0]


def and_reduce_bits(x: torch.Tensor, and_fn=None) -> torch.Tensor:
    """AND over the last axis of 0/1 XOR shares, by a tree. Without `and_fn`: four entries
    per round (ceil(log4 k) rounds, masked polynomials); `and_fn`: the AND of two such
    tensors (rss_binary passes its own), ceil(log2 k) rounds."""
    if and_fn is None:
        while x.shape[-1] > 1:
            x = _and_groups(x)
        return x[..., 0]
    while x.shape[-1] > 1:
        k = x.shape[-1]
        half = k // 2
        both = and_fn(x[..., :half], x[..., half:2 * half])
        x = torch.cat([both, x[..., 2 * half:]], -1) if k % 2 else both
    return x[..., 0]


# -------------------------------------------------------------- B2A and bit * value
def finish(b2as: Sequence[tuple[torch.Tensor, int]] = (),
           muls: Sequence[tuple[torch.Tensor, Sequence[int], torch.Tensor]] = ()):
    """ONE round: B2A of packed bit words, and bit * value products.

    b2as: (words, n) -> arithmetic 0/1 shares of shape (n,).
    muls: (words, bit_shape, value) with prod(bit_shape) bits broadcasting over value's
    shape -> shares of bit * value (value's scale, no truncation).
    """
    return drive(finish_gen(b2as, muls))


def finish_gen(b2as: Sequence[tuple[torch.Tensor, int]] = (),
               muls: Sequence[tuple[torch.Tensor, Sequence[int], torch.Tensor]] = ()):
    """finish as a protocol in rounds (mpc.parallel): yields its one message."""
    s = current()
    corrs_b = [provider_get("bit", n, lambda m: [(m,)], 1) for _, n in b2as]
    flat_m = []
    for _, bs, v in muls:
        n = 1
        for d in bs:
            n *= d
        # Bits broadcast over value's trailing dims (bit_shape = leading dims + 1s).
        target = broadcast_shape(bs, v.shape)
        flat_m.append(v.expand(target).reshape(n, -1))
    corrs_m = [provider_get("bit_mul", v.shape[0], lambda m, w=v.shape[1]: [(m, 1), (m, w)], 1 + v.shape[1])
               for v in flat_m]
    xor_parts = [w ^ circuits.pack_bits(c[0].reshape(-1)) for (w, _), c in zip(b2as, corrs_b)]
    xor_parts += [w ^ circuits.pack_bits(c[0].reshape(-1)) for (w, _, _), c in zip(muls, corrs_m)]
    sum_parts = [(v - c[1]).reshape(-1) for v, c in zip(flat_m, corrs_m)]
    nx = sum(t.numel() for t in xor_parts)
    parts = yield torch.cat(xor_parts + sum_parts)
    xs, ss = opened_xors([p[:nx] for p in parts]), opened_sums([p[nx:] for p in parts])
    out_b, out_m, ox, os_ = [], [], 0, 0
    for (w, n), corr in zip(b2as, corrs_b):
        c = circuits.unpack_bits(xs[ox:ox + w.numel()], n)
        ox += w.numel()
        ra = corr.corrected()[1]
        share = ra - 2 * c * ra
        if s.rank == 0:
            share = share + c
        out_b.append(share)
    for (w, bs, v0), v, corr in zip(muls, flat_m, corrs_m):
        c = circuits.unpack_bits(xs[ox:ox + w.numel()], v.shape[0]).unsqueeze(1)
        ox += w.numel()
        e = ss[os_:os_ + v.numel()].view(v.shape)
        os_ += v.numel()
        _, _, ra, ar = corr.corrected()
        xr = e * ra + ar
        out = c * v + (1 - 2 * c) * xr
        out_m.append(out.view(broadcast_shape(bs, v0.shape)))
    return out_b, out_m


def b2a(words: torch.Tensor, n: int) -> torch.Tensor:
    """Arithmetic 0/1 shares (n,) of packed XOR-shared bits (one round)."""
    return finish([(words, n)])[0][0]


def bit_mul(words: torch.Tensor, bit_shape: Sequence[int], value: torch.Tensor) -> torch.Tensor:
    """Shares of bit * value for packed XOR-shared bits (one round, B2A folded in)."""
    return finish((), [(words, bit_shape, value)])[1][0]


# -------------------------------------------------------------------------- A2B
def a2b(x: torch.Tensor) -> torch.Tensor:
    """XOR shares of every bit of x (full 64-bit A2B by carry-save + Kogge-Stone)."""
    flat = x.reshape(-1)
    (sv, _), (cv, _) = _reduce_operands(flat)
    return circuits.kogge_stone_add(sv, cv, and_many).view(x.shape)


# ------------------------------------------------------------------ exact rounding
def _next_pow2(k: int) -> int:
    w = 1
    while w < k:
        w *= 2
    return w


def round_exact(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Shares of floor((x + 2^(bits-1)) / 2^bits), exactly (|x| < 2^61, 1 <= bits <= 32).

    1 round to open c = x + 2^62 + 2^(bits-1) + r, ceil(log4(bits)) rounds of carry tree for the
    borrow [c mod 2^bits < r mod 2^bits], 1 round of B2A.
    """
    s = current()
    shape = x.shape
    x = x.reshape(-1)
    corr = provider_get("trunc_exact", x.numel(), lambda k: [(k,)], 3, params=[bits])
    bias = (1 << 62) + (1 << (bits - 1))
    c = open_(x + corr[0] + (bias if s.rank == 0 else 0))
    _, rlow, rt, m = corr.corrected()
    rlow = rlow & ((1 << bits) - 1)
    width = _next_pow2(bits)
    keep = (1 << bits) - 1
    not_c = ~c & keep
    g = (rlow & not_c).reshape(-1)
    p = ((rlow ^ not_c) if s.rank == 0 else rlow.clone()).reshape(-1)
    if s.rank == 0 and width > bits:  # pad the top with propagate = 1
        p = p | (((1 << width) - 1) ^ keep)
    n = g.numel()
    borrow_words = circuits.carry_tree(circuits.pack_lanes(g, width), circuits.pack_lanes(p, width),
                                       width, poly_fn=xor_polys)
    borrow = b2a(borrow_words, n)
    wrap = (1 - logical_shift(c, 63)) * m
    out = -rt - borrow + (wrap << (64 - bits))
    if s.rank == 0:
        out = out + logical_shift(c, bits) - (1 << (62 - bits))
    return out.view(shape)
