"""The Z_2^64 matmul / conv engine of provider pairwise (provider/he_pow2.py: plaintext modulus
2^64, one set of ciphertexts per product): exact on the ring's edge values (0, -1, 2^63,
values at the 2^(64-k) and 2^k boundaries of the two-decryption read-out), exact cross terms
of two engines for the split, transposed and joint matmul encodings and the direct conv
with adversarial inputs, the true noise of a returned ciphertext (measured with the secret
key, not SEAL's noise budget, which cannot see a custom t) below the decryption bound with
the flood on top of the evaluation, the carry fix-up refusing an inconsistent read-out, and
the handshake refusing a peer on the CRT matmul engine."""

from __future__ import annotations

import os
import queue

import numpy as np
import pytest

pytest.importorskip("tenseal")

from crypten_lite.errors import ProtocolError  # noqa: E402
from crypten_lite.provider import he, he_conv, he_pow2  # noqa: E402
from crypten_lite.random import PRG  # noqa: E402
from two_party_threads import record_sends, run_both  # noqa: E402

M64 = 1 << 64


def _rand():
    prg = PRG(os.urandom(32))
    return lambda shape: prg.draw(tuple(shape)).numpy().view(np.uint64)


@pytest.fixture(scope="module")
def unit():
    """One party's unit whose peer is itself (its own public key): owner and evaluator."""
    params = he.default_params()
    u = he_pow2.Pow2Unit(params)
    files = he._Files()
    u.peer_key(files, u.keygen(files))
    yield u, files
    files.close()


def _edge_values(k: int) -> np.ndarray:
    vals = [0, 1, M64 - 1, 1 << 63, (1 << 63) - 1, (1 << 63) + 1]
    for b in (64 - k, k, 2 * (64 - k), 48, 56):
        for c in (1, 3, (1 << (64 - b)) - 1):
            base = (c << b) % M64
            vals += [base, (base - 1) % M64, (base + 1) % M64]
    return np.array(vals, dtype=np.uint64)


def _evaluate_identity(u, files, rows, masks, rand, bound=None):
    """Encrypt rows, multiply by the plaintext 1, finish with `masks`: the returned bytes."""
    cts = u.encrypt_rows(files, rows)
    one = np.zeros((1, u.n), dtype=np.uint64)
    one[0, 0] = 1
    pt = u.ntt_plains(files, one)[0]
    out = []
    for i, data in enumerate(cts):
        ct = files.load(he._sealapi().Ciphertext, u.ctx, data, "t")
        u.evaluator.transform_to_ntt_inplace(ct)
        acc = he._dot(u, [(ct, pt)])
        out.append(u.finish(files, acc, masks[i], bound or u.noise_bound(1, 1), rand))
    return out


def test_edge_values_decrypt_exactly(unit):
    """v = A + R mod 2^64 read at every coefficient, A and R at the edges: 0, 2^64 - 1, 2^63,
    both sides of multiples of 2^(64-k) and 2^k (where SEAL's top-k read-out may be off by
    one and the overlap must fix the carry), and uniform values."""
    u, files = unit
    rand = _rand()
    nd = u.n
    edges = _edge_values(u.k)
    rows = np.zeros((2, nd), dtype=np.uint64)
    masks = np.zeros((2, nd), dtype=np.uint64)
    rows[0, :edges.size] = edges                               # R = 0: v = A
    rows[0, edges.size:] = rand((nd - edges.size,))
    masks[1, :edges.size] = edges                              # A uniform, R = edge - A: v = edge
    rows[1] = rand((nd,))
    with np.errstate(over="ignore"):
        masks[1, :edges.size] = edges - rows[1, :edges.size]
        masks[1, edges.size:] = rand((nd - edges.size,))
        want = rows + masks
    back = _evaluate_identity(u, files, rows, masks, rand)
    where = list(range(nd))
    for i in range(2):
        assert np.array_equal(u.open(files, back[i], where), want[i]), i


