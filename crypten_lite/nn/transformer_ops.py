"""Transformer models through from_pytorch: public computations, token ids, masked attention.

HuggingFace transformers models (and torch's own nn.MultiheadAttention) exported with
torch.export mix three kinds of computation, handled here for crypten_lite.nn.from_pytorch:

1. **Computations on public values** (positions, shapes, attention masks, causal masks,
   rotary cos/sin tables): `arange`, comparisons, `where`, `index`, `&`, dtype moves...
   * Nodes that depend on no model input and no parameter are *constant-folded* at import
     time by the model owner (`fold_public`): the exported op itself runs once in torch and
     the node becomes a `public_constant` whose value travels in the model description.
     Non-persistent buffers (computed from the configuration, not learned: HF's
     `position_ids`, `token_type_ids`, rotary `inv_freq`) and tensor constants of the code
     are such public values; they are never secret-shared.
   * Nodes that depend on public inputs (the attention mask) run in the clear at run time
     on every party: the exported aten op itself, on plain torch tensors (`PUBLIC_ATEN`).
   A public-only op that meets a secret-shared operand is refused, naming the node and
   the op; nothing is revealed to compute it.
2. **Token ids** (`embedding`): public ids (a torch tensor) select rows of the (secret)
   table locally; private ids are shared by the data owner as a one-hot matrix
   (`share_tokens`), and the lookup is one secret product one_hot @ table.
3. **Attention with masks**: `scaled_dot_product_attention` with a public boolean or
   additive mask, a causal flag, grouped heads. Masked scores get MASK_VALUE added: the
   private softmax subtracts the row maximum and its exp is 0 below -11.1, so masked
   positions get weight 0 as in torch (float masks filled with the float32 minimum, which no
   fixed-point encoding holds, are clamped to MASK_VALUE for the same reason).
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable

import torch
import torch.fx

from ..cryptensor import CrypTensor
from ..errors import UnsupportedError

# Added to masked attention scores: far below the private exp's cut-off (-11.1), and within
# the range of the attention softmax's narrow comparisons between 2 parties (a row's entries
# within 2^11 of each other, functions.fast.NARROW_RANGE) while the real scores of the row are
# within 2^10 of each other.
MASK_VALUE = -(2.0 ** 10)


def mask_value() -> float:
    """MASK_VALUE between 2 parties; half the narrow range with more (-2^9 between 3, whose
    narrow comparisons reach 2^10: the real scores of a row within 2^9 of each other)."""
    from ..errors import NotInitializedError
    from ..functions.fast import narrow_range
    from ..session import current
    try:
        n = current().world_size
    except NotInitializedError:  # outside a session (a model being described): the 2-party value
        return MASK_VALUE
    return MASK_VALUE if n <= 2 else -narrow_range() / 2
# A public float below this is a "minus infinity" mask entry (HF fills masks with finfo.min).
_MASK_BELOW = -1e30


class PrivateTokens:
    """Token ids of one party, secret-shared as a one-hot matrix (..., vocab_size).

    The shape of the ids (batch, sequence length) is public, so are `pad_mask` (where the
    ids equal `pad_token_id`, declared by their owner; None when no pad id was given).
    Models see it where they see `input_ids`: reshapes act on the id dimensions, `embedding`
    is one secret product one_hot @ table, `ids != pad_token_id` is the public pad mask.
    """

    def __init__(self, one_hot: CrypTensor, pad_token_id: int | None, pad_mask: torch.Tensor | None) -> None:
        self.one_hot = one_hot
        self.pad_token_id = pad_token_id
        self.pad_mask = pad_mask

    @property
    def shape(self) -> torch.Size:
        return self.one_hot.shape[:-1]

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        return self.one_hot.dim() - 1

    @property
    def vocab_size(self) -> int:
        return self.one_hot.shape[-1]

    def _like(self, one_hot: CrypTensor, mask_op: Callable | None) -> "PrivateTokens":
        mask = None if self.pad_mask is None or mask_op is None else mask_op(self.pad_mask)
        return PrivateTokens(one_hot, self.pad_token_id, mask)

    def reshape(self, *shape) -> "PrivateTokens":
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)) else shape
        return self._like(self.one_hot.reshape(*shape, self.vocab_size), lambda m: m.reshape(*shape))

    view = reshape

    def unsqueeze(self, dim: int) -> "PrivateTokens":
        d = dim if dim >= 0 else dim + self.dim() + 1
        return self._like(self.one_hot.unsqueeze(d), lambda m: m.unsqueeze(d))

    def compare(self, value, equal: bool):
        """ids == value (or !=) for the declared pad id: the public pad mask."""
        if self.pad_token_id is None or value != self.pad_token_id:
            raise UnsupportedError(
                f"comparing private token ids with {value!r}: only the pad token id declared by "
                "their owner can be compared (crypten_lite.nn.share_tokens(..., pad_token_id=...)); "
                "a comparison with any other id would reveal the text")
        return self.pad_mask.clone() if equal else ~self.pad_mask


def share_tokens(ids: torch.Tensor | None, vocab_size: int, src: int,
                 pad_token_id: int | None = None) -> PrivateTokens:
    """Party `src`'s token ids (a LongTensor; None on the others) as PrivateTokens.

    Reveals to every party: the shape of `ids` (batch, sequence length) and, with
    `pad_token_id`, where the ids equal it (the padding, which the public attention mask
    shows anyway). The ids themselves stay secret: their one-hot matrix is secret-shared
    (batch x length x vocab_size values, one sharing).
    """
    from ..session import current
    s = current()
    one_hot, problem = None, None
    if s.rank == src:
        if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.dtype == torch.bool:
            problem = f"share_tokens: party {src} must pass its token ids as an integer tensor"
        elif ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
            problem = f"share_tokens: token ids must lie in [0, {vocab_size}) (the model's vocabulary)"
        else:
            one_hot = torch.nn.functional.one_hot(ids.long(), vocab_size).float()
    if problem is not None:
        from ..errors import CryptenLiteError
        try:  # the others learn at once that no ids come (the announcement refuses)
            CrypTensor.from_plain(None, src=src)
        except CryptenLiteError as refused:
            raise UnsupportedError(problem) from refused
        raise UnsupportedError(problem)
    shared = CrypTensor.from_plain(one_hot, src=src)
    mask = None
    if pad_token_id is not None:
        mine = (ids == pad_token_id).to(torch.uint8) if s.rank == src else None
        mask = s.comm.broadcast(mine, src)
        if tuple(mask.shape) != tuple(shared.shape[:-1]) or mask.dtype != torch.uint8:
            raise UnsupportedError(f"share_tokens: party {src} sent a pad mask of shape {tuple(mask.shape)} "
                                   f"({mask.dtype}) for ids of shape {tuple(shared.shape[:-1])}")
        mask = mask.bool()
    return PrivateTokens(shared, pad_token_id, mask)


def _private(*values) -> bool:
    return any(isinstance(v, (CrypTensor, PrivateTokens)) for v in _flat(values))


def _flat(values):
    for v in values:
        if isinstance(v, (list, tuple)):
            yield from _flat(v)
        elif isinstance(v, dict):
            yield from _flat(tuple(v.values()))
        else:
            yield v


def public_constant(value: torch.Tensor) -> torch.Tensor:
    """A value computed from public data only at import time (constant folding)."""
    return value


# ------------------------------------------------------------------ private implementations
def _clamp_mask(t):
    """A public float operand with 'minus infinity' mask entries: those set to MASK_VALUE."""
    if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() and bool((t < _MASK_BELOW).any()):
        return t.clamp_min(mask_value())
    return t


def _add_masked(a, b, alpha=1):
    if isinstance(a, CrypTensor) != isinstance(b, CrypTensor):
        a, b = _clamp_mask(a), _clamp_mask(b)
    b = b if alpha == 1 else b * alpha
    return a + b


def _embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if isinstance(indices, PrivateTokens):
        if indices.vocab_size != weight.shape[0]:
            raise UnsupportedError(f"embedding: private tokens are one-hot over {indices.vocab_size} "
                                   f"ids but the table has {weight.shape[0]} rows")
        return indices.one_hot.matmul(weight)
    if isinstance(indices, CrypTensor):
        raise UnsupportedError("embedding: the token ids are a CrypTensor of integers; share them with "
                               "crypten_lite.nn.share_tokens(ids, vocab_size, src) (a one-hot matrix) "
                               "or pass public ids as a torch tensor")
    if isinstance(weight, CrypTensor):
        idx = indices.long()
        return weight.index_select(0, idx.reshape(-1)).reshape(*idx.shape, weight.shape[-1])
    return torch.nn.functional.embedding(indices, weight)


def _addmm(bias, m1, m2, beta=1, alpha=1):
    prod = m1 @ m2
    prod = prod if alpha == 1 else prod * alpha
    return prod + (bias if beta == 1 else bias * beta)


def _pow(x, exponent):
    if not isinstance(x, CrypTensor):
        return torch.pow(x, exponent)
    if exponent == 2:
        return x.square()
    if exponent == 3:
        return x.square() * x
    if exponent == 1:
        return x
    return x ** exponent


def _method(name: str) -> Callable:
    def call(x, *args, **kwargs):
        if not isinstance(x, CrypTensor):
            return getattr(torch, name)(x, *args, **kwargs)
        fn = getattr(x, name, None)
        if fn is None:
            raise UnsupportedError(f"CrypTensor.{name} is not available (call crypten_lite.init() first)")
        return fn(*args, **kwargs)
    call.__name__ = name
    return call


def _rsqrt(x):
    return torch.rsqrt(x) if not isinstance(x, CrypTensor) else x.inv_sqrt()


def _where(cond, a, b):
    if isinstance(cond, (CrypTensor, PrivateTokens)):
        raise UnsupportedError("where with a secret-shared condition")
    from ..functions.comparisons import where
    if not isinstance(a, CrypTensor) and not isinstance(b, CrypTensor):
        return torch.where(cond, a, b)
    a, b = _clamp_mask(torch.as_tensor(a)) if not isinstance(a, CrypTensor) else a, \
        _clamp_mask(torch.as_tensor(b)) if not isinstance(b, CrypTensor) else b
    return where(cond, a, b)


def _masked_fill(x, mask, value):
    if isinstance(mask, (CrypTensor, PrivateTokens)):
        raise UnsupportedError("masked_fill with a secret-shared mask")
    if not isinstance(x, CrypTensor):
        return torch.masked_fill(x, mask, value)
    value = float(value)
    return _where(mask, torch.tensor(mask_value() if value < _MASK_BELOW else value), x)


def _to_op(target) -> Callable:
    def call(x, *args, **kwargs):
        return _to(x, *args, **kwargs) if _private(x) else target(x, *args, **kwargs)
    return call


def _to(x, *args, **kwargs):
    """dtype / device / layout moves: a CrypTensor stays a float fixed-point value."""
    if isinstance(x, PrivateTokens):
        return x  # ids: an integer tensor for the model, a one-hot matrix underneath
    if not isinstance(x, CrypTensor):
        return x.to(*args, **kwargs)
    dtypes = [a for a in (*args, kwargs.get("dtype")) if isinstance(a, torch.dtype)]
    if any(not d.is_floating_point for d in dtypes):
        raise UnsupportedError(f"a secret-shared value converted to {dtypes[0]} (an integer or bool "
                               "dtype); only float dtypes are supported on CrypTensors")
    return x


def _assert_metadata(x, *args, **kwargs):
    if isinstance(x, (CrypTensor, PrivateTokens)):
        return None  # a secret value has the float32 dtype torch checks here
    return torch.ops.aten._assert_tensor_metadata.default(x, *args, **kwargs)


def _type_as(x, other):
    if isinstance(x, CrypTensor):
        return _to(x, other.dtype)
    return x.type_as(other) if isinstance(other, torch.Tensor) else x.float()


def _compare(op: Callable, equal: bool | None) -> Callable:
    def call(a, b):
        if isinstance(a, PrivateTokens) and equal is not None and not isinstance(b, (CrypTensor, PrivateTokens)):
            return a.compare(b, equal)
        if _private(a, b):
            raise UnsupportedError(f"{op.__name__} of a secret-shared value: a private comparison is not "
                                   "part of imported graphs (it would be revealed or cost a circuit)")
        return op(a, b)
    return call


def _shape_only(target) -> Callable:
    """new_ones / zeros_like / ...: only the operand's shape (public) is used."""
    def call(x, *args, **kwargs):
        if isinstance(x, (CrypTensor, PrivateTokens)):
            x = torch.empty(tuple(x.shape), dtype=torch.float32)
        return target(x, *args, **kwargs)
    return call


