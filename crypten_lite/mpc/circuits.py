"""Boolean circuits on bit-packed XOR shares: pure math, no session, no transport.

Every function here takes this party's XOR shares as int64 words whose LAST axis is the
element axis (leading axes are allowed, which is how the unit tests simulate all parties at
once) and performs only operations that are linear over GF(2) -- shifts, masks, xors, lane
packing -- except through two injected callbacks:

* ``and_fn(pairs) -> list``: shares of x & y for each (x, y); the protocol layer runs ALL the
  pairs of one call in ONE round (binary triples, one message).
* ``lead``: a share-shaped tensor that is all-ones bits on the party that adds public
  constants (rank 0) and zero elsewhere; ``x ^ (lead & c)`` xors the public constant c.

Carry of a two-operand sum (what the MSB, i.e. x < 0, needs), a la [KS73] / [CGH+21]:
  generate g_i = s_i & c_i, propagate p_i = s_i ^ c_i; groups combine as
  (G, P) = (G_hi ^ P_hi & G_lo, P_hi & P_lo), so the carry into bit 63 of s + c is the G of
  bits 0..62. Bit 63 is padded with g = 0, p = 1 (s_63 := 0, c_63 := 1), giving 64 bits
  whose G is that carry. Level 1 (2-bit groups) is evaluated from masked openings (see
  ``expand_terms``); each further level combines the groups of an element and packs the live
  bits of several elements into one word ("lane packing") so that a level with fewer live
  bits sends fewer bytes.

Two ways to run the levels after level 1:

* ``poly_fn`` (what the additive protocol passes; the dealer supplies the mask products):
  radix 4. Four groups combine in ONE
  round as a masked polynomial (``CARRY4_G`` / ``CARRY4_P``: products of up to four inputs,
  the dealer's shares of the mask products, see ``expand_terms``), so w groups take
  ceil(log4 w) rounds instead of log2 w: 32 -> 8 -> 2 -> 1 in 3 rounds, 16 -> 4 -> 1 in 2.
  ``poly_fn(jobs) -> list``: for each job (inputs, outputs), XOR shares of every output, an
  output being an XOR of ANDs of inputs (all XOR-shared); all jobs of a call in ONE round.
The rss protocol has its own carry circuit (``rss_binary._g_carry``: roles 0 and 2 as two
parties, role 1 their dealer), radix 2 but for its last level, which takes four groups
(``CARRY4_G_ONLY``); and_fn remains the callback of the AND tree and the adder.
"""

from __future__ import annotations

import functools
from itertools import combinations
from typing import Callable, Sequence

import numpy as np
import torch

AndFn = Callable[[Sequence[tuple[torch.Tensor, torch.Tensor]]], list[torch.Tensor]]
Terms = Sequence[Sequence[int]]
PolyFn = Callable[[Sequence[tuple[Sequence[torch.Tensor], Sequence[Terms]]]], list[list[torch.Tensor]]]

TOP = -(1 << 63)             # bit 63
LOW63 = (1 << 63) - 1        # bits 0..62
_MASKS = [0x5555555555555555, 0x3333333333333333, 0x0F0F0F0F0F0F0F0F,
          0x00FF00FF00FF00FF, 0x0000FFFF0000FFFF, 0x00000000FFFFFFFF]


# ------------------------------------------------------------------------- lane layout
def compress_even(x: torch.Tensor) -> torch.Tensor:
    """Bits 0, 2, ..., 62 of each word moved to bits 0..31 (the high half becomes 0)."""
    x = x & _MASKS[0]
    for i in range(1, 6):
        x = (x | (x >> (1 << (i - 1)))) & _MASKS[i]
    return x


def _pad_last(x: torch.Tensor, multiple: int) -> torch.Tensor:
    n = x.shape[-1]
    extra = (-n) % multiple
    if extra == 0:
        return x
    return torch.cat([x, x.new_zeros(*x.shape[:-1], extra)], -1)


