"""Integer requantization math, the plaintext backend and the IR, without torch models."""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from crypten_lite.errors import ProtocolError, UnsupportedError
from crypten_lite.quantized.backend import PlainBackend
from crypten_lite.quantized.executor import apply_divide, apply_rescale
from crypten_lite.quantized.ir import Node, QuantizedProgram, Rescale, ValueInfo, bits_for
from crypten_lite.quantized.lowering import ProgramBuilder, Target
from crypten_lite.quantized.requant import (
    common_multipliers,
    div_round_half_even,
    fit_multipliers,
    multiplier_for,
    plan_exact_divide,
    round_shift,
    tie_possible,
)


def test_bits_for():
    assert bits_for(0, 255) == 8
    assert bits_for(-128, 127) == 7
    assert bits_for(-129, 0) == 8
    assert bits_for(0, 0) == 0


@pytest.mark.parametrize("seed", range(5))
def test_multiplier_reproduces_float32_exactly(seed):
    rng = np.random.default_rng(seed)
    for ratio in rng.uniform(1e-6, 3.0, 200).astype(np.float32):
        m, s = multiplier_for(float(ratio), 24)
        assert Fraction(m, 1 << s) == Fraction(float(ratio))
        assert m < 1 << 24


def test_multiplier_rounds_to_the_requested_bits():
    m, s = multiplier_for(1 / 3, 8)
    assert 128 <= m < 256 and abs(Fraction(m, 1 << s) - Fraction(1, 3)) <= Fraction(1, 1 << (s + 1))
    assert multiplier_for(0.0, 24) == (0, 0)
    assert multiplier_for(1000.0, 4) == (1024, 0)  # 4 significant bits, shift stays >= 0
    with pytest.raises(ValueError):
        multiplier_for(-1.0, 24)


def test_common_multipliers_share_one_shift():
    ratios = [0.25, 0.001, 0.3]
    ms, shift = common_multipliers(ratios, 24)
    for r, m in zip(ratios, ms):
        alone, s = multiplier_for(r, 24)
        assert Fraction(m, 1 << shift) == Fraction(alone, 1 << s)
    assert common_multipliers([0.25, 0.5], 24) == ([1, 2], 2)  # powers of two normalized


def test_fit_multipliers_pre_shifts_fine_accumulators():
    # a 50-bit accumulator with a tiny ratio: round it first, keep 24 multiplier bits
    ms, shift, pre = fit_multipliers([0.3 * 2.0**-40], 50, 24, 62, "test")
    assert pre > 0 and 20 <= ms[0].bit_length() <= 24 and 50 - pre + ms[0].bit_length() <= 62
    # a coarse accumulator cannot be pre-rounded: the multiplier shrinks instead
    ms, shift, pre = fit_multipliers([0.3], 50, 24, 62, "test")
    assert pre == 0 and ms[0].bit_length() <= 12
    with pytest.raises(UnsupportedError, match="max_bits"):
        fit_multipliers([0.3], 60, 24, 62, "layer x", allow_pre=False)


@pytest.mark.parametrize("rounding", ["half_up", "half_even"])
def test_round_shift_and_plain_truncate_match_the_definition(rounding):
    rng = random.Random(0)
    values = [rng.randrange(-(1 << 40), 1 << 40) for _ in range(500)]
    values += [k * 8 + 4 for k in range(-20, 20)]  # exact ties for shift 3
    backend = PlainBackend()
    for shift in (1, 3, 17):
        got = backend.truncate(torch.tensor(values), shift, 41, rounding).tolist()
        for v, g in zip(values, got):
            exact = Fraction(v, 1 << shift)
            q = int(np.floor(exact + Fraction(1, 2)))
            if rounding == "half_even" and exact - int(np.floor(exact)) == Fraction(1, 2) and q % 2:
                q -= 1
            assert g == round_shift(v, shift, rounding) == q


def test_tie_possible_against_brute_force():
    rng = random.Random(1)
    for _ in range(300):
        shift = rng.randrange(1, 9)
        m = rng.randrange(0, 200)
        bias = rng.randrange(-300, 300)
        lo = rng.randrange(-50, 50)
        hi = lo + rng.randrange(0, 60)
        brute = any((a * m + bias) % (1 << shift) == 1 << (shift - 1) for a in range(lo, hi + 1))
        assert tie_possible(m, shift, bias, lo, hi) == brute, (m, shift, bias, lo, hi)


