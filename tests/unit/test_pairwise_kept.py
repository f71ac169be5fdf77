"""Provider 'pairwise', kept weight ciphertexts (provider/he_kept.py): a weight triple's B is
the model's fixed weight mask, so each party's B share is encrypted and sent once and the
peer keeps it; per inference only the fresh A is encoded, multiplied and sent back. Two
in-process parties (threads, no gRPC): the triples of two inferences on one kept B are
correct (C = op(A, B) against torch) and fresh, the second moves no kept ciphertexts (fewer
bytes, one message each way), and a tampered or replayed kept-B message is a ProtocolError
on both parties."""

from __future__ import annotations

import os
import struct

import pytest
import torch

pytest.importorskip("tenseal")
pytest.importorskip("nacl")

from crypten_lite.comm.inprocess import InProcessCommunicator, InProcessHub  # noqa: E402
from crypten_lite.config import Config  # noqa: E402
from crypten_lite.errors import ProtocolError  # noqa: E402
from crypten_lite.provider import he, he_kept  # noqa: E402
from crypten_lite.provider.correlations import TRIPLE_OPS  # noqa: E402
from crypten_lite.provider.pairwise import PairwiseProvider  # noqa: E402
from two_party_threads import run_both  # noqa: E402

CONV = (1, 1, 1, 1, 1, 1, 1)        # stride 1, padding 1, dilation 1, groups 1
CONV_S = (2, 1, 0, 2, 1, 1, 1)      # stride (2, 1), padding (0, 2)


def _pair():
    hub = InProcessHub(2, timeout=60.0)
    seed = os.urandom(32)
    comms = [InProcessCommunicator(hub, r) for r in range(2)]
    for r, c in enumerate(comms):
        c.pair_seeds = {1 - r: seed}
    cfg = [Config(rank=r, world_size=2, provider="pairwise", session="kept") for r in range(2)]
    got = run_both([lambda r=r: PairwiseProvider(cfg[r], comms[r]) for r in range(2)], 120, capture=True)
    assert got[0][1] is None and got[1][1] is None, got
    return comms, [g[0] for g in got]


def _both(providers, fn):
    got = run_both([lambda p=p: fn(p) for p in providers], 120, capture=True)
    return got


def _moved(p) -> int:
    return p.stats["pairwise_bytes_sent"] + p.stats["pairwise_bytes_received"]


@pytest.fixture(scope="module")
def pair():
    comms, providers = _pair()
    yield comms, providers
    for p in providers:
        p.close()


@pytest.mark.parametrize("op,xs,ws,params", [
    ("matmul", (1, 256), (256, 120), ()),          # LeNet's fc1 at batch 1
    ("linear", (2, 3, 20), (7, 20), ()),           # leading dimensions folded into m
    ("conv2d", (1, 2, 6, 6), (3, 2, 3, 3), CONV),  # direct layout, padding
    ("conv2d", (2, 1, 7, 5), (4, 1, 2, 3), CONV_S),
    ("conv1d", (2, 4, 11), (6, 4, 3), (2, 1, 1, 1)),                    # height-1 conv2d
    ("conv1d", (1, 4, 9), (4, 2, 3), (1, 0, 2, 2)),                     # dilation 2, groups 2
    ("conv2d", (1, 4, 6, 5), (6, 2, 3, 3), (1, 1, 1, 1, 1, 1, 2)),      # groups 2: a stack
    ("conv2d", (2, 6, 7, 7), (6, 1, 3, 3), (2, 2, 1, 1, 1, 1, 6)),      # depthwise, stride 2
    ("conv_transpose2d", (1, 4, 5, 5), (4, 3, 3, 3), (2, 2, 1, 1, 1, 1, 1, 1, 1)),
    ("conv_transpose2d", (2, 4, 4, 3), (4, 2, 2, 3), (1, 2, 0, 1, 0, 1, 1, 2, 2)),  # groups 2
    # padding exactly at the kernel's reach (nothing before), output_padding allowed by the
    # dilation (stride 1 on that axis), batch 3 (review: each an edge of the conv2d it becomes)
    ("conv_transpose2d", (3, 3, 5, 4), (3, 2, 3, 2), (1, 2, 4, 0, 1, 1, 2, 1, 1)),
    ("matmul", (2, 768), (768, 768), ()),         # past KEEP_MAX_CTS: B in column slices
])
def test_kept_weight_across_two_inferences(pair, op, xs, ws, params):
    """One weight mask, two weight triples: both satisfy C = op(A, B) exactly in Z_2^64, A and
    C differ between them (fresh), B was kept after the first (the cache holds one entry for
    it) and the second moves fewer bytes (no kept ciphertexts go up again)."""
    comms, (p0, p1) = pair
    got = _both((p0, p1), lambda p: p.get("weight_mask", [ws]).corrected())
    b = got[0][0][0] + got[1][0][0]
    counter = p0.counter - 1
    assert he_kept.fits(p0._engine, op, xs, ws, params, p0._chunk)
    seen, moved = [], []
    for _ in range(2):
        before = _moved(p0)
        got = _both((p0, p1), lambda p: p.get("weight_triple", [xs, ws], op, (counter, *params)).corrected())
        assert got[0][1] is None and got[1][1] is None, got
        moved.append(_moved(p0) - before)
        a = got[0][0][0] + got[1][0][0]
        c = got[0][0][1] + got[1][0][1]
        assert torch.equal(c, TRIPLE_OPS[op](a, b, params)), op
        seen.append((a, got[0][0][1]))
        assert any(k[0] == counter for k in p0._kept) and any(k[0] == counter for k in p1._kept)
    assert not torch.equal(seen[0][0], seen[1][0]) and not torch.equal(seen[0][1], seen[1][1])
    assert moved[1] < moved[0]