@functools.lru_cache(maxsize=8)
def _lane_shifts(width: int) -> torch.Tensor:
    """0, width, 2 width, ... < 64 (made once per width: an arange costs a few microseconds,
    and the lanes are packed and unpacked dozens of times per comparison). Read only."""
    return torch.arange(0, 64, width, dtype=torch.int64)


def pack_lanes(x: torch.Tensor, width: int) -> torch.Tensor:
    """Pack elements holding `width` low bits (width | 64) into full words, in order:
    element j of a word occupies bits [width*j, width*(j+1)). The last word is zero-padded."""
    per = 64 // width
    if per == 1:
        return x
    x = _pad_last(x, per)
    x = x.reshape(*x.shape[:-1], -1, per)
    shifts = _lane_shifts(width)
    # Disjoint bit ranges: the sum is the OR (bit 63 wraps to the sign bit, as it should).
    return (x << shifts).sum(-1)


def unpack_lanes(words: torch.Tensor, width: int, n: int) -> torch.Tensor:
    """Inverse of pack_lanes: the first n elements, each in the low `width` bits."""
    per = 64 // width
    if per == 1:
        return words[..., :n]
    shifts = _lane_shifts(width)
    mask = (1 << width) - 1 if width < 64 else -1
    lanes = (words.unsqueeze(-1) >> shifts) & mask
    return lanes.reshape(*words.shape[:-1], -1)[..., :n]


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """0/1 shares (int64) along the last axis -> 64 per word."""
    return pack_lanes(bits & 1, 1)


def unpack_bits(words: torch.Tensor, n: int) -> torch.Tensor:
    """Words -> the first n bits as 0/1 int64. Up to SMALL_EXPAND_WORDS words: numpy's
    unpackbits on the bytes of the same memory (little-endian: bit j of a word is bit j % 8
    of its byte j // 8), about a third of the CPU of the shifts and masks at LeNet's sizes."""
    if (type(words) is torch.Tensor and 0 < words.dim() and words.numel() <= SMALL_EXPAND_WORDS
            and n <= 64 * words.shape[-1]):  # (RSS passes its Replicated pairs: the shifts)
        b = words.contiguous().numpy().view(np.uint8)
        return torch.from_numpy(np.unpackbits(b, axis=-1, count=n, bitorder="little").astype(np.int64))
    return unpack_lanes(words, 1, n)


def _bit_luts() -> tuple[torch.Tensor, torch.Tensor]:
    """For every 16-bit value: its 8 odd bits and its 8 even bits, compressed (uint8)."""
    v = torch.arange(1 << 16, dtype=torch.int64)
    odd, even = torch.zeros_like(v), torch.zeros_like(v)
    for i in range(8):
        even |= ((v >> (2 * i)) & 1) << i
        odd |= ((v >> (2 * i + 1)) & 1) << i
    return odd.to(torch.uint8), even.to(torch.uint8)


_LUT_ODD, _LUT_EVEN = _bit_luts()
_LUT_ODD_NP, _LUT_EVEN_NP = _LUT_ODD.numpy(), _LUT_EVEN.numpy()


def halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Odd and even bits of packed groups, each re-packed into full words (half as many):
    pack_lanes(compress_even(x >> 1), 32) and pack_lanes(compress_even(x), 32), computed by
    a table lookup per 16 bits (8 compressed bits), whose bytes in order are the 32-bit
    halves of two consecutive words already packed into one word (little-endian): a few
    times less CPU than the shifts and masks. Up to SMALL_EXPAND_WORDS words the lookup runs
    on numpy views of the same memory (_halves_np: numpy's take on the 16-bit view, about
    half the CPU of torch's five dispatches at LeNet b1's sizes)."""
    if x.numel() <= SMALL_EXPAND_WORDS:
        odd, even = _halves_np(x.contiguous().numpy())
        return torch.from_numpy(odd), torch.from_numpy(even)
    x = _pad_last(x, 2)
    shape = (*x.shape[:-1], x.shape[-1] // 2)
    idx = x.contiguous().view(-1).view(torch.uint16).to(torch.int32)
    odd, even = _LUT_ODD.index_select(0, idx), _LUT_EVEN.index_select(0, idx)
    return odd.view(torch.int64).view(shape), even.view(torch.int64).view(shape)


def _halves_np(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """halves of a contiguous int64 array, on numpy: the 16-bit view's index converted to
    numpy's index type once for both lookups (take converts a uint16 index on each call)."""
    if a.shape[-1] % 2:
        a = np.concatenate([a, np.zeros((*a.shape[:-1], 1), dtype=np.int64)], -1)
    shape = (*a.shape[:-1], a.shape[-1] // 2)
    idx = a.reshape(-1).view(np.uint16).astype(np.intp)
    return (_LUT_ODD_NP.take(idx).view(np.int64).reshape(shape),
            _LUT_EVEN_NP.take(idx).view(np.int64).reshape(shape))


def quarters(x: torch.Tensor, halves_fn=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Bits 4j, 4j+1, 4j+2, 4j+3 of packed groups of width >= 4 (q0, q1, q2, q3), each
    re-packed into full words (a quarter as many). `halves_fn`: an implementation of halves
    (rss_binary passes its table-lookup one)."""
    if halves_fn is None and x.numel() <= SMALL_EXPAND_WORDS:
        # the three splits on numpy, converted back once per quarter (not once per split)
        hi, lo = _halves_np(x.contiguous().numpy())
        q3, q1 = _halves_np(hi)
        q2, q0 = _halves_np(lo)
        return tuple(torch.from_numpy(q) for q in (q0, q1, q2, q3))
    split = halves_fn or halves
    hi, lo = split(x)
    q3, q1 = split(hi)
    q2, q0 = split(lo)
    return q0, q1, q2, q3


def _halved_words(words: int) -> int:
    return -(-words // 2)


# ------------------------------------------------------------- masked polynomial terms
# Level 1 of the carry circuit from masked openings: inputs 0..3 are the bit planes
# s_lo, s_hi, c_lo, c_hi of 2-bit groups; a term is an AND of inputs, an output the XOR of
# its terms. G = s1 c1 ^ s1 s0 c0 ^ c1 s0 c0 ; P = (s1 ^ c1)(s0 ^ c0).
GROUP2_G = [(1, 3), (1, 0, 2), (3, 0, 2)]
GROUP2_P = [(1, 0), (1, 2), (3, 0), (3, 2)]
# Majority (carry of a full adder) of three inputs: ab ^ ac ^ bc.
MAJ3 = [(0, 1), (0, 2), (1, 2)]

# Radix-4 carry level. Inputs g0, g1, g2, p0, p1, p2, p3 of four groups (3 the most
# significant); g3 enters the result linearly and is never opened:
# G = g3 ^ p3 g2 ^ p3 p2 g1 ^ p3 p2 p1 g0 (the terms exclude each other, so XOR is OR),
# P = p3 p2 p1 p0.
CARRY4_G = [(6, 2), (6, 5, 1), (6, 5, 4, 0)]
CARRY4_P = [(6, 5, 4, 3)]
# The last level needs G only: inputs g0, g1, g2, p1, p2, p3.
CARRY4_G_ONLY = [(5, 2), (5, 4, 1), (5, 4, 3, 0)]
# Radix 2 (a level of width 2): inputs g0, p0, p1 (G = g1 ^ p1 g0, P = p1 p0), or g0, p1.
CARRY2_G = [(2, 0)]
CARRY2_P = [(2, 1)]
CARRY2_G_ONLY = [(1, 0)]
AND4 = [(0, 1, 2, 3)]
AND2 = [(0, 1)]


# expand_terms works on numpy views up to this many words per input (where an operator's
# dispatch outweighs its arithmetic), on torch above (whose kernels use every core).
SMALL_EXPAND_WORDS = 1 << 11
# expand_rows (a job on whole arrays) up to this many words per input (binary.eval_polys):
# above, its gathered copies cost more than expand_outputs' operations (a radix-4 level,
# one process: 2.3x less CPU at 432 words, 1.3x at 1080, even at 1200-1300, 1.3x more at 1536)
ROW_EXPAND_WORDS = 1152


def monomials(terms: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """Every product of >= 2 masks that the expansion of `terms` needs, in a fixed order."""
    out: set[tuple[int, ...]] = set()
    for term in terms:
        t = tuple(sorted(term))
        for k in range(2, len(t) + 1):
            out.update(combinations(t, k))
    return sorted(out, key=lambda s: (len(s), s))


def expand_terms(terms: Sequence[Sequence[int]], opened: Sequence[torch.Tensor],
                 mask: Sequence[torch.Tensor], mono: dict[tuple[int, ...], torch.Tensor],
                 lead: torch.Tensor) -> torch.Tensor:
    """This party's XOR share of XOR_T AND_{k in T} x_k, given public o_k = x_k ^ m_k.

    AND_{k in T} (o_k ^ m_k) = XOR over U subset of T of (AND_{T minus U} o) & (AND_U m):
    U empty is public (added through `lead`), |U| = 1 uses the mask share, |U| >= 2 the
    monomial share. Pure; a la Beaver's multiplication generalised to products of k bits.
    """
    return expand_outputs([terms], opened, mask, mono, lead)[0]


def expand_outputs(outputs: Sequence[Sequence[Sequence[int]]], opened: Sequence[torch.Tensor],
                   mask: Sequence[torch.Tensor], mono: dict[tuple[int, ...], torch.Tensor],
                   lead: torch.Tensor) -> list[torch.Tensor]:
    """expand_terms of each output's terms over the same opened values and shares: on the
    numpy path the numpy views of the shares and the products of opened values are made
    once for all outputs (a carry level's G and P share most of them)."""
    if lead.numel() > SMALL_EXPAND_WORDS:
        opened = [torch.from_numpy(x) if isinstance(x, np.ndarray) else x for x in opened]
        return [_expand_terms_torch(terms, opened, mask, mono, lead) for terms in outputs]
    # On numpy views of the same memory (no copies): for the few words of a small op, each
    # torch operator's dispatch costs more than its arithmetic, numpy's less (a LeNet b1
    # level: about a third less CPU). Products of opened values are computed once per call
    # (terms share their prefixes). `opened` may hold numpy arrays already (binary's
    # masked openings of small jobs).
    o = [x if x is None or isinstance(x, np.ndarray) else x.numpy() for x in opened]
    pubs: dict[tuple[int, ...], np.ndarray] = {}
    shares: dict[tuple[int, ...], np.ndarray] = {(): lead.numpy()}
    results = []
    for terms in outputs:
        out = np.zeros(lead.shape, dtype=np.int64)
        for u, rest in _expansion(tuple(tuple(term) for term in terms)):
            pub = pubs.get(rest)
            if pub is None and rest:
                pub = o[rest[0]]
                for j in rest[1:]:
                    pub = pub & o[j]
                pubs[rest] = pub
            share = shares.get(u)
            if share is None:
                share = shares[u] = (mask[u[0]] if len(u) == 1 else mono[u]).numpy()
            out ^= share if pub is None else share & pub
        results.append(torch.from_numpy(out))
    return results


@functools.lru_cache(maxsize=64)
def _expansion(terms: tuple[tuple[int, ...], ...]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """expand_terms' (U, T minus U) pairs of every term T, in its order (U empty: the public
    product, through `lead`): worked out once per circuit shape."""
    pairs = []
    for term in terms:
        t = tuple(sorted(term))
        for k in range(len(t) + 1):
            pairs += [(u, tuple(j for j in t if j not in u)) for u in combinations(t, k)]
    return pairs


@functools.lru_cache(maxsize=64)
def _row_plan(outputs: tuple, monos: tuple, lead: bool) -> tuple:
    """expand_rows' index arrays for one circuit shape and party (`outputs`: each output's
    terms as sorted tuples; `monos`: the rows of the monomial shares, in order; `lead`:
    whether this party adds the public products). The public products of opened values are
    rows of P: row 0 all ones (the empty product), then every needed product, each the
    product of an earlier row (its factors but the last) and one opened value, built level
    by level (`levels`: for each size, the rows of P it fills, their earlier rows and last
    factors). Each output is the XOR of rows of G, G = (shares gathered) & (P gathered):
    the mask shares' rows, the monomials', then (with `lead`) the public products of whole
    terms, whose P row is the empty product. `cuts`: where each output's rows start (of the
    outputs in `filled`, where some have no rows)."""
    mono_row = {m: i for i, m in enumerate(monos)}
    chosen_all = []
    for out in outputs:
        pairs = _expansion(out)
        chosen_all.append(([(u[0], rest) for u, rest in pairs if len(u) == 1],
                           [(mono_row[u], rest) for u, rest in pairs if len(u) > 1],
                           [(None, rest) for u, rest in pairs if not u and lead]))
    row = {(): 0}
    for chosen in chosen_all:
        for _, rest in (pair for c in chosen for pair in c):
            for j in range(1, len(rest) + 1):  # every prefix of a needed product is needed too
                row.setdefault(rest[:j], -1)
    products = sorted(row, key=lambda r: (len(r), r))
    row = {r: i for i, r in enumerate(products)}
    levels = []
    for size in range(1, max(map(len, products)) + 1):
        rows = [r for r in products if len(r) == size]
        levels.append((row[rows[0]], row[rows[-1]] + 1, np.asarray([row[r[:-1]] for r in rows], dtype=np.intp),
                       np.asarray([r[-1] for r in rows], dtype=np.intp)))
    gathers, pub_rows, cuts = [], [], []
    for single, multi, whole in chosen_all:
        cuts.append(len(pub_rows))
        gathers.append((np.asarray([a for a, _ in single], dtype=np.intp),
                        np.asarray([a for a, _ in multi], dtype=np.intp),
                        np.asarray([row[rest] for _, rest in whole], dtype=np.intp)))
        pub_rows += [row[rest] for _, rest in single + multi] + [0] * len(whole)
    # an output with no rows on this party (no terms; or only the empty term, which rank 0
    # alone adds) is 0: reduceat would give an empty segment the next row, so such outputs
    # leave the cuts and `filled` names the outputs the reduction fills (None: all of them)
    ends = cuts[1:] + [len(pub_rows)]
    filled = [i for i, (c, e) in enumerate(zip(cuts, ends)) if e > c]
    if len(filled) < len(cuts):
        cuts, filled = [cuts[i] for i in filled], np.asarray(filled, dtype=np.intp)
    else:
        filled = None
    return (len(products), levels, gathers, np.asarray(pub_rows, dtype=np.intp), np.asarray(cuts, dtype=np.intp),
            filled)


def expand_rows(outputs: Sequence[Sequence[Sequence[int]]], opened: np.ndarray, masks: np.ndarray,
                monos: np.ndarray, mono_order: Sequence[tuple[int, ...]], lead: bool) -> np.ndarray:
    """expand_outputs on whole arrays, for inputs XOR-shared by every party: `opened` and
    `masks` [k, words] (input j's opened value and mask share in row j), `monos`
    [len(mono_order), words] (the share of the product of mono_order[i]'s masks in row i:
    every monomial the expansion needs), `lead`: whether this party adds the public
    products (rank 0). Returns [outputs, words]: the same XORs of the same products as
    expand_outputs, in a few numpy operations per job whatever its terms (gathers, one AND,
    one XOR reduction) instead of two per product; up to ROW_EXPAND_WORDS words (the
    gathered copies outgrow the cache above: expand_outputs is faster there)."""
    key = tuple(tuple(tuple(sorted(t)) for t in out) for out in outputs)
    count, levels, gathers, pub_rows, cuts, filled = _row_plan(key, tuple(mono_order), bool(lead))
    words = opened.shape[1]
    pub = np.empty((count, words), dtype=np.int64)
    pub[0] = -1
    for lo, hi, prev, last in levels:
        np.bitwise_and(pub.take(prev, 0), opened.take(last, 0), out=pub[lo:hi])
    g = np.empty((len(pub_rows), words), dtype=np.int64)
    at = 0
    for rows_by_source in gathers:
        for source, rows in zip((masks, monos, pub), rows_by_source):
            if len(rows):
                source.take(rows, 0, out=g[at:at + len(rows)])
                at += len(rows)
    g &= pub.take(pub_rows, 0)
    if filled is None:
        return np.bitwise_xor.reduceat(g, cuts, 0)
    out = np.zeros((len(outputs), words), dtype=np.int64)
    if len(cuts):
        out[filled] = np.bitwise_xor.reduceat(g, cuts, 0)
    return out


def _expand_terms_torch(terms, opened, mask, mono, lead) -> torch.Tensor:
    """expand_terms on torch's operators (large inputs: torch's kernels use every core)."""
    out = torch.zeros_like(lead)
    for term in terms:
        t = tuple(sorted(term))
        for k in range(len(t) + 1):
            for u in combinations(t, k):
                pub = None
                for j in t:
                    if j not in u:
                        pub = opened[j] if pub is None else pub & opened[j]
                if k == 0:
                    out = out ^ (lead & pub)
                    continue
                share = mask[u[0]] if k == 1 else mono[u]
                out = out ^ (share if pub is None else share & pub)
    return out


def group2_planes(s: torch.Tensor, c: torch.Tensor) -> list[torch.Tensor]:
    """The 4 input planes of level 1: s_lo, s_hi, c_lo, c_hi, lane-packed 32 per element."""
    s_hi, s_lo = halves(s)
    c_hi, c_lo = halves(c)
    return [s_lo, s_hi, c_lo, c_hi]


def pad_operands(s: torch.Tensor, c: torch.Tensor, lead: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """s_63 := 0 and c_63 := 1, so that the G of the 64 bits is the carry into bit 63."""
    return s & LOW63, (c & LOW63) ^ (lead & TOP)


# ------------------------------------------------------------------------ carry tree
def _carry_level(g: torch.Tensor, p: torch.Tensor, width: int, want_p: bool):
    """One radix-4 (or, at width 2, radix-2) level: (inputs, outputs, finish), where
    finish(results) -> (G, P or None, new width)."""
    if width >= 4:
        g0, g1, g2, g3 = quarters(g)
        p0, p1, p2, p3 = quarters(p)
        if width == 4 and not want_p:
            return [g0, g1, g2, p1, p2, p3], [CARRY4_G_ONLY], lambda r: (g3 ^ r[0], None, 1)
        return [g0, g1, g2, p0, p1, p2, p3], [CARRY4_G, CARRY4_P], lambda r: (g3 ^ r[0], r[1], width // 4)
    g1, g0 = halves(g)
    p1, p0 = halves(p)
    if want_p:
        return [g0, p0, p1], [CARRY2_G, CARRY2_P], lambda r: (g1 ^ r[0], r[1], 1)
    return [g0, p1], [CARRY2_G_ONLY], lambda r: (g1 ^ r[0], None, 1)


def carry_trees(tasks: Sequence[tuple[torch.Tensor, torch.Tensor, int, bool]],
                poly_fn: PolyFn) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Several radix-4 carry trees in lockstep (one poly_fn round per level for all of them).

    A task is (g, p, width, want_p): lane-packed group generate/propagate words of `width`
    groups per element (a power of 2). Returns each task's (G, P) of all its groups, one bit
    per element packed 64 per word in element order; P is None unless want_p.
    """
    state = [[g, p if want_p or width > 1 else None, width, want_p] for g, p, width, want_p in tasks]
    while any(t[2] > 1 for t in state):
        live, jobs = [], []
        for t in state:
            if t[2] > 1:
                inputs, outputs, finish = _carry_level(*t[:4])
                live.append((t, finish))
                jobs.append((inputs, outputs))
        for (t, finish), results in zip(live, poly_fn(jobs)):
            t[0], t[1], t[2] = finish(results)
    return [(t[0], t[1]) for t in state]


def carry_plan(words: int, width: int, want_p: bool = False) -> list[tuple[int, int, list]]:
    """(words, inputs, outputs) of each level of carry_trees on `words` lane-packed words of
    `width` groups per element: what the levels will ask poly_fn for (to prefetch it)."""
    plan = []
    while width > 1:
        if width >= 4:
            words = _halved_words(_halved_words(words))
            if width == 4 and not want_p:
                plan.append((words, 6, [CARRY4_G_ONLY]))
            else:
                plan.append((words, 7, [CARRY4_G, CARRY4_P]))
            width //= 4
        else:
            words = _halved_words(words)
            plan.append((words, 3, [CARRY2_G, CARRY2_P]) if want_p else (words, 2, [CARRY2_G_ONLY]))
            width = 1
    return plan


def carry_tree(g: torch.Tensor, p: torch.Tensor, width: int, poly_fn: PolyFn) -> torch.Tensor:
    """Group-generate of `width` bits per element (lane-packed words) -> 1 bit per element:
    carry_trees of one task. Returns words with one bit per element, 64 elements per word,
    in element order."""
    return carry_trees([(g, p, width, False)], poly_fn)[0][0]


def and_tree(x: torch.Tensor, width: int, and_fn: AndFn | None = None,
             poly_fn: PolyFn | None = None) -> torch.Tensor:
    """AND of the `width` bits of each element (lane-packed) -> 1 bit per element.

    With poly_fn: four bits per round (64 -> 16 -> 4 -> 1: 3 rounds); with and_fn: two."""
    if poly_fn is not None:
        while width > 1:
            if width >= 4:
                ((x,),) = poly_fn([(list(quarters(x)), [AND4])])
                width //= 4
            else:
                ((x,),) = poly_fn([(list(halves(x)), [AND2])])
                width //= 2
        return x
    while width > 1:
        hi, lo = halves(x)
        (x,) = and_fn([(hi, lo)])
        width //= 2
    return x


def msb_from_group2(g: torch.Tensor, p: torch.Tensor, top: torch.Tensor, poly_fn: PolyFn) -> torch.Tensor:
    """Level-1 outputs (32 groups per element) + top bits (packed) -> packed msb shares."""
    return carry_tree(g, p, 32, poly_fn) ^ top


# ------------------------------------------------------------- full adders (A2B)
def kogge_stone_add(s: torch.Tensor, c: torch.Tensor, and_fn: AndFn) -> torch.Tensor:
    """Shares of s + c mod 2^64 (all 64 sum bits) by a Kogge-Stone prefix adder [KS73].

    One round for g = s & c, then 6 rounds of 2 batched ANDs on full words.
    """
    (g,) = and_fn([(s, c)])
    p = s ^ c
    prop = p
    for level in range(6):
        k = 1 << level
        t, prop_next = and_fn([(prop, g << k), (prop, prop << k)])
        g = g ^ t
        prop = prop_next
    return p ^ (g << 1)


def csa(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, maj: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Carry-save step: a + b + c = (a ^ b ^ c) + 2 maj(a, b, c) mod 2^64."""
    return a ^ b ^ c, maj << 1
