"""Graph-node handlers: one function per torch module / function / method, in three tables.

A handler receives the :class:`~crypten_lite.quantized.convert.GraphConverter` (arguments,
traced shapes, output targets) and the fx node, and returns what the node becomes: a
:class:`~crypten_lite.quantized.lowering.Val` built with the converter's
:class:`~crypten_lite.quantized.lowering.ProgramBuilder`, a :class:`QWeight`, a
:class:`Const` or a plain Python value (sizes). Supporting a new op means one handler and
one table line here, lowered to the ops of :data:`crypten_lite.quantized.ir.OPS`.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.ao.nn.intrinsic.quantized as nniq
import torch.ao.nn.intrinsic.quantized.dynamic as nniqd
import torch.ao.nn.quantized as nnq
import torch.ao.nn.quantized.dynamic as nnqd
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed ops)
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from crypten_lite.errors import UnsupportedError
from crypten_lite.quantized.ir import QUANT
from crypten_lite.quantized.lowering import QWeight, Target, Val

if TYPE_CHECKING:
    from crypten_lite.quantized.convert import GraphConverter

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed

PT2E_QUANTIZE = (qd.quantize_per_tensor.default, qd.quantize_per_tensor.tensor)
PT2E_DEQUANTIZE = (qd.dequantize_per_tensor.default, qd.dequantize_per_tensor.tensor)


@dataclass(frozen=True)
class Const:
    """A graph constant (``get_attr``): a float parameter or an int8 weight before DQ."""

    tensor: torch.Tensor


def target_name(target: Any) -> str:
    """A readable name of a graph node's target for error messages."""
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return f"torch.ops.{target}"
    if callable(target):
        module = getattr(target, "__module__", None) or ""
        name = getattr(target, "__qualname__", None) or getattr(target, "__name__", "?")
        return f"{module}.{name}" if module else name
    return str(target)


def unsupported(node: fx.Node, what: str, table: str) -> UnsupportedError:
    """The error for a node no handler covers: names the node, its target and the table."""
    return UnsupportedError(
        f"{node.op} node {node.name!r} (target {what}) is not supported for private quantized "
        f"inference; extend {table} in crypten_lite/quantized/handlers.py with a handler that "
        "lowers it to the ops of crypten_lite.quantized.ir.OPS"
    )


_QDTYPE_RANGE = {
    torch.quint8: (0, 255),
    torch.qint8: (-128, 127),
    torch.qint32: (-(1 << 31), (1 << 31) - 1),
}


def qtensor_target(q: torch.Tensor, node: fx.Node) -> Target:
    """The target of a torch quantized tensor (per-tensor scale and zero point, dtype range)."""
    if q.qscheme() not in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        raise UnsupportedError(f"node {node.name!r}: activations must be quantized per tensor, got {q.qscheme()}")
    return Target.quant(q.q_scale(), q.q_zero_point(), *_QDTYPE_RANGE[q.dtype])


def _pair(v: Any) -> tuple[int, int]:
    if isinstance(v, (list, tuple)):
        return (int(v[0]), int(v[-1])) if v else None  # type: ignore[return-value]
    return int(v), int(v)


# --- handlers: quantize / dequantize -------------------------------------------------------


def _quantize(cv: GraphConverter, node: fx.Node, *_: Any) -> Any:
    src = cv.env.get(node.args[0])
    t = cv.quantize_target(node)
    if isinstance(src, Const):  # a float constant quantized ahead of time (unfolded weight)
        x = src.tensor.to(torch.float32)
        q = torch.clamp(torch.round(x * (1.0 / t.scale)) + t.zero_point, t.qmin, t.qmax)
        return Const(q.to(torch.int64))
    return cv.b.to_target(cv.val(node.args[0], node), t, node.name)


def _dequantize(cv: GraphConverter, node: fx.Node, *_: Any) -> Any:
    src = cv.env.get(node.args[0])
    if isinstance(src, Const):  # a per-tensor int8 weight
        scale, zp = float(cv.const(node.args[1])), int(cv.const(node.args[2]))
        ints = src.tensor.to(torch.int64) - zp
        return QWeight(ints, torch.full((ints.shape[0],), scale, dtype=torch.float64))
    x = cv.val(node.args[0], node)
    if node.target in PT2E_DEQUANTIZE:
        scale, zp = float(cv.const(node.args[1])), int(cv.const(node.args[2]))
        if x.info.kind != QUANT or (x.info.scale, x.info.zero_point) != (scale, zp):
            raise UnsupportedError(f"node {node.name!r} dequantizes with other parameters than its quantize")
    return x  # the integers stay; the reader knows their scale and zero point