def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """softmax(q k^T * scale + mask) v; mask public (bool: True = attend, or additive)."""
    if not _private(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    if dropout_p:
        raise UnsupportedError("scaled_dot_product_attention with dropout_p > 0 (training) on CrypTensors")
    if _private(attn_mask):
        raise UnsupportedError("scaled_dot_product_attention with a secret-shared mask")
    heads_q, heads_k = q.shape[-3] if q.dim() > 2 else 1, k.shape[-3] if k.dim() > 2 else 1
    if heads_q != heads_k:
        if not enable_gqa or heads_q % heads_k:
            raise UnsupportedError(f"scaled_dot_product_attention: {heads_q} query heads, {heads_k} key heads")
        rep = heads_q // heads_k
        k = _repeat_heads(k, rep)
        v = _repeat_heads(v, rep)
    L, S = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale
    bias = torch.zeros(L, S)
    if is_causal:
        bias = bias.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), mask_value())
    if attn_mask is not None:
        m = torch.as_tensor(attn_mask)
        m = torch.zeros(m.shape).masked_fill(~m, mask_value()) if m.dtype == torch.bool else _clamp_mask(m.float())
        bias = (bias + m).clamp_min(mask_value())  # a causal AND a padding mask: still MASK_VALUE
    if is_causal or attn_mask is not None:
        scores = scores + bias
    from ..functions.fast import softmax_last  # 2 parties: one 4-round reciprocal per row
    return softmax_last(scores) @ v


