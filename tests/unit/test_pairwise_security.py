"""Provider 'pairwise', security checks on two in-process parties (threads, no gRPC):
what each party receives is uniform and fresh, no secret key or seed goes on the wire,
tampered / replayed / malformed offline messages are a ProtocolError on BOTH parties (never
a hang or a wrong result), and mismatched parameters are refused at the handshake.
Correctness over real gRPC: tests/protocol/test_pairwise_provider.py."""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import threading

import numpy as np
import pytest
import torch

pytest.importorskip("tenseal")
pytest.importorskip("nacl")

from crypten_lite.comm.inprocess import InProcessCommunicator, InProcessHub  # noqa: E402
from crypten_lite.config import Config  # noqa: E402
from crypten_lite.errors import ConfigError, ProtocolError  # noqa: E402
from crypten_lite.provider import he  # noqa: E402
from crypten_lite.provider.pairwise import DATA, PairwiseProvider  # noqa: E402
from two_party_threads import record_sends, run_both, stop_recording  # noqa: E402


def _pair(providers=(PairwiseProvider, PairwiseProvider), timeout=60.0):
    """Two communicators sharing a pair seed (as the gRPC handshake agrees one)."""
    hub = InProcessHub(2, timeout=timeout)
    seed = os.urandom(32)
    comms = [InProcessCommunicator(hub, r) for r in range(2)]
    for r, c in enumerate(comms):
        c.pair_seeds = {1 - r: seed}
    return comms


def _both(fns):
    """Run fns[r]() on two threads; each rank's (result, exception)."""
    return run_both(fns, 120, capture=True)


def _providers(comms, cls=(PairwiseProvider, PairwiseProvider)):
    cfg = [Config(rank=r, world_size=2, provider="pairwise", session="t") for r in range(2)]
    got = _both([lambda r=r: cls[r](cfg[r], comms[r]) for r in range(2)])
    assert got[0][1] is None and got[1][1] is None, got
    return [g[0] for g in got]


@pytest.fixture(scope="module")
def pair():
    comms = _pair()
    return comms, _providers(comms)


def _get(p, kind="triple", op="mul", shapes=((64,), (64,)), params=()):
    return p.get(kind, [tuple(s) for s in shapes], op, params).corrected()


def _chi2_bytes(values: np.ndarray) -> float:
    counts = np.bincount(np.frombuffer(values.tobytes(), dtype=np.uint8), minlength=256)
    expected = counts.sum() / 256
    return float(((counts - expected) ** 2 / expected).sum())


def test_received_shares_are_uniform_and_fresh():
    """The engine with FIXED operands (x0 = x1 = all ones, X = 1): what rank 0 decrypts is
    X + R, R fresh and uniform in [0, 2^(bound+40)); its share mod 2^64 is uniform bytes,
    different at every call, and R's top byte is uniform too (chi-square, 255 dof: the
    0.9999 quantile is about 347)."""
    comms = _pair()
    params = he.default_params()
    seen = {}

    def engine(r):
        from crypten_lite.random import PRG
        prg = PRG(os.urandom(32))
        eng = he.CrossEngine(r, params, lambda d: comms[r]._send(torch.frombuffer(bytearray(d), dtype=torch.uint8), 1 - r),
                             lambda: comms[r]._recv(1 - r).numpy().tobytes(),
                             lambda shape: prg.draw(tuple(shape)).numpy().view(np.uint64))
        ones = np.ones(8192, dtype=np.uint64)
        shares = [eng.elementwise([ones], 1) for _ in range(2)]
        seen[r] = shares
        return True
    out = _both([lambda: engine(0), lambda: engine(1)])
    assert out[0][1] is None and out[1][1] is None, out
    s0, s1 = seen[0], seen[1]
    for a, b in zip(s0, s1):
        with np.errstate(over="ignore"):
            assert np.all(a + b == 1)
    assert not np.array_equal(s0[0], s0[1])           # fresh: same X, different view
    assert _chi2_bytes(s0[0]) < 347 and _chi2_bytes(s0[1]) < 347
    # rank 1's -R: the word above 2^64 is not visible mod 2^64, but R mod 2^64 is uniform
    assert _chi2_bytes(s1[0]) < 347


