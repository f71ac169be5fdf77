"""Replicated secret sharing (protocol "rss", 3 parties, no dealer): arithmetic against torch,
exact rounds and bytes per party, fresh re-randomization of every reshare (CrypTen issue
#518), and the uniformity of what a party receives.

Ops are also run under rss by tests/protocol/test_arithmetic.py (fixture `pool_all`).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import crypten_lite
from crypten_lite import comm

N, M, K, P = 6, 3, 4, 5
CONV_OUT = 1 * 3 * 3 * 3  # conv2d of [1, 2, 5, 5] by [3, 2, 3, 3]
PREC = 16
DIV3_EXTRA = 3  # x / 3 multiplies by 1/3 encoded with ceil(log2 3) + 1 extra bits


def _inputs(seed: int, *shapes):
    g = torch.Generator().manual_seed(seed)  # test data only, never shares
    return [torch.randn(*s, generator=g) for s in shapes]


def _stats(c) -> dict:
    got = c.get_communication_stats()
    return {k: got[k] for k in ("rounds", "bytes_sent", "bytes_received", "messages")}


class _Capture:
    """Records every tensor this party receives (the messages, as the wire delivered them)."""

    def __init__(self, c):
        self.c, self.got = c, []
        self._orig = c._timed_recv

    def __enter__(self):
        def recv(src):
            t = self._orig(src)
            self.got.append(t.clone())
            return t
        self.c._timed_recv = recv
        return self

    def __exit__(self, *exc):
        self.c._timed_recv = self._orig


# ------------------------------------------------------------------ party functions
def session_facts():
    from crypten_lite.errors import UnsupportedError
    from crypten_lite.mpc.replicated import Replicated
    from crypten_lite.session import current
    s = current()
    try:
        s.provider.get("triple", [(2,), (2,)], "mul")
        refused = ""
    except UnsupportedError as e:
        refused = str(e)
    x = crypten_lite.cryptensor(torch.ones(3), src=2)
    return {"protocol": s.config.protocol, "dealer": s.config.dealer, "refused": refused,
            "share_type": type(x.share).__name__, "is_replicated": isinstance(x.share, Replicated),
            "rank": s.rank}


def exact_costs():
    from crypten_lite.mpc import rss
    c = comm.get()
    x0, y0 = _inputs(1, (N,), (N,))
    a0, b0 = _inputs(2, (M, K), (K, P))
    img0, w0 = _inputs(3, (1, 2, 5, 5), (3, 2, 3, 3))
    out, err = {}, {}

    c.reset_communication_stats()
    x = crypten_lite.cryptensor(x0 if c.rank == 0 else None, src=0)
    out["share"] = _stats(c)
    y = crypten_lite.cryptensor(y0, src=1)
    a, b = crypten_lite.cryptensor(a0, src=0), crypten_lite.cryptensor(b0, src=2)
    img, w = crypten_lite.cryptensor(img0, src=1), crypten_lite.cryptensor(w0, src=0)
    xi = crypten_lite.cryptensor(torch.arange(N) - 3, src=0)
    yi = crypten_lite.cryptensor(torch.arange(N) * 7, src=1)

    # Offline: every truncation pair the online phase below uses, made in one batch.
    c.reset_communication_stats()
    rss.prefetch_trunc(N + M * P + CONV_OUT + N, PREC)
    rss.prefetch_trunc(N, PREC + DIV3_EXTRA)
    out["offline_pairs"] = _stats(c)

    def measure(name, fn, ref=None):
        c.reset_communication_stats()
        z = fn()
        out[name] = _stats(c)
        if ref is not None:
            err[name] = (z.get_plain_text().double() - ref.double()).abs().max().item()

    measure("mul", lambda: x * y, x0 * y0)
    measure("matmul", lambda: a @ b, a0 @ b0)
    measure("conv2d", lambda: img.conv2d(w, padding=0), F.conv2d(img0, w0))
    measure("square", lambda: x.square(), x0 * x0)
    measure("div_public", lambda: x / 3, x0 / 3)
    measure("int_mul", lambda: xi * yi)
    measure("add", lambda: x + y, x0 + y0)
    measure("add_public", lambda: x + 2.5, x0 + 2.5)
    measure("mul_public", lambda: x * 3, x0 * 3)
    measure("sum_index", lambda: x[1:4].sum(), x0[1:4].sum())
    c.reset_communication_stats()
    x.get_plain_text()
    out["reveal"] = _stats(c)
    c.reset_communication_stats()
    x.get_plain_text(dst=1)
    out["reveal_to_1"] = _stats(c)
    err["int_mul_exact"] = float(not torch.equal((xi * yi).get_plain_text(),
                                                 (torch.arange(N) - 3) * torch.arange(N) * 7))
    out["stock_left"] = rss.stocked(PREC) + rss.stocked(PREC + DIV3_EXTRA)
    return out, err


def rerandomization():
    """The same secrets multiplied twice: what this party receives must be fresh each time."""
    from crypten_lite.mpc import protocol, rss
    c = comm.get()
    x = crypten_lite.cryptensor(torch.arange(64) - 10, src=0)   # integers: the product's
    y = crypten_lite.cryptensor(torch.arange(64) * 3, src=1)    # message is the reshare alone
    xf, yf = crypten_lite.cryptensor(torch.ones(64), src=0), crypten_lite.cryptensor(torch.ones(64), src=1)
    got = {}
    for name, fn in (("int", lambda: protocol.mul("mul", x.share, y.share)),
                     ("fixed", lambda: (xf * yf).share), ("fixed_helper", lambda: (xf * yf).share)):
        runs = []
        for _ in range(2):
            if name == "fixed":
                rss.prefetch_trunc(64, PREC)
            else:
                assert rss.stocked(PREC) == 0
            with _Capture(c) as cap:
                z = fn()
            got_words = torch.cat([t.reshape(-1) for t in cap.got]) if cap.got else torch.zeros(0, dtype=torch.int64)
            runs.append((got_words, z.a.clone(), z.b.clone()))
        (m1, a1, b1), (m2, a2, b2) = runs
        got[name] = {"messages_equal": int((m1 == m2).sum()), "a_equal": int((a1 == a2).sum()),
                     "b_equal": int((b1 == b2).sum()), "numel": m1.numel()}
    return got


def received_words(kind: str, big: bool, n: int = 4096):
    """Every word this party receives during one product of two very different inputs (kind
    "int": the ring product; "fixed": with its truncation, pairs prefetched; "fixed_helper"
    and "truncate_helper": no pairs, the helper truncation of a product or of a shared value)."""
    from crypten_lite.mpc import protocol, rss
    c = comm.get()
    if kind == "int":
        v = torch.full((n,), (1 << 40) + 12345) if big else torch.zeros(n, dtype=torch.int64)
        x, y = crypten_lite.cryptensor(v, src=0), crypten_lite.cryptensor(v, src=1)
    else:
        v = torch.full((n,), 1000.5) if big else torch.zeros(n)
        x, y = crypten_lite.cryptensor(v, src=0), crypten_lite.cryptensor(v, src=1)
        if kind == "fixed":
            rss.prefetch_trunc(n, PREC)
        else:
            assert rss.stocked(PREC) == 0
    with _Capture(c) as cap:
        if kind == "int":
            protocol.mul("mul", x.share, y.share)
        elif kind == "truncate_helper":
            rss.truncate(x.share, PREC)
        else:
            x * y
    return torch.cat([t.reshape(-1) for t in cap.got]) if cap.got else torch.zeros(0, dtype=torch.int64)


def helper_costs():
    """Without stocked pairs a truncation runs the helper protocol: exact rounds and bytes of
    a fixed-point product, a square, a matmul and a truncation of a shared value, and their
    values against torch."""
    from crypten_lite.mpc import rss
    c = comm.get()
    x0, y0 = _inputs(5, (N,), (N,))
    a0, b0 = _inputs(6, (M, K), (K, P))
    x, y = crypten_lite.cryptensor(x0 * 40, src=0), crypten_lite.cryptensor(y0 * 40, src=1)
    a, b = crypten_lite.cryptensor(a0, src=0), crypten_lite.cryptensor(b0, src=2)
    assert rss.stocked(PREC) == 0
    out, err = {}, {}
    for name, fn, ref in (("mul", lambda: x * y, x0 * y0 * 1600), ("square", lambda: x.square(), x0 * x0 * 1600),
                          ("matmul", lambda: a @ b, a0 @ b0),
                          ("truncate", lambda: rss.truncate(x.share, 1), x0 * 20)):   # x / 2
        c.reset_communication_stats()
        z = fn()
        out[name] = _stats(c)
        got = z.get_plain_text() if name != "truncate" else rss.open_(z).double() / 2 ** PREC
        err[name] = (got.double() - ref.double()).abs().max().item()
    with rss.record() as plan:
        x * y
    out["plan"] = [list(p) for p in plan]
    return out, err


def helper_exact_ints():
    """The helper truncation of integers across the whole supported range (|x| < 2^62) by
    1, 16, 40 and 61 bits: floor(x / 2^bits) or one more, never anything else."""
    from crypten_lite.mpc import rss
    g = torch.Generator().manual_seed(9)  # test data only, never shares
    lim = (1 << 62) - 1
    v = torch.randint(-lim, lim, (4000,), generator=g, dtype=torch.int64)
    v = torch.cat([v, torch.tensor([lim, -lim, 0, 1, -1, 1 << 61, -(1 << 61)])])
    v = torch.cat([v, v >> 40])                               # small values too
    x = crypten_lite.cryptensor(v, src=0)
    out = {}
    for bits in (1, 16, 40, 61):
        got = rss.open_(rss.truncate(x.share, bits))
        d = got - (v >> bits)                                 # >> on int64: floor division
        out[bits] = sorted(set(d.tolist()))
    return out


def offline_plan():
    """Record a fixed-point program, make its truncation pairs offline, run it online."""
    from crypten_lite.mpc import offline
    c = comm.get()
    x0, y0 = _inputs(7, (N,), (N,))
    x, y = crypten_lite.cryptensor(x0, src=0), crypten_lite.cryptensor(y0, src=1)
    with offline.record() as plan:
        x * y
    c.reset_communication_stats()
    offline.prefetch(plan)
    offline_stats = _stats(c)
    c.reset_communication_stats()
    z = x * y
    online = _stats(c)
    err = (z.get_plain_text() - x0 * y0).abs().max().item()
    return {"plan": [list(p) for p in plan], "offline": offline_stats, "online": online, "err": err}


def int8_backend_refused():
    """int8 execution runs under rss (tests/protocol/test_quantized_mpc.py); only the additive
    protocol's rounding methods are refused, up front."""
    from crypten_lite.errors import UnsupportedError
    from crypten_lite.quantized.mpc_backend import MpcBackend
    MpcBackend()
    try:
        MpcBackend(truncation="dealer")
    except UnsupportedError as e:
        return str(e)
    return ""


