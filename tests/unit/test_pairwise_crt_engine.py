"""The batched CRT engine's helpers (provider/he.py, elementwise products): Garner's CRT on
its fast path (float64 quotient estimates, primes below 2^51) and on the generic one, the
flood term written in place into a SEAL ciphertext against the one loaded from SEAL's
serialization format, and the exchange's framing (pack / unpack, whose chunks are views of
the received message). Each checked against Python integers or SEAL's own objects."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from crypten_lite.errors import ProtocolError
from crypten_lite.provider import he, he_pow2


@pytest.fixture(scope="module")
def params():
    return he.default_params()


def _residues(vals: list[int], primes) -> list[np.ndarray]:
    return [np.array([v % t for v in vals], dtype=np.uint64) for t in primes]


def test_crt_fast_and_generic_paths_agree_with_python(params):
    """crt_mod64 equals X mod 2^64 for X below the product of the primes: the engine's
    45-bit plaintext primes (the fast path, _crt_small) at the extremes and at random,
    the generic path (60-bit primes), and the fast path on residues not yet reduced (a
    residue may arrive as any value below 2^64)."""
    r = random.Random(11)  # insecure-ok: test inputs
    primes = params.plain_primes[:4]
    assert max(primes) < he._SMALL
    top = math.prod(primes)
    vals = [r.randrange(top) for _ in range(500)] + [0, 1, top - 1, top // 2, 1 << 64, (1 << 64) - 1,
                                                      (1 << 169) + 12345, (1 << 170) - 1]
    want = [v % (1 << 64) for v in vals]
    res = _residues(vals, primes)
    assert [int(x) for x in he._crt_small(res, primes)] == want
    assert [int(x) for x in he.crt_mod64(res, primes)] == want
    unreduced = [np.where(x < np.uint64(1 << 20), x + np.uint64(t), x) for x, t in zip(res, primes)]
    assert [int(x) for x in he._crt_small(unreduced, primes)] == want
    for count in (1, 2, 3, 5):                      # every prime count primes_for may pick
        sub = params.plain_primes[:count]
        v = [r.randrange(math.prod(sub)) for _ in range(200)] + [math.prod(sub) - 1]
        assert [int(x) for x in he.crt_mod64(_residues(v, sub), sub)] == [x % (1 << 64) for x in v]
    big = params.coeff_moduli[:3]                   # 60-bit: the generic path
    v = [r.randrange(math.prod(big)) for _ in range(200)] + [math.prod(big) - 1]
    assert [int(x) for x in he.crt_mod64(_residues(v, big), big)] == [x % (1 << 64) for x in v]


def test_mask_residues_on_the_fast_path_are_exact(params):
    """The mask R (169 bits in three words) mod each plaintext prime by float64 quotient
    estimates (CrossEngine._mod_t) equals Python's R mod t."""
    r = random.Random(12)  # insecure-ok: test inputs
    vals = [r.getrandbits(169) for _ in range(300)] + [0, (1 << 169) - 1, (1 << 128) - 1]
    words = [np.array([(v >> (64 * i)) & ((1 << 64) - 1) for v in vals], dtype=np.uint64)
             for i in range(3)]
    for t in params.plain_primes:
        assert [int(x) for x in he.CrossEngine._mod_t(words, t)] == [v % t for v in vals]


def _coeffs(ct, levels: int, n: int) -> np.ndarray:
    view = he_pow2._ct_data(ct, 2, levels, n)
    assert view is not None
    return view.copy()


