"""Ring products by float64 BLAS on 16-bit limbs (crypten_lite.provider.correlations).

Every bilinear ring op (matmul, conv1d, conv2d, conv_transpose2d) may run as ten float64 ops
on 16-bit limbs instead of torch's int64 op; the result must be the int64 op's, bit for bit,
mod 2^64, for any operands: full-range random values, the worst case for the float64 sums
(every limb 65535) at the largest reduction length allowed, and every layout the protocols
use (batched and broadcast matmuls, strided, padded, dilated and grouped convolutions).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from crypten_lite.provider import correlations as corr
from crypten_lite.provider.correlations import LIMB_MAX_TERMS, TRIPLE_OPS, ring_by_limbs

G = torch.Generator().manual_seed(7)  # test operands, not shares


def ring(*shape: int) -> torch.Tensor:
    return torch.randint(-2**63, 2**63 - 1, shape, dtype=torch.int64, generator=G)


CASES = {
    "matmul_2d": ("matmul", (300, 500), (500, 200), ()),
    "matmul_batched_broadcast": ("matmul", (2, 3, 64, 200), (3, 200, 130), ()),
    "matmul_batched_2d": ("matmul", (3, 64, 600), (600, 300), ()),
    "matmul_vector": ("matmul", (40, 700), (700,), ()),
    "conv2d": ("conv2d", (4, 16, 20, 20), (32, 16, 3, 3), (1, 1, 1, 1, 1, 1, 1)),
    "conv2d_stride_groups": ("conv2d", (2, 16, 20, 20), (32, 4, 3, 3), (2, 2, 1, 0, 1, 1, 4)),
    "conv2d_depthwise_dilated": ("conv2d", (2, 16, 21, 21), (16, 1, 3, 3), (1, 1, 2, 2, 2, 2, 16)),
    "conv1d": ("conv1d", (4, 64, 300), (64, 64, 5), (1, 2, 1, 1)),
    "conv_transpose2d": ("conv_transpose2d", (2, 32, 10, 10), (32, 16, 3, 3), (2, 2, 1, 1, 1, 1, 1, 1, 1)),
    "conv_transpose2d_groups": ("conv_transpose2d", (2, 32, 10, 10), (32, 8, 4, 4), (2, 2, 1, 1, 0, 0, 1, 1, 2)),
}


def _int64(op, a, b, p, monkeypatch):
    monkeypatch.setenv("CRYPTEN_LITE_RING_GEMM", "int64")
    return TRIPLE_OPS[op](a, b, p)


@pytest.mark.parametrize("case", list(CASES))
def test_limbs_equal_the_int64_op(case, monkeypatch):
    op, a_shape, b_shape, p = CASES[case]
    a, b = ring(*a_shape), ring(*b_shape)
    want = _int64(op, a, b, p, monkeypatch)
    monkeypatch.setenv("CRYPTEN_LITE_RING_GEMM", "limbs")
    monkeypatch.setattr(corr, "LIMB_MIN_WORK", 0)  # small cases too
    monkeypatch.setattr(corr, "LIMB_MIN_TERMS", 1)
    spy = []
    monkeypatch.setattr(corr, "ring_by_limbs", lambda *args: spy.append(1) or ring_by_limbs(*args))
    got = TRIPLE_OPS[op](a, b, p)
    assert spy, f"{case}: the limbs path did not run"
    assert got.dtype == torch.int64 and torch.equal(got, want), case


def test_worst_case_sums_are_exact_at_the_largest_reduction():
    """Every limb 65535 (a = b = -1) and the longest reduction the limbs take: each of the
    four diagonal sums reaches its largest value, below 2^53; one more term is refused."""
    k = LIMB_MAX_TERMS
    a = torch.full((2, k), -1, dtype=torch.int64)
    b = torch.full((k, 3), -1, dtype=torch.int64)
    b[5, 1] = 2**63 - 1  # and one other value, so that not every output is the same
    got = ring_by_limbs(lambda x, y, p: x @ y, a, b, ())
    assert torch.equal(got, a @ b)
    assert got[0, 0] == k
    assert corr._terms_per_output("matmul", a, b, ()) == k
    wide = torch.zeros((1, k + 1), dtype=torch.int64)
    assert corr._terms_per_output("matmul", wide, wide.t(), ()) > LIMB_MAX_TERMS


def test_longer_reductions_and_small_products_keep_the_int64_op(monkeypatch):
    monkeypatch.setenv("CRYPTEN_LITE_RING_GEMM", "limbs")
    spy = []
    monkeypatch.setattr(corr, "ring_by_limbs", lambda *args: spy.append(1) or ring_by_limbs(*args))
    a, b = ring(8, 16), ring(16, 8)
    assert torch.equal(TRIPLE_OPS["matmul"](a, b, ()), a @ b) and not spy  # too small to pay
    x, kernel = ring(64, 1, 28, 28), ring(6, 1, 5, 5)  # LeNet's first conv: 25 terms per output
    assert torch.equal(TRIPLE_OPS["conv2d"](x, kernel, (1, 1, 0, 0, 1, 1, 1)), F.conv2d(x, kernel)) and not spy
    rows, w = ring(2, 4096), ring(8192, 4096)
    assert torch.equal(TRIPLE_OPS["matmul"](rows, w.t(), ()), torch.matmul(rows, w.t())) and not spy  # torch.mv
    x, kernel = ring(1, LIMB_MAX_TERMS // 4 + 1, 2, 2), ring(2, LIMB_MAX_TERMS // 4 + 1, 2, 2)
    assert corr._terms_per_output("conv2d", x, kernel, (1, 1, 0, 0, 1, 1, 1)) > LIMB_MAX_TERMS
    got = TRIPLE_OPS["conv2d"](x, kernel, (1, 1, 0, 0, 1, 1, 1))
    assert torch.equal(got, F.conv2d(x, kernel)) and not spy


def test_ring_gemm_mode_is_checked(monkeypatch):
    monkeypatch.setenv("CRYPTEN_LITE_RING_GEMM", "fast")
    with pytest.raises(ValueError, match="CRYPTEN_LITE_RING_GEMM='fast': expected one of auto, int64, limbs"):
        TRIPLE_OPS["matmul"](ring(64, 256), ring(256, 256), ())


def test_auto_gives_the_same_products_whichever_it_picks(monkeypatch):
    monkeypatch.setenv("CRYPTEN_LITE_RING_GEMM", "auto")
    a, b = ring(128, 512), ring(512, 256)
    for faster in (True, False):
        monkeypatch.setitem(corr._ring_gemm_choice, "auto", faster)
        assert torch.equal(TRIPLE_OPS["matmul"](a, b, ()), _int64("matmul", a, b, (), monkeypatch))
        monkeypatch.setenv("CRYPTEN_LITE_RING_GEMM", "auto")


@pytest.mark.parametrize("a_shape,b_shape,transposed", [((60, 100), (100, 50), False),
                                                        ((3, 20, 100), (100, 40), False),
                                                        ((5, 100), (50, 100), True)])
def test_blocked_limbs_are_exact_and_bounded(a_shape, b_shape, transposed, monkeypatch):
    """A matmul by a 2-D b larger than LIMB_CHUNK_BYTES runs block by block (rows of a, columns
    of b, a Linear's transposed weight included): the same ring product, and no limb tensor
    larger than the bound."""
    a, b = ring(*a_shape), ring(*b_shape)
    b = b.t() if transposed else b
    want = torch.matmul(a, b)
    bound = 32 * 100 * 16  # the limbs of 16 columns of b
    monkeypatch.setattr(corr, "LIMB_CHUNK_BYTES", bound)
    sizes, limbs = [], corr._limbs
    monkeypatch.setattr(corr, "_limbs", lambda t: sizes.append(t.numel()) or limbs(t))
    got = ring_by_limbs(corr._float_matmul, a, b, (), "matmul")
    assert torch.equal(got, want)
    assert len(sizes) > 2 and 4 * 8 * max(sizes) <= bound, sizes
