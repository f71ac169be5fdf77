"""Run a :class:`~crypten_lite.quantized.ir.QuantizedProgram` on a :class:`Backend`.

The input is encoded by its owner in plaintext (quantized exactly as torch's
``quantize_per_tensor``: ``clamp(round(x * (1 / scale)) + zero_point, qmin, qmax)``, or scaled
by ``2**frac_bits`` for a float input) and then handed to ``backend.input``; every later step
is one function of :data:`EXECUTORS`, written only with :class:`Backend` operations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from crypten_lite.quantized.backend import Backend, PlainBackend, Value
from crypten_lite.quantized.ir import FIXED, Node, QuantizedProgram, Rescale, ValueInfo


def encode_input(node: Node, x: torch.Tensor) -> torch.Tensor:
    """The input owner's plaintext step: float tensor -> int64 tensor."""
    a = node.attrs
    x = x.detach().to(torch.float32)
    if a["kind"] == FIXED:
        return torch.round(x.to(torch.float64) * (1 << a["frac_bits"])).to(torch.int64)
    # the formula of torch's quantize_per_tensor (float32, half to even)
    q = torch.round(x * (1.0 / a["scale"])) + a["zero_point"]
    return torch.clamp(q, a["qmin"], a["qmax"]).to(torch.int64)


def decode_output(info: ValueInfo, y: torch.Tensor) -> torch.Tensor:
    """Revealed integers -> float32 reals (what the dequantized torch model returns)."""
    return info.to_real(y).to(torch.float32)


def run(program: QuantizedProgram, x: torch.Tensor, backend: Backend, debug: bool = False):
    """Execute the program on input ``x`` (a float tensor held by the data owner).

    Returns the backend value of the output (integers with ``program.output_info``), or
    with ``debug=True`` the pair ``(output, {value name: backend value})`` for every node.
    """
    values: dict[str, Value] = {}
    first = program.input
    values[first.name] = backend.input(encode_input(first, x))
    for node in program.nodes[1:]:
        args = [values[name] for name in node.inputs]
        weights = {key: backend.weight(w) for key, w in node.weights.items()}
        values[node.name] = EXECUTORS[node.op](backend, node, args, weights)
    out = values[program.output]
    return (out, values) if debug else out


def run_float(program: QuantizedProgram, x: torch.Tensor, backend: Backend | None = None) -> torch.Tensor:
    """Run, reveal and dequantize the output (plaintext backend by default)."""
    backend = backend or PlainBackend()
    y = backend.reveal(run(program, x, backend))
    return decode_output(program.output_info, y)


def apply_rescale(backend: Backend, v: Value, rs: Rescale, bias: Value | None = None) -> Value:
    """``clamp(round((v * multiplier + bias) / 2**shift) + offset, lo, hi)``."""
    if not (isinstance(rs.multiplier, int) and rs.multiplier == 1):
        v = backend.mul_public(v, rs.multiplier)
    if bias is not None:
        v = backend.add(v, bias)
    if rs.shift:
        v = backend.truncate(v, rs.shift, rs.in_bits, rs.rounding)
    if rs.offset:
        v = backend.add_public(v, rs.offset)
    if rs.lo is not None or rs.hi is not None:
        v = backend.clamp(v, rs.lo, rs.hi, rs.out_bits)
    return v


def _centered(backend: Backend, x: Value, zero_point: int) -> Value:
    return backend.add_public(x, -zero_point) if zero_point else x


def _conv2d(backend, node, args, weights):
    a = node.attrs
    x = _centered(backend, args[0], a["in_zero_point"])
    acc = backend.conv2d(x, weights["weight"], a["stride"], a["padding"], a["dilation"], a["groups"])
    return apply_rescale(backend, acc, a["rescale"], weights.get("bias"))


def _linear(backend, node, args, weights):
    x = _centered(backend, args[0], node.attrs["in_zero_point"])
    acc = backend.matmul(x, weights["weight"])
    return apply_rescale(backend, acc, node.attrs["rescale"], weights.get("bias"))


def _requantize(backend, node, args, weights):
    x = _centered(backend, args[0], node.attrs["in_zero_point"])
    return apply_rescale(backend, x, node.attrs["rescale"])


def _add(backend, node, args, weights):
    a = node.attrs
    acc = None
    for x, z, m in zip(args, a["zero_points"], a["multipliers"]):
        term = _centered(backend, x, z)
        term = backend.mul_public(term, m) if m != 1 else term
        acc = term if acc is None else backend.add(acc, term)
    return apply_rescale(backend, acc, a["rescale"])


def _mul(backend, node, args, weights):
    za, zb = node.attrs["zero_points"]
    acc = backend.mul(_centered(backend, args[0], za), _centered(backend, args[1], zb))
    return apply_rescale(backend, acc, node.attrs["rescale"])


