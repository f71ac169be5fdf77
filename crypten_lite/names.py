"""Named-dimension rules (PyTorch 1.3 named tensors), as pure functions on tuples of names.

PyTorch 1.3 introduced named tensors and current PyTorch no longer has them, so crypten_lite
implements the rules here, apart from any tensor: a CrypTensor keeps its names and asks this
module what the names of a result are. Protocol code never sees names (docs/design.md section 7).

Vocabulary
----------
- ``Names`` is a full tuple with one entry per dimension, each a ``str`` or ``None``
  (unnamed): ``('N', None, 'H', 'W')``.
- ``MaybeNames`` is ``Names`` or ``None``. ``None`` means "no dimension is named" and is the
  canonical form a tensor should store (:func:`normalize` produces it).
- Every rule function takes and returns *full* tuples: call :func:`as_tuple` first (it turns
  ``None`` into ``(None,) * ndim``) and :func:`canonical` on the result before storing it.
- A ``Dim`` is a position (negative counts from the end) or a name.

The rules follow the PyTorch 1.3 documents "Named Tensors" and "Named Tensors operator
coverage" (docs/source/named_tensor.rst, docs/source/name_inference.rst): *match* /
*unify* (two names match if equal or if one is ``None``; unify keeps the more specific),
right-aligned broadcasting with the misalignment check, "removes dimensions",
"permutes dimensions", "contracts away dims", ``rename``, ``refine_names``, ``align_to``,
``flatten`` / ``unflatten``. Where 1.3 had no rule (indexing, stack, conv / pooling, linear,
reshape) the choice made here is stated in the function's docstring and in
docs/names_and_types.md; ``RULES`` lists every op family.

Errors are :class:`NamedDimError`; messages name the op, the dims and both name tuples.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import torch

from .errors import CryptenLiteError

Name = str | None
Names = tuple[Name, ...]
MaybeNames = Names | None
Dim = int | str

__all__ = [
    "Alignment", "Dim", "MaybeNames", "Name", "NamedDimError", "Names", "OP_FAMILY", "RULES",
    "align_as", "align_to", "as_tuple", "canonical", "cat", "conv_or_pool", "expand",
    "flatten", "index", "is_named", "keep", "keep_along", "linear", "matmul", "named_flatten",
    "normalize", "permute", "reduce", "refine_names", "rename", "reshape", "resolve_dim",
    "resolve_dims", "select", "squeeze", "stack", "t", "transpose", "unflatten", "unify",
    "unsqueeze",
]


class NamedDimError(CryptenLiteError, RuntimeError):
    """Names that do not fit: invalid, duplicated, missing, mismatched or misaligned dims."""


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _fmt(names: Sequence[Name]) -> str:
    """``Tensor['N', None]``: how messages show a tuple of names."""
    return "Tensor[" + ", ".join(_fmt_name(n) for n in names) + "]"


def _fmt_name(name: Any) -> str:
    return "None" if name is None else repr(name)


def _is_ellipsis(item: Any) -> bool:
    return item is Ellipsis or (isinstance(item, str) and item == "...")


# --------------------------------------------------------------------------------------------
# Validation and canonical form
# --------------------------------------------------------------------------------------------

def _check_name(name: Any, op: str) -> None:
    if name is None:
        return
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise NamedDimError(
            f"{op}: invalid dim name {name!r}; a name is None or an identifier made of letters, "
            "digits and underscores that does not start with a digit")


def _check_names(names: Sequence[Name], op: str) -> Names:
    """Validate each name and refuse duplicates; returns the names as a tuple."""
    names = tuple(names)
    seen: set[str] = set()
    for name in names:
        _check_name(name, op)
        if name is not None:
            if name in seen:
                raise NamedDimError(
                    f"{op}: dim name {name!r} appears more than once in {_fmt(names)}; "
                    "names must be unique (None may repeat)")
            seen.add(name)
    return names


def normalize(names: Iterable[Name] | str | None, ndim: int) -> MaybeNames:
    """Validate user-given names for a tensor of `ndim` dims and return the canonical form.

    `names` may be None, a single string (only for a 1-dim tensor, as in PyTorch) or any
    iterable of ``str | None``. Checks: length equals `ndim`, every name is an identifier,
    no non-None name repeats. Returns None when no dim is named, else a tuple.
    """
    if names is None:
        return None
    if isinstance(names, str):
        items: tuple[Any, ...] = (names,)
    elif isinstance(names, Iterable):
        items = tuple(names)
    else:
        raise NamedDimError(f"names must be None or a sequence of str / None, got {names!r}")
    if len(items) != ndim:
        raise NamedDimError(
            f"names {items!r} has {len(items)} entries but the tensor has {ndim} dims; "
            "give exactly one name (or None) per dim")
    return canonical(_check_names(items, "names"))


def canonical(names: MaybeNames) -> MaybeNames:
    """None if no dim is named (the form to store), else `names` as a tuple."""
    if names is None or all(n is None for n in names):
        return None
    return tuple(names)


def as_tuple(names: MaybeNames, ndim: int) -> Names:
    """The full tuple of names of a tensor with `ndim` dims (None -> all unnamed)."""
    if names is None:
        return (None,) * ndim
    if len(names) != ndim:
        raise NamedDimError(f"{_fmt(names)} does not describe a tensor of {ndim} dims")
    return tuple(names)


def is_named(names: MaybeNames) -> bool:
    """True if at least one dim has a name (PyTorch's ``Tensor.has_names()``)."""
    return names is not None and any(n is not None for n in names)


# --------------------------------------------------------------------------------------------
# Dims given by position or by name
# --------------------------------------------------------------------------------------------

def _wrap(dim: int, ndim: int, op: str, names: Names | None = None) -> int:
    """A position in range [-ndim, ndim) made non-negative (a 0-dim tensor accepts 0, -1)."""
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise NamedDimError(f"{op}: dim must be an int or a name, got {dim!r}")
    bound = max(ndim, 1)
    if not -bound <= dim < bound:
        where = f" of {_fmt(names)}" if names is not None else ""
        raise NamedDimError(
            f"{op}: dim {dim} is out of range [{-bound}, {bound - 1}] for a tensor of {ndim} "
            f"dims{where}")
    return dim % bound


def resolve_dim(names: Names, dim: Dim, op: str = "resolve_dim") -> int:
    """The non-negative position of `dim` (an int, negative allowed, or a name) in `names`."""
    if isinstance(dim, str):
        if dim not in names:
            raise NamedDimError(
                f"{op}: name {dim!r} not found in {_fmt(names)}; use one of the names there, "
                "or rename / refine_names first")
        return names.index(dim)
    if dim is None:
        raise NamedDimError(f"{op}: look up dims by name or position, got None in {_fmt(names)}")
    return _wrap(dim, len(names), op, names)


def resolve_dims(names: Names, dims: Dim | Sequence[Dim], op: str = "resolve_dims"
                 ) -> tuple[int, ...]:
    """Positions of one dim or a sequence of dims (ints and/or names); refuses repeats."""
    items = (dims,) if isinstance(dims, (int, str)) else tuple(dims)
    result = tuple(resolve_dim(names, d, op) for d in items)
    if len(set(result)) != len(result):
        raise NamedDimError(f"{op}: dims {items!r} name the same dim twice in {_fmt(names)}")
    return result


# --------------------------------------------------------------------------------------------
# Unify (binary broadcasting ops)
# --------------------------------------------------------------------------------------------

def _check_misaligned(name: Name, names: Names, other: Names, action: str) -> None:
    if name is not None and name in other:
        raise NamedDimError(
            f"Misaligned dims when attempting to {action} dims {_fmt(names)} and dims "
            f"{_fmt(other)}: dim {name!r} appears in a different position from the right "
            "across both lists; align them first with align_as / align_to")


def unify(a: Names, b: Names, action: str = "broadcast") -> Names:
    """Output names of a broadcasting binary op (add, mul, eq, where...), PyTorch 1.3 rules.

    Names are matched right-aligned (a missing leading dim counts as None). Two different
    names at the same position are an error; so is a name matched against None when that
    name also appears elsewhere in the other tuple ("misaligned"). The result has
    ``max(len(a), len(b))`` names, each the more specific of the pair.
    """
    size = max(len(a), len(b))
    out: list[Name] = [None] * size
    for k in range(1, size + 1):
        x = a[-k] if k <= len(a) else None
        y = b[-k] if k <= len(b) else None
        if x is not None and y is not None and x != y:
            raise NamedDimError(
                f"Error when attempting to {action} dims {_fmt(a)} and dims {_fmt(b)}: dim "
                f"{x!r} and dim {y!r} are at the same position from the right but do not "
                "match; rename one of them or align them with align_as / align_to")
        out[-k] = y if x is None else x  # the more specific of two matching names
        if x is None or y is None:
            _check_misaligned(x, a, b, action)
            _check_misaligned(y, b, a, action)
    return tuple(out)


# --------------------------------------------------------------------------------------------
# rename, refine_names, align_to, align_as
# --------------------------------------------------------------------------------------------

def _resolve_ellipsis(new: Sequence[Any], names: Names, op: str) -> tuple[Any, ...]:
    """Replace one ``...`` in `new` with the names of `names` at the positions it covers."""
    spots = [i for i, item in enumerate(new) if _is_ellipsis(item)]
    if len(spots) > 1:
        raise NamedDimError(f"{op}: more than one Ellipsis ('...') in {tuple(new)!r}")
    if not spots:
        return tuple(new)
    i = spots[0]
    after = len(new) - i - 1
    if i + after > len(names):
        raise NamedDimError(
            f"{op}: {tuple(new)!r} names {i + after} dims besides '...' but {_fmt(names)} has "
            f"only {len(names)}")
    return tuple(new[:i]) + names[i:len(names) - after] + tuple(new[i + 1:])


def rename(names: Names, *positional: Name, **mapping: Name) -> Names:
    """Names after ``rename``: all of them (`positional`, ``...`` allowed) or some (`mapping`).

    ``rename(names, None)`` removes every name. ``rename(names, 'N', ..., 'W')`` replaces all
    names, ``...`` standing for the current names it covers. ``rename(names, W='width')``
    maps old names to new ones (a new name may be None); every old name must exist.
    """
    if positional and mapping:
        raise NamedDimError(
            "rename: takes either positional names or keyword old=new pairs, not both; use "
            "rename(*names) to name all dims and rename(**mapping) to rename some")
    if mapping:
        out = list(names)
        for old, new in mapping.items():
            if old not in names:
                raise NamedDimError(
                    f"rename: tried to rename dim {old!r} to {_fmt_name(new)} in {_fmt(names)} "
                    f"but dim {old!r} does not exist")
            out[names.index(old)] = new
        return _check_names(out, "rename")
    if len(positional) == 1 and positional[0] is None:
        return (None,) * len(names)
    new = _resolve_ellipsis(positional, names, "rename")
    if len(new) != len(names):
        raise NamedDimError(
            f"rename: got {len(new)} names {new!r} for {_fmt(names)} with {len(names)} dims")
    return _check_names(new, "rename")


def refine_names(names: Names, *new: Name) -> Names:
    """Names after ``refine_names``: lift None dims to names, keep named dims unchanged.

    `new` has one entry per dim, or fewer with one ``...`` that keeps the names it covers.
    Refining None to a name is allowed; a name must stay the same name (changing it, or
    turning it into None, is an error: use :func:`rename`).
    """
    target = _resolve_ellipsis(new, names, "refine_names")
    if len(target) != len(names):
        raise NamedDimError(
            f"refine_names: cannot coerce {_fmt(names)} to {_fmt(target)} because they have a "
            f"different number of dims ({len(names)} and {len(target)})")
    target = _check_names(target, "refine_names")
    for i, (old, out) in enumerate(zip(names, target)):
        if old is None or old == out:
            continue
        why = "is more specific than" if out is None else "is different from"
        raise NamedDimError(
            f"refine_names: cannot coerce {_fmt(names)} to {_fmt(target)} because {old!r} "
            f"{why} {_fmt_name(out)} at index {i}; use rename to change a name")
    return target


class Alignment(NamedTuple):
    """How to align a tensor: ``x.permute(permutation).reshape(alignment.view_shape(x.shape))``.

    - `names`: names of the result.
    - `permutation`: order of the input dims (a permutation of ``range(ndim)``), i.e. the
      input dims in the order they appear in the result.
    - `new_dims`: ascending positions, in the result, of the new size-1 dims; unsqueezing the
      permuted tensor at each of them in turn gives the same result as the reshape.
    """

    names: Names
    permutation: tuple[int, ...]
    new_dims: tuple[int, ...]

    def view_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        """Shape of the result, given the shape of the input tensor."""
        sizes = iter(shape[p] for p in self.permutation)
        return tuple(1 if i in self.new_dims else next(sizes) for i in range(len(self.names)))


def _alignment(names: Names, out_names: Sequence[Name], source: Sequence[int | None]
               ) -> Alignment:
    """Build an Alignment from, for each output dim, the input dim it takes (None = new)."""
    permutation = tuple(s for s in source if s is not None)
    new_dims = tuple(i for i, s in enumerate(source) if s is None)
    return Alignment(_check_names(out_names, "align_to"), permutation, new_dims)


def align_to(names: Names, *order: str) -> Alignment:
    """Permute dims into `order`, adding size-1 dims for names of `order` the tensor lacks.

    Without ``...`` every dim of the tensor must be named and appear in `order`. With one
    ``...`` (Ellipsis or the string '...'), it stands for every dim not mentioned in `order`
    (named or not) in the order they have in the tensor. `order` may not contain None.
    """
    spots = [i for i, item in enumerate(order) if _is_ellipsis(item)]
    if len(spots) > 1:
        raise NamedDimError(f"align_to: more than one Ellipsis ('...') in {order!r}")
    explicit = [item for item in order if not _is_ellipsis(item)]
    for item in explicit:
        if item is None:
            raise NamedDimError(
                f"align_to: the desired order of dims cannot contain None, got {order!r}; "
                "name the dim first with refine_names")
        _check_name(item, "align_to")
    if len(set(explicit)) != len(explicit):
        raise NamedDimError(f"align_to: a name appears twice in the desired order {order!r}")
    if not spots:
        return _align_all_named(names, explicit, "align_to", f"desired order {_fmt(explicit)}")
    mentioned = {names.index(n) for n in explicit if n in names}
    rest = [i for i in range(len(names)) if i not in mentioned]
    source: list[int | None] = []
    out_names: list[Name] = []
    for item in order:
        if _is_ellipsis(item):
            source += rest
            out_names += [names[i] for i in rest]
        else:
            source.append(names.index(item) if item in names else None)
            out_names.append(item)
    return _alignment(names, out_names, source)


def _align_all_named(names: Names, order: Sequence[Name], op: str, what: str) -> Alignment:
    for i, name in enumerate(names):
        if name is None:
            raise NamedDimError(
                f"{op}: all input dims must be named, found an unnamed dim at index {i} of "
                f"{_fmt(names)}; use refine_names first, or '...' in align_to")
        if name not in order:
            raise NamedDimError(f"{op}: cannot find dim {name!r} of {_fmt(names)} in the {what}")
    source = [names.index(n) if n is not None and n in names else None for n in order]
    return _alignment(names, order, source)


def align_as(names: Names, other: Names) -> Alignment:
    """Align to the names of another tensor: ``align_to(*other)`` where `other` may hold None.

    Every dim of the tensor must be named and present in `other`; each other name, and each
    None of `other`, becomes a new size-1 dim. The result has exactly the names `other`.
    """
    return _align_all_named(names, other, "align_as", f"names {_fmt(other)} of the other tensor")


# --------------------------------------------------------------------------------------------
# Output names per op family
# --------------------------------------------------------------------------------------------

def keep(names: Names) -> Names:
    """Unary and other name-keeping ops (abs, neg, relu, sigmoid, exp, dropout, clone, ...)."""
    return names


def keep_along(names: Names, dim: Dim) -> Names:
    """Ops along one dim that keep every dim (softmax, log_softmax, cumsum, narrow, split,
    chunk): checks that `dim` exists, keeps all names."""
    resolve_dim(names, dim, "keep_along")
    return names


def reduce(names: Names, dims: Dim | Sequence[Dim] | None = None, keepdim: bool = False
           ) -> Names:
    """Reductions (sum, mean, max, min, argmax, argmin, prod, var, std, logsumexp, ...).

    `dims` None or empty reduces everything: the result is 0-dim, ``()`` (or all names kept
    with `keepdim`). Otherwise the reduced dims disappear unless `keepdim`.
    """
    if dims is None or (not isinstance(dims, (int, str)) and len(dims) == 0):
        return names if keepdim else ()
    positions = set(resolve_dims(names, dims, "reduce"))
    if keepdim:
        return names
    return tuple(n for i, n in enumerate(names) if i not in positions)


def select(names: Names, dim: Dim) -> Names:
    """``select(dim, index)``, ``unbind(dim)``, indexing one dim by an int: `dim` disappears."""
    if not names:
        raise NamedDimError("select: a 0-dim tensor has no dim to select from")
    position = resolve_dim(names, dim, "select")
    return names[:position] + names[position + 1:]


def _check_distinct(batch: Names, features: Names, a: Names, b: Names, first: str) -> None:
    for name in features:
        if name is not None and name in batch:
            second = "first" if first == "second" else "second"
            raise NamedDimError(
                f"Misaligned dims when batch matrix multiplying {_fmt(a)} and {_fmt(b)}: the "
                f"feature dims of the {first} tensor {_fmt(features)} overlap the batch dims "
                f"of the {second} tensor {_fmt(batch)}; keep batch names out of feature dims")


def matmul(a: Names, b: Names) -> Names:
    """``matmul`` / ``mm`` / ``mv`` / ``dot`` / ``bmm``: contracted dims are removed.

    Feature dims are the last two of each operand (the only one of a 1-dim operand). The
    result is ``unify(a_batch, b_batch) + a_features[:-1] + b_features without its first``:
    ``mm`` gives ``(a[-2], b[-1])``, ``mv`` gives ``(a[-2],)``, ``dot`` gives ``()``. Batch
    names may not reappear among the other operand's feature dims, and the two output
    feature dims may not end up with the same name.
    """
    if len(a) < 1 or len(b) < 1:
        raise NamedDimError(
            f"matmul: both arguments need at least 1 dim, got {len(a)} and {len(b)} dims")
    a_batch, a_feat = a[:-2], a[-2:]
    b_batch, b_feat = b[:-2], b[-2:]
    _check_distinct(a_batch, b_feat, a, b, "second")
    _check_distinct(b_batch, a_feat, a, b, "first")
    mm_names = a_feat[:-1] + b_feat[1:]
    batch = unify(a_batch, b_batch, "batch matrix multiply") if (a_batch or b_batch) else ()
    out = batch + mm_names
    if len(a) >= 2 and len(b) >= 2 and out[-2] is not None and out[-2] == out[-1]:
        raise NamedDimError(
            f"matmul: multiplying {_fmt(a)} with {_fmt(b)} would give duplicate names "
            f"{_fmt(out)}; rename one of the inputs")
    return _check_names(out, "matmul")


def linear(names: Names) -> Names:
    """``nn.Linear`` / ``F.linear`` on input names (…, in_features): the last dim becomes None.

    This is the matmul rule with an unnamed weight (``x @ W.T``); the other dims keep
    their names.
    """
    if not names:
        raise NamedDimError("linear: the input needs at least 1 dim")
    return names[:-1] + (None,)


def conv_or_pool(names: Names) -> Names:
    """Convolution and pooling (conv1d/2d/3d, max/avg pool, adaptive pools, batch norm).

    PyTorch 1.3 had no rule for these (nn modules did not support names). crypten_lite keeps
    every name: the batch dim (N), the channel dim (C; after a conv it holds the output
    channels, still the channel dim) and the spatial dims (H, W...; sizes may change).
    """
    if len(names) < 2:
        raise NamedDimError(
            f"conv_or_pool: expected a (N, C, *spatial) or (C, *spatial) input, got {_fmt(names)}")
    return names


def transpose(names: Names, dim0: Dim, dim1: Dim) -> Names:
    """``transpose(dim0, dim1)``: the two names swap places."""
    i, j = resolve_dim(names, dim0, "transpose"), resolve_dim(names, dim1, "transpose")
    if not names:
        return names  # a 0-dim tensor transposes (0, 0) to itself
    out = list(names)
    out[i], out[j] = out[j], out[i]
    return tuple(out)


def t(names: Names) -> Names:
    """``t()``: transpose of a tensor of at most 2 dims."""
    if len(names) > 2:
        raise NamedDimError(f"t: expects a tensor of at most 2 dims, got {_fmt(names)}; use "
                            "transpose or align_to")
    return names[::-1]


def permute(names: Names, dims: Sequence[Dim]) -> Names:
    """``permute(*dims)``: names follow their dims; `dims` must cover every dim once."""
    positions = resolve_dims(names, dims, "permute")
    if len(positions) != len(names):
        raise NamedDimError(
            f"permute: dims {tuple(dims)!r} must list every one of the {len(names)} dims of "
            f"{_fmt(names)} exactly once")
    return tuple(names[p] for p in positions)


def squeeze(names: Names, dim: Dim | Sequence[Dim] | None = None, *, shape: Sequence[int]
            ) -> Names:
    """``squeeze(dim)``: size-1 dims among `dim` (all dims if None) disappear with their names.

    A dim given but not of size 1 stays, as in PyTorch. `shape` is the input's shape.
    """
    if len(shape) != len(names):
        raise NamedDimError(f"squeeze: shape {tuple(shape)} does not match {_fmt(names)}")
    if dim is None:
        candidates = set(range(len(names)))
    elif len(names) == 0:
        resolve_dims((None,), dim, "squeeze")  # a 0-dim tensor accepts dim 0 / -1
        return names
    else:
        candidates = set(resolve_dims(names, dim, "squeeze"))
    return tuple(n for i, n in enumerate(names) if not (i in candidates and shape[i] == 1))


def unsqueeze(names: Names, dim: int) -> Names:
    """``unsqueeze(dim)``: a new unnamed dim at position `dim` (range [-ndim-1, ndim])."""
    position = _wrap(dim, len(names) + 1, "unsqueeze", names)
    return names[:position] + (None,) + names[position:]


def expand(names: Names, ndim: int) -> Names:
    """``expand(*sizes)`` / ``broadcast_to``: new leading dims are unnamed, the rest keep theirs."""
    if ndim < len(names):
        raise NamedDimError(
            f"expand: cannot expand {_fmt(names)} to {ndim} dims; the number of sizes must be "
            f"at least {len(names)}")
    return (None,) * (ndim - len(names)) + names


def reshape(names: Names, ndim: int) -> Names:
    """``reshape`` / ``view`` to `ndim` dims: every name is dropped.

    PyTorch 1.3 refused ``view`` on named tensors; crypten_lite lets it through and drops
    all names (a reshape has no way to know which dims survive). Use flatten / unflatten to
    keep names.
    """
    return (None,) * ndim


def flatten(names: Names, start: Dim = 0, end: Dim = -1) -> Names:
    """``flatten(start_dim, end_dim)``: the merged dims become one unnamed dim.

    A 0-dim tensor becomes 1-dim ``(None,)``; ``start == end`` keeps every name.
    """
    if not names:
        return (None,)
    i, j = resolve_dim(names, start, "flatten"), resolve_dim(names, end, "flatten")
    if i > j:
        raise NamedDimError(
            f"flatten: start dim {start!r} comes after end dim {end!r} in {_fmt(names)}")
    if i == j:
        return names
    return names[:i] + (None,) + names[j + 1:]


def named_flatten(names: Names, dims: Sequence[Dim], out_dim: str
                  ) -> tuple[Names, int, int]:
    """``flatten(dims, out_dim)``: merge consecutive `dims` into one dim named `out_dim`.

    Returns ``(new_names, start, end)``; the caller flattens positions start..end inclusive.
    """
    positions = resolve_dims(names, dims, "flatten")
    if not positions:
        raise NamedDimError("flatten: dims must not be empty")
    start, end = positions[0], positions[-1]
    if positions != tuple(range(start, end + 1)):
        raise NamedDimError(
            f"flatten: dims {tuple(dims)!r} must be consecutive and in order in {_fmt(names)}; "
            "use align_to to reorder them first")
    _check_name(out_dim, "flatten")
    out = _check_names(names[:start] + (out_dim,) + names[end + 1:], "flatten")
    return out, start, end


def unflatten(names: Names, dim: Dim,
              namedshape: Sequence[tuple[Name, int]] | Mapping[str, int]) -> Names:
    """``unflatten(dim, namedshape)``: `dim` becomes the dims of `namedshape`, in order.

    `namedshape` is a sequence of ``(name, size)`` pairs (names may be None) or a mapping
    name -> size. The result must not repeat a name.
    """
    pairs = list(namedshape.items()) if isinstance(namedshape, Mapping) else list(namedshape)
    if not pairs:
        raise NamedDimError("unflatten: namedshape must not be empty")
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[1], int)):
            raise NamedDimError(
                f"unflatten: namedshape entries must be (name, size) pairs, got {pair!r}")
    position = resolve_dim(names, dim, "unflatten")
    new = tuple(name for name, _ in pairs)
    return _check_names(names[:position] + new + names[position + 1:], "unflatten")