def test_noise_term_in_place_equals_the_serialized_one(params):
    """_Prime.noise_ct writes (e, 0) straight into a fresh SEAL ciphertext: the same
    coefficients, form and level as the ciphertext loaded from noise_bytes (the path a
    TenSEAL build of unchecked layout takes), so the flood is the same either way."""
    if not he_pow2._layout_known():
        pytest.skip("this TenSEAL build's object layout is not the checked one")
    import tenseal.sealapi as s
    p = he._Prime(params, params.plain_primes[0])
    files = he._Files()
    try:
        rng = np.random.default_rng(5)  # insecure-ok: test inputs, not shares
        levels = len(p.data_moduli)
        res = np.stack([rng.integers(0, q, params.n, dtype=np.uint64) for q in p.data_moduli])
        res[:, 0] = [q - 1 for q in p.data_moduli]
        built = p.noise_ct(res)
        loaded = files.load(s.Ciphertext, p.ctx, p.noise_bytes(res), "flooding term")
        assert built is not None
        assert (built.size(), built.is_ntt_form(), built.coeff_modulus_size(), list(built.parms_id())) == \
            (loaded.size(), loaded.is_ntt_form(), loaded.coeff_modulus_size(), list(loaded.parms_id()))
        a, b = _coeffs(built, levels, params.n), _coeffs(loaded, levels, params.n)
        assert np.array_equal(a, b)
        assert np.array_equal(a[:res.size], res.reshape(-1)) and not a[res.size:].any()
    finally:
        files.close()


def test_flood_without_the_in_place_view_takes_the_file_path(params, monkeypatch):
    """Where _ct_data does not know the layout, noise_ct gives None and _flooded loads the
    term from SEAL's serialization format (with the zero encryption's e2 as its c1 where
    the peer's key is held at the data primes): the re-randomised flood still decrypts to
    zero with the room check_room promises."""
    import tenseal.sealapi as s
    monkeypatch.setattr(he_pow2, "_LAYOUT_OK", False)
    p = he._Prime(params, params.plain_primes[0])
    assert p.noise_ct(np.zeros((len(p.data_moduli), params.n), dtype=np.uint64)) is None
    gen = s.KeyGenerator(p.ctx)
    pk = s.PublicKey()
    gen.create_public_key(pk)
    p.encryptor = s.Encryptor(p.ctx, pk)
    dec = s.Decryptor(p.ctx, gen.secret_key())
    prg = np.random.default_rng(6)  # insecure-ok: test stand-in for the evaluator's PRG
    eng = he.CrossEngine(0, params, lambda d: None, lambda: b"",
                         lambda shape: prg.integers(0, 1 << 64, shape, dtype=np.uint64))
    try:
        for peer_key in (False, True):   # SEAL's encrypt_zero; then zero_ntt, its e2 as c1
            if peer_key:
                p.set_peer_key(eng._files, pk)
                assert p.pk_ntt is not None
            z = eng._flooded(p, eng.noise_bound(p.t, 2, params.n))
            assert dec.invariant_noise_budget(z) > 0
            pt = s.Plaintext()
            dec.decrypt(z, pt)
            assert not p.slots_of(pt).any()
    finally:
        eng.close()


def test_pack_unpack_round_trip_with_views():
    """unpack gives the chunks as views of the one received message (no copy per chunk),
    equal to what pack was given; a wrong count, a length past the end or trailing bytes
    stay ProtocolErrors."""
    chunks = [b"", b"a", bytes(range(256)) * 3, b"\x00" * 17]
    msg = he.pack(chunks)
    got = he.unpack(msg, len(chunks), "chunks")
    assert [bytes(c) for c in got] == chunks
    assert all(isinstance(c, memoryview) for c in got)
    with pytest.raises(ProtocolError, match="expected 3"):
        he.unpack(msg, 3, "chunks")
    with pytest.raises(ProtocolError, match="truncated"):
        he.unpack(msg[:-1], len(chunks), "chunks")
    with pytest.raises(ProtocolError, match="trailing"):
        he.unpack(msg + b"x", len(chunks), "chunks")


def _keys(params, p):
    import tenseal.sealapi as s
    gen = s.KeyGenerator(p.ctx)
    sk = gen.secret_key()
    pk = s.PublicKey()
    gen.create_public_key(pk)
    return s, pk, s.Encryptor(p.ctx, sk), s.Decryptor(p.ctx, sk)


