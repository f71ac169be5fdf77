"""Provider 'pairwise', its silent correlated OT (crypten_lite/provider/ferret.py): the COTs
satisfy M = K ^ b*Delta across an iteration boundary (bootstrapped from the previous
iteration's reserve), the OT products and random-OT transfers built on them are exact, what
each party receives (GGM level messages, choice-bit flips) is uniform and fresh while Delta,
the choice bits and the COT values stay off the wire, a malformed silent-OT message is a
ProtocolError, and parties proposing different OT extensions are refused at the handshake."""

from __future__ import annotations

import os
import queue
import threading

import numpy as np
import pytest

pytest.importorskip("tenseal")
pytest.importorskip("nacl")

from crypten_lite.config import Config  # noqa: E402
from crypten_lite.errors import ConfigError, ProtocolError  # noqa: E402
from crypten_lite.provider import ferret, ot  # noqa: E402
from crypten_lite.provider.pairwise import PairwiseProvider  # noqa: E402
from tests.unit.test_pairwise_ot import CHI2_255, _chi2  # noqa: E402
from tests.unit.test_pairwise_security import _both, _pair  # noqa: E402


def _ots(spy=None, tamper=None):
    """Two CorrelatedOT objects (mode ferret) over queues; spy(rank, data) sees every
    message, tamper(rank, data) may replace it."""
    boxes = [queue.Queue(), queue.Queue()]

    def make(r):
        def send(data):
            if spy is not None:
                spy(r, data)
            boxes[1 - r].put(tamper(r, data) if tamper is not None else data)
        return ot.CorrelatedOT(r, send, lambda: boxes[r].get(timeout=60), os.urandom, mode="ferret")
    pair = [make(0), make(1)]
    got = _both([p.setup for p in pair])
    assert got[0][1] is None and got[1][1] is None, got
    return pair


def _take(pair, direction, m):
    got = _both([lambda r=r: pair[r]._silent_pool(direction).take(m) for r in range(2)])
    assert got[0][1] is None and got[1][1] is None, got
    receiver = got[direction][0]
    return receiver[0], receiver[1], got[1 - direction][0]


def test_silent_cots_hold_across_an_iteration_boundary():
    pair = _ots()
    for direction in (0, 1):
        delta = pair[1 - direction]._delta
        seen = []
        for m in (1000, ferret.N):          # the second take crosses into the next iteration
            bits, mine, theirs = _take(pair, direction, m)
            assert np.array_equal(mine, theirs ^ (bits[:, None] * delta[None, :]))
            assert abs(bits.mean() - 0.5) < 6 * 0.5 / m ** 0.5, bits.mean()   # 6 sigma
            seen.append(mine[:64].tobytes())
        pool = pair[direction]._silent_pool(direction)
        assert pool._iteration == 2 and pool.produced >= ferret.N + 1000
        assert seen[0] != seen[1]