def _same_ndim(names_list: Sequence[Names], op: str) -> int:
    if not names_list:
        raise NamedDimError(f"{op}: expected a non-empty list of tensors")
    ndim = len(names_list[0])
    for names in names_list:
        if len(names) != ndim:
            raise NamedDimError(
                f"{op}: tensors must have the same number of dims, got {_fmt(names_list[0])} "
                f"and {_fmt(names)}")
    return ndim


def cat(names_list: Sequence[Names], dim: Dim = 0) -> Names:
    """``cat(tensors, dim)``: the inputs' names unify (right-aligned, as in broadcasting).

    A `dim` given by name is looked up in the first tensor, as in PyTorch.
    """
    ndim = _same_ndim(names_list, "cat")
    if ndim == 0:
        raise NamedDimError("cat: zero-dimensional tensors cannot be concatenated")
    resolve_dim(names_list[0], dim, "cat")
    out = names_list[0]
    for names in names_list[1:]:
        out = unify(out, names, "cat")
    return out


def stack(names_list: Sequence[Names], dim: int = 0) -> Names:
    """``stack(tensors, dim)``: names unify as in cat; the new dim at `dim` is unnamed.

    (Not covered by PyTorch 1.3; this is cat of the inputs unsqueezed at `dim`.)
    """
    _same_ndim(names_list, "stack")
    out = names_list[0]
    for names in names_list[1:]:
        out = unify(out, names, "stack")
    return unsqueeze(out, dim)