def _repeat_heads(x, rep: int):
    shape = tuple(x.shape)
    return x.unsqueeze(-3).expand(*shape[:-2], rep, *shape[-2:]).reshape(*shape[:-3], shape[-3] * rep, *shape[-2:])


def private_table() -> dict[Any, Callable]:
    """aten ops with a private implementation (they also take public operands)."""
    aten = torch.ops.aten
    return {
        aten.embedding.default: _embedding,
        aten.addmm.default: _addmm,
        aten.pow.Tensor_Scalar: _pow,
        aten.rsqrt.default: _rsqrt,
        aten.neg.default: lambda x: -x,
        aten.cos.default: _method("cos"), aten.sin.default: _method("sin"),
        aten.exp.default: _method("exp"),
        aten.cumsum.default: lambda x, dim, dtype=None: x.cumsum(dim) if isinstance(x, CrypTensor)
            else torch.cumsum(x, dim, dtype=dtype),
        aten.gather.default: lambda x, dim, index, sparse_grad=False: x.gather(dim, index),
        aten.where.self: _where, aten.where.ScalarOther: _where, aten.where.ScalarSelf: _where,
        aten.where.Scalar: _where,
        aten.masked_fill.Scalar: _masked_fill, aten.masked_fill_.Scalar: _masked_fill,
        aten.masked_fill.Tensor: _masked_fill,
        aten.add.Tensor: _add_masked, aten.add_.Tensor: _add_masked,
        aten.scaled_dot_product_attention.default: _sdpa,
        aten.to.dtype: _to_op(aten.to.dtype), aten.to.device: _to_op(aten.to.device),
        aten.to.dtype_layout: _to_op(aten.to.dtype_layout), aten._to_copy.default: _to_op(aten._to_copy.default),
        aten._assert_tensor_metadata.default: _assert_metadata,
        aten.type_as.default: _type_as,
        aten.ne.Scalar: _compare(torch.ne, False), aten.eq.Scalar: _compare(torch.eq, True),
        aten.unflatten.int: lambda x, dim, sizes: x.unflatten(dim, sizes) if not isinstance(x, CrypTensor)
            else x.reshape(*x.shape[:dim % x.dim()], *sizes, *x.shape[dim % x.dim() + 1:]),
        aten.new_ones.default: _shape_only(torch.ops.aten.new_ones.default),
        aten.new_zeros.default: _shape_only(torch.ops.aten.new_zeros.default),
        aten.new_full.default: _shape_only(torch.ops.aten.new_full.default),
        aten.ones_like.default: _shape_only(torch.ops.aten.ones_like.default),
        aten.zeros_like.default: _shape_only(torch.ops.aten.zeros_like.default),
        aten.full_like.default: _shape_only(torch.ops.aten.full_like.default),
        operator.getitem: operator.getitem,
    }


