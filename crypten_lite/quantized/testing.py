"""Helpers for tests and benchmarks: quantize a float model three ways, measure agreement.

``quantize_eager`` / ``quantize_fx`` / ``quantize_pt2e`` run torch's own post-training
quantization flows (calibrating on ``calib``); :func:`output_agreement` runs a converted
program on any backend and compares its output with the torch model's, so an MPC backend is
checked with the same code as :class:`~crypten_lite.quantized.backend.PlainBackend`.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Sequence

import torch
import torch.nn as nn

from crypten_lite._quiet import install as _quiet_logs, torch_ao_notes
from crypten_lite.errors import UnsupportedError
from crypten_lite.quantized.backend import Backend, PlainBackend
from crypten_lite.quantized.executor import LayerDiff, diff_values, run
from crypten_lite.quantized.ir import QuantizedProgram


def quantize_eager(
    model: nn.Module,
    calib: torch.Tensor,
    qconfig: str | object = "x86",
    fuse: Sequence[Sequence[str]] = (),
    qat: bool = False,
) -> nn.Module:
    """Eager ``prepare`` / ``convert`` (the model has QuantStub / DeQuantStub / FloatFunctional).

    ``qconfig``: a backend name for ``get_default_qconfig`` (per-channel weights),
    ``"per_tensor"`` for ``default_qconfig``, or a QConfig. ``fuse``: module name groups to
    fuse (conv-bn-relu, linear-relu). ``qat``: go through ``prepare_qat`` (ConvBn QAT modules
    folded at convert), without training.
    """
    from torch.ao import quantization as tq

    model = copy.deepcopy(model)
    if qconfig == "per_tensor":
        qconfig = tq.default_qconfig
    elif isinstance(qconfig, str):
        qconfig = tq.get_default_qat_qconfig(qconfig) if qat else tq.get_default_qconfig(qconfig)
    model.qconfig = qconfig
    if qat:
        model.train()
        if fuse:
            model = tq.fuse_modules_qat(model, [list(f) for f in fuse])
        prepared = tq.prepare_qat(model)
    else:
        model.eval()
        if fuse:
            model = tq.fuse_modules(model, [list(f) for f in fuse])
        prepared = tq.prepare(model)
    with torch.no_grad(), torch_ao_notes():
        prepared(calib)
        return tq.convert(prepared.eval())


def quantize_fx(model: nn.Module, calib: torch.Tensor, backend: str = "x86") -> nn.Module:
    """FX graph mode ``prepare_fx`` / ``convert_fx`` with the backend's default mapping."""
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    model = copy.deepcopy(model).eval()
    with torch_ao_notes():
        prepared = prepare_fx(model, get_default_qconfig_mapping(backend), (calib[:2],))
        with torch.no_grad():
            prepared(calib)
        return convert_fx(prepared)


def quantize_pt2e(model: nn.Module, calib: torch.Tensor, per_channel: bool = True) -> nn.Module:
    """torchao PT2E: ``torch.export`` (dynamic batch), X86InductorQuantizer, calibrate, convert."""
    _quiet_logs()  # torchao's notes about its CUDA kernels at import (crypten_lite._quiet)
    from torchao.quantization.pt2e.observer import MinMaxObserver
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import QuantizationSpec
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    model = copy.deepcopy(model).eval()
    with torch_ao_notes():  # torch's observers' reduce_range note (crypten_lite._quiet)
        batch = torch.export.Dim("batch")
        exported = torch.export.export(model, (calib[:2],), dynamic_shapes=({0: batch},)).module()
        config = get_default_x86_inductor_quantization_config()
        if not per_channel:
            weight = QuantizationSpec(
                dtype=torch.int8, quant_min=-128, quant_max=127, qscheme=torch.per_tensor_symmetric,
                observer_or_fake_quant_ctr=MinMaxObserver.with_args(eps=2**-12),
            )
            config = dataclasses.replace(config, weight=weight)
        quantizer = X86InductorQuantizer()
        quantizer.set_global(config)
        prepared = prepare_pt2e(exported, quantizer)
        with torch.no_grad():
            prepared(calib)
        return convert_pt2e(prepared)


def output_agreement(
    program: QuantizedProgram, model: nn.Module, x: torch.Tensor, backend: Backend | None = None
) -> LayerDiff:
    """Compare the program's output on ``backend`` with the torch model's output on ``x``.

    Quantized outputs are compared as integers (``agree`` = fraction identical), float
    outputs in steps of the program's output scale.
    """
    backend = backend or PlainBackend()
    ours = backend.reveal(run(program, x, backend))
    best = None
    for ref in _torch_outputs(model, x):
        diff = diff_values("output", program.output_info, ours, ref)
        if best is None or (diff.agree, -diff.max_abs) > (best.agree, -best.max_abs):
            best = diff
    return best


def _torch_outputs(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """torch's answers for ``model(x)``: as it runs and, where an average pooling ran on a
    channels-last input, with every pooling fed a contiguous one (torch's quantized pooling
    rounds ties differently by layout on CPUs without AVX-512; :func:`compare_layers` does
    the same). A model that does not trace has its one answer."""
    from crypten_lite.quantized.convert import torch_answers, trace

    def first(out):
        return out[0] if isinstance(out, (tuple, list)) else out

    try:
        gm = trace(model)
    except UnsupportedError:
        with torch.no_grad():
            return [first(model(x))]
    return [first(next(v for n, v in samples.items() if n.op == "output")) for samples in torch_answers(gm, x)]
