"""from_pytorch: a torch.nn.Module -> a crypten_lite.nn.Module, through torch.fx.

    model = crypten_lite.nn.from_pytorch(torch_model, dummy_input)   # public parameters
    model.encrypt(src=0)                                              # party 0's values

With `src=k`, party k alone has the torch model; the others pass None and rebuild the
converted model from the description party k broadcasts (crypten_lite.nn.graph_desc).

1. Trace: `torch.fx.symbolic_trace(model)`; where that fails (Python control flow on
   tensors, for instance), `torch.export.export(model, (dummy_input,))` (aten IR,
   specialized to the dummy input's shapes and to the model's train/eval mode at export).
2. Convert every node through one explicit table, chosen by the node's kind:
   `CONVERTERS` (call_module: torch layer type -> crypten_lite layer), `FUNCTIONS`
   (call_function: torch / torch.nn.functional / operator / aten targets) and `METHODS`
   (call_method: tensor method names). A node missing from its table raises
   UnsupportedError naming the node, its target and the table to extend; nothing is
   converted halfway.
3. The result is a `GraphModule` (a crypten_lite.nn.Module) whose submodules and
   parameters sit at the torch model's paths, so `state_dict()` keys match the torch
   model's. It interprets the graph node by node on public tensors or CrypTensors.
4. With `check=True` (default) the converted graph runs once in plaintext on the dummy
   input, in eval mode, and must match the torch model (a wrong conversion fails here,
   not in a private run).

Train/eval: nn.Dropout and nn.BatchNorm layers (and, after export, every dropout and
batch_norm node) follow the converted module's `train()` / `eval()`. A functional
`F.dropout(x, training=self.training)` is traced with the flag it had at conversion.
"""

from __future__ import annotations

import builtins
import gc
import math
import operator
from typing import Any, Callable

import torch
import torch.fx
import torch.nn.functional as TF

from ..cryptensor import CrypTensor
from ..errors import UnsupportedError
from ..mpc.offline import mapped_transients, trim_heap_growth
from . import functional as F
from . import layers as L
from . import vision_ops as _vision_ops
from .inference import FoldedBatchNorm
from .module import Module

# ---------------------------------------------------------------------- call_module
CONVERTERS: dict[type, Callable[[torch.nn.Module], Module]] = {
    torch.nn.Linear: L.Linear.from_torch,
    torch.nn.Conv1d: L.Conv1d.from_torch,
    torch.nn.Conv2d: L.Conv2d.from_torch,
    torch.nn.ConvTranspose2d: L.ConvTranspose2d.from_torch,
    torch.nn.BatchNorm1d: L.BatchNorm1d.from_torch,
    torch.nn.BatchNorm2d: L.BatchNorm2d.from_torch,
    torch.nn.LayerNorm: L.LayerNorm.from_torch,
    torch.nn.Dropout: L.Dropout.from_torch,
    torch.nn.ReLU: L.ReLU.from_torch,
    torch.nn.ReLU6: L.ReLU6.from_torch,
    torch.nn.GELU: L.GELU.from_torch,
    torch.nn.SiLU: L.SiLU.from_torch,
    torch.nn.Sigmoid: L.Sigmoid.from_torch,
    torch.nn.Tanh: L.Tanh.from_torch,
    torch.nn.Softmax: L.Softmax.from_torch,
    torch.nn.LogSoftmax: L.LogSoftmax.from_torch,
    torch.nn.MaxPool2d: L.MaxPool2d.from_torch,
    torch.nn.AvgPool2d: L.AvgPool2d.from_torch,
    torch.nn.AdaptiveAvgPool2d: L.AdaptiveAvgPool2d.from_torch,
    torch.nn.AdaptiveMaxPool2d: L.AdaptiveMaxPool2d.from_torch,
    torch.nn.Flatten: L.Flatten.from_torch,
    torch.nn.Identity: L.Identity.from_torch,
    torch.nn.Hardswish: L.Hardswish.from_torch,
    torch.nn.Hardsigmoid: L.Hardsigmoid.from_torch,
    torch.nn.MultiheadAttention: L.MultiheadAttention.from_torch,
    FoldedBatchNorm: L.FoldedBatchNorm.from_torch,
    torch.nn.MSELoss: L.MSELoss.from_torch,
    torch.nn.L1Loss: L.L1Loss.from_torch,
    torch.nn.BCELoss: L.BCELoss.from_torch,
    torch.nn.BCEWithLogitsLoss: L.BCEWithLogitsLoss.from_torch,
    torch.nn.CrossEntropyLoss: L.CrossEntropyLoss.from_torch,
}


# ------------------------------------------------------------------ call_function
def _add(a, b, alpha=1):
    b = b if alpha == 1 else b * alpha
    return a + b


def _sub(a, b, alpha=1):
    b = b if alpha == 1 else b * alpha
    return a - b


def _matmul(a, b):
    return a @ b


def _cat(tensors, dim=0):
    tensors = list(tensors)
    if F.is_private(*tensors):  # torch skips 1-D empty tensors (an empty KV cache's first cat)
        tensors = [t for t in tensors if not (isinstance(t, torch.Tensor) and t.dim() == 1 and t.numel() == 0)]
    if not F.is_private(*tensors):
        return torch.cat(tensors, dim)
    from ..cryptensor import cat, default_precision
    return cat([t if isinstance(t, CrypTensor) else
                CrypTensor._public(t.double(), default_precision(), torch.float32)
                for t in tensors], dim)


def _stack(tensors, dim=0):
    return _cat([t.unsqueeze(dim) for t in tensors], dim)


_ATTRIBUTES = {"shape", "ndim", "T", "mT", "dtype", "is_floating_point"}


def _getattr(x, name: str):
    if name not in _ATTRIBUTES:
        raise UnsupportedError(f"attribute {name!r} of a tensor is not supported by from_pytorch; "
                               f"supported: {sorted(_ATTRIBUTES)}")
    if name == "mT":
        return x.transpose(-1, -2)
    return getattr(x, name)


def _linear_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
    """F.scaled_dot_product_attention; a public mask, causal flag, grouped heads (transformer_ops)."""
    return _transformer_ops()._sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale,
                                    kw.get("enable_gqa", False))


