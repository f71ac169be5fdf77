"""The integer program that a quantized PyTorch model is converted into.

A :class:`QuantizedProgram` is a straight-line list of :class:`Node` s. Every value is an
integer tensor with a public affine meaning (:class:`ValueInfo`):

* ``quant``: an int8/uint8 activation, ``real = (v - zero_point) * scale``;
* ``fixed``: a fixed-point number, ``real = v * 2**-frac_bits`` (float segments of a graph,
  dynamic-quantized Linear).

Everything in a node's ``attrs`` is public: shapes, scales, zero points, integer multipliers,
shifts, clamp bounds and the bit bounds that let an MPC backend use short comparisons.
Everything in ``weights`` is a model parameter (int8 weights minus their zero point, biases
already scaled to the accumulator) and stays secret in MPC. The op names are the keys of
:data:`OPS`; :mod:`crypten_lite.quantized.executor` has one function per op.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from crypten_lite.errors import UnsupportedError

QUANT = "quant"
FIXED = "fixed"

# One line per op: what it computes, in the integer domain. Adding an op means a line here,
# a builder in lowering.py and an executor function in executor.py.
OPS: dict[str, str] = {
    "input": "x -> the data owner's input, quantized (quant) or scaled by 2**frac_bits (fixed)",
    "conv2d": "rescale(conv2d(x - in_zero_point, weight)) (+ bias inside the rescale)",
    "linear": "rescale((x - in_zero_point) @ weight) (+ bias inside the rescale)",
    "requantize": "rescale(x - in_zero_point): change scale / zero point / quant<->fixed",
    "add": "rescale(sum_i (x_i - zero_points[i]) * multipliers[i])",
    "mul": "rescale((x0 - zero_points[0]) * (x1 - zero_points[1])), secret * secret",
    "cat": "concatenate inputs (all with the same ValueInfo) along dim",
    "clamp": "clamp(x, lo, hi); relu / relu6 / hardtanh",
    "hardswish": "rescale(x' * clamp(x' * 2**k + c3, 0, c6)), x' = x - in_zero_point",
    "max_pool2d": "max over windows (padding never wins)",
    "avg_pool2d": "rescale or exact divide of sum_pool2d(x - in_zero_point), per-position divisors",
    "reshape": "reshape; dim 0 (batch) is kept as -1",
    "permute": "permute dims",
    "upsample_nearest2d": "index_select(dim 2, index_h) then index_select(dim 3, index_w)",
}

ROUNDINGS = ("half_up", "half_even")


def bits_for(lo: int, hi: int) -> int:
    """Smallest ``b >= 0`` such that ``-2**b <= lo`` and ``hi < 2**b``."""
    b = 0
    while lo < -(1 << b) or hi >= (1 << b):
        b += 1
    return b


@dataclass(frozen=True)
class ValueInfo:
    """Public meaning and bounds of an integer tensor.

    ``real = (v - zero_point) * scale``; a fixed value has ``zero_point == 0`` and
    ``scale == 2**-frac_bits``. ``lo <= v <= hi`` holds for every element and every input
    (a sound bound derived from the dtype ranges and the weights, not from data). ``shape``
    is the shape traced with the example input (dim 0 is the batch).
    """

    kind: str
    scale: float
    zero_point: int
    lo: int
    hi: int
    shape: tuple[int, ...] = ()

    @property
    def bits(self) -> int:
        """Bits of the bound: ``-2**bits <= v < 2**bits``."""
        return bits_for(self.lo, self.hi)

    @property
    def frac_bits(self) -> int:
        """Fractional bits of a fixed value."""
        if self.kind != FIXED:
            raise ValueError("frac_bits is only defined for fixed values")
        return -round(torch.tensor(self.scale, dtype=torch.float64).log2().item())

    def with_bounds(self, lo: int, hi: int) -> "ValueInfo":
        """The same meaning with other bounds."""
        return ValueInfo(self.kind, self.scale, self.zero_point, lo, hi, self.shape)

    def with_shape(self, shape: tuple[int, ...]) -> "ValueInfo":
        """The same meaning with another traced shape."""
        return ValueInfo(self.kind, self.scale, self.zero_point, self.lo, self.hi, shape)

    def same_meaning(self, other: "ValueInfo") -> bool:
        """True when both describe the same integers (bounds and shape aside)."""
        return (self.kind, self.scale, self.zero_point) == (
            other.kind,
            other.scale,
            other.zero_point,
        )

    def to_real(self, v: torch.Tensor) -> torch.Tensor:
        """Dequantize plaintext integers (float64)."""
        return (v.to(torch.float64) - self.zero_point) * self.scale

    def describe(self) -> str:
        """Short text for :meth:`QuantizedProgram.describe`."""
        if self.kind == QUANT:
            meaning = f"quant(scale={self.scale:.6g}, zp={self.zero_point})"
        else:
            meaning = f"fixed(frac_bits={self.frac_bits})"
        return f"{meaning} in [{self.lo}, {self.hi}] {list(self.shape)}"


@dataclass(frozen=True)
class Rescale:
    """``y = clamp(round((v' * multiplier + bias) / 2**shift) + offset, lo, hi)``.

    ``v' = round_half_up(v / 2**pre_shift)`` (``v' = v`` when ``pre_shift == 0``; used for
    fixed-point accumulators much finer than the output; ``pre_bits`` bounds ``v``).

    ``multiplier`` is a public int or an int64 tensor that broadcasts against the value
    without its batch dim (per-channel ``(C, 1, 1)`` for conv, ``(C,)`` for linear,
    per-position ``(Ho, Wo)`` for pooling). The bias is a secret weight of the node, already
    in units of ``2**-shift`` output steps. ``in_bits`` bounds ``v * multiplier + bias`` and
    ``out_bits`` the rounded value plus offset (before the clamp), both as in
    :func:`bits_for`. ``rounding`` is ``"half_up"`` (``floor(t + 1/2)``) when no exact tie
    can occur, else ``"half_even"`` as torch's ``nearbyint``. ``lo`` / ``hi`` are None when
    the bound already holds.
    """

    multiplier: int | torch.Tensor
    shift: int
    offset: int
    lo: int | None
    hi: int | None
    in_bits: int
    out_bits: int
    rounding: str = "half_up"
    pre_shift: int = 0
    pre_bits: int = 0

    def describe(self) -> str:
        """Short text for :meth:`QuantizedProgram.describe`."""
        m = self.multiplier
        if isinstance(m, torch.Tensor):
            flat = m.flatten().tolist()
            m = f"{flat[:3]}{'...' if len(flat) > 3 else ''}({len(flat)})"
        clamp = f" clamp[{self.lo}, {self.hi}]" if (self.lo, self.hi) != (None, None) else ""
        pre = f">>{self.pre_shift} ({self.pre_bits}b) " if self.pre_shift else ""
        return (
            f"{pre}*{m} >>{self.shift} ({self.rounding}, {self.in_bits}b) +{self.offset}"
            f"{clamp} ({self.out_bits}b)"
        )


@dataclass(frozen=True)
class Divide:
    """``clamp(round_half_even(v / d) + offset, lo, hi)`` exactly, for public integers ``d``.

    Used by average pooling when the ratio is exactly ``1 / d`` and ``d`` is even but not a
    power of two, where exact ties (``v / d = k + 1/2``) are common and a multiplier
    ``m / 2**shift`` cannot land on them. Constants (ints or per-position tensors) come from
    :func:`crypten_lite.quantized.requant.plan_exact_divide`, which states the steps.
    """

    odd: int | torch.Tensor
    k: int | torch.Tensor
    magic: int | torch.Tensor
    magic_shift: int
    magic_bits: int
    r_bits: int
    bit_offset: int | torch.Tensor
    bit_weight: int | torch.Tensor
    scale_up: int | torch.Tensor
    shift: int
    y_bits: int
    offset: int
    lo: int | None
    hi: int | None
    out_bits: int

    def describe(self) -> str:
        """Short text for :meth:`QuantizedProgram.describe`."""
        clamp = f" clamp[{self.lo}, {self.hi}]" if (self.lo, self.hi) != (None, None) else ""
        return (f"exact /d: floor >>{self.magic_shift} ({self.magic_bits}b), bit ({self.r_bits}b), "
                f">>{self.shift} (half_even, {self.y_bits}b) +{self.offset}{clamp} ({self.out_bits}b)")


@dataclass
class Node:
    """One step of a program: ``name = op(*inputs; attrs, weights)``.

    ``source`` names the torch module / graph node it came from (for errors and
    :func:`~crypten_lite.quantized.executor.compare_layers`).
    """

    op: str
    name: str
    inputs: tuple[str, ...]
    out: ValueInfo
    attrs: dict[str, Any] = field(default_factory=dict)
    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    source: str = ""

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise UnsupportedError(
                f"IR op {self.op!r} (from {self.source!r}) is not in crypten_lite.quantized.ir.OPS"
            )
        for key, w in self.weights.items():
            if w.dtype != torch.int64:
                raise ValueError(f"weight {key!r} of node {self.name!r} must be int64, got {w.dtype}")

    def describe(self) -> str:
        """One line: output, op, inputs, attributes, output meaning."""
        parts = []
        for key, val in self.attrs.items():
            if isinstance(val, (Rescale, Divide)):
                parts.append(f"{key}: {val.describe()}")
            elif isinstance(val, torch.Tensor):
                parts.append(f"{key}=tensor{list(val.shape)}")
            else:
                parts.append(f"{key}={val}")
        weights = ", ".join(f"{k}:int{list(w.shape)}" for k, w in self.weights.items())
        head = f"%{self.name} = {self.op}({', '.join('%' + i for i in self.inputs)})"
        return (
            f"{head} {{{'; '.join(parts)}}}"
            + (f" weights[{weights}]" if weights else "")
            + f" -> {self.out.describe()}"
            + (f"  # {self.source}" if self.source else "")
        )


@dataclass
class QuantizedProgram:
    """A converted model: nodes in execution order, one input node, one output value.

    ``sources`` maps a torch graph node name to ``(value name, ValueInfo)``: where that torch
    value lives in the program and how its integers are read.
    """

    nodes: list[Node]
    output: str
    sources: dict[str, tuple[str, ValueInfo]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        defined: set[str] = set()
        for node in self.nodes:
            missing = [i for i in node.inputs if i not in defined]
            if missing:
                raise ValueError(f"node {node.name!r} uses undefined values {missing}")
            if node.name in defined:
                raise ValueError(f"value {node.name!r} is defined twice")
            defined.add(node.name)
        if not self.nodes or self.nodes[0].op != "input":
            raise ValueError("a program starts with its input node")
        if self.output not in defined:
            raise ValueError(f"output {self.output!r} is not defined")

    @property
    def input(self) -> Node:
        """The input node."""
        return self.nodes[0]

    @property
    def output_info(self) -> ValueInfo:
        """Meaning of the output integers."""
        return self.node(self.output).out

    def node(self, name: str) -> Node:
        """The node that defines value ``name``."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def public_copy(self) -> "QuantizedProgram":
        """What parties other than the model owner hold: weights become int64 ``meta`` tensors.

        Same nodes and public attributes; each weight keeps only its shape, so an MPC
        backend's ``weight()`` knows what shares to expect.
        """
        nodes = [
            replace(node, weights={k: torch.empty(w.shape, dtype=torch.int64, device="meta")
                                   for k, w in node.weights.items()})
            for node in self.nodes
        ]
        return QuantizedProgram(nodes, self.output, dict(self.sources))

    def run(self, x, **kwargs):
        """Run privately on ``x`` (a CrypTensor, or a tensor held by the data owner).

        Returns the secret output (``QuantizedCrypTensor``, or a float CrypTensor for a float
        output); keyword arguments as :func:`crypten_lite.quantized.mpc_backend.run_private`.
        """
        from crypten_lite.quantized.mpc_backend import run_private  # MPC layers load on use

        kwargs.setdefault("reveal", False)
        return run_private(self, x, **kwargs)

    # --- the calls of a crypten_lite.nn.Module (crypten_lite.quantized.private) ----------
    def encrypt(self, src: int = 0, **backend_options) -> "QuantizedProgram":
        """Secret-share the weights of party ``src`` (the model owner) now; returns self."""
        from crypten_lite.quantized.private import encrypt

        return encrypt(self, src, **backend_options)

    @property
    def encrypted(self) -> bool:
        """True after :meth:`encrypt`."""
        return self.__dict__.get("_backend") is not None

    def eval(self) -> "QuantizedProgram":
        """Inference mode, the only one an int8 program has; returns self."""
        return self

    def train(self, mode: bool = True) -> "QuantizedProgram":
        """``train(False)`` is :meth:`eval`; int8 programs cannot be trained."""
        if mode:
            raise UnsupportedError("an int8 program runs inference only; train the float model")
        return self

    def __call__(self, x, src: int | None = None):
        """The secret output on ``x``: a CrypTensor (quantized in MPC), or with ``src`` the
        data owner's plaintext tensor (None elsewhere), quantized by that party exactly as
        torch does. ``get_plain_text()`` on the result reveals what the torch model returns
        (see :class:`crypten_lite.quantized.private.QuantizedOutput`)."""
        from crypten_lite.quantized.private import call

        return call(self, x, src)

    def describe(self) -> str:
        """Human-readable listing, one node a line."""
        lines = [node.describe() for node in self.nodes]
        lines.append(f"return %{self.output}")
        return "\n".join(lines)