def test_silent_ot_products_and_transfers_are_exact(monkeypatch):
    monkeypatch.setattr(ot, "SILENT_MIN", 8)          # small sizes through the silent path
    pair = _ots()
    n = 1237
    bits = np.frombuffer(os.urandom(8 * n), dtype=np.uint64) & np.uint64(1)
    x = np.frombuffer(os.urandom(8 * n), dtype=np.uint64)
    for chooser in (0, 1):
        for width in (64, 1):
            got = _both([lambda r=r: pair[r].product(bits if r == chooser else x, chooser, width)
                         for r in range(2)])
            s0, s1 = got[0][0], got[1][0]
            with np.errstate(over="ignore"):
                if width == 64:
                    assert np.array_equal(s0 + s1, bits * x)
                else:
                    assert np.array_equal(s0 ^ s1, bits & x & np.uint64(1))
        # random OTs with the chooser's own bits, then packed transfers
        m = 1024
        c = (np.frombuffer(os.urandom(m), dtype=np.uint8) & 1).copy()
        keys = _both([lambda r=r: pair[r].random_ot(c if r == chooser else None, m, chooser)
                      for r in range(2)])
        keys = [k[0] for k in keys]
        _both([lambda r=r: pair[r].prepare(keys[r], 3) for r in range(2)])
        vals = np.frombuffer(os.urandom(3 * m // 8), dtype=np.uint8).reshape(3, m // 8)
        got = _both([lambda r=r: pair[r].transfer_packed(keys[r], None if r == chooser else vals, 3)
                     for r in range(2)])
        want = vals & np.packbits(c, bitorder="little")[None, :]
        assert np.array_equal(got[0][0] ^ got[1][0], want)
    assert pair[0]._silent[0] is not None and pair[0]._silent[1] is not None


def test_silent_ot_wire_is_uniform_and_carries_no_secret(monkeypatch):
    """Every choice bit 1 (fixed): the receiver's flips and the sender's level messages are
    uniform bytes and fresh; Delta, the choice bits and no COT value appear on the wire."""
    monkeypatch.setattr(ot, "SILENT_MIN", 8)
    wire = {0: [], 1: []}
    pair = _ots(spy=lambda r, d: wire[r].append(bytes(d)))
    for r in (0, 1):
        wire[r].clear()
    m = 1 << 16
    ones = np.ones(m, dtype=np.uint8)
    flips = []
    for _ in range(2):
        got = _both([lambda: pair[0].random_ot(None, m, 1), lambda: pair[1].random_ot(ones, m, 1)])
        assert got[0][1] is None and got[1][1] is None, got
        flips.append(wire[1][-1])
    assert flips[0] != flips[1] and len(flips[0]) == m // 8
    assert _chi2(b"".join(flips)) < CHI2_255
    levels = [d for d in wire[0]]                   # the sender's GGM level messages
    assert levels and _chi2(b"".join(levels)) < CHI2_255
    pool_s, pool_r = pair[0]._silent[1], pair[1]._silent[1]
    everything = b"".join(wire[0] + wire[1])
    assert pair[0]._delta.tobytes() not in everything
    assert np.packbits(pool_r._base[0][:4096]).tobytes() not in everything   # LPN secret u
    for table in (pool_s._base[1], pool_r._base[1]):
        for row in table[:: len(table) // 16]:
            assert row.tobytes() not in everything
    # the sender's next leaves (pending, or in the step being made ahead): never sent
    leaves = pool_s._pending[1] if pool_s._pending is not None else pool_s._ahead[1]["trees"]
    assert leaves[0, 5].tobytes() not in everything


def test_malformed_silent_ot_messages_are_refused(monkeypatch):
    monkeypatch.setattr(ot, "SILENT_MIN", 8)

    def cut(r, data):                                # the sender's level messages, truncated
        return data[:-16] if r == 0 and len(data) % (ferret.DEPTH * 32 + 16) == 0 else data
    pair = _ots(tamper=cut)
    got = _both([lambda r=r: pair[r]._silent_pool(1).take(100) for r in range(2)])
    assert isinstance(got[1][1], ProtocolError) and "level messages" in str(got[1][1]), got[1]
    pair = _ots()
    m = 4096

    def short_flip():                                # the receiver's flips one byte short
        t = pair[1]._silent_pool(1).take(m)
        pair[1]._send(np.packbits(t[0][:m - 8]).tobytes())
    got = _both([lambda: pair[0]._extend_sender(m), short_flip])
    assert isinstance(got[0][1], ProtocolError) and "choice-bit flips" in str(got[0][1]), got[0]


def test_different_ot_extensions_are_refused_at_the_handshake(monkeypatch):
    class Iknp(PairwiseProvider):
        def _ot_choice(self):
            return "iknp"
    comms = _pair()
    cfg = [Config(rank=r, world_size=2, provider="pairwise", session="t") for r in range(2)]
    out = _both([lambda: PairwiseProvider(cfg[0], comms[0]), lambda: Iknp(cfg[1], comms[1])])
    for r in range(2):
        assert isinstance(out[r][1], ProtocolError) and "parameters differ" in str(out[r][1]), out[r]
    monkeypatch.setenv("CRYPTEN_LITE_PAIRWISE_OT", "silent")
    with pytest.raises(ConfigError, match="CRYPTEN_LITE_PAIRWISE_OT"):
        PairwiseProvider(cfg[0], _pair()[0])
    with pytest.raises(ConfigError, match="mode"):
        ot.CorrelatedOT(0, print, bytes, os.urandom, mode="silent")


def test_docs_quote_the_measured_ot_modes():
    """docs/protocols.md's silent-OT figures are those of docs/pairwise_ot_modes.jsonl
    (benchmarks/pairwise_ot_modes.py's output), and its parameters are the module's."""
    import json
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[2]
    lines = (root / "docs/pairwise_ot_modes.jsonl").read_text().splitlines()
    rows = {r["mode"]: r for r in map(json.loads, lines)}
    doc = " ".join((root / "docs/protocols.md").read_text().split())
    silent, iknp = rows["ferret"], rows["iknp"]
    assert silent["ots"] == iknp["ots"] and silent["workload"] == iknp["workload"] == "relu_131072"
    assert f"uses {silent['ots'] // 131072} OTs (relu 131072: {silent['ots'] / 1e6:.1f} million)" in doc
    assert f"{silent['mb_both_ways']:.2f} MB instead of {iknp['mb_both_ways']:.2f} MB" in doc
    assert f"({round(iknp['mb_both_ways'] / silent['mb_both_ways'])}x fewer)" in doc
    cpu = " and ".join(f"{c:.2f}" for c in silent["cpu_seconds"])
    assert f"CPU seconds per party {cpu} against IKNP's " + " and ".join(
        f"{c:.2f}" for c in iknp["cpu_seconds"]) in doc
    assert (f"t = {ferret.TREES} trees of depth h = {ferret.DEPTH} (n = {ferret.N:,} outputs per "
            f"iteration), k = 2^{ferret.LOG_K}") in doc
    assert f"({ferret.BASE:,} OTs per direction" in doc


@pytest.mark.parametrize("mode", ["ferret", "iknp"])
def test_free_choice_random_ots_send_no_flips_and_hold(monkeypatch, mode):
    """random_ot(free=True): the chooser's bits are the extension's own (silent: its COTs'
    random bits, bit 0 of its values; IKNP: its PRG's), uniform, fresh, never on the wire;
    the chooser's key is the other's key of its bit, and a silent extension sends no
    derandomizing message (the IKNP one its matrix only)."""
    monkeypatch.setattr(ot, "SILENT_MIN", 8)
    wire = {0: [], 1: []}
    boxes = [queue.Queue(), queue.Queue()]

    def make(r):
        def send(data):
            wire[r].append(bytes(data))
            boxes[1 - r].put(data)
        return ot.CorrelatedOT(r, send, lambda: boxes[r].get(timeout=60), os.urandom, mode=mode)
    pair = [make(0), make(1)]
    assert all(g[1] is None for g in _both([p.setup for p in pair]))
    if mode == "ferret":
        assert pair[0]._delta[0] & 1 and pair[1]._delta[0] & 1      # bit 0 carries the choice
    m = 1 << 14
    seen = []
    for chooser in (0, 1):
        _both([lambda r=r: pair[r]._silent_pool(chooser).take(8) for r in range(2)]
              if mode == "ferret" else [lambda: None, lambda: None])   # bootstrap off the record
        for r in (0, 1):
            wire[r].clear()
        got = _both([lambda r=r: pair[r].random_ot(None, m, chooser, free=True) for r in range(2)])
        assert got[0][1] is None and got[1][1] is None, got
        mine, theirs = got[chooser][0], got[1 - chooser][0]
        c = mine.choice
        assert c.shape == (m,) and set(np.unique(c)) <= {0, 1}
        assert abs(c.mean() - 0.5) < 6 * 0.5 / m ** 0.5, c.mean()
        want = np.where(c[:, None].astype(bool), theirs.keys[1], theirs.keys[0])
        assert np.array_equal(mine.keys[0], want)
        assert not np.array_equal(theirs.keys[0], theirs.keys[1])
        chooser_sent = b"".join(wire[chooser])
        if mode == "ferret":
            assert chooser_sent == b"", len(chooser_sent)          # no flips, no matrix
        else:
            assert len(chooser_sent) == ot.KAPPA * m // 8          # IKNP's U only
        assert np.packbits(c, bitorder="little").tobytes()[:64] not in b"".join(wire[0] + wire[1])
        seen.append(np.packbits(c).tobytes())
    assert seen[0] != seen[1]


def test_both_choosers_interleaved_hold_per_set(monkeypatch):
    """random_ots_both: chunks of the two directions alternate (several chunks each, one
    direction longer), and every set of either chooser is a random OT of the chooser's bits."""
    monkeypatch.setattr(ot, "SILENT_MIN", 8)
    pair = _ots()
    for p in pair:
        p.chunk = 1 << 13                                    # several chunks per direction
    sizes = ([3000, 5000], [20000, 1000, 64])
    got = _both([lambda r=r: pair[r].random_ots_both(sizes) for r in range(2)])
    assert got[0][1] is None and got[1][1] is None, got
    for chooser in (0, 1):
        mine, theirs = got[chooser][0][chooser], got[1 - chooser][0][chooser]
        assert [k.m for k in mine] == [k.m for k in theirs] == sizes[chooser]
        for a, b in zip(mine, theirs):
            want = np.where(a.choice[:, None].astype(bool), b.keys[1], b.keys[0])
            assert np.array_equal(a.keys[0], want)
    assert pair[0].random_ots_both(([], [])) == ([], [])


def test_hash_in_blocks_matches_one_pass():
    """ot._Hash works in blocks of BLOCK rows on reused scratch: the same as hashing each row
    alone (tweak first + row), with `out` and with `xor` (blocks ^ xor, input untouched)."""
    h = ot._Hash()
    m = 2 * ot._Hash.BLOCK + 77
    blocks = np.frombuffer(os.urandom(16 * m), dtype=np.uint8).reshape(m, 16).copy()
    delta = np.frombuffer(os.urandom(16), dtype=np.uint8)
    whole = h(blocks, 5, 9)
    rows = [0, 1, ot._Hash.BLOCK - 1, ot._Hash.BLOCK, m - 1]
    for i in rows:
        assert np.array_equal(ot._Hash()(blocks[i:i + 1], 5 + i, 9)[0], whole[i])
    out = np.empty((m, 2), dtype=np.uint64)
    kept = blocks.copy()
    assert h(blocks, 5, 9, out=out, xor=delta) is out
    assert np.array_equal(blocks, kept)
    assert np.array_equal(out, h(blocks ^ delta, 5, 9))
    assert not np.array_equal(out, whole)


def _seeded_ots(ahead: bool, wire: list):
    """Two CorrelatedOT objects (mode ferret) whose PRGs are seeded (the same Delta, choice
    bits and trees on every call), their pools making steps ahead or not; wire gets every
    message as (rank, bytes)."""
    boxes = [queue.Queue(), queue.Queue()]

    def make(r):
        rng = np.random.default_rng(1234 + r)

        def send(data):
            wire.append((r, bytes(data)))
            boxes[1 - r].put(data)
        o = ot.CorrelatedOT(r, send, lambda: boxes[r].get(timeout=60), rng.bytes, mode="ferret")
        o.silent_ahead = ahead
        return o
    pair = [make(0), make(1)]
    got = _both([p.setup for p in pair])
    assert got[0][1] is None and got[1][1] is None, got
    return pair


def test_steps_made_ahead_change_neither_messages_nor_cots():
    """A pool's next step made on a thread after each hand-out (SilentCOT.ahead), and the
    sender's trees of the step after it expanded there, give the same COTs and the same
    messages, in the same order, as made on demand; and the steps were made ahead (across an iteration boundary: the reserve set by a step made ahead)."""
    runs = []
    for ahead in (False, True):
        wire: list = []
        pair = _seeded_ots(ahead, wire)
        outs = []
        for m in (1000, 600_000, ferret.N, 5000):
            bits, mine, theirs = _take(pair, 1, m)
            assert np.array_equal(mine, theirs ^ (bits[:, None] * pair[0]._delta[None, :]))
            outs.append((bits, mine, theirs))
        made = [pair[r]._silent[1].made_ahead for r in (0, 1)]
        assert (min(made) >= 2) if ahead else made == [0, 0], made
        # the sender's next trees expanded on the thread too (its roots stream, step order)
        grown = [pair[r]._silent[1].grown_ahead for r in (0, 1)]
        assert grown == ([made[0], 0] if ahead else [0, 0]), (grown, made)
        assert pair[1]._silent[1]._iteration == 3
        runs.append((wire, outs))
    (wire0, outs0), (wire1, outs1) = runs
    assert [(r, len(d)) for r, d in wire0] == [(r, len(d)) for r, d in wire1]
    assert wire0 == wire1
    for a, b in zip(outs0, outs1):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_a_step_made_ahead_that_fails_or_hangs_is_an_error_at_the_next_take(monkeypatch):
    """The thread's exception is raised by the take that needs its step; a step that does not
    finish within AHEAD_DEADLINE is a ProtocolError (no wait without a deadline); a take after
    either is refused (the peer kept that step's COTs: serving on would silently mismatch)."""
    monkeypatch.setattr(ferret, "AHEAD_DEADLINE", 0.2)
    release = threading.Event()
    for what in ("fails", "hangs"):
        pair = _ots()
        receiver = pair[1]._silent_pool(1)
        pair[0]._silent_pool(1)
        own = receiver._local

        def ahead_only(where, trees, own=own, what=what):
            if not threading.current_thread().name.startswith("ferret-ahead"):
                return own(where, trees)
            if what == "fails":
                raise ValueError("broken step")
            release.wait(30)
            return own(where, trees)
        monkeypatch.setattr(receiver, "_local", ahead_only)
        _take(pair, 1, 1000)                  # the first step on demand, the next one ahead
        assert receiver._ahead is not None
        need = receiver._have + 1
        got = _both([lambda r=r: pair[r]._silent_pool(1).take(need) for r in range(2)])
        assert got[0][1] is None, got[0]
        if what == "fails":
            assert isinstance(got[1][1], ValueError) and "broken step" in str(got[1][1]), got[1]
        else:
            assert isinstance(got[1][1], ProtocolError) and "did not finish" in str(got[1][1]), got[1]
        with pytest.raises(ProtocolError, match="out of step"):    # never COTs unlike the peer's
            receiver.take(10)
    release.set()


def test_close_joins_a_step_made_ahead_and_refuses_later_takes(monkeypatch):
    """CorrelatedOT.close (called by PairwiseProvider.close) waits for a step being made
    ahead, so no ferret-ahead thread outlives it, drops what was not handed out, and a take
    after it is a ProtocolError (no pool made anew out of step with the peer). The step is
    held on an Event, so the thread is surely running when close is called."""
    pair = _ots()
    release, started = threading.Event(), threading.Event()
    receiver = pair[1]._silent_pool(1)
    pair[0]._silent_pool(1)
    own = receiver._local

    def held(where, trees):
        if threading.current_thread().name.startswith("ferret-ahead"):
            started.set()
            assert release.wait(30)
        return own(where, trees)
    monkeypatch.setattr(receiver, "_local", held)
    _take(pair, 1, 1000)
    thread = receiver._ahead[0]
    assert started.wait(30) and thread.is_alive()
    threading.Timer(0.05, release.set).start()
    for o in pair:
        o.close()
    assert not thread.is_alive() and receiver._ahead is None and receiver._have == 0
    assert not [t for t in threading.enumerate() if t.name.startswith("ferret-ahead") and t.is_alive()]
    with pytest.raises(ProtocolError, match="closed"):
        receiver.take(10)
