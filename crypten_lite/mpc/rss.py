"""Arithmetic protocols on 2-out-of-3 replicated shares (3 parties, honest majority, no dealer).

Party i holds (x_i, x_{i+1}) of x = x_0 + x_1 + x_2 mod 2^64 (``Replicated``: ``.a``, ``.b``);
next = i + 1, prev = i - 1 (mod 3). Pairwise seeds from the handshake give each pair {i, j} a
common PRG per purpose (``Session.pair_prg``); F(k_ij) below is the next draw of that stream,
drawn by both i and j at the same point of the program. A la [AFL+16] / [MR18] (ABY3).

1. share(v, src): x_src = F(k_{src,prev}) (purpose "rss-share"; src and prev draw it),
   x_prev = 0, x_next = v - x_src, sent by src to next: one one-way message of 8 bytes per
   element (counted like the shape announcement: bytes and a message, not a round).
2. open (to all): party i sends x_{i+1} (its .b) to prev, which lacks it: 1 round, 8 B per
   element per party. To one party dst: only next(dst) sends (dst's missing component).
3. bilinear product f (mul, matmul, conv): z_i = f(x_i, y_i + y_{i+1}) + f(x_{i+1}, y_i) + alpha_i
   (the 9 cross terms split over the parties), alpha_i = F(k_{i,next}) - F(k_{prev,i}) a fresh
   zero-sharing (purpose "rss-zero", a new draw every call); party i sends z_i to prev and
   receives z_{next}: (z_i, z_{i+1}). 1 round, 8 B per output element per party.
4. product + truncation by 2^bits (fixed point), fused, with a pair ([r], [r >> bits],
   [msb r]) made without a dealer (``rss_binary.trunc_pairs``), exact as
   ``truncation.truncate_exact``: every party sends u_i = z_i + alpha_i + r_i (+ 2^62 on
   party 0) to BOTH others (16 B per output element per party, 1 round), everyone sums
   c = xy + 2^62 + r; then [x' >> bits] = (c >> bits) - [rt] + 2^(64-bits) (1 - msb c) [m],
   minus 2^(62-bits), with no further round. Error at most 1 ulp, never catastrophic
   (|xy| < 2^62). u_i alone is uniform to each receiver (alpha_i hides z_i from next... and
   r_i, unknown to next, hides it; the two received values are jointly uniform because
   r_{i-1} is unknown to i).
5. truncate(x, bits) of a replicated x: open c = x + 2^62 + r like 2. (1 round, 8 B/element).
6. Without a stocked pair (no offline phase), 4. and 5. run the helper truncation
   (_helper_trunc_gen): a helper (party n mod 3) knows r and deals the two values that make c
   exact as 2-of-2 shares to the other two, who open c between themselves and turn their result into
   replicated shares in a second round: 2 rounds, nothing made beforehand.

The re-randomization in 3. is what CrypTen's RSS once missed (its issue #518): the test suite
checks that the values a party receives for the same product twice are fresh and uniform.
"""

from __future__ import annotations

import math

import contextlib
import hashlib
from typing import Iterator, Sequence

import torch

from ..comm.communicator import shape_tag, tag_of, with_tag
from ..errors import ProtocolError, UnsupportedError
from ..provider.correlations import TRIPLE_OPS, logical_shift
from ..random import canonical
from ..session import current
from .replicated import Replicated

BIAS_BITS = 62
WORLD = 3
MAX_WIRE_DIMS = 16  # as primitives.MAX_WIRE_DIMS


def _peers(rank: int) -> tuple[int, int]:
    return (rank + 1) % WORLD, (rank + 2) % WORLD


def zero_share(shape) -> torch.Tensor:
    """alpha_i of a fresh 3-party zero sharing: F(k_{i,next}) - F(k_{prev,i})."""
    s = current()
    nxt, prev = _peers(s.rank)
    shape = tuple(shape)
    out = s.pair_prg("rss-zero", nxt).draw(shape)
    out -= s.pair_prg("rss-zero", prev).draw(shape)
    return out


def _check(mine: torch.Tensor, got: torch.Tensor, peer: int, what: str) -> None:
    """ProtocolError unless `got` has `mine`'s shape, dtype and tag (the digest of the full
    shapes a flat message carries, comm.communicator.shape_tag)."""
    if got.shape != mine.shape or got.dtype != mine.dtype:
        rank = current().rank
        raise ProtocolError(
            f"party {rank}: {what} of a share of shape {tuple(mine.shape)} ({mine.dtype}) here, "
            f"but party {peer} sent shape {tuple(got.shape)} ({got.dtype}); every party must "
            "reveal the same tensor (the parties' programs diverged: check shapes and inputs)")
    if tag_of(got) != tag_of(mine):
        raise ProtocolError(
            f"party {current().rank}: {what} of {mine.numel()} values here, but party {peer}'s "
            "message says they have other shapes (the digest of the full shapes in its header "
            "differs); every party must reveal the same tensors (the parties' programs "
            "diverged: check shapes and inputs)")