def test_an_op_without_a_kept_layout_is_made_as_before(pair):
    """A conv_transpose2d whose padding passes its kernel's reach has no kept layout (its
    conv2d form would crop): the triple is made as any (exact), nothing is kept."""
    comms, (p0, p1) = pair
    xs, ws, params = (1, 2, 5, 4), (2, 3, 2, 2), (2, 1, 2, 1, 0, 0, 1, 1, 1)   # padding 2 > kernel 2 - 1
    assert not he_kept.fits(p0._engine, "conv_transpose2d", xs, ws, params, p0._chunk)
    got = _both((p0, p1), lambda p: p.get("weight_mask", [ws]).corrected())
    b = got[0][0][0] + got[1][0][0]
    counter = p0.counter - 1
    before = len(p0._kept)
    got = _both((p0, p1), lambda p: p.get("weight_triple", [xs, ws], "conv_transpose2d",
                                          (counter, *params)).corrected())
    a, c = got[0][0][0] + got[1][0][0], got[0][0][1] + got[1][0][1]
    assert torch.equal(c, TRIPLE_OPS["conv_transpose2d"](a, b, params)) and len(p0._kept) == before


ATTACKED = [("matmul", (1, 64), (64, 10), ()),
            ("conv1d", (1, 4, 30), (6, 4, 3), (1, 1, 1, 1)),
            ("conv2d", (1, 4, 6, 5), (6, 2, 3, 3), (1, 1, 1, 1, 1, 1, 2)),          # a stack
            ("conv_transpose2d", (1, 4, 5, 5), (4, 3, 3, 3), (2, 2, 1, 1, 1, 1, 1, 1, 1)),
            ("matmul", (1, 768), (768, 768), ())]                                 # column slices


def _attack(mutate, layer=ATTACKED[0]):
    """Rank 0's frame carrying its kept B ciphertexts (the first DATA frame of the first
    weight triple) is replaced by mutate(frame, recorded); both parties must raise
    ProtocolError, and neither keeps anything from it."""
    comms, (p0, p1) = _pair()
    op, xs, ws, params = layer
    assert he_kept.fits(p0._engine, op, xs, ws, params, p0._chunk), layer
    _both((p0, p1), lambda p: p.get("weight_mask", [ws]).corrected())
    counter = p0.counter - 1
    real = comms[0]._send
    frames: list = []

    def record(tensor, dst):
        frames.append(tensor.numpy().tobytes())
        real(tensor, dst)
    comms[0]._send = record
    _both((p0, p1), lambda p: p.get("triple", [(8,), (8,)], "mul").corrected())   # an earlier exchange
    state = {"done": False}

    def evil(tensor, dst):
        data = tensor.numpy().tobytes()
        if not state["done"] and len(data) > 100_000:       # the kept B ciphertexts
            state["done"] = True
            tensor = torch.frombuffer(bytearray(mutate(data, frames)), dtype=torch.uint8)
        real(tensor, dst)
    comms[0]._send = evil
    out = _both((p0, p1), lambda p: p.get("weight_triple", [xs, ws], op, (counter, *params)).corrected())
    assert state["done"]
    for r in range(2):
        assert out[r][0] is None and isinstance(out[r][1], ProtocolError), (r, out[r])
    assert not any(k[0] == counter for k in p1._kept)
    for p in (p0, p1):
        p.close()
    return [str(out[r][1]) for r in range(2)]


