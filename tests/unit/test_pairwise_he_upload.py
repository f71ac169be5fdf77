"""Provider 'pairwise', the Z_2^64 engine's ciphertexts to the peer in NTT form
(provider/he_upload.py): the arithmetic (mulmod_vec, the seed's expansion) is exact and
uniform, an encryption decrypts to its row through the engine's product and return, what the
peer receives is fresh and uniform, the secret key never goes on the wire, a malformed
ciphertext from a peer is refused by both parties, a peer on the former wire is refused at
the handshake, and an unchecked TenSEAL build takes SEAL's load instead of memory."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

pytest.importorskip("tenseal")
pytest.importorskip("nacl")

from crypten_lite.comm.inprocess import InProcessCommunicator, InProcessHub  # noqa: E402
from crypten_lite.config import Config  # noqa: E402
from crypten_lite.errors import ProtocolError  # noqa: E402
from crypten_lite.provider import he, he_pow2, he_upload  # noqa: E402
from crypten_lite.provider.correlations import TRIPLE_OPS  # noqa: E402
from crypten_lite.provider.pairwise import PairwiseProvider  # noqa: E402
from two_party_threads import record_sends, run_both, stop_recording  # noqa: E402


@pytest.fixture(scope="module")
def unit():
    u = he_pow2.Pow2Unit(he.default_params())
    files = he._Files()
    u.peer_key(files, u.keygen(files))
    yield u, files
    files.close()


def _chi2(values: np.ndarray, bins: int) -> float:
    counts = np.bincount(values, minlength=bins)
    expected = counts.sum() / bins
    return float(((counts - expected) ** 2 / expected).sum())


def _round_trip(u, files, rows: np.ndarray) -> np.ndarray:
    """The rows through encrypt_ntt, load_ntt, a product by 1, finish (no mask) and open."""
    rng = np.random.default_rng(1)
    one = np.zeros((1, u.n), dtype=np.uint64)
    one[0, 0] = 1
    pt = u.ntt_plains(files, one)[0]
    out = []
    for data in u.encrypt_ntt(files, rows):
        back = u.finish(files, he._dot(u, [(u.load_ntt(files, data), pt)]), np.zeros(u.n, dtype=np.uint64),
                        u.noise_bound(1, 1), lambda shape: rng.integers(0, 1 << 62, size=shape, dtype=np.uint64))
        out.append(u.open(files, back, list(range(u.n))))
    return np.stack(out)


def test_mulmod_vec_is_exact():
    rng = np.random.default_rng(3)
    for q in he_pow2.moduli()[:-1]:
        x = rng.integers(0, q, size=20000, dtype=np.uint64)
        y = rng.integers(0, q, size=20000, dtype=np.uint64)
        x[:6] = [0, 1, q - 1, q - 1, q - 2, (q - 1) // 2]
        y[:6] = [q - 1, q - 1, q - 1, 1, q - 2, 2]
        got = he_upload.mulmod_vec(x, y, q)
        want = np.array([int(a) * int(b) % q for a, b in zip(x.tolist(), y.tolist())], dtype=np.uint64)
        assert np.array_equal(got, want), q


def test_seed_expansion_is_deterministic_below_each_prime_and_uniform():
    moduli = he_pow2.moduli()[:-1]
    seed = os.urandom(32)
    a = he_upload.expand(seed, moduli, 8192)
    assert np.array_equal(a, he_upload.expand(seed, moduli, 8192))
    assert not np.array_equal(a, he_upload.expand(os.urandom(32), moduli, 8192))
    for i, q in enumerate(moduli):
        assert int(a[i].max()) < q
        # 64 equal buckets of [0, q): chi-square with 63 dof, 0.9999 quantile about 117
        assert _chi2((a[i].astype(np.float64) / q * 64).astype(np.int64), 64) < 117
    # small moduli reject often: the refills from each prime's own nonce, still uniform
    small = he_upload.expand(seed, (5, 17), 20000)
    assert np.array_equal(small, he_upload.expand(seed, (5, 17), 20000))
    assert _chi2(small[0].astype(np.int64), 5) < 30 and _chi2(small[1].astype(np.int64), 17) < 60


def test_noise_is_seals_centred_binomial():
    from crypten_lite.random import PRG
    e = he_upload._noise(PRG(os.urandom(32)), (4, 8192))
    assert int(np.abs(e).max()) <= he.FRESH_NOISE
    assert abs(float(e.mean())) < 0.1 and 9.5 < float(e.var()) < 11.5      # 21 / 2


def test_ntt_form_encryptions_decrypt_to_their_rows(unit):
    u, files = unit
    rng = np.random.default_rng(7)
    for r in (1, 2, 17):                                 # one, two, past one SEAL NTT call
        rows = rng.integers(0, 1 << 64, size=(r, u.n), dtype=np.uint64)
        rows[0, :5] = [0, 1, (1 << 64) - 1, 1 << 63, (1 << 63) - 1]
        assert np.array_equal(_round_trip(u, files, rows), rows)


def test_what_the_peer_receives_is_fresh_and_uniform(unit):
    """The same row twice: different seeds and different c0 (fresh e and a); c0's residues
    are uniform below each prime (chi-square, 63 dof) even for an all-zero row."""
    u, files = unit
    rows = np.zeros((2, u.n), dtype=np.uint64)
    got = u.encrypt_ntt(files, rows)
    assert got[0][:32] != got[1][:32] and got[0][32:] != got[1][32:]
    nl = len(u.data_moduli)
    for data in got:
        c0 = he_pow2.unpack50(data[32:], nl * u.n, "t").reshape(nl, u.n)
        for i, q in enumerate(u.data_moduli):
            assert _chi2((c0[i].astype(np.float64) / q * 64).astype(np.int64), 64) < 117


def test_unchecked_tenseal_loads_through_seal(unit, monkeypatch):
    """Where _ct_data does not know the layout, the NTTs and the loaded ciphertext go through
    SEAL's save and load: the same values (a fresh unit: no template kept)."""
    monkeypatch.setattr(he_pow2, "_LAYOUT_OK", False)
    u = he_pow2.Pow2Unit(he.default_params())
    files = he._Files()
    try:
        u.peer_key(files, u.keygen(files))
        rows = np.random.default_rng(9).integers(0, 1 << 64, size=(2, u.n), dtype=np.uint64)
        assert np.array_equal(_round_trip(u, files, rows), rows)
        assert u._uploads()._template is None
    finally:
        files.close()


