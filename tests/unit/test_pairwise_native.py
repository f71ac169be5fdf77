"""Provider pairwise's native OT kernels (crypten_lite/_native, otkernels.c): built where a C
compiler is present, AES-128 (own key expansion, AES-NI) equal to `cryptography`'s, and every
kernel byte-identical to the numpy path it replaces (the TCCR hash, the GGM levels with their
sums, the LPN code, whole silent-OT steps with seeded PRGs: the same wire bytes and COTs), on
random inputs of edge sizes; bad buffers are a TypeError / ValueError; CRYPTEN_LITE_NATIVE=0
and a missing build both give the numpy path (the latter logged once at INFO)."""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import sys
import sysconfig

import numpy as np
import pytest

pytest.importorskip("nacl")

from crypten_lite import _native  # noqa: E402
from crypten_lite.provider import ferret, ot  # noqa: E402
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes  # noqa: E402

SIZES = (0, 1, 3, 4, 7, 8, 9, 33, 1000)


def _compiler() -> bool:
    cc = (sysconfig.get_config_var("CC") or "cc").split()
    return bool(cc) and shutil.which(cc[0]) is not None


def _rand(n: int) -> np.ndarray:
    return np.frombuffer(os.urandom(n), dtype=np.uint8).copy()


def _kernels():
    mod = _native.kernels()
    if mod is None:
        pytest.skip(f"native kernels: {_native.describe()}")
    return mod


def _aes():
    mod = _native.aes()
    if mod is None:
        pytest.skip(f"native AES kernels: {_native.describe()}")
    return mod


@pytest.fixture(params=[True, False], ids=["vaes", "aesni"])
def wide(request):
    """The AES kernels with VAES (AVX-512, where the CPU has it) and with 128-bit AES-NI only."""
    k = _aes()
    was = k.set_wide(request.param)
    yield request.param
    k.set_wide(was)


def test_native_module_is_built_where_a_compiler_is_present():
    """CI has gcc: the README's install (pip install -e '.[test]') must have built it."""
    if not _compiler():
        pytest.skip("no C compiler: the numpy path is the install's (the extension is optional)")
    mod = importlib.import_module("crypten_lite._native._otkernels")
    assert callable(mod.lpn_encode)
    if os.environ.get(_native.ENV, "1") != "0":
        assert _native.kernels() is mod
        assert _native.describe().startswith("native")


def test_aes_ecb_with_own_key_expansion_matches_cryptography():
    k = _aes()
    for m in SIZES:
        for _ in range(3):
            key, src = bytes(_rand(16)), _rand(16 * m)
            out = np.empty_like(src)
            k.aes_ecb(key, src, out)
            want = Cipher(algorithms.AES(key), modes.ECB()).encryptor().update(src.tobytes())
            assert out.tobytes() == want, m
    # FIPS-197 appendix C.1's known answer
    out = np.empty(16, dtype=np.uint8)
    k.aes_ecb(bytes(range(16)), np.frombuffer(bytes.fromhex("00112233445566778899aabbccddeeff"),
                                              dtype=np.uint8), out)
    assert out.tobytes().hex() == "69c4e0d86a7b0430d8cdb78070b4c55a"


def _numpy_hash(monkeypatch):
    monkeypatch.setenv(_native.ENV, "0")
    h = ot._Hash()
    monkeypatch.delenv(_native.ENV)
    assert h._native is None
    return h


def test_tccr_hash_is_byte_identical_to_numpy(monkeypatch, wide):
    ref, nat = _numpy_hash(monkeypatch), ot._Hash()
    assert nat._native is not None
    for m in SIZES + (15, 16, 17, 31, 48, ot._Hash.BLOCK + 5):
        blocks = _rand(16 * m).reshape(m, 16)
        delta = _rand(16)
        for first, domain in ((0, 0), (12345, (1 << 63) | 7), ((1 << 62) + 3, (1 << 61) | 1)):
            kept = blocks.copy()
            a, b = ref(blocks, first, domain), nat(blocks, first, domain)
            assert a.dtype == b.dtype == np.uint64 and np.array_equal(a, b), (m, first)
            assert np.array_equal(ref(blocks, first, domain, xor=delta),
                                  nat(blocks, first, domain, xor=delta))
            assert np.array_equal(blocks, kept)
        # a strided `out` (a column block of a wider array) and a strided input
        wide = np.zeros((m, 4), dtype=np.uint64)
        assert nat(blocks, 9, 3, out=wide[:, 1:3]) is not None
        assert np.array_equal(wide[:, 1:3], ref(blocks, 9, 3)) and not wide[:, [0, 3]].any()
        big = _rand(32 * m).reshape(m, 32)
        assert np.array_equal(nat(big[:, 8:24], 1, 2), ref(big[:, 8:24], 1, 2))


