"""Build IR nodes: one method per layer kind, independent of how the model was written.

:class:`ProgramBuilder` receives values (:class:`Val`: an IR value name and its public
:class:`~crypten_lite.quantized.ir.ValueInfo`), int weights (:class:`QWeight`) and an output
:class:`Target` (the scale / zero point / clamp range the result must have), and emits
nodes whose public constants (multipliers, shifts, clamp bounds, bit bounds, rounding) are
all worked out here, so that execution is mechanical.

Every layer computes ``round(real_result / s_y) + z_y`` exactly in integers, where
``real_result`` is the layer's real-valued function of the dequantized inputs. Two
references of torch differ only in how they round the public ratio:

* ``"fbgemm"`` (eager and FX quantized modules): torch's fbgemm / x86 kernels compute
  ``M = float32(float32(s_x * s_w) / s_y)`` and ``B = float32(b / float32(s_x * s_w))`` and
  then ``lrintf((acc + B) * M)``; we take ``M`` exactly (24-bit mantissa) and ``B * m``
  rounded to an integer in units of ``2**-shift``;
* ``"exact"`` (PT2E, which simulates ``Q(f(DQ(x)))`` in float): the ratio in double, the
  bias as ``round(b / s_y * 2**shift)``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from crypten_lite.errors import UnsupportedError
from crypten_lite.quantized.ir import FIXED, QUANT, Divide, Node, QuantizedProgram, Rescale, ValueInfo, bits_for
from crypten_lite.quantized.requant import (
    fit_multipliers,
    plan_clamp,
    plan_exact_divide,
    product_bounds,
    rescale_bounds,
    tie_possible_sum,
)

Shape = Sequence[int]
Pair = Sequence[int]

# hardswish computes clamp(x + 3, 0, 6) with 2**-12 of a quantization step of resolution:
# fine enough that the threshold never moves a result, small enough to keep x * t short.
HARDSWISH_FRAC_BITS = 12


@dataclass(frozen=True)
class Val:
    """An IR value: its name in the program and its public meaning."""

    name: str
    info: ValueInfo


@dataclass(frozen=True)
class QWeight:
    """An int8 weight: ``real = values * scales[c]`` along dim 0 (zero point removed)."""

    values: torch.Tensor  # int64, shape (O, ...)
    scales: torch.Tensor  # float64, shape (O,)

    @staticmethod
    def from_qtensor(q: torch.Tensor) -> "QWeight":
        """From a torch quantized tensor (per-tensor or per-channel along dim 0)."""
        ints = q.int_repr().to(torch.int64)
        out = ints.shape[0]
        if q.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
            return QWeight(ints - q.q_zero_point(), torch.full((out,), q.q_scale(), dtype=torch.float64))
        if q.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
            if q.q_per_channel_axis() != 0:
                raise UnsupportedError("per-channel weights must be quantized along dim 0")
            zp = q.q_per_channel_zero_points().to(torch.int64)
            shape = (out,) + (1,) * (ints.dim() - 1)
            return QWeight(ints - zp.reshape(shape), q.q_per_channel_scales().to(torch.float64))
        raise UnsupportedError(f"weight quantization scheme {q.qscheme()} is not supported")

    def acc_ranges(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """Per output channel, the range of ``sum(w * x)`` for ``x`` in ``[lo, hi]``."""
        w = self.values.reshape(self.values.shape[0], -1)
        pos, neg = w.clamp(min=0).sum(1), w.clamp(max=0).sum(1)
        return [
            (int(p) * lo + int(n) * hi, int(p) * hi + int(n) * lo)
            for p, n in zip(pos.tolist(), neg.tolist())
        ]


@dataclass(frozen=True)
class Target:
    """What a layer's output must be: a quantization (with its clamp range) or fixed point.

    ``act_lo`` / ``act_hi`` are real-valued bounds of a fused activation (ReLU: 0, None;
    ReLU6: 0, 6); they become integer clamp bounds by quantizing them.
    """

    kind: str
    scale: float
    zero_point: int
    qmin: int | None = None
    qmax: int | None = None
    act_lo: float | None = None
    act_hi: float | None = None

    @staticmethod
    def quant(scale: float, zero_point: int, qmin: int, qmax: int) -> "Target":
        """An int8-style quantization target."""
        return Target(QUANT, float(scale), int(zero_point), int(qmin), int(qmax))

    @staticmethod
    def fixed(frac_bits: int) -> "Target":
        """A fixed-point target with ``frac_bits`` fractional bits."""
        return Target(FIXED, 2.0**-frac_bits, 0)

    def with_activation(self, lo: float | None, hi: float | None) -> "Target":
        """Intersect with a real-valued clamp range."""
        if lo is not None and self.act_lo is not None:
            lo = max(lo, self.act_lo)
        if hi is not None and self.act_hi is not None:
            hi = min(hi, self.act_hi)
        return replace(
            self,
            act_lo=self.act_lo if lo is None else lo,
            act_hi=self.act_hi if hi is None else hi,
        )

    def plain(self) -> "Target":
        """The same target without the activation."""
        return replace(self, act_lo=None, act_hi=None)

    def quantize(self, real: float) -> int:
        """``round(real / scale) + zero_point`` (half to even, as torch), within range."""
        q = int(np.rint(real / self.scale)) + self.zero_point
        if self.kind == QUANT:
            q = min(max(q, self.qmin), self.qmax)
        return q

    def clamp_ints(self) -> tuple[int | None, int | None]:
        """Integer clamp bounds: the dtype range intersected with the activation."""
        lo, hi = (self.qmin, self.qmax) if self.kind == QUANT else (None, None)
        if self.act_lo is not None:
            q = self.quantize(self.act_lo)
            lo = q if lo is None else max(lo, q)
        if self.act_hi is not None:
            q = self.quantize(self.act_hi)
            hi = q if hi is None else min(hi, q)
        return lo, hi

    def matches(self, info: ValueInfo) -> bool:
        """True when ``info`` has this target's meaning."""
        return (self.kind, self.scale, self.zero_point) == (info.kind, info.scale, info.zero_point)

    def info(self, lo: int, hi: int, shape: Sequence[int]) -> ValueInfo:
        """The ValueInfo of an output with these bounds."""
        return ValueInfo(self.kind, self.scale, self.zero_point, lo, hi, tuple(shape))


