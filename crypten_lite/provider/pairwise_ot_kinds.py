"""Provider pairwise's OT kinds: the correlations whose cross products have a bit as one
factor, made by oblivious transfer (provider/ot.py) between the two parties alone.

bit, binary_triple, trunc(_exact), bit_mul and binary_monomials: their cross terms are the
OT rows of the table in provider/pairwise.py's docstring (one table, kept there).

Each maker takes the provider (its PRG, its CorrelatedOT `_ot`, its framed channel) and this
party's derived components; PairwiseProvider (provider/pairwise.py) runs it inside one
request's exchange. This module does not import pairwise.py (no import circle).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

from ..errors import ProtocolError
from . import correlations

if TYPE_CHECKING:  # pragma: no cover
    from .pairwise import PairwiseProvider

OT_BYTES = 256             # working set of one OT in an IKNP extension (matrices, hashes)


def _u(t: torch.Tensor) -> np.ndarray:
    """A ring tensor's elements as uint64 (a copy, contiguous)."""
    return t.detach().contiguous().clone().numpy().view(np.uint64)


def _v(t: torch.Tensor) -> np.ndarray:
    """A ring tensor's elements as uint64 on its memory where contiguous (no copy): only for
    reading into a new array (np.stack, np.concatenate), never written."""
    return t.detach().contiguous().numpy().view(np.uint64)


def _t(a: np.ndarray, shape=None) -> torch.Tensor:
    out = torch.from_numpy(np.ascontiguousarray(a).view(np.int64).copy())
    return out.view(shape) if shape is not None else out


def _bits(words: torch.Tensor) -> np.ndarray:
    """[n] words -> [n, 64] bits (uint64 0/1), least significant first."""
    w = _u(words).reshape(-1, 1)
    return (w >> np.arange(64, dtype=np.uint64)) & np.uint64(1)


def _words(bits: np.ndarray) -> np.ndarray:
    """[n, 64] bits (only bit 0 of each entry used) -> [n] words."""
    return np.bitwise_or.reduce((bits & np.uint64(1)) << np.arange(64, dtype=np.uint64), axis=-1)


LANES = 2                  # 64-bit products padded by one random OT's 128-bit keys


def _choice(keys, shape) -> torch.Tensor:
    """The chooser's free choice bits of a set of random OTs as a 0/1 int64 tensor."""
    return torch.from_numpy(keys.choice.astype(np.int64)).view(shape)


def _rot_products(pv: "PairwiseProvider", items: list[tuple]) -> list[np.ndarray]:
    """Additive shares mod 2^64 of c_j * x_lj from random OTs (keys: ot.OTKeys of m OTs, c
    the chooser's bits): items (keys, values, lanes) in the same order on both parties,
    values [lanes, m] uint64 from the non-chooser (None where this party chooses), lanes <=
    LANES. Each OT's two 128-bit keys pad `lanes` products of its one bit, a 64-bit half each
    (k_b the keys: the non-chooser sends y = k_0 + x - k_1 and keeps -k_0, the chooser takes
    k_c + c y), and the keys are dropped: nothing is padded twice. Every correction of this
    party goes in one message, sent before the peer's is read: one message each way in all.
    Returns [lanes, m] uint64 per item."""
    out, send, recv = [], [], []
    for keys, values, lanes in items:
        if keys.keys is None or keys.uses or not 1 <= lanes <= LANES:
            raise ProtocolError(f"party {pv.rank}: random-OT keys already used, or {lanes} "
                                f"products per OT (at most {LANES})")
        k, choice = keys.keys, keys.choice
        keys.keys, keys.choice, keys.uses = None, None, 1
        if pv.rank == keys.chooser:
            recv.append((len(out), k[0][:, :lanes].T, choice, lanes, keys.m))
            out.append(None)
            continue
        x = np.ascontiguousarray(values, dtype=np.uint64).reshape(lanes, keys.m)
        with np.errstate(over="ignore"):
            send.append((k[0][:, :lanes].T + x - k[1][:, :lanes].T).reshape(-1))
            out.append(np.uint64(0) - k[0][:, :lanes].T)
    if sum(part.size for part in send):          # nothing at all for empty requests (the
        pv._send_data(np.concatenate(send).tobytes())   # peer then expects nothing either)
    need = sum(lanes * m for _, _, _, lanes, m in recv)
    if need:
        data = pv._recv_data()
        if len(data) != 8 * need:
            raise ProtocolError(f"party {pv.rank}: expected {8 * need} bytes of random-OT "
                                f"corrections, got {len(data)}; the parties are out of step")
        y_all, at = np.frombuffer(data, dtype=np.uint64), 0
        for i, kc, choice, lanes, m in recv:
            y = y_all[at:at + lanes * m].reshape(lanes, m)
            at += lanes * m
            with np.errstate(over="ignore"):
                out[i] = kc + choice.astype(np.uint64) * y
    return out