def _expand_numpy(nodes, levels, zero=None):
    """The numpy reference: _Expander + _fold per level, zeroing one node's children per tree."""
    exp = ferret._Expander()
    g = nodes.shape[1]
    rows = np.arange(g)
    folds = []
    for level in range(levels):
        w = nodes.shape[0]
        nodes = exp(nodes)
        if zero is not None:
            nodes[zero[level], rows] = 0
            nodes[w + zero[level], rows] = 0
        folds.append(np.stack([ferret._fold(nodes[:w]), ferret._fold(nodes[w:])], axis=1))
    return nodes, folds


@pytest.mark.parametrize("g", [1, 3, 5, 8, 11, 64])
def test_ggm_levels_and_sums_are_byte_identical_to_numpy(g, wide):
    k = _aes()
    levels = 4
    rng = np.random.default_rng(g)
    roots = np.frombuffer(os.urandom(16 * g), dtype=np.uint64).reshape(1, g, 2)
    zero = [rng.integers(0, 1 << level, size=g).astype(np.int64) for level in range(levels)]
    for zeros in (None, zero):
        want, want_folds = _expand_numpy(roots.copy(), levels, zeros)
        for clear in (False, True):
            buf = np.empty((1 << levels, g, 2), dtype=np.uint64)
            buf[0] = roots[0]
            for level in range(levels):
                folds = np.empty((g, 2, 2), dtype=np.uint64)
                last = clear and level == levels - 1
                k.ggm_level(ferret._KEYS[0], ferret._KEYS[1], buf, 1 << level, g, folds,
                            None if zeros is None else zeros[level], last)
                assert np.array_equal(folds, want_folds[level]), (level, clear)
            expect = want.copy()
            if clear:
                expect[:, :, 0] &= ferret._CLEAR
            assert np.array_equal(buf, expect)


def test_lpn_encode_is_byte_identical_to_numpy():
    k = _kernels()
    table = np.frombuffer(os.urandom(16 * ferret.K), dtype=np.complex128)
    for count in (0, 1, 7, ferret.BLOCK - 1, ferret.BLOCK + 3, 3 * ferret.BLOCK + 1):
        rows = ferret._make_indices(count % 7, count)
        acc = np.frombuffer(os.urandom(16 * count), dtype=np.uint64).reshape(count, 2).copy()
        want = acc.copy()
        ferret._encode(want, table, rows, count)
        bits = np.full(count, 7, dtype=np.uint8)
        k.lpn_encode(acc, table, rows, ferret.D, bits)
        assert np.array_equal(acc, want), count
        assert np.array_equal(bits, (want[:, 0] & np.uint64(1)).astype(np.uint8)), count
    acc = np.zeros((5, 2), dtype=np.uint64)
    k.lpn_encode(acc, table, np.zeros((0, 5), dtype=np.int32), 0)     # d = 0: unchanged
    assert not acc.any()