def _cat(backend, node, args, weights):
    return backend.cat(args, node.attrs["dim"])


def _clamp(backend, node, args, weights):
    a = node.attrs
    return backend.clamp(args[0], a["lo"], a["hi"], a["bits"])


def _hardswish(backend, node, args, weights):
    a = node.attrs
    x = _centered(backend, args[0], a["in_zero_point"])
    u = backend.add_public(backend.mul_public(x, 1 << a["k"]) if a["k"] else x, a["c3"])
    t = backend.clamp(u, a["t_lo"], a["t_hi"], a["t_bits"]) if (a["t_lo"], a["t_hi"]) != (None, None) else u
    return apply_rescale(backend, backend.mul(x, t), a["rescale"])


def _max_pool2d(backend, node, args, weights):
    a = node.attrs
    return backend.max_pool2d(args[0], a["kernel_size"], a["stride"], a["padding"], a["dilation"],
                              a["ceil_mode"], a["bits"])


def _avg_pool2d(backend, node, args, weights):
    a = node.attrs
    x = _centered(backend, args[0], a["in_zero_point"])
    acc = backend.sum_pool2d(x, a["kernel_size"], a["stride"], a["padding"], a["ceil_mode"])
    return apply_rescale(backend, acc, a["rescale"])


def _reshape(backend, node, args, weights):
    return backend.reshape(args[0], node.attrs["shape"])


def _permute(backend, node, args, weights):
    return backend.permute(args[0], node.attrs["dims"])


def _upsample_nearest2d(backend, node, args, weights):
    y = backend.index_select(args[0], 2, node.attrs["index_h"])
    return backend.index_select(y, 3, node.attrs["index_w"])


Executor = Callable[[Backend, Node, list, dict], Any]

# One line per IR op (the keys of ir.OPS except "input", which run() handles).
EXECUTORS: dict[str, Executor] = {
    "conv2d": _conv2d,
    "linear": _linear,
    "requantize": _requantize,
    "add": _add,
    "mul": _mul,
    "cat": _cat,
    "clamp": _clamp,
    "hardswish": _hardswish,
    "max_pool2d": _max_pool2d,
    "avg_pool2d": _avg_pool2d,
    "reshape": _reshape,
    "permute": _permute,
    "upsample_nearest2d": _upsample_nearest2d,
}


@dataclass(frozen=True)
class LayerDiff:
    """Agreement of one torch graph value with the program's value for it.

    ``max_steps``: largest difference in steps of the program value (one quantization step,
    or ``2**-frac_bits`` for fixed values); ``agree``: fraction of elements with equal
    integers (torch quantized / int8 values) or within one step (torch float values);
    ``max_abs``: largest difference of the real values.
    """

    name: str
    kind: str
    max_steps: float
    agree: float
    max_abs: float

    def __str__(self) -> str:
        return (f"{self.name:<32} {self.kind:<5} max diff {self.max_steps:9.3f} steps  "
                f"agree {100 * self.agree:7.3f}%  max |real diff| {self.max_abs:.3g}")


def compare_layers(program: QuantizedProgram, model: torch.nn.Module, x: torch.Tensor) -> list[LayerDiff]:
    """Per-layer agreement of the plaintext program with ``model`` on input ``x``."""
    from crypten_lite.quantized.convert import record, trace  # convert imports this module

    gm = trace(model)
    samples = record(gm, x)
    _, values = run(program, x, PlainBackend(), debug=True)
    rows = []
    for node in gm.graph.nodes:
        if node.op == "placeholder" or node.name not in program.sources:
            continue
        name, info = program.sources[node.name]
        ours = values[name]
        ref = samples[node]
        if ref.is_quantized:
            ref_int, ref_real = ref.int_repr().to(torch.int64), ref.dequantize().to(torch.float64)
        elif ref.dtype in (torch.uint8, torch.int8, torch.int32):
            ref_int, ref_real = ref.to(torch.int64), info.to_real(ref.to(torch.int64))
        else:
            ref_int, ref_real = None, ref.detach().to(torch.float64)
        real_diff = (info.to_real(ours) - ref_real).abs()
        if ref_int is not None and info.kind != FIXED:
            steps = (ours - ref_int).abs().to(torch.float64)
            agree = (steps == 0).double().mean().item()
        else:
            steps = real_diff / info.scale
            agree = (steps <= 1).double().mean().item()
        max_steps = float(steps.max()) if steps.numel() else 0.0
        max_abs = float(real_diff.max()) if real_diff.numel() else 0.0
        rows.append(LayerDiff(node.name, info.kind, max_steps, agree, max_abs))
    return rows