def public_ops() -> list:
    """aten ops evaluated in the clear on public operands only (positions, masks, shapes)."""
    aten = torch.ops.aten
    return [
        aten.arange.default, aten.arange.start, aten.arange.start_step,
        aten.ge.Scalar, aten.ge.Tensor, aten.gt.Scalar, aten.gt.Tensor, aten.le.Scalar, aten.le.Tensor,
        aten.lt.Scalar, aten.lt.Tensor, aten.eq.Tensor, aten.ne.Tensor,
        aten.__and__.Tensor, aten.__or__.Tensor, aten.bitwise_and.Tensor, aten.bitwise_or.Tensor,
        aten.bitwise_not.default, aten.logical_not.default, aten.logical_and.default,
        aten.logical_or.default, aten.index.Tensor, aten.ones.default, aten.zeros.default,
        aten.full.default, aten.scalar_tensor.default, aten.lift_fresh_copy.default,
        aten.tril.default, aten.triu.default, aten.all.default, aten.any.default,
        aten.floor_divide.default, aten.remainder.Scalar, aten.sub.Scalar, aten.div.Tensor_mode,
        aten.clamp.default, aten.min.default, aten.max.default, aten.abs.default, aten.sign.default,
    ]


# A public op of a received description may not make more elements than this (a hostile or
# broken description, e.g. arange(2**40), is refused before anything is allocated).
MAX_PUBLIC_ELEMENTS = 1 << 28


