"""A small CNN on scikit-learn's 8x8 digits, quantized three ways, against torch on 200 images.

conv-relu-maxpool-conv-relu, a residual add, a cat, adaptive average pooling, flatten,
linear. Trained for a few epochs, calibrated on training images, compared on 200 held-out
images; run with ``-s`` to see the agreement figures (they are quoted in docs/quantized.md).
"""

from __future__ import annotations

import importlib.util
import pathlib
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.ao.nn.quantized import FloatFunctional
from torch.ao.quantization import DeQuantStub, QuantStub

from crypten_lite.errors import UnsupportedError
from crypten_lite.quantized import compare_layers, from_quantized
from crypten_lite.quantized.executor import decode_output, run, run_float
from crypten_lite.quantized.backend import PlainBackend
from crypten_lite.quantized.testing import output_agreement, quantize_eager, quantize_fx, quantize_pt2e

# PT2E needs torchao (the "quantization" extra)
def _generator():
    path = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "gen_doc_figures.py"
    spec = importlib.util.spec_from_file_location("gen_doc_figures", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()  # docs/quantized_agreement.json's figures for this CPU class
requires_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao not installed")

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*deprecat",
    "ignore:Please use quant_min",
    "ignore:The input of maxpool2d is not quantized",
    "ignore:All inputs of this cat operator must share",  # FX requantizes them; so do we
)


class DigitsNet(nn.Module):
    """The same network for all three flows; ``eager`` adds the stubs and FloatFunctionals."""

    def __init__(self, eager: bool = False):
        super().__init__()
        self.eager = eager
        self.quant, self.dequant = QuantStub(), DeQuantStub()
        self.conv1, self.relu1 = nn.Conv2d(1, 8, 3, padding=1), nn.ReLU()
        self.pool1 = nn.MaxPool2d(2)
        self.conv2, self.relu2 = nn.Conv2d(8, 8, 3, padding=1), nn.ReLU()
        self.skip, self.join = FloatFunctional(), FloatFunctional()
        self.pool2 = nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(16 * 2 * 2, 10)

    def forward(self, x):
        if self.eager:
            x = self.quant(x)
        a = self.pool1(self.relu1(self.conv1(x)))  # 8x8 -> 4x4
        b = self.relu2(self.conv2(a))
        s = self.skip.add(a, b) if self.eager else a + b
        c = self.join.cat([s, a], 1) if self.eager else torch.cat([s, a], 1)
        y = self.fc(torch.flatten(self.pool2(c), 1))
        return self.dequant(y) if self.eager else y


@pytest.fixture(scope="module")
def digits():
    """(float model, calibration images, 200 test images, their labels)."""
    return digits_data()


def digits_data():
    """The seeded float model, calibration images, 200 test images and their labels (also used
    by scripts/gen_doc_figures.py --measure-quantized)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(data.target)
    torch.manual_seed(0)
    perm = torch.randperm(len(x))
    train, test = perm[:-200], perm[-200:]
    # trained in float64 (the same weights on every CPU model: examples/quantized_inference.train)
    model = DigitsNet().double()
    x64 = x.double()
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    for _ in range(4):
        for i in range(0, len(train), 128):
            idx = train[i:i + 128]
            opt.zero_grad()
            F.cross_entropy(model(x64[idx]), y[idx]).backward()
            opt.step()
    return model.float().eval(), x[train[:400]], x[test], y[test]


def _eager_copy(model: DigitsNet) -> DigitsNet:
    eager = DigitsNet(eager=True)
    eager.load_state_dict(model.state_dict())
    return eager.eval()


def _report(flow, program, qmodel, x, y):
    rows = compare_layers(program, qmodel, x)
    out = output_agreement(program, qmodel, x)
    ours = run_float(program, x)
    with torch.no_grad():
        ref = qmodel(x)
    same_class = (ours.argmax(1) == ref.argmax(1)).double().mean().item()
    print(f"\n[{flow}] 200 digits images: output {out}")
    print(f"[{flow}] accuracy torch {100 * (ref.argmax(1) == y).double().mean():.1f}%, "
          f"program {100 * (ours.argmax(1) == y).double().mean():.1f}%, same class {100 * same_class:.1f}%")
    for row in rows:
        print(f"[{flow}]   {row}")
    return rows, out, same_class


MULTIPLIER_SETTINGS = ((24, 62), (20, 48), (16, 40), (12, 32))  # (multiplier_bits, max_bits)


def quantize_flow(flow, model, calib):
    """The digits model quantized by one of torch's flows, as the tests below do."""
    if flow == "eager":
        return quantize_eager(_eager_copy(model), calib, "x86", [["conv1", "relu1"], ["conv2", "relu2"]])
    return quantize_fx(model, calib) if flow == "fx" else quantize_pt2e(model, calib)


