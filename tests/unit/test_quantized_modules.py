"""Each quantized module and Q/DQ pattern against torch's own quantized model.

Every case quantizes a small float model with torch (eager, FX or PT2E), converts it,
runs it on the plaintext backend and compares every layer torch exposes: quantized values
as integers (>= 99% identical, never more than one step apart), float values in fixed point.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.ao.nn.quantized import FloatFunctional
from torch.ao.quantization import DeQuantStub, QuantStub

from crypten_lite.quantized import PlainBackend, compare_layers, from_quantized
from crypten_lite.quantized.executor import run_float
from crypten_lite.quantized.testing import output_agreement, quantize_eager, quantize_fx, quantize_pt2e

# PT2E needs torchao (the "quantization" extra)
requires_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao not installed")

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*deprecat", "ignore:Please use quant_min", "ignore:The input of maxpool2d is not quantized"
)


def check(qmodel: nn.Module, x: torch.Tensor, min_agree: float = 0.99):
    """Convert, compare every layer and the output with torch; return the program and rows."""
    program = from_quantized(qmodel, x[:2])
    rows = compare_layers(program, qmodel, x)
    assert rows
    for row in rows:
        if row.kind == "quant":
            assert row.agree >= min_agree and row.max_steps <= 1, str(row)
    out = output_agreement(program, qmodel, x)
    if out.kind == "quant":
        assert out.agree >= min_agree and out.max_steps <= 1, str(out)
    else:  # float output of a PT2E graph: the last linear of agreeing int8 values
        assert out.max_abs < 5e-2, str(out)
    return program, rows


# --- eager mode ------------------------------------------------------------------------


class Wrap(nn.Module):
    """QuantStub -> body -> DeQuantStub."""

    def __init__(self, *body: nn.Module):
        super().__init__()
        self.quant, self.body, self.dequant = QuantStub(), nn.Sequential(*body), DeQuantStub()

    def forward(self, x):
        return self.dequant(self.body(self.quant(x)))


class Binary(nn.Module):
    """Two convs joined by a FloatFunctional op (add / add_relu / mul / cat)."""

    def __init__(self, op: str):
        super().__init__()
        self.quant, self.dequant, self.f, self.op = QuantStub(), DeQuantStub(), FloatFunctional(), op
        self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        x = self.quant(x)
        a, b = self.a(x), self.b(x)
        y = self.f.cat([a, b], 1) if self.op == "cat" else getattr(self.f, self.op)(a, b)
        return self.dequant(y)


EAGER_CASES = {
    "linear": (lambda: Wrap(nn.Linear(32, 16)), (32,), []),
    "linear_relu": (lambda: Wrap(nn.Linear(32, 16), nn.ReLU()), (32,), [["body.0", "body.1"]]),
    "conv_stride_pad": (lambda: Wrap(nn.Conv2d(3, 8, 3, stride=2, padding=1)), (3, 10, 10), []),
    "conv_groups_dilation": (lambda: Wrap(nn.Conv2d(4, 6, 3, padding=2, dilation=2, groups=2)), (4, 10, 10), []),
    "conv_relu": (lambda: Wrap(nn.Conv2d(3, 8, 3), nn.ReLU()), (3, 10, 10), [["body.0", "body.1"]]),
    "conv_bn_relu_folded": (lambda: Wrap(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()), (3, 10, 10),
                            [["body.0", "body.1", "body.2"]]),
    "relu6": (lambda: Wrap(nn.Conv2d(3, 8, 3), nn.ReLU6()), (3, 10, 10), []),
    "hardswish": (lambda: Wrap(nn.Conv2d(3, 8, 3), nn.Hardswish()), (3, 10, 10), []),
    "maxpool_pad_ceil": (lambda: Wrap(nn.Conv2d(3, 8, 3), nn.MaxPool2d(3, 2, 1, ceil_mode=True)), (3, 10, 10), []),
    "avgpool_pad": (lambda: Wrap(nn.Conv2d(3, 8, 3), nn.AvgPool2d(3, 2, 1)), (3, 10, 10), []),
    "avgpool_exclude_pad": (lambda: Wrap(nn.Conv2d(3, 8, 3), nn.AvgPool2d(3, 2, 1, count_include_pad=False)),
                            (3, 10, 10), []),
    "adaptive_global": (lambda: Wrap(nn.Conv2d(3, 8, 3), nn.AdaptiveAvgPool2d(1)), (3, 12, 12), []),
    "adaptive_2x2": (lambda: Wrap(nn.Conv2d(3, 8, 3), nn.AdaptiveAvgPool2d(5)), (3, 12, 12), []),
    "upsample": (lambda: Wrap(nn.Conv2d(3, 8, 3), nn.Upsample(scale_factor=2)), (3, 6, 6), []),
    "flatten_linear": (lambda: Wrap(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(64, 10)), (3, 6, 6), []),
    "add": (lambda: Binary("add"), (3, 6, 6), []),
    "add_relu": (lambda: Binary("add_relu"), (3, 6, 6), []),
    "mul": (lambda: Binary("mul"), (3, 6, 6), []),
    "cat": (lambda: Binary("cat"), (3, 6, 6), []),
}


WEIGHTED = ["linear", "linear_relu", "conv_stride_pad", "conv_groups_dilation", "conv_relu",
            "conv_bn_relu_folded"]


@pytest.mark.parametrize(
    "case, qconfig",
    [(c, "x86") for c in EAGER_CASES] + [(c, "per_tensor") for c in WEIGHTED],
    ids=[f"{c}-per_channel" for c in EAGER_CASES] + [f"{c}-per_tensor" for c in WEIGHTED],
)
def test_eager_module(case, qconfig):
    make, shape, fuse = EAGER_CASES[case]
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(32, *shape)
    check(quantize_eager(model, x, qconfig, fuse), x)


def test_eager_qat_conv_bn_relu_is_folded():
    torch.manual_seed(0)
    model = Wrap(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
    x = torch.randn(32, 3, 8, 8)
    qmodel = quantize_eager(model, x, "x86", [["body.0", "body.1", "body.2"]], qat=True)
    program, _ = check(qmodel, x)
    assert [n.op for n in program.nodes] == ["input", "conv2d"]


def test_dynamic_linear_runs_in_fixed_point():
    """Dynamic Linear keeps activations in fixed point: their range would be data dependent.

    The program equals the float model with int8 weights up to fixed-point rounding; torch
    additionally quantizes the activations, so it differs by its own quantization error.
    """
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).eval()
    qmodel = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    x = torch.randn(128, 32)
    program = from_quantized(qmodel, x[:2])
    assert [n.op for n in program.nodes] == ["input", "linear", "clamp", "linear"]
    ours = run_float(program, x).double()
    w1, w2 = qmodel[0].weight().dequantize().double(), qmodel[2].weight().dequantize().double()
    ref = F.linear(F.relu(F.linear(x.double(), w1, qmodel[0].bias().double())), w2, qmodel[2].bias().double())
    assert (ours - ref).abs().max() < 1e-4
    torch_error = (qmodel(x).double() - ref).abs().max()
    assert (ours - qmodel(x).double()).abs().max() <= 1.5 * torch_error + 1e-4


def test_program_runs_on_other_batch_sizes():
    torch.manual_seed(0)
    x = torch.randn(16, 3, 6, 6)
    qmodel = quantize_eager(EAGER_CASES["flatten_linear"][0]().eval(), x)
    program = from_quantized(qmodel, x[:2])
    for n in (1, 5):
        assert torch.equal(run_float(program, x[:n], PlainBackend()), qmodel(x[:n]))


class CountingBackend(PlainBackend):
    """A stand-in for an MPC backend: counts the interactive operations and their bit hints."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    def weight(self, w):
        self.calls.append(("weight", w.numel()))
        return super().weight(w)

    def truncate(self, x, shift, bits, rounding):
        self.calls.append((f"truncate/{rounding}", bits))
        return super().truncate(x, shift, bits, rounding)

    def clamp(self, x, lo, hi, bits):
        self.calls.append(("clamp", bits))
        return super().clamp(x, lo, hi, bits)

    def max_pool2d(self, x, kernel_size, stride, padding, dilation, ceil_mode, bits):
        self.calls.append(("max_pool2d", bits))
        return super().max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode, bits)


