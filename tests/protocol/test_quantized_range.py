"""Quantized programs refuse inputs outside the range their static bit bounds assume.

Regression test of issue 11, finding 3: a float-input program assumes |x| < 2**8 and every
comparison and rounding of its MPC run uses bit bounds derived from that; nothing checked it,
so `max(-5000, 0)` returned -5000, `clamp(4200, -128, 127)` returned 4455 and a dynamically
quantized Linear-ReLU-Linear on inputs near 3000 returned values unrelated to torch's. The data
owner now checks its plaintext input before anything is sent: outside the range every party
raises ProtocolError (the owner's names the bound), or with `clamp_input=True` the input is
clamped into it. A CrypTensor input (secret, uncheckable) is clamped into the range in MPC.
Fixed-point `cryptensor()` inputs whose encoding overflows are refused on every party too.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import crypten_lite
from crypten_lite.errors import ProtocolError
from crypten_lite.quantized import from_quantized
from crypten_lite.quantized.backend import PlainBackend
from crypten_lite.quantized.executor import input_range, run_float

OWNER = 1  # src_input of run_private


class Clamp(nn.Module):
    def forward(self, x):
        return torch.clamp(x, -128, 127)


def _dynamic(model: nn.Module) -> nn.Module:
    return torch.ao.quantization.quantize_dynamic(model.eval(), {nn.Linear}, dtype=torch.qint8)


def _mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval()
    return model, _dynamic(model)


def _programs():
    relu = from_quantized(_dynamic(nn.Sequential(nn.ReLU())), torch.zeros(1, 3))
    clamp = from_quantized(_dynamic(Clamp()), torch.zeros(1, 3))
    model, qmodel = _mlp()
    mlp = from_quantized(qmodel, torch.zeros(2, 16))
    return relu, clamp, mlp


def _int8_reference(qmodel: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The float MLP with torch's int8 weights (what a dynamic Linear computes in fixed point)."""
    first, second = qmodel[0], qmodel[2]
    h = F.relu(F.linear(x, first.weight().dequantize(), first.bias()))
    return F.linear(h, second.weight().dequantize(), second.bias())


# ------------------------------------------------------------------ party functions
def party_run(jobs):
    """run_private on each (name, program, owner's input, options): ('error', message) or
    ('value', output) at every party."""
    from crypten_lite.quantized import run_private

    out = {}
    for name, program, x, options in jobs:
        try:
            y = run_private(program, x if crypten_lite.get_rank() == OWNER else None,
                            src_input=OWNER, **options)
            out[name] = ("value", y)
        except ProtocolError as e:
            out[name] = ("error", str(e))
    return out


def party_cryptensor_input(program, x):
    """A float program on a CrypTensor input (secret): clamped into the range in MPC."""
    enc = crypten_lite.cryptensor(x if crypten_lite.get_rank() == OWNER else None, src=OWNER)
    return program(enc).get_plain_text()


def party_fixed_point_overflow():
    """cryptensor() of a value whose fixed-point encoding overflows: refused on every party."""
    try:
        crypten_lite.cryptensor(torch.tensor([1.0, 1e15]) if crypten_lite.get_rank() == 0 else None)
        got = ("value", None)
    except ProtocolError as e:
        got = ("error", str(e))
    ok = crypten_lite.cryptensor(torch.tensor([2.5]) if crypten_lite.get_rank() == 0 else None)
    return got, ok.get_plain_text().tolist()


# ------------------------------------------------------------------ tests
@pytest.fixture(params=["pool2", "pool3", "pool3_rss"], ids=["2pc", "3pc", "3rss"])
def pool_q(request):
    """2 and 3 parties (additive, dealer) and 3 parties under rss (no dealer)."""
    return request.getfixturevalue(request.param)


def test_range_of_a_float_program_in_plaintext():
    relu, clamp, mlp = _programs()
    assert input_range(relu.input) == [-256.0, 256.0 - 2.0 ** -20]
    with pytest.raises(ProtocolError, match=r"\[-256, 255.99999.*values themselves are not shown") as err:
        run_float(relu, torch.tensor([[-5000.0, 1.0, 2.0]]))
    assert "5000" not in str(err.value)  # the owner's values never appear in an error
    with pytest.raises(ProtocolError, match="NaN"):
        run_float(relu, torch.tensor([[float("nan"), 1.0, 2.0]]))
    # near the bound, the static bounds hold (PlainBackend checks every bits hint)
    _, qmodel = _mlp()
    x = (torch.rand(8, 16, generator=torch.Generator().manual_seed(1)) * 2 - 1) * 255.9
    y = run_float(mlp, x, PlainBackend(check_bits=True))
    ref = _int8_reference(qmodel, x)
    assert (y - ref).abs().max() <= 1e-4 * ref.abs().max()
    torch_out = qmodel(x)  # its own activation quantization adds an error of about 1%
    assert (y - torch_out).abs().max() <= 0.03 * torch_out.abs().max()