def _providers(classes=(PairwiseProvider, PairwiseProvider)):
    hub = InProcessHub(2, timeout=60.0)
    seed = os.urandom(32)
    comms = [InProcessCommunicator(hub, r) for r in range(2)]
    for r, c in enumerate(comms):
        c.pair_seeds = {1 - r: seed}
    cfg = [Config(rank=r, world_size=2, provider="pairwise", session="up") for r in range(2)]
    got = run_both([lambda r=r: classes[r](cfg[r], comms[r]) for r in range(2)], 120, capture=True)
    return comms, got


def _weight_triple(ps, xs=(1, 64), ws=(64, 10)):
    got = run_both([lambda p=p: p.get("weight_mask", [ws]).corrected() for p in ps], 120, capture=True)
    b = got[0][0][0] + got[1][0][0]
    counter = ps[0].counter - 1
    got = run_both([lambda p=p: p.get("weight_triple", [xs, ws], "matmul", (counter,)).corrected() for p in ps],
                   120, capture=True)
    return b, got


def test_secret_key_never_on_the_wire():
    """A kept weight triple (B up in NTT form, products back): neither party's Z_2^64 secret
    key, as 64-bit words or packed at 50 bits, is in anything either party sent."""
    comms, got = _providers()
    ps = [g[0] for g in got]
    try:
        sent = record_sends(comms)
        try:
            b, out = _weight_triple(ps)
        finally:
            stop_recording(comms)
        assert out[0][1] is None and out[1][1] is None, out
        a, c = out[0][0][0] + out[1][0][0], out[0][0][1] + out[1][0][1]
        assert torch.equal(c, TRIPLE_OPS["matmul"](a, b, ()))
        wire = b"".join(sent[0] + sent[1])
        assert len(wire) > 400_000
        for p in ps:
            s = p._engine._mm_units()[0]._uploads()._secret()
            for i in range(s.shape[0]):
                assert s[i, 100:108].astype("<u8").tobytes() not in wire
                assert he_pow2.pack50(s[i, 100:116])[:50] not in wire
    finally:
        for p in ps:
            p.close()