def test_a_pluggable_backend_runs_the_program_through_the_interface():
    torch.manual_seed(0)
    x = torch.randn(16, 3, 10, 10)
    model = Wrap(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(128, 10))
    qmodel = quantize_eager(model.eval(), x, "x86", [["body.0", "body.1"]])
    program = from_quantized(qmodel, x[:2])
    backend = CountingBackend()
    assert torch.equal(run_float(program, x, backend), qmodel(x))
    kinds = [k for k, _ in backend.calls]
    assert kinds.count("weight") == 4  # conv and linear weights and biases
    assert kinds.count("truncate/half_up") == 2 and kinds.count("max_pool2d") == 1
    # comparisons on int8 layers are short: that is what makes quantized inference cheap
    assert all(bits <= 12 for kind, bits in backend.calls if kind in ("clamp", "max_pool2d"))
    # parties other than the model owner hold the program without the weights' values
    public = program.public_copy()
    assert public.describe() == program.describe()
    for mine, theirs in zip(program.nodes, public.nodes):
        for key, w in mine.weights.items():
            assert theirs.weights[key].is_meta and theirs.weights[key].shape == w.shape


# --- FX graph mode and PT2E --------------------------------------------------------------


class Composite(nn.Module):
    """Plain torch ops for FX / export; two variants cover every supported op between them.

    ``a``: conv-relu, conv-bn-relu, residual add-relu, relu6, padded max-pool, cat,
    flatten-linear. ``b``: hardswish, mul, add, padded avg-pool, nearest upsample (scale and
    size), hardtanh, adaptive average pool, linear.
    """

    def __init__(self, variant: str):
        super().__init__()
        self.variant = variant
        self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.c3, self.c4 = nn.Conv2d(8, 8, 1), nn.Conv2d(8, 8, 1)  # each called once (PT2E partitions)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(16 * 3 * 3 if variant == "a" else 8 * 3 * 3, 10)

    def forward(self, x):
        y = F.relu(self.c1(x))
        if self.variant == "a":
            y = F.relu(self.bn(self.c2(y)))
            y = F.relu(y + self.c3(y))
            y = F.max_pool2d(F.relu6(y), 3, 2, 1)
            y = torch.cat([y, F.relu(self.c4(y))], 1)
            y = F.max_pool2d(y, 2)
        else:
            y = F.hardswish(self.c2(y))
            y = y * self.c3(y)
            y = F.avg_pool2d(y + self.c4(y), 3, 1, 1)
            y = F.interpolate(F.max_pool2d(y, 2), scale_factor=2, mode="nearest")
            y = F.interpolate(F.hardtanh(y, 0.0, 4.0), size=(6, 6), mode="nearest")
            y = F.adaptive_avg_pool2d(y, 3)
        return self.fc(torch.flatten(y, 1))


