"""Convert a quantized PyTorch model into a :class:`~crypten_lite.quantized.ir.QuantizedProgram`.

Three kinds of models share one path, a torch.fx graph:

1. eager ``torch.ao.quantization`` ``prepare`` / ``convert`` models are traced with
   ``torch.fx.symbolic_trace`` (torch's quantized modules are leaves; ``QFunctional``
   methods trace into ``torch.ops.quantized.*`` calls);
2. FX graph mode ``convert_fx`` models are already GraphModules;
3. torchao PT2E ``convert_pt2e`` models are GraphModules of ``quantized_decomposed``
   quantize / dequantize nodes around float aten ops.

The graph is run once on the example input (:func:`record`) to learn every value's shape
and, for torch quantized tensors, its scale and zero point. Each node is then handled by one
function of the tables in :mod:`crypten_lite.quantized.handlers`, which calls a
:class:`~crypten_lite.quantized.lowering.ProgramBuilder` method.

Q/DQ folding (PT2E): a dequantize node is not an op, it only tells how to read the integers
of its input. A float op learns its output target by looking ahead (:meth:`GraphConverter.target`):
if its single user, possibly through relu / clamp / reshape / max-pool, is a quantize node,
the op requantizes straight to that node's scale and zero point (``DQ(x), DQ(w) -> conv ->
relu -> Q`` becomes one integer conv with a clamped requantization); otherwise its result
stays a fixed-point value.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.ao.nn.quantized as nnq
import torch.fx as fx
import torch.nn as nn

from crypten_lite.errors import UnsupportedError
from crypten_lite.quantized.handlers import (
    FUNCTION_HANDLERS,
    METHOD_HANDLERS,
    MODULE_HANDLERS,
    PT2E_DEQUANTIZE,
    PT2E_QUANTIZE,
    Const,
    qtensor_target,
    target_name,
    transparent_bounds,
    unsupported,
)
from crypten_lite.quantized.ir import QUANT, QuantizedProgram
from crypten_lite.quantized.lowering import ProgramBuilder, Target, Val


def trace(model: nn.Module) -> fx.GraphModule:
    """The fx graph of a model (GraphModules as they are, eager models traced)."""
    if isinstance(model, fx.GraphModule):
        return model
    try:
        return fx.symbolic_trace(model)
    except Exception as e:  # tracing errors come in many types
        raise UnsupportedError(
            f"could not trace {type(model).__name__} with torch.fx ({e}); convert it with "
            "FX graph mode (prepare_fx / convert_fx) or torch.export + PT2E instead"
        ) from e


def _contiguous(args: tuple) -> tuple:
    return tuple(a.contiguous() if isinstance(a, torch.Tensor) else a for a in args)


class _Recorder(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule, contiguous_pooling: bool = False):
        super().__init__(gm)
        self.samples: dict[fx.Node, Any] = {}
        self.contiguous_pooling = contiguous_pooling
        self.pooled = False  # whether an average pooling ran on a non-contiguous input

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        self.samples[n] = out
        return out

    def _pool_args(self, name: str, args: tuple) -> tuple:
        if "avg_pool" not in name.lower() and "avgpool" not in name.lower():
            return args
        if any(isinstance(a, torch.Tensor) and not a.is_contiguous() for a in args):
            self.pooled = True
            if self.contiguous_pooling:
                return _contiguous(args)
        return args

    def call_module(self, target, args, kwargs):
        return super().call_module(target, self._pool_args(type(self.fetch_attr(target)).__name__, args), kwargs)

    def call_function(self, target, args, kwargs):
        return super().call_function(target, self._pool_args(target_name(target), args), kwargs)


def record(gm: fx.GraphModule, x: torch.Tensor, contiguous_pooling: bool = False) -> dict[fx.Node, Any]:
    """Run the graph on ``x`` and keep every node's output.

    ``contiguous_pooling``: feed every average pooling a contiguous (NCHW) input. torch's
    quantized average pooling rounds ties differently by memory layout on some CPUs (its
    channels-last kernel without AVX-512), so a pooling fed by a quantized conv (channels-last)
    has two torch answers; :func:`torch_answers` gives both.
    """
    return _recorded(gm, x, contiguous_pooling).samples


def _recorded(gm: fx.GraphModule, x: torch.Tensor, contiguous_pooling: bool = False) -> _Recorder:
    rec = _Recorder(gm, contiguous_pooling)
    with torch.no_grad():
        rec.run(x)
    return rec


def torch_answers(gm: fx.GraphModule, x: torch.Tensor) -> list[dict[fx.Node, Any]]:
    """Every node's output as torch computes it, once as the model runs and, where an average
    pooling ran on a non-contiguous input, once more with the pooling fed a contiguous one."""
    rec = _recorded(gm, x)
    return [rec.samples] + ([record(gm, x, contiguous_pooling=True)] if rec.pooled else [])


def from_quantized(
    model: nn.Module,
    example_input: torch.Tensor,
    *,
    frac_bits: int = 20,
    multiplier_bits: int = 24,
    max_bits: int = 62,
) -> QuantizedProgram:
    """Convert a quantized model (eager, FX or PT2E) into an integer program.

    ``example_input`` (batch first) fixes the shapes; the program runs on any batch size.
    ``frac_bits``: fractional bits of fixed-point (float) values. ``multiplier_bits``:
    significant bits of each requantization ratio (24 = float32, exact as torch).
    ``max_bits``: largest intermediate the backend holds; multipliers shrink to fit.
    Raises :class:`~crypten_lite.errors.UnsupportedError` naming any node it cannot convert.
    """
    gm = trace(model)
    samples = record(gm, example_input)
    builder = ProgramBuilder(frac_bits, multiplier_bits, max_bits)
    return GraphConverter(gm, samples, builder).convert()


class GraphConverter:
    """Walks the graph once; ``env`` maps fx nodes to Val / QWeight / Const / Python values.

    Handlers use :meth:`val`, :meth:`const`, :meth:`bind`, :meth:`shape`, :meth:`target` and
    the builder ``b``.
    """

    def __init__(self, gm: fx.GraphModule, samples: dict[fx.Node, Any], builder: ProgramBuilder):
        self.gm = gm
        self.samples = samples
        self.b = builder
        self.env: dict[fx.Node, Any] = {}
        self.sources: dict[str, tuple[str, Any]] = {}

    def convert(self) -> QuantizedProgram:
        """The program of the whole graph."""
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != 1:
            raise UnsupportedError(f"a quantized program has one input, the model has {len(placeholders)}")
        for node in self.gm.graph.nodes:
            if node.op == "output":
                return self.b.program(self._output(node), self.sources)
            if not node.users:  # dead code such as PT2E's _guards_fn
                continue
            value = self._convert(node)
            self.env[node] = value
            if isinstance(value, Val) and self._comparable(node, value):
                self.sources[node.name] = (value.name, value.info)
        raise UnsupportedError("the graph has no output node")

    def _comparable(self, node: fx.Node, value: Val) -> bool:
        """Whether ``value`` holds this node's torch value (not a fused, requantized one)."""
        sample = self.samples.get(node)
        if not isinstance(sample, torch.Tensor) or not sample.is_floating_point():
            return isinstance(sample, torch.Tensor)
        # a float torch value held as int8: only a dequantize (exact) or the input
        is_dq = node.target in PT2E_DEQUANTIZE or node.target == "dequantize" or (
            node.op == "call_module" and isinstance(self.gm.get_submodule(node.target), nnq.DeQuantize))
        return value.info.kind != QUANT or is_dq

    def _convert(self, node: fx.Node) -> Any:
        if node.op == "placeholder":
            return self._placeholder(node)
        if node.op == "get_attr":
            return Const(_fetch_attr(self.gm, node.target))
        if node.op == "call_module":
            mod = self.gm.get_submodule(node.target)
            handler = MODULE_HANDLERS.get(type(mod))
            if handler is None:
                raise unsupported(node, type(mod).__qualname__, "MODULE_HANDLERS")
            return handler(self, node, mod)
        if node.op == "call_function":
            handler = FUNCTION_HANDLERS.get(node.target)
            if handler is None:
                raise unsupported(node, target_name(node.target), "FUNCTION_HANDLERS")
            return handler(self, node)
        if node.op == "call_method":
            handler = METHOD_HANDLERS.get(node.target)
            if handler is None:
                raise unsupported(node, f"Tensor.{node.target}", "METHOD_HANDLERS")
            return handler(self, node)
        raise unsupported(node, str(node.target), "the fx node kinds")

    # --- access to arguments -------------------------------------------------------------
    def val(self, arg: Any, node: fx.Node) -> Val:
        """The IR value of an activation argument."""
        v = self.env.get(arg) if isinstance(arg, fx.Node) else None
        if not isinstance(v, Val):
            raise UnsupportedError(
                f"node {node.name!r} ({target_name(node.target)}): argument {arg} is not a "
                "quantized or float activation (constants and Python values are not supported here)"
            )
        return v

    def const(self, arg: Any) -> Any:
        """A Python / constant argument (nodes resolved through env, lists recursively)."""
        if isinstance(arg, fx.Node):
            v = self.env[arg]
            return v.tensor if isinstance(v, Const) else v
        if isinstance(arg, (list, tuple)):
            return type(arg)(self.const(a) for a in arg)
        return arg

    def shape(self, node: fx.Node) -> tuple[int, ...]:
        """The traced output shape of a node."""
        return tuple(self.samples[node].shape)

    def bind(self, node: fx.Node, names: list[str], defaults: dict[str, Any]) -> dict[str, Any]:
        """Positional and keyword arguments by name, constants resolved."""
        out = dict(defaults)
        for name, arg in zip(names, node.args):
            out[name] = arg
        out.update(node.kwargs)
        return {k: (v if k == names[0] else self.const(v)) for k, v in out.items()}

    # --- targets -------------------------------------------------------------------------
    def target(self, node: fx.Node) -> Target:
        """The scale / zero point / clamp range this node's result must have."""
        sample = self.samples.get(node)
        if isinstance(sample, torch.Tensor) and sample.is_quantized:
            return qtensor_target(sample, node)
        acts: list[tuple[Any, Any]] = []
        cur = node
        while len(cur.users) == 1:
            user = next(iter(cur.users))
            q = self.quantize_target(user)
            if q is not None:
                for lo, hi in acts:
                    q = q.with_activation(lo, hi)
                return q
            bounds = transparent_bounds(self, user)
            if bounds is None or not user.args or user.args[0] is not cur:
                break
            acts.append(bounds)
            cur = user
        # no quantize ahead: a float result; its activations clamp on their own
        return Target.fixed(self.b.frac_bits)

    def quantize_target(self, node: fx.Node) -> Target | None:
        """The target of a quantize node (eager, FX or PT2E), else None."""
        if node.op == "call_module" and isinstance(self.gm.get_submodule(node.target), nnq.Quantize):
            return qtensor_target(self.samples[node], node)
        if node.op == "call_function" and node.target is torch.quantize_per_tensor:
            return qtensor_target(self.samples[node], node)
        if node.op == "call_function" and node.target in PT2E_QUANTIZE:
            scale, zp, qmin, qmax = (self.const(a) for a in node.args[1:5])
            return Target.quant(float(scale), int(zp), int(qmin), int(qmax))
        return None

    # --- graph ends ----------------------------------------------------------------------
    def _placeholder(self, node: fx.Node) -> Val:
        users = [u for u in node.users if u.users]  # dead users such as PT2E's _guards_fn
        targets = [self.quantize_target(u) for u in users]
        shape = self.shape(node)
        if targets and all(t is not None and t == targets[0] for t in targets):
            return self.b.input(targets[0], shape, node.name)
        return self.b.input(Target.fixed(self.b.frac_bits), shape, node.name)

    def _output(self, node: fx.Node) -> Val:
        out = node.args[0]
        if isinstance(out, (list, tuple)):
            if len(out) != 1:
                raise UnsupportedError(f"a quantized program has one output, the model returns {len(out)}")
            out = out[0]
        return self.val(out, node)


def _fetch_attr(gm: fx.GraphModule, target: str) -> torch.Tensor:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj.detach() if isinstance(obj, torch.Tensor) else torch.as_tensor(obj)