def _method_call(name: str) -> Callable:
    """x.name(*args) on a public tensor or a CrypTensor (the same method exists on both)."""
    def call(x, *args, **kwargs):
        return getattr(x, name)(*args, **kwargs)
    call.__name__ = name
    return call


def _flatten(x, start_dim=0, end_dim=-1):
    return x.flatten(start_dim, end_dim)


def _size(x, dim=None):
    return x.size() if dim is None else x.size(dim)


def _to(x, *args, **kwargs):
    return x  # dtype / device moves: CrypTensors stay in fixed point on the CPU


def _contiguous(x, *args, **kwargs):
    return x.contiguous() if isinstance(x, torch.Tensor) else x  # CrypTensor shapes ops copy


def _view(x, *args, **kwargs):
    """Tensor.view; a CrypTensor reshapes (torch refuses a view of a non-contiguous tensor
    that reshape copies; the values are the same)."""
    if isinstance(x, torch.Tensor) and not (args and isinstance(args[0], torch.dtype)):
        return x.reshape(*args, **kwargs) if not x.is_contiguous() else x.view(*args, **kwargs)
    if args and isinstance(args[0], torch.dtype):
        raise UnsupportedError(f"Tensor.view({args[0]}) (a dtype reinterpretation) is not supported")
    return x.reshape(*args, **kwargs)


def _public_only(name: str, fn: Callable) -> Callable:
    """An operation on public values only (shapes, sizes, positions): evaluated in the clear
    on every party; a secret-shared operand is refused (nothing is revealed to compute it)."""
    def call(*args, **kwargs):
        if F.is_private(*args, *kwargs.values()):
            raise UnsupportedError(f"{name} on a secret-shared value is not supported by from_pytorch "
                                   "(only public values such as shapes are compared in the clear)")
        return fn(*args, **kwargs)
    call.__name__ = name
    return call


def _assert(condition, message=""):
    if F.is_private(condition):
        raise UnsupportedError("torch._assert on a secret-shared value is not supported")
    if not bool(condition):
        raise UnsupportedError(f"the model's assertion failed at run time: {message}")


def _stochastic_depth(x, p: float, mode: str, training: bool = True):
    """torchvision.ops.stochastic_depth: the identity in eval mode; in training, a public
    per-sample ("row") or whole-batch keep mask drawn like a dropout mask."""
    if not training or p == 0.0:
        return x
    if mode not in ("row", "batch"):
        raise UnsupportedError(f"stochastic_depth mode {mode!r}")
    shape = [x.shape[0]] + [1] * (x.dim() - 1) if mode == "row" else [1] * x.dim()
    mask = F.dropout_mask(shape, p)
    return x.mul(mask) if F.is_private(x) else x * mask.to(x.dtype)


def _adaptive_max_pool2d(x, output_size, return_indices=False):
    """adaptive_max_pool2d on a CrypTensor (its method) or a public tensor (torch's)."""
    if isinstance(x, CrypTensor):
        return x.adaptive_max_pool2d(output_size, return_indices=return_indices)
    return torch.nn.functional.adaptive_max_pool2d(x, output_size, return_indices)


def _hardtanh(x, min_val=-1.0, max_val=1.0, inplace=False):
    lo, hi = min_val, max_val  # torch's keyword names (F.hardtanh(x, min_val=, max_val=))
    if not F.is_private(x):
        return TF.hardtanh(x, lo, hi)
    if hasattr(x, "hardtanh"):
        return x.hardtanh(lo, hi)
    return F.relu(x.sub(lo)).sub(F.relu(x.sub(hi))).add(lo)


FUNCTIONS: dict[Any, Callable] = {
    # python operators (also the arithmetic of x.size() values)
    operator.add: _add, operator.iadd: _add, operator.sub: _sub, operator.isub: _sub,
    operator.mul: operator.mul, operator.imul: operator.mul, operator.truediv: operator.truediv,
    operator.floordiv: operator.floordiv, operator.neg: operator.neg, operator.pow: operator.pow,
    operator.matmul: _matmul, operator.getitem: operator.getitem, builtins.getattr: _getattr,
    math.sqrt: math.sqrt, torch._assert: _assert,
    **{op: _public_only(op.__name__, op) for op in (operator.eq, operator.ne, operator.lt, operator.le,
                                                    operator.gt, operator.ge, operator.not_)},
    # torch
    torch.add: _add, torch.sub: _sub, torch.mul: operator.mul, torch.div: operator.truediv,
    torch.matmul: _matmul, torch.mm: _matmul, torch.bmm: _matmul, torch.cat: _cat,
    torch.concat: _cat, torch.stack: _stack, torch.flatten: _flatten,
    torch.reshape: _method_call("reshape"), torch.transpose: _method_call("transpose"),
    torch.permute: _method_call("permute"), torch.squeeze: _method_call("squeeze"),
    torch.unsqueeze: _method_call("unsqueeze"), torch.sum: _method_call("sum"),
    torch.mean: _method_call("mean"), torch.relu: F.relu, torch.sigmoid: F.sigmoid,
    torch.tanh: F.tanh, torch.softmax: F.softmax, torch.log_softmax: F.log_softmax,
    torch.chunk: _method_call("chunk"), torch.split: _method_call("split"),
    torch.einsum: _vision_ops.einsum, torch.swapaxes: _method_call("transpose"),
    # torch.nn.functional
    TF.linear: F.linear, TF.conv1d: F.conv1d, TF.conv2d: F.conv2d,
    TF.conv_transpose2d: F.conv_transpose2d, TF.relu: F.relu, TF.relu6: F.relu6,
    TF.gelu: F.gelu, TF.silu: F.silu, TF.sigmoid: F.sigmoid, TF.tanh: F.tanh,
    TF.softmax: F.softmax, TF.log_softmax: F.log_softmax, TF.max_pool2d: F.max_pool2d,
    TF.avg_pool2d: F.avg_pool2d, TF.adaptive_avg_pool2d: F.adaptive_avg_pool2d,
    TF.adaptive_max_pool2d: lambda x, output_size, return_indices=False:
        _adaptive_max_pool2d(x, output_size, return_indices),
    TF.layer_norm: F.layer_norm, TF.batch_norm: F.batch_norm, TF.dropout: F.dropout,
    TF.pad: F.pad, TF.hardtanh: _hardtanh, TF.hardswish: F.hardswish, TF.hardsigmoid: F.hardsigmoid,
    TF.scaled_dot_product_attention: _linear_sdpa,
}

