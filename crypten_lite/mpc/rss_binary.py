"""Binary protocols and conversions on 2-out-of-3 replicated shares (3 parties, no dealer).

Same functions and semantics as binary.py / convert.py (protocol.py routes to them under
``rss``): shares are ``Replicated`` (party i holds components (x_i, x_{i+1})); binary words
are XOR sharings x = x_0 ^ x_1 ^ x_2 of bit-packed int64 words, arithmetic values sums mod
2^64. F(k_ij) is the next draw of the stream that parties i and j share (purpose "rss-rand",
``Session.pair_prg``); every protocol call draws fresh values, and every party draws its
pairwise values at the start of a call in one canonical order, so the streams stay in step.
A la [AFL+16] (replicated AND), [MR18] (ABY3), [KS73] (carry trees), [DSZ15] (B2A by a masked
opening), [RW19]/[EGK+20] (random shared bits).

**Roles.** A protocol on n elements runs on three chunks at once; chunk k gives party k+j
role j (mod 3), so every party plays every role on a third of the elements and the bytes
below (per element, per role) average out evenly. Component j of a chunk's role indexing
is held by roles j and j-1. A call on fewer than SPLIT_WORDS (256) words of 64 elements runs
as one chunk, its rotation the number of words mod 3 (``_chunks``): fewer messages, the same
rounds.

**AND** (``and_many``, 1 round): party i computes t_i = x_i y_i ^ x_i y_{i+1} ^ x_{i+1} y_i
^ alpha_i, alpha_i = F(k_{i,i+1}) ^ F(k_{i-1,i}) (a fresh zero sharing), and sends t_i to
i-1: (t_i, t_{i+1}). 8 B per AND word per party.

**Carry of a + b** (``_carry``), a known to roles 0 and 2, b known to role 1 (for x
replicated: a = x_0, b = x_1 + x_2): every term of the 2-bit-group generate and propagate
G2 = a1 b1 ^ a1 a0 b0 ^ a0 (b1 b0),  P2 = a1 a0 ^ a1 b0 ^ a0 b1 ^ b1 b0
is (function of a) & (function of b). Then roles 0 and 2 evaluate the carry tree as two
parties with role 1 as their dealer:
  1. (round 1) role 1 sends m = h(b) ^ rho to role 0 (h = the planes b0, b1, b1 b0 of the 32
     groups, plus any extra bit planes; rho = F(k_12)), and to role 2 the correcting shares
     of the AND triples of every tree level (role 0's triple shares and masks are F(k_01),
     role 2's F(k_12); role 1 knows both and sends c_2 = a b ^ c_0). Role 0 computes f(a) & m,
     role 2 f(a) & rho: an XOR sharing of (G2, P2) between roles 0 and 2.
  2. (rounds 2..) per level of two groups, roles 0 and 2 open e = P_hi ^ alpha,
     d = G_lo ^ gamma, d' = P_lo ^ gamma' to each other (P_hi is one operand of both ANDs of a
     level, so one mask serves both: 3 words for 2 ANDs) and compute Beaver's shares. The
     last level takes the final FOUR groups at once (G only, circuits.CARRY4_G_ONLY): roles 0
     and 2 open their 6 inputs masked, role 1 having dealt in round 1 the 15 mask products
     (the dealer-style masked polynomial of binary.eval_polys): one round instead of two, for
     a few more words from role 1 on the level's few words.
  Privacy: role 0 receives h ^ rho (rho unknown to it) and role 2's openings, masked by
  role 2's mask shares F(k_12) (unknown to role 0); role 2 receives c_2, masked by c_0 =
  F(k_01), and role 0's openings, masked by F(k_01); role 1 receives nothing. Fresh masks on
  every level and call.

**MSB** (``msb_words``): a = x_0 with bit 63 := 0, b = x_1 + x_2 with bit 63 := 1, so the
G of the 64 bits is the carry into bit 63; msb = a_63 ^ b_63 ^ carry (roles 0/2 XOR shares).
  Rounds 1-5 as above (1 + 4 levels: 32 -> 16 -> 8 -> 4 -> 1 groups), then round 6 turns
  the XOR sharing (u at role 0, v at role 2) into replicated shares: z_1 = F(k_01), z_0 =
  u ^ z_1 ^ F(k_02) sent by role 0 to role 2, z_2 = v ^ F(k_02) sent by role 2 to role 1
  (each masked by a seed the receiver lacks). Bytes per element: role 0 and role 2
  11.25 + 0.125, role 1 12.125 + 8.875.

**Bit injection** (``finish``, ``b2a``, ``bit_mul``, a la [DSZ15] with a random bit made by
the parties): r = s ^ t with s = F(k_01) ^ F(k_02) (known to role 0 alone) and t = F(k_12)
(roles 1 and 2): nobody knows r. [s] = (s - S_1, S_1, 0) (role 0 sends s - S_1 to role 2,
S_1 = F(k_01)), [t] = (0, 0, t), [st] by the product's cross terms (S_1 t at role 1, (s - S_1) t
at role 2, reshared with role 0 idle: z_0 = F(k_02), z_1 = F(k_01), roles 1 and 2 send each
other their term minus their z), [r] = [s] + [t] - 2[st]. The bit b (XOR shared by roles 0
and 2, or replicated: role 0 takes x_0 ^ x_1, role 2 x_2, locally) is opened masked:
c = b ^ r, role 0 sending b_0 ^ s ^ F(k_02) and role 2 b_2 ^ t ^ F(k_02) to both others
(1 round, 1 bit each way); then [b] = c + (1 - 2c)[r], [b v] = c [v] + (1 - 2c)[r v].
  * ``finish`` on replicated words: 2 rounds (the opening with the first); [r v] =
    [s (v - 2 t v)] + [t v] ([t v]: cross terms at roles 1 and 2 in round 1).
  * ``msb_finish`` (lt, ReLU, abs, clamp): the random bit and [r v] = [r][v] (one product,
    round 3) are made during the MSB's rounds 1-5 and its XOR sharing is opened in round 6.
  * ``eqz_finish``: z == 0 iff msb(z) == msb(-z): both carry circuits, one opening, 6 rounds.
  * With random bits made offline (``dabits``, rss.prefetch_dabits: r in both forms, its
    binary sharing free as (F(k_02), F(k_01), F(k_12)) and [r] as above), ``finish`` is ONE
    round: c = b ^ r opened like any binary value, [r v] = [r][v] reshared in the same message.
  Privacy: role 2 receives s - S_1 and S_1 t - z_1 (S_1, z_1 from k_01), role 1 receives
  (s - S_1) t - z_0 (z_0 from k_02); the opening's shares are masked by F(k_02) for role 1 and
  by r's other half (t, resp. the k_01 half of s) for roles 0 and 2, and c itself is b ^ r.

**A2B** (``a2b``): [a] = (a, 0, 0), [b] = (0, b ^ rho, rho) (party 1 sends b ^ rho: 1 round),
then circuits.kogge_stone_add with ``and_many``: 8 rounds.

**Exact rounding** (``round_exact``), **truncation pairs** (``trunc_pairs``) and the short
MSB (``msb_low``): carries of a + b on low bit lanes (and at the top) as above; see their
docstrings.

Measured figures (3 parties over gRPC, tests/protocol/test_rss_binary.py; bytes sent per
element per party, averaged over the roles: n a multiple of 3 * 64 * SPLIT_WORDS):

================================  ======  ===========================================
function                          rounds  bytes per element per party
================================  ======  ===========================================
and_many                          1       8 per AND word
msb_words                         6       14.58 (roles 0/2: 11.375, role 1: 21)
msb_finish, bit only (lt)         6       22.67 (19.5 / 29)
msb_finish, bit * value (ReLU)    6       30.67 (27.5 / 37), with or without the bit
eqz_finish (eq)                   6       37.17
b2a / finish (B2A)                2       8.17 per bit
bit_mul / finish (product)        2       16.17 per bit and value element
finish, random bits prefetched    1       0.125 per bit + 8 per value element
dabits (offline random bits)      2       8.17 per bit
msb_low(m = 16)                   4       3.58
a2b                               8       104 (+8 on party 1)
round_exact(bits = 1 / 16 / 32)   3/4/5   per chunk: tests/protocol/test_rss_binary.py
trunc_pairs(bits = 1 / 16 / 32)   6       about 42 / 45 / 49 per pair (offline)
================================  ======  ===========================================
"""

from __future__ import annotations

from typing import Callable, Generator, Sequence

import torch

from ..errors import ProtocolError
from ..provider.correlations import logical_shift
from ..session import current
from . import circuits
from .parallel import _Rider as _BaseRider
from .replicated import Replicated

WORLD = 3
PURPOSE = "rss-rand"
ALL_ONES = -1
BIAS_BITS = 62

# A protocol step: (outgoing {dst: 1-D int64 tensor}, expected {src: numel}) -> received.
Request = tuple[dict[int, torch.Tensor], dict[int, int]]
Gen = Generator[Request, dict[int, torch.Tensor], object]

_EMPTY = torch.zeros(0, dtype=torch.int64)


