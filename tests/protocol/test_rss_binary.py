"""Binary protocols and conversions of the 3-party replicated mode (crypten_lite.mpc.rss_binary)
against plaintext torch, over gRPC between 3 real party processes, no dealer; exact rounds and
bytes per party; privacy of what each party receives during the MSB.

Byte counts: N = 3 * 64 * SPLIT_WORDS elements = three word-aligned chunks of SPLIT_WORDS
words (the smallest call that runs as three chunks), so every party plays every role of the
MSB / bit injection once and all parties send the same number of bytes. Per word of 64
elements of a chunk (words of 8 bytes):
  carry circuit (64-bit, MSB): role 1 sends 3*32 + 1 (h ^ rho, b_63) + 61 (triple corrections)
    = 158 words; roles 0 and 2 send 16*3 + 8*3 + 4*3 + 2*3 + 1*2 = 92 words of openings;
  to replicated (msb_words): roles 0 and 2 one word each;
  random bit: role 0 64 words ([s]); [s t]: roles 1 and 2 64 words each;
  opening c = b ^ r: roles 0 and 2 send one word to each of the two others;
  fused product [r][v]: 64 words per role; 2-round product: [t v] 64 words from roles 1, 2,
    [s (v - 2 t v)] 64 words from every role.
"""

from __future__ import annotations

import pytest
import torch

from crypten_lite.mpc.launcher import PartyPool

from _costs import cost  # tests/protocol/_costs.py

from crypten_lite.mpc.rss_binary import SPLIT_WORDS

N = 3 * 64 * SPLIT_WORDS
WORD = 8
EDGES = [0, -1, 1, (1 << 63) - 1, -(1 << 63), -2, 2, 1 << 62, -(1 << 62)]


@pytest.fixture
def rss_pool(pool3_rss) -> PartyPool:
    """The session's 3-party rss pool (tests/conftest.py): no dealer process."""
    return pool3_rss


def _values(seed: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)  # test data only, never shares
    x = torch.randint(-(1 << 63), (1 << 63) - 1, (n,), generator=g, dtype=torch.int64)
    x[:len(EDGES)] = torch.tensor(EDGES)
    return x


def _binary_share(v: torch.Tensor, seed: int):
    """This party's replicated XOR share of a public test vector (test data only)."""
    from crypten_lite.mpc.replicated import Replicated
    from crypten_lite.session import current
    g = torch.Generator().manual_seed(seed)
    c0, c1 = (torch.randint(-(1 << 63), (1 << 63) - 1, v.shape, generator=g, dtype=torch.int64)
              for _ in range(2))
    comps = [c0, c1, v ^ c0 ^ c1]
    rank = current().rank
    return Replicated(comps[rank], comps[(rank + 1) % 3], rank)


def _arith_share(v: torch.Tensor):
    from crypten_lite.mpc import rss
    from crypten_lite.session import current
    return rss.share(v if current().rank == 0 else None, 0, tuple(v.shape))


# ------------------------------------------------------------------ party functions
def _and_and_msb():
    from crypten_lite.mpc import circuits, rss
    from crypten_lite.mpc import rss_binary as rb
    x, y = _values(1, N), _values(2, N)
    (z,), r_and, b_and = cost(lambda: rb.and_many([(_binary_share(x, 3), _binary_share(y, 4))]))
    ok_and = torch.equal(rss.open_xor(z), x & y)
    xs = _arith_share(x)
    w, r_msb, b_msb = cost(lambda: rb.msb_words(xs))
    ok_msb = torch.equal(circuits.unpack_bits(rss.open_xor(w), N), (x < 0).long())
    # lt as the function layer gets it: msb and B2A fused
    (bit, _), r_lt, b_lt = cost(lambda: rb.msb_finish(xs, True))
    ok_lt = torch.equal(rss.open_(bit), (x < 0).long())
    # ReLU: relu(v) = v * [v > 0] = v * msb(-v); with and without the mask bit
    v = _values(5, N) >> 20
    vs = _arith_share(v)
    (_, (p,)), r_relu, b_relu = cost(lambda: rb.msb_finish(-vs, False, [((N,), vs)]))
    ok_relu = torch.equal(rss.open_(p), v.clamp(min=0))
    (mask, (p2,)), r_relu2, b_relu2 = cost(lambda: rb.msb_finish(-vs, True, [((N,), vs)]))
    ok_relu2 = torch.equal(rss.open_(p2), v.clamp(min=0)) and torch.equal(rss.open_(mask), (v > 0).long())
    return {"and": (ok_and, r_and, b_and), "msb": (ok_msb, r_msb, b_msb), "lt": (ok_lt, r_lt, b_lt),
            "relu": (ok_relu, r_relu, b_relu), "relu_mask": (ok_relu2, r_relu2, b_relu2)}