# Functions of optional packages (torchvision), by qualified name: crypten_lite never imports
# those packages. A traced graph that calls one is bound by the name; a party without the
# package rebuilds the node from a model description through a stand-in of the same name.
NAMED_FUNCTIONS: dict[str, Callable] = {
    "torchvision.ops.stochastic_depth.stochastic_depth": _stochastic_depth,
    **_vision_ops.FUNCTIONS,  # Swin's window attention, relative position bias, patch merging
}
_STAND_INS: dict[str, Callable] = {}


def named_stand_in(name: str) -> Callable:
    """A function whose qualified name is `name` (an entry of NAMED_FUNCTIONS), for rebuilt graphs."""
    if name not in _STAND_INS:
        impl = NAMED_FUNCTIONS[name]
        module, _, short = name.rpartition(".")

        def stand_in(*args, **kwargs):
            return impl(*args, **kwargs)
        stand_in.__module__, stand_in.__name__, stand_in.__qualname__ = module, short, short
        _STAND_INS[name] = stand_in
    return _STAND_INS[name]


# ------------------------------------------------------------------- call_method
METHODS: dict[str, Callable] = {name: _method_call(name) for name in (
    "reshape", "transpose", "permute", "unsqueeze", "squeeze", "expand", "expand_as",
    "repeat", "view_as", "reshape_as", "narrow", "chunk", "split", "t", "dim", "numel",
    "add", "sub", "mul", "div", "matmul", "neg", "sum", "mean", "square", "clone", "detach",
    "relu", "sigmoid", "tanh", "softmax", "log_softmax", "exp", "unbind", "cumsum", "flip", "roll",
)}
METHODS.update({"flatten": _flatten, "size": _size, "contiguous": _contiguous, "to": _to, "view": _view,
                "float": _contiguous, "type_as": _to})


# ---------------------------------------------------------------- aten (export fallback)
def _aten_table() -> dict[Any, Callable]:
    aten = torch.ops.aten

    return {
        aten.linear.default: F.linear,
        aten.conv1d.default: F.conv1d, aten.conv2d.default: F.conv2d,
        aten.conv_transpose2d.input: F.conv_transpose2d,
        aten.relu.default: F.relu, aten.relu_.default: F.relu,
        aten.hardtanh.default: _hardtanh,
        aten.gelu.default: lambda x, approximate="none": F.gelu(x, approximate),
        aten.silu.default: F.silu, aten.sigmoid.default: F.sigmoid, aten.tanh.default: F.tanh,
        aten.softmax.int: lambda x, dim, dtype=None: F.softmax(x, dim),
        aten._softmax.default: lambda x, dim, half=False: F.softmax(x, dim),
        aten.log_softmax.int: lambda x, dim, dtype=None: F.log_softmax(x, dim),
        aten.add.Tensor: _add, aten.add_.Tensor: _add, aten.sub.Tensor: _sub,
        aten.mul.Tensor: operator.mul, aten.div.Tensor: operator.truediv,
        aten.add.Scalar: _add, aten.mul.Scalar: operator.mul,
        aten.matmul.default: _matmul, aten.mm.default: _matmul, aten.bmm.default: _matmul,
        aten.t.default: _method_call("t"), aten.transpose.int: _method_call("transpose"),
        aten.permute.default: _method_call("permute"), aten.view.default: _method_call("reshape"),
        aten.reshape.default: _method_call("reshape"), aten._unsafe_view.default: _method_call("reshape"),
        aten.flatten.using_ints: _flatten, aten.unsqueeze.default: _method_call("unsqueeze"),
        aten.squeeze.dim: _method_call("squeeze"), aten.expand.default: _method_call("expand"),
        aten.clone.default: lambda x, memory_format=None: x.clone(),
        aten.contiguous.default: _contiguous,
        aten.cat.default: _cat, aten.stack.default: _stack,
        aten.mean.dim: lambda x, dim, keepdim=False, dtype=None: x.mean(dim, keepdim),
        aten.sum.dim_IntList: lambda x, dim, keepdim=False, dtype=None: x.sum(dim, keepdim),
        aten.max_pool2d.default: F.max_pool2d, aten.avg_pool2d.default: F.avg_pool2d,
        aten.adaptive_avg_pool2d.default: F.adaptive_avg_pool2d,
        aten.adaptive_max_pool2d.default: lambda x, size: _adaptive_max_pool2d(x, size, True),
        aten.layer_norm.default: lambda x, shape, w=None, b=None, eps=1e-5, cudnn=False:
            F.layer_norm(x, shape, w, b, eps),
        aten.rms_norm.default: lambda x, shape, w=None, eps=None:
            torch.nn.functional.rms_norm(x, shape, w, eps),
        aten.select.int: lambda x, dim, index: x.select(dim, index),
        aten.slice.Tensor: lambda x, dim=0, start=None, end=None, step=1:
            x[(slice(None),) * (dim % x.dim()) + (slice(start, end, step),)],
        aten.sym_size.int: lambda x, dim: x.size(dim),
        aten.scaled_dot_product_attention.default: _linear_sdpa,
        aten.split.Tensor: _method_call("split"), aten.chunk.default: _method_call("chunk"),
        aten.pad.default: lambda x, pad, mode="constant", value=None: F.pad(x, pad, mode, value),
        aten.constant_pad_nd.default: lambda x, pad, value=0: F.pad(x, pad, "constant", value),
        aten.alias.default: lambda x: x, aten.detach.default: lambda x: x.detach(),
        # transformers: ops on public values (bound per node), embeddings, masked attention
        **{op: _transformer_ops().public_only for op in _transformer_ops().public_ops()},
        **_transformer_ops().private_table(),
        _transformer_ops().public_constant: _transformer_ops().public_constant,
    }