def _dequantize_per_channel(cv: GraphConverter, node: fx.Node) -> QWeight:
    src = cv.env.get(node.args[0])
    scales, zps, axis = (cv.const(a) for a in node.args[1:4])
    if not isinstance(src, Const) or axis != 0:
        raise UnsupportedError(f"node {node.name!r}: per-channel dequantize is supported for weights along dim 0")
    ints = src.tensor.to(torch.int64)
    shape = (-1,) + (1,) * (ints.dim() - 1)
    return QWeight(ints - zps.to(torch.int64).reshape(shape), scales.to(torch.float64))


# --- handlers: layers with weights --------------------------------------------------------


def _linear_module(cv: GraphConverter, node: fx.Node, mod: nn.Module) -> Val:
    dynamic = isinstance(mod, nnqd.Linear)
    t = cv.target(node)
    if isinstance(mod, (nniq.LinearReLU, nniqd.LinearReLU)):
        t = t.with_activation(0.0, None)
    w = QWeight.from_qtensor(mod.weight())
    return cv.b.linear(cv.val(node.args[0], node), w, mod.bias(), t, cv.shape(node), node.name,
                       "exact" if dynamic else "fbgemm")


def _conv_module(cv: GraphConverter, node: fx.Node, mod: nn.Module) -> Val:
    if mod.padding_mode != "zeros":
        raise UnsupportedError(f"node {node.name!r}: conv padding_mode {mod.padding_mode!r}; only 'zeros'")
    t = cv.target(node)
    if isinstance(mod, nniq.ConvReLU2d):
        t = t.with_activation(0.0, None)
    w = QWeight.from_qtensor(mod.weight())
    return cv.b.conv2d(cv.val(node.args[0], node), w, mod.bias(), mod.stride, mod.padding,
                       mod.dilation, mod.groups, t, cv.shape(node), node.name, "fbgemm")


def _weight_arg(node: fx.Node, w: Any) -> QWeight:
    if not isinstance(w, QWeight):
        raise UnsupportedError(
            f"node {node.name!r}: the weight is not a dequantized int8 constant; quantize the "
            "model's weights (PT2E: annotate this op in the quantizer)"
        )
    return w


def _aten_conv2d(cv: GraphConverter, node: fx.Node) -> Val:
    a = cv.bind(node, ["input", "weight", "bias", "stride", "padding", "dilation", "groups"],
                dict(bias=None, stride=1, padding=0, dilation=1, groups=1))
    return cv.b.conv2d(cv.val(a["input"], node), _weight_arg(node, a["weight"]), a["bias"],
                       _pair(a["stride"]), _pair(a["padding"]), _pair(a["dilation"]), a["groups"],
                       cv.target(node), cv.shape(node), node.name)


def _aten_linear(cv: GraphConverter, node: fx.Node) -> Val:
    a = cv.bind(node, ["input", "weight", "bias"], dict(bias=None))
    return cv.b.linear(cv.val(a["input"], node), _weight_arg(node, a["weight"]), a["bias"],
                       cv.target(node), cv.shape(node), node.name)


# --- handlers: elementwise ---------------------------------------------------------------


def _make_add(relu: bool) -> Callable[["GraphConverter", fx.Node], Val]:
    def handler(cv: GraphConverter, node: fx.Node) -> Val:
        a, b = node.args[0], node.args[1]
        if node.target is aten.add.Tensor:
            alpha = node.kwargs.get("alpha", node.args[2] if len(node.args) > 2 else 1)
            if alpha != 1:
                raise UnsupportedError(f"node {node.name!r}: add with alpha={alpha}; only alpha=1")
        t = cv.target(node)
        if relu:
            t = t.with_activation(0.0, None)
        return cv.b.add([cv.val(a, node), cv.val(b, node)], t, cv.shape(node), node.name)

    return handler