def test_bad_buffers_are_type_or_value_errors():
    k = _kernels()
    table = np.zeros((16, 2), dtype=np.uint64)
    acc = np.zeros((8, 2), dtype=np.uint64)
    rows = np.zeros((2, 8), dtype=np.int32)
    with pytest.raises(ValueError, match="outside the table"):
        k.lpn_encode(acc, table, np.full((2, 8), 16, dtype=np.int32), 2)
    acc[:] = 5
    with pytest.raises(ValueError, match="outside the table"):
        k.lpn_encode(acc, table, np.full((2, 8), -1, dtype=np.int32), 2)
    assert not acc.any()                                      # no partial result left
    with pytest.raises(ValueError, match="bits"):
        k.lpn_encode(acc, table, rows, 2, np.empty(7, dtype=np.uint8))
    with pytest.raises(ValueError, match="int32"):
        k.lpn_encode(acc, table, rows.astype(np.int64), 2)
    with pytest.raises(ValueError, match="int32"):
        k.lpn_encode(acc, table, rows, 3)                     # rows too short for d
    with pytest.raises(TypeError, match="C-contiguous"):
        k.lpn_encode(np.zeros((8, 4), dtype=np.uint64)[:, :2], table, rows, 2)
    ro = acc.copy()
    ro.flags.writeable = False
    with pytest.raises(TypeError, match="writable"):
        k.lpn_encode(ro, table, rows, 2)
    with pytest.raises(TypeError):
        k.lpn_encode("acc", table, rows, 2)
    if _native.aes() is None:
        return
    out = np.empty((4, 2), dtype=np.uint64)
    with pytest.raises(ValueError, match="16 bytes"):
        k.tccr(b"short", np.zeros(64, np.uint8), out, 0, 0)
    with pytest.raises(ValueError, match="same size"):
        k.tccr(bytes(16), np.zeros(48, np.uint8), out, 0, 0)
    with pytest.raises(ValueError, match="mask"):
        k.tccr(bytes(16), np.zeros(64, np.uint8), out, 0, 0, np.zeros(8, np.uint8))
    with pytest.raises(ValueError, match=r"\[0, 2\^64\)"):
        k.tccr(bytes(16), np.zeros(64, np.uint8), out, -1, 0)
    with pytest.raises(TypeError, match="int"):
        k.tccr(bytes(16), np.zeros(64, np.uint8), out, 1.5, 0)
    buf = np.zeros((4, 3, 2), dtype=np.uint64)
    folds = np.zeros((3, 2, 2), dtype=np.uint64)
    key = ferret._KEYS[0]
    with pytest.raises(ValueError, match="needs"):
        k.ggm_level(key, key, buf, 4, 3, folds, None, False)      # no room for 8 x 3 children
    with pytest.raises(ValueError, match="folds"):
        k.ggm_level(key, key, buf, 2, 3, folds[:2], None, False)
    with pytest.raises(ValueError, match="not a position"):
        k.ggm_level(key, key, buf, 2, 3, folds, np.array([0, 2, 1], dtype=np.int64), False)
    with pytest.raises(ValueError, match="int64"):
        k.ggm_level(key, key, buf, 2, 3, folds, np.array([0, 1, 1], dtype=np.int32), False)
    with pytest.raises(ValueError, match="positive"):
        k.ggm_level(key, key, buf, 0, 3, folds, None, False)


def use_native(native: bool, monkeypatch) -> None:
    """The native kernels (the default) or the numpy path (CRYPTEN_LITE_NATIVE=0)."""
    if native:
        monkeypatch.delenv(_native.ENV, raising=False)
    else:
        monkeypatch.setenv(_native.ENV, "0")


def _run(native: bool, monkeypatch, sizes):
    from tests.unit.test_pairwise_ferret import _seeded_ots, _take
    use_native(native, monkeypatch)
    wire: list = []
    pair = _seeded_ots(False, wire)
    outs = []
    for m in sizes:
        bits, mine, theirs = _take(pair, 1, m)
        # the COT relation M = K ^ x*Delta, x the receiver's bits
        assert np.array_equal(mine, theirs ^ (bits[:, None] * pair[0]._delta[None, :]))
        outs.append((bits, mine, theirs))
    pool = pair[0]._silent[1]
    assert (pool._aes is not None) == native and (pool._kern is not None) == native
    assert (pair[0]._hash._native is not None) == native
    return wire, outs