def test_no_secret_key_or_seed_on_the_wire(pair):
    """Both parties own a key pair (each owns half of a two-block product): neither secret
    key, nor a seed or MAC key, appears in anything either party sends."""
    comms, (p0, p1) = pair
    sent = record_sends(comms)
    try:
        out = _both([lambda: _get(p0, shapes=((9000,), (9000,))),
                     lambda: _get(p1, shapes=((9000,), (9000,)))])
    finally:
        stop_recording(comms)
    assert out[0][1] is None and out[1][1] is None
    for r, p in enumerate((p0, p1)):
        wire = b"".join(sent[0] + sent[1])
        assert len(b"".join(sent[r])) > 100_000   # ciphertexts did go out both ways
        for prime in p._engine._primes:
            key = p._engine._files.dump(prime.secret_key)
            body = key[len(key) // 2: len(key) // 2 + 64]   # past SEAL's (public) header
            assert body not in wire
        assert p._seed not in wire and p._key not in wire


def _attack(mutate):
    """Rank 0's next offline frame is replaced by mutate(frame, provider); both parties must
    raise ProtocolError (no hang, no result)."""
    comms = _pair()
    p0, p1 = _providers(comms)
    _both([lambda: _get(p0), lambda: _get(p1)])          # one clean exchange first
    real = comms[0]._send
    state = {"done": False}

    def evil(tensor, dst):
        if not state["done"]:
            state["done"] = True
            tensor = torch.frombuffer(bytearray(mutate(tensor.numpy().tobytes(), p0)), dtype=torch.uint8)
        real(tensor, dst)
    comms[0]._send = evil
    out = _both([lambda: _get(p0), lambda: _get(p1)])
    for r in range(2):
        assert out[r][0] is None and isinstance(out[r][1], ProtocolError), (r, out[r])
    # the channel stays refused afterwards, with a clear message
    with pytest.raises(ProtocolError, match="unusable"):
        _get(p0)
    return [str(out[r][1]) for r in range(2)]


def test_tampered_message_is_refused_by_both():
    def flip(frame, p):
        b = bytearray(frame)
        b[len(b) // 2] ^= 0x01
        return bytes(b)
    msgs = _attack(flip)
    assert "integrity" in msgs[1]


def test_replayed_message_is_refused_by_both():
    """Rank 0's first frame of an earlier exchange, sent again (valid MAC, old sequence)."""
    recorded = {}
    comms = _pair()
    p0, p1 = _providers(comms)
    real = comms[0]._send

    def record(tensor, dst):
        recorded.setdefault("frame", tensor.numpy().tobytes())
        real(tensor, dst)
    comms[0]._send = record
    _both([lambda: _get(p0), lambda: _get(p1)])
    state = {"done": False}

    def evil(tensor, dst):
        if not state["done"]:
            state["done"] = True
            tensor = torch.frombuffer(bytearray(recorded["frame"]), dtype=torch.uint8)
        real(tensor, dst)
    comms[0]._send = evil
    out = _both([lambda: _get(p0), lambda: _get(p1)])
    for r in range(2):
        assert isinstance(out[r][1], ProtocolError), (r, out[r])
    assert "replayed" in str(out[1][1])


def test_malformed_message_is_refused_by_both():
    """A well-framed message (valid MAC and sequence number) with nonsense inside."""
    comms = _pair()
    p0, p1 = _providers(comms)
    real = comms[0]._send
    state = {"done": False}

    def evil(tensor, dst):
        if not state["done"]:
            state["done"] = True
            p0._seq_out -= 1                      # reuse the sequence number of the frame replaced
            tensor = torch.frombuffer(bytearray(p0._frame(DATA, b"\x05\x00\x00\x00garbage")), dtype=torch.uint8)
        real(tensor, dst)
    comms[0]._send = evil
    out = _both([lambda: _get(p0), lambda: _get(p1)])
    for r in range(2):
        assert isinstance(out[r][1], ProtocolError), (r, out[r])
    assert "expected" in str(out[1][1]) or "truncated" in str(out[1][1])


def test_mismatched_parameters_are_refused_at_the_handshake():
    class Other(PairwiseProvider):
        def _parameters(self):
            return dataclasses.replace(he.default_params(), stat_bits=30)
    comms = _pair()
    cfg = [Config(rank=r, world_size=2, provider="pairwise", session="t") for r in range(2)]
    out = _both([lambda: PairwiseProvider(cfg[0], comms[0]), lambda: Other(cfg[1], comms[1])])
    for r in range(2):
        assert isinstance(out[r][1], ProtocolError) and "parameters differ" in str(out[r][1]), out[r]


def test_a_peer_on_the_former_parameters_is_refused_at_the_handshake():
    """A peer still on 4 x 50 + 18 with 60-bit plaintext primes (returned at two primes), or
    one that would unfold the convolutions this version makes directly, never exchanges a
    ciphertext: both parties get a ProtocolError naming the mismatch."""
    import tenseal.sealapi as s

    class Former(PairwiseProvider):
        def _parameters(self):
            coeff = tuple(m.value() for m in s.CoeffModulus.Create(he.N, [50, 50, 50, 50, 18]))
            plain = tuple(m.value() for m in s.PlainModulus.Batching(he.N, [60] * he.MAX_PRIMES))
            return he.HEParams(he.N, coeff, plain, return_primes=2)

    class Unfolding(PairwiseProvider):
        def _parameters(self):
            params = he.default_params()
            text = params.describe().replace(";conv=direct-cheetah", "")
            return type("P", (), {"describe": lambda self: text, "n": params.n})()
    for cls in (Former, Unfolding):
        comms = _pair()
        cfg = [Config(rank=r, world_size=2, provider="pairwise", session="t") for r in range(2)]
        out = _both([lambda: PairwiseProvider(cfg[0], comms[0]), lambda: cls(cfg[1], comms[1])])
        for r in range(2):
            assert isinstance(out[r][1], ProtocolError) and "parameters differ" in str(out[r][1]), out[r]


def test_pairwise_needs_exactly_two_parties():
    from crypten_lite.errors import ConfigError
    with pytest.raises(ConfigError, match="exactly 2 parties"):
        Config(rank=0, world_size=3, provider="pairwise")


def _flood_setup():
    import tenseal.sealapi as s
    params = he.default_params()
    from crypten_lite.random import PRG
    prg = PRG(os.urandom(32))
    evaluator = he.CrossEngine(1, params, lambda d: None, lambda: b"",
                               lambda shape: prg.draw(tuple(shape)).numpy().view(np.uint64))
    p = he._Prime(params, params.plain_primes[0])
    gen = s.KeyGenerator(p.ctx)
    sk = gen.secret_key()
    pk = s.PublicKey()
    gen.create_public_key(pk)
    p.encryptor = s.Encryptor(p.ctx, pk)
    return s, params, evaluator, p, s.Encryptor(p.ctx, sk), s.Decryptor(p.ctx, sk)


def test_flooding_noise_exceeds_the_product_noise_by_the_statistical_margin():
    """Circuit privacy's premise, measured with SEAL's noise budget on worst-case operands
    (every slot a full-size plaintext, the elementwise triple's two products): the flood
    (uniform in [-2^F, 2^F) on c0, F from the engine's own noise bound) is at least
    2^(STAT_BITS + log2 N) times the products' noise (every coefficient's noise within
    2^-STAT_BITS of the flood's distribution, union over N coefficients), and the ciphertext
    as returned (masked, switched down to RETURN_PRIMES primes) still decrypts to X + R."""
    s, params, evaluator, p, enc, dec = _flood_setup()
    acc, want = None, np.zeros(params.n, dtype=object)
    for _ in range(2):
        x = evaluator._uniform(p.t, (params.n,))
        y = evaluator._uniform(p.t, (params.n,))
        want = (want + x.astype(object) * y.astype(object)) % p.t
        ct = s.Ciphertext()
        enc.encrypt_symmetric(p.plain(x), ct)
        prod = s.Ciphertext()
        p.evaluator.multiply_plain(ct, p.plain(y), prod)
        acc = prod if acc is None else (p.evaluator.add_inplace(acc, prod) or acc)
    product_budget = dec.invariant_noise_budget(acc)
    flood = evaluator._flooded(p, evaluator.noise_bound(p.t, 2, params.n))
    flood_budget = dec.invariant_noise_budget(flood)
    assert product_budget - flood_budget >= params.stat_bits + 13, (product_budget, flood_budget)
    mask = evaluator._uniform(p.t, (params.n,))
    returned = evaluator._finish(p, acc, p.plain(mask), evaluator.noise_bound(p.t, 2, params.n),
                                 in_ntt=False)
    back = he._Files().load(s.Ciphertext, p.ctx, returned, "test")
    assert back.coeff_modulus_size() == params.return_primes
    assert dec.invariant_noise_budget(back) >= 1
    pt = s.Plaintext()
    dec.decrypt(back, pt)
    assert np.array_equal(p.slots_of(pt).astype(object), (want + mask.astype(object)) % p.t)


def test_flooding_that_cannot_fit_is_refused():
    """A noise bound whose flood would leave no room for decryption is a ProtocolError
    naming what to do, never a wrong result; the block chooser never produces one."""
    s, params, evaluator, p, enc, dec = _flood_setup()
    with pytest.raises(ProtocolError, match="split the operation"):
        evaluator._flooded(p, evaluator.noise_bound(p.t, 1 << 20, params.n))
    for dims in ((1, 768, 3072), (128, 3072, 768), (4096, 4096, 1)):
        for joint in (True, False):
            _, mw, kw, nw = he._blocks_cost(*dims, params.n, joint=joint)
            kb = -(-dims[1] // kw)
            terms = 2 * kb * max(mw * kw, kw * nw) if joint else kb * kw * nw
            evaluator._room(p, params.flood_bits(evaluator.noise_bound(p.t, 1, terms)),
                            evaluator.noise_bound(p.t, 1, terms))


def test_progress_line_for_long_offline_phases(monkeypatch, capsys):
    from crypten_lite.provider.pairwise import PROGRESS_ENV, _Progress
    monkeypatch.setenv(PROGRESS_ENV, "1")
    monkeypatch.setattr(_Progress, "TICK", 3600.0)   # no redraw by time: the test needs none
    stats = {"pairwise_bytes_sent": 0, "pairwise_bytes_received": 0}
    bar = _Progress([10, 30], stats, rank=0)
    stats["pairwise_bytes_sent"] = 3_000_000
    bar.step(1, 10)
    assert bar.units == 10 and not bar.drawn           # redrawn by the ticker, not per step
    bar.step(2, 40)
    bar.done()
    assert not bar._ticker.is_alive()                   # done() stops the ticker
    err = capsys.readouterr().err
    assert "2/2 correlations" in err and "3.0 MB" in err and "MB/s" in err and "0 s left" in err
    assert err.endswith("\n")
    other = _Progress([1], stats, rank=1)
    assert not other.show and other._ticker is None    # one line per run: rank 0's
    monkeypatch.setenv(PROGRESS_ENV, "0")
    assert not _Progress([1], stats, rank=0).show
    monkeypatch.delenv(PROGRESS_ENV)                    # unset: only on a terminal
    assert _Progress([1], stats, rank=0).show == sys.stderr.isatty()
    monkeypatch.setenv(PROGRESS_ENV, "yes")
    with pytest.raises(ConfigError, match="CRYPTEN_LITE_PROGRESS='yes'"):
        _Progress([1], stats, rank=0)


def test_progress_line_on_a_failed_phase_ends_quietly(monkeypatch, capsys):
    from crypten_lite.provider.pairwise import PROGRESS_ENV, _Progress
    monkeypatch.setenv(PROGRESS_ENV, "1")
    monkeypatch.setattr(_Progress, "TICK", 3600.0)   # no redraw by time: the test needs none
    bar = _Progress([5, 5], {"pairwise_bytes_sent": 0, "pairwise_bytes_received": 0}, rank=0)
    bar.step(1, 5)
    bar.done()                                          # the phase raised: nothing drawn yet
    assert not bar._ticker.is_alive() and capsys.readouterr().err == ""


def test_docs_tables_come_from_the_measurements():
    import pathlib
    import sys
    root = pathlib.Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "benchmarks"))
    try:
        import pairwise_tables
    finally:
        sys.path.pop(0)
    doc = (root / "docs" / "protocols.md").read_text()
    assert pairwise_tables.small_table() in doc
    assert pairwise_tables.side_by_side() in doc
    assert pairwise_tables.quick_table() in doc
    assert pairwise_tables.breakdown_table() in doc


def test_noise_table_in_the_docs_comes_from_the_measurements():
    """docs/protocols.md's plaintext-prime table is benchmarks/pairwise_noise.py's rendering of
    docs/pairwise_noise.jsonl, and the row of the parameters in use is usable."""
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "benchmarks"))
    try:
        import pairwise_noise
    finally:
        sys.path.pop(0)
    assert pairwise_noise.noise_table() in (root / "docs" / "protocols.md").read_text()
    import json
    rows = [json.loads(line) for line in (root / "docs" / "pairwise_noise.jsonl").read_text().splitlines()]
    ours = [r for r in rows if r["modulus"] == "3x60+38" and r["plain_bits"] == he.PLAIN_BITS]
    assert len(ours) == 1 and ours[0]["usable"] and ours[0]["margin"] >= he.STAT_BITS + 13