def _conversions():
    from crypten_lite.mpc import circuits, rss
    from crypten_lite.mpc import rss_binary as rb
    x, y = _values(6, N), _values(7, N)
    bits = (x & 1)
    words = _binary_share(circuits.pack_bits(bits), 8)
    ys = _arith_share(y)
    other = _binary_share(circuits.pack_bits(bits), 17)   # another sharing of the same bits
    (bs, ms), r_fin, b_fin = cost(lambda: rb.finish([(words, N)], [(other, (N, 1), ys.view(N, 1))]))
    ok_b2a = torch.equal(rss.open_(bs[0]), bits)
    ok_mul = torch.equal(rss.open_(ms[0]).view(N), bits * y)
    # the same words as a B2A and a product (relu with its mask): one random bit, one opening
    (bs2, ms2), r_same, b_same = cost(lambda: rb.finish([(words, N)], [(words, (N,), ys)]))
    ok_same = torch.equal(rss.open_(bs2[0]), bits) and torch.equal(rss.open_(ms2[0]), bits * y)
    b, r_b2a, b_b2a = cost(lambda: rb.b2a(words, N))
    ok_b2a2 = torch.equal(rss.open_(b), bits)
    # a value broadcast over a trailing dim: 2 bits times (2, 3) values
    v = y[:6].view(2, 3)
    vs = _arith_share(v)
    w2 = _binary_share(circuits.pack_bits(bits[:2]), 9)
    prod = rb.bit_mul(w2, (2, 1), vs)
    ok_bcast = torch.equal(rss.open_(prod), bits[:2].view(2, 1) * v)
    xs = _arith_share(x)
    a, r_a2b, b_a2b = cost(lambda: rb.a2b(xs))
    ok_a2b = torch.equal(rss.open_xor(a), x)
    # AND of 0/1 bits and its tree over the last axis (5 -> 3 -> 2 -> 1: 3 rounds, 1 word each)
    u = (_values(14, 20) & 1).view(4, 5)
    u[0] = 1
    us = _binary_share(u, 15)
    both = rb.and_bits(us, _binary_share(u.flip(1), 16))
    red, r_red, b_red = cost(lambda: rb.and_reduce_bits(us))
    ok_red = torch.equal(rss.open_xor(both), u & u.flip(1)) and torch.equal(rss.open_xor(red), u.prod(1))
    # equality (fused: both MSBs, one bit injection) and the short MSB, |z| < 2^63
    z = _values(12, N) % 5 - 2
    z[:4] = torch.tensor([0, (1 << 63) - 1, -(1 << 63) + 1, 1 << 40])
    zs = _arith_share(z)
    e, r_eq, b_eq = cost(lambda: rb.eqz_finish(zs))
    ok_eq = torch.equal(rss.open_(e), (z == 0).long())
    small = _values(13, N) >> 49                     # 15-bit signed values
    ss = _arith_share(small)
    lows = {}
    for m in (1, 2, 16, 64):
        w, r_low, b_low = cost(lambda: rb.msb_low(ss, m))
        ok = torch.equal(circuits.unpack_bits(rss.open_xor(w), N), (small >> (m - 1)) & 1)
        lows[f"msb_low{m}"] = (ok, r_low, b_low)
    return {"finish": (ok_b2a and ok_mul, r_fin, b_fin), "b2a": (ok_b2a2, r_b2a, b_b2a),
            "finish_same_words": (ok_same, r_same, b_same),
            "bit_mul_bcast": (ok_bcast, 0, 0), "a2b": (ok_a2b, r_a2b, b_a2b),
            "eq": (ok_eq, r_eq, b_eq), "and_reduce": (ok_red, r_red, b_red), **lows}