def _transformer_ops():
    from . import transformer_ops
    return transformer_ops


ATEN: dict[Any, Callable] = {}


def _aten() -> dict[Any, Callable]:
    if not ATEN:
        ATEN.update(_aten_table())
    return ATEN


# ------------------------------------------------------------------ the converted module
# A private model whose weight shares reach this size runs its forwards inside
# offline.mapped_transients. Below it the heap is small anyway and mapping each 1 MiB+
# temporary afresh costs more than it saves: LeNet batch 64 faulted in about 27,000-58,000
# pages per inference instead of about 40 (+45% CPU time), ResNet-18 +15% CPU time; BERT-base
# (1.7 GB of shares and masks) saved 0.4-0.5 GB per party.
MAPPED_TRANSIENTS_MODEL_BYTES = 256 << 20


class GraphModule(Module):
    """A converted model: submodules at the torch model's paths and the graph to interpret."""

    def __init__(self, graph: torch.fx.Graph, source: str) -> None:
        super().__init__()
        object.__setattr__(self, "graph", graph)
        object.__setattr__(self, "source", source)  # "fx" or "export"
        object.__setattr__(self, "_impl", {})        # node -> callable (call_function/method)
        object.__setattr__(self, "_input_names", [])
        object.__setattr__(self, "_out_spec", None)      # export: (pytree spec, user outputs)

    def release_torch_model(self) -> None:
        """Forget the model owner's torch model that an in-band from_pytorch attached (only
        nn.generate needs it, to export its graphs; a no-op on the other parties): its float32
        weights are freed once the caller drops its own reference too."""
        self.__dict__.pop("_torch_model", None)

    def _unflatten(self, flat):
        from torch.utils._pytree import tree_unflatten
        spec, n_user = self._out_spec
        return tree_unflatten(list(flat)[len(flat) - n_user:], spec)

    def _path(self, path: str, create: bool = True) -> tuple[Module, str]:
        """The module owning the dotted `path` (containers created on demand) and the leaf name."""
        owner: Module = self
        *parents, leaf = path.split(".")
        for part in parents:
            child = owner._modules.get(part)
            if child is None:
                if not create:
                    raise KeyError(path)
                child = Module()
                owner.add_module(part, child)
            owner = child
        return owner, leaf

    def _get(self, path: str):
        owner, leaf = self._path(path, create=False)
        for table in (owner._parameters, owner._buffers, owner._modules):
            if leaf in table:
                return table[leaf]
        raise KeyError(path)

    def encrypt(self, src: int = 0, precision: int | None = None) -> "GraphModule":
        """Module.encrypt; a model shipped in-band (from_pytorch(..., src=k)) is shared by party k."""
        model_src = self.__dict__.get("_model_src")
        if model_src is not None and src != model_src:
            from ..errors import ProtocolError
            raise ProtocolError(f"this model came from party {model_src} (from_pytorch(..., src="
                                f"{model_src})), which alone holds its weights; call encrypt(src={model_src})")
        super().encrypt(src, precision)
        if model_src is not None:  # tied weights (from the description: alike on every party)
            for group in self.__dict__.get("_tied", ()):
                first = self._get(group[0])
                for path in group[1:]:  # shared as before (same costs), then one copy kept
                    owner, leaf = self._path(path, create=False)
                    owner._parameters[leaf] = first
        object.__setattr__(self, "_architecture_only", False)
        return self

    def train(self, mode: bool = True) -> "GraphModule":
        if mode and self.__dict__.get("_inference_only"):
            raise UnsupportedError("this model was converted for inference (eval mode: BatchNorm folded, "
                                   "dropout removed); convert it with from_pytorch(..., "
                                   "fold_batch_norm=False) to train it")
        return super().train(mode)

    def __call__(self, *inputs, **named):
        if not self._encrypted or not self._maps_transients():
            return super().__call__(*inputs, **named)
        # a large private model's temporaries in mappings of their own, not heap holes that
        # stay resident (crypten_lite.mpc.offline.mapped_transients says why)
        with mapped_transients():
            return super().__call__(*inputs, **named)

    def _maps_transients(self) -> bool:
        """Whether this private model runs inside offline.mapped_transients: its weights'
        shares reach MAPPED_TRANSIENTS_MODEL_BYTES (decided once per model)."""
        big = self.__dict__.get("_mapped_transients")
        if big is None:
            big = 8 * sum(p.numel() for p in self.parameters()) >= MAPPED_TRANSIENTS_MODEL_BYTES
            object.__setattr__(self, "_mapped_transients", big)
        return big

    def forward(self, *inputs, **named):
        if named:  # keyword inputs (input_ids=..., attention_mask=...) by placeholder name
            inputs = _transformer_ops().by_name(self._input_names, inputs, named)
        if self.__dict__.get("_architecture_only") and any(
                isinstance(v, torch.Tensor) and v.device.type == "meta" for v in self.state_dict().values()):
            from ..errors import ProtocolError
            from ..session import current
            raise ProtocolError(f"party {current().rank} holds only the architecture of this model (its "
                                f"weights are with party {self.__dict__.get('_model_src')}); call "
                                "encrypt(src=...) on every party before running it")
        if len(inputs) != len(self._input_names):
            raise UnsupportedError(f"converted model takes {len(self._input_names)} inputs "
                                   f"({', '.join(self._input_names)}), got {len(inputs)}")
        env: dict[torch.fx.Node, Any] = {}
        feed = iter(inputs)
        fusion = self._fusion()
        last_uses = self._last_uses()
        private = self._encrypted
        for node in self.graph.nodes:
            # values no later node reads are dropped (an activation lives until its last use,
            # not to the end of the forward: BERT-base seq 128's peak fell about 100 MB per party)
            for done in last_uses.get(node, ()):
                env.pop(done, None)
            if private:
                trim_heap_growth()  # free heap pages that the last operation left resident
            op = node.op
            role = fusion.get(node)
            if role == "skip":  # a ReLU folded into the neighbouring max pool
                env[node] = env[node.args[0]]
                continue
            if role is not None:
                x = env[node.args[0]]
                env[node] = (x.relu_max_pool2d(*role) if hasattr(x, "relu_max_pool2d")
                             else torch.nn.functional.max_pool2d(torch.relu(x), *role))
                continue
            if op == "placeholder":
                env[node] = next(feed) if node.name in self._input_names else self._get(node.meta["state_path"])
                continue
            if op == "output":
                result = torch.fx.node.map_arg(node.args[0], lambda n: env[n])
                return self._unflatten(result) if self._out_spec is not None else result
            args = torch.fx.node.map_arg(node.args, lambda n: env[n])
            kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
            if op == "get_attr":
                env[node] = self._get(node.target)
            elif op == "call_module":
                env[node] = self._get(node.target)(*args, **kwargs)
            else:
                env[node] = self._impl[node](*args, **kwargs)
            del args, kwargs
        raise UnsupportedError("converted graph has no output node")

    def _last_uses(self) -> dict:
        """For each node, the earlier nodes whose values it is the last to read (dropped from
        the forward's environment before it runs: its own arguments are fetched first)."""
        plan = self.__dict__.get("_last_use_plan")
        if plan is not None and plan[0] is self.graph:
            return plan[1]
        last: dict = {}
        for node in self.graph.nodes:
            last[node] = node  # a value nothing reads goes at once
            for used in node.all_input_nodes:
                last[used] = node
        # a value is dropped once the node after its last reader starts
        nodes = list(self.graph.nodes)
        after = dict(zip(nodes, nodes[1:]))
        drops: dict = {}
        for used, reader in last.items():
            nxt = after.get(reader)
            if nxt is not None:
                drops.setdefault(nxt, []).append(used)
        object.__setattr__(self, "_last_use_plan", (self.graph, drops))
        return drops

    def extra_repr(self) -> str:
        return f"source={self.source}"

    def _fusion(self) -> dict:
        """ReLU next to a 2D max pool (either order, sole user): one fused op, the rounds of
        one pooling (relu(maxpool(x)) == maxpool(relu(x)))."""
        plan = self.__dict__.get("_fusion_plan")
        if plan is not None:
            return plan
        plan = {}
        for node in self.graph.nodes:
            pool = self._pool_params(node)
            if pool is None:
                continue
            before = node.args[0] if node.args and isinstance(node.args[0], torch.fx.Node) else None
            after = next(iter(node.users)) if len(node.users) == 1 else None
            if before is not None and self._is_relu(before) and len(before.users) == 1 and before not in plan:
                plan[before], plan[node] = "skip", pool
            elif after is not None and self._is_relu(after):
                plan[node], plan[after] = pool, "skip"
        object.__setattr__(self, "_fusion_plan", plan)
        return plan

    def _module_at(self, node: torch.fx.Node):
        if node.op != "call_module":
            return None
        try:
            return self._get(node.target)
        except KeyError:
            return None

    def _is_relu(self, node: torch.fx.Node) -> bool:
        from .layers import ReLU
        if node.op == "call_module":
            return isinstance(self._module_at(node), ReLU)
        if node.op == "call_function":
            return node.target in (torch.relu, torch.nn.functional.relu) and len(node.args) == 1 \
                and not node.kwargs.get("inplace", False) or node.target is torch.ops.aten.relu.default
        return node.op == "call_method" and node.target == "relu"

    def _pool_params(self, node: torch.fx.Node):
        from .layers import MaxPool2d
        m = self._module_at(node)
        if isinstance(m, MaxPool2d):
            return (m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode)
        if node.op == "call_function" and node.target in (torch.nn.functional.max_pool2d, torch.max_pool2d) \
                and not node.kwargs.get("return_indices", False):
            if any(isinstance(a, torch.fx.Node) for a in node.args[1:]):
                return None
            names = ("kernel_size", "stride", "padding", "dilation", "ceil_mode")
            defaults = {"stride": None, "padding": 0, "dilation": 1, "ceil_mode": False}
            values = dict(zip(names, node.args[1:]), **{k: v for k, v in node.kwargs.items() if k in names})
            if "kernel_size" not in values:
                return None
            return tuple(values.get(n, defaults.get(n)) for n in names)
        return None