# ------------------------------------------------------------------------- sharing
def share(encoded: torch.Tensor | None, src: int, shape) -> Replicated:
    """This party's replicated share of `encoded` (held by `src`; None elsewhere)."""
    s = current()
    rank = s.rank
    nxt, prev = _peers(rank)
    shape = tuple(shape)
    if rank == src:
        x_src = s.pair_prg("rss-share", prev).draw(shape)
        x_next = encoded.reshape(shape) - x_src
        # One-way: nobody answers it (counted in bytes and messages, like the announcement).
        s.comm.exchange({nxt: _wire(x_next)}, [], rounds=0)
        return Replicated(x_src, x_next, rank)
    if nxt == src:  # this party is src's prev: (x_prev, x_src) = (0, F(k_{src,prev}))
        x_src = s.pair_prg("rss-share", src).draw(shape)
        return Replicated(torch.zeros(shape, dtype=torch.int64), x_src, rank)
    # this party is src's next: (x_next, x_prev) = (received, 0)
    x_next = s.comm.exchange({}, [src], rounds=0)[src]
    _check(_wire(torch.empty(shape, dtype=torch.int64)), x_next, src, "input sharing")
    return Replicated(x_next.reshape(shape), torch.zeros(shape, dtype=torch.int64), rank)


def _wire(x: torch.Tensor) -> torch.Tensor:
    """`x` as a one-tensor message: in its own shape, flat beyond MAX_WIRE_DIMS dimensions,
    its full shape's digest in the header either way (checked by _check)."""
    return with_tag(x if x.dim() <= MAX_WIRE_DIMS else x.reshape(-1), shape_tag([x.shape]))


def public(encoded: torch.Tensor) -> Replicated:
    """The trivial sharing (c, 0, 0) of a public value (no communication)."""
    rank = current().rank
    zero = torch.zeros_like(encoded)
    if rank == 0:
        return Replicated(encoded.clone(), zero, rank)
    if rank == 2:
        return Replicated(zero, encoded.clone(), rank)
    return Replicated(zero, zero.clone(), rank)


# ------------------------------------------------------------------------- opening
def _as_rep(x) -> Replicated:
    if not isinstance(x, Replicated):
        raise ProtocolError(f"protocol 'rss' expects replicated shares, got {type(x).__name__} "
                            "(a share made under another protocol, or a plain tensor)")
    return x


def open_many(shares: Sequence[Replicated], dst: int | None = None, binary: bool = False
              ) -> list[torch.Tensor] | None:
    """Reveal several replicated tensors in one round (to all, or only to `dst`)."""
    s = current()
    rank = s.rank
    nxt, prev = _peers(rank)
    shares = [_as_rep(x) for x in shares]
    # One tensor travels in its own shape; several (or one of more dimensions than a header
    # holds) as one flat vector. Either way the header carries a digest of every value's full
    # shape, which the receiver compares with its own (_check): no extra byte, no extra round.
    one = len(shares) == 1 and shares[0].dim() <= MAX_WIRE_DIMS
    flat_b = shares[0].b if one else torch.cat([x.b.reshape(-1) for x in shares])
    flat_b = with_tag(flat_b, shape_tag([x.a.shape for x in shares]))
    what = "reveal" if len(shares) == 1 else f"opening of {len(shares)} values"
    if dst is None:
        got = s.comm.exchange({prev: flat_b}, [nxt])[nxt]
    else:
        if not 0 <= dst < WORLD:
            raise ProtocolError(f"dst={dst} is out of range: ranks are 0..2")
        if rank == dst:
            got = s.comm.exchange({}, [nxt])[nxt]
        else:
            s.comm.exchange({dst: flat_b} if prev == dst else {}, [])
            return None
    _check(flat_b, got, nxt, what)
    got = got.reshape(-1)
    out, offset = [], 0
    for x in shares:
        n = x.numel()
        missing = got[offset:offset + n].view(x.shape)
        offset += n
        out.append(x.a ^ x.b ^ missing if binary else x.a + x.b + missing)
    return out


def open_(x: Replicated, dst: int | None = None) -> torch.Tensor | None:
    """Reveal one replicated tensor (one round)."""
    got = open_many([x], dst)
    return None if got is None else got[0]