def _make_mul(relu: bool) -> Callable[["GraphConverter", fx.Node], Val]:
    def handler(cv: GraphConverter, node: fx.Node) -> Val:
        t = cv.target(node)
        if relu:
            t = t.with_activation(0.0, None)
        return cv.b.mul(cv.val(node.args[0], node), cv.val(node.args[1], node), t, cv.shape(node), node.name)

    return handler


def _activation(lo: Any, hi: Any) -> Callable[..., Val]:
    def handler(cv: GraphConverter, node: fx.Node, *_: Any) -> Val:
        t = cv.target(node).with_activation(lo, hi)
        return cv.b.clamp(cv.val(node.args[0], node), t, node.name)

    return handler


def _hardtanh_bounds(cv: GraphConverter, node: fx.Node) -> tuple[Any, Any]:
    names = ["input", "min_val", "max_val"] if node.target in (F.hardtanh, aten.hardtanh.default,
                                                                aten.hardtanh_.default) else ["input", "min", "max"]
    defaults = dict(min_val=-1.0, max_val=1.0) if names[1] == "min_val" else dict(min=None, max=None)
    a = cv.bind(node, names, defaults)
    return a[names[1]], a[names[2]]


def _hardtanh(cv: GraphConverter, node: fx.Node) -> Val:
    return _activation(*_hardtanh_bounds(cv, node))(cv, node)


def _hardswish(cv: GraphConverter, node: fx.Node, *_: Any) -> Val:
    return cv.b.hardswish(cv.val(node.args[0], node), cv.target(node), cv.shape(node), node.name)


def _passthrough(cv: GraphConverter, node: fx.Node, *_: Any) -> Val:
    return cv.b.to_target(cv.val(node.args[0], node), cv.target(node), node.name)


# --- handlers: pooling -------------------------------------------------------------------


def _max_pool(cv: GraphConverter, node: fx.Node, x: Val, kernel, stride, padding, dilation, ceil_mode) -> Val:
    kernel = _pair(kernel)
    stride = _pair(stride) if stride not in (None, [], ()) else kernel
    return cv.b.max_pool2d(x, kernel, stride, _pair(padding), _pair(dilation), ceil_mode,
                           cv.target(node), cv.shape(node), node.name)


def _max_pool_module(cv: GraphConverter, node: fx.Node, mod: nn.MaxPool2d) -> Val:
    if mod.return_indices:
        raise UnsupportedError(f"node {node.name!r}: max_pool2d with return_indices")
    return _max_pool(cv, node, cv.val(node.args[0], node), mod.kernel_size, mod.stride, mod.padding,
                     mod.dilation, mod.ceil_mode)