def test_silent_ot_steps_native_and_numpy_send_the_same_bytes_and_cots(monkeypatch, wide):
    """Seeded PRGs: the same messages in the same order and the same COTs on both paths, across
    an iteration boundary (the reserve made natively bootstraps the next iteration; the
    iteration's last step has 338 trees, not a multiple of 8: VAES's tail)."""
    sizes = (1, 1000, 600_001, ferret.N, 5000)
    wire0, outs0 = _run(False, monkeypatch, sizes)
    wire1, outs1 = _run(True, monkeypatch, sizes)
    assert [(r, len(d)) for r, d in wire0] == [(r, len(d)) for r, d in wire1]
    assert wire0 == wire1
    for a, b in zip(outs0, outs1):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_env_var_forces_numpy_and_a_missing_build_falls_back_logged(monkeypatch, caplog):
    monkeypatch.setenv(_native.ENV, "0")
    assert _native.kernels() is None and _native.aes() is None
    assert "CRYPTEN_LITE_NATIVE=0" in _native.describe()
    assert ot._Hash()._native is None
    monkeypatch.delenv(_native.ENV)
    # a build that is absent: the import fails, the numpy path is taken, logged once at INFO
    monkeypatch.setattr(_native, "_state", {})
    monkeypatch.setitem(sys.modules, "crypten_lite._native._otkernels", None)
    monkeypatch.delattr(_native, "_otkernels", raising=False)
    with caplog.at_level(logging.INFO, logger="crypten_lite._native"):
        assert _native.kernels() is None and _native.aes() is None
        assert _native.kernels() is None
    said = [r for r in caplog.records if r.name == "crypten_lite._native"]
    assert len(said) == 1 and said[0].levelno == logging.INFO
    assert "pip install -e ." in said[0].getMessage() and "C compiler" in said[0].getMessage()
    assert _native.describe().startswith("numpy (native kernels not built")
    h = ot._Hash()
    assert h._native is None
    blocks = _rand(16 * 9).reshape(9, 16)
    assert h(blocks, 0, 1).shape == (9, 2)


def test_transpose_is_byte_identical_to_numpy():
    k = _kernels()
    for rows, nb in ((8, 1), (16, 3), (128, 1), (128, 513), (128, 4097), (1 << 12, 16), (8, 0)):
        a = _rand(rows * nb).reshape(rows, nb)
        assert np.array_equal(ot.transpose(a), ot._transpose(a) if nb else
                              np.empty((0, rows // 8), np.uint8)), (rows, nb)
    keys = _rand(16 * 4096).reshape(4096, 16)
    for take in (1, 2, 7, 16):       # prepare's use: the first `take` bytes of each 16
        want = ot._transpose(np.ascontiguousarray(keys[:, :take]))
        assert np.array_equal(ot.transpose(keys, take), want), take
    out = np.empty((8, 2), dtype=np.uint8)
    with pytest.raises(ValueError, match="multiple"):
        k.transpose(_rand(12), 12, 1, 1, np.empty((8, 1), np.uint8))
    with pytest.raises(ValueError, match="stride"):
        k.transpose(_rand(16), 16, 2, 1, out)
    with pytest.raises(ValueError, match="got"):
        k.transpose(_rand(16), 16, 1, 1, np.empty((8, 3), np.uint8))


def test_kernels_take_buffers_at_any_alignment(wide):
    """Buffers at an odd address (a uint8 array's slice from byte 1) give the same results."""
    k = _aes()
    g, levels = 9, 3

    def odd(n):
        return np.zeros(n + 1, dtype=np.uint8)[1:]
    roots = _rand(16 * g)
    for bufs in ((np.zeros((16 * g) << levels, np.uint8), np.zeros(32 * g, np.uint8)),
                 (odd((16 * g) << levels), odd(32 * g))):
        buf, folds = bufs
        buf[:16 * g] = roots
        for level in range(levels):
            k.ggm_level(ferret._KEYS[0], ferret._KEYS[1], buf, 1 << level, g, folds, None, False)
        got = (buf.copy(), folds.copy())
        if bufs[0].ctypes.data % 16 == 0:
            want = got
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    src, out = odd(16 * 37), odd(16 * 37)
    src[:] = _rand(16 * 37)
    k.tccr(ot._FIXED_KEY, src, out, 3, 4)
    assert np.array_equal(out.view(np.uint64).reshape(-1, 2),
                          ot._Hash()(np.ascontiguousarray(src).reshape(37, 16), 3, 4))
