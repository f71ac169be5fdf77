"""The RAM-disk files through which sealapi loads SEAL objects (he._Files): each thread's one
input file is overwritten in place, so a shorter object after a longer one must load as
itself (SEAL reads only the size its header states), a header that does not state the
object's own length is refused before SEAL could read the previous object's stale tail, and
close() leaves nothing behind."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from crypten_lite.errors import ProtocolError
from crypten_lite.provider import he, he_pow2


@pytest.fixture(scope="module")
def unit():
    return he_pow2.Pow2Unit(he.default_params())


def _polys(unit, size: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)   # test data only; the library draws from its PRG
    mods = np.array(unit.data_moduli, dtype=np.uint64)[:, None]
    return np.stack([rng.integers(0, 1 << 50, (len(mods), unit.n), dtype=np.uint64) % mods
                     for _ in range(size)]).reshape(size, -1)


def test_shorter_after_longer_loads_as_itself(unit):
    s = he._sealapi()
    files = he._Files()
    try:
        for size, seed in ((5, 1), (2, 2), (3, 3), (2, 4)):
            polys = _polys(unit, size, seed)
            ct = files.load(s.Ciphertext, unit.ctx, unit._ct_bytes(polys), "ciphertext")
            assert ct.size() == size
            arr = ct.dyn_array()
            for j in (0, 1, polys.size // 2, polys.size - 1):   # SEAL's layout: poly, prime, coeff
                assert arr.at(j) == int(polys.reshape(-1)[j])
    finally:
        files.close()
    assert not os.path.exists(files.dir)


def test_header_not_stating_its_length_is_refused(unit):
    s = he._sealapi()
    files = he._Files()
    try:
        data = unit._ct_bytes(_polys(unit, 3, 5))
        files.load(s.Ciphertext, unit.ctx, data, "ciphertext")            # a longer file first
        short = unit._ct_bytes(_polys(unit, 2, 6))
        for bad in (short + b"\0" * 8, short[:-8], short[:10]):
            with pytest.raises(ProtocolError, match="does not state"):
                files.load(s.Ciphertext, unit.ctx, bad, "ciphertext")
        # a header claiming the longer object's size over the shorter body: refused here,
        # never read from the stale tail of the file
        forged = bytearray(short)
        forged[8:16] = len(data).to_bytes(8, "little")
        with pytest.raises(ProtocolError, match="does not state"):
            files.load(s.Ciphertext, unit.ctx, bytes(forged), "ciphertext")
    finally:
        files.close()


def test_one_input_file_per_thread_all_removed(unit):
    s = he._sealapi()
    files = he._Files()
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for i in range(3):
                polys = _polys(unit, 2 + (seed + i) % 3, 10 * seed + i)
                ct = files.load(s.Ciphertext, unit.ctx, unit._ct_bytes(polys), "ciphertext")
                assert ct.dyn_array().at(polys.size - 1) == int(polys.reshape(-1)[-1])
        except BaseException as e:  # reported below, not lost in the thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert len(files._inputs) == 3
    # nothing on the RAM disk while in use (Linux: read through /proc/self/fd), so a
    # process that dies without close() leaves no operand behind
    if all(path.startswith("/proc/") for _, path in files._inputs):
        assert os.listdir(files.dir) == []
    files.close()
    assert not os.path.exists(files.dir)


@pytest.mark.parametrize("size", [2, 16])
def test_ct_data_matches_seals_own_save(unit, size):
    """he_pow2._ct_data (the NTT'd plaintext rows read in memory) is what SEAL's zstd save
    holds, coefficient for coefficient; a wrong expected shape gives None (the save path)."""
    s = he._sealapi()
    files = he._Files()
    try:
        polys = _polys(unit, size, 7 + size)
        ct = files.load(s.Ciphertext, unit.ctx, unit._ct_bytes(polys), "ciphertext")
        unit.evaluator.transform_to_ntt_inplace(ct)
        got = he_pow2._ct_data(ct, size, len(unit.data_moduli), unit.n)
        body = he_pow2._body(files.dump(ct), he_pow2._HEAD + 8 * polys.size + 4096)
        ref = np.frombuffer(body, dtype="<u8", count=polys.size, offset=he_pow2._HEAD)
        assert got is not None and np.array_equal(got, ref)
        assert not np.array_equal(ref, polys.reshape(-1))          # the NTT did happen
        assert he_pow2._ct_data(ct, size + 1, len(unit.data_moduli), unit.n) is None
        assert he_pow2._ct_data(ct, size, len(unit.data_moduli) - 1, unit.n) is None
    finally:
        files.close()


def test_new_ct_is_written_in_place(unit):
    """he_pow2.Pow2Unit._new_ct: a zero data-level ciphertext whose view writes through to
    SEAL's own coefficients (what the flood term and the plaintext rows are built in)."""
    ct, view = unit._new_ct(3)
    assert ct is not None and view.shape == (3, len(unit.data_moduli), unit.n)
    assert not view.any() and not ct.is_ntt_form()
    view[2, 0, 0] = 12345
    view[1, 0, 0] = 777
    assert ct.data(2) == 12345 and ct.data(1) == 777 and ct.data(0) == 0


def test_unchecked_tenseal_takes_the_save_path(unit, monkeypatch):
    """A TenSEAL build whose object layout was not checked never has its memory read by
    pointer (that could crash before any check): _ct_data gives None, _new_ct no view, and the
    engine's plaintext rows still come out as SEAL's own save has them."""
    s = he._sealapi()
    files = he._Files()
    try:
        polys = _polys(unit, 2, 99)
        ct = files.load(s.Ciphertext, unit.ctx, unit._ct_bytes(polys), "ciphertext")
        assert he_pow2._ct_data(ct, 2, len(unit.data_moduli), unit.n) is not None
        monkeypatch.setattr(he_pow2, "_LAYOUT_OK", False)
        assert he_pow2._ct_data(ct, 2, len(unit.data_moduli), unit.n) is None
        assert unit._new_ct(2)[1] is None
    finally:
        files.close()


def test_an_engine_never_closed_leaves_no_folder():
    """A _Files dropped without close() (a provider discarded, a failed test) removes its
    private folder when collected (and at exit): runs used to leave thousands on /dev/shm."""
    import gc
    import os
    files = he._Files()
    folder = files.dir
    assert os.path.isdir(folder)
    del files
    gc.collect()
    assert not os.path.exists(folder)