def open_xor(x: Replicated) -> torch.Tensor:
    """Reveal a binary (xor) replicated tensor to every party (one round)."""
    return open_many([x], binary=True)[0]


# ------------------------------------------------------------------------- products
def _cross(op: str, x: Replicated, y: Replicated, params: Sequence[int]) -> torch.Tensor:
    """z_i = f(x_i, y_i + y_{i+1}) + f(x_{i+1}, y_i) = f(x_i + x_{i+1}, y_i) + f(x_i, y_{i+1}): this
    party's 3-of-3 share of f(x, y)."""
    if op not in TRIPLE_OPS:
        raise UnsupportedError(f"no replicated product for op {op!r}; supported: {sorted(TRIPLE_OPS)}")
    fn = TRIPLE_OPS[op]
    x, y = _as_rep(x), _as_rep(y)
    if op == "mul" and x.a.shape == y.a.shape:  # the same sum in place: one temporary, not three
        z = y.a + y.b
        z *= x.a
        return z.addcmul_(x.b, y.a)
    # The same three terms either way; sum the components of the SMALLER operand (a decode
    # step's one token against a weight: no weight-sized temporary per call).
    if x.a.numel() < y.a.numel():
        z = fn(x.a + x.b, y.a, params)
        z += fn(x.a, y.b, params)
        return z
    z = fn(x.a, y.a + y.b, params)
    z += fn(x.b, y.a, params)
    return z


def reshare(z: torch.Tensor) -> Replicated:
    """A 3-of-3 additive sharing z_i -> replicated: add a fresh zero sharing, send to prev,
    receive from next (one round, 8 B per element per party)."""
    s = current()
    nxt, prev = _peers(s.rank)
    z = z + zero_share(z.shape)
    got = s.comm.exchange({prev: z}, [nxt])[nxt]
    _check(z, got, nxt, "reshare")
    return Replicated(z, got, s.rank)


def mul(op: str, x: Replicated, y: Replicated, params: Sequence[int] = ()) -> Replicated:
    """Replicated shares of op(x, y) at the sum of the scales (one round)."""
    return reshare(_cross(op, x, y, params))


def square(x: Replicated) -> Replicated:
    """Replicated shares of x * x (one round): z_i = x_i (x_i + 2 x_{i+1})."""
    x = _as_rep(x)
    return reshare(x.a * (x.a + 2 * x.b))


def _generate_pairs(n: int, bits: int):
    try:
        from . import rss_binary
    except ImportError:
        rss_binary = None
    gen = getattr(rss_binary, "trunc_pairs", None)
    if gen is None:
        raise UnsupportedError("truncation under protocol 'rss' needs crypten_lite.mpc.rss_binary."
                               "trunc_pairs (dealer-free truncation pairs), which is not available")
    return gen(n, bits)


class _PairStock:
    """Truncation pairs made ahead of time (prefetch_trunc), used in order, each once."""

    def __init__(self) -> None:
        self.parts: list[tuple[Replicated, Replicated, Replicated]] = []
        self.available = 0

    def take(self, n: int) -> tuple[Replicated, ...]:
        got, need = [], n
        while need:
            part = self.parts[0]
            size = part[0].numel()
            k = min(need, size)
            got.append(tuple(t[:k] for t in part))
            if k == size:
                self.parts.pop(0)
            else:
                self.parts[0] = tuple(t[k:] for t in part)
            need -= k
        self.available -= n
        if len(got) == 1:
            return got[0]
        return tuple(torch.cat([g[j] for g in got]) for j in range(len(got[0])))


# Stock key of the random bits (rss_binary.dabits), beside the truncation pairs' bit counts.
DABITS = 0
# Offline batches: at most this many pairs (or random bits) per call of the generating
# circuits, so that their temporaries stay bounded (a whole model's plan at once once took a
# party past 8 GB); each batch is its own 7 (2) offline rounds.
PREFETCH_BATCH = 1 << 20


def _batches(n: int) -> Iterator[int]:
    """The sizes of n items made PREFETCH_BATCH at a time."""
    for lo in range(0, n, PREFETCH_BATCH):
        yield min(PREFETCH_BATCH, n - lo)


def _stock(bits: int) -> _PairStock:
    stocks = current().rss_stock
    if bits not in stocks:
        stocks[bits] = _PairStock()
    return stocks[bits]


def prefetch_dabits(n: int) -> None:
    """Offline: make n random bits, each both XOR- and arithmetically shared
    (rss_binary.dabits: 2 rounds, input-independent), for later B2As and bit * value
    products (rss_binary.finish then takes one round instead of two). Collective."""
    if n <= 0:
        return
    from . import rss_binary
    stock = _stock(DABITS)
    for k in _batches(n):
        stock.parts.append(tuple(rss_binary.dabits(k)))
        stock.available += k


