"""Provider 'pairwise', its oblivious transfer (crypten_lite/provider/ot.py): correlated OT is
correct in both directions and both widths (vectorized, odd lengths), what each party
receives (the extension matrix U, the corrections y) is uniform and fresh, the extension
sender's Delta, the receiver's choice bits and every base-OT key stay off the wire, and a
tampered, replayed or malformed OT message is a ProtocolError on both parties."""

from __future__ import annotations

import os
import queue

import numpy as np
import pytest
import torch

pytest.importorskip("tenseal")
pytest.importorskip("nacl")

from crypten_lite.errors import ProtocolError  # noqa: E402
from crypten_lite.provider import ot  # noqa: E402
from crypten_lite.provider.pairwise import DATA  # noqa: E402
from tests.unit.test_pairwise_security import _both, _pair, _providers  # noqa: E402

CHI2_255 = 400       # chi-square with 255 degrees of freedom: P(> 400) < 1e-8


def _chi2(data: bytes) -> float:
    counts = np.bincount(np.frombuffer(data, dtype=np.uint8), minlength=256)
    expected = counts.sum() / 256
    return float(((counts - expected) ** 2 / expected).sum())


def _ots(spy=None):
    """Two CorrelatedOT objects over queues; spy(rank, data) sees every message sent."""
    boxes = [queue.Queue(), queue.Queue()]

    def make(r):
        def send(data):
            if spy is not None:
                spy(r, data)
            boxes[1 - r].put(data)
        return ot.CorrelatedOT(r, send, lambda: boxes[r].get(timeout=60), os.urandom)
    return [make(0), make(1)]


def _words(n: int) -> np.ndarray:
    return np.frombuffer(os.urandom(8 * n), dtype=np.uint64).copy()


def test_correlated_ot_is_correct_both_ways_and_widths():
    pair = _ots()
    n = 1237                                   # not a multiple of 8 or 128
    bits = _words(n) & np.uint64(1)
    x = _words(n)
    for chooser in (0, 1):
        for width in (64, 1):
            got = _both([lambda r=r: pair[r].product(bits if r == chooser else x, chooser, width)
                         for r in range(2)])
            s0, s1 = got[0][0], got[1][0]
            assert got[0][1] is None and got[1][1] is None, got
            with np.errstate(over="ignore"):
                if width == 64:
                    assert np.array_equal(s0 + s1, bits * x)
                else:
                    assert np.array_equal(s0 ^ s1, bits & x & np.uint64(1))
                    assert set(np.unique(s0).tolist()) <= {0, 1}
    # every share is masked: the chooser's share alone is not the product
    assert not np.array_equal(s0, bits & x & np.uint64(1))
    # a transpose round trip of the 128 x m bit matrix
    rows = np.frombuffer(os.urandom(16 * 40), dtype=np.uint8).reshape(128, 5)
    cols = ot.transpose(rows)
    assert cols.shape == (40, 16)
    back = np.packbits(np.unpackbits(cols, axis=1, bitorder="little").T, axis=1, bitorder="little")
    assert np.array_equal(back, rows)


def test_what_each_party_receives_is_uniform_and_fresh():
    """Fixed inputs (every choice bit 1, every x 0): the sender's U and the receiver's
    corrections y are uniform bytes (chi-square) and different at every call."""
    seen = {0: [], 1: []}
    pair = _ots(lambda r, data: seen[r].append(data))
    _both([lambda r=r: pair[r].setup() for r in range(2)])
    n = 4096
    ones = np.ones(n, dtype=np.uint64)
    zeros = np.zeros(n, dtype=np.uint64)
    runs = []
    for _ in range(2):
        for r in (0, 1):
            seen[r].clear()
        _both([lambda r=r: pair[r].product(ones if r == 1 else zeros, 1, 64) for r in range(2)])
        u, y = seen[1][0], seen[0][0]         # rank 1 chose: it sent U, rank 0 sent y
        assert len(u) == 128 * n // 8 and len(y) == 8 * n
        assert _chi2(u) < CHI2_255 and _chi2(y) < CHI2_255
        runs.append((u, y))
    assert runs[0][0] != runs[1][0] and runs[0][1] != runs[1][1]