def _max_pool_function(cv: GraphConverter, node: fx.Node) -> Val:
    a = cv.bind(node, ["input", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices"],
                dict(stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False))
    if a["return_indices"]:
        raise UnsupportedError(f"node {node.name!r}: max_pool2d with return_indices")
    return _max_pool(cv, node, cv.val(a["input"], node), a["kernel_size"], a["stride"], a["padding"],
                     a["dilation"], a["ceil_mode"])


def _avg_pool(cv: GraphConverter, node: fx.Node, x: Val, kernel, stride, padding, ceil_mode, include_pad,
              divisor) -> Val:
    kernel = _pair(kernel)
    stride = _pair(stride) if stride not in (None, [], ()) else kernel
    return cv.b.avg_pool2d(x, kernel, stride, _pair(padding), ceil_mode, include_pad, divisor,
                           cv.target(node), cv.shape(node), node.name, _reference(cv, node))


def _avg_pool_module(cv: GraphConverter, node: fx.Node, mod: nn.AvgPool2d) -> Val:
    return _avg_pool(cv, node, cv.val(node.args[0], node), mod.kernel_size, mod.stride, mod.padding,
                     mod.ceil_mode, mod.count_include_pad, mod.divisor_override)


def _avg_pool_function(cv: GraphConverter, node: fx.Node) -> Val:
    a = cv.bind(node, ["input", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad",
                       "divisor_override"],
                dict(stride=None, padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None))
    return _avg_pool(cv, node, cv.val(a["input"], node), a["kernel_size"], a["stride"], a["padding"],
                     a["ceil_mode"], a["count_include_pad"], a["divisor_override"])


def _reference(cv: GraphConverter, node: fx.Node) -> str:
    """``"fbgemm"`` for torch's quantized kernels, ``"exact"`` for float ops (PT2E)."""
    sample = cv.samples.get(node)
    return "fbgemm" if isinstance(sample, torch.Tensor) and sample.is_quantized else "exact"


def _adaptive_avg_pool(cv: GraphConverter, node: fx.Node, *_: Any) -> Val:
    return cv.b.adaptive_avg_pool2d(cv.val(node.args[0], node), cv.target(node), cv.shape(node), node.name,
                                    _reference(cv, node))


def _mean(cv: GraphConverter, node: fx.Node) -> Val:
    a = cv.bind(node, ["input", "dim", "keepdim"], dict(keepdim=False))
    x = cv.val(a["input"], node)
    dims = sorted(d % len(x.info.shape) for d in a["dim"])
    if dims != [2, 3] or len(x.info.shape) != 4:
        raise UnsupportedError(f"node {node.name!r}: mean is supported over the spatial dims of NCHW only")
    n, c = x.info.shape[:2]
    if a["keepdim"]:
        return cv.b.adaptive_avg_pool2d(x, cv.target(node), cv.shape(node), node.name)
    pooled = cv.b.adaptive_avg_pool2d(x, cv.target(node).plain(), (n, c, 1, 1), node.name)
    return cv.b.reshape(pooled, cv.shape(node), cv.target(node), node.name)


# --- handlers: data movement -------------------------------------------------------------


def _reshape(cv: GraphConverter, node: fx.Node, *_: Any) -> Val:
    shape = cv.shape(node)
    if shape[:1] != cv.samples[node.args[0]].shape[:1]:
        raise UnsupportedError(f"node {node.name!r}: reshapes must keep the batch dim first")
    return cv.b.reshape(cv.val(node.args[0], node), shape, cv.target(node), node.name)


def _permute(cv: GraphConverter, node: fx.Node) -> Val:
    dims = node.args[1:] if node.op == "call_method" and not isinstance(node.args[1], (list, tuple)) else node.args[1]
    return cv.b.permute(cv.val(node.args[0], node), [int(d) for d in cv.const(dims)], cv.target(node),
                        cv.shape(node), node.name)


def _cat(cv: GraphConverter, node: fx.Node) -> Val:
    a = cv.bind(node, ["tensors", "dim"], dict(dim=0))
    xs = [cv.val(x, node) for x in a["tensors"]]
    return cv.b.cat(xs, a["dim"], cv.target(node), cv.shape(node), node.name)


def _quantized_cat(cv: GraphConverter, node: fx.Node) -> Val:
    a = cv.bind(node, ["qx", "dim", "scale", "zero_point"], dict(dim=0))
    xs = [cv.val(x, node) for x in a["qx"]]
    return cv.b.cat(xs, a["dim"], cv.target(node), cv.shape(node), node.name)


def _replay(cv: GraphConverter, node: fx.Node, x: torch.Tensor) -> torch.Tensor:
    """Run the node's own torch op on another input tensor (constants as in the graph)."""
    args = (x,) + tuple(cv.const(a) for a in node.args[1:])
    kwargs = {k: cv.const(v) for k, v in node.kwargs.items()}
    if node.op == "call_module":
        return cv.gm.get_submodule(node.target)(*args, **kwargs)
    return node.target(*args, **kwargs)


def _upsample_nearest(cv: GraphConverter, node: fx.Node, *_: Any) -> Val:
    mode = None
    if node.op == "call_module":
        mode = cv.gm.get_submodule(node.target).mode
    elif node.target is F.interpolate:
        mode = cv.bind(node, ["input", "size", "scale_factor", "mode"], dict(mode="nearest"))["mode"]
    if mode not in (None, "nearest"):
        raise UnsupportedError(f"node {node.name!r}: upsampling mode {mode!r}; only 'nearest' is supported")
    x = cv.val(node.args[0], node)
    n, c, h, w = x.info.shape
    # torch's own index arithmetic, replayed on coordinate images
    rows = torch.arange(h, dtype=torch.float32).view(1, 1, h, 1).expand(1, 1, h, w)
    cols = torch.arange(w, dtype=torch.float32).view(1, 1, 1, w).expand(1, 1, h, w)
    index_h = _replay(cv, node, rows.contiguous())[0, 0, :, 0].round().to(torch.int64)
    index_w = _replay(cv, node, cols.contiguous())[0, 0, 0, :].round().to(torch.int64)
    return cv.b.upsample_nearest2d(x, index_h, index_w, cv.target(node), cv.shape(node), node.name)


def _python_value(cv: GraphConverter, node: fx.Node, *_: Any) -> Any:
    """Sizes and their items: plain Python values taken from the traced run."""
    return cv.samples[node]


def _getitem(cv: GraphConverter, node: fx.Node) -> Any:
    if isinstance(cv.env.get(node.args[0]), Val):
        raise unsupported(node, "operator.getitem on a tensor", "FUNCTION_HANDLERS")
    return cv.samples[node]


# --- the tables --------------------------------------------------------------------------

PT2E_QUANTIZE = (qd.quantize_per_tensor.default, qd.quantize_per_tensor.tensor)
PT2E_DEQUANTIZE = (qd.dequantize_per_tensor.default, qd.dequantize_per_tensor.tensor)

ModuleHandler = Callable[["GraphConverter", fx.Node, nn.Module], Any]
FunctionHandler = Callable[["GraphConverter", fx.Node], Any]

MODULE_HANDLERS: dict[type, ModuleHandler] = {
    nnq.Quantize: _quantize,
    nnq.DeQuantize: _dequantize,
    nnq.Linear: _linear_module,
    nniq.LinearReLU: _linear_module,
    nnqd.Linear: _linear_module,
    nniqd.LinearReLU: _linear_module,
    nnq.Conv2d: _conv_module,
    nniq.ConvReLU2d: _conv_module,
    nn.ReLU: _activation(0.0, None),
    nnq.ReLU6: _activation(0.0, 6.0),
    nn.ReLU6: _activation(0.0, 6.0),
    nnq.Hardswish: _hardswish,
    nn.Hardswish: _hardswish,
    nn.MaxPool2d: _max_pool_module,
    nn.AvgPool2d: _avg_pool_module,
    nn.AdaptiveAvgPool2d: _adaptive_avg_pool,
    nn.Flatten: _reshape,
    nn.Upsample: _upsample_nearest,
    nn.Identity: _passthrough,
    nn.Dropout: _passthrough,
    nnq.Dropout: _passthrough,
}

FUNCTION_HANDLERS: dict[Any, FunctionHandler] = {
    # quantize / dequantize
    torch.quantize_per_tensor: _quantize,
    qd.quantize_per_tensor.default: _quantize,
    qd.quantize_per_tensor.tensor: _quantize,
    qd.dequantize_per_tensor.default: _dequantize,
    qd.dequantize_per_tensor.tensor: _dequantize,
    qd.dequantize_per_channel.default: _dequantize_per_channel,
    # layers with weights (PT2E)
    aten.conv2d.default: _aten_conv2d,
    aten.linear.default: _aten_linear,
    # elementwise: quantized ops (eager QFunctional, FX) and float ops (PT2E)
    torch.ops.quantized.add: _make_add(relu=False),
    torch.ops.quantized.add.default: _make_add(relu=False),
    torch.ops.quantized.add_relu: _make_add(relu=True),
    torch.ops.quantized.add_relu.default: _make_add(relu=True),
    torch.ops.quantized.mul: _make_mul(relu=False),
    torch.ops.quantized.mul.default: _make_mul(relu=False),
    torch.ops.quantized.mul_relu: _make_mul(relu=True),
    torch.ops.quantized.mul_relu.default: _make_mul(relu=True),
    aten.add.Tensor: _make_add(relu=False),
    aten.mul.Tensor: _make_mul(relu=False),
    torch.relu: _activation(0.0, None),
    F.relu: _activation(0.0, None),
    aten.relu.default: _activation(0.0, None),
    aten.relu_.default: _activation(0.0, None),
    F.relu6: _activation(0.0, 6.0),
    aten.relu6.default: _activation(0.0, 6.0),
    F.hardtanh: _hardtanh,
    aten.hardtanh.default: _hardtanh,
    aten.hardtanh_.default: _hardtanh,
    torch.clamp: _hardtanh,
    aten.clamp.default: _hardtanh,
    F.hardswish: _hardswish,
    torch.ops.quantized.hardswish: _hardswish,
    torch.ops.quantized.hardswish.default: _hardswish,
    aten.hardswish.default: _hardswish,
    aten.hardswish_.default: _hardswish,
    # pooling
    F.max_pool2d: _max_pool_function,
    aten.max_pool2d.default: _max_pool_function,
    F.avg_pool2d: _avg_pool_function,
    aten.avg_pool2d.default: _avg_pool_function,
    F.adaptive_avg_pool2d: _adaptive_avg_pool,
    aten.adaptive_avg_pool2d.default: _adaptive_avg_pool,
    aten.mean.dim: _mean,
    # data movement
    torch.ops.quantized.cat: _quantized_cat,
    torch.ops.quantized.cat.default: _quantized_cat,
    torch.cat: _cat,
    aten.cat.default: _cat,
    torch.flatten: _reshape,
    torch.reshape: _reshape,
    aten.flatten.using_ints: _reshape,
    aten.view.default: _reshape,
    aten.reshape.default: _reshape,
    torch.permute: _permute,
    aten.permute.default: _permute,
    F.interpolate: _upsample_nearest,
    aten.upsample_nearest2d.vec: _upsample_nearest,
    aten.upsample_nearest2d.default: _upsample_nearest,
    aten.dropout.default: _passthrough,
    aten.clone.default: _passthrough,
    aten.contiguous.default: _passthrough,
    # Python values (sizes)
    aten.sym_size.int: _python_value,
    operator.getitem: _getitem,
}

METHOD_HANDLERS: dict[str, FunctionHandler] = {
    "dequantize": _dequantize,
    "view": _reshape,
    "reshape": _reshape,
    "flatten": _reshape,
    "permute": _permute,
    "relu": _activation(0.0, None),
    "contiguous": _passthrough,
    "clone": _passthrough,
    "size": _python_value,
}

# Ops that a quantize node can be seen through when looking ahead for a node's target:
# elementwise clamps (their real bounds) and ops that commute with quantization (None, None).
_TRANSPARENT_FUNCTIONS: dict[Any, Callable[["GraphConverter", fx.Node], tuple[Any, Any]]] = {
    **{t: (lambda cv, n: (0.0, None)) for t in (torch.relu, F.relu, aten.relu.default, aten.relu_.default)},
    F.relu6: lambda cv, n: (0.0, 6.0),
    aten.relu6.default: lambda cv, n: (0.0, 6.0),
    **{t: _hardtanh_bounds for t in (F.hardtanh, aten.hardtanh.default, aten.hardtanh_.default,
                                      torch.clamp, aten.clamp.default)},
    **{t: (lambda cv, n: (None, None)) for t in (
        torch.flatten, torch.reshape, aten.flatten.using_ints, aten.view.default, aten.reshape.default,
        F.max_pool2d, aten.max_pool2d.default, F.interpolate, aten.upsample_nearest2d.vec,
        aten.upsample_nearest2d.default, aten.dropout.default, aten.clone.default, aten.contiguous.default)},
}
_TRANSPARENT_MODULES: dict[type, Callable[[nn.Module], tuple[Any, Any]]] = {
    nn.ReLU: lambda m: (0.0, None),
    nn.ReLU6: lambda m: (0.0, 6.0),
    nn.Flatten: lambda m: (None, None),
    nn.Identity: lambda m: (None, None),
    nn.Dropout: lambda m: (None, None),
    nn.MaxPool2d: lambda m: (None, None),
    nn.Upsample: lambda m: (None, None),
}
_TRANSPARENT_METHODS = {"relu": (0.0, None), "view": (None, None), "reshape": (None, None),
                        "flatten": (None, None), "contiguous": (None, None)}


def transparent_bounds(cv: GraphConverter, node: fx.Node) -> tuple[Any, Any] | None:
    """Real clamp bounds of a node a quantize can be seen through, else None."""
    if node.op == "call_function" and node.target in _TRANSPARENT_FUNCTIONS:
        return _TRANSPARENT_FUNCTIONS[node.target](cv, node)
    if node.op == "call_module":
        fn = _TRANSPARENT_MODULES.get(type(cv.gm.get_submodule(node.target)))
        return fn(cv.gm.get_submodule(node.target)) if fn else None
    if node.op == "call_method":
        return _TRANSPARENT_METHODS.get(node.target)
    return None