def _bit(pv: "PairwiseProvider", parts, op, shapes, params):
    """r0 * r1 on one free-choice random OT per bit (_bit_steps, driven alone)."""
    if parts[0].numel() == 0:
        return [parts[0], parts[0].clone()]
    return _drive_monomials(pv, [_bit_steps(pv, parts)])[0]


def _bit_steps(pv: "PairwiseProvider", parts):
    """bit as a generator (_drive_monomials): r0 * r1 on one free-choice random OT per bit,
    rank 1's share r1 its choice bits; ra = r - 2 r0 r1."""
    r = parts[0]
    n = r.numel()
    if n == 0:
        return [r, r.clone()]
    made = yield ("ots", ([], [n]), None)
    keys = made[1][0][0]
    if pv.rank == 1:
        r = _choice(keys, r.shape)
    (prod,) = yield ("arith", [(keys, _u(r).reshape(1, n) if pv.rank == 0 else None, 1)])
    return [r, r - 2 * _t(prod[0]).view(r.shape)]


def _binary_triple(pv: "PairwiseProvider", parts, op, shapes, params):
    a, b = parts[0], parts[1]
    ab, bb = _bits(a), _bits(b)
    x, y = (ab, bb) if pv.rank == 0 else (bb, ab)
    cross = _t(_words(pv.cross_and(x, y))).view(a.shape)
    return [a, b, (a & b) ^ cross]


def _random_bits(pv: "PairwiseProvider", w: torch.Tensor) -> torch.Tensor:
    """[n, 64] arithmetic shares of the bits of r = w0 XOR w1."""
    bits = _bits(w.reshape(-1))
    prod = _t(pv.ot_product(bits.reshape(-1), 1, 64)).view(bits.shape)
    return _t(bits).view(bits.shape) - 2 * prod


def _ring(values: list[int]) -> torch.Tensor:
    """Python integers mod 2^64 as an int64 tensor."""
    return torch.tensor([v - (1 << 64) if v >= 1 << 63 else v for v in values], dtype=torch.int64)


def _combine(d: torch.Tensor, bits: int, shape) -> list[torch.Tensor]:
    """Shares of r = Sum_j 2^j b_j, r >> bits (logical) and msb(r) from shares d of the bits."""
    r = (d * _ring([1 << j for j in range(64)])).sum(-1)
    rt = (d * _ring([1 << (j - bits) if j >= bits else 0 for j in range(64)])).sum(-1)
    return [r.view(shape), rt.view(shape), d[:, 63].contiguous().view(shape)]


def _trunc(pv: "PairwiseProvider", parts, op, shapes, params):
    w = parts[0]
    r, rt, m = _combine(_random_bits(pv, w), params[0], w.shape)
    return [r, rt, m]


def _trunc_exact(pv: "PairwiseProvider", parts, op, shapes, params):
    w = parts[0]
    bits = params[0]
    r, rt, m = _combine(_random_bits(pv, w), bits, w.shape)
    low = w & ((1 << bits) - 1) if bits < 64 else w
    return [r, low, rt, m]


def _bit_mul(pv: "PairwiseProvider", parts, op, shapes, params):
    """ra = r - 2 r0 r1 and shares of (r0 XOR r1) a: the cross terms r0 * r1 and w0 * rb1
    (rank 1 chooses with r1) and rb0 * w1 (rank 0 chooses with r0), w = (1 - 2 rb) a. One
    value per bit (a of r's shape): _bit_mul_steps, driven alone; else correlated OTs both
    ways (ot.products_both, 1 + 2 w per row)."""
    r, a = parts[0], parts[1]
    n = r.numel()
    if n and a.numel() == n:
        return _drive_monomials(pv, [_bit_mul_steps(pv, parts)])[0]
    rb = r.expand_as(a)
    w = (1 - 2 * rb) * a
    # r0 * r1 (ra = r - 2 r0 r1) and w0 * rb1 (rank 1 chooses), rb0 * w1 (rank 0 chooses):
    # correlated OTs both ways at once (ot.products_both: one message each way per step)
    first, both = pv._ot.products_both(
        (_u(rb if pv.rank == 0 else w).reshape(-1),
         np.concatenate([_u(r).reshape(-1), _u(w if pv.rank == 0 else rb).reshape(-1)])), 64)
    ra = r - 2 * _t(both[:n]).view(r.shape)
    second = both[n:]
    with np.errstate(over="ignore"):
        cross = _t(first + second).view(a.shape)
    return [r, a, ra, rb * a + cross]