# --------------------------------------------------------------------------------------------
# Indexing
# --------------------------------------------------------------------------------------------

class _Item(NamedTuple):
    kind: str      # "int", "slice", "none", "ellipsis", "advanced"
    consumes: int  # input dims the item uses up
    adv_ndim: int  # for "advanced": dims it contributes to the broadcast index shape


def _nesting(seq: Any) -> tuple[int, bool]:
    """(ndim, is_bool) of a (nested) Python list used as an index, like torch.as_tensor."""
    depth, item = 0, seq
    while isinstance(item, (list, tuple)):
        depth += 1
        if not item:
            return depth, False
        item = item[0]
    return depth, isinstance(item, bool)


def _classify(item: Any) -> _Item:
    if item is None:
        return _Item("none", 0, 0)
    if item is Ellipsis:
        return _Item("ellipsis", 0, 0)
    if isinstance(item, slice):
        return _Item("slice", 1, 0)
    if isinstance(item, bool):
        # PyTorch: True / False inserts a dim of size 1 / 0, indexed like a 1-dim index.
        return _Item("advanced", 0, 1)
    if isinstance(item, int):
        return _Item("int", 1, 0)
    if isinstance(item, (list, tuple)):
        ndim, is_bool = _nesting(item)
        return _Item("advanced", ndim, 1) if is_bool else _Item("advanced", 1, ndim)
    dtype, ndim = getattr(item, "dtype", None), getattr(item, "ndim", None)
    if ndim is None or dtype is None:
        raise NamedDimError(f"index: unsupported index item of type {type(item).__name__}")
    if dtype == torch.bool:
        return _Item("advanced", ndim, 1)  # a mask over `ndim` dims gives one dim
    if getattr(dtype, "is_floating_point", False):
        raise NamedDimError("index: tensors used as indices must be integer or bool tensors")
    return _Item("int", 1, 0) if ndim == 0 else _Item("advanced", 1, ndim)


