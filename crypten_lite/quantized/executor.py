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

from crypten_lite.errors import ProtocolError
from crypten_lite.quantized.backend import Backend, PlainBackend, Value
from crypten_lite.quantized.ir import FIXED, QUANT, Divide, Node, QuantizedProgram, Rescale, ValueInfo


def encode_input(node: Node, x: torch.Tensor, clamp: bool = False) -> torch.Tensor:
    """The input owner's plaintext step: float tensor -> int64 tensor.

    A float (fixed) input must lie in :func:`input_range` (``|x| < 2**fixed_input_bits``, 256
    by default): the program's static bit bounds, hence every comparison and rounding in MPC,
    assume it. Outside it raises ProtocolError naming the bound, or with ``clamp=True`` is
    clamped into it. A quantized input is clamped to ``[qmin, qmax]`` exactly as torch does.
    NaN is refused for both. Meta tensors (parties without the input) pass unchecked.
    """
    a = node.attrs
    x = x.detach().to(torch.float32)
    if not x.is_meta and bool(torch.isnan(x).any()):
        raise ProtocolError("input of the quantized program contains NaN; only numbers can be quantized")
    if a["kind"] == FIXED:
        scaled = torch.round(x.to(torch.float64) * (1 << a["frac_bits"]))
        lo, hi = node.out.lo, node.out.hi
        if not x.is_meta and scaled.numel() and bool(((scaled < lo) | (scaled > hi)).any()):
            if not clamp:
                low, high = input_range(node)
                raise ProtocolError(
                    f"input of the quantized program outside its supported range [{low:g}, {high:.9g}] "
                    f"(|x| < 2**{(hi + 1).bit_length() - 1 - a['frac_bits']}, the float input range "
                    f"its static bit bounds assume; the values themselves are not shown); "
                    "rescale the input, build the program with a larger fixed_input_bits, or pass "
                    "clamp_input=True to clamp it into the range")
            scaled = scaled.clamp(lo, hi)
        return scaled.to(torch.int64)
    # the formula of torch's quantize_per_tensor (float32, half to even)
    q = torch.round(x * (1.0 / a["scale"])) + a["zero_point"]
    return torch.clamp(q, a["qmin"], a["qmax"]).to(torch.int64)


def input_range(node: Node) -> tuple[float, float]:
    """Real values the program's input may take: ``[-2**b, 2**b - 2**-frac_bits]`` for a float
    (fixed) input with ``b = fixed_input_bits``; the dequantized ``[qmin, qmax]`` otherwise
    (outside values are clamped to it, as torch's quantize_per_tensor does)."""
    return node.out.to_real(torch.tensor([node.out.lo, node.out.hi])).tolist()


def decode_output(info: ValueInfo, y: torch.Tensor) -> torch.Tensor:
    """Revealed integers -> float32 reals (what the dequantized torch model returns)."""
    return info.to_real(y).to(torch.float32)


def run(program: QuantizedProgram, x: torch.Tensor, backend: Backend, debug: bool = False,
        clamp_input: bool = False):
    """Execute the program on input ``x`` (a float tensor held by the data owner).

    In MPC, parties without the input pass ``torch.empty(shape, device="meta")``: the
    encoded input stays a meta tensor of the right shape, for ``backend.input`` to share.

    Returns the backend value of the output (integers with ``program.output_info``), or
    with ``debug=True`` the pair ``(output, {value name: backend value})`` for every node.
    A float input outside the program's range raises ProtocolError (``clamp_input=True``:
    clamped into it; see :func:`encode_input`).
    """
    values: dict[str, Value] = {}
    first = program.input
    values[first.name] = backend.input(encode_input(first, x, clamp_input))
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
    """``clamp(round((v * multiplier + bias) / 2**shift) + offset, lo, hi)`` (Backend.rescale)."""
    return backend.rescale(v, rs, bias)