def flow_figures(flow, qmodel, x, y) -> dict:
    """docs/quantized.md's agreement figures of one flow (docs/quantized_agreement.json): the
    plaintext program against torch on the test images, and the worst int8 layer and widest
    truncation at each multiplier size. Deterministic (seeded training, plaintext integers)."""
    program = from_quantized(qmodel, x[:1])
    rows = compare_layers(program, qmodel, x)
    out = output_agreement(program, qmodel, x)
    ours = run_float(program, x)
    with torch.no_grad():
        ref = qmodel(x)
    quant = [r for r in rows if r.kind == "quant"]
    figures = {"layers": len(rows), "int8_layers": len(quant), "int8_identical": min(r.agree for r in quant),
               "fixed_max_abs": float(f"{max([r.max_abs for r in rows if r.kind != 'quant'] or [0.0]):.1e}"),
               "output_kind": out.kind, "output_identical": out.agree, "output_max_abs": float(f"{out.max_abs:.1e}"),
               "class_agreement": (ours.argmax(1) == ref.argmax(1)).double().mean().item(),
               "accuracy_torch": (ref.argmax(1) == y).double().mean().item(),
               "accuracy_program": (ours.argmax(1) == y).double().mean().item(), "multipliers": []}
    for multiplier_bits, max_bits in MULTIPLIER_SETTINGS:
        row = {"multiplier_bits": multiplier_bits, "max_bits": max_bits}
        try:
            p = program if (multiplier_bits, max_bits) == (24, 62) else \
                from_quantized(qmodel, x[:1], multiplier_bits=multiplier_bits, max_bits=max_bits)
        except UnsupportedError as e:
            row["unsupported"] = str(e).split(":")[0]
        else:
            layers = rows if p is program else compare_layers(p, qmodel, x)
            worst = min((r for r in layers if r.kind == "quant"), key=lambda r: r.agree)
            row.update(int8_identical=round(worst.agree, 6), max_steps=int(worst.max_steps),
                       widest_truncation_bits=max(n.attrs["rescale"].in_bits for n in p.nodes if "rescale" in n.attrs))
        figures["multipliers"].append(row)
    return figures


def _assert_doc_figures(flow, qmodel, x, y):
    """docs/quantized.md's tables come from docs/quantized_agreement.json: the seeded run
    gives exactly its figures (if the code changed them on purpose:
    python scripts/gen_doc_figures.py --measure-quantized, then python scripts/gen_doc_figures.py)."""
    cpu = GEN.cpu_class()
    flows = GEN.agreement_figures(cpu)
    if flows is None:  # torch's calibration and int8 kernels differ by CPU class: no figures for this one
        warnings.warn(f"docs/quantized_agreement.json has no figures for this CPU class ({cpu}); to add them: "
                      "python scripts/gen_doc_figures.py --measure-quantized")
        return
    want = flows[flow]
    got = flow_figures(flow, qmodel, x, y)
    assert got == want, f"{flow} on {cpu}: docs/quantized_agreement.json has {want}, the code gives {got}"


def _assert_int8_agreement(rows):
    quant = [r for r in rows if r.kind == "quant"]
    assert quant
    for row in quant:
        assert row.agree >= 0.99 and row.max_steps <= 1, str(row)


def test_digits_eager(digits):
    model, calib, x, y = digits
    qmodel = quantize_eager(_eager_copy(model), calib, "x86", [["conv1", "relu1"], ["conv2", "relu2"]])
    program = from_quantized(qmodel, x[:1])
    rows, out, same_class = _report("eager", program, qmodel, x, y)
    _assert_int8_agreement(rows)
    assert out.kind == "quant" and out.agree >= 0.99 and out.max_steps <= 1
    assert same_class >= 0.99
    _assert_doc_figures("eager", qmodel, x, y)


def test_digits_fx(digits):
    model, calib, x, y = digits
    qmodel = quantize_fx(model, calib)
    program = from_quantized(qmodel, x[:1])
    rows, out, same_class = _report("fx", program, qmodel, x, y)
    _assert_int8_agreement(rows)
    assert out.kind == "quant" and out.agree >= 0.99 and out.max_steps <= 1
    assert same_class >= 0.99
    _assert_doc_figures("fx", qmodel, x, y)


@requires_torchao
def test_digits_pt2e(digits):
    model, calib, x, y = digits
    qmodel = quantize_pt2e(model, calib)
    program = from_quantized(qmodel, x[:1])
    rows, out, same_class = _report("pt2e", program, qmodel, x, y)
    _assert_int8_agreement(rows)
    # the graph ends in a float linear: its output is kept in fixed point
    assert out.kind == "fixed" and out.max_abs < 1e-3
    assert same_class >= 0.99
    _assert_doc_figures("pt2e", qmodel, x, y)
    # the per-layer debug outputs of the executor line up with the program
    _, values = run(program, x[:4], PlainBackend(), debug=True)
    assert set(values) == {n.name for n in program.nodes}
    assert torch.equal(decode_output(program.output_info, values[program.output]), run_float(program, x[:4]))


def test_unsupported_ops_name_the_node_and_the_table():
    torch.manual_seed(0)
    x = torch.randn(8, 3, 6, 6)

    class Fx(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x):
            return torch.sigmoid(self.conv(x))

    with pytest.raises(UnsupportedError) as err:
        from_quantized(quantize_fx(Fx().eval(), x), x[:2])
    message = str(err.value)
    assert "'sigmoid'" in message and "sigmoid" in message.split("target")[1]
    assert "FUNCTION_HANDLERS" in message and "ir.OPS" in message

    eager = nn.Sequential(QuantStub(), nn.Conv2d(3, 4, 3), nn.Sigmoid(), DeQuantStub()).eval()
    with pytest.raises(UnsupportedError, match=r"call_module node '_2' \(target Sigmoid\).*MODULE_HANDLERS"):
        from_quantized(quantize_eager(eager, x), x[:2])