def index(names: Names, spec: Any) -> Names:
    """``x[spec]``, following how current PyTorch shapes the result.

    Basic items: an int (or 0-dim integer tensor) removes its dim; a slice keeps it with its
    name; None adds an unnamed dim; ``...`` stands for the dims not indexed. Advanced items
    (integer tensors or lists, bool masks, True / False) produce unnamed dims: the broadcast
    index dims sit where the advanced items are if they are adjacent (after ints are
    removed), else at the front. PyTorch 1.3 did not support indexing named tensors; this
    rule keeps the names of every dim that survives untouched.
    """
    items = spec if isinstance(spec, tuple) else (spec,)
    kinds = [_classify(item) for item in items]
    if sum(k.kind == "ellipsis" for k in kinds) > 1:
        raise NamedDimError("index: an index can only have a single ellipsis ('...')")
    used = sum(k.consumes for k in kinds)
    if used > len(names):
        raise NamedDimError(
            f"index: too many indices for {_fmt(names)}: {len(names)} dims, {used} indexed")
    if not any(k.kind == "ellipsis" for k in kinds):
        kinds.append(_Item("ellipsis", 0, 0))
    slots: list[Name | _Item] = []  # output dims before advanced dims are placed
    position = 0
    for k in kinds:
        if k.kind == "ellipsis":
            width = len(names) - used
            slots += names[position:position + width]
            position += width
        elif k.kind == "slice":
            slots.append(names[position])
        elif k.kind == "none":
            slots.append(None)
        elif k.kind == "advanced":
            slots.append(k)
        position += k.consumes
    return _place_advanced(slots)


