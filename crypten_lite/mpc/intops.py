"""Integer protocols on ADDITIVE shares of small values (int8 inference), any N >= 2 parties.

``crypten_lite.mpc.protocol`` routes ``msb_low``, ``round_shift`` and ``requantize_clamp`` here
under the additive protocol (crypten_lite.mpc.rss_int holds the replicated ones); the layers
above (crypten_lite.quantized.mpc_ops) call only the protocol interface.

Values of a quantized program are small (an int8 activation before its clamp has 9 to 12
bits, an accumulator times its multiplier 30 to 50) and every caller passes a sound
``bits`` bound. These protocols use it: a comparison runs its carry circuit over
``bits + 1`` bits instead of 64, and a rounding division by ``2**k`` needs only the carry
out of the shares' low bits. Built on the binary-sharing primitives of
:mod:`crypten_lite.mpc.binary` (binary triples, masked openings, lane packing) and the
dealer's ``trunc_exact`` / ``bit`` / ``bit_mul`` correlations; every function takes and
returns this party's int64 shares (arithmetic unless the name says words: bit-packed XOR
shares, 64 elements per word). Byte counts below are per element and per party, 2 parties.

**Short MSB** (:func:`msb_low`): XOR shares of bit ``m - 1`` of ``x mod 2**m``, which is
``x < 0`` when ``-2**(m-1) <= x < 2**(m-1)``. Let ``W = next_pow2(m)``.

1. Each party keeps ``(x_i << (W - m)) mod 2**W`` (local; the sign lands on bit ``W - 1``)
   and packs ``64 / W`` elements per word. With N > 2 parties, carry-save layers (one round
   each, the majority of three operands from masked openings) reduce the N owned operands
   to two XOR-shared ones, the carries shifted within their lane.
2. msb = s_top ^ c_top ^ carry into bit ``W - 1`` of s + c: bit ``W - 1`` is padded with
   (generate 0, propagate 1) and level 1 (2-bit groups) comes from ONE masked opening (each
   owner sends its operand: ``W / 8`` bytes), as :func:`crypten_lite.mpc.convert.msb_words`
   does for 64 bits.
3. ``ceil(log4(W / 2))`` rounds of :func:`crypten_lite.mpc.circuits.carry_tree` (radix 4).

``m <= 16``: 3 rounds and 4 bytes (64 bits: 4 rounds, 17 bytes).

**Clamp** (:func:`clamp`): ``b_lo = [x > lo]``, ``b_hi = [x > hi]`` in one short-MSB call;
``y = lo + (b_lo ^ b_hi) (x - lo) + (hi - lo) b_hi`` (``b_hi <= b_lo``), the bit times value
and the B2A in ONE round (kind ``bit_mul``: 8.125 bytes). One bound: one bit, one product.

**Max pooling** (:func:`max_pool2d`): windows gathered locally (padding filled with the
public ``-2**bits``, which never wins), then ``ceil(log2 k)`` levels of
``max(a, b) = b + [a > b] (a - b)``: a short MSB on ``bits + 2`` bits and one bit-times-value
round per level.

**Rounding division** (:func:`round_shift`): ``floor((x + 2**(k-1)) / 2**k)``, torch's
``half_up`` (and ``half_even`` with a tie bit). With ``x' = x + 2**(k-1) + 2**62`` in
``[0, 2**63)``:

* 2 parties, no dealer opening (a la [MZ17] made exact): shares ``x'_i = H_i 2**k + L_i``
  (unsigned) give ``floor(x' / 2**k) = H_0 + H_1 + [L_0 + L_1 >= 2**k] - w 2**(64-k)``
  where the wrap ``w = top(x'_0) OR top(x'_1)`` (because ``x' < 2**63``). The carry comes
  from a carry tree over the top ``e = min(k, carry_bits)`` bits of ``L_0``, ``L_1``
  (level 1 and the AND for ``w`` in one masked opening), then one B2A round for both bits.
  ``e = 16``: 4 rounds, 4.4 bytes.
* N > 2 parties (dealer-assisted, a la [EGK+20]): open ``c = x' + r`` (one round, 8 bytes),
  borrow ``[c mod 2**k < r mod 2**k]`` from ``r``'s XOR-shared bits (kind ``trunc_exact``)
  by a carry tree on the top ``e`` bits (``c`` is public: no level-1 opening), the wrap
  from ``msb(r)``; one B2A round. ``e = 16``: 4 rounds, 24.75 bytes at 3 parties (to the two
  others).

Both are exact when ``k <= carry_bits``. Otherwise the carry ignores the bits below
``k - e``. 2 parties: the missed carry needs the low ``k`` bits of ``x'`` below
``2**(k-e)``; ``x'`` gets ``+ 2**(k-e)`` first, so that this band lies just below a rounding
boundary (not on exact ties): the result can be one too large only where ``x / 2**k`` lies
within ``2**-e`` below ``j + 1/2``. N > 2: one too large with probability at most
``2**-(e+1)`` per element over the dealer's randomness (when ``r``'s top ``e`` low bits
equal ``c``'s). ``half_even`` subtracts
``[x mod 2**(k+1) == 2**(k-1)]`` (a tie whose half-up result is odd): a short MSB of
``x - 2**(k-1)`` and of its negation on ``k + 1`` bits, a NOR, and the B2A round above.

References: [MZ17] Mohassel, Zhang, SecureML (S&P 2017); [EGK+20] Escudero et al.,
Improved primitives for MPC over mixed arithmetic-binary circuits (CRYPTO 2020); [KS73]
Kogge, Stone (carry trees).
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..errors import ProtocolError
from ..provider.correlations import logical_shift
from ..session import current
from . import circuits, convert
from .binary import PolyJob, and_many, eval_polys, provider_get, xor_polys, xor_public
from .primitives import open_

BIAS_BITS = 62  # x' = x + 2**62 is in [0, 2**63) for |x| < 2**61
MAX_BITS = 61
DEFAULT_CARRY_BITS = 16

Bound = int | torch.Tensor


def next_pow2(k: int) -> int:
    """Smallest power of two >= k (and >= 2)."""
    w = 2
    while w < k:
        w *= 2
    return w


def _word(v: int) -> int:
    """A 64-bit pattern as a Python int that fits torch.int64 (two's complement)."""
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >> 63 else v


def lane_mask(width: int, bit: int) -> int:
    """Word with bit ``bit`` set in every ``width``-bit lane."""
    return _word(sum(1 << (width * j + bit) for j in range(64 // width)))


def _low_mask(width: int) -> int:
    return -1 if width >= 64 else (1 << width) - 1


def public_share(value, like: torch.Tensor) -> torch.Tensor:
    """A public integer as an additive share broadcast to ``like``'s shape (rank 0 holds it)."""
    v = torch.as_tensor(value, dtype=torch.int64)
    out = torch.zeros(torch.broadcast_shapes(v.shape, like.shape), dtype=torch.int64)
    return out + v if current().rank == 0 else out


def _bounds(v: Bound) -> tuple[int, int]:
    if isinstance(v, torch.Tensor):
        return int(v.min()), int(v.max())
    return int(v), int(v)


def _lane_top_bits(words: torch.Tensor, width: int, n: int) -> torch.Tensor:
    """Bit ``width - 1`` of each lane (element) of packed words, re-packed one bit each."""
    lanes = circuits.unpack_lanes(words, width, n)
    return circuits.pack_bits(logical_shift(lanes, width - 1) & 1)


# ------------------------------------------------------------------------ short MSB
def _csa_reduce(ops: list[tuple[torch.Tensor, int]], width: int) -> list[tuple[torch.Tensor, int]]:
    """Carry-save layers (one round each) until two operands are left; lanes of ``width`` bits."""
    keep = ~lane_mask(width, 0)  # a carry shifted out of a lane must not enter the next
    while len(ops) > 2:
        cut = len(ops) - len(ops) % 3
        groups = [ops[i:i + 3] for i in range(0, cut, 3)]
        jobs = [PolyJob([g[0][0], g[1][0], g[2][0]], [g[0][1], g[1][1], g[2][1]], [circuits.MAJ3])
                for g in groups]
        majs = eval_polys(jobs)
        ops = list(ops[cut:])
        for g, (maj,) in zip(groups, majs):
            ops += [(g[0][0] ^ g[1][0] ^ g[2][0], -1), ((maj << 1) & keep, -1)]
    if len(ops) == 1:  # a session of one party: its operand and a zero one
        ops.append((torch.zeros_like(ops[0][0]), 0))
    return ops


def msb_low(x: torch.Tensor, m: int) -> torch.Tensor:
    """Packed XOR shares of bit ``m - 1`` of ``x mod 2**m`` (``x``: arithmetic shares).

    That bit is ``x < 0`` whenever ``-2**(m-1) <= x < 2**(m-1)``. Rounds (2 parties):
    ``log2(next_pow2(m))``; see the module docstring.
    """
    if not 1 <= m <= 64:
        raise ProtocolError(f"msb_low: width {m} must be in 1..64")
    s = current()
    flat = x.reshape(-1)
    n = flat.numel()
    width = next_pow2(m)
    mine = circuits.pack_lanes((flat << (width - m)) & _low_mask(width), width)
    ops = [(mine if s.rank == r else torch.zeros_like(mine), r) for r in range(s.world_size)]
    (sv, so), (cv, co) = _csa_reduce(ops, width)
    top = _lane_top_bits(sv ^ cv, width, n)
    top_lanes = lane_mask(width, width - 1)
    # s_top := 0 and c_top := 1, so that the group generate of the lane is the carry into the top
    sv = sv & ~top_lanes
    cv = cv & ~top_lanes
    if s.rank == (0 if co == -1 else co):
        cv = cv | top_lanes
    planes = circuits.group2_planes(sv, cv)
    ((g, p),) = eval_polys([PolyJob(planes, [so, so, co, co], [circuits.GROUP2_G, circuits.GROUP2_P])])
    return circuits.carry_tree(g, p, width // 2, poly_fn=xor_polys) ^ top


def _floor_div_local(xb: torch.Tensor, k: int, e: int, extra_b2a: Sequence[torch.Tensor]):
    """2 parties: shares of floor(xb / 2**k) for xb in [0, 2**63), carry on the top e low bits."""
    s = current()
    n = xb.numel()
    high = logical_shift(xb, k)
    width = next_pow2(e)
    low_top = ((xb & ((1 << k) - 1)) >> (k - e)) << (width - e)
    mine = circuits.pack_lanes(low_top, width)
    zero = torch.zeros_like(mine)
    sv, cv = (mine, zero) if s.rank == 0 else (zero, mine)
    top = circuits.pack_bits(logical_shift(xb, 63))
    a, b = (top, torch.zeros_like(top)) if s.rank == 0 else (torch.zeros_like(top), top)
    planes = circuits.group2_planes(sv, cv)
    (g, p), (ab,) = eval_polys([
        PolyJob(planes, [0, 0, 1, 1], [circuits.GROUP2_G, circuits.GROUP2_P]),
        PolyJob([a, b], [0, 1], [[(0, 1)]]),
    ])
    carry = circuits.carry_tree(g, p, width // 2, poly_fn=xor_polys)
    wrap = a ^ b ^ ab  # top_0 OR top_1
    got, _ = convert.finish([(carry, n), (wrap, n)] + [(w, n) for w in extra_b2a])
    return high + got[0] - (got[1] << (64 - k)), got[2:]


def _floor_div_dealer(xb: torch.Tensor, k: int, e: int, extra_b2a: Sequence[torch.Tensor]):
    """Any N: shares of floor(xb / 2**k) for xb in [0, 2**63) from an opened c = xb + r."""
    s = current()
    n = xb.numel()
    corr = provider_get("trunc_exact", n, lambda m: [(m,)], 3, params=[k])
    c = open_(xb + corr[0])
    _, rlow, rt, m = corr.corrected()
    width = next_pow2(e)
    keep = (1 << e) - 1
    r_top = ((rlow >> (k - e)) & keep) << (width - e)
    not_c = ((~c >> (k - e)) & keep) << (width - e)
    # borrow = [c_top < r_top] = carry out of r_top + ~c_top
    g = r_top & not_c
    p = r_top ^ not_c if s.rank == 0 else r_top.clone()
    borrow = circuits.carry_tree(circuits.pack_lanes(g, width), circuits.pack_lanes(p, width), width,
                                poly_fn=xor_polys)
    got, _ = convert.finish([(borrow, n)] + [(w, n) for w in extra_b2a])
    wrap = (1 - logical_shift(c, 63)) * m
    out = -rt - got[0] + (wrap << (64 - k))
    if s.rank == 0:
        out = out + logical_shift(c, k)
    return out, got[1:]


def _tie_words(x: torch.Tensor, k: int) -> torch.Tensor:
    """Packed XOR shares of [x mod 2**(k+1) == 2**(k-1)] (a tie whose half-up result is odd)."""
    z = x - public_share(1 << (k - 1), x)
    n = z.numel()
    words = msb_low(torch.cat([z, -z]), k + 1)
    both = circuits.unpack_bits(words, 2 * n)
    (nor,) = and_many([(xor_public(circuits.pack_bits(both[:n]), -1),
                        xor_public(circuits.pack_bits(both[n:]), -1))])
    return nor


def round_shift(x: torch.Tensor, shift: int, bits: int, rounding: str = "half_up",
                carry_bits: int = DEFAULT_CARRY_BITS, method: str = "auto") -> torch.Tensor:
    """Additive shares of ``round(x / 2**shift)`` for ``-2**bits <= x < 2**bits`` (``bits <= 61``).

    ``rounding``: ``"half_up"`` or ``"half_even"``. ``method``: ``"local"`` (2 parties),
    ``"dealer"`` (any N), ``"auto"`` (local for 2 parties) or ``"probabilistic"``
    (:func:`crypten_lite.mpc.truncation.truncate_exact` of ``x + 2**(shift-1)``: one round,
    but the result is one too large with probability equal to the fraction dropped, so about
    half the values differ from the rounded result; for measurements only).
    """
    s = current()
    shape = x.shape
    flat = x.reshape(-1)
    if method == "probabilistic":
        return _probabilistic(flat + public_share(1 << (shift - 1), flat), shift).view(shape)
    if method == "auto":
        method = "local" if s.world_size == 2 else "dealer"
    if method == "local" and s.world_size != 2:
        raise ProtocolError(f"round_shift: the local method needs 2 parties, not {s.world_size}")
    e = max(1, min(shift, carry_bits))
    ties = [_tie_words(flat, shift)] if rounding == "half_even" else []
    # local: the top-e carry can miss a carry from the bits below only where the low k bits
    # are below 2**(k-e); adding 2**(k-e) moves that band from just above a rounding boundary
    # (exact ties included) to just below it
    guard = (1 << (shift - e)) if method == "local" and e < shift else 0
    xb = flat + public_share((1 << (shift - 1)) + (1 << BIAS_BITS) + guard, flat)
    if method == "local":
        q, tie = _floor_div_local(xb, shift, e, ties)
    elif method == "dealer":
        q, tie = _floor_div_dealer(xb, shift, e, ties)
    else:
        raise ValueError(f"unknown truncation method {method!r}")
    q = q - public_share(1 << (BIAS_BITS - shift), q)
    if tie:
        q = q - tie[0]
    return q.view(shape)


def _lockstep_trees(tasks: list[list]) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Several radix-4 carry trees in lockstep (circuits.carry_trees): one round per level
    for all of them. A task is ``[g, p, width, want_p]``; returns each (G, P or None)."""
    return circuits.carry_trees([tuple(t) for t in tasks], xor_polys)


def and_with_b2a(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], b2as: Sequence[tuple[torch.Tensor, int]]):
    """ANDs of packed words and B2A of packed bits in ONE round (one opening of XOR masks)."""
    s = current()
    xs = [x.reshape(-1) for x, _ in pairs]
    ys = [y.reshape(-1) for _, y in pairs]
    x, y = torch.cat(xs), torch.cat(ys)
    nw = x.numel()
    triple = provider_get("binary_triple", nw, lambda m: [(m,)], 1)
    corrs = [provider_get("bit", n, lambda m: [(m,)], 1) for _, n in b2as]
    masked = [w ^ circuits.pack_bits(c[0].reshape(-1)) for (w, _), c in zip(b2as, corrs)]
    a, b = triple[0], triple[1]
    from crypten_lite.mpc.binary import open_xor

    opened = open_xor(torch.cat([x ^ a, y ^ b] + masked))
    e, d = opened[:nw], opened[nw:2 * nw]
    z = triple.corrected()[2] ^ (e & b) ^ (a & d)
    if s.rank == 0:
        z = z ^ (e & d)
    ands, off = [], 0
    for t in xs:
        ands.append(z[off:off + t.numel()])
        off += t.numel()
    arith, off = [], 2 * nw
    for (w, n), corr in zip(b2as, corrs):
        c = circuits.unpack_bits(opened[off:off + w.numel()], n)
        off += w.numel()
        ra = corr.corrected()[1]
        share = ra - 2 * c * ra
        arith.append(share + c if s.rank == 0 else share)
    return ands, arith


def requantize_clamp(v: torch.Tensor, shift: int, offset: int, lo: Bound | None, hi: Bound | None,
                     m: int, carry_bits: int = DEFAULT_CARRY_BITS) -> torch.Tensor:
    """2 parties (additive): ``clamp(floor((v + 2**(shift-1)) / 2**shift) + offset, lo, hi)`` in 5 rounds.

    The rounding of :func:`round_shift` (local method) and the clamp's comparisons run
    together: with ``t = H_0 + H_1 + carry - wrap 2**(64-k) - 2**(62-k)``, the sign of
    ``t + offset - B`` for a bound ``B`` is the top bit of ``A_0 + A_1 + carry`` on ``m``
    bits, where ``A_i`` are the low bits of each party's ``H_i`` (plus public constants on
    party 0): its carry tree needs no rounding result, only the rounding's carry as a
    carry-in (``G | P & carry``). Rounds: level 1 of every tree (one masked opening), the
    tree levels in lockstep, the carry-in ANDs with the B2A of the carry and the wrap (one
    opening), the bit-times-value fold. Same bytes as the separate steps, 3 rounds fewer.
    """
    s = current()
    shape = v.shape
    flat = v.reshape(-1)
    n = flat.numel()
    k = shift
    e = max(1, min(k, carry_bits))
    guard = (1 << (k - e)) if e < k else 0
    xb = flat + public_share((1 << (k - 1)) + (1 << BIAS_BITS) + guard, flat)
    high = logical_shift(xb, k)
    # the rounding's carry (as _floor_div_local)
    we = next_pow2(e)
    low_top = circuits.pack_lanes(((xb & ((1 << k) - 1)) >> (k - e)) << (we - e), we)
    zero = torch.zeros_like(low_top)
    st, ct = (low_top, zero) if s.rank == 0 else (zero, low_top)
    top = circuits.pack_bits(logical_shift(xb, 63))
    a, b = (top, torch.zeros_like(top)) if s.rank == 0 else (torch.zeros_like(top), top)
    # the comparisons: A = high (+ offset - B - 2**(62-k) on party 0), m bits at the top of
    # W-bit lanes; lane padding: top (g 0, p 1) and bits below the value (g 0, p 1)
    bounds = [bd for bd in (lo, hi) if bd is not None]
    wm = next_pow2(m)  # m: bits of t + offset - B (crypten_lite.quantized.mpc_ops._window_bits)
    consts = [offset - (1 << (BIAS_BITS - k)) - torch.as_tensor(bd, dtype=torch.int64) for bd in bounds]
    vals = torch.cat([(high + public_share(c, xb.view(shape)).reshape(-1)) & _low_mask(m) for c in consts])
    lanes = circuits.pack_lanes(vals << (wm - m), wm)
    nb = vals.numel()
    sign_top = lane_mask(wm, wm - 1)
    pad = _word(sum(((1 << (wm - m)) - 1) << (wm * j) for j in range(64 // wm))) | sign_top
    mine = lanes & ~sign_top
    sc, cc = (mine, torch.zeros_like(mine)) if s.rank == 0 else (torch.zeros_like(mine), mine | pad)
    top_c = _lane_top_bits(lanes, wm, nb)  # each party's own top bit: XOR shares of s_top ^ c_top
    (gt, pt), (ab,), (gc, pc) = eval_polys([
        PolyJob(circuits.group2_planes(st, ct), [0, 0, 1, 1], [circuits.GROUP2_G, circuits.GROUP2_P]),
        PolyJob([a, b], [0, 1], [[(0, 1)]]),
        PolyJob(circuits.group2_planes(sc, cc), [0, 0, 1, 1], [circuits.GROUP2_G, circuits.GROUP2_P]),
    ])
    (carry, _), (g_all, p_all) = _lockstep_trees([[gt, pt, we // 2, False], [gc, pc, wm // 2, True]])
    wrap = a ^ b ^ ab
    carry_bits_n = circuits.unpack_bits(carry, n)
    cin = circuits.pack_bits(carry_bits_n.repeat(len(bounds)))
    (p_cin,), (carry_a, wrap_a) = and_with_b2a([(p_all, cin)], [(carry, n), (wrap, n)])
    below = circuits.unpack_bits(top_c ^ g_all ^ p_cin, nb)  # [t + offset < B]
    t = (high + carry_a - (wrap_a << (64 - k))) + public_share(offset - (1 << (BIAS_BITS - k)), high)
    t = t.view(shape)
    at_least = [1 - below[i * n:(i + 1) * n] if s.rank == 0 else below[i * n:(i + 1) * n] for i in range(len(bounds))]
    # at_least[i]: XOR shares of [t + offset >= B_i] (rank 0 flips)
    if lo is not None and hi is not None:
        sel = circuits.pack_bits(at_least[0] ^ at_least[1])
        (hi_a,), (prod,) = convert.finish([(circuits.pack_bits(at_least[1]), n)],
                                         [(sel, tuple(shape), t - public_share(lo, t))])
        gap = torch.as_tensor(hi, dtype=torch.int64) - torch.as_tensor(lo, dtype=torch.int64)
        return public_share(lo, t) + prod + hi_a.view(shape) * gap
    words = circuits.pack_bits(at_least[0])
    if lo is not None:
        (prod,) = convert.finish((), [(words, tuple(shape), t - public_share(lo, t))])[1]
        return public_share(lo, t) + prod
    (prod,) = convert.finish((), [(words, tuple(shape), t - public_share(hi, t))])[1]
    return t - prod


def _probabilistic(flat: torch.Tensor, shift: int) -> torch.Tensor:
    from crypten_lite.mpc.truncation import truncate_exact

    chunk = 1 << 17  # the dealer answers each request in one 4 MiB message
    return torch.cat([truncate_exact(flat[i:i + chunk], shift) for i in range(0, flat.numel(), chunk)])




def random_words(n_words: int) -> torch.Tensor:
    """Packed XOR shares of ``64 * n_words`` uniform secret bits (no communication): every
    party draws its share from its own cryptographic PRG (a fresh seed); their XOR is unknown
    to any coalition missing a party."""
    from ..random import PRG, fresh_seed

    return PRG(fresh_seed()).draw((n_words,))


def msb_low_mul(pairs, m: int) -> list[torch.Tensor]:
    """[x < 0] * v for each (x, v) (v of x's shape): one short MSB over all the x
    (:func:`msb_low`), then one bit-times-value round (convert.finish)."""
    if len(pairs) == 1:
        x, v = pairs[0]
        words = msb_low(x, m)
        return convert.finish((), [(words, tuple(x.shape), v)])[1]
    flat = torch.cat([x.reshape(-1) for x, _ in pairs])
    bits = circuits.unpack_bits(msb_low(flat, m), flat.numel())
    muls, off = [], 0
    for x, v in pairs:
        n = x.numel()
        muls.append((circuits.pack_bits(bits[off:off + n]), tuple(x.shape), v))
        off += n
    return convert.finish((), muls)[1]