# ------------------------------------------------------------------ checks on the host
def _byte_hist(words: torch.Tensor) -> torch.Tensor:
    raw = torch.frombuffer(bytearray(words.numpy().tobytes()), dtype=torch.uint8)
    return torch.bincount(raw.long(), minlength=256).double()


def _chi2_uniform(h: torch.Tensor) -> float:
    expected = h.sum() / 256
    return float(((h - expected) ** 2 / expected).sum())


def _chi2_two_sample(h1: torch.Tensor, h2: torch.Tensor) -> float:
    total = h1 + h2
    keep = total > 0
    e1 = total * h1.sum() / (h1.sum() + h2.sum())
    e2 = total * h2.sum() / (h1.sum() + h2.sum())
    return float((((h1 - e1) ** 2 / e1) + ((h2 - e2) ** 2 / e2))[keep].sum())


def _bit_freqs(words: torch.Tensor) -> torch.Tensor:
    bits = (words.unsqueeze(1) >> torch.arange(64)) & 1
    return bits.double().mean(0)


# 255 degrees of freedom: mean 255, standard deviation 22.6; 420 is 7.3 sigma (a false alarm
# about once in 10^12 runs). Bit frequencies over >= 4096 words: sigma <= 0.0078; 0.06 is 7.7.
CHI2_MAX = 420.0
BIT_DEV_MAX = 0.06