@pytest.mark.parametrize("layer", ATTACKED, ids=lambda x: f"{x[0]}{x[2]}")
def test_tampered_kept_weight_message_is_refused_by_both(layer):
    def flip(frame, frames):
        b = bytearray(frame)
        b[len(b) // 2] ^= 0x01
        return bytes(b)
    assert "integrity" in _attack(flip, layer)[1]


@pytest.mark.parametrize("layer", ATTACKED, ids=lambda x: f"{x[0]}{x[2]}")
def test_replayed_kept_weight_message_is_refused_by_both(layer):
    """An earlier frame of rank 0 (valid MAC, old sequence number) in place of its kept B."""
    msgs = _attack(lambda frame, frames: frames[0], layer)
    assert "replayed" in msgs[1] or "sequence" in msgs[1]


def test_kept_matmul_blocks_return_one_ciphertext_for_lenet():
    """LeNet's linear layers at batch 1 come back in one ciphertext each (A as plaintext: the
    k blocks are summed in the ciphertexts), their kept B in 4, 2 and 1; conv2's kernel in 3,
    its product in one."""
    for (k, n), kept in (((256, 120), 4), ((120, 84), 2), ((84, 10), 1)):
        enc = he_kept._Matmul(1, k, n, he.N, he_kept._matmul_blocks(1, k, n, he.N))
        assert (enc.back, enc.kept) == (1, kept), (k, n)
    # batch 64: the kept B's upload spread over two inferences keeps a first inference about
    # as dear as a fresh A's product (fc1: 32 kept, not 64; conv2: 24 kernel blocks, not 48)
    enc = he_kept._Matmul(64, 256, 120, he.N, he_kept._matmul_blocks(64, 256, 120, he.N))
    assert (enc.kept, enc.back) == (32, 16)
    lay = he_kept._conv_layout((64, 6, 12, 12), (16, 6, 5, 5), (1, 1), he.N)
    assert (lay.plaintexts(), lay.ciphertexts()) == (24, (30, 20))
    lay = he_kept._conv_layout((1, 6, 12, 12), (16, 6, 5, 5), (1, 1), he.N)
    assert (lay.plaintexts(), lay.ciphertexts()) == (3, (3, 1))


def test_prefetch_makes_kept_weight_triples_in_one_exchange():
    """A loaded model's later inference: the plan's weight triples whose B is kept are made in
    one exchange (one message of products each way and one acknowledgement: two frames from
    party 0 instead of two per triple), each still exact and fresh."""
    comms, ps = _pair()
    layers = [("matmul", (1, 64), (64, 10), ()), ("conv2d", (1, 1, 8, 8), (2, 1, 3, 3), CONV)]
    masks = []
    for op, xs, ws, params in layers:
        got = _both(ps, lambda p: p.get("weight_mask", [ws]).corrected())
        counter = ps[0].counter - 1
        masks.append((counter, got[0][0][0] + got[1][0][0]))
        _both(ps, lambda p: p.get("weight_triple", [xs, ws], op, (counter, *params)).corrected())
    plan = [("weight_triple", op, [xs, ws], (counter, *params))
            for (op, xs, ws, params), (counter, _) in zip(layers, masks)]
    frames = ps[0]._seq_out
    got = _both(ps, lambda p: p.prefetch(plan))
    assert got[0][1] is None and got[1][1] is None, got
    assert ps[0]._seq_out - frames == 2 and ps[0].by_kind["weight_triple batch"][0] == 2  # products, ACK
    for (op, xs, ws, params), (counter, b) in zip(layers, masks):
        got = _both(ps, lambda p: p.get("weight_triple", [xs, ws], op, (counter, *params)).corrected())
        a, c = got[0][0][0] + got[1][0][0], got[0][0][1] + got[1][0][1]
        assert torch.equal(c, TRIPLE_OPS[op](a, b, params)), op
    assert ps[0].stats["prefetched"] == 2
    for p in ps:
        p.close()


def test_prefetch_makes_a_fresh_models_weight_triples_in_one_exchange():
    """A model's first inference (no B kept yet): the plan's weight triples go in one
    exchange too (party 0 sends its B shares of both layers in one message, the products in
    one, one acknowledgement: three frames, where each triple alone sent three), the B shares
    are kept for the next inference, and every triple is exact."""
    comms, ps = _pair()
    layers = [("matmul", (1, 64), (64, 10), ()), ("conv2d", (1, 1, 8, 8), (2, 1, 3, 3), CONV),
              ("matmul", (1, 84), (84, 10), ())]
    masks = []
    for op, xs, ws, params in layers:
        got = _both(ps, lambda p: p.get("weight_mask", [ws]).corrected())
        masks.append((ps[0].counter - 1, got[0][0][0] + got[1][0][0]))
    _both(ps, lambda p: p.get("triple", [(1, 8), (8, 3)], "matmul").corrected())   # the HE keys
    plan = [("weight_triple", op, [xs, ws], (counter, *params))
            for (op, xs, ws, params), (counter, _) in zip(layers, masks)]
    plan.append(plan[0])                 # the same layer twice: its B goes up once
    frames = ps[0]._seq_out
    got = _both(ps, lambda p: p.prefetch(plan))
    assert got[0][1] is None and got[1][1] is None, got
    assert ps[0]._seq_out - frames == 3 and ps[0].by_kind["weight_triple batch"][0] == 4
    assert all(sum(k[0] == counter for k in p._kept) == 1 for p in ps for counter, _ in masks)
    for (op, xs, ws, params), (counter, b) in zip(layers + layers[:1], masks + masks[:1]):
        got = _both(ps, lambda p: p.get("weight_triple", [xs, ws], op, (counter, *params)).corrected())
        a, c = got[0][0][0] + got[1][0][0], got[0][0][1] + got[1][0][1]
        assert torch.equal(c, TRIPLE_OPS[op](a, b, params)), op
    assert ps[0].stats["prefetched"] == 4
    for p in ps:
        p.close()


def test_kept_layouts_flood_fits_the_noise_room():
    """The returned ciphertext's noise is the kept B's encryption error times A's plaintext:
    every kept layout keeps products x A's nonzero coefficients within he_pow2.MAX_TERMS, so
    its flood fits (Pow2Unit.room), the limit itself included; a layout past it is not kept."""
    from crypten_lite.provider import he_pow2
    unit = he_pow2.Pow2Unit(he.default_params())
    shapes = [("matmul", (1, 256), (256, 120), ()), ("matmul", (64, 256), (256, 120), ()),
              ("linear", (128, 768), (768, 768), ()), ("conv2d", (1, 1, 28, 28), (6, 1, 5, 5), CONV),
              ("conv2d", (1, 6, 12, 12), (16, 6, 5, 5), CONV), ("conv2d", (64, 6, 12, 12), (16, 6, 5, 5), CONV),
              # the stacks and reshapes: their sub-layouts' products and A's nonzero coefficients
              ("conv1d", (4, 16, 200), (32, 16, 5), (1, 2, 1, 1)),
              ("conv2d", (2, 32, 14, 14), (32, 1, 3, 3), (1, 1, 1, 1, 1, 1, 32)),     # depthwise
              ("conv2d", (1, 16, 16, 16), (32, 4, 3, 3), (2, 2, 1, 1, 1, 1, 4)),
              ("conv_transpose2d", (1, 16, 8, 8), (16, 8, 4, 4), (2, 2, 1, 1, 0, 0, 1, 1, 1)),
              ("matmul", (1, 768), (768, 3072), ()), ("matmul", (32, 768), (768, 768), ())]
    for op, xs, ws, params in shapes:
        plan = he_kept._plan(op, xs, ws, params, he.N)
        if plan is None:
            assert op in ("linear", "matmul") and xs[0] > 1, (op, xs, ws)   # not kept: costs more
            continue
        enc = plan[0]
        _, nonzero = enc.pairs(0, [None] * enc.kept, [None] * 10 ** 5)
        assert enc.terms() * nonzero <= he_pow2.MAX_TERMS, (op, xs, ws)
        bound = unit.noise_bound(enc.terms(), nonzero)
        unit.room(unit.params.flood_bits(bound), bound)
    bound = unit.noise_bound(1, he_pow2.MAX_TERMS)
    unit.room(unit.params.flood_bits(bound), bound)
    assert he_kept._plan("conv2d", (1, 3, 90, 90), (8, 3, 7, 7), CONV, he.N) is None


def test_large_weights_are_kept_in_column_slices_where_that_costs_less():
    """A weight past KEEP_MAX_CTS kept ciphertexts (BERT-base's 768 x 768 and 768 x 3072) is
    kept as a stack of column slices, each within KEEP_MAX_CTS, where its work per inference
    (the cost model's units, the upload over two inferences) is below a fresh A's product:
    at a few rows, not at BERT's seq 128 (768 ciphertexts back): that one is made as before."""
    for m, k, n in ((1, 768, 768), (1, 768, 3072), (1, 3072, 768), (8, 768, 768)):
        enc = he_kept._plan("matmul", (m, k), (k, n), (), he.N)[0]
        assert isinstance(enc, he_kept._Stack) and enc.sub.kept <= he_kept.KEEP_MAX_CTS
        assert enc.kept > he_kept.KEEP_MAX_CTS and enc.kept <= he_kept.KEEP_TOTAL_CTS
        assert he_kept._kept_cost(enc) < he_kept._fresh_cost(m, k, n, he.N), (m, k, n)
    assert he_kept._plan("matmul", (128, 768), (768, 768), (), he.N) is None


def test_a_peer_without_kept_weights_is_refused_at_the_handshake():
    """A peer of the former encodings (one output channel per returned ciphertext, no kept
    weight ciphertexts) would make its weight triples another way: both parties get a
    ProtocolError at the handshake, before any ciphertext."""
    class Former(PairwiseProvider):
        def _encodings(self):
            return "convlayout=cb-v1;weights=none"
    hub = InProcessHub(2, timeout=60.0)
    seed = os.urandom(32)
    comms = [InProcessCommunicator(hub, r) for r in range(2)]
    for r, c in enumerate(comms):
        c.pair_seeds = {1 - r: seed}
    cfg = [Config(rank=r, world_size=2, provider="pairwise", session="kept") for r in range(2)]
    out = run_both([lambda: PairwiseProvider(cfg[0], comms[0]), lambda: Former(cfg[1], comms[1])], 120,
                   capture=True)
    for r in range(2):
        assert isinstance(out[r][1], ProtocolError) and "parameters differ" in str(out[r][1]), out[r]


def test_kept_products_received_are_uniform_and_fresh():
    """Fixed operands (every A and B all ones, the same B kept for both calls): what each
    party keeps is uniform bytes (chi-square, 255 dof: below 400, which a uniform sample
    exceeds with probability about 1e-8) and
    different at each call, and the shares add up to the cross terms (2 k per output)."""
    import queue

    import numpy as np

    from crypten_lite.random import PRG
    boxes = [queue.Queue(), queue.Queue()]

    def engine(r):
        prg = PRG(os.urandom(32))
        return he.CrossEngine(r, he.default_params(), lambda d, r=r: boxes[1 - r].put(d),
                              lambda r=r: boxes[r].get(timeout=120),
                              lambda shape: prg.draw(tuple(shape)).numpy().view(np.uint64))
    engines = [engine(0), engine(1)]
    caches = [{}, {}]
    ones_a, ones_b = np.ones((64, 64), dtype=np.uint64), np.ones((64, 64), dtype=np.uint64)
    calls = []
    for _ in range(2):
        got = run_both([lambda r=r: he_kept.cross_many(engines[r], caches[r], 1 << 30,
                                                       [(7, "matmul", ones_a, ones_b, ())])[0]
                        for r in range(2)], 120)
        with np.errstate(over="ignore"):
            assert np.all(got[0] + got[1] == 128)
        calls.append(got)
    assert len(caches[0]) == 1 and len(caches[1]) == 1
    for r in range(2):
        assert not np.array_equal(calls[0][r], calls[1][r])
        for c in calls:
            counts = np.bincount(np.frombuffer(c[r].tobytes(), dtype=np.uint8), minlength=256)
            expected = counts.sum() / 256
            assert float(((counts - expected) ** 2 / expected).sum()) < 400
    for e in engines:
        e.close()


def test_output_extraction_opens_exactly_and_sends_only_the_outputs():
    """finish(..., keep=where) sends c0 at the output coefficients only (c1 whole): opened by
    its owner it gives A + R exactly at every kept coefficient (edge values included), in
    about half the bytes of the whole ciphertext for few outputs; a payload of the wrong size
    (truncated, or opened with other positions) is a ProtocolError, never a wrong value."""
    import numpy as np

    from crypten_lite.provider import he_pow2
    from crypten_lite.random import PRG
    prg = PRG(os.urandom(32))

    def rand(shape):
        return prg.draw(tuple(shape)).numpy().view(np.uint64)
    u = he_pow2.Pow2Unit(he.default_params())
    files = he._Files()
    u.peer_key(files, u.keygen(files))
    nd = u.n
    where = sorted({0, 1, 5, 63, 64, 4095, nd - 1} | set(range(200, 320)))
    edges = np.array([0, 1, (1 << 64) - 1, 1 << 63, (1 << 63) - 1, 1 << 24, (1 << 40) - 1],
                     dtype=np.uint64)
    rows, masks = rand((1, nd)), rand((1, nd))
    rows[0, where[:edges.size]] = edges
    masks[0, where[:edges.size]] = 0
    with np.errstate(over="ignore"):
        want = (rows + masks)[0, where]
    ct = files.load(he._sealapi().Ciphertext, u.ctx, u.encrypt_rows(files, rows)[0], "t")
    u.evaluator.transform_to_ntt_inplace(ct)
    one = np.zeros((1, nd), dtype=np.uint64)
    one[0, 0] = 1
    pt = u.ntt_plains(files, one)[0]
    whole = u.finish(files, he._dot(u, [(ct, pt)]), masks[0], u.noise_bound(1, 1), rand)
    extracted = u.finish(files, he._dot(u, [(ct, pt)]), masks[0], u.noise_bound(1, 1), rand, where)
    assert np.array_equal(u.open(files, whole, where), want)
    assert np.array_equal(u.open_extracted(files, extracted, where), want)
    assert len(extracted) < 0.6 * len(whole), (len(extracted), len(whole))
    with pytest.raises(ProtocolError):
        u.open_extracted(files, extracted[:len(extracted) // 2], where)
    with pytest.raises(ProtocolError):
        u.open_extracted(files, extracted, where[:-1])
    with pytest.raises(ProtocolError):                  # oversized
        u.open_extracted(files, extracted + bytes(25), where)
    level = u.params.mm_return
    vals = he_pow2.unpack50(extracted, level * (len(where) + nd), "t")
    for at in (3, level * len(where) + 3):              # a c0 (output) and a c1 coefficient
        bad = vals.copy()                               # at its prime: 50 bits hold it
        bad[at] = u.data_moduli[0]
        with pytest.raises(ProtocolError, match="malformed"):
            u.open_extracted(files, he_pow2.pack50(bad), where)
    files.close()


def test_products_share_returned_ciphertexts_side_by_side():
    """Products whose spans fit side by side come back summed in one ciphertext (each at its
    own offset, never meeting nor wrapping, noise within MAX_TERMS): LeNet b1's five kept
    products in four ciphertexts (conv1's and fc3's together), a depthwise conv's 32 groups
    in 3; exactness of packed products: test_kept_weight_across_two_inferences (depthwise)
    and test_prefetch_makes_kept_weight_triples_in_one_exchange (two layers)."""
    lenet = [("conv2d", (1, 1, 28, 28), (6, 1, 5, 5), (1, 1, 0, 0, 1, 1, 1)),
             ("conv2d", (1, 6, 12, 12), (16, 6, 5, 5), (1, 1, 0, 0, 1, 1, 1)),
             ("matmul", (1, 256), (256, 120), ()), ("matmul", (1, 120), (120, 84), ()),
             ("matmul", (1, 84), (84, 10), ())]
    encs = [he_kept._plan(op, xs, ws, p, he.N)[0] for op, xs, ws, p in lenet]
    bins = he_kept._bins(encs, he.N)
    assert sorted(len(b) for b in bins) == [1, 1, 1, 2] and [(0, 0, 0), (4, 0, 5400)] in bins
    from crypten_lite.provider import he_pow2
    for b in bins:
        assert max(off + encs[e].span() for e, _, off in b) <= he.N
        assert sum(encs[e].terms() * encs[e].pairs(j, [None] * encs[e].kept, [None] * encs[e].plains)[1]
                   for e, j, _ in b) <= he_pow2.MAX_TERMS
    dw = he_kept._plan("conv2d", (2, 32, 14, 14), (32, 1, 3, 3), (1, 1, 1, 1, 1, 1, 32), he.N)[0]
    assert dw.back == 32 and len(he_kept._bins([dw], he.N)) == 3


def test_packed_kept_ciphertexts_round_trip_and_refuse_bad_payloads():
    """What goes to the peer (a kept B, a fresh A) is an NTT-form encryption (he_upload.py:
    a seed and c0 at 50 bits a coefficient, read back by load_ntt without any NTT): the
    product of what load_ntt gives with a plaintext decrypts to the row exactly, and it is
    smaller than SEAL's own zstd save; a short payload, a wrong count, or a coefficient at or
    past its prime (which 50 bits can hold) is a ProtocolError, never a wrong value. pack50
    round-trips every 50-bit value."""
    import numpy as np

    from crypten_lite.provider import he_pow2, he_upload
    rng = np.random.default_rng(5)
    for n in (1, 3, 4, 5, 8193):
        v = rng.integers(0, 1 << 50, size=n, dtype=np.uint64)
        v[-1] = (1 << 50) - 1
        assert np.array_equal(he_pow2.unpack50(he_pow2.pack50(v), n, "t"), v)
    with pytest.raises(ValueError):
        he_pow2.pack50(np.array([1 << 50], dtype=np.uint64))
    u = he_pow2.Pow2Unit(he.default_params())
    files = he._Files()
    u.peer_key(files, u.keygen(files))
    row = rng.integers(0, 1 << 63, size=(1, u.n), dtype=np.uint64)
    row[0, :4] = [0, 1, (1 << 64) - 1, 1 << 63]
    data = u.encrypt_ntt(files, row)[0]
    whole = u.encrypt_rows(files, row)[0]
    assert len(data) == he_upload.SEED_BYTES + 25 * len(u.data_moduli) * u.n // 4 < 0.9 * len(whole)
    ct = u.load_ntt(files, data)
    assert ct.is_ntt_form() and ct.size() == 2
    one = np.zeros((1, u.n), dtype=np.uint64)
    one[0, 0] = 1
    back = u.finish(files, he._dot(u, [(ct, u.ntt_plains(files, one)[0])]), np.zeros(u.n, dtype=np.uint64),
                    u.noise_bound(1, 1), lambda shape: rng.integers(0, 1 << 63, size=shape, dtype=np.uint64) * 2)
    assert np.array_equal(u.open(files, back, list(range(u.n))), row[0])
    at = he_upload.SEED_BYTES
    c0 = he_pow2.unpack50(data[at:], len(u.data_moduli) * u.n, "t")
    for where in (0, u.n - 1, 3 * u.n + 7):          # a coefficient equal to its prime
        bad = c0.copy()
        bad[where] = u.data_moduli[where // u.n]
        with pytest.raises(ProtocolError, match="malformed"):
            u.load_ntt(files, data[:at] + he_pow2.pack50(bad))
    for bad in (data[:len(data) - 25], data[:100], data[:at], data + bytes(25), b""):
        with pytest.raises(ProtocolError):
            u.load_ntt(files, bad)
    files.close()


def test_data_primes_past_50_bits_are_refused_at_construction():
    """The wire packs residues at 50 bits (pack50), so a Z_2^64 engine with a 51-bit data
    prime is a ConfigError when made, not a ValueError at the first send."""
    import dataclasses

    from crypten_lite.errors import ConfigError
    from crypten_lite.provider import he_pow2
    mods = tuple(m.value() for m in he._sealapi().CoeffModulus.Create(8192, [51, 50, 50, 50, 17]))
    with pytest.raises(ConfigError, match="below 2\\^50"):
        he_pow2.Pow2Unit(dataclasses.replace(he.default_params(), mm_moduli=mods))