def test_no_choice_bits_delta_or_base_keys_on_the_wire(pair):
    comms, (p0, p1) = pair
    sent = {0: [], 1: []}
    reals = [c._send for c in comms]

    def spy(r):
        def send(tensor, dst):
            sent[r].append(tensor.numpy().tobytes())
            reals[r](tensor, dst)
        return send
    for r in range(2):
        comms[r]._send = spy(r)
    try:
        out = _both([lambda p=p: p.get("binary_triple", [(64,)]).corrected() for p in (p0, p1)])
    finally:
        for r in range(2):
            comms[r]._send = reals[r]
    assert out[0][1] is None and out[1][1] is None, out
    wire = b"".join(sent[0] + sent[1])
    assert len(wire) > 64 * 64 * 2 * 16                    # the extension matrices did go out
    a1, b1 = out[1][0][0], out[1][0][1]                    # rank 1's operands: its choice bits
    choice = np.packbits(np.unpackbits(np.concatenate([b1.numpy().view(np.uint8),
                                                       a1.numpy().view(np.uint8)]),
                                       bitorder="little"), bitorder="little").tobytes()
    for i in range(0, len(choice) - 16, 16):
        assert choice[i:i + 16] not in wire
    for p in (p0, p1):
        secrets = [p._seed, p._key, p._ot._delta.tobytes()] + p._ot._keys
        secrets += [k for pair_ in p._ot._pairs for k in pair_]
        for s in secrets:
            assert len(s) >= 16 and s not in wire


def _attack_ot(mutate):
    """Rank 1's first frame of an OT-made request (its extension matrix U) is replaced by
    mutate(frame, provider); both parties must raise ProtocolError, neither hangs."""
    comms = _pair()
    p0, p1 = _providers(comms)
    _both([lambda p=p: p.get("binary_triple", [(8,)]).corrected() for p in (p0, p1)])
    real = comms[1]._send
    state = {"done": False, "first": None}

    def evil(tensor, dst):
        if tensor.numpy()[5] != DATA:                      # acknowledgements pass untouched
            pass
        elif state["first"] is None:
            state["first"] = tensor.numpy().tobytes()
        elif not state["done"]:
            state["done"] = True
            tensor = torch.frombuffer(bytearray(mutate(tensor.numpy().tobytes(), p1, state["first"])),
                                      dtype=torch.uint8)
        real(tensor, dst)
    comms[1]._send = evil
    # first request: recorded (for the replay); second: mutated
    _both([lambda p=p: p.get("bit", [(8,)]).corrected() for p in (p0, p1)])
    out = _both([lambda p=p: p.get("bit", [(8,)]).corrected() for p in (p0, p1)])
    for r in range(2):
        assert out[r][0] is None and isinstance(out[r][1], ProtocolError), (r, out[r])
    return [str(out[r][1]) for r in range(2)]