def test_prefetch_batches_small_elementwise_correlations():
    """An offline plan of small mul triples and squares is made in one exchange (shared
    ciphertexts): each correlation still combines to its relation, and the bytes are far
    fewer than one exchange per request."""
    plan = [("triple", "mul", [(5, 3), (3,)], ()), ("square", "", [(7,)], ()),
            ("triple", "mul", [(40,), (40,)], ()), ("bit", "", [(4,)], ())]
    comms = _pair()
    ps = _providers(comms)

    def used(p):
        return p.stats["pairwise_bytes_sent"] + p.stats["pairwise_bytes_received"]

    def run(p):
        p.get("triple", [(1,), (1,)], "mul").corrected()      # the public keys go out here
        before = used(p)
        p.prefetch(plan[:3])
        made = used(p) - before
        p.prefetch(plan)
        got = [[t.clone() for t in p.get(k, s, op, par).corrected()] for k, op, s, par in plan]
        return got, made, p.stats["prefetched"]
    out = _both([lambda p=p: run(p) for p in ps])
    assert out[0][1] is None and out[1][1] is None, out
    (g0, batched, pre0), (g1, _, _) = out[0][0], out[1][0]
    assert pre0 == len(plan)
    s = [[x + y for x, y in zip(a, b)] for a, b in zip(g0, g1)]
    assert torch.equal(s[0][2], s[0][0] * s[0][1]) and torch.equal(s[2][2], s[2][0] * s[2][1])
    assert torch.equal(s[1][1], s[1][0] * s[1][0])
    assert torch.equal(s[3][1], g0[3][0] ^ g1[3][0])
    assert ps[0].by_kind["elementwise batch"][0] == 6
    # the same requests one by one: three HE exchanges instead of one
    before = used(ps[0])
    single = _both([lambda p=p: [p.get(k, s, op, par).corrected() for k, op, s, par in plan[:3]]
                    for p in ps])
    assert single[0][1] is None
    alone = used(ps[0]) - before
    assert batched < 0.5 * alone, (batched, alone)


