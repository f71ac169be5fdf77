"""correlations._matmul (the `matmul` of TRIPLE_OPS, under both protocols): a few rows against
a transposed weight take torch.mv on the contiguous weight; the result is torch.matmul's,
bit for bit in the ring, for every shape it takes and every one it leaves to torch."""

from __future__ import annotations

import pytest
import torch

from crypten_lite.provider.correlations import MV_ROWS, TRIPLE_OPS, _matmul

RING = (-(1 << 63), (1 << 63) - 1)


def _ring(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(*RING, shape, generator=g, dtype=torch.int64)


@pytest.mark.parametrize("a_shape", [(7,), (1, 7), (2, 7), (MV_ROWS, 7), (MV_ROWS + 1, 7), (1, 1, 7),
                                     (2, 2, 7), (3, 1, 7)])
def test_transposed_weight_gives_torch_matmul(a_shape):
    w = _ring(11, 7, seed=1)                      # a Linear's weight: out x in, row-major
    a = _ring(*a_shape, seed=2)
    got = TRIPLE_OPS["matmul"](a, w.t(), ())
    assert got.shape == torch.matmul(a, w.t()).shape
    assert torch.equal(got, torch.matmul(a, w.t()))   # wraps mod 2^64 alike


@pytest.mark.parametrize("b", ["contiguous", "batched", "sliced"])
def test_other_layouts_are_torch_matmul(b):
    a = _ring(2, 7, seed=3)
    w = {"contiguous": _ring(7, 5, seed=4), "batched": _ring(3, 5, 7, seed=4).transpose(-1, -2),
         "sliced": _ring(9, 7, seed=4)[::2].t()}[b]
    assert torch.equal(_matmul(a, w), torch.matmul(a, w))


def test_replicated_operands_are_left_to_their_dispatch():
    from crypten_lite.mpc.replicated import Replicated
    w = _ring(11, 7, seed=5)
    x = Replicated(_ring(1, 11, seed=6), _ring(1, 11, seed=7), 0)
    got = _matmul(x, w)                           # public weight on the right: componentwise
    assert isinstance(got, Replicated)
    assert torch.equal(got.a, torch.matmul(x.a, w)) and torch.equal(got.b, torch.matmul(x.b, w))
    a = _ring(1, 7, seed=8)
    y = Replicated(w.t(), w.t(), 0)              # a transposed weight's shares
    assert torch.equal(_matmul(a, y).a, torch.matmul(a, w.t()))