def take_dabits(n: int):
    """(binary 0/1 bits, arithmetic 0/1 bits) of n prefetched random bits, or None when fewer
    than n are stocked (then the caller makes its own online). Recorded (bits 0) under
    record(), so that a plan prefetches them."""
    s = current()
    if s.rss_recording is not None:
        s.rss_recording.append((DABITS, n))
    stock = _stock(DABITS)
    if n and stock.available >= n:
        return stock.take(n)
    return None


def prefetch_trunc(n: int, bits: int) -> None:
    """Offline: make n truncation pairs for `bits` now, in one batch (collective: every party
    calls it with the same arguments at the same point). Later truncations by `bits` use them
    first, in order, so their online cost is the opening alone."""
    if n <= 0:
        return
    stock = _stock(bits)
    for k in _batches(n):
        stock.parts.append(_prepare(*_generate_pairs(k, bits), bits))
        stock.available += k


def stocked(bits: int) -> int:
    """Truncation pairs for `bits` made ahead of time and not used yet."""
    return _stock(bits).available


@contextlib.contextmanager
def record() -> Iterator[list]:
    """Record the truncation pairs the block uses, as [(bits, n), ...] (offline.record under
    rss); the list is filled at exit. A plan depends on the program and shapes, not on values."""
    s = current()
    plan: list = []
    s.rss_recording = []
    try:
        yield plan
    finally:
        plan.extend(s.rss_recording)
        s.rss_recording = None


def prefetch(plan: Sequence[tuple[int, int]]) -> None:
    """Offline (collective): make every truncation pair of a recorded plan now, one batch per
    bit count (7 rounds each, all input-independent), and its random bits (bit count 0:
    2 rounds); the run that follows uses them."""
    s = current()
    digest = hashlib.sha256(canonical("rss-plan/v1", [[int(b), int(n)] for b, n in plan])).digest()
    mine = torch.frombuffer(bytearray(digest), dtype=torch.int64).clone()
    differ = [r for r, d in enumerate(s.comm.all_gather(mine)) if not torch.equal(d, mine)]
    if differ:
        raise ProtocolError(f"offline.prefetch: party {s.rank}'s plan differs from that of parties "
                            f"{differ}; every party must record the same program and call prefetch "
                            "with its plan at the same point")
    totals: dict[int, int] = {}
    for bits, n in plan:
        totals[int(bits)] = totals.get(int(bits), 0) + int(n)
    for bits in sorted(totals):
        if bits == DABITS:
            prefetch_dabits(totals[bits])
        else:
            prefetch_trunc(totals[bits], bits)


def _note(n: int, bits: int) -> None:
    """Record that a truncation by `bits` of n elements ran (the plan offline.record makes)."""
    s = current()
    if s.rss_recording is not None:
        s.rss_recording.append((bits, n))


def _trunc_pairs(n: int, bits: int):
    """A prepared pair (_prepare) of n elements from the prefetched stock (the caller checked
    _stocked first)."""
    _note(n, bits)
    return _stock(bits).take(n)


def _stocked(needs: Sequence[tuple[int, int]]) -> bool:
    """Whether the stock holds pairs for every (n, bits) of a call (bits 0: none needed). A
    call with its pairs stocked opens c = x + r to everyone in one round; any other call runs
    the helper truncation (_helper_trunc_gen: two rounds, no pair). Every party's stock is the
    same (the same plan, prefetched at the same point), so every party takes the same path."""
    totals: dict[int, int] = {}
    for n, bits in needs:
        if bits:
            totals[bits] = totals.get(bits, 0) + int(n)
    return all(_stock(bits).available >= n for bits, n in totals.items())


def _wrap64(v: int) -> int:
    """v mod 2^64 as a signed int64 value."""
    return ((v + (1 << 63)) % (1 << 64)) - (1 << 63)


