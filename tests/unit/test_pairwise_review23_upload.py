"""Review of session 23's NTT-form uploads (he_upload.py, issue 29): the phase c0 + c1 s of
what a party sends, taken back to coefficient form, is e + Delta'(row) with e SEAL's own
fresh noise (centred binomial 21 - 21: |e| <= he.FRESH_NOISE, variance 10.5), the same
integer polynomial at every prime, and fresh per ciphertext: the bounds that the returned
ciphertexts' flooding (circuit privacy) assumes. A missing or mis-scaled e, or an e reused
across ciphertexts, fails here (the round-trip tests decrypt exactly with e = 0 too)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tenseal")

from crypten_lite.provider import he, he_pow2, he_upload  # noqa: E402,F401
from tests.unit.test_pairwise_he_upload import unit  # noqa: E402,F401 (the engine fixture)


def _noise_of(u, files, data: bytes, row: np.ndarray) -> np.ndarray:
    """e [L, N] (centred) of one upload of `row`, decrypted with the owner's key."""
    ups = u._uploads()
    ct = u.load_ntt(files, data)
    nl, n = len(u.data_moduli), u.n
    view = he_pow2._ct_data(ct, 2, nl, n, writable=True)
    if view is None:
        pytest.skip("SEAL ciphertext layout not known to _ct_data here")
    view = view.reshape(2, nl, n)
    s = ups._secret()
    phase = np.empty((nl, n), dtype=np.uint64)
    for i, q in enumerate(u.data_moduli):
        v = view[0, i] + he_upload.mulmod_vec(view[1, i], s[i], q)
        phase[i] = np.where(v >= q, v - q, v)
    view[0] = phase
    view[1] = phase
    u.evaluator.transform_from_ntt_inplace(ct)
    coeff = he_pow2._ct_data(ct, 2, nl, n).reshape(2, nl, n)[0]
    shift = u.delta(row[None])[:, 0]                  # Delta'(row) at each prime, [L, N]
    out = np.empty((nl, n), dtype=np.int64)
    for i, q in enumerate(u.data_moduli):
        d = (coeff[i].astype(object) - shift[i].astype(object)) % q
        out[i] = np.array([x - q if x > q // 2 else x for x in d], dtype=np.int64)
    return out


def test_upload_noise_is_seals_fresh_noise_same_at_every_prime(unit):
    u, files = unit
    rng = np.random.default_rng(5)
    rows = rng.integers(0, 1 << 64, size=(2, u.n), dtype=np.uint64)
    rows[1] = rows[0]                                 # the same row twice
    sent = u.encrypt_ntt(files, rows)
    es = [_noise_of(u, files, data, rows[j]) for j, data in enumerate(sent)]
    for e in es:
        assert all(np.array_equal(e[0], e[i]) for i in range(1, len(e))), "e differs across primes"
        assert int(np.abs(e[0]).max()) <= he.FRESH_NOISE
        assert abs(float(e[0].mean())) < 0.2 and 9.0 < float(e[0].var()) < 12.0   # 21 / 2
    assert not np.array_equal(es[0][0], es[1][0]), "the same e in two ciphertexts"