def apply_divide(backend: Backend, v: Value, dv: Divide) -> Value:
    """``clamp(round_half_even(v / d) + offset, lo, hi)``, exactly (requant.plan_exact_divide)."""
    q = backend.add_public(v, dv.k * dv.odd)  # >= 0
    q = backend.add_public(backend.mul_public(q, dv.magic), -(1 << (dv.magic_shift - 1)))
    q = backend.truncate(q, dv.magic_shift, dv.magic_bits, "half_up")  # floor(x' / o)
    q = backend.add_public(q, -dv.k) if not (isinstance(dv.k, int) and dv.k == 0) else q
    r = backend.sub(v, backend.mul_public(q, dv.odd))  # in [0, o)
    bit = backend.clamp(backend.add_public(r, -dv.bit_offset), 0, 1, dv.r_bits)
    y = backend.add(backend.mul_public(q, 2), backend.mul_public(bit, dv.bit_weight))
    y = backend.mul_public(y, dv.scale_up)
    y = backend.truncate(y, dv.shift, dv.y_bits, "half_even")
    if dv.offset:
        y = backend.add_public(y, dv.offset)
    if dv.lo is not None or dv.hi is not None:
        y = backend.clamp(y, dv.lo, dv.hi, dv.out_bits)
    return y


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
    if "pre_offset" in a:
        acc = backend.add_public(acc, a["pre_offset"])
    if "divide" in a:
        return apply_divide(backend, acc, a["divide"])
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


def diff_values(name: str, info: ValueInfo, ours: torch.Tensor, ref: torch.Tensor) -> LayerDiff:
    """Compare program integers ``ours`` (meaning ``info``) with a torch value ``ref``.

    ``ref`` may be a torch quantized tensor, an int8 / uint8 tensor (PT2E quantize output) or
    a float tensor (dequantized or float values).
    """
    if ref.is_quantized:
        ref_real = ref.dequantize().to(torch.float64)
    elif not ref.is_floating_point():
        ref_real = info.to_real(ref.to(torch.int64))
    else:
        ref_real = ref.detach().to(torch.float64)
    real_diff = (info.to_real(ours) - ref_real).abs()
    if info.kind == QUANT:
        # torch's dequantized values are exact multiples of the scale: recover the integers
        if ref.is_quantized:
            ref_int = ref.int_repr().to(torch.int64)
        elif not ref.is_floating_point():
            ref_int = ref.to(torch.int64)
        else:
            ref_int = torch.round(ref_real / info.scale).to(torch.int64) + info.zero_point
        steps = (ours - ref_int).abs().to(torch.float64)
        agree = (steps == 0).double().mean().item()
    else:
        steps = real_diff / info.scale
        agree = (steps <= 1).double().mean().item()
    max_steps = float(steps.max()) if steps.numel() else 0.0
    max_abs = float(real_diff.max()) if real_diff.numel() else 0.0
    return LayerDiff(name, info.kind, max_steps, agree, max_abs)


def compare_layers(program: QuantizedProgram, model: torch.nn.Module, x: torch.Tensor) -> list[LayerDiff]:
    """Per-layer agreement of the plaintext program with ``model`` on input ``x``.

    One row per torch graph value that the program holds (quantize outputs, dequantized
    values, float values kept in fixed point); see :class:`LayerDiff`.

    Where torch itself has two answers (its quantized average pooling rounds ties differently
    for channels-last and contiguous inputs on CPUs without AVX-512), the rows come from the
    torch run that agrees better with the program (worst int8 layer, then the mean).
    """
    # convert pulls in torch.ao.quantization, which running a program does not need
    from crypten_lite.quantized.convert import torch_answers, trace

    gm = trace(model)
    _, values = run(program, x, PlainBackend(), debug=True)
    best: list[LayerDiff] | None = None
    for samples in torch_answers(gm, x):
        rows = []
        for node in gm.graph.nodes:
            if node.op == "placeholder" or node.name not in program.sources:
                continue
            name, info = program.sources[node.name]
            rows.append(diff_values(node.name, info, values[name], samples[node]))
        if best is None or _agreement_key(rows) > _agreement_key(best):
            best = rows
    return best


def _agreement_key(rows: list[LayerDiff]) -> tuple[float, float]:
    agree = [r.agree for r in rows] or [1.0]
    return min(agree), sum(agree) / len(agree)