# ------------------------------------------------------------------ rounds and streams
def _run(gen: Gen):
    """Drive a protocol generator: one exchange (one round) per request it yields. While a
    side protocol rides (``alongside``), its pending request travels in the same messages."""
    comm = current().comm
    try:
        request = next(gen)
        while True:
            send, recv = request
            rider = getattr(comm, "rss_rider", None)
            if rider is not None:
                send, recv, take = rider.merge(send, recv)
            # A message exists iff it has words (both ends decide from public sizes).
            send = {d: t for d, t in send.items() if t.numel()}
            recv = {src: n for src, n in recv.items() if n}
            got = comm.exchange(send, sorted(recv))
            for src, n in recv.items():
                if got[src].dtype != torch.int64 or got[src].dim() != 1 or got[src].numel() != n:
                    raise ProtocolError(
                        f"party {current().rank}: expected {n} words from party {src} in a binary "
                        f"protocol round, got shape {tuple(got[src].shape)} ({got[src].dtype}); "
                        "the parties' programs diverged (check shapes and inputs)")
            got = {src: got.get(src, _EMPTY) for src in range(WORLD)}
            if rider is not None:
                got = take(got)
            request = gen.send(got)
    except StopIteration as stop:
        return stop.value


class _Rider(_BaseRider):
    """A side protocol (a Gen) whose messages travel in the rounds of the protocols that
    ``_run`` drives while it rides: each round's messages to a peer are the main protocol's
    words, then the side's (both ends know both sizes: same program). ``message`` is its
    pending request, ``parts`` the words it received (parallel._Rider's fields)."""

    def _advance(self) -> None:
        # the side's own code runs with this rider off: a collective it calls directly (a
        # stock refill) is its own round, the same on every party
        comm = current().comm
        comm.rss_rider, saved = self.prev, comm.rss_rider
        try:
            super()._advance()
        finally:
            comm.rss_rider = saved

    def merge(self, send: dict, recv: dict):
        """(send, recv) with the side's pending request appended, and the function that
        splits the received words back (the main protocol's part returned)."""
        if self.message is None and not self.done:
            self._advance()
        if self.done:
            return send, recv, lambda got: got
        s_send, s_recv = self.message
        send = dict(send)
        for dst, t in s_send.items():
            if t.numel():
                send[dst] = torch.cat([send[dst].reshape(-1), t.reshape(-1)]) if dst in send else t.reshape(-1)
        main_n = {src: n for src, n in recv.items() if n}
        side_n = {src: n for src, n in s_recv.items() if n}
        merged = {src: main_n.get(src, 0) + side_n.get(src, 0) for src in set(main_n) | set(side_n)}

        def take(got: dict) -> dict:
            self.parts = {src: got[src][main_n.get(src, 0):] if src in side_n else _EMPTY
                          for src in range(WORLD)}
            self.message = None
            return {src: got[src][:main_n[src]] if src in main_n else _EMPTY for src in range(WORLD)}
        return send, merged, take

    def finish(self):
        """Run what is left of the side protocol in rounds of its own; its result."""
        if self.message is None and not self.done:
            self._advance()
        if self.done:
            return self.value
        request, self.message = self.message, None

        def rest():
            got = yield request
            return (yield from _resume(self.gen, got))
        return _run(rest())


def _resume(gen: Gen, got):
    """The rest of a started generator, from sending it `got`."""
    try:
        request = gen.send(got)
    except StopIteration as stop:
        return stop.value
    while True:
        got = yield request
        try:
            request = gen.send(got)
        except StopIteration as stop:
            return stop.value


def _par(gens: Sequence[Gen]) -> Gen:
    """Several protocol generators in lockstep: their messages of a round travel together."""
    results: list = [None] * len(gens)
    pending: dict[int, Request] = {}
    for i, g in enumerate(gens):
        try:
            pending[i] = next(g)
        except StopIteration as stop:
            results[i] = stop.value
    while pending:
        order = sorted(pending)
        send: dict[int, list[torch.Tensor]] = {}
        recv: dict[int, list[tuple[int, int]]] = {}
        for i in order:
            out, exp = pending[i]
            for dst, t in out.items():
                send.setdefault(dst, []).append(t.reshape(-1))
            for src, n in exp.items():
                recv.setdefault(src, []).append((i, n))
        got = yield ({d: torch.cat(ts) for d, ts in send.items()},
                     {s: sum(n for _, n in lst) for s, lst in recv.items()})
        parts: dict[int, dict[int, torch.Tensor]] = {i: {} for i in order}
        for src, lst in recv.items():
            off = 0
            for i, n in lst:
                parts[i][src] = got[src][off:off + n]
                off += n
        nxt: dict[int, Request] = {}
        for i in order:
            try:
                nxt[i] = gens[i].send(parts[i])
            except StopIteration as stop:
                results[i] = stop.value
        pending = nxt
    return results


class _Roles:
    """Chunk k's role view of this party: role j is party (j + k) mod 3."""

    def __init__(self, k: int):
        self.k = k
        self.rank = current().rank
        self.role = (self.rank - k) % WORLD

    def party(self, role: int) -> int:
        return (role + self.k) % WORLD

    def draws(self, spec: dict[tuple[int, int], list[int]]) -> dict[tuple[int, int], list[torch.Tensor]]:
        """Fresh pairwise draws: spec[(i, j)] lists the numels role pair (i, j) draws, in order.
        Every party draws the pairs it belongs to, pairs in the order (0,1), (1,2), (0,2)."""
        s = current()
        out: dict[tuple[int, int], list[torch.Tensor]] = {}
        for pair in ((0, 1), (1, 2), (0, 2)):
            if pair not in spec or self.role not in pair:
                continue
            other = self.party(pair[0] if pair[1] == self.role else pair[1])
            prg = s.pair_prg(PURPOSE, other)
            out[pair] = [prg.draw((n,)) for n in spec[pair]]
        return out


# Calls on fewer words than this run as ONE chunk (see _chunks).
SPLIT_WORDS = 256