def _bit_mul_steps(pv: "PairwiseProvider", parts):
    """bit_mul of one value per bit as a generator (_drive_monomials): a free-choice random
    OT per bit and chooser, each party's r its choice bits, rank 1's two products (r0 * r1,
    w0 * r1) on one OT's two key halves: 2 OTs per element, no flips on the wire."""
    r, a = parts[0], parts[1]
    n = r.numel()
    if n == 0:
        return [r, a, r.clone(), a.clone()]
    made = yield ("ots", ([n], [n]), None)
    sets = (made[0][0][0], made[1][0][0])
    r = _choice(sets[pv.rank], r.shape)
    w = (1 - 2 * r.expand_as(a)) * a
    values = [_u(w).reshape(1, n), None] if pv.rank == 1 else \
        [None, np.stack([_u(r).reshape(n), _u(w).reshape(n)])]
    first, both = yield ("arith", [(sets[0], values[0], 1), (sets[1], values[1], 2)])
    ra = r - 2 * _t(both[0]).view(r.shape)
    with np.errstate(over="ignore"):
        cross = _t(first[0] + both[1]).view(a.shape)
    return [r, a, ra, r.expand_as(a) * a + cross]


def _binary_monomials(pv: "PairwiseProvider", parts, op, shapes, params):
    """XOR shares of AND-products of masks (_balanced_steps, driven alone)."""
    return _drive_monomials(pv, [_balanced_steps(pv, parts, params)])[0]


def _reversed_params(k: int, owners, subsets) -> tuple:
    """The same products with the masks in reverse order (mask j as mask k - 1 - j)."""
    rev = [sum(1 << (k - 1 - j) for j in range(k) if s >> j & 1) for s in subsets]
    return correlations.monomial_params(list(owners)[::-1], rev)


@functools.lru_cache(maxsize=128)
def _one_sided(params: tuple) -> bool:
    """Whether every random OT of the request has one chooser and the reversed mask order
    has the other one alone (masks owned by the parties, e.g. a comparison's first carry
    level, owners 0, 0, 1, 1: party 1 chooses with its masks, or party 0 with its own)."""
    k, owners, subsets = correlations._split_monomial_params(params)
    mine = {c for _, c in _monomial_plan(tuple(owners), tuple(subsets))[1]}
    _, ro, rs = correlations._split_monomial_params(_reversed_params(k, owners, subsets))
    theirs = {c for _, c in _monomial_plan(tuple(ro), tuple(rs))[1]}
    return len(mine) == 1 and theirs == {1 - next(iter(mine))}


def _balanced_steps(pv: "PairwiseProvider", parts, params):
    """_monomial_steps, and where its random OTs all have one chooser (_one_sided), its
    second half of the words made with the masks in reverse order, whose random OTs the
    other party chooses: the same products and OT count, each direction's COTs (and the
    sender's two hashes per OT) about half of them, so neither party does most of the work.
    Both halves' steps merged into one generator (one ots request, one layer per round)."""
    k, owners, subsets = correlations._split_monomial_params(params)
    n = parts[0].numel()
    if n < 2 or not _one_sided(tuple(params)):
        return (yield from _monomial_steps(pv, parts, params))
    h = n // 2
    flat = [p.reshape(-1) for p in parts]
    rparams = _reversed_params(k, owners, subsets)
    gens = [_monomial_steps(pv, [p[:h] for p in flat], params),
            _monomial_steps(pv, [p[h:] for p in flat[:k]][::-1] + [p[h:] for p in flat[k:]], rparams)]
    wants = [next(g) for g in gens]
    made = yield ("ots", tuple(wants[0][1][c] + wants[1][1][c] for c in (0, 1)),
                  tuple(wants[0][2][c] + wants[1][2][c] for c in (0, 1)))
    replies = [tuple(made[c][:len(wants[0][1][c])] for c in (0, 1)),
               tuple(made[c][len(wants[0][1][c]):] for c in (0, 1))]
    outs: list = [None, None]
    live = [0, 1]
    while live:
        items, still = [], []
        for i in live:
            try:
                _, got = gens[i].send(replies[i])
            except StopIteration as done:
                outs[i] = done.value
                continue
            items.append(got)
            still.append(i)
        if not still:
            break
        shares = yield ("layer", [it for got in items for it in got])
        at = 0
        for i, got in zip(still, items):
            replies[i] = shares[at:at + len(got)]
            at += len(got)
        live = still
    first, second = outs
    second = second[:k][::-1] + second[k:]
    shape = parts[0].shape
    return [torch.cat([a.reshape(-1), b.reshape(-1)]).view(shape) for a, b in zip(first, second)]