@pytest.mark.parametrize("divisors", [[100], [6, 4, 9], [12, 1, 3, 8], [36, 2]])
def test_exact_divide_matches_round_half_even(divisors):
    lo, hi = -3000, 20000
    builder = ProgramBuilder()
    target = Target.quant(1.0, 5, -(1 << 30), 1 << 30)
    divide, _, _ = builder._divide(divisors, [(lo, hi)], target, 5, (len(divisors),), "test")
    x = torch.arange(lo, hi + 1).unsqueeze(1).expand(-1, len(divisors))
    got = apply_divide(PlainBackend(), x, divide)
    plan = plan_exact_divide(divisors, lo, hi)
    assert plan["magic_bits"] < 62
    for j, d in enumerate(divisors):
        want = torch.tensor([div_round_half_even(v, d) + 5 for v in range(lo, hi + 1)])
        assert torch.equal(got[:, j], want)


def test_apply_rescale_clamps_and_offsets():
    rs = Rescale(multiplier=3, shift=2, offset=10, lo=0, hi=20, in_bits=10, out_bits=9, rounding="half_up")
    x = torch.tensor([-40, -3, 0, 1, 2, 30])
    # round(x * 3 / 4) + 10, clamped to [0, 20]
    assert apply_rescale(PlainBackend(), x, rs).tolist() == [0, 8, 10, 11, 12, 20]


def test_plain_backend_checks_bit_hints():
    with pytest.raises(ProtocolError, match="8-bit bound"):
        PlainBackend().clamp(torch.tensor([300]), 0, 255, 8)
    assert PlainBackend(check_bits=False).clamp(torch.tensor([300]), 0, 255, 8).tolist() == [255]


@pytest.mark.parametrize("args", [(3, 2, 1, False), (2, 2, 0, False), (3, 2, 1, True), (2, 1, 1, True)])
def test_sum_pool_and_max_pool_match_torch(args):
    k, s, p, ceil = args
    x = torch.randint(-1000, 1000, (2, 3, 9, 7))
    backend = PlainBackend()
    sums = backend.sum_pool2d(x, (k, k), (s, s), (p, p), ceil)
    want = F.avg_pool2d(x.double(), k, s, p, ceil, True, 1)
    assert torch.equal(sums, want.round().long())
    maxes = backend.max_pool2d(x, (k, k), (s, s), (p, p), (1, 1), ceil, 10)
    assert torch.equal(maxes, F.max_pool2d(x.double(), k, s, p, 1, ceil).long())


def test_plain_conv_and_matmul_are_exact_in_int64():
    x = torch.randint(-(1 << 20), 1 << 20, (2, 3, 5, 5))
    w = torch.randint(-128, 128, (4, 3, 3, 3))
    got = PlainBackend().conv2d(x, w, (1, 1), (1, 1), (1, 1), 1)
    want = F.conv2d(x.double(), w.double(), None, 1, 1)  # < 2**53: exact in float64 too
    assert torch.equal(got, want.long())
    a, b = torch.randint(-(1 << 30), 1 << 30, (3, 7)), torch.randint(-128, 128, (7, 2))
    assert torch.equal(PlainBackend().matmul(a, b), (a.double() @ b.double()).long())


def _info(lo=0, hi=255):
    return ValueInfo("quant", 0.1, 0, lo, hi, (1, 4))


def test_ir_rejects_unknown_ops_and_bad_programs():
    with pytest.raises(UnsupportedError, match="ir.OPS"):
        Node("softmax", "y", ("x",), _info())
    x = Node("input", "x", (), _info(), dict(kind="quant", scale=0.1, zero_point=0, qmin=0, qmax=255))
    with pytest.raises(ValueError, match="undefined"):
        QuantizedProgram([x, Node("clamp", "y", ("z",), _info())], "y")
    with pytest.raises(ValueError, match="int64"):
        Node("linear", "y", ("x",), _info(), weights=dict(weight=torch.zeros(2, 2)))
    prog = QuantizedProgram([x, Node("clamp", "y", ("x",), _info(), dict(lo=5, hi=None, bits=8))], "y")
    text = prog.describe()
    assert "%y = clamp(%x)" in text and "return %y" in text
    assert prog.output_info.lo == 0 and prog.input.name == "x"