def _prepare(r: Replicated, rt: Replicated, m: Replicated, bits: int) -> tuple:
    """Everything of a truncation pair that does not depend on the value, computed when the
    pair is made (offline for prefetched pairs), so that the online truncation is an opening
    and a selection:

    * u_mask = r_i + alpha_i (+ 2^62 on rank 0): this party's term of the fused product's
      opening (_trunc_additive), alpha a fresh zero sharing of its own (rss-zero streams, drawn
      here once per pair, in the same order on every party);
    * for each component j of the result, the two values it takes depending on the public
      keep = 1 - msb(c): A_j = 2^(64-bits) m_j - rt_j and B_j = -rt_j, with the public term's
      constants (-2^(62-bits), and +2^(64-bits) that turns the arithmetic shift c >> bits into
      the logical one when c < 0) folded into share index 0; kept as D_j = A_j - B_j and B_j,
      so that the selection is B_j + (D_j & keep mask).

    Returns (r, u_mask, D_a, D_b, B_a, B_b), every tensor flat (n,)."""
    rank = current().rank
    n = r.numel()
    u_mask = r.a.reshape(-1) + zero_share((n,))
    if rank == 0:
        u_mask += 1 << BIAS_BITS
    hi = 64 - bits
    # D_j = A_j - B_j = 2^(64-bits) m_j (share index 0: minus the 2^(64-bits) that B_0 adds)
    d = [m.a.reshape(-1) << hi, m.b.reshape(-1) << hi]
    b = [-rt.a.reshape(-1), -rt.b.reshape(-1)]
    holder = 0 if rank == 0 else 1 if rank == 2 else None
    if holder is not None:
        k = 1 << (BIAS_BITS - bits)
        d[holder] -= _wrap64(1 << hi)
        b[holder] += _wrap64((1 << hi) - k)
    return (r.reshape(-1), u_mask, d[0], d[1], b[0], b[1])


def _finish_trunc(c: torch.Tensor, pair: tuple, bits: int) -> Replicated:
    """(c >> bits) - [rt] + 2^(64-bits) (1 - msb c) [m] - 2^(62-bits), c public: one
    selection per component by keep = 1 - msb(c) between the pair's prepared values, and the
    arithmetic shift of c added to share index 0 (local). c is the caller's fresh opening,
    shifted in place (two temporaries in all, for a 10^6-element product 16 MB)."""
    _, _, d_a, d_b, b_a, b_b = pair
    keep = c >> 63                                  # all ones where c < 0 ...
    keep.bitwise_not_()                             # ... now where c >= 0: 1 - msb c, public
    a = d_a & keep
    a += b_a
    b = torch.bitwise_and(d_b, keep, out=keep)      # keep's buffer, not needed after this
    b += b_b
    rank = current().rank
    if rank in (0, 2):
        (a if rank == 0 else b).add_(c.bitwise_right_shift_(bits))
    return Replicated(a, b, rank)


def truncate(x: Replicated, bits: int) -> Replicated:
    """Replicated shares of x / 2^bits (+-1 ulp, |x| < 2^62; one round, 8 B per element)."""
    if bits == 0:
        return x
    x = _as_rep(x)
    shape = x.shape
    if not _stocked([(x.numel(), bits)]):
        return _run_gen(truncate_many_gen([(x, bits)]))[0]
    pair = _trunc_pairs(x.numel(), bits)
    c = open_(x.reshape(-1) + pair[0] + (1 << BIAS_BITS))
    return _finish_trunc(c, pair, bits).view(shape)


def truncate_many(items: Sequence[tuple[Replicated, int]]) -> list[Replicated]:
    """truncate for several (x, bits) in ONE round: one opening of every x + 2^62 + r (8 B
    per truncated element per party); items with bits 0 come back as they are."""
    todo = [(i, _as_rep(x), b) for i, (x, b) in enumerate(items) if b]
    out = [x for x, _ in items]
    if not todo:
        return out
    if not _stocked([(x.numel(), b) for _, x, b in todo]):
        return _run_gen(truncate_many_gen(items))
    pairs = [_trunc_pairs(x.numel(), b) for _, x, b in todo]
    opened = open_many([x.reshape(-1) + pair[0] + (1 << BIAS_BITS) for (_, x, _), pair in zip(todo, pairs)])
    for (i, x, b), pair, c in zip(todo, pairs, opened):
        out[i] = _finish_trunc(c, pair, b).view(x.shape)
    return out


# ------------------------------------------------------- protocols in rounds (generators)
# The same steps as rss_binary's protocol generators: each yields its one request
# ({dst: words}, {src: numel}) and gets the words received, so that it can ride in another
# protocol's rounds (mpc.parallel.alongside) or run alone (rss_binary._run).
def _additive_terms(job: tuple) -> torch.Tensor:
    """This party's 3-of-3 additive share of a job's value: ("square", x), ("mul", x, y)
    (broadcasting shapes), ("square_sum", x) (sum of x^2 over the last dim, kept),
    ("share", x) (x itself: its component x_i), or ("terms", z) (z, this party's term)."""
    if job[0] == "terms":
        return job[1]
    kind, x = job[0], _as_rep(job[1])
    if kind == "square":
        return x.a * (x.a + 2 * x.b)
    if kind == "square_sum":
        return (x.a * (x.a + 2 * x.b)).sum(-1, keepdim=True)
    if kind == "share":
        return x.a.clone()
    if kind == "mul":
        return _cross("mul", x, job[2], ())
    raise ProtocolError(f"no replicated product job {kind!r}")