def _unsupported(node: torch.fx.Node, table: str, what: str) -> UnsupportedError:
    return UnsupportedError(
        f"from_pytorch: node {node.name!r} ({node.op}, target {what}) is not supported; "
        f"add an entry for it to crypten_lite.nn.from_pytorch.{table} (or rewrite the model "
        "with supported layers and functions)")


def _target_name(target) -> str:
    if isinstance(target, str):
        return repr(target)
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    try:
        return torch.fx.node._get_qualified_name(target)
    except Exception:  # targets without a qualified name: show what Python shows
        return repr(target)


def _convert_fx(model: torch.nn.Module, traced: torch.fx.GraphModule) -> GraphModule:
    out = GraphModule(traced.graph, "fx")
    torch_modules = dict(model.named_modules())
    for node in traced.graph.nodes:
        if node.op == "placeholder":
            out._input_names.append(node.name)
        elif node.op == "call_module":
            sub = torch_modules[node.target]
            convert = CONVERTERS.get(type(sub))
            if convert is None:
                raise _unsupported(node, "CONVERTERS", f"{type(sub).__module__}.{type(sub).__name__}")
            owner, leaf = out._path(node.target)
            if leaf not in owner._modules:
                owner.add_module(leaf, convert(sub))
        elif node.op == "get_attr":
            value = _fetch(model, node.target)
            owner, leaf = out._path(node.target)
            if not isinstance(value, torch.Tensor):
                raise _unsupported(node, "CONVERTERS", f"attribute of type {type(value).__name__}")
            if isinstance(value, torch.nn.Parameter):
                owner.register_parameter(leaf, value.detach().clone())
            else:
                owner.register_buffer(leaf, value.detach().clone())
        elif node.op in ("call_function", "call_method"):
            bind_node(out, node)
    return out