def _rounding_and_pairs():
    from crypten_lite.mpc import rss
    from crypten_lite.mpc import rss_binary as rb
    from crypten_lite.provider.correlations import logical_shift
    x = _values(10, N) >> 3          # |x| < 2^60
    x[:6] = torch.tensor([0, -1, 1 << 15, -(1 << 15), (1 << 16) + (1 << 15), -(1 << 60)])
    xs = _arith_share(x)
    out = {}
    for bits in (1, 16, 32):
        y, rounds, sent = cost(lambda: rb.round_exact(xs, bits))
        want = torch.div(x + (1 << (bits - 1)), 1 << bits, rounding_mode="floor")
        out[f"round{bits}"] = (torch.equal(rss.open_(y), want), rounds, sent)
    for bits in (1, 16, 40):
        (r, rt, m), rounds, sent = cost(lambda: rb.trunc_pairs(N, bits))
        rv, rtv, mv = rss.open_(r), rss.open_(rt), rss.open_(m)
        ok = torch.equal(rtv, logical_shift(rv, bits)) and torch.equal(mv, logical_shift(rv, 63))
        # r is not constant across elements and its top bit varies (a weak sanity check:
        # uniformity of what parties receive is tested below)
        ok = ok and rv.unique().numel() == N and 0 < int(mv.sum()) < N
        out[f"pairs{bits}"] = (ok, rounds, sent)
    return out


def _received_during(fn):
    """The int64 words this party receives while fn() runs (flattened, in order)."""
    from crypten_lite.session import current
    comm = current().comm
    seen = []
    original = comm.exchange

    def spy(outgoing, sources, rounds=1):
        got = original(outgoing, sources, rounds)
        for src in sorted(got):
            seen.append(got[src].reshape(-1).clone())
        return got

    comm.exchange = spy
    try:
        fn()
    finally:
        comm.exchange = original
    return torch.cat(seen) if seen else torch.zeros(0, dtype=torch.int64)


def _privacy_views(n: int):
    from crypten_lite.mpc import rss_binary as rb
    views = {}
    for name, value in (("zeros", torch.zeros(n, dtype=torch.int64)),
                        ("mixed", _values(11, n))):
        xs = _arith_share(value)
        small = _arith_share(value >> 3)

        def run():
            words = rb.msb_words(xs)
            rb.msb_finish(xs, True, [((n,), xs)])
            rb.finish([(words, n)], [(words, (n, 1), xs.view(n, 1))])   # the 2-round B2A
            rb.round_exact(small, 16)
            rb.eqz_finish(xs)
        views[name] = _received_during(run)
        views[name + "_again"] = _received_during(run)
    return views


def _refusals():
    from crypten_lite.errors import ProtocolError
    from crypten_lite.mpc import rss_binary as rb
    caught = []
    for fn in (lambda: rb.msb_words(torch.zeros(3, dtype=torch.int64)),
               lambda: rb.round_exact(_arith_share(torch.zeros(3, dtype=torch.int64)), 0),
               lambda: rb.and_many([(torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64))]),
               lambda: rb.b2a(_binary_share(torch.zeros(1, dtype=torch.int64), 18), 100)):
        try:
            fn()
            caught.append("no error")
        except ProtocolError as e:
            caught.append(str(e))
    return caught


# ------------------------------------------------------------------------- tests
def _words_per_party(**roles) -> int:
    """Bytes one party sends for N = 3 chunks: the sum over the three roles of the words sent
    per word of 64 elements, times the chunk's SPLIT_WORDS words."""
    return WORD * SPLIT_WORDS * sum(roles.values())