def test_tampered_ot_message_is_refused_by_both():
    def flip(frame, p, first):
        b = bytearray(frame)
        b[len(b) // 2] ^= 0x40
        return bytes(b)
    assert "integrity" in _attack_ot(flip)[0]


def test_replayed_ot_message_is_refused_by_both():
    assert "replayed" in _attack_ot(lambda frame, p, first: first)[0]


def test_malformed_ot_message_is_refused_by_both():
    def short(frame, p, first):
        p._seq_out -= 1                   # a valid frame (MAC, sequence) with a short matrix
        return p._frame(DATA, b"\x00" * 17)
    assert "extension matrix" in _attack_ot(short)[0]


def test_base_ot_refuses_a_point_outside_the_group():
    box = queue.Queue()
    bad = bytes(32)                            # the identity's encoding is not a valid point
    with pytest.raises(ProtocolError, match="prime-order"):
        ot.base_receive([0, 1], b"t", box.put, lambda: bad, os.urandom)
    with pytest.raises(ProtocolError, match="expected 2 points"):
        ot.base_send(2, b"t", box.put, lambda: b"\x01" * 40, os.urandom)


@pytest.fixture(scope="module")
def pair():
    comms = _pair()
    return comms, _providers(comms)


def test_random_ot_keys_serve_many_transfers_both_ways():
    """One random OT per bit (OTKeys), then transfers of 1, 3 and 130 values per bit: each
    gives XOR shares of c & x, with fresh pads at every use (the same x twice gives
    different messages)."""
    seen = {0: [], 1: []}
    pair = _ots(lambda r, data: seen[r].append(data))
    m = 1001
    c = np.frombuffer(os.urandom(m), dtype=np.uint8) & 1
    for chooser in (0, 1):
        keys = _both([lambda r=r: pair[r].random_ot(c if r == chooser else None, m, chooser)
                      for r in range(2)])
        keys = [k[0] for k in keys]
        xs = [np.frombuffer(os.urandom(g * m), dtype=np.uint8).reshape(g, m) & 1 for g in (1, 3, 130)]
        sent = []
        for x in xs + [xs[1]]:
            g = x.shape[0]
            seen[1 - chooser].clear()
            got = _both([lambda r=r: pair[r].transfer(keys[r], None if r == chooser else x, g)
                         for r in range(2)])
            assert np.array_equal(got[0][0] ^ got[1][0], x & c), (chooser, g)
            sent.append((seen[1 - chooser][0], x))
        assert sent[1][0] != sent[3][0]          # same values, fresh pads
        assert keys[chooser].uses == 4
        # all-zero values: the transfer is still uniform bytes to the chooser
        seen[1 - chooser].clear()
        zero = np.zeros((130, m), dtype=np.uint8)
        _both([lambda r=r: pair[r].transfer(keys[r], None if r == chooser else zero, 130)
               for r in range(2)])
        assert _chi2(seen[1 - chooser][0]) < CHI2_255


def test_prepared_pads_serve_packed_transfers_each_row_once():
    """Random OTs turned into packed pad rows (prepare: the keys' own 128 bits, then hashed
    blocks: 200 rows here), handed out by transfer_packed in uses of 1, 70 and 129 rows: XOR
    shares of c & x on packed bits; a row is never handed out twice (asking past the prepared
    rows is a ProtocolError), and all-zero values still send uniform bytes."""
    seen = {0: [], 1: []}
    pair = _ots(lambda r, data: seen[r].append(data))
    m = 1024
    c = np.frombuffer(os.urandom(m), dtype=np.uint8) & 1
    cp = np.packbits(c, bitorder="little")
    for chooser in (0, 1):
        keys = _both([lambda r=r: pair[r].random_ot(c if r == chooser else None, m, chooser)
                      for r in range(2)])
        keys = [k[0] for k in keys]
        for r in range(2):
            pair[r].prepare(keys[r], 200)
        for g in (1, 70):
            x = np.frombuffer(os.urandom(g * m // 8), dtype=np.uint8).reshape(g, m // 8)
            got = _both([lambda r=r: pair[r].transfer_packed(keys[r], None if r == chooser else x, g)
                         for r in range(2)])
            assert np.array_equal(got[0][0] ^ got[1][0], x & cp), (chooser, g)
        seen[1 - chooser].clear()
        zero = np.zeros((129, m // 8), dtype=np.uint8)
        got = _both([lambda r=r: pair[r].transfer_packed(keys[r], None if r == chooser else zero, 129)
                     for r in range(2)])
        assert np.array_equal(got[0][0] ^ got[1][0], zero)
        assert _chi2(seen[1 - chooser][0]) < CHI2_255
        with pytest.raises(ProtocolError, match="never reused"):
            pair[1 - chooser].transfer_packed(keys[1 - chooser], zero[:1], 1)
        with pytest.raises(ProtocolError, match="packed pads"):
            pair[chooser].transfer(keys[chooser], None, 1)


def test_transpose_is_the_bit_matrix_transpose_in_tiles():
    """ot.transpose against numpy's unpack/transpose/pack, on a matrix wider than one tile
    (the tiled path) and on key bytes (the direction prepare uses)."""
    def reference(rows):
        bits = np.unpackbits(rows, axis=1, bitorder="little")
        return np.packbits(np.ascontiguousarray(bits.T), axis=1, bitorder="little")
    wide = np.frombuffer(os.urandom(128 * (ot._TILE + 24)), dtype=np.uint8).reshape(128, -1)
    assert np.array_equal(ot.transpose(wide), reference(wide))
    keys = np.frombuffer(os.urandom(4096 * 2), dtype=np.uint8).reshape(4096, 2)
    assert np.array_equal(ot.transpose(keys), reference(keys))