def test_zero_encryption_at_the_data_primes_is_a_fresh_encryption_of_zero(params):
    """_Prime.zero_ntt (the peer's public key at the data primes, u uniform ternary, e1, e2
    centred binomial) decrypts to zero, with its noise within the 2^20 check_room allows
    for it (SEAL's noise budget: at most 21 bits below the data modulus's q / t), and two
    draws differ (fresh u and errors)."""
    p = he._Prime(params, params.plain_primes[0])
    s, pk, _, dec = _keys(params, p)
    files = he._Files()
    prg = np.random.default_rng(8)  # insecure-ok: test stand-in for the evaluator's PRG
    try:
        p.set_peer_key(files, pk)
        assert p.pk_ntt is not None and p.pk_ntt.is_ntt_form()
        assert p.pk_ntt.coeff_modulus_size() == len(p.data_moduli)
        cts = []
        for _ in range(2):
            z, errors = p.zero_ntt(files, lambda shape: prg.integers(0, 1 << 64, shape, dtype=np.uint64))
            assert errors.shape == (2, len(p.data_moduli), params.n)
            noise = p.noise_ct(errors[0].astype(np.uint64), errors[1].astype(np.uint64))
            p.evaluator.transform_from_ntt_inplace(z)
            p.evaluator.add_inplace(z, noise)
            room = math.log2(math.prod(p.data_moduli) / p.t) - 1
            assert dec.invariant_noise_budget(z) >= room - 21
            pt = s.Plaintext()
            dec.decrypt(z, pt)
            assert pt.is_zero()
            cts.append(z.data(0))
        assert cts[0] != cts[1]
    finally:
        files.close()


def test_flood_on_the_engine_path_keeps_its_margin_and_decrypts_exactly(params):
    """The elementwise evaluation as the engine now makes it (products accumulated in NTT
    form, the zero encryption's (pk0 u, pk1 u) added before the one inverse NTT, its errors
    in the flood term): SEAL's noise budget shows the flood 2^(40 + 13) above the worst-case
    products (two full-size plaintexts), and the returned ciphertext (masked, switched down)
    decrypts to X + R."""
    p = he._Prime(params, params.plain_primes[0])
    s, pk, enc, dec = _keys(params, p)
    prg = np.random.default_rng(9)  # insecure-ok: test stand-in for the evaluator's PRG
    eng = he.CrossEngine(1, params, lambda d: None, lambda: b"",
                         lambda shape: prg.integers(0, 1 << 64, shape, dtype=np.uint64))
    try:
        p.set_peer_key(eng._files, pk)
        acc, plain_acc, want = None, None, np.zeros(params.n, dtype=object)
        for _ in range(2):
            x, y = eng._uniform(p.t, (params.n,)), eng._uniform(p.t, (params.n,))
            want = (want + x.astype(object) * y.astype(object)) % p.t
            ct = s.Ciphertext()
            enc.encrypt_symmetric(p.plain(x), ct)
            prod = s.Ciphertext()
            p.evaluator.multiply_plain(ct, p.plain(y), prod)
            plain_acc = prod if plain_acc is None else (p.evaluator.add_inplace(plain_acc, prod) or plain_acc)
            pt = p.plain(y)
            p.evaluator.transform_to_ntt_inplace(pt, p.pid)
            p.evaluator.transform_to_ntt_inplace(ct)
            p.evaluator.multiply_plain_inplace(ct, pt)
            acc = ct if acc is None else (p.evaluator.add_inplace(acc, ct) or acc)
        bound = eng.noise_bound(p.t, 2, params.n)
        flood = eng._flooded(p, bound)
        assert dec.invariant_noise_budget(plain_acc) - dec.invariant_noise_budget(flood) >= params.stat_bits + 13
        mask = eng._uniform(p.t, (params.n,))
        back = eng._files.load(s.Ciphertext, p.ctx, eng._finish(p, acc, p.plain(mask), bound), "test")
        assert back.coeff_modulus_size() == params.return_primes
        assert dec.invariant_noise_budget(back) >= 1
        out = s.Plaintext()
        dec.decrypt(back, out)
        assert np.array_equal(p.slots_of(out).astype(object), (want + mask.astype(object)) % p.t)
    finally:
        eng.close()