def test_and_msb_lt_relu(rss_pool):
    results = rss_pool.run(_and_and_msb)
    # per chunk of 64 elements: role 1 sends the 3 level-1 planes (96 words), b_63 (1) and
    # the corrections of the levels 32 -> 16 -> 8 -> 4 (2 ANDs each: 32 + 16 + 8 words) and of
    # the last, 4 -> 1 in one round (15 mask products of 1 word); roles 0 and 2 open 3 words
    # per 2 ANDs (48 + 24 + 12) and the last level's 6 inputs
    carry = dict(r0=90, r1=168, r2=90)
    expected = {
        "and": (1, WORD * N),
        "msb": (6, _words_per_party(r0=90 + 1, r1=168, r2=90 + 1)),
        "lt": (6, _words_per_party(r0=carry["r0"] + 64 + 2, r1=carry["r1"] + 64, r2=carry["r2"] + 64 + 2)),
        "relu": (6, _words_per_party(r0=carry["r0"] + 64 + 2 + 64, r1=carry["r1"] + 64 + 64,
                                     r2=carry["r2"] + 64 + 2 + 64)),
    }
    expected["relu_mask"] = expected["relu"]
    for rank, res in enumerate(results):
        for op, (ok, rounds, sent) in res.items():
            assert ok, f"party {rank}: {op} differs from torch"
            assert (rounds, sent) == expected[op], (rank, op, rounds, sent)
    # the figures: lt <= 7 rounds and <= 24 B per element, ReLU <= 7 rounds and <= 32 B
    assert expected["lt"][1] / N <= 24 and expected["relu"][1] / N <= 32
    assert expected["lt"][1] / N == pytest.approx(22.67, abs=0.01)
    assert expected["relu"][1] / N == pytest.approx(30.67, abs=0.01)


def test_b2a_bit_mul_a2b(rss_pool):
    results = rss_pool.run(_conversions)
    b2a = dict(r0=64 + 2, r1=64, r2=64 + 2)
    mul = dict(r0=64 + 2 + 64, r1=64 + 64, r2=64 + 64 + 2)
    expected = {
        "finish": (2, WORD * SPLIT_WORDS * (sum(b2a.values()) + sum(mul.values()))),
        "b2a": (2, WORD * SPLIT_WORDS * sum(b2a.values())),
        # [r] and [r v] of one random bit: the B2A's words plus [t v] and the product
        "finish_same_words": (2, WORD * SPLIT_WORDS * (sum(b2a.values()) + 64 + 64 + 3 * 64)),
        "bit_mul_bcast": (0, 0),
        "and_reduce": (3, 3 * WORD),
        # both MSB carry circuits (2 * 90 + 2 * 168 words per chunk) + one bit injection
        "eq": (6, _words_per_party(r0=180 + 64 + 2, r1=336 + 64, r2=180 + 64 + 2)),
        # m = 1, 2: one group-2 level (role 1: 3 + 1 words; for m = 1 its three planes are of
        # 2-bit lanes, 32 to a word: 1.5 words), conversion (roles 0, 2: 1 word);
        # m = 16: 15 bits in 16-bit lanes, levels 8 -> 4 -> 1 (role 1: 3*8 + 1 + 8 + 15,
        # roles 0/2: 12 + 6 + 1); m = 64: as msb_words
        "msb_low1": (2, _words_per_party(r0=1, r1=2.5, r2=1)),
        "msb_low2": (2, _words_per_party(r0=1, r1=4, r2=1)),
        "msb_low16": (4, _words_per_party(r0=19, r1=48, r2=19)),
        "msb_low64": (6, _words_per_party(r0=91, r1=168, r2=91)),
    }
    for rank, res in enumerate(results):
        for op, (ok, rounds, sent) in res.items():
            assert ok, f"party {rank}: {op} differs from torch"
            if op == "a2b":   # no chunks: party 1 also shares b = x_1 + x_2 (N words)
                assert (rounds, sent) == (8, WORD * N * (13 + (rank == 1))), (rank, rounds, sent)
            else:
                assert (rounds, sent) == expected[op], (rank, op, rounds, sent)