def _place_advanced(slots: list[Name | _Item]) -> Names:
    spots = [i for i, s in enumerate(slots) if isinstance(s, _Item)]
    if not spots:
        return tuple(slots)  # type: ignore[arg-type]
    width = max(s.adv_ndim for s in slots if isinstance(s, _Item))  # type: ignore[union-attr]
    basic = [s for s in slots if not isinstance(s, _Item)]
    at = spots[0] if spots == list(range(spots[0], spots[-1] + 1)) else 0
    return tuple(basic[:at]) + (None,) * width + tuple(basic[at:])  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------

RULES: dict[str, Callable[..., Any]] = {
    "keep": keep,
    "keep_along": keep_along,
    "unify": unify,
    "reduce": reduce,
    "select": select,
    "matmul": matmul,
    "linear": linear,
    "conv_or_pool": conv_or_pool,
    "transpose": transpose,
    "t": t,
    "permute": permute,
    "squeeze": squeeze,
    "unsqueeze": unsqueeze,
    "expand": expand,
    "reshape": reshape,
    "flatten": flatten,
    "named_flatten": named_flatten,
    "unflatten": unflatten,
    "cat": cat,
    "stack": stack,
    "index": index,
    "rename": rename,
    "refine_names": refine_names,
    "align_to": align_to,
    "align_as": align_as,
}
"""Op family -> rule function (the family names are the keys of :data:`OP_FAMILY` values)."""

