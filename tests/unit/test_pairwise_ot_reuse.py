"""Provider 'pairwise', the OT correlations of small requests (issue 29's per-inference cost):
once a direction's silent pool is bootstrapped, a small request takes the pool's next COTs
(no IKNP matrix); a COT is handed out once, in the same order on both parties, across
requests, across a pool step and after a failed request; OT products of both choosers in one
step (ot.products_both) and a layer's packed transfers in one message per party
(ot.transfer_packed_many) are exact and refuse a malformed message; prefetch makes a plan's
small bit / bit_mul correlations in one exchange each; a tampered message of these new
exchanges is a ProtocolError on both parties."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

pytest.importorskip("tenseal")
pytest.importorskip("nacl")

from crypten_lite.errors import ProtocolError  # noqa: E402
from crypten_lite.provider import correlations as C  # noqa: E402
from crypten_lite.provider import ferret, ot  # noqa: E402
from tests.unit.test_pairwise_ferret import _ots  # noqa: E402
from tests.protocol.test_pairwise_provider import _check  # noqa: E402
from tests.unit.test_pairwise_security import _both, _pair, _providers  # noqa: E402


def _ok(got):
    assert got[0][1] is None and got[1][1] is None, got
    return got[0][0], got[1][0]


def _record_takes(monkeypatch):
    """Every COT the silent pools hand out, per (party, direction), in order: (bits, values)."""
    seen: dict = {}
    real = ferret.SilentCOT.take_parts

    def take_parts(self, m):
        pieces = real(self, m)
        mine = seen.setdefault((self._ot.rank, self.direction), [])
        mine.extend((None if b is None else b.copy(), v.copy()) for b, v in pieces)
        return pieces
    monkeypatch.setattr(ferret.SilentCOT, "take_parts", take_parts)
    return seen


def _joined(pieces):
    vals = np.concatenate([v for _, v in pieces])
    bits = None if pieces[0][0] is None else np.concatenate([b for b, _ in pieces])
    return bits, vals


def test_small_requests_take_the_bootstrapped_pool():
    """Below SILENT_MIN a product is IKNP until its direction's pool exists, then silent:
    the chooser sends one bit per OT (its flips), not IKNP's 16 bytes, and stays exact."""
    wire = {0: [], 1: []}
    pair = _ots(spy=lambda r, d: wire[r].append(len(d)))
    m = 1000                                                  # < ot.SILENT_MIN
    bits = np.frombuffer(os.urandom(8 * m), dtype=np.uint64) & np.uint64(1)
    x = np.frombuffer(os.urandom(8 * m), dtype=np.uint64)

    def product():
        for r in (0, 1):
            wire[r].clear()
        s0, s1 = _ok(_both([lambda r=r: pair[r].product(bits if r == 1 else x, 1, 64) for r in range(2)]))
        with np.errstate(over="ignore"):
            assert np.array_equal(s0 + s1, bits * x)
        return list(wire[1])
    assert product() == [ot.KAPPA * m // 8]                   # IKNP: the matrix U
    assert pair[0]._silent[1] is None
    _ok(_both([lambda r=r: pair[r]._silent_pool(1).take(8) for r in range(2)]))   # bootstrap
    assert product() == [m // 8]                              # silent: the flips only
    assert pair[1]._silent[0] is None                         # the other direction untouched


def test_a_cot_is_handed_out_once_across_requests_steps_and_failures(monkeypatch):
    """Requests of every OT entry point, one of them larger than what the pool holds (a new
    step; its leftover kept for the next request), and one that fails (a short flip
    message): every COT a pool hands out is new (no 128-bit value twice), the two parties
    take the same positions in the same order (M = K ^ b*Delta row by row), the failed
    request's COTs are consumed, not handed out again, and nothing produced is thrown away."""
    seen = _record_takes(monkeypatch)
    monkeypatch.setattr(ot, "SILENT_MIN", 8)
    pair = _ots()
    n = 3000
    bits = np.frombuffer(os.urandom(8 * n), dtype=np.uint64) & np.uint64(1)
    x = np.frombuffer(os.urandom(8 * n), dtype=np.uint64)
    _ok(_both([lambda r=r: pair[r].product(bits if r == 0 else x, 0, 64) for r in range(2)]))
    _ok(_both([lambda r=r: pair[r].products_both((bits if r == 0 else x, x if r == 0 else bits), 1)
               for r in range(2)]))
    _ok(_both([lambda r=r: pair[r].random_ots_both(([64, 8], [128])) for r in range(2)]))
    left = pair[1]._silent[1]._have
    big = left + 1000                                          # more than the pool holds: a step
    _ok(_both([lambda r=r: pair[r].random_ot(None, big, 1, free=True) for r in range(2)]))
    assert pair[1]._silent[1]._have > 0                        # the step's leftover is kept

    def short_flips():                                         # party 1's flips one byte short
        b, _ = pair[1]._silent_pool(1).take(64)
        pair[1]._send(np.packbits(b[:56], bitorder="little").tobytes())
    got = _both([lambda: pair[0]._extend_sender(64), short_flips])
    assert isinstance(got[0][1], ProtocolError) and "flips" in str(got[0][1]), got[0]
    _ok(_both([lambda r=r: pair[r].product(bits[:100] if r == 1 else x[:100], 1, 1) for r in range(2)]))
    for d in (0, 1):
        delta = pair[1 - d]._delta
        b, mine = _joined(seen[(d, d)])                        # the receiver's (bits, M)
        _, theirs = _joined(seen[(1 - d, d)])                  # the sender's K
        assert mine.shape == theirs.shape
        assert np.array_equal(mine, theirs ^ (b[:, None] * delta[None, :]))   # same positions
        rows = theirs.view(np.dtype((np.void, 16))).reshape(-1)
        assert np.unique(rows).size == rows.size               # never the same COT twice
        pool = pair[d]._silent[d]
        assert pool.produced == mine.shape[0] + pool._have     # all handed out or still kept
    assert seen[(1, 1)][-1][1].shape[0] == 100                 # after the failure: fresh ones


@pytest.mark.parametrize("silent", [True, False])
def test_products_of_both_choosers_at_once_are_exact(monkeypatch, silent):
    """products_both: both widths, unequal sizes per chooser, several chunks; silent: each
    party sends two messages per chunk (flips, corrections); else the two products in turn."""
    monkeypatch.setattr(ot, "SILENT_MIN", 8 if silent else 1 << 40)
    counts = {0: 0, 1: 0}
    pair = _ots(spy=lambda r, d: counts.__setitem__(r, counts[r] + 1))
    for p in pair:
        p.chunk = 1024
    sizes = (2500, 1300)
    c = [np.frombuffer(os.urandom(8 * s), dtype=np.uint64) & np.uint64(1) for s in sizes]
    v = [np.frombuffer(os.urandom(8 * s), dtype=np.uint64) for s in sizes]
    for width in (64, 1):
        for r in (0, 1):
            counts[r] = 0
        ins = [tuple(c[k] if r == k else v[k] for k in (0, 1)) for r in range(2)]
        a, b = _ok(_both([lambda r=r: pair[r].products_both(ins[r], width) for r in range(2)]))
        for k in (0, 1):
            with np.errstate(over="ignore"):
                if width == 64:
                    assert np.array_equal(a[k] + b[k], c[k] * v[k])
                else:
                    assert np.array_equal(a[k] ^ b[k], c[k] & v[k] & np.uint64(1))
        if silent and width == 1:                      # the pools exist: no level messages now
            # chunks of 1024: two with both choosers (flips and corrections from each party),
            # the third with chooser 0 only (its flips, party 1's corrections)
            assert counts[0] == counts[1] == 2 + 2 + 1


def test_a_layer_of_packed_transfers_is_one_message_each_way(monkeypatch):
    """transfer_packed_many over sets of both choosers: exact (x & c), one message sent by
    each party, pads never reused, a short message refused."""
    monkeypatch.setattr(ot, "SILENT_MIN", 8)
    sent = {0: [], 1: []}
    pair = _ots(spy=lambda r, d: sent[r].append(len(d)))
    m = 512
    keys = _ok(_both([lambda r=r: pair[r].random_ots_both(([m, m], [m])) for r in range(2)]))
    sets = [(0, 0, 2), (0, 1, 1), (1, 0, 3)]           # (chooser, set, transfers it serves)
    choice = {(ch, i): np.packbits(keys[ch][ch][i].choice, bitorder="little") for ch, i, _ in sets}
    for r in (0, 1):
        for chooser, i, g in sets:
            pair[r].prepare(keys[r][chooser][i], g)
    vals = {(ch, i): np.frombuffer(os.urandom(g * m // 8), dtype=np.uint8).reshape(g, m // 8)
            for ch, i, g in sets}

    def items(r, take):
        return [(keys[r][ch][i], None if r == ch else vals[(ch, i)][:take], take)
                for ch, i, g in sets]
    for r in (0, 1):
        sent[r].clear()
    got = _ok(_both([lambda r=r: pair[r].transfer_packed_many(items(r, 1)) for r in range(2)]))
    for j, (ch, i, _) in enumerate(sets):
        assert np.array_equal(got[0][j] ^ got[1][j], vals[(ch, i)][:1] & choice[(ch, i)][None, :])
    # one message each: party 1 masks for chooser 0's two sets, party 0 for chooser 1's set
    assert sent == {0: [m // 8], 1: [2 * m // 8]}
    # set (0, 1) served its one transfer: asking again is refused before anything is sent
    again = _both([lambda r=r: pair[r].transfer_packed_many(items(r, 1)) for r in range(2)])
    assert all(isinstance(e, ProtocolError) and "never reused" in str(e) for _, e in again)
    short = _both([lambda: pair[0]._send(b"\0" * 5),
                   lambda: pair[1].transfer_packed_many([(keys[1][1][0], None, 1)])])
    assert isinstance(short[1][1], ProtocolError) and "packed transfers" in str(short[1][1])



MONOMIALS = ("binary_monomials", "", [(6,)],
             C.monomial_params([-1, -1, 0, -1], [0b0011, 0b0111, 0b1111, 0b1101]))
BIT_MUL = ("bit_mul", "", [(5, 1), (5, 1)], ())


def _relation(kind, params, a, b):
    """The correlation's relation between the two parties' components: the provider tests' own
    check (tests/protocol/test_pairwise_provider.py)."""
    _check(kind, "", params, a, b)


def test_prefetch_makes_small_bits_and_bit_muls_in_one_exchange(monkeypatch):
    """A plan of small bit and bit_mul requests (and monomials, whose layers go one message
    per party each): the groups of both kinds in one exchange (an OT bin), every correlation
    combines to its relation, and with the pools bootstrapped the silent path carries them."""
    monkeypatch.setattr(ot, "SILENT_MIN", 8)
    plan = [("bit", "", [(4,)], ()), BIT_MUL, ("bit", "", [(6,)], ()),
            ("bit_mul", "", [(3, 1), (3, 1)], ()), MONOMIALS, ("bit_mul", "", [(2, 1), (2, 3)], ())]
    ps = _providers(_pair())

    def run(p):
        p.get(*BIT_MUL[:1], [(2, 1), (2, 1)]).corrected()          # both pools start here
        p.prefetch(plan)
        got = [[t.clone() for t in p.get(k, s, op, par).corrected()] for k, op, s, par in plan]
        return got, dict(p.by_kind)
    (g0, kinds), (g1, _) = _ok(_both([lambda p=p: run(p) for p in ps]))
    for (kind, _, _, params), a, b in zip(plan, g0, g1):
        _relation(kind, params, a, b)
    assert kinds["ot bins"][0] == 4 and "bit batch" not in kinds and "bit_mul batch" not in kinds
    assert kinds["bit_mul"][0] == 2          # the first request, and (2, 1) x (2, 3): alone
    assert all(p._ot._silent[d].produced > 0 for p in ps for d in (0, 1))


BIT = ("bit", "", [(7,)], ())
WIDE_BIT_MUL = ("bit_mul", "", [(3, 1), (3, 2)], ())


@pytest.mark.parametrize("request_, frame", [(BIT_MUL, 0), (BIT, 0), (WIDE_BIT_MUL, 0), (WIDE_BIT_MUL, 1),
                                             (MONOMIALS, 0), (MONOMIALS, 1)])
def test_a_tampered_message_of_the_merged_ot_exchanges_is_refused_by_both(monkeypatch, request_, frame):
    """Rank 0's random-OT corrections (bit, bit_mul: one message), its flips or corrections
    (a bit_mul of several values per bit: ot.products_both) or its packed transfers of a
    monomial layer (ot.transfer_packed_many), one bit flipped in transit: ProtocolError on
    both parties (no hang, no result), and the channel stays refused."""
    monkeypatch.setattr(ot, "SILENT_MIN", 8)
    comms = _pair()
    ps = _providers(comms)
    kind, op, shapes, params = request_
    _ok(_both([lambda p=p: p.get(kind, shapes, op, params).corrected() for p in ps]))   # clean
    real = comms[0]._send
    count = {"n": 0}

    def evil(tensor, dst):
        if count["n"] == frame:
            b = bytearray(tensor.numpy().tobytes())
            b[len(b) // 2] ^= 0x01
            tensor = torch.frombuffer(b, dtype=torch.uint8)
        count["n"] += 1
        real(tensor, dst)
    comms[0]._send = evil
    out = _both([lambda p=p: p.get(kind, shapes, op, params).corrected() for p in ps])
    for r in range(2):
        assert out[r][0] is None and isinstance(out[r][1], ProtocolError), (r, out[r])
    assert "integrity" in str(out[1][1])
    with pytest.raises(ProtocolError, match="unusable"):
        ps[0].get(kind, shapes, op, params)


def test_docs_quote_the_measured_small_inference_ot_figures():
    """docs/protocols.md's figures for LeNet b1's OT kinds are those of
    docs/pairwise_ot_small.jsonl (benchmarks/pairwise_ot_small.py's median lines, before and
    after)."""
    import json
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[2]
    rows = [json.loads(line) for line in (root / "docs/pairwise_ot_small.jsonl").read_text().splitlines()]
    med = {("before" if "before" in r["workload"] else "after"): r for r in rows if r["run"] == "median"}
    ots = {r["ots"] for r in rows if r["run"] != "median"}
    doc = " ".join((root / "docs/protocols.md").read_text().split())

    def pair(v):
        return " / ".join(str(x) for x in v)
    b, a = med["before"], med["after"]
    assert len(ots) == 1 and f"{ots.pop():,} OTs per inference" in doc
    assert f"{pair(b['messages_sent'])} offline messages sent by rank 0 / rank 1 per inference" in doc
    assert (f"offline messages sent per inference {pair(b['messages_sent'])} before, "
            f"{pair(a['messages_sent'])} after") in doc
    assert f"MB sent {pair(b['mb_sent_median'])} before, {pair(a['mb_sent_median'])} after" in doc
    assert (f"CPU seconds per party {pair(b['cpu_seconds'])} before, "
            f"{pair(a['cpu_seconds'])} after") in doc
    assert f"{b['seconds']} before and {a['seconds']} after" in doc
    assert f"load average {b['load_average_1min']} and {a['load_average_1min']}" in doc
    assert a["messages_sent"][0] < b["messages_sent"][0] and a["messages_sent"][1] < b["messages_sent"][1]


def test_a_peer_on_the_former_ot_exchanges_is_refused_at_the_handshake(monkeypatch):
    """The OT description both parties compare names the exchanges' message pattern: a peer
    whose description lacks it (the pattern before this one) is refused on both parties."""
    import threading

    from crypten_lite.config import Config
    from crypten_lite.provider import pairwise
    from crypten_lite.provider.pairwise import PairwiseProvider
    assert pairwise.OT_EXCHANGES in pairwise.ot_description("ferret")
    assert pairwise.OT_EXCHANGES in pairwise.ot_description("iknp")
    real, old = pairwise.ot_description, threading.local()

    def description(mode):
        got = real(mode)
        return got.replace(";" + pairwise.OT_EXCHANGES, "") if getattr(old, "on", False) else got
    monkeypatch.setattr(pairwise, "ot_description", description)
    comms = _pair()
    cfg = [Config(rank=r, world_size=2, provider="pairwise", session="t") for r in range(2)]

    def former():
        old.on = True
        return PairwiseProvider(cfg[1], comms[1])
    out = _both([lambda: PairwiseProvider(cfg[0], comms[0]), former])
    for r in range(2):
        assert isinstance(out[r][1], ProtocolError) and "parameters differ" in str(out[r][1]), out[r]


def test_prefetch_makes_monomial_groups_of_different_parameters_in_one_exchange(monkeypatch):
    """Small binary_monomials requests of three parameter sets (two requests each, so three
    groups; the sets with different layer counts): one exchange for all of them, driven in
    lockstep, every request combining to its products; then a fourth group beyond half the
    chunk budget goes in an exchange of its own."""
    monkeypatch.setattr(ot, "SILENT_MIN", 8)
    two = C.monomial_params([-1, -1], [0b11])
    owned = C.monomial_params([0, 1, -1], [0b011, 0b111, 0b101])
    kinds = [MONOMIALS[3], two, owned]
    plan = [("binary_monomials", "", [(n,)], params) for params in kinds for n in (3, 5)]
    ps = _providers(_pair())

    def run(p):
        p.get("bit_mul", [(2, 1), (2, 1)]).corrected()            # both pools start here
        p.by_kind.clear()
        p.prefetch(plan)
        got = [[t.clone() for t in p.get(k, s, op, par).corrected()] for k, op, s, par in plan]
        rows = dict(p.by_kind)
        p.by_kind.clear()
        p.set_chunk_bytes(176_000)        # requests under a quarter, groups under half, the
        # bins (at most half; _monomial_bytes, 8 elements a group): [4 masks] alone (5 sets,
        # 57,344 B), then [2 masks, 3 masks] (2 and 3 sets: 37,376 + 44,544 B)
        p.prefetch(plan)
        again = [[t.clone() for t in p.get(k, s, op, par).corrected()] for k, op, s, par in plan]
        return got, again, rows, dict(p.by_kind)
    (g0, a0, rows, small), (g1, a1, _, _) = _ok(_both([lambda p=p: run(p) for p in ps]))
    for (kind, _, _, params), a, b, c, d in zip(plan, g0, g1, a0, a1):
        _relation(kind, params, a, b)
        _relation(kind, params, c, d)
    assert rows == {"ot bins": rows["ot bins"]}
    assert rows["ot bins"][0] == len(plan)
    assert small["ot bins"][0] == 4 and small["binary_monomials batch"][0] == 2


def test_bit_and_bit_mul_on_free_random_ots(monkeypatch):
    """bit takes one random OT per element, bit_mul (one value per bit) two: each party's
    share r is its own choice bits (free choice: no flips), rank 1's two products ride on one
    OT's two key halves; each party sends one message of corrections, 8 bytes per product;
    every request combines to its relation; the corrections rank 1 receives and the shares
    are uniform (chi-square over bytes, 255 dof) and fresh (same request twice: other
    shares); the random-OT keys cannot pad twice."""
    from tests.unit.test_pairwise_security import _chi2_bytes
    from crypten_lite.provider import pairwise_ot_kinds as K
    monkeypatch.setattr(ot, "SILENT_MIN", 8)
    comms = _pair()
    ps = _providers(comms)
    n = 4096
    _ok(_both([lambda p=p: p.get("bit_mul", [(8, 1), (8, 1)]).corrected() for p in ps]))  # pools
    wire = {0: [], 1: []}
    real = {r: comms[r]._send for r in range(2)}
    for r in range(2):
        comms[r]._send = lambda t, dst, r=r: (wire[r].append(t.numpy().tobytes()), real[r](t, dst))[1]

    def run(p, kind, shapes):
        made = p._ot.made
        got = [t.clone() for t in p.get(kind, shapes).corrected()]
        return got, p._ot.made - made
    for kind, shapes, ots, per in (("bit", [(n,)], n, [8 * n, 0]),
                                   ("bit_mul", [(n, 1), (n, 1)], 2 * n, [16 * n, 8 * n])):
        outs = []
        for _ in range(2):
            for r in range(2):
                wire[r].clear()
            (a, m0), (b, m1) = _ok(_both([lambda p=p: run(p, kind, shapes) for p in ps]))
            _relation(kind, (), a, b)
            assert m0 == m1 == ots
            # one data message of corrections from each sender (header 46 + MAC 32 bytes),
            # then the acknowledgements; no silent-pool step at these sizes
            for r in range(2):
                data = [len(d) - 78 for d in wire[r] if len(d) > 80]
                assert data == ([per[r]] if per[r] else []), (kind, r, data)
            body = [d for d in wire[0] if len(d) > 80][0][46:-32]
            assert _chi2_bytes(np.frombuffer(body, dtype=np.uint8)) < 347
            assert _chi2_bytes(a[-1].numpy()) < 347 and _chi2_bytes(b[-1].numpy()) < 347
            outs.append((a, b))
        assert not torch.equal(outs[0][0][-1], outs[1][0][-1])
        assert not torch.equal(outs[0][1][0], outs[1][1][0])      # rank 1's r: fresh bits
    keys = _ok(_both([lambda p=p: p._ot.random_ots_both(([], [16])) for p in ps]))
    vals = np.arange(16, dtype=np.uint64).reshape(1, 16)
    _ok(_both([lambda r=r: K._rot_products(ps[r], [(keys[r][1][0], None if r else vals, 1)])
               for r in range(2)]))
    again = _both([lambda r=r: K._rot_products(ps[r], [(keys[r][1][0], None if r else vals, 1)])
                   for r in range(2)])
    assert all(isinstance(e, ProtocolError) and "already used" in str(e) for _, e in again)


BIN_PLAN = [("bit", "", [(5,)], ()), BIT_MUL, MONOMIALS, ("bit", "", [(3,)], ()),
            ("bit_mul", "", [(4, 1), (4, 1)], ()), ("binary_monomials", "", [(4,)], MONOMIALS[3])]


@pytest.mark.parametrize("frame", [0, 1, 2])     # rank 0 sends 3 data messages here
def test_a_tampered_message_of_an_ot_bin_is_refused_by_both(monkeypatch, frame):
    """bit, bit_mul and binary_monomials groups prefetched in one exchange (an OT bin: the
    random-OT corrections, then the monomial layers' packed transfers); rank 0's k-th data
    message of it with one bit flipped in transit: ProtocolError on both parties, nothing
    made; untampered, every request combines to its relation in that one exchange."""
    monkeypatch.setattr(ot, "SILENT_MIN", 8)
    comms = _pair()
    ps = _providers(comms)

    def run(p):
        p.by_kind.clear()
        p.prefetch(BIN_PLAN)
        return [[t.clone() for t in p.get(k, s, op, par).corrected()] for k, op, s, par in BIN_PLAN], dict(p.by_kind)
    _ok(_both([lambda p=p: p.get("bit_mul", [(2, 1), (2, 1)]).corrected() for p in ps]))   # pools
    (g0, kinds), (g1, _) = _ok(_both([lambda p=p: run(p) for p in ps]))
    for (kind, _, _, params), a, b in zip(BIN_PLAN, g0, g1):
        _relation(kind, params, a, b)
    assert kinds == {"ot bins": [len(BIN_PLAN), kinds["ot bins"][1], kinds["ot bins"][2]]}
    real = comms[0]._send
    count = {"n": 0}

    def evil(tensor, dst):
        raw = tensor.numpy().tobytes()
        if raw[5] == 2:                                  # a DATA frame (pairwise header)
            if count["n"] == frame:
                b = bytearray(raw)
                b[len(b) // 2] ^= 0x01
                tensor = torch.frombuffer(b, dtype=torch.uint8)
            count["n"] += 1
        real(tensor, dst)
    comms[0]._send = evil
    out = _both([lambda p=p: run(p) for p in ps])
    for r in range(2):
        assert out[r][0] is None and isinstance(out[r][1], ProtocolError), (r, out[r])


def test_a_monomial_request_takes_64_random_ots_per_word_and_set():
    """The random OTs of a binary_monomials request are those its (top, chooser) sets need
    (_monomial_plan, on which _monomial_bytes' estimate rests): 64 per word and set."""
    from crypten_lite.provider import pairwise_ot_kinds as K
    ps = _providers(_pair())
    for params, n in ((MONOMIALS[3], 7), (C.monomial_params([0, 0, 1, 1], [5, 9, 6, 10, 7, 13]), 5),
                      (C.monomial_params([-1] * 4, [3, 5, 9, 6, 10, 12, 7, 11, 13, 14, 15]), 3)):
        k, owners, subsets = C._split_monomial_params(params)
        sets = K._monomial_plan(tuple(owners), tuple(subsets))[1]

        def run(p):
            made = p._ot.made
            got = [t.clone() for t in p.get("binary_monomials", [(n,)], "", params).corrected()]
            return got, p._ot.made - made
        (a, m0), (b, m1) = _ok(_both([lambda p=p: run(p) for p in ps]))
        _relation("binary_monomials", params, a, b)
        assert m0 == m1 == 64 * n * len(sets)
    assert len(K._monomial_plan((0, 0, 1, 1), (5, 9, 6, 10, 7, 13))[1]) == 2
    assert len(K._monomial_plan((-1,) * 4, (3, 5, 9, 6, 10, 12, 7, 11, 13, 14, 15))[1]) == 6


def test_a_one_sided_monomial_request_is_split_between_the_choosers(monkeypatch):
    """A request whose random OTs would all have one chooser (masks owned 0, 0, 1, 1: a
    comparison's first carry level) is made half as it is, half with the masks reversed (the
    other party choosing): the same 64 OTs per word and set, both directions alike, every
    product right; a request of shared masks is not split (both choose already)."""
    from crypten_lite.provider import pairwise_ot_kinds as K
    owned = C.monomial_params([0, 0, 1, 1], [5, 9, 6, 10, 7, 13])
    assert K._one_sided(owned) and not K._one_sided(MONOMIALS[3])
    ps = _providers(_pair())
    asked = {0: [], 1: []}
    for p in ps:
        real = p._ot.random_ots_both

        def spy(sizes, pads=None, real=real, r=p.rank):
            asked[r].append(tuple(sum(s) for s in sizes))
            return real(sizes, pads)
        p._ot.random_ots_both = spy
    for params, n in ((owned, 10), (owned, 7), (MONOMIALS[3], 6)):
        for r in (0, 1):
            asked[r].clear()
        (a, b) = _ok(_both([lambda p=p: [t.clone() for t in p.get("binary_monomials", [(n,)], "", params).corrected()]
                            for p in ps]))
        _relation("binary_monomials", params, a, b)
        d0, d1 = (sum(x[c] for x in asked[0]) for c in (0, 1))
        assert asked[0] == asked[1]
        if params is owned:
            assert (d0, d1) == (2 * 64 * (n - n // 2), 2 * 64 * (n // 2)) or (d0, d1) == (2 * 64 * (n // 2), 2 * 64 * (n - n // 2))
        else:
            assert d0 > 0 and d1 > 0


def test_empty_bit_and_bit_mul_requests_in_a_bin(monkeypatch):
    """Empty bit and bit_mul requests grouped in an OT bin beside real ones: no message for
    them (the peer expects none), every request combines to its relation."""
    monkeypatch.setattr(ot, "SILENT_MIN", 8)
    plan = [("bit", "", [(0,)], ()), ("bit", "", [(0,)], ()), ("bit_mul", "", [(0, 1), (0, 1)], ()),
            ("bit_mul", "", [(0, 1), (0, 1)], ()), ("bit", "", [(3,)], ()), ("bit", "", [(2,)], ())]
    ps = _providers(_pair())

    def run(p):
        p.prefetch(plan)
        return [[t.clone() for t in p.get(k, s, op, par).corrected()] for k, op, s, par in plan]
    g0, g1 = _ok(_both([lambda p=p: run(p) for p in ps]))
    for (kind, _, _, params), a, b in zip(plan, g0, g1):
        _relation(kind, params, a, b)