class ProgramBuilder:
    """Collects nodes; each public method lowers one layer and returns its output Val.

    ``frac_bits``: fractional bits of fixed-point values. ``multiplier_bits``: significant
    bits of requantization multipliers (24 reproduces float32 ratios exactly).
    ``max_bits``: bound on any intermediate (``acc * multiplier``) the backend must hold.
    ``fixed_input_bits``: assumed integer bits of a float program input (``|x| < 2**b``).
    """

    def __init__(
        self,
        frac_bits: int = 20,
        multiplier_bits: int = 24,
        max_bits: int = 62,
        fixed_input_bits: int = 8,
    ):
        self.frac_bits = frac_bits
        self.multiplier_bits = multiplier_bits
        self.max_bits = max_bits
        self.fixed_input_bits = fixed_input_bits
        self.nodes: list[Node] = []
        self._used: set[str] = set()

    # --- plumbing ----------------------------------------------------------------------
    def _name(self, hint: str) -> str:
        base = "".join(c if c.isalnum() or c == "_" else "_" for c in hint) or "v"
        name, i = base, 1
        while name in self._used:
            name, i = f"{base}_{i}", i + 1
        self._used.add(name)
        return name

    def _emit(self, op, inputs, info, source, attrs=None, weights=None) -> Val:
        node = Node(
            op,
            self._name(source),
            tuple(v.name for v in inputs),
            info,
            attrs or {},
            {k: w for k, w in (weights or {}).items() if w is not None},
            source,
        )
        self.nodes.append(node)
        return Val(node.name, info)

    def program(self, output: Val, sources: dict[str, tuple[str, ValueInfo]]) -> QuantizedProgram:
        """The finished program."""
        return QuantizedProgram(list(self.nodes), output.name, dict(sources))

    def _fit(self, ratios, acc_bits: int, what: str, pre: bool = True):
        """``(multipliers, shift, pre_shift)`` for the ratios (requant.fit_multipliers)."""
        return fit_multipliers(ratios, acc_bits, self.multiplier_bits, self.max_bits, what, pre)

    def _finish(self, multiplier, shift, v_lo, v_hi, pre_lo, pre_hi, ties, target, what, offset=None):
        in_bits = bits_for(v_lo, v_hi)
        if in_bits > self.max_bits:
            raise UnsupportedError(f"{what}: {in_bits}-bit intermediate exceeds max_bits={self.max_bits}")
        lo, hi = target.clamp_ints()
        lo, hi, out_lo, out_hi = plan_clamp(pre_lo, pre_hi, lo, hi)
        rescale = Rescale(
            multiplier,
            shift,
            target.zero_point if offset is None else offset,
            lo,
            hi,
            in_bits,
            bits_for(pre_lo, pre_hi),
            # torch's ties-to-even only matters for int8 results; fixed point has no ties to match
            "half_even" if ties and target.kind == QUANT else "half_up",
        )
        return rescale, out_lo, out_hi

    def _channel_rescale(self, ms, shift, ranges, biases, target, mshape, what, offset=None, pre=0):
        """Rescale with per-channel / per-position multipliers; returns (rescale, bias, lo, hi)."""
        offset = target.zero_point if offset is None else offset
        pre_bits = max(bits_for(lo, hi) for lo, hi in ranges)
        if pre:  # floor / ceil: sound for the half-up pre-rounding
            ranges = [(lo >> pre, -((-hi) >> pre)) for lo, hi in ranges]
        v_lo, v_hi, pre_lo, pre_hi, ties = rescale_bounds(ms, ranges, biases, shift, offset)
        multiplier = self._public(ms, mshape)
        bias = None
        if biases is not None and any(biases):
            bias = torch.tensor(biases, dtype=torch.int64).reshape(mshape)
        rescale, lo, hi = self._finish(multiplier, shift, v_lo, v_hi, pre_lo, pre_hi, ties, target, what,
                                       offset)
        if pre:
            rescale = replace(rescale, pre_shift=pre, pre_bits=pre_bits)
        return rescale, bias, lo, hi

    # --- inputs and conversions -------------------------------------------------------
    def input(self, target: Target, shape: Sequence[int], source: str = "input") -> Val:
        """The program input: quantized by its owner (quant) or scaled by 2**frac_bits."""
        if target.kind == QUANT:
            attrs = dict(kind=QUANT, scale=target.scale, zero_point=target.zero_point,
                         qmin=target.qmin, qmax=target.qmax)
            info = target.info(target.qmin, target.qmax, shape)
        else:
            attrs = dict(kind=FIXED, frac_bits=self.frac_bits)
            bound = 1 << (self.fixed_input_bits + self.frac_bits)
            info = Target.fixed(self.frac_bits).info(-bound, bound - 1, shape)
        return self._emit("input", [], info, source, attrs)

    def to_target(self, x: Val, target: Target, source: str) -> Val:
        """``x`` with the target's meaning and clamp range (no node when it already has them)."""
        if target.matches(x.info):
            lo, hi = target.clamp_ints()
            lo, hi, out_lo, out_hi = plan_clamp(x.info.lo, x.info.hi, lo, hi)
            if lo is None and hi is None:
                return x
            attrs = dict(lo=lo, hi=hi, bits=x.info.bits)
            return self._emit("clamp", [x], x.info.with_bounds(out_lo, out_hi), source, attrs)
        return self.requantize(x, target, source)

    def requantize(self, x: Val, target: Target, source: str) -> Val:
        """``round((x - z_x) * s_x / s_y) + z_y``: quant <-> quant, quant <-> fixed."""
        zx = x.info.zero_point
        acc = (x.info.lo - zx, x.info.hi - zx)
        ms, shift, pre = self._fit([x.info.scale / target.scale], bits_for(*acc), source)
        rescale, _, lo, hi = self._channel_rescale(ms, shift, [acc], None, target, (), source, pre=pre)
        attrs = dict(in_zero_point=zx, rescale=rescale)
        return self._emit("requantize", [x], target.info(lo, hi, x.info.shape), source, attrs)

    # --- layers with weights ------------------------------------------------------------
    def _weighted(self, x, w, bias, target, reference, what, x_range):
        """Multipliers, bias integers and ranges shared by linear and conv2d."""
        sx, sy = x.info.scale, target.scale
        ranges = w.acc_ranges(*x_range)
        acc_bits = max(bits_for(lo, hi) for lo, hi in ranges)
        sw = w.scales.tolist()
        if reference == "fbgemm":
            f32 = np.float32
            sxw = [f32(f32(sx) * f32(s)) for s in sw]
            ratios = [float(f32(p / f32(sy))) for p in sxw]
        else:
            ratios = [sx * s / sy for s in sw]
        ms, shift, pre = self._fit(ratios, acc_bits, what)
        biases = None
        if bias is not None:
            b = bias.detach().to(torch.float32).tolist()
            if reference == "fbgemm":
                # fbgemm adds float32(b / (s_x s_w)) to the accumulator before scaling
                biases = [round(Fraction(float(f32(f32(bi) / p))) * m) for bi, p, m in zip(b, sxw, ms)]
            else:
                biases = [round(Fraction(bi) / Fraction(sy) * (1 << shift)) for bi in b]
        return ms, shift, pre, ranges, biases

    def linear(self, x: Val, w: QWeight, bias: torch.Tensor | None, target: Target, shape: Shape,
               source: str, reference: str = "exact") -> Val:
        """``x @ w.T + b`` over the last dim; weight ``(O, K)``; int8 or fixed input."""
        zx = x.info.zero_point
        x_range = (x.info.lo - zx, x.info.hi - zx)
        ms, shift, pre, ranges, biases = self._weighted(x, w, bias, target, reference, source, x_range)
        out = w.values.shape[0]
        rescale, b, lo, hi = self._channel_rescale(ms, shift, ranges, biases, target, (out,), source, pre=pre)
        attrs = dict(in_zero_point=zx, rescale=rescale)
        weights = dict(weight=w.values.t().contiguous(), bias=b)
        return self._emit("linear", [x], target.info(lo, hi, shape), source, attrs, weights)

    def conv2d(self, x: Val, w: QWeight, bias: torch.Tensor | None, stride: Pair, padding: Pair,
               dilation: Pair, groups: int, target: Target, shape: Shape, source: str,
               reference: str = "exact") -> Val:
        """2-d convolution with zero padding (padding is the real 0, i.e. the zero point)."""
        zx = x.info.zero_point
        lo, hi = x.info.lo - zx, x.info.hi - zx
        if any(padding):
            lo, hi = min(lo, 0), max(hi, 0)
        ms, shift, pre, ranges, biases = self._weighted(x, w, bias, target, reference, source, (lo, hi))
        out = w.values.shape[0]
        rescale, b, lo, hi = self._channel_rescale(ms, shift, ranges, biases, target, (out, 1, 1), source,
                                                   pre=pre)
        attrs = dict(in_zero_point=zx, stride=tuple(stride), padding=tuple(padding),
                     dilation=tuple(dilation), groups=int(groups), rescale=rescale)
        weights = dict(weight=w.values, bias=b)
        return self._emit("conv2d", [x], target.info(lo, hi, shape), source, attrs, weights)

    # --- elementwise ------------------------------------------------------------------
    def add(self, xs: Sequence[Val], target: Target, shape: Shape, source: str) -> Val:
        """``sum_i real(x_i)``, requantized to the target (add / add_relu)."""
        ranges = [(v.info.lo - v.info.zero_point, v.info.hi - v.info.zero_point) for v in xs]
        acc_bits = max(bits_for(*r) for r in ranges) + (len(xs) - 1).bit_length()
        # no pre-shift here: it would have to round each input separately
        ms, shift, _ = self._fit([v.info.scale / target.scale for v in xs], acc_bits, source, pre=False)
        v_lo = sum(product_bounds(r, (m, m))[0] for r, m in zip(ranges, ms))
        v_hi = sum(product_bounds(r, (m, m))[1] for r, m in zip(ranges, ms))
        ties = tie_possible_sum(ms, ranges, shift)
        pre_lo = (v_lo >> shift) + target.zero_point
        pre_hi = -((-v_hi) >> shift) + target.zero_point
        rescale, lo, hi = self._finish(1, shift, v_lo, v_hi, pre_lo, pre_hi, ties, target, source)
        attrs = dict(zero_points=tuple(v.info.zero_point for v in xs), multipliers=tuple(ms),
                     rescale=rescale)
        return self._emit("add", xs, target.info(lo, hi, shape), source, attrs)

    def mul(self, a: Val, b: Val, target: Target, shape: Shape, source: str) -> Val:
        """``real(a) * real(b)``, a secret-by-secret product, requantized."""
        ra = (a.info.lo - a.info.zero_point, a.info.hi - a.info.zero_point)
        rb = (b.info.lo - b.info.zero_point, b.info.hi - b.info.zero_point)
        acc = product_bounds(ra, rb)
        ms, shift, pre = self._fit([a.info.scale * b.info.scale / target.scale], bits_for(*acc), source)
        rescale, _, lo, hi = self._channel_rescale(ms, shift, [acc], None, target, (), source, pre=pre)
        attrs = dict(zero_points=(a.info.zero_point, b.info.zero_point), rescale=rescale)
        return self._emit("mul", [a, b], target.info(lo, hi, shape), source, attrs)

    def clamp(self, x: Val, target: Target, source: str) -> Val:
        """relu / relu6 / hardtanh: the activation is part of ``target``."""
        return self.to_target(x, target, source)

    def hardswish(self, x: Val, target: Target, shape: Shape, source: str) -> Val:
        """``x * clamp(x + 3, 0, 6) / 6`` with ``x + 3`` in units of ``s_x * 2**-k``."""
        zx, sx = x.info.zero_point, x.info.scale
        k = 0 if x.info.kind == FIXED else HARDSWISH_FRAC_BITS
        xr = (x.info.lo - zx, x.info.hi - zx)
        c3 = round(3 * (1 << k) / sx)
        c6 = round(6 * (1 << k) / sx)
        u = (xr[0] * (1 << k) + c3, xr[1] * (1 << k) + c3)
        t_lo, t_hi, tl, th = plan_clamp(u[0], u[1], 0, c6)
        acc = product_bounds(xr, (tl, th))
        ratio = sx * sx / (6 * (1 << k) * target.scale)
        ms, shift, pre = self._fit([ratio], bits_for(*acc), source)
        rescale, _, lo, hi = self._channel_rescale(ms, shift, [acc], None, target, (), source, pre=pre)
        attrs = dict(in_zero_point=zx, k=k, c3=c3, t_lo=t_lo, t_hi=t_hi, t_bits=bits_for(*u),
                     rescale=rescale)
        return self._emit("hardswish", [x], target.info(lo, hi, shape), source, attrs)

    # --- pooling ----------------------------------------------------------------------
    def max_pool2d(self, x: Val, kernel_size: Pair, stride: Pair, padding: Pair, dilation: Pair,
                   ceil_mode: bool, target: Target, shape: Shape, source: str) -> Val:
        """Max over windows; commutes with (re)quantization, so runs on x's integers."""
        attrs = dict(kernel_size=tuple(kernel_size), stride=tuple(stride), padding=tuple(padding),
                     dilation=tuple(dilation), ceil_mode=bool(ceil_mode), bits=x.info.bits)
        y = self._emit("max_pool2d", [x], x.info.with_shape(tuple(shape)), source, attrs)
        return self.to_target(y, target, source)

    def avg_pool2d(self, x: Val, kernel_size: Pair, stride: Pair, padding: Pair, ceil_mode: bool,
                   count_include_pad: bool, divisor_override: int | None, target: Target, shape: Shape,
                   source: str, reference: str = "exact") -> Val:
        """Window sums of ``x - z_x`` times a public per-position ``s_x / (d * s_y)``.

        ``reference="fbgemm"`` (torch's quantized kernels, same scale and zero point in and
        out) rounds ``(sum + d * z) / d``, i.e. after adding the zero point, which differs
        from ``round(sum / d) + z`` at ties when ``z`` is odd; ``"exact"`` (PT2E) rounds first.
        """
        h, w = x.info.shape[2], x.info.shape[3]
        ones = torch.ones(1, 1, h, w, dtype=torch.float64)
        args = (tuple(kernel_size), tuple(stride), tuple(padding), ceil_mode)
        count = F.avg_pool2d(ones, *args, True, 1)[0, 0]
        if divisor_override:
            divisor = torch.full_like(count, float(divisor_override))
        else:
            divisor = count / F.avg_pool2d(ones, *args, count_include_pad)[0, 0]
        counts = count.round().to(torch.int64).flatten().tolist()
        divisors = divisor.round().to(torch.int64).flatten().tolist()
        zx = x.info.zero_point
        same = x.info.kind == QUANT and target.matches(x.info)
        if reference == "fbgemm" and not same:
            raise UnsupportedError(f"{source}: a quantized avg_pool2d must keep its scale and zero point")
        pre = [d * zx for d in divisors] if reference == "fbgemm" else [0] * len(divisors)
        offset = 0 if reference == "fbgemm" else target.zero_point
        lo, hi = x.info.lo - zx, x.info.hi - zx
        ranges = [(n * lo + p, n * hi + p) for n, p in zip(counts, pre)]
        mshape = tuple(count.shape)
        attrs = dict(in_zero_point=zx, kernel_size=tuple(kernel_size), stride=tuple(stride),
                     padding=tuple(padding), ceil_mode=bool(ceil_mode))
        if any(pre):
            attrs["pre_offset"] = self._public(pre, mshape)
        exact_ratio = x.info.kind == QUANT and target.kind == QUANT and x.info.scale == target.scale
        if exact_ratio and any(d % 2 == 0 and d & (d - 1) for d in divisors):
            attrs["divide"], lo, hi = self._divide(divisors, ranges, target, offset, mshape, source)
            return self._emit("avg_pool2d", [x], target.info(lo, hi, shape), source, attrs)
        acc_bits = max(bits_for(*r) for r in ranges)
        ratios = [x.info.scale / (d * target.scale) for d in divisors]
        ms, shift, pre = self._fit(ratios, acc_bits, source)
        attrs["rescale"], _, lo, hi = self._channel_rescale(ms, shift, ranges, None, target, mshape, source,
                                                            offset, pre)
        return self._emit("avg_pool2d", [x], target.info(lo, hi, shape), source, attrs)

    @staticmethod
    def _public(values: Sequence[int], shape) -> int | torch.Tensor:
        """An int when all values agree, else an int64 tensor of ``shape``."""
        if len(set(values)) == 1:
            return values[0]
        return torch.tensor(list(values), dtype=torch.int64).reshape(shape)

    def _divide(self, divisors, ranges, target, offset, mshape, source):
        """An exact ``round_half_even(v / d)`` (see requant.plan_exact_divide)."""
        x_lo, x_hi = min(r[0] for r in ranges), max(r[1] for r in ranges)
        plan = plan_exact_divide(divisors, x_lo, x_hi)
        if max(plan["magic_bits"], plan["y_bits"]) > self.max_bits:
            raise UnsupportedError(f"{source}: exact division needs more than max_bits={self.max_bits}")

        def public(key):
            return self._public(plan[key], mshape)

        pre_lo = min(x_lo // d for d in divisors) + offset
        pre_hi = max(-(-x_hi // d) for d in divisors) + offset
        lo, hi = target.clamp_ints()
        lo, hi, out_lo, out_hi = plan_clamp(pre_lo, pre_hi, lo, hi)
        divide = Divide(
            public("odd"), public("k"), public("magic"), plan["magic_shift"], plan["magic_bits"],
            plan["r_bits"], public("bit_offset"), public("bit_weight"), public("scale_up"),
            plan["shift"], plan["y_bits"], offset, lo, hi, bits_for(pre_lo, pre_hi),
        )
        return divide, out_lo, out_hi

    def adaptive_avg_pool2d(self, x: Val, target: Target, shape: Shape, source: str,
                            reference: str = "exact") -> Val:
        """Adaptive average pooling when the input size is a multiple of the output size."""
        (h, w), (oh, ow) = x.info.shape[2:], tuple(shape[2:])
        if h % oh or w % ow:
            raise UnsupportedError(
                f"{source}: adaptive_avg_pool2d from {h}x{w} to {oh}x{ow} has unequal windows; "
                "only input sizes that are multiples of the output size are supported"
            )
        k = (h // oh, w // ow)
        return self.avg_pool2d(x, k, k, (0, 0), False, True, None, target, shape, source, reference)

    # --- data movement ----------------------------------------------------------------
    def cat(self, xs: Sequence[Val], dim: int, target: Target, shape: Shape, source: str) -> Val:
        """Concatenate after bringing every input to the target's meaning."""
        ys = [self.to_target(v, target.plain(), source) for v in xs]
        lo, hi = min(v.info.lo for v in ys), max(v.info.hi for v in ys)
        y = self._emit("cat", ys, target.info(lo, hi, shape), source, dict(dim=int(dim)))
        return self.to_target(y, target, source)

    def reshape(self, x: Val, shape: Shape, target: Target, source: str) -> Val:
        """Reshape keeping dim 0 (the batch)."""
        attrs = dict(shape=(-1,) + tuple(shape[1:]))
        y = self._emit("reshape", [x], x.info.with_shape(tuple(shape)), source, attrs)
        return self.to_target(y, target, source)

    def permute(self, x: Val, dims: Sequence[int], target: Target, shape: Shape, source: str) -> Val:
        """Permute dims (the batch must stay first)."""
        if dims[0] != 0:
            raise UnsupportedError(f"{source}: permute must keep the batch dim first, got {dims}")
        y = self._emit("permute", [x], x.info.with_shape(tuple(shape)), source, dict(dims=tuple(dims)))
        return self.to_target(y, target, source)

    def upsample_nearest2d(self, x: Val, index_h: torch.Tensor, index_w: torch.Tensor, target: Target,
                           shape: Shape, source: str) -> Val:
        """Nearest-neighbour upsampling as two public gathers."""
        attrs = dict(index_h=index_h.to(torch.int64), index_w=index_w.to(torch.int64))
        y = self._emit("upsample_nearest2d", [x], x.info.with_shape(tuple(shape)), source, attrs)
        return self.to_target(y, target, source)