def bind_node(out: "GraphModule", node: torch.fx.Node) -> None:
    """Attach the implementation of a call_function / call_method node (from the tables)."""
    if node.op == "call_method":
        impl = METHODS.get(node.target)
        if impl is None:
            raise _unsupported(node, "METHODS", f"Tensor.{node.target}")
    elif out.source == "fx":
        impl = FUNCTIONS.get(node.target)
        if impl is None or node.target is torch.einsum:
            named = NAMED_FUNCTIONS.get(_target_name(node.target)) or impl
            impl = None if named is None else _naming(node, named)
        if impl is None:
            raise _unsupported(node, "FUNCTIONS", _target_name(node.target))
    elif node.target is torch.ops.aten.batch_norm.default:
        impl = _bind_batch_norm(out, node)
    elif node.target is torch.ops.aten.dropout.default:
        impl = lambda x, p, train, _m=out: F.dropout(x, p, _m.training)  # noqa: E731
    else:
        impl = _aten().get(node.target)
        if impl is None:
            raise _unsupported(node, "ATEN (export fallback) / FUNCTIONS", _target_name(node.target))
        impl = _transformer_ops().bind(node, impl)  # errors name the node; public-only ops
    out._impl[node] = impl


def _naming(node: torch.fx.Node, impl: Callable) -> Callable:
    """impl, whose refusals (a variant it does not support) name the node and its op."""
    def call(*args, **kwargs):
        try:
            return impl(*args, **kwargs)
        except UnsupportedError as e:
            raise UnsupportedError(f"from_pytorch: node {node.name!r} ({_target_name(node.target)}): {e}") from e
    call.__name__ = node.name
    return call


def _fetch(model: torch.nn.Module, path: str):
    obj: Any = model
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _forget_export_proxies() -> None:
    """Empty torch's module-level map from fake tensors to the proxies of the last export
    (torch.fx.experimental.proxy_tensor): it keeps that export's whole traced graph alive,
    with the model's float32 weights in it (BERT-base: 2 x 418 MiB held by the model owner
    after its model is shared). Only an export in progress reads it."""
    from torch.fx.experimental import proxy_tensor
    held = getattr(proxy_tensor, "_FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT", None)
    if isinstance(held, dict):
        held.clear()


def _convert_export(model: torch.nn.Module, dummy_inputs: tuple | dict) -> GraphModule:
    args, kwargs = ((), dict(dummy_inputs)) if isinstance(dummy_inputs, dict) else (dummy_inputs, None)
    with _transformer_ops().no_cache(model):
        exported = torch.export.export(model, args, kwargs)
    _forget_export_proxies()
    graph = exported.graph_module.graph
    sig = exported.graph_signature
    state = dict(model.state_dict(keep_vars=True))
    state.update(dict(exported.constants))
    paths = {**sig.inputs_to_parameters, **sig.inputs_to_buffers,
             **getattr(sig, "inputs_to_lifted_tensor_constants", {})}
    params = set(sig.inputs_to_parameters)
    # non-persistent buffers and code constants are public: folded with what they compute
    _transformer_ops().publicize(graph, sig, state)
    out = GraphModule(graph, "export")
    object.__setattr__(out, "_out_spec", (exported.call_spec.out_spec, len(sig.user_outputs)))
    for node in graph.nodes:
        if node.op == "placeholder":
            if node.name in paths:
                path = paths[node.name]
                node.meta["state_path"] = path
                owner, leaf = out._path(path)
                value = state[path]
                if node.name in params:
                    owner.register_parameter(leaf, value.detach().clone())
                else:
                    owner.register_buffer(leaf, value.detach().clone())
            else:
                out._input_names.append(node.name)
        elif node.op == "call_function":
            bind_node(out, node)
        elif node.op not in ("output", "get_attr"):
            raise _unsupported(node, "ATEN (export fallback)", str(node.target))
    return out


def _bind_batch_norm(out: GraphModule, node: torch.fx.Node) -> Callable:
    """aten.batch_norm reads its parameters from placeholders: make them a BatchNorm layer at
    their common path, so that running statistics update in training like nn.BatchNorm."""
    x, w, b, rm, rv, _training, momentum, eps = node.args[:8]
    path = rm.meta["state_path"].rsplit(".", 1)[0] if rm is not None else None
    if path is None:
        return lambda x, w, b, rm, rv, training, momentum, eps, cudnn=False: \
            F.batch_norm(x, None, None, w, b, True, momentum, eps)[0]
    owner, leaf = out._path(path)
    container = owner._modules[leaf]
    bn = L._BatchNorm.__new__(L._BatchNorm)
    Module.__init__(bn)
    for a, v in (("num_features", container._buffers["running_mean"].shape[0]), ("eps", eps),
                 ("momentum", momentum), ("affine", w is not None), ("track_running_stats", True)):
        object.__setattr__(bn, a, v)
    object.__setattr__(bn, "_dims", (2, 3, 4))
    for table in ("_parameters", "_buffers"):
        getattr(bn, table).update(getattr(container, table))
    owner._modules[leaf] = bn
    return lambda x, *rest, _bn=bn: _bn(x)


class _Tracer(torch.fx.Tracer):
    """torch.fx's tracer, but a torch.nn module made of other modules that has no converter
    (TransformerEncoderLayer, TransformerEncoder...) is traced through, not kept as a leaf."""

    def is_leaf_module(self, m: torch.nn.Module, qualname: str) -> bool:
        if type(m) not in CONVERTERS and next(m.children(), None) is not None:
            return False
        return super().is_leaf_module(m, qualname)


def _trace(model: torch.nn.Module) -> torch.fx.GraphModule:
    tracer = _Tracer()
    graph = tracer.trace(model)
    return torch.fx.GraphModule(tracer.root, graph, type(model).__name__)


_QUANTIZED_MODULES = ("torch.ao.nn.quantized", "torch.ao.nn.intrinsic.quantized", "torch.nn.quantized",
                      "torch.ao.quantization.stubs")


def is_quantized(model: torch.nn.Module) -> bool:
    """Whether `model` is an int8 model of torch.ao.quantization (eager/FX) or torchao PT2E."""
    if any(type(m).__module__.startswith(_QUANTIZED_MODULES) and type(m).__name__ not in ("QuantStub", "DeQuantStub", "FloatFunctional")
           for m in model.modules()):
        return True
    if isinstance(model, torch.fx.GraphModule):
        return any(n.op == "call_function" and ("quantize_per" in str(n.target) or "dequantize" in str(n.target))
                   for n in model.graph.nodes)
    return False