def _unflatten(flat: Replicated, shapes) -> list[Replicated]:
    out, off = [], 0
    for shape in shapes:
        n = math.prod(shape)
        out.append(flat[off:off + n].view(shape))
        off += n
    return out


def products_gen(jobs: Sequence[tuple]):
    """Untruncated products of several jobs (_additive_terms) in one round (a reshare: 8 B
    per element)."""
    return (yield from _reshare_terms_gen([_additive_terms(job) for job in jobs]))


def products_trunc_gen(jobs: Sequence[tuple], bits):
    """The values of several jobs (_additive_terms), job j divided by 2^bits[j] (or all by
    2^bits), in ONE round (mul_trunc's fused truncation: 16 B per element; a job with bits 0
    is reshared in the same message, 8 B)."""
    bits = [bits] * len(jobs) if isinstance(bits, int) else list(bits)[:len(jobs)]
    if not any(bits):
        return (yield from products_gen(jobs))
    s = current()
    nxt, prev = _peers(s.rank)
    zs = [_additive_terms(job) for job in jobs]
    if not _stocked([(z.numel(), b) for z, b in zip(zs, bits)]):
        return (yield from _helper_products_gen(zs, bits))
    pairs = [_trunc_pairs(z.numel(), b) if b else None for z, b in zip(zs, bits)]
    # r_i + alpha_i (+ 2^62) for a truncated job (_prepare), a fresh zero sharing for the rest
    us = [z.reshape(-1) + pair[1] if pair is not None else z.reshape(-1) + zero_share((z.numel(),))
          for z, pair in zip(zs, pairs)]
    both = torch.cat([u for u, pair in zip(us, pairs) if pair is not None])
    plain = [u for u, pair in zip(us, pairs) if pair is None]
    to_prev = torch.cat([both] + plain) if plain else both
    got = yield ({nxt: both, prev: to_prev}, {nxt: to_prev.numel(), prev: both.numel()})
    out, off_b, off_p = [], 0, both.numel()
    for z, u, pair, b in zip(zs, us, pairs, bits):
        n = u.numel()
        if pair is None:
            out.append(Replicated(u, got[nxt][off_p:off_p + n], s.rank).view(z.shape))
            off_p += n
            continue
        c = u + got[nxt][off_b:off_b + n]
        c += got[prev][off_b:off_b + n]
        off_b += n
        out.append(_finish_trunc(c, pair, b).view(z.shape))
    return out


def truncate_many_gen(items: Sequence[tuple[Replicated, int]]):
    """truncate_many in one request (items with bits 0 come back as they are)."""
    s = current()
    nxt, prev = _peers(s.rank)
    todo = [(i, _as_rep(x), b) for i, (x, b) in enumerate(items) if b]
    out = [x for x, _ in items]
    if not todo:
        return out
    if not _stocked([(x.numel(), b) for _, x, b in todo]):
        # the helper's two rounds: A's x_A plus B's x_B + x_H is x, so the helper adds no term
        flat = [x.reshape(-1) for _, x, _ in todo]
        h = helper_of(sum(x.numel() for x in flat))
        terms = [None if s.rank == h else x.a if s.rank == (h + 1) % WORLD else x.a + x.b for x in flat]
        got = yield from _helper_trunc_gen(terms, [x.numel() for x in flat], [b for _, _, b in todo], False)
        for (i, x, _), y in zip(todo, got):
            out[i] = y.view(x.shape)
        return out
    pairs = [_trunc_pairs(x.numel(), b) for _, x, b in todo]
    masked = [_as_rep(x.reshape(-1) + pair[0] + (1 << BIAS_BITS)) for (_, x, _), pair in zip(todo, pairs)]
    flat_b = torch.cat([m.b for m in masked])
    got = (yield ({prev: flat_b}, {nxt: flat_b.numel()}))[nxt]
    off = 0
    for (i, x, b), pair, m in zip(todo, pairs, masked):
        n = m.numel()
        c = m.a + m.b + got[off:off + n]
        off += n
        out[i] = _finish_trunc(c, pair, b).view(x.shape)
    return out


# ------------------------------------------------ truncation without a pair (a helper deals)
def helper_of(n: int) -> int:
    """The party that deals a helper truncation of n elements in all (n mod 3, as
    rss_binary rotates its roles by a call's size): the helper sends the most (its term and
    the dealt values), so the load moves between the parties from one size to the next. A
    function of the call alone, the same on every party whatever ran before."""
    return n % WORLD