def _chunks(n: int) -> list[tuple[int, int, int]]:
    """(rotation, start, stop) of the chunks of a call on n elements (word-aligned: multiples
    of 64): three chunks, one per rotation of the roles, from SPLIT_WORDS words up; below,
    one chunk, its rotation the call's number of words mod 3.

    Three chunks balance the bytes and the work of a large call over the parties, but every
    party then sends to both others in each round. A small call costs its messages more than
    its words: as one chunk, only roles 0 and 2 talk after the first round (12 messages for
    an MSB instead of 36: LeNet at batch 1 takes a third less CPU), and calls of different
    sizes give role 1, which sends the most, to different parties. The rotation depends on
    the call alone, not on what ran before it, so a call's bytes per party do not either."""
    words = -(-n // 64)
    if not n:
        return []
    if words < SPLIT_WORDS:
        return [(words % WORLD, 0, n)]
    per = -(-words // WORLD) * 64
    out = []
    for k in range(WORLD):
        lo, hi = min(n, k * per), min(n, (k + 1) * per)
        if hi > lo:
            out.append((k, lo, hi))
    return out


def _add_public(a: torch.Tensor, b: torch.Tensor, c) -> tuple[torch.Tensor, torch.Tensor]:
    """Components of x + c for a public c: c goes to component 0 (party 0's a, party 2's b).
    (On the components directly: the share type's operators are not needed here.)"""
    rank = current().rank
    if rank == 0:
        return a + c, b
    if rank == 2:
        return a, b + c
    return a, b


def _rep(a: torch.Tensor, b: torch.Tensor) -> Replicated:
    return Replicated(a.contiguous(), b.contiguous(), current().rank)


def _as_rep(x, what: str) -> Replicated:
    if not isinstance(x, Replicated):
        raise ProtocolError(f"protocol 'rss': {what} expects replicated shares, got "
                            f"{type(x).__name__} (a share made under another protocol?)")
    return x


def _lin(fn: Callable[[torch.Tensor], torch.Tensor], x: Replicated) -> Replicated:
    """A GF(2)- or Z-linear map with no public constant, applied to both components."""
    return _rep(fn(x.a), fn(x.b))


def _role_comps(ro: _Roles, x: Replicated) -> dict[int, torch.Tensor]:
    """This party's components in chunk role indexing: {role: x_role, role+1: ...}."""
    return {ro.role: x.a, (ro.role + 1) % WORLD: x.b}


def _from_comps(ro: _Roles, comps: dict[int, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return comps[ro.role], comps[(ro.role + 1) % WORLD]


# --------------------------------------------------------------------------- AND, XOR
def _g_and(pairs: Sequence[tuple[Replicated, Replicated]]) -> Gen:
    s = current()
    rank = s.rank
    nxt, prev = (rank + 1) % WORLD, (rank + 2) % WORLD
    xs, ys, shapes = [], [], []
    for x, y in pairs:
        x, y = _as_rep(x, "AND"), _as_rep(y, "AND")
        shape = torch.broadcast_shapes(x.shape, y.shape)
        shapes.append(shape)
        xs.append((x.a.expand(shape).reshape(-1), x.b.expand(shape).reshape(-1)))
        ys.append((y.a.expand(shape).reshape(-1), y.b.expand(shape).reshape(-1)))
    xa = torch.cat([a for a, _ in xs]) if xs else _EMPTY
    xb = torch.cat([b for _, b in xs]) if xs else _EMPTY
    ya = torch.cat([a for a, _ in ys]) if ys else _EMPTY
    yb = torch.cat([b for _, b in ys]) if ys else _EMPTY
    n = xa.numel()
    # alpha_i = F(k_{i,i+1}) ^ F(k_{i-1,i}): draw the lower pair first on both of its parties.
    alpha = torch.zeros(n, dtype=torch.int64)
    for peer in sorted((nxt, prev)):
        alpha ^= s.pair_prg(PURPOSE, peer).draw((n,))
    t = (xa & ya) ^ (xa & yb) ^ (xb & ya) ^ alpha
    got = yield ({prev: t}, {nxt: n})
    z = got[nxt]
    out, off = [], 0
    for shape in shapes:
        m = 1
        for d in shape:
            m *= d
        out.append(_rep(t[off:off + m].view(shape), z[off:off + m].view(shape)))
        off += m
    return out


def and_many(pairs: Sequence[tuple[Replicated, Replicated]], triple=None) -> list[Replicated]:
    """Shares of x & y for every pair, in ONE round (8 B per AND word per party)."""
    if triple is not None:
        raise ProtocolError("protocol 'rss' needs no binary triples (the AND is one reshare)")
    return _run(_g_and(pairs))


def and_(x: Replicated, y: Replicated) -> Replicated:
    """Shares of x & y (one round)."""
    return and_many([(x, y)])[0]


def or_(x: Replicated, y: Replicated) -> Replicated:
    """Shares of x | y = x ^ y ^ (x & y) (one round)."""
    return x ^ y ^ and_(x, y)


def xor(x: Replicated, y: Replicated) -> Replicated:
    """Shares of x ^ y (local)."""
    return x ^ y


def xor_public(x: Replicated, c) -> Replicated:
    """x ^ c for a public c (on share index 0: party 0's a, party 2's b)."""
    x = _as_rep(x, "xor")
    rank = current().rank
    a, b = x.a, x.b
    if rank == 0:
        a = a ^ c
    elif rank == 2:
        b = b ^ c
    a, b = torch.broadcast_tensors(a, b)
    return _rep(a.clone(), b.clone())


def not_(x: Replicated) -> Replicated:
    """Bitwise NOT (local)."""
    return xor_public(x, ALL_ONES)


def lshift(x: Replicated, k: int) -> Replicated:
    """Shares of x << k (local)."""
    return _lin(lambda t: t << k, x)


def rshift(x: Replicated, k: int) -> Replicated:
    """Shares of the LOGICAL right shift x >>> k (local)."""
    return _lin(lambda t: logical_shift(t, k), x)


def lead_of(like: torch.Tensor) -> Replicated:
    """A binary sharing of all-ones words (xor public constants through `lead & c`)."""
    from . import rss
    return rss.public(torch.full(tuple(like.shape), ALL_ONES, dtype=torch.int64))


def open_xor(x: Replicated) -> torch.Tensor:
    """Reveal a binary replicated tensor to every party (one round)."""
    from . import rss
    return rss.open_xor(x)


def and_bits(x: Replicated, y: Replicated) -> Replicated:
    """AND of 0/1-valued XOR shares (any shape), packed for the wire (one round)."""
    shape = torch.broadcast_shapes(x.shape, y.shape)
    n = 1
    for d in shape:
        n *= d
    px = _lin(lambda t: circuits.pack_bits(t.expand(shape).reshape(-1)), x)
    py = _lin(lambda t: circuits.pack_bits(t.expand(shape).reshape(-1)), y)
    (z,) = and_many([(px, py)])
    return _lin(lambda t: circuits.unpack_bits(t, n).view(shape), z)


def not_bits(x: Replicated) -> Replicated:
    """NOT of 0/1-valued XOR shares (local)."""
    return xor_public(x, 1)


def and_reduce_bits(x: Replicated) -> Replicated:
    """AND over the last axis of 0/1 XOR shares, by a tree (ceil(log2 k) rounds)."""
    from . import convert
    return convert.and_reduce_bits(x, and_bits)


# --------------------------------------------------------- carries of a + b (2 roles)
# circuits.halves (a table lookup per 16 bits), under the name this module's circuits use.
_halves = circuits.halves


# The last carry level combines the final four groups in one round (G only): a masked
# polynomial of 6 inputs (circuits.CARRY4_G_ONLY) whose 15 mask products role 1 deals.
_G4_MONOS = circuits.monomials(circuits.CARRY4_G_ONLY)


def _carry_levels(words: int, width: int) -> tuple[int, list[tuple[int, str]]]:
    """Words of the level-1 planes, and (words, kind) of each carry-tree level, for `words`
    lane-packed words of `width`-bit lanes. kind: "gp" (two groups, G and P), "g" (two
    groups, G only: the last level from 2 groups) or "g4" (four groups, G only: the last
    level from 4 groups, one round instead of two)."""
    w = -(-words // 2)
    first = w
    levels = []
    width //= 2
    while width > 1:
        if width == 4:
            w = -(-(-(-w // 2)) // 2)
            levels.append((w, "g4"))
            break
        w = -(-w // 2)
        levels.append((w, "gp" if width > 2 else "g"))
        width //= 2
    return first, levels


# Pairwise draws per level (numels in units of the level's words): role pair (0, 1) and
# role pair (1, 2); role 1's corrections to role 2, per level.
_SPEC01 = {"gp": 5, "g": 3, "g4": 6 + len(_G4_MONOS)}
_SPEC12 = {"gp": 3, "g": 2, "g4": 6}
_CORR = {"gp": 2, "g": 1, "g4": len(_G4_MONOS)}


def _g_carry(ro: _Roles, a_words, b_words, words: int, width: int, extra_b: Sequence, extra_sizes: Sequence[int]) -> Gen:
    """XOR shares (roles 0 and 2; role 1 gets zeros) of the carry out of every `width`-bit
    lane of a + b, and of role 1's `extra_b` words. `a_words`: roles 0 and 2 (None on role
    1); `b_words`, `extra_b`: role 1 (None elsewhere). Returns (carry words, one bit per lane
    packed 64 per word in lane order, [extra shares])."""
    first, levels = _carry_levels(words, width)
    n_extra = sum(extra_sizes)
    spec01, spec12 = [], [3 * first, n_extra]
    for w, kind in levels:
        spec01 += [w] * _SPEC01[kind]
        spec12 += [w] * _SPEC12[kind]
    d = ro.draws({(0, 1): spec01, (1, 2): spec12})
    out_words = levels[-1][0] if levels else first

    def masks(pair_draws: list[torch.Tensor], with_c: bool) -> list[dict]:
        """Per level: alpha, gamma (for G_lo), gamma_p (P_lo), c, c_p (role 0's products);
        g4 levels: the inputs' masks and (role 0) the mask products' shares."""
        it = iter(pair_draws)
        per = []
        for _, kind in levels:
            if kind == "g4":
                m = {"masks": [next(it) for _ in range(6)]}
                if with_c:
                    m["monos"] = [next(it) for _ in _G4_MONOS]
                per.append(m)
                continue
            m = {"alpha": next(it), "gamma": next(it)}
            m["gamma_p"] = next(it) if kind == "gp" else None
            if with_c:
                m["c"] = next(it)
                m["c_p"] = next(it) if kind == "gp" else None
            per.append(m)
        return per

    if ro.role == 1:
        rho_h, rho_x = d[(1, 2)][0], d[(1, 2)][1]
        m0, m2 = masks(d[(0, 1)], True), masks(d[(1, 2)][2:], False)
        b_hi, b_lo = _halves(b_words)
        h = torch.cat([b_lo, b_hi, b_hi & b_lo])
        ex = torch.cat([t.reshape(-1) for t in extra_b]) if extra_b else _EMPTY
        corr = []
        for (_, kind), x0, x2 in zip(levels, m0, m2):
            if kind == "g4":
                full = [a ^ b for a, b in zip(x0["masks"], x2["masks"])]
                for mono, c0 in zip(_G4_MONOS, x0["monos"]):
                    v = full[mono[0]]
                    for k in mono[1:]:
                        v = v & full[k]
                    corr.append(v ^ c0)
                continue
            alpha = x0["alpha"] ^ x2["alpha"]
            corr.append((alpha & (x0["gamma"] ^ x2["gamma"])) ^ x0["c"])
            if x0["gamma_p"] is not None:
                corr.append((alpha & (x0["gamma_p"] ^ x2["gamma_p"])) ^ x0["c_p"])
        yield ({ro.party(0): torch.cat([h ^ rho_h, ex ^ rho_x]),
                ro.party(2): torch.cat(corr) if corr else _EMPTY}, {})
        for _ in levels:
            yield ({}, {})
        zeros = torch.zeros(out_words, dtype=torch.int64)
        return zeros, [torch.zeros(n, dtype=torch.int64) for n in extra_sizes]

    lead = ro.role == 0
    other = ro.party(2 if lead else 0)
    if lead:
        mine = masks(d[(0, 1)], True)
        got = yield ({}, {ro.party(1): 3 * first + n_extra})
        m = got[ro.party(1)]
    else:
        mine = masks(d[(1, 2)][2:], False)
        n_corr = sum(w * _CORR[kind] for w, kind in levels)
        got = yield ({}, {ro.party(1): n_corr})
        corr = got[ro.party(1)]
        off = 0
        for x, (w, kind) in zip(mine, levels):
            if kind == "g4":
                x["monos"] = [corr[off + i * w:off + (i + 1) * w] for i in range(len(_G4_MONOS))]
                off += len(_G4_MONOS) * w
                continue
            x["c"] = corr[off:off + w]
            off += w
            if kind == "gp":
                x["c_p"] = corr[off:off + w]
                off += w
        m = torch.cat([d[(1, 2)][0], d[(1, 2)][1]])
    mb0, mb1, mb10 = m[:first], m[first:2 * first], m[2 * first:3 * first]
    ex = m[3 * first:]
    a1, a0 = _halves(a_words)
    a10 = a1 & a0
    g = (a1 & mb1) ^ (a10 & mb0) ^ (a0 & mb10)
    p = (a1 & mb0) ^ (a0 & mb1) ^ mb10
    if lead:
        p = p ^ a10
    for x, (w, kind) in zip(mine, levels):
        if kind == "g4":
            g0, g1, g2, g3 = circuits.quarters(g, _halves)
            _, p1, p2, p3 = circuits.quarters(p, _halves)
            inputs = [g0, g1, g2, p1, p2, p3]
            mine_open = torch.cat([v ^ mk for v, mk in zip(inputs, x["masks"])])
            got = yield ({other: mine_open}, {other: mine_open.numel()})
            both = mine_open ^ got[other]
            opened = [both[i * w:(i + 1) * w] for i in range(6)]
            lead_words = torch.full((w,), ALL_ONES, dtype=torch.int64) if lead else torch.zeros(w, dtype=torch.int64)
            t = circuits.expand_terms(circuits.CARRY4_G_ONLY, opened, x["masks"],
                                      dict(zip(_G4_MONOS, x["monos"])), lead_words)
            g = g3 ^ t
            continue
        g_hi, g_lo = _halves(g)
        p_hi, p_lo = _halves(p)
        has_p = kind == "gp"
        opened = [p_hi ^ x["alpha"], g_lo ^ x["gamma"]] + ([p_lo ^ x["gamma_p"]] if has_p else [])
        mine_open = torch.cat(opened)
        got = yield ({other: mine_open}, {other: mine_open.numel()})
        both = mine_open ^ got[other]
        e, dg = both[:w], both[w:2 * w]
        z = x["c"] ^ (e & x["gamma"]) ^ (x["alpha"] & dg)
        if lead:
            z = z ^ (e & dg)
        g = g_hi ^ z
        if has_p:
            dp = both[2 * w:]
            p = x["c_p"] ^ (e & x["gamma_p"]) ^ (x["alpha"] & dp)
            if lead:
                p = p ^ (e & dp)
    extras, off = [], 0
    for n in extra_sizes:
        extras.append(ex[off:off + n])
        off += n
    return g, extras


def _g_to_rss(ro: _Roles, u: torch.Tensor, nw: int) -> Gen:
    """XOR shares u of roles 0 and 2 (role 1: anything) -> this party's replicated (a, b).
    z_1 = F(k_01); z_0 = u_0 ^ z_1 ^ F(k_02) (role 0 -> role 2); z_2 = u_2 ^ F(k_02)
    (role 2 -> role 1). One round; nw words from roles 0 and 2."""
    d = ro.draws({(0, 1): [nw], (0, 2): [nw]})
    if ro.role == 0:
        z1, f = d[(0, 1)][0], d[(0, 2)][0]
        z0 = u ^ z1 ^ f
        yield ({ro.party(2): z0}, {})
        return z0, z1
    if ro.role == 1:
        got = yield ({}, {ro.party(2): nw})
        return d[(0, 1)][0], got[ro.party(2)]
    z2 = u ^ d[(0, 2)][0]
    got = yield ({ro.party(1): z2}, {ro.party(0): nw})
    return z2, got[ro.party(0)]


def _g_open_c(ro: _Roles, beta: torch.Tensor, r2: torch.Tensor, nw: int) -> Gen:
    """Open c = beta ^ r to all three (beta, r: XOR shares of roles 0 and 2), each share
    re-masked by a fresh F(k_02) so that role 1 sees only c. One round, nw words from roles
    0 and 2 to each of the others."""
    d = ro.draws({(0, 2): [nw]})
    if ro.role == 1:
        got = yield ({}, {ro.party(0): nw, ro.party(2): nw})
        return got[ro.party(0)] ^ got[ro.party(2)]
    other = ro.party(2 if ro.role == 0 else 0)
    u = beta ^ r2 ^ d[(0, 2)][0]
    got = yield ({other: u, ro.party(1): u}, {other: nw})
    return u ^ got[other]


# ------------------------------------------------------------ random bits and injection
def _dabit_words(ro: _Roles, nw: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(s words on role 0 / t words on roles 1 and 2, this party's XOR share of r = s ^ t
    between roles 0 and 2). s = F(k_01) ^ F(k_02), t = F(k_12)."""
    d = ro.draws({(0, 1): [nw], (1, 2): [nw], (0, 2): [nw]})
    if ro.role == 0:
        s = d[(0, 1)][0] ^ d[(0, 2)][0]
        return s, s
    t = d[(1, 2)][0]
    return t, (t if ro.role == 2 else torch.zeros_like(t))


def _g_inject(ro: _Roles, n: int, bits_words: torch.Tensor, values: Sequence[tuple[torch.Tensor, torch.Tensor]],
              want_bit: bool) -> Gen:
    """[r] (if want_bit) and [r v] for each value v (components (n, w)), r = s ^ t of
    _dabit_words (bits_words: s on role 0, t on roles 1 and 2). Two rounds, input-independent
    but for v. Returns ((r_a, r_b) or None, [(rv_a, rv_b)])."""
    sizes = [va.numel() for va, _ in values]
    spec01 = [n] + ([n] if want_bit else []) + [m for m in sizes for _ in range(2)]
    spec12 = list(sizes)
    spec02 = ([n] if want_bit else []) + [m for m in sizes for _ in range(2)]
    d = ro.draws({(0, 1): spec01, (1, 2): spec12, (0, 2): spec02})
    bit = circuits.unpack_bits(bits_words, n)          # s on role 0, t on roles 1 and 2
    it01 = iter(d.get((0, 1), []))
    it12 = iter(d.get((1, 2), []))
    it02 = iter(d.get((0, 2), []))
    role = ro.role
    r0, r1, r2 = ro.party(0), ro.party(1), ro.party(2)
    S1 = next(it01) if role in (0, 1) else None
    st_c1 = next(it01) if want_bit and role in (0, 1) else None
    st_c0 = next(it02) if want_bit and role in (0, 2) else None
    tv_c1, tv_c0, z01, z12, z02 = [], [], [], [], []
    for _ in sizes:
        if role in (0, 1):
            tv_c1.append(next(it01))
            z01.append(next(it01))
        if role in (1, 2):
            z12.append(next(it12))
        if role in (0, 2):
            tv_c0.append(next(it02))
            z02.append(next(it02))

    # Round A: role 0 shares s ([s] = (s - S1, S1, 0)); [t v] by cross terms at roles 1, 2.
    send: dict[int, list] = {}
    recv: dict[int, int] = {}
    if role == 0:
        S0 = bit - S1
        send[r2] = [S0]
    else:
        t = bit.unsqueeze(1)
        terms = []
        for (va, vb), c1, c0 in zip(values, tv_c1 or [None] * len(values), tv_c0 or [None] * len(values)):
            if role == 1:      # holds (v_1, v_2)
                terms.append((va * t - c1.view(va.shape)).reshape(-1))
            else:              # holds (v_2, v_0)
                terms.append(((va + vb) * t - c0.view(va.shape)).reshape(-1))
        send[r2 if role == 1 else r1] = terms
        recv[r2 if role == 1 else r1] = sum(sizes)
    if role == 2:
        recv[r0] = n
    got = yield ({k: torch.cat(v) if v else _EMPTY for k, v in send.items()}, recv)
    # [t v] components in role indexing
    tvs = []
    off = 0
    for i, (va, vb) in enumerate(values):
        m = sizes[i]
        if role == 0:
            tvs.append((tv_c0[i].view(va.shape), tv_c1[i].view(va.shape)))
        else:
            mine = send[r2 if role == 1 else r1][i]
            theirs = got[r2 if role == 1 else r1][off:off + m]
            c2 = (mine + theirs).view(va.shape)
            tvs.append((tv_c1[i].view(va.shape), c2) if role == 1 else (c2, tv_c0[i].view(va.shape)))
        off += m
    if role == 0:
        s_comps = (S0, S1)                           # (s_0, s_1)
    elif role == 1:
        s_comps = (S1, torch.zeros(n, dtype=torch.int64))
    else:
        S0 = got[r0]
        s_comps = (torch.zeros(n, dtype=torch.int64), S0)

    # Round B: [s t] (roles 1, 2 hold terms; role 0 idle) and [s (v - 2 t v)] (a product).
    send, recv = {}, {}
    msgs = []
    if want_bit:
        if role == 1:
            msgs.append(S1 * bit - st_c1)
        elif role == 2:
            msgs.append(S0 * bit - st_c0)
    prods = []
    for i, (va, vb) in enumerate(values):
        ya, yb = va - 2 * tvs[i][0], vb - 2 * tvs[i][1]
        sa, sb = s_comps[0].unsqueeze(1), s_comps[1].unsqueeze(1)
        z = sa * (ya + yb) + sb * ya                  # s_i (y_i + y_{i+1}) + s_{i+1} y_i
        if role == 0:
            z = z + z01[i].view(z.shape) - z02[i].view(z.shape)
        elif role == 1:
            z = z + z12[i].view(z.shape) - z01[i].view(z.shape)
        else:
            z = z + z02[i].view(z.shape) - z12[i].view(z.shape)
        prods.append(z)
    prev, nxt = ro.party((role + 2) % WORLD), ro.party((role + 1) % WORLD)
    out_prev = [z.reshape(-1) for z in prods]
    if role == 1:
        send[r2] = msgs
        recv[r2] = n if want_bit else 0
    elif role == 2:
        send[r1] = msgs
        recv[r1] = n if want_bit else 0
    send.setdefault(prev, [])
    send[prev] = send[prev] + out_prev
    recv[nxt] = recv.get(nxt, 0) + sum(sizes)
    send = {k: torch.cat(v) if v else _EMPTY for k, v in send.items()}
    got = yield (send, recv)
    # unpack: role 1 and 2 exchange with each other: st first, then (for the one whose prev
    # or next it is) the products. Order on the wire per destination: st msgs, then products.
    r_comps = None
    if want_bit:
        if role == 0:
            st = (st_c0, st_c1)
        else:
            peer = r2 if role == 1 else r1
            c2 = msgs[0] + got[peer][:n]
            st = (st_c1, c2) if role == 1 else (c2, st_c0)
        # [t] = (0, 0, t): role 1 holds (0, t), role 2 (t, 0), role 0 (0, 0)
        t_at = {1: 1, 2: 0}.get(role)
        r_comps = []
        for j in range(2):
            comp = s_comps[j] - 2 * st[j]
            if j == t_at:
                comp += bit
            r_comps.append(comp)
        r_comps = tuple(r_comps)
    # products: received from nxt; skip the st part when nxt is the st peer
    skip = 0
    if want_bit and ((role == 1 and nxt == r2) or (role == 2 and nxt == r1)):
        skip = n
    rvs, off = [], skip
    for i, (va, _) in enumerate(values):
        m = sizes[i]
        theirs = got[nxt][off:off + m].view(va.shape)
        off += m
        rvs.append((prods[i] + tvs[i][0], theirs + tvs[i][1]))
    return r_comps, rvs


# ----------------------------------------------------------------------------- MSB
def _msb_operands(ro: _Roles, xa: torch.Tensor, xb: torch.Tensor):
    """(a words, b words, extra b words, a_63 packed) of chunk role `ro` for x = a + b."""
    if ro.role == 1:
        b = xa + xb
        return None, (b & circuits.LOW63) | circuits.TOP, [circuits.pack_bits(logical_shift(b, 63))], None
    a = xa if ro.role == 0 else xb
    return a & circuits.LOW63, None, None, circuits.pack_bits(logical_shift(a, 63))


def _g_msb2(ro: _Roles, xa: torch.Tensor, xb: torch.Tensor) -> Gen:
    """XOR shares of msb(x) (packed) between roles 0 and 2 (zeros on role 1): 6 rounds."""
    n = xa.numel()
    nw = -(-n // 64)
    a, b, extra, a63 = _msb_operands(ro, xa, xb)
    g, (e,) = yield from _g_carry(ro, a, b, n, 64, extra, [nw])
    if ro.role == 0:
        return g ^ e ^ a63
    return g ^ e


def _g_msb_words(ro: _Roles, xa: torch.Tensor, xb: torch.Tensor) -> Gen:
    u = yield from _g_msb2(ro, xa, xb)
    return (yield from _g_to_rss(ro, u, -(-xa.numel() // 64)))


def _flat(x: Replicated) -> tuple[torch.Tensor, torch.Tensor]:
    x = _as_rep(x, "a conversion")
    return x.a.reshape(-1), x.b.reshape(-1)


def msb_words(x: Replicated) -> Replicated:
    """Packed binary shares (64 elements per word, row-major) of msb(x), i.e. x < 0.

    7 rounds; per element, role 0 and role 2 send 11.625 B, role 1 19.75 B (every party
    plays each role on a third of the elements)."""
    xa, xb = _flat(x)
    chunks = _chunks(xa.numel())
    got = _run(_par([_g_msb_words(_Roles(k), xa[lo:hi], xb[lo:hi]) for k, lo, hi in chunks]))
    if not got:
        return _rep(_EMPTY.clone(), _EMPTY.clone())
    return _rep(torch.cat([a for a, _ in got]), torch.cat([b for _, b in got]))


# ---------------------------------------------------------------- B2A and bit * value
def _bit_count(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _mul_operand(bit_shape: Sequence[int], value: Replicated) -> tuple[torch.Tensor, torch.Tensor, tuple]:
    """value's components as (n bits, w) rows (bits broadcast over value's trailing dims)."""
    value = _as_rep(value, "bit * value")
    n = _bit_count(bit_shape)
    target = torch.broadcast_shapes(tuple(bit_shape), tuple(value.shape))
    return value.a.expand(target).reshape(n, -1), value.b.expand(target).reshape(n, -1), target


def _combine(c_bits: torch.Tensor, r: tuple | None, rvs, values, want_bit: bool = True) -> tuple:
    """[b] = c + (1 - 2c)[r], [b v] = c [v] + (1 - 2c)[r v] (local)."""
    bit = None
    if r is not None and want_bit:
        bit = _rep(*_add_public(r[0] * (1 - 2 * c_bits), r[1] * (1 - 2 * c_bits), c_bits))
    prods = []
    for (ra, rb), (va, vb) in zip(rvs, values):
        c = c_bits.unsqueeze(1)
        prods.append(_rep(va * c + (1 - 2 * c) * ra, vb * c + (1 - 2 * c) * rb))
    return bit, prods


def _g_inject_late(ro: _Roles, n: int, bits_words: torch.Tensor,
                   values: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> Gen:
    """[r] as _g_inject (2 rounds), then [r v] = [r] [v] by one replicated product (round 3):
    8 B per value element from every role, instead of the 2-round form's 16 B from roles 1
    and 2 plus 8 B from role 0 ([t v], then [s (v - 2 t v)]). For callers with rounds to spare."""
    sizes = [va.numel() for va, _ in values]
    d = ro.draws({(0, 1): sizes, (1, 2): sizes, (0, 2): sizes})
    r, _ = yield from _g_inject(ro, n, bits_words, [], True)
    role = ro.role
    prev, nxt = ro.party((role + 2) % WORLD), ro.party((role + 1) % WORLD)
    zs = []
    for i, (va, vb) in enumerate(values):
        z = r[0].unsqueeze(1) * (va + vb) + r[1].unsqueeze(1) * va
        f = {pair: d[pair][i].view(z.shape) for pair in d}
        if role == 0:
            z = z + f[(0, 1)] - f[(0, 2)]
        elif role == 1:
            z = z + f[(1, 2)] - f[(0, 1)]
        else:
            z = z + f[(0, 2)] - f[(1, 2)]
        zs.append(z)
    got = yield ({prev: torch.cat([z.reshape(-1) for z in zs]) if zs else _EMPTY}, {nxt: sum(sizes)})
    rvs, off = [], 0
    for z, m in zip(zs, sizes):
        rvs.append((z, got[nxt][off:off + m].view(z.shape)))
        off += m
    return r, rvs


def _g_inject_open(ro: _Roles, beta: torch.Tensor, n: int, values, want_bit: bool, first=None) -> Gen:
    """B2A / bit * value of n bits XOR-shared by roles 0 and 2 (beta), optionally computed
    by the generator `first` (which returns beta) while the random bits are made (then the
    product takes the 3-round, cheaper form)."""
    nw = -(-n // 64)
    bits_words, r2 = _dabit_words(ro, nw)
    if first is not None and values:
        inj = _g_inject_late(ro, n, bits_words, values)
    else:
        inj = _g_inject(ro, n, bits_words, values, want_bit)
    if first is None:
        c, (r, rvs) = yield from _par([_g_open_c(ro, beta, r2, nw), inj])
    else:
        beta, (r, rvs) = yield from _par([first, inj])
        c = yield from _g_open_c(ro, beta, r2, nw)
    return _combine(circuits.unpack_bits(c, n), r, rvs, values, want_bit)


def _words_2of2(ro: _Roles, wa: torch.Tensor, wb: torch.Tensor) -> torch.Tensor:
    """Replicated binary words -> XOR shares of roles 0 (x_0 ^ x_1) and 2 (x_2), local."""
    if ro.role == 0:
        return wa ^ wb
    if ro.role == 2:
        return wa.clone()
    return torch.zeros_like(wa)


def _cat_rep(parts: list[Replicated], shape) -> Replicated:
    a = torch.cat([p.a.reshape(-1) for p in parts]) if parts else torch.zeros(0, dtype=torch.int64)
    b = torch.cat([p.b.reshape(-1) for p in parts]) if parts else torch.zeros(0, dtype=torch.int64)
    return _rep(a.view(shape), b.view(shape))


def _jobs_gens(jobs, make):
    """One generator per (job, chunk); `make(ro, job, lo, hi)` builds it. Returns the gens
    and their (job index, chunk) keys."""
    gens, keys = [], []
    for j, job in enumerate(jobs):
        for k, lo, hi in _chunks(job["n"]):
            gens.append(make(_Roles(k), job, lo, hi))
            keys.append(j)
    return gens, keys


def _collect(jobs, keys, results):
    """Concatenate each job's chunk results (bit, [prod])."""
    bits: list[list] = [[] for _ in jobs]
    prods: list[list] = [[] for _ in jobs]
    for j, (bit, ps) in zip(keys, results):
        if bit is not None:
            bits[j].append(bit)
        if ps:
            prods[j].append(ps[0])
    return bits, prods


def _finish_jobs(jobs, first_of=None):
    """Run B2A / bit * value jobs (dicts: n, words or x, want_bit, value rows) in parallel."""
    def make(ro, job, lo, hi):
        n = hi - lo
        values = []
        if job.get("va") is not None:
            values = [(job["va"][lo:hi], job["vb"][lo:hi])]
        if first_of is None:
            wa, wb = job["wa"][lo // 64:-(-hi // 64)], job["wb"][lo // 64:-(-hi // 64)]
            beta = _words_2of2(ro, wa, wb)
            return _g_inject_open(ro, beta, n, values, job["want_bit"])
        return _g_inject_open(ro, None, n, values, job["want_bit"], first_of(ro, job, lo, hi))

    gens, keys = _jobs_gens(jobs, make)
    results = yield from _par(gens)
    return _collect(jobs, keys, results)


def finish(b2as: Sequence[tuple[Replicated, int]] = (),
           muls: Sequence[tuple[Replicated, Sequence[int], Replicated]] = ()):
    """B2A of packed bit words, and bit * value products (finish_gen, driven on its own)."""
    return _run(finish_gen(b2as, muls))


def finish_gen(b2as: Sequence[tuple[Replicated, int]] = (),
           muls: Sequence[tuple[Replicated, Sequence[int], Replicated]] = ()):
    """B2A of packed bit words, and bit * value products (2 rounds; convert.finish's API).

    b2as: (words, n) -> arithmetic 0/1 shares of shape (n,).
    muls: (words, bit_shape, value) -> shares of bit * value (value's scale, no truncation).
    Per bit, roles 0 and 2 send 8.25 B and role 1 8 B for a B2A; a product adds 16 B (roles
    1 and 2) or 8 B (role 0) per value element. A product whose words are the very words of a
    B2A of the call (relu with its mask) shares that B2A's random bit and opening."""
    def checked(words, n: int, what: str) -> Replicated:
        words = _as_rep(words, what)
        if words.numel() < -(-n // 64):
            raise ProtocolError(f"party {current().rank}: {what} of {n} bits needs {-(-n // 64)} "
                                f"packed words, got {words.numel()}")
        return words

    jobs = []
    for words, n in b2as:
        words = checked(words, n, "B2A")
        jobs.append({"n": n, "wa": words.a.reshape(-1), "wb": words.b.reshape(-1), "want_bit": True,
                     "words": words})
    targets, mul_jobs = [], []
    for words, bit_shape, value in muls:
        words = checked(words, _bit_count(bit_shape), "bit * value")
        va, vb, target = _mul_operand(bit_shape, value)
        targets.append(target)
        n = _bit_count(bit_shape)
        same = [j for j, job in enumerate(jobs[:len(b2as)])
                if job["words"] is words and job["n"] == n and job.get("va") is None]
        if same:
            jobs[same[0]].update(va=va, vb=vb)
            mul_jobs.append(same[0])
        else:
            mul_jobs.append(len(jobs))
            jobs.append({"n": n, "wa": words.a.reshape(-1), "wb": words.b.reshape(-1),
                         "want_bit": False, "va": va, "vb": vb})
    from . import rss
    stocked = rss.take_dabits(sum(job["n"] for job in jobs))
    if stocked is None:
        bits, prods = yield from _finish_jobs(jobs)
    else:
        bits, prods = yield from _finish_stocked(jobs, *stocked)
    out_b = [_cat_rep(bits[j], (n,)) for j, (_, n) in enumerate(b2as)]
    out_m = [_cat_rep(prods[j], targets[i]) for i, j in enumerate(mul_jobs)]
    return out_b, out_m


# ------------------------------------------------- random bits made ahead (offline)
def _pair_components(d: dict) -> dict:
    """Replicated components from one draw of each pairwise stream this role holds: component 0
    is F(k_02), 1 is F(k_01), 2 is F(k_12) (the two a role holds; the third is absent)."""
    return {c: d[pair][0] for c, pair in ((0, (0, 2)), (1, (0, 1)), (2, (1, 2))) if pair in d}


def _g_dabit_chunk(ro: _Roles, n: int) -> Gen:
    """n random bits r = F(k_01) ^ F(k_02) ^ F(k_12) of chunk role `ro`: binary replicated
    for free (component 0 = F(k_02), 1 = F(k_01), 2 = F(k_12), each held by its two roles),
    arithmetic [r] by _g_inject (2 rounds). Returns ((binary a, b) unpacked, (arith a, b))."""
    nw = -(-n // 64)
    d = ro.draws({(0, 1): [nw], (1, 2): [nw], (0, 2): [nw]})
    comps = _pair_components(d)
    # s = F(k_01) ^ F(k_02) on role 0, t = F(k_12) on roles 1 and 2 (as _dabit_words)
    words = comps[0] ^ comps[1] if ro.role == 0 else comps[2]
    r, _ = yield from _g_inject(ro, n, words, [], True)
    binary = (circuits.unpack_bits(comps[ro.role], n), circuits.unpack_bits(comps[(ro.role + 1) % WORLD], n))
    return binary, r


def dabits(n: int) -> tuple[Replicated, Replicated]:
    """n uniform secret bits, as binary (XOR, one 0/1 bit per element) and arithmetic 0/1
    replicated shares of the same bits: 2 rounds, input-independent (made offline,
    rss.prefetch_dabits). Nobody knows a bit: each party lacks one of its three XOR parts."""
    got = _run(_par([_g_dabit_chunk(_Roles(k), hi - lo) for k, lo, hi in _chunks(n)]))
    cat = lambda ts: torch.cat(ts) if ts else torch.zeros(0, dtype=torch.int64)  # noqa: E731
    return (_rep(cat([g[0][0] for g in got]), cat([g[0][1] for g in got])),
            _rep(cat([g[1][0] for g in got]), cat([g[1][1] for g in got])))


def _finish_stocked(jobs, rb: Replicated, ra: Replicated):
    """_finish_jobs with prefetched random bits: ONE round. Per job, c = b ^ r is opened
    (open_xor of the masked words: each party sends one word per 64 bits to prev) and
    [r v] = [r] [v] is reshared (a replicated product, fresh zero sharing: 8 B per value
    element) in the same message; then [b] = c + (1 - 2c)[r], [b v] = c [v] + (1 - 2c)[r v]."""
    from . import rss
    s = current()
    rank = s.rank
    nxt, prev = (rank + 1) % WORLD, (rank + 2) % WORLD
    masked, zs, off = [], [], 0
    for job in jobs:
        n = job["n"]
        nw = -(-n // 64)
        ba, bb = rb.a[off:off + n], rb.b[off:off + n]
        aa, ab = ra.a[off:off + n], ra.b[off:off + n]
        off += n
        wa = job["wa"][:nw] ^ circuits.pack_bits(ba)
        wb = job["wb"][:nw] ^ circuits.pack_bits(bb)
        z = None
        if job.get("va") is not None:
            va, vb = job["va"], job["vb"]
            z = aa.unsqueeze(1) * (va + vb) + ab.unsqueeze(1) * va
            z = z + rss.zero_share(z.shape)
        masked.append((wa, wb))
        zs.append(z)
    parts = [wb.reshape(-1) for _, wb in masked] + [z.reshape(-1) for z in zs if z is not None]
    msg = torch.cat(parts) if parts else _EMPTY
    got = (yield ({prev: msg}, {nxt: msg.numel()}))[nxt]
    bits: list[list] = [[] for _ in jobs]
    prods: list[list] = [[] for _ in jobs]
    pos, off = 0, 0
    opened = []
    for (wa, wb) in masked:
        opened.append(wa ^ wb ^ got[pos:pos + wa.numel()])
        pos += wa.numel()
    for j, job in enumerate(jobs):
        n = job["n"]
        c = circuits.unpack_bits(opened[j], n)
        r = (ra.a[off:off + n], ra.b[off:off + n])
        off += n
        values, rvs = [], []
        if zs[j] is not None:
            m = zs[j].numel()
            values = [(job["va"], job["vb"])]
            rvs = [(zs[j], got[pos:pos + m].view(zs[j].shape))]
            pos += m
        bit, ps = _combine(c, r, rvs, values, job["want_bit"])
        if bit is not None:
            bits[j].append(bit)
        if ps:
            prods[j].append(ps[0])
    return bits, prods


def b2a(words: Replicated, n: int) -> Replicated:
    """Arithmetic 0/1 shares (n,) of packed binary-shared bits (2 rounds)."""
    return finish([(words, n)])[0][0]


def bit_mul(words: Replicated, bit_shape: Sequence[int], value: Replicated) -> Replicated:
    """Shares of bit * value for packed binary-shared bits (2 rounds)."""
    return finish((), [(words, bit_shape, value)])[1][0]


def msb_finish(x: Replicated, want_bit: bool = True,
               muls: Sequence[tuple[Sequence[int], Replicated]] = ()):
    """msb(x) (x < 0) as arithmetic 0/1 shares (if want_bit) and times each value, in
    7 rounds: the MSB's XOR sharing is opened masked by a random bit made during its rounds.

    muls: (bit_shape, value) with prod(bit_shape) == x.numel() (x's elements in row-major
    order are the bits). Returns (bit shares of x's shape or None, [bit * value]).
    Per element (lt): roles 0 and 2 send 19.75 B, role 1 27.75 B (every party plays each role
    on a third of the elements: 22.4 B on average); ReLU adds 16 B (roles 1, 2) or 8 B."""
    xa, xb = _flat(x)
    n = xa.numel()
    if len(muls) > 1:
        raise ProtocolError("msb_finish takes at most one bit * value product per call")
    jobs = [{"n": n, "want_bit": want_bit}]
    targets = []
    for bit_shape, value in muls:
        if _bit_count(bit_shape) != n:
            raise ProtocolError(f"msb_finish: bit_shape {tuple(bit_shape)} has {_bit_count(bit_shape)} "
                                f"bits but x has {n} elements")
        va, vb, target = _mul_operand(bit_shape, value)
        jobs[0].update(va=va, vb=vb)
        targets.append(target)

    def first(ro, job, lo, hi):
        return _g_msb2(ro, xa[lo:hi], xb[lo:hi])

    bits, prods = _run(_finish_jobs(jobs, first))
    bit = _cat_rep(bits[0], tuple(x.shape)) if want_bit else None
    return bit, [_cat_rep(prods[0], targets[0])] if muls else []


# -------------------------------------------------------------------------- A2B
def _g_input_b_binary(ro: _Roles, b: torch.Tensor | None, n: int) -> Gen:
    """Role 1's private words b as a binary replicated sharing (0, b ^ rho, rho), rho =
    F(k_12): one round, role 1 sends n words to role 0."""
    d = ro.draws({(1, 2): [n]})
    if ro.role == 1:
        rho = d[(1, 2)][0]
        m = b ^ rho
        yield ({ro.party(0): m}, {})
        return m, rho
    if ro.role == 0:
        got = yield ({}, {ro.party(1): n})
        return torch.zeros(n, dtype=torch.int64), got[ro.party(1)]
    yield ({}, {})
    return d[(1, 2)][0], torch.zeros(n, dtype=torch.int64)


def a2b(x: Replicated) -> Replicated:
    """Binary shares of every bit of x (full 64-bit A2B): x = a + b with [a] = (x_0, 0, 0) and
    [b] = (0, b ^ rho, rho) (1 round, 8 B per element from party 1), then a Kogge-Stone adder
    (circuits.kogge_stone_add: 7 rounds, 13 AND words per element). 8 rounds, 104 B per element
    per party (+ 8 B on party 1)."""
    x = _as_rep(x, "A2B")
    xa, xb = _flat(x)
    n = xa.numel()
    ro = _Roles(0)
    b = xa + xb if ro.role == 1 else None
    bc = _run(_g_input_b_binary(ro, b, n))
    zero = torch.zeros(n, dtype=torch.int64)
    a_comps = {0: (xa, zero), 1: (zero, zero.clone()), 2: (zero, xb)}[ro.role]
    # circuits.kogge_stone_add on the components (linear steps componentwise)
    (g,) = and_many([(_rep(*a_comps), _rep(*bc))])
    p = (a_comps[0] ^ bc[0], a_comps[1] ^ bc[1])
    prop, gen = p, (g.a, g.b)
    for level in range(6):
        k = 1 << level
        t, nxt = and_many([(_rep(*prop), _rep(gen[0] << k, gen[1] << k)),
                           (_rep(*prop), _rep(prop[0] << k, prop[1] << k))])
        gen = (gen[0] ^ t.a, gen[1] ^ t.b)
        prop = (nxt.a, nxt.b)
    return _rep((p[0] ^ (gen[0] << 1)).view(x.shape), (p[1] ^ (gen[1] << 1)).view(x.shape))


# ----------------------------------------------- sums a + b split at bit k (rounding)
def _low_mask(k: int) -> int:
    return -1 if k >= 64 else (1 << k) - 1


def _next_pow2(k: int) -> int:
    w = 2
    while w < k:
        w *= 2
    return w


def _low_lanes(v: torch.Tensor, k: int, pad: bool) -> tuple[torch.Tensor, int]:
    """The low k bits of each element in lanes of W = next_pow2(k) bits (lane-packed); with
    `pad`, bits k..W-1 set (propagate 1, so the lane's carry out is the carry out of bit k-1)."""
    width = _next_pow2(k)
    lanes = v & _low_mask(k)
    if pad and width > k:
        lanes = lanes | (_low_mask(width) ^ _low_mask(k))
    return circuits.pack_lanes(lanes, width), width


def _g_input_b_arith(ro: _Roles, v: torch.Tensor | None, n: int) -> Gen:
    """Role 1's private ring values v as an arithmetic replicated sharing (0, F(k_01),
    v - F(k_01)): one round, role 1 sends n elements to role 2. Returns this party's (a, b)."""
    d = ro.draws({(0, 1): [n]})
    zero = torch.zeros(n, dtype=torch.int64)
    if ro.role == 0:
        yield ({}, {})
        return zero, d[(0, 1)][0]
    if ro.role == 1:
        c1 = d[(0, 1)][0]
        c2 = v - c1
        yield ({ro.party(2): c2}, {})
        return c1, c2
    got = yield ({}, {ro.party(1): n})
    return got[ro.party(1)], zero


def _comp0(ro: _Roles, v: torch.Tensor | None, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(v, 0, 0) for a v known to roles 0 and 2: this party's (a, b)."""
    zero = torch.zeros(n, dtype=torch.int64)
    if ro.role == 0:
        return v, zero
    if ro.role == 2:
        return zero, v
    return zero, zero.clone()


def _g_round_chunk(ro: _Roles, xa: torch.Tensor, xb: torch.Tensor, bits: int) -> Gen:
    """floor(x' / 2^bits) for x' = a + b < 2^63 (x' already biased)."""
    n = xa.numel()
    nw = -(-n // 64)
    if ro.role == 1:
        a, b = None, xa + xb
        lane_b, width = _low_lanes(b, bits, True)
        lane_a = None
        extra = [circuits.pack_bits(logical_shift(b, 63))]
        b_high = logical_shift(b, bits)
    else:
        a, b = (xa if ro.role == 0 else xb), None
        lane_a, width = _low_lanes(a, bits, False)
        lane_b, extra, b_high = None, None, None
    words = -(-(n * width) // 64)

    def first() -> Gen:
        # carry out of the low `bits` bits, and w = a_63 | b_63 (the wrap of a + b, x' < 2^63)
        carry, (e,) = yield from _g_carry(ro, lane_a, lane_b, words, width, extra, [nw])
        if ro.role == 1:
            return torch.zeros(2 * nw, dtype=torch.int64)
        w = e ^ (circuits.pack_bits(logical_shift(a, 63)) & e)
        if ro.role == 0:
            w = w ^ circuits.pack_bits(logical_shift(a, 63))
        both = torch.cat([circuits.unpack_bits(carry, n), circuits.unpack_bits(w, n)])
        return circuits.pack_bits(both)

    inj = _g_inject_open(ro, None, 2 * n, [], True, first())
    (bit, _), high = yield from _par([inj, _g_input_b_arith(ro, b_high, n)])
    carry_w = (bit.a[:n], bit.b[:n])
    wrap_w = (bit.a[n:], bit.b[n:])
    ah = _comp0(ro, logical_shift(a, bits) if a is not None else None, n)
    return [ah[j] + high[j] + carry_w[j] - (wrap_w[j] << (64 - bits)) for j in range(2)]


def round_exact(x: Replicated, bits: int) -> Replicated:
    """Shares of floor((x + 2^(bits-1)) / 2^bits), exactly (|x| < 2^61, 1 <= bits <= 62).

    x' = x + 2^62 + 2^(bits-1) = a + b (a = x_0, b = x_1 + x_2, unsigned) is in [0, 2^63), so
    floor(x' / 2^bits) = (a >> bits) + (b >> bits) + carry - 2^(64-bits) w with carry the carry
    out of the low `bits` bits of a + b and w = a_63 | b_63 (a + b wraps iff a top bit is set,
    as x' < 2^63). [a >> bits] is component 0; party 1 shares b >> bits (round 1); the carry
    and w come from the carry circuit (1 + log2(W/2) rounds, W = next_pow2(bits)) and one bit
    injection (opened in the round after). bits = 16: 5 rounds.
    """
    x = _as_rep(x, "round_exact")
    if not 1 <= bits <= 62:
        raise ProtocolError(f"round_exact: bits must be 1..62, got {bits}")
    shape = x.shape
    xa, xb = _add_public(*_flat(x), (1 << BIAS_BITS) + (1 << (bits - 1)))
    chunks = _chunks(xa.numel())
    got = _run(_par([_g_round_chunk(_Roles(k), xa[lo:hi], xb[lo:hi], bits) for k, lo, hi in chunks]))
    if not got:
        return _rep(torch.zeros(shape, dtype=torch.int64), torch.zeros(shape, dtype=torch.int64))
    a, b = _add_public(torch.cat([g[0] for g in got]), torch.cat([g[1] for g in got]),
                       -(1 << (BIAS_BITS - bits)))
    return _rep(a.view(shape), b.view(shape))


# ------------------------------------------------------------- truncation pairs
def _g_trunc_chunk(ro: _Roles, n: int, bits: int) -> Gen:
    """n pairs of chunk role `ro`: this party's (r, rt, m) components."""
    nw = -(-n // 64)
    d = ro.draws({(0, 1): [n], (1, 2): [n], (0, 2): [n]})
    role = ro.role
    comps = _pair_components(d)
    r = (comps[role], comps[(role + 1) % WORLD])
    if role == 1:
        a, b = None, comps[1] + comps[2]
        lo_a, (lo_b, width) = None, _low_lanes(b, bits, True)
        top_a, top_b = None, (b & circuits.LOW63) | circuits.TOP
        extra = [circuits.pack_bits(logical_shift(b, 63))]
        high = logical_shift(b, bits) - (logical_shift(b, 63) << (63 - bits))
    else:
        a, b = comps[0], None
        (lo_a, width), lo_b = _low_lanes(a, bits, False), None
        top_a, top_b, extra, high = a & circuits.LOW63, None, None, None
    words = -(-(n * width) // 64)

    def first() -> Gen:
        (low, _), (c63, (e,)) = yield from _par([
            _g_carry(ro, lo_a, lo_b, words, width, [], []),
            _g_carry(ro, top_a, top_b, n, 64, extra, [nw])])
        if role == 1:
            return torch.zeros(3 * nw, dtype=torch.int64)
        m = c63 ^ e
        if role == 0:
            m = m ^ circuits.pack_bits(logical_shift(a, 63))
        return circuits.pack_bits(torch.cat([circuits.unpack_bits(w, n) for w in (low, c63, m)]))

    inj = _g_inject_open(ro, None, 3 * n, [], True, first())
    (bit, _), hi = yield from _par([inj, _g_input_b_arith(ro, high, n)])
    cl = (bit.a[:n], bit.b[:n])
    c63 = (bit.a[n:2 * n], bit.b[n:2 * n])
    m = (bit.a[2 * n:], bit.b[2 * n:])
    ah = _comp0(ro, logical_shift(a, bits) - (logical_shift(a, 63) << (63 - bits)) if a is not None else None, n)
    rt = tuple(ah[j] + hi[j] + cl[j] - ((c63[j] - m[j]) << (63 - bits)) for j in range(2))
    return r, rt, m


def trunc_pairs(n: int, bits: int) -> tuple[Replicated, Replicated, Replicated]:
    """n truncation pairs ([r], [r >> bits] logical, [msb r]) without a dealer.

    r = r_0 + r_1 + r_2 with r_j = F(k_{j,j-1}) (component j, known to its two holders): uniform
    and unknown to every party. With a = r_0 and b = r_1 + r_2 (party 1's): r >> bits = (a >> bits)
    + (b >> bits) + carry - 2^(64-bits) wrap, where carry is the carry out of the low `bits` bits
    of a + b and, from the full adder at bit 63 (c63 = carry into bit 63, m = a_63 ^ b_63 ^ c63
    = msb r), 2 wrap = a_63 + b_63 + c63 - m: so [rt] = [(a >> bits) - 2^(63-bits) a_63]
    (component 0) + [(b >> bits) - 2^(63-bits) b_63] (shared by party 1, round 1) + [carry]
    - 2^(63-bits) ([c63] - [m]). The three bits come from two carry circuits (low lanes of
    W = next_pow2(bits) bits, and the 64-bit one as for the MSB) and one bit injection:
    7 rounds (independent of the input: run them in bulk ahead of time).
    """
    if not 1 <= bits <= 62:
        raise ProtocolError(f"trunc_pairs: bits must be 1..62, got {bits}")
    chunks = _chunks(n)
    got = _run(_par([_g_trunc_chunk(_Roles(k), hi - lo, bits) for k, lo, hi in chunks]))
    outs = []
    for j in range(3):
        a = torch.cat([g[j][0] for g in got]) if got else torch.zeros(0, dtype=torch.int64)
        b = torch.cat([g[j][1] for g in got]) if got else torch.zeros(0, dtype=torch.int64)
        outs.append(_rep(a, b))
    return outs[0], outs[1], outs[2]


# ------------------------------------------------------------------ fused equality
def eqz_finish(z: Replicated) -> Replicated:
    """[z == 0] as arithmetic 0/1 shares of z's shape, in 7 rounds: z == 0 iff
    msb(z) == msb(-z), both MSBs' XOR sharings (rounds 1-6) xored and negated locally, then
    opened masked by a random bit made meanwhile (round 7). Per element: twice the carry
    circuit of msb_finish and one bit injection (roles 0 and 2 192 + 64 + 2, role 1 316 + 64
    words per 64 elements: 36.8 B per element per party on average)."""
    za, zb = _flat(z)
    n = za.numel()

    def first(ro, job, lo, hi):
        def both() -> Gen:
            u, v = yield from _par([_g_msb2(ro, za[lo:hi], zb[lo:hi]), _g_msb2(ro, -za[lo:hi], -zb[lo:hi])])
            w = u ^ v
            return ~w if ro.role == 0 else w
        return both()

    bits, _ = _run(_finish_jobs([{"n": n, "want_bit": True}], first))
    return _cat_rep(bits[0], tuple(z.shape))


# ------------------------------------------------------------- short MSB (small values)
def _g_msb_low(ro: _Roles, xa: torch.Tensor, xb: torch.Tensor, m: int) -> Gen:
    """XOR shares (roles 0 and 2) of bit m-1 of (a + b) mod 2^m: 1 + log2(W/2) rounds for
    the carry into bit m-1 (W = next_pow2(m - 1)), none for m = 1."""
    n = xa.numel()
    nw = -(-n // 64)
    if ro.role == 1:
        b = xa + xb
        top = circuits.pack_bits(logical_shift(b, m - 1) & 1)
    else:
        b = None
        top = circuits.pack_bits(logical_shift(xa if ro.role == 0 else xb, m - 1) & 1)
    extra_sizes = [nw]
    if m == 1:
        # no carry: share role 1's top bit through one masked message
        lane_a = torch.zeros(nw, dtype=torch.int64) if ro.role != 1 else None
        lane_b = torch.zeros(nw, dtype=torch.int64) if ro.role == 1 else None
        width, words = 2, nw
    elif ro.role == 1:
        lane_b, width = _low_lanes(b, m - 1, True)
        lane_a = None
        words = lane_b.numel()
    else:
        lane_a, width = _low_lanes(xa if ro.role == 0 else xb, m - 1, False)
        lane_b = None
        words = lane_a.numel()
    carry, (e,) = yield from _g_carry(ro, lane_a, lane_b, words, width, [top] if ro.role == 1 else None, extra_sizes)
    if m == 1:
        carry = torch.zeros(nw, dtype=torch.int64)
    if ro.role == 1:
        return torch.zeros(nw, dtype=torch.int64)
    out = carry ^ e
    return out ^ top if ro.role == 0 else out


def msb_low(x: Replicated, m: int) -> Replicated:
    """Packed binary shares of bit m-1 of x mod 2^m (x < 0 when -2^(m-1) <= x < 2^(m-1)), for
    1 <= m <= 64: the carry circuit on the low m - 1 bits, then the conversion round:
    2 + log2(W/2) rounds, W = next_pow2(m - 1) (m = 16: 5 rounds)."""
    if not 1 <= m <= 64:
        raise ProtocolError(f"msb_low: m must be 1..64, got {m}")
    xa, xb = _flat(x)

    def chunk(ro, a, b) -> Gen:
        u = yield from _g_msb_low(ro, a, b, m)
        return (yield from _g_to_rss(ro, u, -(-a.numel() // 64)))

    got = _run(_par([chunk(_Roles(k), xa[lo:hi], xb[lo:hi]) for k, lo, hi in _chunks(xa.numel())]))
    if not got:
        return _rep(_EMPTY.clone(), _EMPTY.clone())
    return _rep(torch.cat([a for a, _ in got]), torch.cat([b for _, b in got]))