def _output_elements(target: Callable, args: tuple, kwargs: dict) -> int | None:
    """Elements the op would make, found on the meta device (None where the op has no meta
    implementation: it then runs as it is)."""
    def meta(a):
        if isinstance(a, torch.Tensor):
            return a.to("meta")
        if isinstance(a, torch.device):
            return torch.device("meta")
        if isinstance(a, (list, tuple)):
            return type(a)(meta(b) for b in a)
        return a
    kwargs = {k: meta(v) for k, v in kwargs.items()}
    schema = getattr(target, "_schema", None)
    if schema is not None and any(a.name == "device" for a in schema.arguments):
        kwargs["device"] = torch.device("meta")  # a factory op (arange, full, ...)
    try:
        with torch.device("meta"):
            out = target(*meta(args), **kwargs)
    except Exception:  # noqa: BLE001 - no meta kernel, or a value-dependent op
        return None
    outs = out if isinstance(out, (list, tuple)) else [out]
    return sum(t.numel() for t in outs if isinstance(t, torch.Tensor))


def public_only(node: torch.fx.Node) -> Callable:
    """The exported op itself on public operands; a clear refusal on secret-shared ones, and
    on outputs of more than MAX_PUBLIC_ELEMENTS elements."""
    target = node.target

    def call(*args, **kwargs):
        if _private(args, kwargs):
            raise UnsupportedError(
                f"from_pytorch: node {node.name!r} ({target}) computes on public values only (positions, "
                "masks, shapes) but got a secret-shared operand; pass that input as a public torch "
                "tensor, or rewrite the model so that this op sees public values")
        size = _output_elements(target, args, kwargs)
        if size is not None and size > MAX_PUBLIC_ELEMENTS:
            raise UnsupportedError(
                f"from_pytorch: node {node.name!r} ({target}) would make a public tensor of {size:,} "
                f"elements (more than {MAX_PUBLIC_ELEMENTS:,}); the model description is refused")
        return target(*args, **kwargs)
    call.__name__ = node.name
    return call


_PRIVATE_TARGETS: set = set()


def bind(node: torch.fx.Node, impl: Callable) -> Callable:
    """The implementation of an exported node: public-only ops run the op itself (a secret
    operand is refused), the ops of `private_table` raise errors that name the node."""
    if impl is public_only:
        return public_only(node)
    if not _PRIVATE_TARGETS:
        _PRIVATE_TARGETS.update(private_table())
    if node.target not in _PRIVATE_TARGETS:
        return impl

    from .from_pytorch import _naming
    return _naming(node, impl)


# ------------------------------------------------------------------ constant folding
_NOT_FOLDED = ("dropout", "rand", "bernoulli", "normal", "uniform", "empty")


def fold_public(graph: torch.fx.Graph, constants: dict[torch.fx.Node, torch.Tensor],
                max_elements: int = 1 << 24) -> int:
    """Evaluate (in torch) every call_function node that depends only on `constants` (public
    placeholders) and on literals, and replace it by a `public_constant` node holding its value.

    Runs on the model owner at import time. Returns the number of nodes folded.
    """
    values: dict[torch.fx.Node, Any] = dict(constants)
    folded = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is public_constant:
            continue
        if not all(a in values for a in node.all_input_nodes):
            continue
        if any(word in str(node.target) for word in _NOT_FOLDED):
            continue
        args = torch.fx.node.map_arg(node.args, lambda n: values[n])
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: values[n])
        value = node.target(*args, **kwargs)
        values[node] = value
        if isinstance(value, torch.Tensor) and value.numel() <= max_elements:
            with graph.inserting_before(node):
                const = graph.call_function(public_constant, (value.detach().clone(),))
            node.replace_all_uses_with(const)
            graph.erase_node(node)
            values[const] = value
            folded += 1
        elif not isinstance(value, (torch.Tensor, int, float, bool, tuple, list)) or value is None:
            del values[node]
    for node in reversed(list(graph.nodes)):  # drop what only the folded nodes used
        if node.op == "call_function" and not node.users and node.target is public_constant:
            graph.erase_node(node)
        elif node.op == "call_function" and not node.users and node in values and \
                not isinstance(values[node], torch.Tensor):
            graph.erase_node(node)
    return folded