def test_he_thread_count_is_checked(monkeypatch):
    from crypten_lite.errors import ConfigError
    monkeypatch.setenv(he.THREADS_ENV, "two")
    with pytest.raises(ConfigError, match="not a number of threads"):
        he._threads()
    monkeypatch.setenv(he.THREADS_ENV, "0")
    with pytest.raises(ConfigError, match="at least 1"):
        he._threads()
    monkeypatch.setenv(he.THREADS_ENV, "3")
    assert he._threads() == 3


@pytest.mark.parametrize("n", [100, he.N + 5])
def test_he_exchange_is_pipelined_one_message_per_prime(n):
    """Each party sends its public keys, then each prime's ciphertexts as soon as they are
    made (the peer starts on prime 0 while the others are encrypted), one message per prime
    each way per role: with one block rank 0 owns the product (rank 1 only returns results);
    with two, each party owns one block and evaluates the other's at the same time. The
    shares still combine to the exact product."""
    import queue
    from crypten_lite.random import PRG
    params = he.default_params()
    boxes, sent, out = [queue.Queue(), queue.Queue()], [[], []], [None, None]

    def party(r, x):
        prg = PRG(os.urandom(32))

        def send(d):
            sent[r].append(len(d))
            boxes[1 - r].put(d)
        eng = he.CrossEngine(r, params, send, lambda: boxes[r].get(timeout=120),
                             lambda shape: prg.draw(tuple(shape)).numpy().view(np.uint64))
        try:
            out[r] = eng.elementwise([x], 128)
        finally:
            eng.close()
    rng = np.random.default_rng(5)  # insecure-ok: test inputs
    xs = [rng.integers(0, 2 ** 63, n, dtype=np.uint64) for _ in range(2)]
    threads = [threading.Thread(target=party, args=(r, xs[r])) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        assert not t.is_alive(), "a party hung"
    primes = params.primes_for(128)
    assert primes == 4
    roles = 1 if n <= he.N else 2
    assert len(sent[0]) == 1 + roles * primes and len(sent[1]) == 1 + roles * primes
    with np.errstate(over="ignore"):
        assert np.array_equal(out[0] + out[1], xs[0] * xs[1])


@pytest.mark.parametrize("transposed", [False, True])
def test_matmul_as_two_one_sided_products(monkeypatch, transposed):
    """The split encoding (A0 B1 owned by party 0 and A1 B0 by party 1, made at the same
    time), chosen where it costs less (matmul 256: yes), forced here on tiny shapes: the triples combine to their relation, batched and not."""
    assert he.split_products(256, 256, 256, he.N)
    monkeypatch.setattr(he, "split_products", lambda *a: True)
    monkeypatch.setattr(he, "split_transposed", lambda *a: transposed)   # B^T A^T: each encrypts its rhs
    comms = _pair()
    ps = _providers(comms)
    reqs = [[(3, 5), (5, 2)], [(2, 3, 4), (4, 2)]]
    out = _both([lambda p=p: [[t.clone() for t in p.get("triple", s, "matmul").corrected()] for s in reqs]
                 for p in ps])
    assert out[0][1] is None and out[1][1] is None, out
    for a, b in zip(out[0][0], out[1][0]):
        s = [x + y for x, y in zip(a, b)]
        assert torch.equal(s[2], s[0] @ s[1])


def test_coefficient_plaintexts_and_modular_arithmetic_are_exact():
    """Coefficient plaintexts written in SEAL's serialization format load with exactly the
    coefficients given (extreme values too), and the numpy modular helpers (Shoup products,
    multi-word reduction, Garner's CRT) agree with Python's integers for 60-bit primes."""
    import random
    params = he.default_params()
    p = he._Prime(params, params.plain_primes[0])
    files = he._Files()
    rng = np.random.default_rng(7)  # insecure-ok: test inputs, not shares
    row = rng.integers(0, p.t, params.n, dtype=np.uint64)
    row[:4] = [0, 1, p.t - 1, p.t - 2]
    import tenseal.sealapi as s
    pt = files.load(s.Plaintext, p.ctx, p.plain_bytes(row), "test")
    assert np.array_equal(p.coeffs_of(pt, list(range(params.n))), row)
    with pytest.raises(ProtocolError, match="malformed plaintext"):   # SEAL checks c < t
        bad = row.copy()
        bad[5] = p.t
        files.load(s.Plaintext, p.ctx, p.plain_bytes(bad), "plaintext")
    r = random.Random(3)  # insecure-ok: test inputs
    primes = params.plain_primes[:4]
    vals = [r.getrandbits(179) for _ in range(300)] + [0, 1, math.prod(primes) - 1]
    res = [np.array([v % t for v in vals], dtype=np.uint64) for t in primes]
    assert [int(x) for x in he.crt_mod64(res, primes)] == [v % (1 << 64) for v in vals]
    words = [np.array([(v >> (64 * i)) & ((1 << 64) - 1) for v in vals], dtype=np.uint64)
             for i in range(3)]
    for m in primes + params.coeff_moduli:
        assert [int(x) for x in he.words_mod(words, m)] == [v % m for v in vals]


def test_progress_line_redraws_during_one_long_correlation(monkeypatch, capsys):
    from crypten_lite.provider.pairwise import PROGRESS_ENV, _Progress
    monkeypatch.setenv(PROGRESS_ENV, "1")
    monkeypatch.setattr(_Progress, "TICK", 0.01)
    stats = {"pairwise_bytes_sent": 0, "pairwise_bytes_received": 2_000_000}
    bar = _Progress([7], stats, rank=0)
    deadline = threading.Event()
    for _ in range(6000):                               # the ticker draws without any step
        if bar.drawn or deadline.wait(0.01):
            break
    bar.done()
    err = capsys.readouterr().err
    assert bar.drawn and "0/1 correlations" in err and "time left unknown" in err
    assert "2.0 MB" not in err                          # bytes counted from the bar's start