# ------------------------------------------------------------------ tests
def test_rss_session_has_no_dealer(pool3_rss):
    for r in pool3_rss.run(session_facts):
        assert r["protocol"] == "rss" and r["dealer"] == ""
        assert r["is_replicated"] and r["share_type"] == "Replicated"
        assert "has no dealer" in r["refused"] and "triple/mul" in r["refused"]


def test_rss_exact_rounds_and_bytes(pool3_rss):
    results = pool3_rss.run(exact_costs)
    for rank, (out, err) in enumerate(results):
        bad = {k: v for k, v in err.items() if not v <= 2e-4}
        assert not bad, (rank, bad)
        assert out["stock_left"] == 0
        one_round = lambda b: {"rounds": 1, "bytes_sent": b, "bytes_received": b}  # noqa: E731
        # products: ONE round; fixed point with the truncation fused in: 16 B per output
        # element (each party sends its masked term to both others); integers: 8 B.
        for name, elements, per in (("mul", N, 16), ("matmul", M * P, 16), ("conv2d", CONV_OUT, 16),
                                    ("square", N, 16), ("int_mul", N, 8), ("div_public", N, 8),
                                    ("reveal", N, 8)):
            expect = one_round(per * elements)
            assert {k: out[name][k] for k in expect} == expect, (rank, name, out[name])
        for name in ("add", "add_public", "mul_public", "sum_index"):
            assert out[name] == {"rounds": 0, "bytes_sent": 0, "bytes_received": 0, "messages": 0}, name
        assert out["mul"]["messages"] == 2 and out["int_mul"]["messages"] == 1
        # reveal to party 1: party 2 (1's next) sends its second component, nobody else sends
        assert out["reveal_to_1"]["rounds"] == 1
        assert out["reveal_to_1"]["bytes_sent"] == (8 * N if rank == 2 else 0)
        assert out["reveal_to_1"]["bytes_received"] == (8 * N if rank == 1 else 0)
        # input sharing by party 0: the shape announcement (8 * (2 + ndim) bytes to each peer)
        # and one component (8 B per element) to party 1; no round (nobody answers).
        header = 8 * (2 + 1)
        share = {0: (2 * header + 8 * N, 0), 1: (0, header + 8 * N), 2: (0, header)}[rank]
        assert out["share"]["rounds"] == 0
        assert (out["share"]["bytes_sent"], out["share"]["bytes_received"]) == share