def test_out_of_range_inputs_fail_on_every_party(pool_q):
    pool = pool_q
    relu, clamp, mlp = _programs()
    _, qmodel = _mlp()
    near_3000 = 3000 + torch.randn(2, 16, generator=torch.Generator().manual_seed(2))
    in_range = torch.tensor([[-200.0, 100.0, 3.25]])
    jobs = [
        ("relu", relu, torch.tensor([[-5000.0, 1.5, 2.0]]), {}),
        ("clamp", clamp, torch.tensor([[4200.0, 1.5, -2.0]]), {}),
        ("mlp", mlp, near_3000, {}),
        ("relu_clamped", relu, torch.tensor([[-5000.0, 1.5, 2.0]]), {"clamp_input": True}),
        ("clamp_clamped", clamp, torch.tensor([[4200.0, 1.5, -2.0]]), {"clamp_input": True}),
        ("relu_ok", relu, in_range, {}),
        ("clamp_ok", clamp, in_range, {}),
        ("mlp_ok", mlp, near_3000 / 12, {}),
    ]
    results = pool.run(party_run, jobs)
    for rank, res in enumerate(results):
        for name in ("relu", "clamp", "mlp"):
            status, message = res[name]
            assert status == "error", (rank, name, message)
            if rank == OWNER:
                assert "outside its supported range [-256, 255.99999" in message, message
            else:
                assert f"party {OWNER} refused to share its input" in message, message
        # the documented clamp option: the input is clamped to [-256, 256), then the op runs
        assert torch.equal(res["relu_clamped"][1], torch.tensor([[0.0, 1.5, 2.0]]))
        assert torch.equal(res["clamp_clamped"][1], torch.tensor([[127.0, 1.5, -2.0]]))
        assert torch.equal(res["relu_ok"][1], F.relu(in_range))
        assert torch.equal(res["clamp_ok"][1], torch.clamp(in_range, -128, 127))
        y, x = res["mlp_ok"][1], near_3000 / 12
        ref = _int8_reference(qmodel, x)
        assert (y - ref).abs().max() <= 1e-4 * ref.abs().max()
        torch_out = qmodel(x)
        assert (y - torch_out).abs().max() <= 0.03 * torch_out.abs().max()


def test_secret_input_is_clamped_into_the_range(pool_q):
    pool = pool_q
    relu, clamp, _ = _programs()
    x = torch.tensor([[-5000.0, 4200.0, 3.5]])
    for program, expected in ((relu, [0.0, 256.0, 3.5]), (clamp, [-128.0, 127.0, 3.5])):
        for y in pool.run(party_cryptensor_input, program, x):
            assert (y - torch.tensor([expected])).abs().max() <= 1e-4, y


def test_fixed_point_overflow_is_refused_on_every_party(pool_q):
    pool = pool_q
    for rank, ((status, message), after) in enumerate(pool.run(party_fixed_point_overflow)):
        assert status == "error", (rank, message)
        if rank == 0:
            assert "out of the fixed-point range: |x| must be < 2^46" in message, message
        else:
            assert "party 0 refused to share its input" in message, message
        assert after == [2.5]


def _one_large_weight_per_channel(layer: nn.Module, generator: torch.Generator) -> None:
    """Weights whose int8 values are one +-127 per output channel and others in {-1, 0, 1}.

    torch's x86 int8 kernels on CPUs without AVX-512 VNNI add pairs of uint8 x int8 products
    in int16 with saturation (vpmaddubsw): once activations reach the ends of the uint8 range,
    as inputs far outside the calibration range do, torch's result is not the exact integer
    one (the program's). With these weights a pair is at most 255 * 128 < 2**15, so torch is
    exact on every CPU.
    """
    with torch.no_grad():
        w = layer.weight.view(layer.weight.shape[0], -1)
        w.copy_(0.002 * torch.randn(w.shape, generator=generator))
        big = torch.randint(0, w.shape[1], (w.shape[0],), generator=generator)
        sign = torch.randint(0, 2, (w.shape[0],), generator=generator) * 2 - 1
        w[torch.arange(w.shape[0]), big] = sign.to(w.dtype)


def test_int8_program_bounds_hold_for_inputs_of_any_magnitude():
    """An int8 input is clamped to [qmin, qmax] by its owner (as torch does), so the static
    bounds of every later activation hold however large the float input is: PlainBackend
    checks every bits hint, and the output equals torch's."""
    from crypten_lite.quantized.executor import decode_output, run
    from crypten_lite.quantized.testing import quantize_fx

    def make():
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(8 * 4 * 4, 10)).eval()

    torch.manual_seed(0)
    calib = torch.randn(32, 3, 8, 8)
    random_weights = make()
    exact_on_every_cpu = make()
    g = torch.Generator().manual_seed(5)
    _one_large_weight_per_channel(exact_on_every_cpu[0], g)
    _one_large_weight_per_channel(exact_on_every_cpu[4], g)
    for model in (random_weights, exact_on_every_cpu):
        qmodel = quantize_fx(model, calib)
        program = from_quantized(qmodel, calib[:2])
        g = torch.Generator().manual_seed(3)
        for scale in (1.0, 1e3, 1e6):
            x = torch.randn(4, 3, 8, 8, generator=g) * scale
            backend = PlainBackend(check_bits=True)  # raises if a value leaves its static bounds
            y = decode_output(program.output_info, backend.reveal(run(program, x, backend)))
            if model is exact_on_every_cpu or scale == 1.0:  # torch's kernels saturate on some CPUs
                assert torch.equal(y, qmodel(x)), scale
            assert not torch.equal(y, torch.zeros_like(y))  # the clamped inputs still reach the output