OP_FAMILY: dict[str, str] = {
    # keeps input names
    **{op: "keep" for op in (
        "abs", "neg", "sign", "relu", "sigmoid", "tanh", "exp", "log", "sqrt", "reciprocal",
        "square", "pos", "clone", "detach", "dropout", "hardtanh", "gelu", "silu", "clamp",
        "polynomial", "float", "double", "long", "int", "bool", "to", "type_as", "bitwise_not",
        "logical_not", "masked_fill", "contiguous")},
    # keeps names, takes a dim
    **{op: "keep_along" for op in (
        "softmax", "log_softmax", "cumsum", "cumprod", "narrow", "split", "chunk",
        "index_select")},
    # unifies names from inputs
    **{op: "unify" for op in (
        "add", "sub", "mul", "div", "true_divide", "floor_divide", "pow", "eq", "ne", "lt",
        "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "bitwise_and",
        "bitwise_or", "bitwise_xor", "where", "maximum", "minimum", "atan2", "copy_")},
    # removes dimensions
    **{op: "reduce" for op in (
        "sum", "mean", "prod", "max", "min", "argmax", "argmin", "var", "std", "logsumexp",
        "all", "any", "norm", "median", "mode", "kthvalue")},
    **{op: "select" for op in ("select", "unbind")},
    # contracts away dims
    **{op: "matmul" for op in ("matmul", "mm", "mv", "dot", "bmm", "addmm", "addmv")},
    "linear": "linear",
    **{op: "conv_or_pool" for op in (
        "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "max_pool1d",
        "max_pool2d", "avg_pool1d", "avg_pool2d", "adaptive_avg_pool2d", "batch_norm")},
    "transpose": "transpose", "t": "t", "permute": "permute",
    "squeeze": "squeeze", "unsqueeze": "unsqueeze",
    "expand": "expand", "broadcast_to": "expand",
    "reshape": "reshape", "view": "reshape",
    "flatten": "flatten", "unflatten": "unflatten",
    "cat": "cat", "stack": "stack",
    "__getitem__": "index",
    "rename": "rename", "refine_names": "refine_names",
    "align_to": "align_to", "align_as": "align_as",
}
"""Op name -> op family (a key of :data:`RULES`), for the integration and the docs table."""