def test_round_exact_and_truncation_pairs(rss_pool):
    results = rss_pool.run(_rounding_and_pairs)
    # rounds: carry circuit (1 + log2(W / 2) - 1 levels, W = next_pow2(bits): the last level
    # combines four groups; at least 2 for the random bits) then the opening; pairs: the
    # 64-bit carry (5) then the opening.
    rounds = {"round1": 3, "round16": 4, "round32": 5, "pairs1": 6, "pairs16": 6, "pairs40": 6}
    sent = [res and {op: v[2] for op, v in res.items()} for res in results]
    for rank, res in enumerate(results):
        for op, (ok, r, _) in res.items():
            assert ok, f"party {rank}: {op} differs from torch"
            assert r == rounds[op], (rank, op, r)
    # every party plays every role once: the same bytes on all three
    assert sent[0] == sent[1] == sent[2], sent
    # round_exact(16), per chunk: carry on 16-bit lanes (16 words; role 1: h 3*8 + b_63 1 +
    # corrections 2*4 + 15; roles 0 and 2: openings 4*3 + 6), 2 bits per element
    # injected (role 0: [s] 128 words; roles 1 and 2: [s t] 128; roles 0 and 2: opening 2 words
    # to each other party), b >> 16 shared by role 1 (64 words)
    per_chunk = (24 + 1 + 23 + 128 + 64) + (18 + 128 + 4) + (18 + 128 + 4)
    assert sent[0]["round16"] == WORD * SPLIT_WORDS * per_chunk, sent[0]["round16"]


def test_msb_views_uniform_and_independent_of_input(rss_pool):
    """What each party receives while computing msb_words, the fused lt/bit * value, B2A and
    bit * value of replicated words, exact rounding and equality is
    uniformly distributed and independent of the input (two very different inputs), and
    fresh on every call (the same input twice gives independent views)."""
    n = 1920
    results = rss_pool.run(_privacy_views, n)
    for rank, views in enumerate(results):
        sizes = {k: v.numel() for k, v in views.items()}
        assert len(set(sizes.values())) == 1, sizes     # the view's shape is public
        bits = {k: ((v.unsqueeze(1) >> torch.arange(64)) & 1).double() for k, v in views.items()}
        for name, b in bits.items():
            ones = b.mean().item()
            sd = 0.5 / b.numel() ** 0.5
            assert abs(ones - 0.5) < 6 * sd, (rank, name, ones)
            # per bit position (low bits of small counters, or a sign bit, would stand out)
            per_pos = b.mean(0)
            sd_pos = 0.5 / b.shape[0] ** 0.5
            assert (per_pos - 0.5).abs().max().item() < 6 * sd_pos, (rank, name)
        # two inputs, and two calls on one input: element-wise independent (xor ~ uniform)
        for a, b in (("zeros", "mixed"), ("zeros", "zeros_again"), ("mixed", "mixed_again")):
            x = bits[a] != bits[b]
            frac = x.double().mean().item()
            assert abs(frac - 0.5) < 6 * 0.5 / x.numel() ** 0.5, (rank, a, b, frac)
        # byte histograms of the two inputs agree (chi-square, 255 degrees of freedom)
        hist = {}
        for name in ("zeros", "mixed"):
            by = views[name].view(torch.uint8).long()
            hist[name] = torch.bincount(by, minlength=256).double()
        total = hist["zeros"] + hist["mixed"]
        expect = total / 2
        chi2 = (((hist["zeros"] - expect) ** 2 + (hist["mixed"] - expect) ** 2) / expect.clamp(min=1)).sum().item()
        assert chi2 < 255 + 8 * (2 * 255) ** 0.5, (rank, chi2)


def test_refusals(rss_pool):
    for caught in rss_pool.run(_refusals):
        assert "replicated" in caught[0] and "bits must be 1..62" in caught[1] and "replicated" in caught[2], caught
        assert "needs 2 packed words, got 1" in caught[3], caught


