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

from crypten_lite.provider import he, he_conv  # noqa: E402
from crypten_lite.random import PRG  # noqa: E402
from two_party_threads import run_both  # noqa: E402


def _negacyclic(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a(X) b(X) mod X^N + 1 over the integers (object arrays; small N only)."""
    n = a.size
    full = np.convolve(a.astype(object), b.astype(object))
    out = full[:n].copy()
    out[:full.size - n] -= full[n:]
    return out


@pytest.mark.parametrize("shape,kernel,dil", [((3, 2, 5, 4), (2, 2, 3, 2), (1, 1)),
                                              ((2, 3, 6, 6), (1, 3, 2, 2), (2, 1)),
                                              ((1, 5, 4, 4), (2, 5, 3, 3), (1, 1))])
def test_layout_products_are_the_convolution(shape, kernel, dil):
    """With N = 64 (a layout of several images, or of channel blocks), the polynomial
    products read at the output positions are conv2d, whatever the other coefficients."""
    nd = 64
    lay = he_conv.layout(shape, kernel, dil, nd)
    g = torch.Generator().manual_seed(1)     # test data only
    x = torch.randint(-50, 50, shape, generator=g)
    w = torch.randint(-50, 50, kernel, generator=g)
    want = F.conv2d(x, w, dilation=dil)
    pos_w, pos_out = lay.positions()
    t = 1 << 40
    xr = he_conv._input_rows(lay, (x % t).numpy().astype(np.uint64), t, nd).astype(object)
    wr = he_conv._kernel_rows(lay, (w % t).numpy().astype(np.uint64), pos_w, t, nd).astype(object)
    blocks = np.zeros((lay.gblocks, lay.out_channels, pos_out.size), dtype=object)
    for gi in range(lay.gblocks):
        for o in range(lay.out_channels):
            acc = np.zeros(nd, dtype=object)
            for c in range(lay.cblocks):
                acc = acc + _negacyclic(xr[gi * lay.cblocks + c], wr[o * lay.cblocks + c])
            blocks[gi, o] = acc[pos_out] % t
    got = he_conv._from_blocks(lay, blocks)
    centred = np.vectorize(lambda v: v - t if v >= t // 2 else v)(got).astype(np.int64)
    assert lay.gblocks * lay.cblocks > 1 or lay.nb > 1
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
    """LeNet's convolutions at batch 64 take the direct encoding (cheaper than unfolding by
    the cost model; at batch 1 they cost about the same and stay unfolded), conv2's with one
    channel per block (56 images per polynomial: 32 ciphertexts back per prime, not 128), and
    every product's flood fits the noise budget."""
    nd = he.N
    params = he.default_params()
    engine = he.CrossEngine(1, params, lambda d: None, lambda: b"", lambda s: np.zeros(s, np.uint64))
    p = he._Prime(params, params.plain_primes[0])
    for xs, ws in (((64, 1, 28, 28), (6, 1, 5, 5)), ((64, 6, 12, 12), (16, 6, 5, 5))):
        assert he_conv.preferred(xs, ws, (1, 1), (0, 0), (1, 1), 1, nd), (xs, ws)
    lay = he_conv.layout((64, 6, 12, 12), (16, 6, 5, 5), (1, 1), nd)
    assert (lay.cb, lay.nb, lay.ciphertexts()) == (1, 56, (12, 32))
    assert not he_conv.preferred((1, 6, 12, 12), (16, 6, 5, 5), (1, 1), (0, 0), (1, 1), 1, nd)
    for xs, ws in (((64, 6, 12, 12), (16, 6, 5, 5)), ((1, 512, 14, 14), (4, 512, 3, 3)),
                   ((1, 3, 90, 90), (8, 3, 7, 7))):
        lay = he_conv.layout(xs, ws, (1, 1), nd)
        bound = engine.noise_bound(p.t, lay.cblocks, lay.cb * lay.kh * lay.kw)
        engine._room(p, params.flood_bits(bound), bound)
    assert not he_conv.preferred((1, 4, 5, 4), (4, 2, 2, 3), (1, 1), (0, 0), (1, 1), 2, nd)  # groups
    assert he_conv.layout((1, 1, 100, 100), (1, 1, 3, 3), (1, 1), nd) is None        # H W > N
    engine.close()


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
    for name, xs, ws in (("conv1", (64, 1, 28, 28), (6, 1, 5, 5)), ("conv2", (64, 6, 12, 12), (16, 6, 5, 5))):
        lay = he_conv.layout(xs, ws, (1, 1), he.N)
        up, back = lay.ciphertexts()
        direct = (up, back, lay.out_channels * lay.cblocks, back * lay.cblocks)
        unfolded = _unfolded_counts(ws[0], ws[1] * ws[2] * ws[3], xs[0] * lay.hout * lay.wout)
        row = (f"| LeNet {name}, [{','.join(map(str, xs))}] x [{','.join(map(str, ws))}] | "
               f"{', '.join(map(str, unfolded))} | {', '.join(map(str, direct))} |")
        assert row in doc, row
