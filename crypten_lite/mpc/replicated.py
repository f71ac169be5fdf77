"""Replicated (2-out-of-3) shares as one torch.Tensor subclass.

A value x in Z_2^64 is split into three components x = x_0 + x_1 + x_2 (arithmetic) or
x = x_0 ^ x_1 ^ x_2 (binary; the same type, the protocol functions know which). Party i holds
the pair (x_i, x_{i+1 mod 3}) as ``.a`` and ``.b``: any two parties hold all three components,
any single party sees two uniformly random-looking ones ([AFL+16], [MR18] "ABY3").

``Replicated`` is a wrapper tensor subclass (``torch.Tensor._make_wrapper_subclass`` +
``__torch_dispatch__``), so that code written for additive shares (views, reshapes, indexing,
``cat``, sums, products by public tensors, shifts of binary words) runs unchanged on both
components. What is applied, by table (never by guessing):

* LINEAR ops (the share is the only secret operand, every other tensor operand is public:
  views, reshape, permute, indexing, sum/cumsum, neg, mul/matmul/conv by a public tensor,
  shifts, ``&`` with a public mask, clone, ...) are applied to both components.
* ADDITIVE ops (add, sub, xor, cat/stack, where, index_put/copy_ of values, full_like, fill)
  apply to both components when every operand is replicated; a PUBLIC operand (a plain tensor
  or a scalar) is added to the component of share index 0 only (party 0's ``.a``, party 2's
  ``.b``), which is the sharing (c, 0, 0) of the public c: ``x + c`` is right on its own.
* Products of two replicated tensors (mul, matmul, conv, bitwise_and) and every op not in
  the tables raise TypeError naming the op: they need a protocol (crypten_lite.mpc.protocol),
  and a silently wrong result is never an option.

``bitwise_not`` is the binary NOT (xor with all-ones on share index 0); arithmetic shares
have no use for it. A replicated tensor never travels as one tensor: the communicator refuses
it (send ``.a`` or ``.b``, as the protocols do).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

aten = torch.ops.aten

WORLD = 3


# In-place overload packets (add_, copy_, index_put_...) -> their out-of-place packet.
_BASE: dict = {}


def _packets(*names: str) -> frozenset:
    """The aten overload packets of `names` that exist in this torch build (in-place variants
    are recognised through _BASE)."""
    for n in names:
        if hasattr(aten, n + "_") and hasattr(aten, n):
            _BASE[getattr(aten, n + "_")] = getattr(aten, n)
    return frozenset(getattr(aten, n) for n in names if hasattr(aten, n))


# Ops linear in the single replicated operand (every other tensor operand public).
LINEAR = _packets(
    "view", "_unsafe_view", "reshape", "permute", "transpose", "t", "expand", "slice", "select",
    "index", "squeeze", "unsqueeze", "narrow", "alias", "detach", "clone", "contiguous", "flip",
    "roll", "repeat", "gather", "sum", "cumsum", "neg", "mul", "mm", "bmm", "matmul", "dot",
    "convolution", "lshift", "rshift", "__lshift__", "__rshift__", "bitwise_left_shift",
    "bitwise_right_shift", "bitwise_and", "__and__", "unbind", "split", "split_with_sizes",
    "chunk", "diagonal", "index_select", "unfold", "im2col", "col2im", "movedim", "flatten",
    "unflatten", "expand_as", "view_as", "reshape_as", "as_strided", "masked_select",
    "take_along_dim", "tril", "triu", "diag_embed",
    "constant_pad_nd", "reflection_pad1d", "reflection_pad2d", "replication_pad1d",
    "replication_pad2d", "_convolution", "conv2d", "conv1d", "conv_transpose2d",
    "unsafe_split", "unsafe_chunk", "split_copy", "slice_copy", "select_copy", "permute_copy",
    "view_copy", "expand_copy", "t_copy", "transpose_copy", "squeeze_copy", "unsqueeze_copy",
    "_reshape_alias", "new_zeros", "new_empty", "zeros_like", "empty_like", "zero",
    "__ilshift__", "__irshift__", "__iand__",
)
# Ops additive in their secret operands: a public operand goes to share index 0 only.
ADDITIVE = _packets("add", "sub", "rsub", "bitwise_xor", "__xor__", "__ixor__", "cat", "stack",
                    "where", "copy", "index_put", "fill", "full_like", "ones_like", "new_full",
                    "new_ones", "masked_fill", "scatter", "scatter_add", "index_add", "index_copy")
# Public masks: `cond` of where/masked_fill, indices; not additive operands.
_MASK_ARGS = {aten.where: (0,), aten.masked_fill: (1,)}
# Linear ops where a second replicated operand is fine (all operands secret, componentwise).
_MULTI_OK = frozenset({aten.cat, aten.stack})


def _index0(rank: int) -> str | None:
    """Which component of party `rank` is share index 0: party 0's a, party 2's b."""
    return {0: "a", 2: "b"}.get(rank)


class Replicated(torch.Tensor):
    """Party `rank`'s replicated share: components ``a`` = x_rank and ``b`` = x_{rank+1 mod 3}.

    `rank` may be omitted (None): it is then read from the session when an op needs it (a
    public operand). Both components are int64 tensors of the same shape.
    """

    a: torch.Tensor
    b: torch.Tensor
    rank: int | None
    is_replicated_share = True

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, a: torch.Tensor, b: torch.Tensor, rank: int | None = None):
        for name, t in (("a", a), ("b", b)):
            if type(t) is not torch.Tensor:
                raise TypeError(f"Replicated: component {name} must be a plain torch.Tensor, "
                                f"got {type(t).__name__}")
        if a.dtype != torch.int64 or b.dtype != torch.int64:
            raise TypeError(f"Replicated: components must be int64 ring elements, got {a.dtype} "
                            f"and {b.dtype}")
        if a.shape != b.shape:
            raise TypeError(f"Replicated: components of shapes {tuple(a.shape)} and "
                            f"{tuple(b.shape)}; both must have the same shape")
        if rank is not None and rank not in range(WORLD):
            raise TypeError(f"Replicated: rank {rank} is not 0, 1 or 2")
        return _wrapped(a, b, rank)

    def __init__(self, a, b, rank=None):  # components set in __new__
        super().__init__()

    def __repr__(self, *args, **kwargs) -> str:  # never the values
        return f"Replicated(shape={tuple(self.shape)}, rank={self.rank})"

    def __reduce_ex__(self, protocol):
        raise TypeError("a Replicated share is not picklable (shares never leave a party as objects)")

    def numpy(self, *args, **kwargs):
        raise TypeError("a Replicated share has two components: use .a or .b")

    def tolist(self):
        raise TypeError("a Replicated share has two components: use .a or .b")

    def __bool__(self):
        raise TypeError("a Replicated share is secret and has no truth value")

    # torch turns a TypeError inside a binary operator into NotImplemented (a message without
    # the reason): products of two shares are refused here, by name.
    def __mul__(self, other):
        _refuse_product("mul", other)
        return super().__mul__(other)

    def __rmul__(self, other):
        _refuse_product("mul", other)
        return super().__rmul__(other)

    def __matmul__(self, other):
        _refuse_product("matmul", other)
        return super().__matmul__(other)

    def __rmatmul__(self, other):
        _refuse_product("matmul", other)
        return super().__rmatmul__(other)

    def __and__(self, other):
        _refuse_product("bitwise_and", other)
        return super().__and__(other)

    def __rand__(self, other):
        _refuse_product("bitwise_and", other)
        return super().__rand__(other)

    def components(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.a, self.b

    def share_rank(self) -> int:
        """This party's rank (recorded, else the session's)."""
        if self.rank is not None:
            return self.rank
        from ..session import current
        return current().rank

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})


def _wrapped(a: torch.Tensor, b: torch.Tensor, rank: int | None) -> Replicated:
    """The Replicated wrapper of two checked components (Replicated() checks them first; the
    shape ops' fast path makes them from components that already passed)."""
    out = torch.Tensor._make_wrapper_subclass(Replicated, a.shape, strides=a.stride(), dtype=torch.int64,
                                              device=a.device, requires_grad=False)
    out.a, out.b, out.rank = a, b, rank
    return out


def _refuse_product(op: str, other: Any) -> None:
    if isinstance(other, Replicated):
        raise TypeError(f"Replicated shares: {op} of two replicated shares is a product of "
                        f"secrets; use crypten_lite.mpc.protocol.mul(\"{op}\", x, y) (one round)"
                        if op != "bitwise_and" else
                        "Replicated shares: bitwise_and of two replicated shares is an AND of "
                        "secrets; use the binary protocol (crypten_lite.mpc.protocol.and_many)")


def _is_rep(x: Any) -> bool:
    return isinstance(x, Replicated)


def _wrap(a: Any, b: Any, rank: int | None) -> Any:
    if isinstance(a, torch.Tensor):
        return Replicated(a, b, rank)
    if isinstance(a, (tuple, list)):
        return type(a)(_wrap(x, y, rank) for x, y in zip(a, b))
    return a  # metadata (sizes) identical on both components


def _zero_like(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return torch.zeros_like(x)
    if isinstance(x, bool):
        return False
    if isinstance(x, (int, float)):
        return type(x)(0)
    return x


def _refuse(func, why: str):
    raise TypeError(f"Replicated shares: {func} {why}; use crypten_lite.mpc.protocol (mul, "
                    "matmul, conv, and, truncate, open) for anything that is not linear")


class _FlatArgs:
    """The "spec" of arguments that need no pytree: no container among them holds a
    replicated share, so the flat list is the positional arguments themselves (kwargs kept
    aside). torch's pytree walk costs more than most component ops on small tensors, and
    almost every op has this form."""

    __slots__ = ("kwargs",)

    def __init__(self, kwargs: dict):
        self.kwargs = kwargs


def _holds_rep(x: Any) -> bool:
    if isinstance(x, (list, tuple)):
        return any(_holds_rep(v) for v in x)
    if isinstance(x, dict):
        return any(_holds_rep(v) for v in x.values())
    return _is_rep(x)


def _flatten(args: tuple, kwargs: dict):
    """(flat leaves, spec) of (args, kwargs): the positional arguments as they are where no
    container holds a share (see _FlatArgs), else torch's pytree."""
    if not any(isinstance(a, (list, tuple, dict)) and _holds_rep(a) for a in args) \
            and not any(_holds_rep(v) for v in kwargs.values()):
        return list(args), _FlatArgs(kwargs)
    return tree_flatten((args, kwargs))


def _unflatten(items, spec):
    """(args, kwargs) back from _flatten's leaves (changed or not)."""
    if isinstance(spec, _FlatArgs):
        return tuple(items), spec.kwargs
    return tree_unflatten(items, spec)


# Shape ops of one share with only non-tensor arguments: applied to both components with no
# argument walk (they are most of what protocol code does to shares between rounds).
_SHAPE_OPS = frozenset({
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.permute.default,
    aten.t.default, aten.expand.default, aten.slice.Tensor, aten.unsqueeze.default,
    aten.alias.default, aten.clone.default, aten.transpose.int, aten.select.int,
    aten.squeeze.dim, aten.narrow.default})
_RESHAPE = frozenset({aten.view.default, aten._unsafe_view.default})


def _shape_op(func, args: tuple, kwargs: dict):
    """func on both components of args[0], or None where the fast form does not apply."""
    x = args[0]
    if type(x) is not Replicated or kwargs or any(isinstance(v, torch.Tensor) for v in args[1:]):
        return None
    if func in _RESHAPE:  # the components' strides may differ from the wrapper's
        func = aten.reshape.default
    rest = args[1:]
    return _wrapped(func(x.a, *rest), func(x.b, *rest), x.rank)


def _dispatch(func, args: tuple, kwargs: dict):
    if func in _SHAPE_OPS:
        out = _shape_op(func, args, kwargs)
        if out is not None:
            return out
    packet = _BASE.get(func.overloadpacket, func.overloadpacket)
    flat, spec = _flatten(args, kwargs)
    reps = [x for x in flat if _is_rep(x)]
    rank = next((r.rank for r in reps if r.rank is not None), None)
    mutable = func._schema.is_mutable
    if packet in (aten.view, aten._unsafe_view):
        # The components' strides may differ from the wrapper's: reshape copies if it must.
        func = aten.reshape.default
    if packet in ADDITIVE:
        result = _additive(func, packet, flat, spec, reps, rank)
    elif packet in LINEAR:
        if len(reps) > 1 and packet not in _MULTI_OK:
            _refuse(func, f"of {len(reps)} replicated operands is a product of secrets")
        result = _componentwise(func, flat, spec, rank)
    elif packet in (aten.bitwise_not, aten.bitwise_not_):
        result = _not(func, flat, spec, reps, rank)
    elif packet in (aten.bitwise_or, aten.__or__, aten.bitwise_or_, aten.__ior__):
        result = _or(func, args, kwargs, reps, rank)
    else:
        _refuse(func, "is not linear in a replicated share (or not known to be)")
    if mutable and reps and _is_rep(args[0]):
        return args[0]
    return result


def _componentwise(func, flat, spec, rank, zero_public: str | None = None):
    """func applied to the a components, then to the b ones (public operands as given; with
    `zero_public` naming a component, that component gets zeros for the public additive
    operands: see _additive)."""
    outs = []
    for comp in ("a", "b"):
        items = []
        for x in flat:
            if _is_rep(x):
                items.append(getattr(x, comp))
            else:
                items.append(x)
        args, kwargs = _unflatten(items, spec)
        outs.append(func(*args, **kwargs))
    return _wrap(outs[0], outs[1], rank)


_CONSTANTS = _packets("full_like", "ones_like", "new_full", "new_ones", "fill")


def _additive(func, packet, flat, spec, reps, rank):
    """An op additive in its secret operands: public operands on share index 0 only."""
    args, kwargs = _unflatten(flat, spec)
    idx0 = _index0(reps[0].share_rank())
    if packet in _CONSTANTS and not _is_rep(args[0]):
        _refuse(func, "writes a replicated share into a public tensor")
    if packet in _CONSTANTS and any(_is_rep(v) for v in args[1:]):
        return _componentwise(func, flat, spec, rank)  # fill with a shared value
    if packet in _CONSTANTS:  # a public constant in a share's shape: the sharing (c, 0, 0)
        args_b = [args[0].b] + list(args[1:])
        args_a = [args[0].a] + list(args[1:])
        a = func(*args_a, **kwargs) if idx0 == "a" else _zero_const(func, packet, args_a, kwargs)
        b = func(*args_b, **kwargs) if idx0 == "b" else _zero_const(func, packet, args_b, kwargs)
        return Replicated(a, b, rank)
    if packet in (aten.cat, aten.stack):
        tensors = args[0]
        if all(_is_rep(t) for t in tensors):
            return _componentwise(func, flat, spec, rank)
        out = []
        for comp in ("a", "b"):
            parts = [getattr(t, comp) if _is_rep(t) else (t if comp == idx0 else torch.zeros_like(t))
                     for t in tensors]
            out.append(func(parts, *args[1:], **kwargs))
        return Replicated(out[0], out[1], rank)
    if packet in (aten.copy, aten.index_put, aten.index_copy, aten.index_add, aten.scatter,
                  aten.scatter_add, aten.masked_fill) and not _is_rep(args[0]):
        _refuse(func, "writes a replicated share into a public tensor")
    masks = _MASK_ARGS.get(packet, ())
    public = {i for i, v in enumerate(args)
              if i not in masks and _operand_position(packet, i) and _public_operand(v)}
    if not public:
        return _componentwise(func, flat, spec, rank)
    outs = []
    for comp in ("a", "b"):
        new_args = [getattr(v, comp) if _is_rep(v) else
                    (_zero_like(v) if i in public and comp != idx0 else v)
                    for i, v in enumerate(args)]
        outs.append(func(*new_args, **kwargs))
    return _wrap(outs[0], outs[1], rank)


def _operand_position(packet, i: int) -> bool:
    """Whether positional argument i of an additive op is a value operand (not an index)."""
    if packet is aten.index_put:
        return i in (0, 2)
    if packet in (aten.index_copy, aten.index_add, aten.scatter, aten.scatter_add):
        return i in (0, 3)
    return True


def _public_operand(v: Any) -> bool:
    return (isinstance(v, torch.Tensor) and not _is_rep(v)) or \
        (isinstance(v, (int, float)) and not isinstance(v, bool))


def _zero_const(func, packet, args, kwargs):
    """The zero component of a public constant op (full_like, ones_like, fill, new_full)."""
    if packet is aten.fill:
        return func(args[0], _zero_like(args[1]), **kwargs)
    if packet is aten.full_like:
        return func(args[0], _zero_like(args[1]), *args[2:], **kwargs)
    if packet is aten.ones_like:
        return aten.zeros_like(args[0], *args[1:], **kwargs)
    if packet is aten.new_full:
        return func(args[0], args[1], _zero_like(args[2]), *args[3:], **kwargs)
    if packet is aten.new_ones:
        return aten.new_zeros(args[0], *args[1:], **kwargs)
    raise AssertionError(packet)


def _not(func, flat, spec, reps, rank):
    """Binary NOT: xor all-ones into share index 0 only."""
    (x,), kwargs = _unflatten(flat, spec)
    idx0 = _index0(x.share_rank())
    a = func(x.a) if idx0 == "a" else x.a.clone()
    b = func(x.b) if idx0 == "b" else x.b.clone()
    if func._schema.is_mutable:
        x.a.copy_(a)
        x.b.copy_(b)
        return x
    return Replicated(a, b, rank)


def _or(func, args, kwargs, reps, rank):
    """x | c for a public c: (x & ~c) ^ c (the xor on share index 0)."""
    if len(reps) != 1:
        _refuse(func, "of two replicated operands is an AND (a protocol round)")
    x, c = (args[0], args[1]) if _is_rep(args[0]) else (args[1], args[0])
    out = Replicated(x.a & ~torch.as_tensor(c), x.b & ~torch.as_tensor(c), rank)
    out = out ^ c
    if func._schema.is_mutable:
        args[0].a.copy_(out.a)
        args[0].b.copy_(out.b)
        return args[0]
    return out


# ----------------------------------------------------------------- pure sharing math
def split(value: torch.Tensor, randoms: Sequence[torch.Tensor], binary: bool = False) -> list[torch.Tensor]:
    """Three components of `value` (x_0, x_1 from `randoms`, x_2 completing the sum or xor)."""
    x0, x1 = randoms
    x2 = value ^ x0 ^ x1 if binary else value - x0 - x1
    return [x0, x1, x2]


def of_party(components: Sequence[torch.Tensor], rank: int) -> Replicated:
    """Party `rank`'s share of the components (x_rank, x_{rank+1})."""
    return Replicated(components[rank], components[(rank + 1) % WORLD], rank)


def reconstruct(shares: Sequence[Replicated], binary: bool = False) -> torch.Tensor:
    """The value of the three parties' shares (checks that they are consistent)."""
    comps = [s.a for s in shares]
    for r, s in enumerate(shares):
        if not torch.equal(s.b, comps[(r + 1) % WORLD]):
            raise ValueError(f"party {r}'s second component differs from party {(r + 1) % WORLD}'s first")
    if binary:
        return comps[0] ^ comps[1] ^ comps[2]
    return comps[0] + comps[1] + comps[2]