def _fold_batch_norm(model: torch.nn.Module) -> torch.fx.GraphModule | None:
    """The eval-mode model simplified for inference (crypten_lite.nn.inference): BatchNorms
    folded, dropout and stochastic depth removed; None where torch.fx cannot trace it."""
    from .inference import simplify
    try:
        return simplify(model)
    except Exception:  # untraceable: converted without folding (torch.export keeps BatchNorm)
        return None


def from_pytorch(model: torch.nn.Module | None, dummy_input, check: bool = True,
                 tolerance: float = 1e-4, fold_batch_norm: bool | None = None, *, src: int | None = None):
    """Convert a torch model to a crypten_lite.nn.Module with the same (public) parameters.

    `dummy_input` (a tensor or a tuple of tensors of the input shapes) drives the
    torch.export fallback and the plaintext check; call `.encrypt(src=...)` on the result to
    secret-share the parameters of the party that owns them.

    With `src` (in a session), only party `src` has the model; the others pass None:

        private = from_pytorch(model if rank == src else None, dummy, src=src)
        private.encrypt(src=src)

    Party `src` converts its model and broadcasts a description of it (architecture and
    public constants, no weights: crypten_lite.nn.graph_desc); every other party rebuilds
    the same model from it, with placeholders for the weights that `encrypt(src=src)` then
    shares. No other party needs the model's class. `dummy_input` may then be a shape; the
    other parties' dummy (optional) is checked against the owner's input shape. Int8 models
    come back as a QuantizedProgram with the same calls (`encrypt`, `eval`, `__call__`).

    A model in eval mode is simplified for inference by default (`fold_batch_norm=None`:
    fold exactly when the model is in eval mode; crypten_lite.nn.inference): each BatchNorm
    that follows a convolution or linear layer is folded into that layer's weights and bias,
    every other BatchNorm becomes a per-channel affine map, and dropout and stochastic depth
    (identities in eval) are removed, in plaintext, on the model owner's side, before anything
    is shared. Private inference then needs no normalization (no private inverse square root:
    about 12 rounds saved per BatchNorm; torchvision's ResNet-18 goes from 442 to 162 rounds). The state
    dict then has the folded layers' keys instead of the BatchNorm ones, and the converted
    model refuses `train()`. `fold_batch_norm=False` converts the model as it is (torch's
    state dict keys, trainable); `True` insists on folding (the model must be in eval mode).
    """
    if src is not None:
        with mapped_transients():  # the owner's conversion copies leave no heap hole behind
            return _in_band(model, dummy_input, src, check, tolerance, fold_batch_norm)
    if is_quantized(model):  # torch.ao eager/FX or torchao PT2E int8 model
        from ..quantized import from_quantized
        return from_quantized(model, dummy_input)
    dummy = dummy_input if isinstance(dummy_input, (tuple, dict)) else (dummy_input,)
    if fold_batch_norm and model.training:
        raise UnsupportedError("fold_batch_norm=True needs the model in eval mode (model.eval())")
    if fold_batch_norm is None:
        fold_batch_norm = not model.training
    try:
        folded = _fold_batch_norm(model) if fold_batch_norm else None
        if folded is not None:
            converted = _convert_fx(folded, folded)
            object.__setattr__(converted, "_inference_only", True)
        else:
            traced = _trace(model)
            converted = _convert_fx(model, traced)
    except UnsupportedError:
        raise
    except Exception as fx_error:  # torch.fx cannot trace this model: use torch.export
        try:
            converted = _convert_export(model, dummy)
        except UnsupportedError:
            raise
        except Exception as export_error:
            raise UnsupportedError(f"from_pytorch: torch.fx failed ({fx_error}) and torch.export "
                                   f"failed ({export_error}); simplify the model's control flow") \
                from export_error
    object.__setattr__(converted, "_tied", _tied_paths(model, converted))
    converted.train(model.training)
    if check and all(isinstance(d, torch.Tensor) for d in _values(dummy)):
        _check(model, converted, dummy, tolerance)
    return converted


def _tied_paths(model: torch.nn.Module, converted: "GraphModule") -> list[list[str]]:
    """Groups of parameter paths that are one tensor in the torch model (tied weights: GPT-2's
    token embedding and LM head), where the converted model holds equal values at each path.
    The in-band description carries them, so that encrypt shares one CrypTensor per group
    (crypten_lite.nn.graph_desc; GraphModule.encrypt)."""
    own = converted.state_dict()
    groups: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if isinstance(own.get(name), torch.Tensor):
            groups.setdefault(id(p), []).append(name)
    return [g for g in groups.values() if len(g) > 1
            and all(own[n].shape == own[g[0]].shape and torch.equal(own[n], own[g[0]]) for n in g[1:])]


# A dummy input beyond this magnitude (or not finite) is not data: torch.empty's garbage, which
# CrypTen's tutorials pass since CrypTen reads only the shape. The check then runs on
# checkable_dummy's values instead.
DUMMY_BOUND = 1e3


def checkable_dummy(dummy):
    """`dummy` (a tuple or dict of tensors) with every floating tensor that holds a value
    that is not finite or beyond DUMMY_BOUND (uninitialized memory: torch.empty) replaced by
    a deterministic pattern of the same shape and dtype in [-1, 1]; other tensors as given."""
    def fix(t):
        if not (isinstance(t, torch.Tensor) and t.is_floating_point()) or t.numel() == 0:
            return t
        if torch.isfinite(t).all() and t.abs().max() <= DUMMY_BOUND:
            return t
        pattern = torch.sin(torch.arange(t.numel(), dtype=torch.float64) * 0.7)
        return pattern.reshape(t.shape).to(t.dtype)
    if isinstance(dummy, dict):
        return {k: fix(v) for k, v in dummy.items()}
    return tuple(fix(t) for t in dummy)


