"""Direct (Cheetah-style) convolution triples of provider pairwise (provider/he_conv.py): the
layout's algebra on plain integers (no HE: the coefficients of x(X) w_o(X) at the output
positions are the convolution, nothing wraps onto them), the cross terms of two engines on
two threads against torch's conv2d in Z_2^64 (stride, padding, dilation, channel blocks,
several images per polynomial, a slice at a small chunk budget), the choice against
unfolding, and the noise room of every layout the chooser can pick."""

from __future__ import annotations

import os
import queue

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("tenseal")

from crypten_lite.provider import he, he_conv, he_pow2  # noqa: E402
from crypten_lite.random import PRG  # noqa: E402
from two_party_threads import run_both  # noqa: E402


def _negacyclic(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a(X) b(X) mod X^N + 1 over the integers (object arrays; small N only)."""
    n = a.size
    full = np.convolve(a.astype(object), b.astype(object))
    out = full[:n].copy()
    out[:full.size - n] -= full[n:]
    return out


@pytest.mark.parametrize("shape,kernel,dil,nd,mo", [((3, 2, 5, 4), (2, 2, 3, 2), (1, 1), 64, None),
                                                    ((2, 3, 6, 6), (1, 3, 2, 2), (2, 1), 64, None),
                                                    ((1, 5, 4, 4), (2, 5, 3, 3), (1, 1), 64, None),
                                                    ((1, 1, 5, 5), (5, 1, 3, 3), (1, 1), 64, None),
                                                    ((2, 2, 4, 4), (5, 2, 2, 3), (1, 1), 128, 3),
                                                    ((3, 2, 4, 3), (4, 2, 2, 2), (1, 1), 64, 2)])
def test_layout_products_are_the_convolution(shape, kernel, dil, nd, mo):
    """With N = 64 or 128 (a layout of several images, of channel blocks, of several output
    channels per polynomial: kernel o at X^(o S), a group padded with a zero kernel), the
    polynomial products read at the output positions are conv2d, whatever the other
    coefficients (a wrapped term landing on an output would show)."""
    lay = he_conv.layout(shape, kernel, dil, nd, mo=mo)
    g = torch.Generator().manual_seed(1)     # test data only
    x = torch.randint(-50, 50, shape, generator=g)
    w = torch.randint(-50, 50, kernel, generator=g)
    want = F.conv2d(x, w, dilation=dil)
    pos_w, pos_out = lay.positions()
    t = 1 << 40
    xr = he_conv._input_rows(lay, (x % t).numpy().astype(np.uint64), t, nd).astype(object)
    wr = he_conv._kernel_rows(lay, (w % t).numpy().astype(np.uint64), pos_w, t, nd).astype(object)
    blocks = np.zeros((lay.gblocks, lay.oblocks, pos_out.size), dtype=object)
    for gi in range(lay.gblocks):
        for o in range(lay.oblocks):
            acc = np.zeros(nd, dtype=object)
            for c in range(lay.cblocks):
                acc = acc + _negacyclic(xr[gi * lay.cblocks + c], wr[o * lay.cblocks + c])
            blocks[gi, o] = acc[pos_out] % t
    got = he_conv._from_blocks(lay, blocks)
    centred = np.vectorize(lambda v: v - t if v >= t // 2 else v)(got).astype(np.int64)
    assert lay.gblocks * lay.cblocks > 1 or lay.nb > 1 or lay.mo > 1
    assert mo is None or lay.mo == mo
    assert np.array_equal(centred, want.numpy())


def _engines():
    boxes = [queue.Queue(), queue.Queue()]
    sent = [0, 0]

    def make(r):
        prg = PRG(os.urandom(32))

        def send(d, r=r):
            sent[r] += len(d)
            boxes[1 - r].put(d)
        return he.CrossEngine(r, he.default_params(), send, lambda r=r: boxes[r].get(timeout=120),
                              lambda shape: prg.draw(tuple(shape)).numpy().view(np.uint64))
    return [make(0), make(1)], sent


def _both(fns):
    return run_both(fns, 300)


def _ring(shape, g):
    return torch.randint(-(1 << 62), 1 << 62, shape, generator=g) * 2 + torch.randint(0, 2, shape, generator=g)


def test_direct_conv_cross_terms_are_exact_in_z2_64():
    """conv(x0, w1) + conv(x1, w0) in Z_2^64 from full-size ring elements: padding, stride,
    dilation, two images per polynomial; then the same at a chunk budget that slices it."""
    engines, sent = _engines()
    g = torch.Generator().manual_seed(2)     # test data only
    x = [_ring((3, 2, 9, 8), g) for _ in range(2)]
    w = [_ring((3, 2, 3, 2), g) for _ in range(2)]
    stride, padding, dil = (2, 1), (1, 2), (2, 1)
    want = sum(F.conv2d(x[r], w[1 - r], stride=stride, padding=padding, dilation=dil) for r in range(2))
    for chunk in (1 << 30, 1):
        got = _both([lambda r=r: he_conv.cross_conv(
            engines[r], chunk, x[r].numpy().view(np.uint64), w[r].numpy().view(np.uint64),
            stride, padding, dil, 129 + 3) for r in range(2)])
        total = torch.from_numpy((got[0] + got[1]).view(np.int64))
        assert torch.equal(total, want), chunk
    for e in engines:
        e.close()


def test_lenet_convs_go_direct_and_their_noise_fits():
    """LeNet's convolutions take the direct encoding at batch 64 and at batch 1 (cheaper than
    unfolding by the cost model): at batch 1 all of conv1's 6 output channels come back in one
    ciphertext and conv2's 16 in one (2 channels per block: 3 sent); conv2 at batch 64 with
    one channel per block, 2 output channels and 28 images per polynomial (18 sent, 24 back;
    one output channel per ciphertext needed 12 and 32). Every layout's flood fits the noise
    budget of the Z_2^64 engine."""
    nd = he.N
    unit = he_pow2.Pow2Unit(he.default_params())
    for xs, ws in (((64, 1, 28, 28), (6, 1, 5, 5)), ((64, 6, 12, 12), (16, 6, 5, 5)),
                   ((1, 1, 28, 28), (6, 1, 5, 5)), ((1, 6, 12, 12), (16, 6, 5, 5))):
        assert he_conv.preferred(xs, ws, (1, 1), (0, 0), (1, 1), 1, nd), (xs, ws)
    lay = he_conv.layout((64, 6, 12, 12), (16, 6, 5, 5), (1, 1), nd)
    assert (lay.cb, lay.mo, lay.nb, lay.ciphertexts()) == (1, 2, 28, (18, 24))
    assert he_conv.layout((64, 6, 12, 12), (16, 6, 5, 5), (1, 1), nd, mo=1).ciphertexts() == (12, 32)
    lay = he_conv.layout((1, 1, 28, 28), (6, 1, 5, 5), (1, 1), nd)
    assert (lay.mo, lay.ciphertexts(), lay.plaintexts()) == (6, (1, 1), 1)
    lay = he_conv.layout((1, 6, 12, 12), (16, 6, 5, 5), (1, 1), nd)
    assert (lay.cb, lay.mo, lay.ciphertexts(), lay.plaintexts()) == (2, 16, (3, 1), 3)
    for xs, ws in (((64, 6, 12, 12), (16, 6, 5, 5)), ((1, 512, 14, 14), (4, 512, 3, 3)),
                   ((1, 3, 90, 90), (8, 3, 7, 7)), ((1, 6, 12, 12), (16, 6, 5, 5)),
                   ((1, 1, 28, 28), (6, 1, 5, 5))):
        lay = he_conv.layout(xs, ws, (1, 1), nd)
        bound = unit.noise_bound(lay.cblocks, lay.mo * lay.cb * lay.kh * lay.kw)
        unit.room(unit.params.flood_bits(bound), bound)
    assert not he_conv.preferred((1, 4, 5, 4), (4, 2, 2, 3), (1, 1), (0, 0), (1, 1), 2, nd)  # groups
    assert he_conv.layout((1, 1, 100, 100), (1, 1, 3, 3), (1, 1), nd) is None        # H W > N


def _unfolded_counts(m: int, k: int, n: int) -> tuple[int, int, int, int]:
    _, mw, kw, nw = he._blocks_cost(m, k, n, he.N, joint=False)
    mb, kb, nb = -(-m // mw), -(-k // kw), -(-n // nw)
    return mb * kb, mb * nb, kb * nb, mb * kb * nb


def test_docs_ciphertext_counts():
    """docs/protocols.md's "Direct convolutions" table: ciphertexts per prime and one-sided
    product, unfolded (he.CrossEngine.matmul's blocks for [M, C kh kw] x [C kh kw, B L])
    and direct (sent, returned, plaintexts, products)."""
    import pathlib
    doc = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "protocols.md").read_text()
    for name, xs, ws in (("conv1", (64, 1, 28, 28), (6, 1, 5, 5)), ("conv2", (64, 6, 12, 12), (16, 6, 5, 5)),
                         ("conv1", (1, 1, 28, 28), (6, 1, 5, 5)), ("conv2", (1, 6, 12, 12), (16, 6, 5, 5))):
        lay = he_conv.layout(xs, ws, (1, 1), he.N)
        up, back = lay.ciphertexts()
        direct = (up, back, lay.plaintexts(), back * lay.cblocks)
        unfolded = _unfolded_counts(ws[0], ws[1] * ws[2] * ws[3], xs[0] * lay.hout * lay.wout)
        row = (f"| LeNet {name}, [{','.join(map(str, xs))}] x [{','.join(map(str, ws))}] | "
               f"{', '.join(map(str, unfolded))} | {', '.join(map(str, direct))} |")
        assert row in doc, row