@pytest.mark.parametrize("variant", ["a", "b"])
def test_fx_ops(variant):
    torch.manual_seed(0)
    x = torch.randn(32, 3, 12, 12)
    program, _ = check(quantize_fx(Composite(variant).eval(), x), x)
    assert program.output_info.kind == "quant"


@requires_torchao
@pytest.mark.parametrize("per_channel", [True, False], ids=["per_channel", "per_tensor"])
@pytest.mark.parametrize("variant", ["a", "b"])
def test_pt2e_ops(variant, per_channel):
    torch.manual_seed(0)
    x = torch.randn(32, 3, 12, 12)
    check(quantize_pt2e(Composite(variant).eval(), x, per_channel), x)


@requires_torchao
def test_pt2e_even_window_average_of_int8_values():
    """PT2E averages dequantized int8 values in float32: exact ties (a 2x2 mean at k + 1/2)
    round by float noise in torch, by round-half-even here; everything else is identical."""
    torch.manual_seed(0)
    x = torch.randn(32, 3, 12, 12)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(6)).eval()
    _, rows = check(quantize_pt2e(model, x), x, min_agree=0.9)
    assert rows[-1].agree < 1  # the ties


@requires_torchao
def test_pt2e_conv_relu_quantize_folds_into_one_integer_conv():
    torch.manual_seed(0)
    x = torch.randn(16, 3, 12, 12)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(8 * 36, 10)).eval()
    program = from_quantized(quantize_pt2e(model, x), x[:2])
    # DQ(x), DQ(w) -> conv -> relu -> Q -> DQ -> maxpool -> Q: one integer conv, one max-pool
    assert [n.op for n in program.nodes] == ["input", "conv2d", "max_pool2d", "reshape", "linear"]
    conv = program.nodes[1]
    assert conv.weights["weight"].abs().max() <= 128  # int8 weights, secret in MPC
    rescale = conv.attrs["rescale"]
    assert rescale.lo == conv.out.zero_point  # the ReLU, as a clamp at the zero point
    assert isinstance(rescale.multiplier, torch.Tensor) and rescale.multiplier.shape == (8, 1, 1)