# ------------------------------------------- B2A and bit * value with prefetched random bits
def _stocked_finish():
    """finish with random bits made offline (rss.prefetch_dabits): ONE round online, right
    against torch; the stock's bits are uniform and each one is used once."""
    from crypten_lite.mpc import circuits, offline, rss
    from crypten_lite.mpc import rss_binary as rb
    x, y = _values(21, N), _values(22, N)
    bits = x & 1
    words = _binary_share(circuits.pack_bits(bits), 23)
    other = _binary_share(circuits.pack_bits(bits), 24)
    ys = _arith_share(y)
    job = lambda: rb.finish([(words, N)], [(other, (N, 1), ys.view(N, 1)), (words, (N,), ys)])  # noqa: E731
    with offline.record() as plan:
        job()
    _, r_off, b_off = cost(lambda: offline.prefetch(plan))
    before = rss.stocked(rss.DABITS)
    (bs, ms), r_fin, b_fin = cost(job)
    ok = (torch.equal(rss.open_(bs[0]), bits) and torch.equal(rss.open_(ms[0]).view(N), bits * y)
          and torch.equal(rss.open_(ms[1]), bits * y))
    # the bits themselves: binary and arithmetic sharings of the same uniform bits
    rs_bin, rs_ar = rb.dabits(4096)
    b_open, a_open = rss.open_xor(rs_bin), rss.open_(rs_ar)
    return {"plan": [list(p) for p in plan], "offline": (r_off, b_off), "stock": (before, rss.stocked(rss.DABITS)),
            "online": (ok, r_fin, b_fin), "same_bits": torch.equal(b_open, a_open),
            "ones": int(a_open.sum()), "binary": bool(((a_open == 0) | (a_open == 1)).all())}


def test_finish_with_prefetched_random_bits_takes_one_round(rss_pool):
    for rank, r in enumerate(rss_pool.run(_stocked_finish)):
        # two jobs (the B2A shares its words with the second product): 2N bits recorded
        assert r["plan"] == [[0, 2 * N]], r["plan"]
        assert r["offline"][0] == 1 + 2                   # plan check, the random bits' 2 rounds
        assert r["stock"] == (2 * N, 0)                   # every stocked bit used, once
        ok, rounds, sent = r["online"]
        assert ok, f"party {rank}: finish with prefetched bits differs from torch"
        # one message to prev: the masked words (N / 64 per job) and [r][v] (8 B per value
        # element of each product)
        assert (rounds, sent) == (1, WORD * (2 * (N // 64) + 2 * N)), (rank, rounds, sent)
        assert r["same_bits"] and r["binary"]
        assert abs(r["ones"] - 2048) < 6 * 32             # 4096 fair bits: sd 32


# ------------------------------------------------- small calls: one chunk, rotating roles
def _small_calls():
    """msb_words on 1, 2 and 3 words of 64 elements (< SPLIT_WORDS): each call runs as ONE
    chunk, its roles rotated by its number of words."""
    from crypten_lite.mpc import circuits, rss
    from crypten_lite.mpc import rss_binary as rb
    from crypten_lite.session import current
    out = []
    for words in (1, 2, 3):
        x = _values(30 + words, 64 * words)
        xs = _arith_share(x)
        w, rounds, sent = cost(lambda: rb.msb_words(xs))
        messages = current().comm.get_communication_stats()["messages"]   # since cost's reset
        ok = torch.equal(circuits.unpack_bits(rss.open_xor(w), 64 * words), (x < 0).long())
        out.append((ok, rounds, sent, messages))
    return out


def test_small_calls_run_as_one_chunk_with_rotating_roles(rss_pool):
    results = rss_pool.run(_small_calls)
    for call, words in enumerate((1, 2, 3)):
        for rank in range(3):
            ok, rounds, _, _ = results[rank][call]
            assert ok and rounds == 6, (rank, words, rounds)
        # a call on w words: party (j + w) mod 3 plays role j; per word role 1 sends 168
        # words, roles 0 and 2 91 (msb_words' per-role figures above)
        sent = [results[rank][call][2] for rank in range(3)]
        role1 = (1 + words) % 3
        assert sent == [WORD * words * (168 if r == role1 else 91) for r in range(3)], (words, sent)
        # role 1 sends in round 1 only (to both others); roles 0 and 2 one message each in
        # rounds 2-6: 12 messages a call, where three chunks take 36
        messages = [results[rank][call][3] for rank in range(3)]
        assert messages[role1] == 2 and sorted(messages) == [2, 5, 5], (words, messages)
    # over the three sizes every party played role 1 once
    assert sorted((1 + words) % 3 for words in (1, 2, 3)) == [0, 1, 2]