def _drive_monomials(pv: "PairwiseProvider", steps: list) -> list:
    """Run OT-kind generators (_monomial_steps, _bit_steps, _bit_mul_steps) in lockstep.
    Each first yields ("ots", sizes, pads): its sets of free-choice random OTs per chooser
    and, per set, the pad bits to prepare (None: the keys as they are). The sets of all of
    them are made in calls of ot.random_ots_both of at most the OT chunk (both directions'
    extensions interleaved), each set prepared as soon as it is made, so that only one
    call's random-OT keys are alive at a time. Then, round by round, what every generator
    still running asks for: ("arith", items) of all of them in one _rot_products (one
    message per party), ("layer", items) in one ot.transfer_packed_many (one message per
    party), however many correlations. Both parties run the same generators in the same
    order. Returns each generator's components."""
    out: list = [None] * len(steps)
    wants, done_ = [], set()
    for i, g in enumerate(steps):                          # ("ots", sizes, pads)
        try:
            wants.append(next(g))
        except StopIteration as done:                      # nothing to make (no elements)
            out[i] = done.value
            done_.add(i)
            wants.append(("ots", ([], []), None))
    made = _make_sets(pv, wants)
    replies = [made[i] for i in range(len(steps)) if i not in done_]
    active = [i for i in range(len(steps)) if i not in done_]
    while active:
        ariths, layers, still = [], [], []
        for i, reply in zip(active, replies):
            try:
                what, items = steps[i].send(reply)         # ("arith" | "layer", items)
            except StopIteration as done:
                out[i] = done.value
                continue
            (ariths if what == "arith" else layers).append((i, items))
            still.append(i)
        if not still:
            break
        got: dict[int, list] = {}
        for batch, run in ((ariths, lambda flat: _rot_products(pv, flat)),
                           (layers, pv._ot.transfer_packed_many)):
            if not batch:
                continue
            shares, at = run([item for _, items in batch for item in items]), 0
            for i, items in batch:
                got[i] = shares[at:at + len(items)]
                at += len(items)
        replies = [got[i] for i in still]
        active = still
    return out


def _make_sets(pv: "PairwiseProvider", wants: list) -> list:
    """The free-choice random OTs every generator asked for (its ("ots", sizes, pads)), in
    calls of ot.random_ots_both of at most the OT chunk, each set prepared as soon as it is
    made (one call's keys alive at a time). Returns, per generator and chooser, one
    (OTKeys, the chooser's bits as words where prepared) per set."""
    made = [([None] * len(w[1][0]), [None] * len(w[1][1])) for w in wants]
    pending: tuple[list, list] = ([], [])                  # per chooser: (step, set, m, g)
    budget = max(8, pv._ot.chunk)

    def flush() -> None:                # prepared sets: the keys dropped, pad rows only
        got = pv._ot.random_ots_both(tuple([m for _, _, m, _ in pending[c]] for c in (0, 1)),
                                     tuple([g for _, _, _, g in pending[c]] for c in (0, 1)))
        for c in (0, 1):
            for (i, j, _, g), keys in zip(pending[c], got[c]):
                words = None                    # the chooser's bits of a prepared set as words:
                if g and pv._ot.rank == c:      # its packed choice row, a read-only view (the
                    words = keys.rows[1].view(np.uint64)    # steps copy it: _t)
                    words.flags.writeable = False
                made[i][c][j] = (keys, words)
            pending[c].clear()
    for i, (_, sizes, pads) in enumerate(wants):
        for c in (0, 1):
            for j, m in enumerate(sizes[c]):
                total = sum(e[2] for e in pending[0]) + sum(e[2] for e in pending[1])
                if total and total + m > budget:
                    flush()
                pending[c].append((i, j, m, None if pads is None else pads[c][j]))
    if pending[0] or pending[1]:
        flush()
    return made