def test_rss_every_reshare_is_fresh(pool3_rss):
    """CrypTen issue #518: a reshare without a fresh zero sharing leaked. Multiplying the same
    secrets twice must give a party independent received values and shares."""
    for rank, r in enumerate(pool3_rss.run(rerandomization)):
        for kind in ("int", "fixed", "fixed_helper"):
            got = r[kind]
            # the helper (64 elements: party 64 mod 3) receives nothing; its shares are fresh
            assert got["numel"] == 0 if (kind, rank) == ("fixed_helper", 64 % 3) else got["numel"] >= 64
            # independent uniform words coincide with probability 2^-64 per position
            assert got["messages_equal"] == 0 and got["a_equal"] == 0 and got["b_equal"] == 0, (kind, got)


@pytest.mark.parametrize("kind", ["int", "fixed", "fixed_helper", "truncate_helper"])
def test_rss_received_values_are_uniform_and_input_independent(pool3_rss, kind):
    small = pool3_rss.run(received_words, kind, False)
    big = pool3_rss.run(received_words, kind, True)
    for rank in range(3):
        if kind.endswith("_helper") and rank == 4096 % 3:
            # the helper deals the truncation's values and receives nothing at all
            assert small[rank].numel() == 0 and big[rank].numel() == 0
            continue
        h_small, h_big = _byte_hist(small[rank]), _byte_hist(big[rank])
        assert _chi2_uniform(h_small) < CHI2_MAX, (rank, kind)
        assert _chi2_uniform(h_big) < CHI2_MAX, (rank, kind)
        assert _chi2_two_sample(h_small, h_big) < CHI2_MAX, (rank, kind)
        for words in (small[rank], big[rank]):
            assert (_bit_freqs(words) - 0.5).abs().max() < BIT_DEV_MAX, (rank, kind)


def test_rss_helper_truncation_exact_costs(pool3_rss):
    """No pairs stocked: a fixed-point product is two rounds; two parties send 16 B per
    element (8 per round), the helper (the call's size mod 3) 32 B (its own term and one dealt
    value to each) and receives nothing; a truncation of a shared value sends 16 B per element
    on every party. The plan still records the pairs a prefetch would make."""
    results = pool3_rss.run(helper_costs)
    for rank, (out, err) in enumerate(results):
        assert all(e <= 2e-3 for e in err.values()), (rank, err)
        for name, n in (("mul", N), ("square", N), ("matmul", M * P), ("truncate", N)):
            helper = n % 3                      # rss.helper_of: the call's size mod 3
            sent = 32 * n if rank == helper and name != "truncate" else 16 * n
            received = 0 if rank == helper else (32 * n if name != "truncate" else 24 * n)
            messages = {0: 2, 1: 2, 2: 2}[rank]
            assert out[name] == {"rounds": 2, "bytes_sent": sent, "bytes_received": received,
                                 "messages": messages}, (rank, name, out[name])
        assert out["plan"] == [[PREC, N]]


def test_rss_helper_truncation_is_exact_over_the_whole_range(pool3_rss):
    for out in pool3_rss.run(helper_exact_ints):
        for bits, diffs in out.items():
            assert set(diffs) <= {0, 1}, (bits, diffs)


def test_rss_offline_plan_moves_pair_generation_out_of_the_online_phase(pool3_rss):
    for r in pool3_rss.run(offline_plan):
        assert r["plan"] == [[PREC, N]] and r["err"] <= 2e-4
        assert r["offline"]["rounds"] >= 1                      # the pairs' own protocol
        assert {k: r["online"][k] for k in ("rounds", "bytes_sent", "bytes_received")} == \
            {"rounds": 1, "bytes_sent": 16 * N, "bytes_received": 16 * N}


def test_rss_int8_additive_rounding_methods_refused_up_front(pool3_rss):
    """The int8 pipeline runs under rss; asking for one of the additive protocol's rounding
    methods (local, dealer) is a clear error up front, never a wrong result halfway."""
    for msg in pool3_rss.run(int8_backend_refused):
        assert "method of the additive protocol" in msg and "truncation='auto'" in msg