def test_combine_fixes_the_carry_and_refuses_inconsistency():
    k = 40
    rng = np.random.default_rng(3)  # test data only
    v = np.concatenate([_edge_values(k), rng.integers(0, 1 << 63, 500, dtype=np.uint64) * 2 + 1])
    top = v >> np.uint64(64 - k)
    low = v & np.uint64((1 << k) - 1)
    km = np.uint64((1 << k) - 1)
    for d in (0, 1, km):                                       # SEAL's top k bits off by -1, 0, +1
        with np.errstate(over="ignore"):
            assert np.array_equal(he_pow2.combine((top + np.uint64(d)) & km, low, k), v), d
    with pytest.raises(ProtocolError, match="inconsistently"):
        he_pow2.combine((top + np.uint64(5)) & km, low, k)


def test_float_mulmod_and_words_mod_are_exact():
    """he_pow2.mulmod (float64 quotient estimate) and words_mod against Python integers, at
    the edges (0, q - 1, values near 2^50) and on uniform values, for the engine's primes."""
    rng = np.random.default_rng(4)  # test data only
    for q in he_pow2.moduli()[:-1]:
        x = np.concatenate([np.array([0, 1, q - 1, q - 2, (1 << 49), q // 2], dtype=np.uint64),
                            rng.integers(0, q, 2000, dtype=np.uint64)])
        for c in (1, 2, q - 1, (1 << 64) % q, (1 << 50) % q, int(rng.integers(0, q))):
            assert [int(v) for v in he_pow2.mulmod(x, c, q)] == [int(v) * c % q for v in x], (q, c)
        w = [rng.integers(0, 1 << 63, 500, dtype=np.uint64) * np.uint64(2) + np.uint64(1) for _ in range(3)]
        w[0][:2] = [0, (1 << 64) - 1]
        want = [(int(a) + (int(b) << 64) + (int(c) << 128)) % q for a, b, c in zip(*w)]
        assert [int(v) for v in he_pow2.words_mod(w, q)] == want


def test_true_noise_is_below_the_bound_and_flooded(unit):
    """A returned ciphertext's true noise (secret key, not SEAL's budget): below Q / 2^65 (it
    decrypts exactly), and of the flood's size (2^F scaled to the return modulus), F at least
    40 + 13 bits above the evaluation's worst-case bound."""
    u, files = unit
    rand = _rand()
    nd = u.n
    rows = np.full((1, nd), M64 - 1, dtype=np.uint64)         # all -1: the largest |A|
    b = np.full((1, nd), 1 << 63, dtype=np.uint64)            # |B| = 2^63 in every coefficient
    masks = rand((1, nd))
    cts = u.encrypt_rows(files, rows)
    pt = u.ntt_plains(files, b)[0]
    ct = files.load(he._sealapi().Ciphertext, u.ctx, cts[0], "t")
    u.evaluator.transform_to_ntt_inplace(ct)
    acc = he._dot(u, [(ct, pt)])
    bound = u.noise_bound(1, nd)
    flood = u.params.flood_bits(bound)
    assert flood >= bound.bit_length() + 53
    back = u.finish(files, acc, masks[0], bound, rand)
    # A B = (-Sum X^i)(2^63 Sum X^j) mod X^N + 1: coefficient i is -2^63 (2 i + 2 - N), 0 mod 2^64
    i = np.arange(nd, dtype=object)
    prod = (-(1 << 63) * (2 * i + 2 - nd)) % M64
    v = ((prod + masks[0].astype(object)) % M64).astype(np.uint64)
    assert np.array_equal(u.open(files, back, list(range(nd))), v)
    e = np.abs(u.true_noise(files, back, v))
    L = u.params.mm_return
    qret = float(np.prod([float(m) for m in u.data_moduli[:L]]))
    qdata = float(np.prod([float(m) for m in u.data_moduli]))
    assert e.max() < qret / 2.0 ** 65                           # decrypts: the bound holds
    scaled_flood = 2.0 ** flood * qret / qdata
    assert e.max() > scaled_flood / 2                           # the flood is there, in full
    assert np.median(e) > scaled_flood / 8                      # uniform-sized, not a few outliers


def _engines():
    boxes = [queue.Queue(), queue.Queue()]

    def make(r):
        rand = _rand()
        return he.CrossEngine(r, he.default_params(), lambda d, r=r: boxes[1 - r].put(d),
                              lambda r=r: boxes[r].get(timeout=300), rand)
    return [make(0), make(1)]


def _both(fns):
    return run_both(fns, 600)


def _adversarial(shape, kind, rng):
    if kind == "ones":
        return np.full(shape, M64 - 1, dtype=np.uint64)       # all -1
    if kind == "top":
        return np.full(shape, 1 << 63, dtype=np.uint64)       # 2^63
    return rng.integers(0, 1 << 63, shape, dtype=np.uint64) * np.uint64(2) + np.uint64(1)


def _matmul_ref(a0, b0, a1, b1):
    o = [x.astype(object) for x in (a0, b1, a1, b0)]
    return ((np.matmul(o[0], o[1]) + np.matmul(o[2], o[3])) % M64).astype(np.uint64)


@pytest.mark.parametrize("mode,in_memory", [("split", True), ("transposed", True), ("joint", True),
                                             ("split", False)])
def test_matmul_cross_terms_exact_with_adversarial_inputs(monkeypatch, mode, in_memory):
    """lhs0 @ rhs1 + lhs1 @ rhs0 in Z_2^64 for every encoding, operands all -1, all 2^63 and
    uniform (each party's and each side's kind differ), batched, with several blocks; also
    through SEAL's save and load where the TenSEAL build's layout is unchecked (in_memory off)."""
    if not in_memory:
        monkeypatch.setattr(he_pow2, "_LAYOUT_OK", False)
    monkeypatch.setattr(he, "split_products", lambda *a: mode != "joint")
    monkeypatch.setattr(he, "split_transposed", lambda *a: mode == "transposed")
    engines = _engines()
    rng = np.random.default_rng(7)  # test data only
    shape_l, shape_r = (2, 3, 5), (2, 5, 4)
    for kinds in (("ones", "top", "top", "ones"), ("random", "ones", "top", "random")):
        a0, b0, a1, b1 = (_adversarial(s, k, rng) for s, k in zip((shape_l, shape_r) * 2, kinds))
        got = _both([lambda: engines[0].matmul(a0, b0, 140), lambda: engines[1].matmul(a1, b1, 140)])
        with np.errstate(over="ignore"):
            assert np.array_equal(got[0] + got[1], _matmul_ref(a0, b0, a1, b1)), kinds
    for e in engines:
        e.close()


def test_long_inner_dimension_is_summed_from_chunks():
    """An inner dimension past he.K_CHUNK (beyond the noise limit of one product) is made from
    chunks and stays exact; the block chooser costs it instead of refusing it."""
    k = he.K_CHUNK + 5
    assert he._blocks_cost(2, k, 3, he.N)[0] > 0 and he._blocks_cost(2, k, 3, he.N, joint=False)[0] > 0
    engines = _engines()
    rng = np.random.default_rng(9)  # test data only
    a0, a1 = (_adversarial((1, 2, k), kind, rng) for kind in ("ones", "random"))
    b0, b1 = (_adversarial((1, k, 3), kind, rng) for kind in ("random", "top"))
    got = _both([lambda: engines[0].matmul(a0, b0, 150), lambda: engines[1].matmul(a1, b1, 150)])
    with np.errstate(over="ignore"):
        assert np.array_equal(got[0] + got[1], _matmul_ref(a0, b0, a1, b1))
    for e in engines:
        e.close()


def test_direct_conv_cross_terms_exact_with_adversarial_inputs():
    """conv(x0, w1) + conv(x1, w0) in Z_2^64, inputs all -1 and kernels all 2^63 (and the
    reverse), two images per polynomial, several channel blocks."""
    import torch
    import torch.nn.functional as F
    engines = _engines()
    rng = np.random.default_rng(8)  # test data only
    xs, ws = (2, 2, 6, 5), (3, 2, 3, 2)
    for kinds in (("ones", "top", "top", "ones"), ("random", "top", "ones", "random")):
        x0, w0, x1, w1 = (_adversarial(s, k, rng) for s, k in zip((xs, ws) * 2, kinds))
        got = _both([lambda: he_conv.conv2d(engines[0], x0, w0, (1, 1), 140),
                     lambda: he_conv.conv2d(engines[1], x1, w1, (1, 1), 140)])
        t = [torch.from_numpy(v.view(np.int64)) for v in (x0, w1, x1, w0)]
        want = F.conv2d(t[0], t[1]) + F.conv2d(t[2], t[3])      # int64 wraps: mod 2^64
        with np.errstate(over="ignore"):
            assert np.array_equal((got[0] + got[1]).view(np.int64), want.numpy()), kinds
    for e in engines:
        e.close()


def test_block_choice_keeps_the_noise_within_room(unit):
    """Every block choice of the matmul encoding, at shapes up to BERT's, and LeNet's direct
    convolutions pass the engine's room check (the chooser never picks what it would refuse);
    past MAX_TERMS the room check refuses."""
    u, _ = unit
    for m, k, n in ((256, 256, 256), (128, 768, 768), (128, 3072, 768), (1, 400, 120), (64, 120, 84)):
        for joint in (False, True):
            _, mw, kw, nw = he._blocks_cost(m, k, n, he.N, joint=joint)
            kb = -(-k // kw)
            bound = u.noise_bound(2 * kb, max(mw * kw, kw * nw)) if joint else u.noise_bound(kb, kw * nw)
            u.room(u.params.flood_bits(bound), bound)
    for xs, ws in (((64, 6, 12, 12), (16, 6, 5, 5)), ((64, 1, 28, 28), (6, 1, 5, 5)),
                   ((1, 512, 14, 14), (4, 512, 3, 3))):
        lay = he_conv.layout(xs, ws, (1, 1), he.N)
        bound = u.noise_bound(lay.cblocks, lay.cb * lay.kh * lay.kw)
        u.room(u.params.flood_bits(bound), bound)
    big = u.noise_bound(1, 4 * he.MAX_NOISE_TERMS)
    with pytest.raises(ProtocolError, match="no room"):
        u.room(u.params.flood_bits(big), big)


def test_no_secret_key_of_the_z2_64_unit_on_the_wire():
    """A matmul triple through two providers (the Z_2^64 unit keyed on first use): neither
    party's secret key of that unit, compressed as SEAL saves it or raw, appears in anything
    either party sends, and the triple holds."""
    import torch

    from crypten_lite.comm.inprocess import InProcessCommunicator, InProcessHub
    from crypten_lite.config import Config
    from crypten_lite.provider.pairwise import PairwiseProvider

    hub = InProcessHub(2, timeout=120.0)
    seed = os.urandom(32)
    comms = [InProcessCommunicator(hub, r) for r in range(2)]
    for r, c in enumerate(comms):
        c.pair_seeds = {1 - r: seed}
    sent = record_sends(comms)
    cfg = [Config(rank=r, world_size=2, provider="pairwise", session="t") for r in range(2)]
    ps = _both([lambda r=r: PairwiseProvider(cfg[r], comms[r]) for r in range(2)])
    shapes = [(4, 6), (6, 3)]
    out = _both([lambda p=p: [t.clone() for t in p.get("triple", shapes, "matmul").corrected()] for p in ps])
    a, b, c = (x + y for x, y in zip(out[0], out[1]))
    assert torch.equal(c, a @ b)
    wire = b"".join(sent[0] + sent[1])
    assert len(wire) > 400_000                      # ciphertexts did go both ways
    for p in ps:
        unit = p._engine._pow2
        assert unit is not None
        key = p._engine._files.dump(unit.secret_key)
        assert key[len(key) // 2: len(key) // 2 + 64] not in wire
        raw = he_pow2._body(key, 8 * 5 * unit.n + 4096)
        assert raw[len(raw) // 2: len(raw) // 2 + 64] not in wire


def test_a_peer_on_the_crt_matmul_engine_is_refused_at_the_handshake():
    """A peer whose matmul / conv triples still use the CRT plaintext primes (no mm=pow2-64 in
    its parameters) never exchanges a ciphertext: both get a ProtocolError."""
    from crypten_lite.config import Config
    from crypten_lite.provider.pairwise import PairwiseProvider
    from crypten_lite.comm.inprocess import InProcessCommunicator, InProcessHub

    hub = InProcessHub(2, timeout=60.0)
    seed = os.urandom(32)
    comms = [InProcessCommunicator(hub, r) for r in range(2)]
    for r, c in enumerate(comms):
        c.pair_seeds = {1 - r: seed}

    def both(fns):
        return run_both(fns, 120, capture=True)

    class Crt(PairwiseProvider):
        def _parameters(self):
            params = he.default_params()
            text = params.describe().split(";mm=")[0]
            assert "pow2" not in text
            return type("P", (), {"describe": lambda self: text, "n": params.n})()
    cfg = [Config(rank=r, world_size=2, provider="pairwise", session="t") for r in range(2)]
    out = both([lambda: PairwiseProvider(cfg[0], comms[0]), lambda: Crt(cfg[1], comms[1])])
    for r in range(2):
        assert isinstance(out[r][1], ProtocolError) and "parameters differ" in str(out[r][1]), out[r]


def test_noise_table_in_the_docs_comes_from_the_measurements():
    """docs/protocols.md's Z_2^64 noise table is benchmarks/pairwise_noise_pow2.py's rendering
    of docs/pairwise_noise_pow2.jsonl; every row decrypts exactly, keeps its largest noise
    under the limit and its flood 53 bits above the bound, at the parameters in use."""
    import json
    import pathlib
    import sys
    root = pathlib.Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "benchmarks"))
    try:
        import pairwise_noise_pow2
    finally:
        sys.path.pop(0)
    assert pairwise_noise_pow2.noise_table() in (root / "docs" / "protocols.md").read_text()
    rows = [json.loads(line) for line in (root / "docs" / "pairwise_noise_pow2.jsonl").read_text().splitlines()]
    params = he.default_params()
    assert len(rows) == len(pairwise_noise_pow2.CASES)
    for r in rows:
        bound = he_pow2.Pow2Unit.noise_bound(None, r["products"], r["nonzero"])
        assert r["bound_bits"] == bound.bit_length() and r["flood_bits"] == params.flood_bits(bound)
        assert r["decrypts_exactly"] and r["noise_max_bits"] < r["limit_bits"]
        assert r["margin"] >= he.STAT_BITS + 13


def test_own_zero_encryption_at_the_data_primes_decrypts_to_zero_within_its_room(unit):
    """The unit keeps the peer's public key at the four data primes in NTT form (pk_ntt), and
    he.zero_at_data_primes under it (u uniform ternary, e1 and e2 centred binomial, SEAL's
    t = 2^k for u's -1) decrypts to zero with its noise within the 2^20 that check_room
    reserves for it (SEAL's noise budget: at most 21 bits below log2(q / t) - 1, and below
    that, so not noiseless), and two draws differ (fresh u and errors)."""
    import math
    u, files = unit
    s = he._sealapi()
    assert u.pk_ntt is not None and u.pk_ntt.is_ntt_form()
    assert u.pk_ntt.coeff_modulus_size() == len(u.data_moduli)
    rand = _rand()
    room = math.log2(math.prod(u.data_moduli) / 2.0 ** u.k) - 1
    heads = []
    for _ in range(2):
        z, errors = he.zero_at_data_primes(files, u.ctx, u.pid, u.evaluator, u.pk_ntt,
                                           u.data_moduli, 1 << u.k, rand)
        assert errors.shape == (2, len(u.data_moduli), u.n)
        u.evaluator.transform_from_ntt_inplace(z)
        u.evaluator.add_inplace(z, files.load(s.Ciphertext, u.ctx, u._ct_bytes(
            errors.astype(np.uint64).reshape(2, -1)), "errors"))
        assert room - 21 <= u.decryptor.invariant_noise_budget(z) < room
        pt = s.Plaintext()
        u.decryptor.decrypt(z, pt)
        assert pt.is_zero()
        heads.append(z.data(0))
    assert heads[0] != heads[1]


@pytest.mark.parametrize("check", [test_edge_values_decrypt_exactly,
                                   test_true_noise_is_below_the_bound_and_flooded])
def test_seal_encrypt_zero_fallback_decrypts_exactly_and_floods(unit, monkeypatch, check):
    """Without the peer's key at the data primes (a key not laid out as SEAL 4 saves one),
    finish re-randomises with SEAL's encrypt_zero as before: the edge values still decrypt
    exactly and the flood still arrives in full."""
    u, _ = unit
    monkeypatch.setattr(u, "pk_ntt", None)
    check(unit)


@pytest.mark.parametrize("own_zero", [True, False])
def test_engine_products_exact_on_the_own_zero_path_and_the_fallback(monkeypatch, own_zero):
    """A matmul's and a direct conv's cross terms through two engines, exact against torch's
    plaintext product mod 2^64, once with the engine's own encryption of zero (every returned
    ciphertext made through he.zero_at_data_primes) and once with SEAL's encrypt_zero (the key
    at the data primes unavailable: zero_at_data_primes never called)."""
    import torch
    import torch.nn.functional as F
    calls = []
    made = he.zero_at_data_primes
    monkeypatch.setattr(he, "zero_at_data_primes", lambda *a: calls.append(1) or made(*a))
    if not own_zero:
        monkeypatch.setattr(he, "key_at_data_primes", lambda *a: None)
    engines = _engines()
    rng = np.random.default_rng(11)  # test data only
    try:
        a0, b0, a1, b1 = (_adversarial(s, k, rng) for s, k in
                          zip(((1, 3, 5), (1, 5, 4)) * 2, ("ones", "random", "random", "top")))
        got = _both([lambda: engines[0].matmul(a0, b0, 140), lambda: engines[1].matmul(a1, b1, 140)])
        with np.errstate(over="ignore"):
            assert np.array_equal(got[0] + got[1], _matmul_ref(a0, b0, a1, b1))
        x0, w0, x1, w1 = (_adversarial(s, k, rng) for s, k in
                          zip(((1, 2, 5, 4), (2, 2, 3, 2)) * 2, ("random", "top", "ones", "random")))
        got = _both([lambda: he_conv.conv2d(engines[0], x0, w0, (1, 1), 140),
                     lambda: he_conv.conv2d(engines[1], x1, w1, (1, 1), 140)])
        t = [torch.from_numpy(v.view(np.int64)) for v in (x0, w1, x1, w0)]
        want = F.conv2d(t[0], t[1]) + F.conv2d(t[2], t[3])      # int64 wraps: mod 2^64
        with np.errstate(over="ignore"):
            assert np.array_equal((got[0] + got[1]).view(np.int64), want.numpy())
    finally:
        for e in engines:
            e.close()
    assert (len(calls) > 0) == own_zero