def _run_gen(gen):
    """Run a protocol generator alone (rss_binary._run: one exchange per request)."""
    from .rss_binary import _run
    return _run(gen)


def _helper_trunc_gen(terms, sizes: Sequence[int], bits: Sequence[int], helper_terms: bool):
    """Replicated shares of (sum_i z_i) / 2^bits for each job, from a 3-of-3 additive sharing
    z (this party's flat term per job in `terms`; the helper's are None when it has none,
    `helper_terms` False), without a truncation pair: TWO rounds, nothing made beforehand.
    H = helper_of(n) (n: the call's elements in all), A = H + 1 and B = H + 2 (mod 3): A holds
    (y_{A}, y_{B}) of a result y, B (y_{B}, y_{H}), H (y_{H}, y_{A}); F_AH, F_BH the streams A
    and H, B and H share (purpose "rss-trunc", fresh draws every call).

    r = r_A + r_B (r_A = F_AH, r_B = F_BH): H knows r, A and B one half each.
    Round 1: A sends B e_A = z_A + 2^62 + r_A + t_A, B sends A e_B = z_B + r_B + t_B; H sends
      A f_A = z_H - t_B and d_A = -(r >> bits) - p_B, and B f_B = z_H - t_A and
      k_B = 2^(64-bits) msb(r) - k_A (t_A, k_A = F_AH; t_B, p_B = F_BH; no t nor f when H
      has no term). A and B each sum c = z + 2^62 + r (c is never sent to H).
    Then x' >> bits = (c >> bits) - (r >> bits) + 2^(64-bits) msb(r) (1 - msb c) (+-1 ulp,
      |x| < 2^62; logical shifts): A holds s_A = (c >> bits) - 2^(62-bits) + d_A + k_A (1 - msb c),
      B holds s_B = p_B + k_B (1 - msb c), s_A + s_B = x / 2^bits.
    Round 2: the result's components y_A = F_AH and y_H = F_BH are drawn; A sends B
      s_A - y_A, B sends A s_B - y_H, and both sum y_B. H sends nothing.
    Bytes per element: A and B 16 (8 per round), H 16 (32 when it has terms: f and d to A,
    f and k to B). What a party receives is uniform and independent of x: to A, e_B is masked
    by r_B, f_A by t_B, d_A by p_B and B's round-2 word by y_H (all from F_BH, which A lacks);
    to B likewise with F_AH; H receives nothing. Secure against one semi-honest party, as the
    rest of this module: H with A (or B) would learn x."""
    s = current()
    rank = s.rank
    for size, b in zip(sizes, bits):
        _note(size, b)                  # the pairs a prefetch of this run's plan would make
    n = int(sum(sizes))
    h_ = helper_of(n)
    a_, b_ = (h_ + 1) % WORLD, (h_ + 2) % WORLD
    offsets = [0]
    for k in sizes:
        offsets.append(offsets[-1] + int(k))

    def per_job(fn, t: torch.Tensor) -> torch.Tensor:
        return torch.cat([fn(t[lo:hi], b) for lo, hi, b in zip(offsets, offsets[1:], bits)]) if n else t

    def stream(peer: int, count: int) -> list[torch.Tensor]:
        g = s.pair_prg("rss-trunc", peer)
        return [g.draw((n,)) for _ in range(count)]

    def flat_terms() -> torch.Tensor:
        return torch.cat([t.reshape(-1) for t in terms]) if len(terms) > 1 else terms[0].reshape(-1)

    k = 4 if helper_terms else 3
    if rank in (a_, h_):
        r_a, *rest = stream(h_ if rank == a_ else a_, k)
        t_a = rest.pop(0) if helper_terms else None
        y_ah, k_a = rest
    if rank in (b_, h_):
        r_b, *rest = stream(h_ if rank == b_ else b_, k)
        t_b = rest.pop(0) if helper_terms else None
        y_bh, p_b = rest
    from_h = 2 * n if helper_terms else n

    if rank == h_:
        r = r_a + r_b
        d_a = per_job(lambda t, b: -logical_shift(t, b), r) - p_b
        k_b = per_job(lambda t, b: logical_shift(t, 63) << (64 - b), r) - k_a
        if helper_terms:
            z = flat_terms()
            to_a, to_b = torch.cat([z - t_b, d_a]), torch.cat([z - t_a, k_b])
        else:
            to_a, to_b = d_a, k_b
        yield ({a_: to_a, b_: to_b}, {})
        yield ({}, {})
        return _unflatten(Replicated(y_bh, y_ah, rank), [(k,) for k in sizes])

    other = b_ if rank == a_ else a_
    z = flat_terms()
    if rank == a_:
        e = z + r_a
        e += 1 << BIAS_BITS
        if helper_terms:
            e += t_a
    else:
        e = z + r_b
        if helper_terms:
            e += t_b
    got = yield ({other: e}, {other: n, h_: from_h})
    word = got[h_][n:] if helper_terms else got[h_]          # d_A on A, k_B on B
    c = e + got[other]
    if helper_terms:
        c += got[h_][:n]                                        # f cancels the sender's t
        c -= t_a if rank == a_ else t_b
    keep = c >> 63
    keep.bitwise_not_()                                         # all ones where msb(c) = 0
    if rank == a_:
        share = per_job(lambda t, b: logical_shift(t, b) - (1 << (BIAS_BITS - b)), c)
        share += word
        share += k_a & keep
        mine = share - y_ah
    else:
        share = p_b + (word & keep)
        mine = share - y_bh
    got = yield ({other: mine}, {other: n})
    y_ab = mine + got[other]
    comps = Replicated(y_ah, y_ab, rank) if rank == a_ else Replicated(y_ab, y_bh, rank)
    return _unflatten(comps, [(k,) for k in sizes])


