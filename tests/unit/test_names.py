"""Name inference of crypten_lite.names against the PyTorch 1.3 named-tensor documents.

Expected names come from the examples of docs/source/named_tensor.rst and
name_inference.rst of PyTorch 1.3 (current torch has no named tensors to compare with).
Where a rule also decides shapes (indexing, matmul, squeeze, align_to, flatten), the
position of every named dim is checked against what current torch does to the shape.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from crypten_lite import names as N
from crypten_lite.errors import CryptenLiteError
from crypten_lite.names import NamedDimError

NCHW = ("N", "C", "H", "W")

# (rule, args, kwargs, expected names): one line per documented behaviour.
TABLE: list[tuple[str, tuple[Any, ...], dict[str, Any], Any]] = [
    # keeps input names
    ("keep", (("N", "C"),), {}, ("N", "C")),
    ("keep_along", (("N", "C"), "C"), {}, ("N", "C")),
    ("keep_along", (("N", "C"), -1), {}, ("N", "C")),
    # removes dimensions
    ("reduce", (NCHW, ["N", "C"]), {}, ("H", "W")),
    ("reduce", (NCHW, ["N", "C"]), {"keepdim": True}, NCHW),
    ("reduce", (NCHW, 1), {}, ("N", "H", "W")),
    ("reduce", (NCHW,), {}, ()),
    ("reduce", (NCHW, ()), {}, ()),
    ("reduce", (NCHW,), {"keepdim": True}, NCHW),
    ("select", (NCHW, "C"), {}, ("N", "H", "W")),
    ("squeeze", (NCHW, "N"), {"shape": (1, 3, 3, 3)}, ("C", "H", "W")),
    ("squeeze", (NCHW, "C"), {"shape": (1, 3, 3, 3)}, NCHW),  # size 3: stays, as in torch
    ("squeeze", (NCHW,), {"shape": (1, 3, 1, 3)}, ("C", "W")),
    ("squeeze", (NCHW, ("N", "H")), {"shape": (1, 3, 1, 3)}, ("C", "W")),
    # unifies names from inputs
    ("unify", (("N", None), (None, "C")), {}, ("N", "C")),
    (("unify"), (("X",), (None,)), {}, ("X",)),
    ("unify", (("X",), ("X",)), {}, ("X",)),
    ("unify", (("N", "C", "H", "W"), ("W",)), {}, NCHW),
    ("unify", ((None, None, "W"), ("C", None, None)), {}, ("C", None, "W")),
    ("unify", ((), ("A", None)), {}, ("A", None)),
    ("cat", ([("N", None), (None, "C")], 0), {}, ("N", "C")),
    ("cat", ([("N", "C"), ("N", "C"), (None, None)], "C"), {}, ("N", "C")),
    ("stack", ([("N", None), (None, "C")], 0), {}, (None, "N", "C")),
    ("stack", ([("N", "C"), ("N", "C")], -1), {}, ("N", "C", None)),
    # permutes dimensions
    ("transpose", (("N", "C"), "N", "C"), {}, ("C", "N")),
    ("transpose", (NCHW, 1, -1), {}, ("N", "W", "H", "C")),
    ("t", (("N", "C"),), {}, ("C", "N")),
    ("t", (("N",),), {}, ("N",)),
    ("permute", (NCHW, ("W", 0, "C", -2)), {}, ("W", "N", "C", "H")),
    # contracts away dims
    ("matmul", (("N", "D"), ("in", "out")), {}, ("N", "out")),                 # mm
    ("matmul", (("N", "D"), ("something",)), {}, ("N",)),                       # mv
    ("matmul", (("A",), ("B",)), {}, ()),                                       # dot
    ("matmul", (("A", "B", "C", "D"), ("B", "E", "F")), {}, ("A", "B", "C", "F")),
    ("matmul", (("K",), ("B", "K2", "F")), {}, ("B", "F")),                     # 1-D @ 3-D
    ("matmul", (("B", "M", "K"), ("K2",)), {}, ("B", "M")),                     # 3-D @ 1-D
    ("matmul", ((None, "M", "K"), ("B", "K", "F")), {}, ("B", "M", "F")),
    ("linear", (("N", "features"),), {}, ("N", None)),
    ("linear", (("B", "T", "D"),), {}, ("B", "T", None)),
    ("conv_or_pool", (NCHW,), {}, NCHW),
    # shape changes
    ("unsqueeze", (("N", "C"), 1), {}, ("N", None, "C")),
    ("unsqueeze", (("N", "C"), -1), {}, ("N", "C", None)),
    ("unsqueeze", ((), 0), {}, (None,)),
    ("expand", (("H", "W"), 4), {}, (None, None, "H", "W")),
    ("expand", (("H", "W"), 2), {}, ("H", "W")),
    ("reshape", (NCHW, 2), {}, (None, None)),
    ("flatten", (NCHW, 1), {}, ("N", None)),
    ("flatten", (NCHW, "C", "H"), {}, ("N", None, "W")),
    ("flatten", (NCHW, 2, 2), {}, NCHW),
    ("flatten", ((),), {}, (None,)),
    ("named_flatten", (NCHW, ["C", "H", "W"], "features"), {}, (("N", "features"), 1, 3)),
    ("named_flatten", (NCHW, ["N", "C"], "NC"), {}, (("NC", "H", "W"), 0, 1)),
    ("unflatten", (("N", "features"), "features", [("C", 3), ("H", 128), ("W", 128)]), {},
     NCHW),
    ("unflatten", (("N", "features"), -1, {"C": 3, "HW": 9}), {}, ("N", "C", "HW")),
    # name manipulation
    ("rename", (NCHW, "...", "height", "width"), {}, ("N", "C", "height", "width")),
    ("rename", (NCHW, "batch", ..., "width"), {}, ("batch", "C", "H", "width")),
    ("rename", (NCHW,), {"W": "width", "H": "height"}, ("N", "C", "height", "width")),
    ("rename", (NCHW,), {"C": None}, ("N", None, "H", "W")),
    ("rename", (NCHW, None), {}, (None,) * 4),
    ("rename", ((), ), {}, ()),
    ("refine_names", ((None,) * 4, "N", "C", "H", "W"), {}, NCHW),
    ("refine_names", ((None,) * 4, "N", ...), {}, ("N", None, None, None)),
    ("refine_names", (("N", None, None, "W"), ..., "H", "W"), {}, ("N", None, "H", "W")),
    ("refine_names", (("N", None), "N", None), {}, ("N", None)),
    # indexing
    ("index", (NCHW, 0), {}, ("C", "H", "W")),
    ("index", (NCHW, (slice(None), 1)), {}, ("N", "H", "W")),
    ("index", (NCHW, (..., 0)), {}, ("N", "C", "H")),
    ("index", (NCHW, (None, ..., None)), {}, (None, "N", "C", "H", "W", None)),
    ("index", (NCHW, (slice(0, 2), slice(None, None, 2))), {}, NCHW),
    ("index", (NCHW, (slice(None), [0, 1])), {}, ("N", None, "H", "W")),
    ("index", (NCHW, ([0, 1], slice(None), [0, 1])), {}, (None, "C", "W")),
    ("index", (NCHW, (slice(None), [0, 1], 0, [0, 1])), {}, ("N", None)),
    ("index", (NCHW, (slice(None), True)), {}, ("N", None, "C", "H", "W")),
    ("index", (NCHW, ([[True, False]],)), {}, (None, "H", "W")),
]


def _table_id(row: tuple[Any, ...]) -> str:
    return f"{row[0]}{row[1]!r}{row[2] or ''}"[:90]


@pytest.mark.parametrize("row", TABLE, ids=_table_id)
def test_rule_table(row):
    rule, args, kwargs, expected = row
    assert N.RULES[rule](*args, **kwargs) == expected


def test_rules_and_op_families_cover_each_other():
    # flatten(dims, out_dim) is the op "flatten" with other arguments: named_flatten.
    assert set(N.OP_FAMILY.values()) == set(N.RULES) - {"named_flatten"}
    assert {row[0] for row in TABLE} == set(N.RULES) - {"align_to", "align_as"}


# --------------------------------------------------------------------------------------------
# Errors: what the messages must say
# --------------------------------------------------------------------------------------------

def test_unify_mismatch_names_both_dims_and_both_tuples():
    with pytest.raises(NamedDimError) as info:
        N.unify(("N", "C"), ("N",))
    message = str(info.value)
    for part in ("'C'", "'N'", "Tensor['N', 'C']", "Tensor['N']", "same position"):
        assert part in message


def test_unify_misaligned():
    with pytest.raises(NamedDimError, match=r"Misaligned.*'N'.*different position") as info:
        N.unify(("N", None), ("N",))
    assert "Tensor['N', None]" in str(info.value) and "Tensor['N']" in str(info.value)
    with pytest.raises(NamedDimError, match="Misaligned"):
        N.unify(("A", None, None), (None, "A"))


def test_errors_are_crypten_lite_and_runtime_errors():
    with pytest.raises(CryptenLiteError):
        N.resolve_dim(("N",), "C")
    with pytest.raises(RuntimeError):
        N.resolve_dim(("N",), "C")


@pytest.mark.parametrize(("call", "match"), [
    (lambda: N.resolve_dim(NCHW, "X"), r"'X' not found in Tensor\['N', 'C', 'H', 'W'\]"),
    (lambda: N.resolve_dim(NCHW, 4), r"out of range \[-4, 3\]"),
    (lambda: N.resolve_dim(NCHW, None), "by name or position"),
    (lambda: N.resolve_dims(NCHW, ("N", 0)), "same dim twice"),
    (lambda: N.normalize(("N", "N"), 2), "more than once"),
    (lambda: N.normalize(("N",), 2), "1 entries but the tensor has 2 dims"),
    (lambda: N.normalize(("1x",), 1), "invalid dim name"),
    (lambda: N.normalize(("a-b",), 1), "invalid dim name"),
    (lambda: N.normalize((3,), 1), "invalid dim name"),
    (lambda: N.normalize(3, 1), "sequence of str"),
    (lambda: N.rename(NCHW, "A", W="B"), "not both"),
    (lambda: N.rename(NCHW, X="Y"), "'X' does not exist"),
    (lambda: N.rename(NCHW, W="N"), "more than once"),
    (lambda: N.rename(NCHW, "A", "B"), "got 2 names"),
    (lambda: N.rename(NCHW, ..., "A", ...), "more than one Ellipsis"),
    (lambda: N.refine_names(("N", None), "M", None), r"'N' is different from 'M' at index 0"),
    (lambda: N.refine_names(("N", None), None, None), "more specific than None"),
    (lambda: N.refine_names(("N", None), "N"), "different number of dims"),
    (lambda: N.refine_names((None, None), "A", "A"), "more than once"),
    (lambda: N.align_to(("N", None), "N"), "unnamed dim at index 1"),
    (lambda: N.align_to(("N", "C"), "N"), "cannot find dim 'C'"),
    (lambda: N.align_to(("N", "C"), "N", None, ...), "cannot contain None"),
    (lambda: N.align_to(("N", "C"), "N", "N", ...), "appears twice"),
    (lambda: N.align_to(("N", "C"), ..., ...), "more than one Ellipsis"),
    (lambda: N.align_as(("N", "C"), ("C", "H")), "cannot find dim 'N'"),
    (lambda: N.matmul(("N", "A", "B"), (None, "N", "A")), "overlap"),
    (lambda: N.matmul(("N", "A", "B1"), ("N", "B2")), "overlap"),
    (lambda: N.matmul(("A", "X"), ("Y", "A")), "duplicate names"),
    (lambda: N.matmul((), ("A",)), "at least 1 dim"),
    (lambda: N.matmul(("B", "M", "K"), ("C", "K", "F")), r"'B' and dim 'C'"),
    (lambda: N.permute(NCHW, ("N", "C")), "exactly once"),
    (lambda: N.t(("A", "B", "C")), "at most 2 dims"),
    (lambda: N.flatten(NCHW, 2, 1), "comes after"),
    (lambda: N.named_flatten(NCHW, ["C", "W"], "CW"), "consecutive"),
    (lambda: N.named_flatten(NCHW, ["H", "C"], "CH"), "consecutive"),
    (lambda: N.named_flatten(NCHW, ["C", "H"], "N"), "more than once"),
    (lambda: N.unflatten(("N", "F"), "F", [("N", 2), ("X", 3)]), "more than once"),
    (lambda: N.unflatten(("N", "F"), "F", []), "must not be empty"),
    (lambda: N.unflatten(("N", "F"), "F", ["C"]), r"\(name, size\) pairs"),
    (lambda: N.cat([("N", "C"), ("N",)], 0), "same number of dims"),
    (lambda: N.cat([(), ()], 0), "zero-dimensional"),
    (lambda: N.cat([("N", "C"), ("N", "D")], 0), r"'C' and dim 'D'"),
    (lambda: N.stack([("N", "C"), ("C", "N")], 0), "do not match"),
    (lambda: N.expand(("H", "W"), 1), "at least 2"),
    (lambda: N.unsqueeze(("A",), 3), r"out of range \[-2, 1\]"),
    (lambda: N.squeeze(("A",), shape=(1, 2)), "does not match"),
    (lambda: N.index(NCHW, (0, 0, 0, 0, 0)), "too many indices"),
    (lambda: N.index(NCHW, (..., 0, ...)), "single ellipsis"),
    (lambda: N.index(NCHW, (torch.zeros(2),)), "integer or bool"),
    (lambda: N.index(NCHW, ("a",)), "unsupported index"),
    (lambda: N.select((), 0), "0-dim"),
    (lambda: N.conv_or_pool(("N",)), "spatial"),
    (lambda: N.as_tuple(("N",), 2), "2 dims"),
])
def test_errors(call, match):
    with pytest.raises(NamedDimError, match=match):
        call()


# --------------------------------------------------------------------------------------------
# normalize / canonical / as_tuple / resolve
# --------------------------------------------------------------------------------------------

def test_normalize_and_canonical_forms():
    assert N.normalize(None, 3) is None
    assert N.normalize([None, None], 2) is None
    assert N.normalize(["N", None], 2) == ("N", None)
    assert N.normalize("C", 1) == ("C",)
    assert N.normalize((), 0) is None
    assert N.normalize(("_x1", "y_2"), 2) == ("_x1", "y_2")
    assert N.canonical((None, None)) is None and N.canonical(("A",)) == ("A",)
    assert N.as_tuple(None, 2) == (None, None) and N.as_tuple(("A", None), 2) == ("A", None)
    assert N.is_named(("A", None)) and not N.is_named((None,)) and not N.is_named(None)


def test_resolve_dims():
    assert N.resolve_dim(NCHW, "H") == 2
    assert N.resolve_dim(NCHW, -1) == 3
    assert N.resolve_dims(NCHW, ("W", 0, -3)) == (3, 0, 1)
    assert N.resolve_dims(NCHW, "C") == (1,)
    assert N.resolve_dim((), 0) == 0 and N.resolve_dim((), -1) == 0  # as torch for 0-dim


# --------------------------------------------------------------------------------------------
# align_to / align_as, executed on real tensors
# --------------------------------------------------------------------------------------------

def _apply(alignment: N.Alignment, x: torch.Tensor) -> torch.Tensor:
    return x.permute(alignment.permutation).reshape(alignment.view_shape(x.shape))


def test_align_to_doc_example():
    # named_tensor.align_to('F', 'E', ...) == tensor.permute(5, 4, 0, 1, 2, 3)
    names = ("A", "B", "C", "D", "E", "F")
    x = torch.randn(2, 3, 4, 5, 6, 7)
    a = N.align_to(names, "F", "E", ...)
    assert a.names == ("F", "E", "A", "B", "C", "D") and a.new_dims == ()
    assert torch.equal(_apply(a, x), x.permute(5, 4, 0, 1, 2, 3))


def test_align_to_adds_size_one_dims_and_keeps_unnamed_dims_under_ellipsis():
    a = N.align_to(("N", None, "W"), "W", "X", ...)
    assert a == N.Alignment(("W", "X", "N", None), (2, 0, 1), (1,))
    x = torch.randn(2, 3, 5)
    y = _apply(a, x)
    assert y.shape == (5, 1, 2, 3)
    z = x.permute(a.permutation)
    for p in a.new_dims:
        z = z.unsqueeze(p)
    assert torch.equal(y, z)


def test_align_as_scale_channels_doc_example():
    scale = N.refine_names((None,), "C")
    for target in (("N", "H", "W", "C"), ("N", "C", "H", "W"), ("N", "C", "H", "W", "D")):
        a = N.align_as(scale, target)
        assert a.names == target
        sizes = a.view_shape((3,))
        assert sizes == tuple(3 if n == "C" else 1 for n in target)
    assert N.align_as(("C",), (None, "C")) == N.Alignment((None, "C"), (0,), (0,))


@settings(max_examples=60, deadline=None)
@given(st.permutations(["A", "B", "C", "D"]), st.integers(1, 4),
       st.lists(st.sampled_from(["X", "Y"]), unique=True, max_size=2), st.data())
def test_align_to_moves_every_dim_with_its_size(perm, ndim, extra, data):
    names = tuple(perm[:ndim])
    sizes = {"A": 2, "B": 3, "C": 5, "D": 7}
    x = torch.arange(torch.tensor([sizes[n] for n in names]).prod().item()).reshape(
        [sizes[n] for n in names])
    order = data.draw(st.permutations(list(names) + extra))
    a = N.align_to(names, *order)
    y = _apply(a, x)
    assert a.names == tuple(order)
    assert tuple(y.shape) == tuple(sizes.get(n, 1) for n in order)
    assert torch.equal(y.squeeze(), x.permute(a.permutation).squeeze())


# --------------------------------------------------------------------------------------------
# Properties (hypothesis)
# --------------------------------------------------------------------------------------------

name_lists = st.lists(st.sampled_from(["A", "B", "C", "D", "E", None]), max_size=5).filter(
    lambda ns: len([n for n in ns if n]) == len({n for n in ns if n}))


@given(name_lists)
def test_unify_with_itself_and_with_unnamed(names):
    names = tuple(names)
    assert N.unify(names, names) == names
    assert N.unify(names, (None,) * len(names)) == names
    assert N.unify((None,) * len(names), names) == names


@given(name_lists, name_lists)
def test_unify_is_symmetric(a, b):
    a, b = tuple(a), tuple(b)
    try:
        ab = N.unify(a, b)
    except NamedDimError:
        with pytest.raises(NamedDimError):
            N.unify(b, a)
        return
    assert N.unify(b, a) == ab
    assert len(ab) == max(len(a), len(b))
    assert len({n for n in ab if n}) == len([n for n in ab if n])  # never a duplicate


@given(name_lists.filter(lambda ns: len(ns) >= 1), st.data())
def test_named_flatten_then_unflatten_restores_names(names, data):
    names = tuple(names)
    start = data.draw(st.integers(0, len(names) - 1))
    end = data.draw(st.integers(start, len(names) - 1))
    assume("Z" not in names)
    flat, i, j = N.named_flatten(names, list(range(start, end + 1)), "Z")
    assert (i, j) == (start, end)
    shape = [(n, 2) for n in names[start:end + 1]]
    assert N.unflatten(flat, "Z", shape) == names


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.data())
def test_matmul_names_place_like_torch_shapes(a_ndim, b_ndim, data):
    # Distinct sizes per role so that each output name can be found by its size.
    m, k, n = 2, 3, 5
    a_batch = data.draw(st.lists(st.sampled_from([1, 7]), min_size=max(a_ndim - 2, 0),
                                 max_size=max(a_ndim - 2, 0)))
    b_batch = data.draw(st.lists(st.sampled_from([1, 7]), min_size=max(b_ndim - 2, 0),
                                 max_size=max(b_ndim - 2, 0)))
    a_shape = a_batch + ([m, k] if a_ndim >= 2 else [k])
    b_shape = b_batch + ([k, n] if b_ndim >= 2 else [k])
    out_shape = torch.matmul(torch.zeros(a_shape), torch.zeros(b_shape)).shape
    a_names = tuple(f"a{i}" for i in range(len(a_batch))) + (("M", "K1") if a_ndim >= 2
                                                               else ("K1",))
    b_names = (None,) * len(b_batch) + (("K2", "P") if b_ndim >= 2 else ("K2",))
    out = N.matmul(a_names, b_names)
    assert len(out) == len(out_shape)
    size_of = {"M": m, "P": n, **{f"a{i}": s for i, s in enumerate(a_batch)}}
    for name, size in zip(out, out_shape):
        if name is not None and not (name.startswith("a") and size_of[name] == 1):
            assert size_of[name] == size


@settings(max_examples=80, deadline=None)
@given(st.lists(st.sampled_from([1, 2]), min_size=0, max_size=4), st.data())
def test_squeeze_and_reduce_match_torch_ndim(shape, data):
    names = tuple("ABCD"[: len(shape)])
    x = torch.zeros(shape)
    dim = data.draw(st.none() | st.integers(-max(len(shape), 1), max(len(shape), 1) - 1))
    expected = x.squeeze() if dim is None else x.squeeze(dim)
    got = N.squeeze(names, dim, shape=shape)
    assert len(got) == expected.ndim
    if shape:
        keepdim = data.draw(st.booleans())
        d = dim if dim is not None else 0
        assert len(N.reduce(names, d, keepdim)) == x.sum(d, keepdim=keepdim).ndim


# Index items drawn for a (2, 3, 5, 7) tensor; sizes are distinct, so a kept dim is found by
# its size. Integer index tensors have 11 / 13 entries and bool masks are all True.
_SIZES = (2, 3, 5, 7)


@st.composite
def index_specs(draw) -> tuple[Any, ...]:
    items: list[Any] = []
    remaining = len(_SIZES)
    for _ in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(
            ["int", "slice", "none", "ellipsis", "tensor", "tensor2d", "list", "mask", "true",
             "int0d"]))
        if kind == "none":
            items.append(None)
        elif kind == "ellipsis" and not any(item is Ellipsis for item in items):
            items.append(Ellipsis)
        elif kind == "true":
            items.append(True)
        elif kind == "int" and remaining:
            items.append(draw(st.integers(-1, 1)))
            remaining -= 1
        elif kind == "int0d" and remaining:
            items.append(torch.tensor(0))
            remaining -= 1
        elif kind == "slice" and remaining:
            items.append(slice(None))
            remaining -= 1
        elif kind == "tensor" and remaining:
            items.append(torch.zeros(11, dtype=torch.long))
            remaining -= 1
        elif kind == "tensor2d" and remaining:
            items.append(torch.zeros(13, 1, dtype=torch.long))
            remaining -= 1
        elif kind == "list" and remaining:
            items.append([0] * 11)
            remaining -= 1
        elif kind == "mask" and remaining >= 2:
            items.append("mask")  # resolved below, once its dims are known
            remaining -= 2
    return tuple(items)


def _resolve_masks(spec: tuple[Any, ...]) -> tuple[Any, ...]:
    """Replace each "mask" by an all-True bool tensor over the dims it will cover."""
    consumed_before: list[int] = []
    used = 0
    for item in spec:
        consumed_before.append(used)
        if item is None or item is Ellipsis or isinstance(item, bool):
            continue
        used += 2 if isinstance(item, str) else 1
    out = []
    ellipsis_width = len(_SIZES) - used
    for item, before in zip(spec, consumed_before):
        if isinstance(item, str):
            shift = ellipsis_width if any(i is Ellipsis for i in spec[: len(out)]) else 0
            first = before + shift
            out.append(torch.ones(_SIZES[first], _SIZES[first + 1], dtype=torch.bool))
        else:
            out.append(item)
    return tuple(out)


@settings(max_examples=300, deadline=None)
@given(index_specs())
def test_index_names_follow_torch_shapes(spec):
    spec = _resolve_masks(spec)
    x = torch.zeros(_SIZES)
    try:
        result = x[spec]
    except (IndexError, RuntimeError):
        assume(False)  # index tensors that do not broadcast together: not a naming question
    names = N.index(("A", "B", "C", "D"), spec)
    assert len(names) == result.ndim
    size_of = dict(zip("ABCD", _SIZES))
    for name, size in zip(names, result.shape):
        if name is not None:
            assert size_of[name] == size
    # Every dim indexed by a slice or covered by the ellipsis keeps its name.
    assert len([n for n in names if n]) == len(set(n for n in names if n))


# --------------------------------------------------------------------------------------------
# Docs
# --------------------------------------------------------------------------------------------

def test_docs_list_every_rule():
    doc = (pathlib.Path(__file__).parents[2] / "docs" / "names_and_types.md").read_text()
    for family in N.RULES:
        assert f"`{family}`" in doc, f"docs/names_and_types.md does not describe {family}"
