"""The native hash fused with prepare's transpose (otkernels.tccr_rows, ot.random_ots_both's
`pads`): the pad rows byte for byte as the numpy hash + transpose make them (pieces cut at any
OT, under Delta or not, 1..128 rows, VAES and AES-NI, buffers at any address), bad buffers
refused, and random_ots_both with pads giving the same messages and the same pad rows on the
native and the numpy paths as random_ots_both + prepare, the OT relation holding."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("tenseal")
pytest.importorskip("nacl")

from crypten_lite import _native  # noqa: E402
from crypten_lite.provider import ot  # noqa: E402
from tests.unit.test_pairwise_native import _aes, _numpy_hash, wide  # noqa: E402,F401


def _rand(n: int) -> np.ndarray:
    return np.frombuffer(os.urandom(n), dtype=np.uint8).copy()


def _ref_rows(ref, src, first, domain, mask, nrows):
    """The numpy path: hash to [m, 16] keys, then ot._transpose of the bytes used."""
    keys = ref(src, first, domain, xor=mask).view(np.uint8).reshape(-1, 16)
    take = -(-nrows // 8)
    return ot._transpose(np.ascontiguousarray(keys[:, :take]))[:nrows]


def test_tccr_rows_is_byte_identical_to_numpy_hash_and_transpose(monkeypatch, wide):
    k, ref = _aes(), _numpy_hash(monkeypatch)
    rng = np.random.default_rng(7)
    for m in (8, 64, 520, 1000, 4096 + 24):
        src = _rand(16 * m).reshape(m, 16)
        for nrows in (1, 3, 8, 9, 14, 16, 17, 64, 128):
            for mask in (None, _rand(16)):
                first, domain = int(rng.integers(0, 1 << 62)), (1 << 63) | 5
                want = _ref_rows(ref, src, first, domain, mask, nrows)
                cuts = sorted({0, m, *(int(c) for c in rng.integers(0, m, 4))})
                rows = np.full((nrows, m // 8), 0xA5, dtype=np.uint8)   # every bit written
                for a, b in zip(cuts, cuts[1:]):
                    k.tccr_rows(ot._FIXED_KEY, np.ascontiguousarray(src[a:b]), rows, first + a,
                                domain, mask, a, nrows)
                assert np.array_equal(rows, want), (m, nrows, cuts, mask is None)


def test_tccr_rows_leaves_other_bits_and_takes_odd_addresses(wide):
    k = _aes()

    def odd(n):
        return np.zeros(n + 1, dtype=np.uint8)[1:]
    m, nrows = 40, 11
    src = odd(16 * 13)
    src[:] = _rand(16 * 13)
    rows = odd(nrows * (m // 8))
    rows[:] = 0xFF
    k.tccr_rows(ot._FIXED_KEY, src, rows, 3, 4, None, 5, nrows)   # OTs 5 .. 17 of 40
    full = np.zeros((nrows, m // 8), dtype=np.uint8)
    k.tccr_rows(ot._FIXED_KEY, np.ascontiguousarray(src), full, 3, 4, None, 5, nrows)
    bits = np.unpackbits(rows.reshape(nrows, -1), axis=1, bitorder="little")
    ref = np.unpackbits(full, axis=1, bitorder="little")
    assert np.array_equal(bits[:, 5:18], ref[:, 5:18])
    assert bits[:, :5].all() and bits[:, 18:].all()                  # untouched
    assert not ref[:, :5].any() and not ref[:, 18:].any()


def test_tccr_rows_refuses_bad_buffers():
    k = _aes()
    key, src = ot._FIXED_KEY, np.zeros(16 * 8, np.uint8)
    rows = np.zeros((3, 1), np.uint8)
    with pytest.raises(ValueError, match="nrows"):
        k.tccr_rows(key, src, rows, 0, 0, None, 0, 0)
    with pytest.raises(ValueError, match="nrows"):
        k.tccr_rows(key, src, np.zeros((129, 1), np.uint8), 0, 0, None, 0, 129)
    with pytest.raises(ValueError, match="8 W"):
        k.tccr_rows(key, src, rows, 0, 0, None, 1, 3)                # 8 OTs from bit 1 of 8
    with pytest.raises(ValueError, match="8 W"):
        k.tccr_rows(key, src, rows, 0, 0, None, -1, 3)
    with pytest.raises(ValueError, match="nrows"):
        k.tccr_rows(key, src, np.zeros(7, np.uint8), 0, 0, None, 0, 3)   # not 3 rows
    with pytest.raises(ValueError, match="16-byte"):
        k.tccr_rows(key, src[:20], rows, 0, 0, None, 0, 3)
    with pytest.raises(ValueError, match="mask"):
        k.tccr_rows(key, src, rows, 0, 0, np.zeros(8, np.uint8), 0, 3)
    with pytest.raises(ValueError, match="16 bytes"):
        k.tccr_rows(b"short", src, rows, 0, 0, None, 0, 3)
    ro = rows.copy()
    ro.flags.writeable = False
    with pytest.raises(TypeError, match="writable"):
        k.tccr_rows(key, src, ro, 0, 0, None, 0, 3)
    with pytest.raises(ValueError, match=r"\[0, 2\^64\)"):
        k.tccr_rows(key, src, rows, -1, 0, None, 0, 3)


SIZES = ([1000, 64, 70_000, 8, 333, 40_960], [4096, 200_000, 136])
PADS = ([3, None, 14, 1, None, 2], [128, 130, 6])     # 130: two blocks (prepare's own path)


def _made(native: bool, monkeypatch, fused: bool):
    from tests.unit.test_pairwise_ferret import _seeded_ots
    from tests.unit.test_pairwise_native import use_native
    from tests.unit.test_pairwise_security import _both
    use_native(native, monkeypatch)
    wire: list = []
    pair = _seeded_ots(False, wire)
    assert (pair[0]._hash._native is not None) == native
    out = []
    for _ in range(2):                  # the second call's OTs start inside a pool's step
        if fused:
            got = _both([lambda r=r: pair[r].random_ots_both(SIZES, PADS) for r in range(2)])
        else:
            got = _both([lambda r=r: pair[r].random_ots_both(SIZES) for r in range(2)])
        assert all(e is None for _, e in got), got
        keys = [g for g, _ in got]
        if not fused:
            for r in (0, 1):
                for c in (0, 1):
                    for key, g in zip(keys[r][c], PADS[c]):
                        if g:
                            pair[r].prepare(key, g)
        out.append(keys)
    return wire, out


def test_random_ots_both_with_pads_matches_prepare_on_both_paths(monkeypatch):
    if _native.aes() is None:
        pytest.skip(f"native AES kernels: {_native.describe()}")
    runs = [_made(n, monkeypatch, f) for n, f in ((True, True), (False, True), (True, False))]
    wire0 = runs[0][0]
    for wire, _ in runs[1:]:
        assert wire == wire0                                 # the same messages, same order
    for call in range(2):
        for c in (0, 1):
            for j, g in enumerate(PADS[c]):
                sets = [run[1][call][r][c][j] for run in runs for r in (0, 1)]
                if not g:                                    # kept as keys: the same keys
                    assert all(s.rows is None for s in sets)
                    for r in (0, 1):
                        for s in sets[2 + r::2]:
                            assert all(np.array_equal(a, b) for a, b in
                                       zip(s.keys, sets[r].keys))
                    continue
                for s in sets:
                    assert s.keys is None and s.choice is None and s.bits == g and s.offset == 0
                    assert s.rows[0].shape == (g, SIZES[c][j] // 8)
                for r in (0, 1):
                    for s in sets[2 + r::2]:
                        assert all(np.array_equal(a, b) for a, b in zip(s.rows, sets[r].rows))
                ch, other = sets[c], sets[1 - c]             # pad_c = pad0 ^ c & (pad0 ^ pad1)
                assert np.array_equal(ch.rows[0], other.rows[0] ^ (other.rows[1] & ch.rows[1]))
                assert other.rows[1].any()