def publicize(graph: torch.fx.Graph, signature, state: dict[str, torch.Tensor]) -> int:
    """Exported placeholders of public values (non-persistent buffers, tensor constants of the
    code) become `public_constant` nodes, then everything computed from public values only is
    folded (`fold_public`), and written-out tanh GELUs become one GELU (`fuse_tanh_gelu`) and
written-out RMSNorms one rms_norm (`fuse_rms_norm`).
    Returns the number of nodes folded."""
    public_paths = set(getattr(signature, "non_persistent_buffers", ()))
    lifted = dict(getattr(signature, "inputs_to_lifted_tensor_constants", {}))
    buffers = dict(signature.inputs_to_buffers)
    constants: dict[torch.fx.Node, torch.Tensor] = {}
    first = next((n for n in graph.nodes if n.op != "placeholder"), None)
    for node in list(graph.nodes):
        if node.op != "placeholder":
            continue
        path = lifted.get(node.name) or (buffers.get(node.name) if buffers.get(node.name) in public_paths else None)
        if path is None:
            continue
        value = state[path].detach().clone()
        with graph.inserting_before(first):
            const = graph.call_function(public_constant, (value,))
        node.replace_all_uses_with(const)
        graph.erase_node(node)
        constants[const] = value
    folded = fold_public(graph, constants)
    fuse_tanh_gelu(graph)
    fuse_rms_norm(graph)
    return folded