def _check(model: torch.nn.Module, converted: GraphModule, dummy: tuple, tolerance: float) -> None:
    dummy = checkable_dummy(dummy)
    was_training = model.training
    model.eval()
    converted.eval()
    try:
        with torch.no_grad(), _transformer_ops().no_cache(model):
            expected = model(**dummy) if isinstance(dummy, dict) else model(*dummy)
            got = converted(**dummy) if isinstance(dummy, dict) else converted(*dummy)
    finally:
        model.train(was_training)
        converted.train(was_training)
    from torch.utils._pytree import tree_leaves
    flat_e, flat_g = tree_leaves(expected), tree_leaves(got)  # HF ModelOutput / dict outputs
    if len(flat_e) != len(flat_g):
        raise UnsupportedError(f"from_pytorch: the converted model returns {len(flat_g)} values, the "
                               f"torch model {len(flat_e)}")
    for e, g in zip(flat_e, flat_g):
        if isinstance(e, torch.Tensor) and not torch.allclose(e, g, atol=tolerance, rtol=tolerance):
            raise UnsupportedError(
                f"from_pytorch: the converted model differs from the torch model on the dummy "
                f"input (max abs difference {(e - g).abs().max().item():.3g}); a converter in "
                "crypten_lite.nn.from_pytorch does not match torch for this model")


# ------------------------------------------------------------------ the model shipped in-band
def _dummy_tuple(dummy_input) -> tuple | None:
    """The dummy as a tuple of tensors (a shape becomes zeros of that shape); None stays None."""
    if dummy_input is None:
        return None
    if isinstance(dummy_input, torch.Tensor):
        return (dummy_input,)
    if isinstance(dummy_input, (tuple, list, torch.Size)) and dummy_input and \
            all(isinstance(d, int) and not isinstance(d, bool) for d in dummy_input):
        return (torch.zeros(tuple(dummy_input)),)
    if isinstance(dummy_input, (tuple, list)) and all(isinstance(d, torch.Tensor) for d in dummy_input):
        return tuple(dummy_input)
    if isinstance(dummy_input, dict) and all(isinstance(d, torch.Tensor) for d in dummy_input.values()):
        return dict(dummy_input)  # keyword inputs (HF models: input_ids=..., attention_mask=...)
    raise UnsupportedError("dummy_input must be a tensor, a tuple of tensors or a shape (tuple of ints), "
                           f"got {type(dummy_input).__name__}")


def _values(dummy) -> tuple:
    """The dummy inputs as a tuple (a dict of keyword inputs: its values, in order)."""
    return tuple(dummy.values()) if isinstance(dummy, dict) else tuple(dummy)


def _owner_convert(model, dummy: tuple, dummy_input, check: bool, tolerance: float,
                   fold_batch_norm: bool, src: int):
    """Party src: convert, describe, rebuild from the description (what the others run)."""
    from . import graph_desc as gd
    if not isinstance(model, torch.nn.Module):
        raise UnsupportedError(f"party {src} is the model owner (src={src}) but passed "
                               f"{type(model).__name__}, not a torch model")
    if dummy is None:
        raise UnsupportedError(f"party {src} (the model owner) needs dummy_input to trace its model")
    if is_quantized(model):
        from ..quantized import from_quantized
        from ..quantized.mpc_backend import public_digest
        program = from_quantized(model, dummy[0])
        payload = gd.describe_program(program)
        rebuilt = gd.rebuild_program(gd.read(payload)[1])
        if public_digest(rebuilt) != public_digest(program.public_copy()):
            raise UnsupportedError("the int8 program does not survive its description; "
                                   "crypten_lite.nn.graph_desc misses one of its attributes")
        return program, payload
    converted = from_pytorch(model, dummy if isinstance(dummy, dict) or len(dummy) > 1 else dummy[0],
                             check=False, fold_batch_norm=fold_batch_norm)
    payload = gd.describe_graph(converted, [list(d.shape) for d in _values(dummy)])
    rebuilt = gd.rebuild_graph(gd.read(payload)[1], values=dict(converted.state_dict()))
    if check:
        _check(model, rebuilt, dummy, tolerance)
    del converted
    # A traced graph is a web of reference cycles (nodes, their users, their metadata) that
    # holds tensors of the model's size: collected now, not at some later collection, so
    # that the owner's float32 copies are freed as soon as they are no longer referenced.
    gc.collect()
    return rebuilt, payload


def _in_band(model, dummy_input, src: int, check: bool, tolerance: float, fold_batch_norm: bool):
    from ..errors import ProtocolError
    from ..session import current
    from . import graph_desc as gd

    s = current()
    dummy = _dummy_tuple(dummy_input)
    if s.rank == src:
        try:
            result, payload = _owner_convert(model, dummy, dummy_input, check, tolerance, fold_batch_norm, src)
        except BaseException:
            try:  # the others must not wait for a description that will not come
                gd.broadcast(None, src)
            except Exception:  # noqa: S110  (the owner's own error is the one to report)
                pass
            raise
        gd.broadcast(payload, src)
        kind = "quantized" if not isinstance(result, GraphModule) else "graph"
    else:
        kind, reader = gd.read(gd.broadcast(None, src))
        result = gd.rebuild_graph(reader) if kind == "graph" else gd.rebuild_program(reader)
        if model is not None:
            raise UnsupportedError(f"party {s.rank} passed a model, but party {src} owns the model "
                                   f"(src={src}); pass None on the other parties")
        expected = ([result.input.out.shape] if kind == "quantized" else
                    [tuple(d) for d in reader.doc.get("input_shapes", [])])
        if dummy is not None and [tuple(d.shape)[1:] for d in _values(dummy)] != [tuple(e)[1:] for e in expected]:
            raise ProtocolError(f"party {s.rank}: dummy input shapes {[tuple(d.shape) for d in _values(dummy)]} "
                                f"differ from the model owner's {[tuple(e) for e in expected]} "
                                "(beyond the batch dimension)")
    object.__setattr__(result, "_model_src", src)
    if s.rank == src:  # the owner's own torch model (nn.generate exports its step graphs from it)
        object.__setattr__(result, "_torch_model", model)
    return result