@functools.lru_cache(maxsize=128)
def _monomial_plan(owners: tuple, subsets: tuple) -> tuple[frozenset, dict]:
    """A binary_monomials request's products to make (every subset and its prefixes, the
    subset less its largest mask, of degree >= 2) and its (top, chooser) sets of random OTs
    with the transfers (pad bits) each serves: public, the same on both parties (owners are
    public). A product of masks one party owns is local; a cross term x0 & y1 is chosen by
    party 1 with its share of the top y, y0 & x1 by party 0. Callers do not modify them."""
    needed: set[int] = set()
    for sub in subsets:
        while sub and sub & (sub - 1) and sub not in needed:
            needed.add(sub)
            sub &= ~(1 << (sub.bit_length() - 1))
    owner = {1 << j: o for j, o in enumerate(owners)}
    sets: dict[tuple[int, int], int] = {}       # (top, chooser) -> transfers (pad bits) it serves
    for m in sorted(needed, key=lambda v: (bin(v).count("1"), v)):
        top = 1 << (m.bit_length() - 1)
        ox, oy = owner[m & ~top], owner[top]
        if ox == oy and ox != -1:
            owner[m] = ox
            continue
        if ox != 1 and oy != 0:
            sets[(top, 1)] = sets.get((top, 1), 0) + 1
        if ox != 0 and oy != 1:
            sets[(top, 0)] = sets.get((top, 0), 0) + 1
        owner[m] = -1
    return frozenset(needed), sets


def _monomial_steps(pv: "PairwiseProvider", parts, params):
    """XOR shares of AND-products of masks, as a generator (yields what it needs from the
    peer: ("ots", sizes) for random_ots_both, then ("layer", items) for each layer's
    transfer_packed_many; returns the components). A product is built from its prefix (the
    subset less its largest mask, the *top*), one AND layer per degree, each prefix once; a product
    of masks that one party owns is local, and only the cross terms that are not zero are
    computed: x0 & y1 (party 1 chooses with its share of the top y) and y0 & x1 (party 0
    chooses with its share). Every cross term with the same top and chooser, in every layer,
    rides on the same random OTs (one per bit, made at the top's first use): each use is one
    transfer of fresh pads derived from the OT keys (provider/ot.py, OTKeys)."""
    k, owners, subsets = correlations._split_monomial_params(params)
    shape = parts[0].shape
    n = int(np.prod(shape)) if len(shape) else 1
    # value of a subset (bitmask): (this party's XOR share as words, owner: -1 = shared)
    values: dict[int, tuple[torch.Tensor, int]] = {}
    for j, o in enumerate(owners):
        share = parts[j] if o == -1 or o == pv.rank else torch.zeros_like(parts[j])
        values[1 << j] = (share, o)
    needed, sets = _monomial_plan(tuple(owners), tuple(subsets))
    keys: dict[tuple[int, int], object] = {}     # (top, chooser) -> OTKeys
    masks = list(parts[:k])
    # the chooser's value of a top mask (its share, or the mask it owns) is a fresh uniform
    # value of its own: the OTs choose it (ot.random_ot's `free`: silent COTs' own random
    # bits, no derandomizing message) and it replaces the drawn one; both choosers' OTs are
    # made at once, their extensions interleaved (ot.random_ots_both)
    tops = [sorted(t for t, c in sets if c == chooser) for chooser in (0, 1)]
    # one pad bit per OT and cross term: the driver prepares each set as it is made
    made = yield ("ots", tuple([n * 64] * len(tops[c]) for c in (0, 1)),
                  tuple([sets[(t, c)] for t in tops[c]] for c in (0, 1)))
    for chooser in (0, 1):
        for t, (got, words) in zip(tops[chooser], made[chooser]):
            if pv.rank == chooser:
                word = _t(words).view(shape)
                values[t] = (word, values[t][1])
                masks[t.bit_length() - 1] = word
            keys[(t, chooser)] = got
    for degree in range(2, k + 1):
        layer = sorted(m for m in needed if bin(m).count("1") == degree)
        if not layer:
            continue
        plans, groups = _layer_plan(layer, values)
        crosses: dict[int, torch.Tensor] = {}
        items = []
        for (top, chooser), members in sorted(groups.items()):
            sender = None
            if pv.rank != chooser:   # x's words as bytes are its bits packed (OT i*64 + j: bit j of word i)
                sender = np.stack([_v(x).reshape(-1).view(np.uint8) for _, x in members])
            items.append((keys[(top, chooser)], sender, len(members)))
        # the layer's transfers of both choosers in one message per party (sent at once,
        # with the same round's layers of the other correlations driven alongside)
        shares = yield ("layer", items)
        for ((top, chooser), members), share in zip(sorted(groups.items()), shares):
            for (m, _), bits in zip(members, share):
                word = _t(bits.view(np.uint64)).view(shape)
                crosses[m] = crosses[m] ^ word if m in crosses else word
        for m, x, y, owner in plans:
            value = x & y
            if m in crosses:
                value = value ^ crosses[m]
            values[m] = (value, owner)
    out = [values[sub][0] if sub & (sub - 1) else values[sub][0].clone() for sub in subsets]
    return masks + out