def _const_arg(node, value: float, rel: float = 1e-6) -> torch.fx.Node | None:
    """For x * c or c * x (aten.mul / add with one float literal c close to `value`): x."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" or len(node.args) != 2:
        return None
    a, b = node.args
    for x, c in ((a, b), (b, a)):
        if isinstance(x, torch.fx.Node) and isinstance(c, (int, float)) and not isinstance(c, bool) \
                and abs(c - value) <= rel * max(1.0, abs(value)):
            return x
    return None


def fuse_tanh_gelu(graph: torch.fx.Graph) -> int:
    """GELU written out in a model's code (HF's gelu_new / NewGELUActivation, GPT-2):
    0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) becomes one aten.gelu(x, approximate="tanh"),
    the private GELU, instead of a private cube and tanh. Returns the number fused."""
    aten = torch.ops.aten
    fused = 0
    for tanh in list(graph.nodes):
        if tanh.target is not aten.tanh.default or len(tanh.users) != 1:
            continue
        one_plus = next(iter(tanh.users))
        if one_plus.target is not aten.add.Tensor or _const_arg(one_plus, 1.0) is not tanh \
                or len(one_plus.users) != 1:
            continue
        inner = tanh.args[0]
        if getattr(inner, "target", None) is not aten.mul.Tensor:
            continue
        x_plus = _const_arg(inner, math.sqrt(2 / math.pi))
        if getattr(x_plus, "target", None) is not aten.add.Tensor or len(x_plus.args) != 2:
            continue
        x, cubic = x_plus.args
        if getattr(cubic, "target", None) is not aten.mul.Tensor:
            x, cubic = cubic, x
        cube = _const_arg(cubic, 0.044715)
        if getattr(cube, "target", None) is not aten.pow.Tensor_Scalar or cube.args != (x, 3.0) \
                and cube.args != (x, 3):
            continue
        out = next(iter(one_plus.users))
        if out.target is not aten.mul.Tensor or len(out.args) != 2:
            continue
        half = out.args[0] if out.args[1] is one_plus else out.args[1]
        if _const_arg(half, 0.5) is not x:
            continue
        with graph.inserting_before(out):
            gelu = graph.call_function(aten.gelu.default, (x,), {"approximate": "tanh"})
        out.replace_all_uses_with(gelu)
        for dead in (out, one_plus, half, tanh, inner, x_plus, cubic, cube):
            if not dead.users:
                graph.erase_node(dead)
        fused += 1
    return fused


def fuse_rms_norm(graph: torch.fx.Graph) -> int:
    """RMSNorm written out in a model's code (HF's LlamaRMSNorm and its kin):
    x * rsqrt(mean(x^2, -1, keepdim) + eps), and its product with a weight (through a dtype
    cast), become one aten.rms_norm(x, [D], weight, eps): the private rms_norm (between 2
    parties one 6-round pass per row, the weight in its first round) instead of a square, a
    general inv_sqrt and two products. Returns the number fused."""
    aten = torch.ops.aten
    fused = 0
    for rsqrt in list(graph.nodes):
        if rsqrt.target is not aten.rsqrt.default or len(rsqrt.users) != 1:
            continue
        plus = rsqrt.args[0]
        if getattr(plus, "target", None) is not aten.add.Tensor or len(plus.users) != 1:
            continue
        mean = next((a for a in plus.args if isinstance(a, torch.fx.Node)), None)
        eps = next((a for a in plus.args if isinstance(a, float)), None)
        if mean is None or eps is None or _const_arg(plus, eps) is not mean:
            continue
        if mean.target is not aten.mean.dim or len(mean.users) != 1 or tuple(mean.args[1]) != (-1,) \
                or not (len(mean.args) > 2 and mean.args[2]):
            continue
        square = mean.args[0]
        if getattr(square, "target", None) is not aten.pow.Tensor_Scalar or square.args[1] != 2 \
                or len(square.users) != 1:
            continue
        x = square.args[0]
        out = next(iter(rsqrt.users))
        if out.target is not aten.mul.Tensor or set(out.args) != {x, rsqrt}:
            continue
        val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
        if val is None or val.dim() < 1:
            continue
        dim = int(val.shape[-1])
        dead, weight, last = [out, rsqrt, plus, mean, square], None, out
        # a weight (D,) placeholder multiplying the result, possibly through a float cast
        user = _only_user(out)
        cast = None
        if user is not None and user.target is aten.to.dtype and _only_user(user) is not None:
            cast, user = user, _only_user(user)
        if user is not None and user.target is aten.mul.Tensor and len(user.args) == 2:
            w = user.args[0] if user.args[1] is (cast or out) else user.args[1]
            wv = w.meta.get("val") if isinstance(w, torch.fx.Node) else None
            if w.op == "placeholder" and wv is not None and tuple(wv.shape) == (dim,):
                weight, last = w, user
                dead = [user] + ([cast] if cast is not None else []) + dead
        with graph.inserting_before(last):
            norm = graph.call_function(aten.rms_norm.default, (x, [dim], weight, eps))
        last.replace_all_uses_with(norm)
        for node in dead:
            for check in [u for u in node.users if u.target is aten._assert_tensor_metadata.default]:
                graph.erase_node(check)
            if not node.users:
                graph.erase_node(node)
        fused += 1
    return fused


def _only_user(node: torch.fx.Node) -> torch.fx.Node | None:
    """The one node using `node` besides torch.export's metadata checks, or None."""
    users = [u for u in node.users if u.target is not torch.ops.aten._assert_tensor_metadata.default]
    return users[0] if len(users) == 1 else None


def by_name(names: list[str], inputs: tuple, named: dict) -> tuple:
    """Positional and keyword inputs in placeholder order (keyword names: the placeholders')."""
    unknown = set(named) - set(names)
    if unknown:
        raise UnsupportedError(f"converted model has no input named {sorted(unknown)}; its inputs: {names}")
    rest = names[len(inputs):]
    missing = [n for n in rest if n not in named]
    if missing:
        raise UnsupportedError(f"converted model: input(s) {missing} not given; its inputs: {names}")
    return tuple(inputs) + tuple(named[n] for n in rest)


class no_cache:
    """A HuggingFace model traced and checked with `config.use_cache = False` (restored after):
    a forward then returns logits, not a KV cache object torch.export cannot flatten."""

    def __init__(self, model) -> None:
        self.config = getattr(model, "config", None)
        self.saved = getattr(self.config, "use_cache", None)

    def __enter__(self) -> None:
        if self.saved:
            self.config.use_cache = False

    def __exit__(self, *exc) -> None:
        if self.saved:
            self.config.use_cache = self.saved