def _reshare_terms_gen(zs: Sequence[torch.Tensor]):
    """Untruncated values of 3-of-3 additive terms zs, in one round (a reshare: 8 B per
    element)."""
    s = current()
    nxt, prev = _peers(s.rank)
    z = torch.cat([t.reshape(-1) for t in zs]) if len(zs) > 1 else zs[0].reshape(-1)
    z = z + zero_share(z.shape)
    got = (yield ({prev: z}, {nxt: z.numel()}))[nxt]
    return _unflatten(Replicated(z, got, s.rank), [t.shape for t in zs])


def _helper_products_gen(zs: Sequence[torch.Tensor], bits: Sequence[int]):
    """products_trunc_gen without stocked pairs: the truncated jobs by the helper truncation
    (two rounds), the jobs with bits 0 reshared in its first round."""
    from .rss_binary import _par
    cut = [i for i, b in enumerate(bits) if b]
    plain = [i for i, b in enumerate(bits) if not b]
    gens = [_helper_trunc_gen([zs[i] for i in cut], [zs[i].numel() for i in cut], [bits[i] for i in cut], True)]
    if plain:
        gens.append(_reshare_terms_gen([zs[i] for i in plain]))
    got = yield from _par(gens)
    out: list = [None] * len(zs)
    for i, y in zip(cut, got[0]):
        out[i] = y.view(zs[i].shape)
    if plain:
        for i, y in zip(plain, got[1]):
            out[i] = y
    return out


def open_additive(u: torch.Tensor) -> torch.Tensor:
    """Sum of a 3-of-3 additive sharing, revealed to every party (each sends u_i to both
    others: one round, 16 B per element per party)."""
    s = current()
    nxt, prev = _peers(s.rank)
    u = with_tag(u, shape_tag([u.shape]))
    got = s.comm.exchange({nxt: u, prev: u}, [nxt, prev])
    for peer in (nxt, prev):
        _check(u, got[peer], peer, "opening")
    out = u + got[nxt]
    out += got[prev]
    return out


def mul_trunc(op: str, x: Replicated, y: Replicated, params: Sequence[int], bits: int) -> Replicated:
    """op(x, y) / 2^bits in ONE round (truncation fused into the reshare): 16 B per output
    element per party; integer products (bits == 0) cost 8 B (plain reshare)."""
    if bits == 0:
        return mul(op, x, y, params)
    z = _cross(op, x, y, params)
    return _trunc_additive(z, bits)


def square_trunc(x: Replicated, bits: int) -> Replicated:
    """x * x / 2^bits in one round (see mul_trunc)."""
    if bits == 0:
        return square(x)
    x = _as_rep(x)
    return _trunc_additive(x.a * (x.a + 2 * x.b), bits)


def _trunc_additive(z: torch.Tensor, bits: int) -> Replicated:
    """Replicated shares of (sum_i z_i) / 2^bits from a 3-of-3 additive sharing z (one round)."""
    shape = z.shape
    if not _stocked([(z.numel(), bits)]):
        return _run_gen(products_trunc_gen([("terms", z)], bits))[0]
    pair = _trunc_pairs(z.numel(), bits)
    u = z.reshape(-1) + pair[1]                     # r_i + alpha_i (+ 2^62): see _prepare
    c = open_additive(u)
    return _finish_trunc(c, pair, bits).view(shape)