def _layer_plan(layer: list, values: dict) -> tuple[list, dict]:
    """One AND layer of _monomial_steps: each product m of the layer as (m, x, y, owner) (x
    its prefix's value, y its top's; owner -1: shared, computed locally where one party owns
    both), and its cross terms grouped by (top, chooser): [(m, the sender's operand x)]."""
    groups: dict[tuple[int, int], list] = {}
    plans = []
    for m in layer:
        top = 1 << (m.bit_length() - 1)
        (x, ox), (y, oy) = values[m & ~top], values[top]
        if ox == oy and ox != -1:                    # one owner: local
            plans.append((m, x, y, ox))
            continue
        if ox != 1 and oy != 0:                      # x0 & y1: party 1 chooses with y1
            groups.setdefault((top, 1), []).append((m, x))
        if ox != 0 and oy != 1:                      # y0 & x1: party 0 chooses with y0
            groups.setdefault((top, 0), []).append((m, x))
        plans.append((m, x, y, -1))
    return plans, groups


def _monomial_bytes(params) -> int:
    """binary_monomials' working set per element: 768 bytes per (top mask, chooser) set of
    random OTs (64 OTs per element: the pad rows a set keeps once prepared, its transfers
    and products), 3 KB for the random-OT keys of the set being made (up to 32 bytes an OT
    and the COTs they come from: _drive_monomials prepares each set as it is made, so one
    call's keys are alive at a time) and 64 bytes per subset (its words). Measured per
    party (tracemalloc, a party per process, the peak of one request of 8000 words, a
    silent-pool step included; estimate in brackets): k = 7 shared (6 sets, 22 subsets)
    8.1 KB (9.1), k = 4 shared (6 sets, 11 subsets) 7.9 KB (8.4), k = 4 owners 0, 0, 1, 1
    (2 sets) 4.4 KB (4.9), k = 2 (2 sets) 4.0 KB (4.7)."""
    k, owners, subsets = correlations._split_monomial_params(params)
    return 768 * len(_monomial_plan(tuple(owners), tuple(subsets))[1]) + 3072 + 64 * len(subsets)


# working set per element of the elementwise OT kinds (bytes; _chunked slices by it)
ELEMENT_BYTES: dict[str, Callable] = {
    "binary_triple": lambda params: 6144,     # 2 x 64 bits as words, shares, OT outputs
    "trunc": lambda params: 6144,             # 64 bits as words, their products (5.7 KB measured)
    "trunc_exact": lambda params: 6144,
    "binary_monomials": _monomial_bytes,
    # one (bit) and two (bit_mul, one value per bit) random OTs per element, OT_BYTES each: so that
    # prefetch makes a plan's small ones of a kind in one exchange (_ot_groups; bit_mul only
    # where its two shapes are alike, (m, 1): otherwise it is made alone, unsliced)
    "bit": lambda params: OT_BYTES,
    "bit_mul": lambda params: 2 * OT_BYTES,
}


# the OT kinds made as generators (_drive_monomials drives several in one exchange); bit_mul
# only with one value per bit (its grouped requests: _ot_groups joins equal sizes only)
STEPS: dict[str, Callable] = {
    "binary_monomials": lambda pv, parts, params: _balanced_steps(pv, parts, tuple(params)),
    "bit": lambda pv, parts, params: _bit_steps(pv, parts),
    "bit_mul": lambda pv, parts, params: _bit_mul_steps(pv, parts),
}