def test_a_malformed_ciphertext_from_the_peer_is_refused_by_both(monkeypatch):
    """Rank 0 sends a kept B whose first coefficient equals its prime (the frame itself
    authentic): rank 1's reader refuses it, and both parties raise ProtocolError."""
    comms, got = _providers()
    ps = [g[0] for g in got]
    real = he_upload.Uploads.encrypt

    def evil(self, files, rows):
        out = real(self, files, rows)
        if self.unit is ps[0]._engine._mm_units()[0]:
            c0 = he_pow2.unpack50(out[0][32:], len(self.moduli) * self.n, "t")
            c0[0] = self.moduli[0]
            out[0] = out[0][:32] + he_pow2.pack50(c0)
        return out
    monkeypatch.setattr(he_upload.Uploads, "encrypt", evil)
    try:
        _, out = _weight_triple(ps)
        for r in range(2):
            assert out[r][0] is None and isinstance(out[r][1], ProtocolError), (r, out[r])
        assert "past its prime" in str(out[1][1])
    finally:
        for p in ps:
            p.close()


def test_a_peer_on_the_former_upload_wire_is_refused_at_the_handshake():
    class Former(PairwiseProvider):
        def _parameters(self):
            params = he.default_params()
            text = params.describe().replace(f";mmup={he_upload.VERSION}", "")
            assert text != params.describe()
            return type("P", (), {"describe": lambda self: text, "n": params.n})()
    _, got = _providers((PairwiseProvider, Former))
    for r in range(2):
        assert isinstance(got[r][1], ProtocolError) and "parameters differ" in str(got[r][1]), got[r]


def test_delta_is_round_q_a_over_2_64_exactly(unit):
    """Pow2Unit.delta (from one 64-bit product, (2^63 - r) 2^-64 mod q_i) against Python's
    integers, at the edges of a and of r = (Ql a + 2^63) mod 2^64 (0, 1, 2^63, 2^64 - 1)."""
    import math
    u, _ = unit
    q = math.prod(u.data_moduli)
    inv = pow(q % (1 << 64), -1, 1 << 64)                # q is odd
    a = np.random.default_rng(11).integers(0, 1 << 64, size=(2, 4096), dtype=np.uint64)
    edges = [0, 1, 2, (1 << 63) - 1, 1 << 63, (1 << 63) + 1, (1 << 64) - 1]
    edges += [(r - (1 << 63)) * inv % (1 << 64) for r in (0, 1, 1 << 63, (1 << 63) + 1, (1 << 64) - 1)]
    a[0, :len(edges)] = edges
    got = u.delta(a)
    for i, m in enumerate(u.data_moduli):
        want = [((q * x + (1 << 63)) >> 64) % m for x in a.reshape(-1).tolist()]
        assert got[i].reshape(-1).tolist() == want, i


def test_delta_and_centred_of_sparse_rows_match_the_dense_computation(unit):
    """Rows mostly zero (a conv kernel's kept rows, a batch-1 linear layer's plaintexts) are
    computed at their nonzeros only: the same values as every element computed, all-zero
    rows included."""
    u, _ = unit
    rng = np.random.default_rng(13)
    for fraction in (0.0, 0.01, 0.3, 0.49, 0.5, 0.9):
        rows = rng.integers(1, 1 << 64, size=(3, 512), dtype=np.uint64)
        rows[rng.random(rows.shape) >= fraction] = 0
        rows[0, :3] = [(1 << 64) - 1, 1 << 63, 1]
        assert np.array_equal(u.delta(rows), u._delta(rows)), fraction
        assert np.array_equal(u.centred(rows), u._centred(rows)), fraction
    zero = np.zeros((2, 64), dtype=np.uint64)
    assert not u.delta(zero).any() and not u.centred(zero).any() and u.delta(zero).shape == (4, 2, 64)


def test_no_rows_encrypt_to_no_ciphertexts(unit):
    """Zero rows: no ciphertext (the noise draw's shape divided by zero rows before)."""
    u, files = unit
    assert list(u.encrypt_ntt(files, np.zeros((0, u.n), dtype=np.uint64))) == []
