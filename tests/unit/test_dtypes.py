"""Type promotion of crypten_lite.dtypes checked against torch itself.

A private operand is a tensor of a logical dtype and a public one any torch tensor or Python
scalar; promotion sees only (dtype, kind), so checking every (dtype, kind) pair against torch
covers {private, public} x {bool, int, float} and Python scalars.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
import pathlib
from typing import Any, Callable, Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from crypten_lite import dtypes
from crypten_lite.dtypes import Cast, DtypeError, Operand, promote_op, result_type
from crypten_lite.errors import CryptenLiteError

DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16,
          torch.float32, torch.float64)
SCALARS = (True, 3, 2.5)


def _operands() -> list[tuple[Operand, Any]]:
    """(Operand, a real value torch sees) for every dtype x {n-dim, 0-dim} and each scalar."""
    out: list[tuple[Operand, Any]] = []
    for dtype in DTYPES:
        out.append((Operand(dtype, "tensor"), torch.ones(2, 3, dtype=dtype)))
        out.append((Operand(dtype, "zero_dim"), torch.ones((), dtype=dtype)))
    for value in SCALARS:
        out.append((dtypes.operand(value), value))
    return out


OPERANDS = _operands()
PAIRS = list(itertools.product(OPERANDS, OPERANDS))
# A CrypTensor op always has a tensor operand: no scalar-with-scalar pairs.
TENSOR_PAIRS = [p for p in PAIRS if p[0][0].kind != "scalar" or p[1][0].kind != "scalar"]


def _pair_id(pair: tuple[tuple[Operand, Any], tuple[Operand, Any]]) -> str:
    return "-".join(f"{op.kind}:{str(op.dtype).removeprefix('torch.')}" for op, _ in pair)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


# --------------------------------------------------------------------------------------------
# result_type
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("pair", PAIRS, ids=_pair_id)
def test_result_type_matches_torch(pair):
    (a, a_value), (b, b_value) = pair
    assert result_type(a, b) == torch.result_type(a_value, b_value)


def test_result_type_follows_default_dtype():
    assert result_type(torch.int64, 2.5) == torch.float32
    with default_dtype(torch.float64):
        assert result_type(torch.int64, 2.5) == torch.float64
        assert promote_op("div", torch.int64, torch.int64) == torch.float64
    assert result_type(torch.int64, 2.5) == torch.float32


def test_operand_accepts_tensors_dtypes_scalars_and_duck_types():
    class FakeCrypTensor:
        dtype = torch.int64

        def dim(self) -> int:
            return 0

    assert dtypes.operand(torch.float64) == Operand(torch.float64, "tensor")
    assert dtypes.operand(torch.ones(())) == Operand(torch.float32, "zero_dim")
    assert dtypes.operand(torch.ones(1, dtype=torch.bool)) == Operand(torch.bool, "tensor")
    assert dtypes.operand(FakeCrypTensor()) == Operand(torch.int64, "zero_dim")
    assert dtypes.operand(True) == Operand(torch.bool, "scalar")
    assert dtypes.operand(7) == Operand(torch.int64, "scalar")
    assert dtypes.operand(float) == Operand(torch.float64, "scalar")
    with pytest.raises(DtypeError):
        dtypes.operand("3")


# --------------------------------------------------------------------------------------------
# promote_op: every op of every family against the torch op on real operands
# --------------------------------------------------------------------------------------------

def _logical(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], torch.Tensor]:
    def run(a: Any, b: Any) -> torch.Tensor:
        # torch.logical_* want tensors; a scalar becomes a 0-dim tensor (the result is bool
        # either way, only acceptance matters).
        return fn(torch.as_tensor(a), torch.as_tensor(b))
    return run


# Python operators, so that a scalar on the left goes through Tensor.__radd__ & co. as it
# will for a CrypTensor (``2 * x``, ``1.5 - x``, ``2 < x``).
TORCH_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul,
    "div": operator.truediv, "floor_divide": operator.floordiv,
    "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le,
    "gt": operator.gt, "ge": operator.ge,
    "logical_and": _logical(torch.logical_and), "logical_or": _logical(torch.logical_or),
    "logical_xor": _logical(torch.logical_xor),
}


@pytest.mark.parametrize("op", sorted(TORCH_OPS))
@pytest.mark.parametrize("pair", TENSOR_PAIRS, ids=_pair_id)
def test_promote_op_matches_torch(op, pair):
    (a, a_value), (b, b_value) = pair
    try:
        expected = TORCH_OPS[op](a_value, b_value).dtype
    except RuntimeError:
        with pytest.raises(DtypeError):
            promote_op(op, a, b)
        return
    assert promote_op(op, a, b) == dtypes.logical_dtype(expected)


@pytest.mark.parametrize("family", dtypes.FAMILIES)
def test_every_family_has_an_op_and_accepts_its_own_name(family):
    assert dtypes.OP_FAMILY[family] == family
    promote_op(family, torch.float32, torch.float32)


@pytest.mark.parametrize("pair", PAIRS, ids=_pair_id)
def test_matmul_promotion(pair):
    (a, a_value), (b, b_value) = pair
    if a.kind != "tensor" or b.kind != "tensor":
        with pytest.raises(DtypeError, match="at least 1 dim"):
            promote_op("matmul", a, b)
        return
    promoted = torch.result_type(a_value, b_value)
    if promoted == torch.bool:
        with pytest.raises(DtypeError, match="bool"):
            promote_op("matmul", a, b)
        return
    # torch.matmul wants equal dtypes; crypten_lite promotes first, then multiplies.
    x, y = a_value.to(promoted), b_value.to(promoted).T
    if promoted == torch.float16:
        x, y = x.float(), y.float()  # half matmul may be missing on CPU; dtype is what counts
        expected = promoted
    else:
        expected = torch.matmul(x, y).dtype
    assert promote_op("matmul", a, b) == dtypes.logical_dtype(expected)


def test_promote_op_rejects_unknown_ops():
    with pytest.raises(DtypeError, match="unknown op"):
        promote_op("frobnicate", torch.float32, torch.float32)


def test_sub_with_bool_is_refused_with_a_hint():
    with pytest.raises(DtypeError, match="logical_xor"):
        promote_op("sub", torch.bool, torch.bool)


# --------------------------------------------------------------------------------------------
# logical dtypes, scales, casts
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES + (torch.int16, torch.bfloat16))
def test_logical_dtype(dtype):
    expected = dtype if dtype.is_floating_point or dtype == torch.bool else torch.int64
    assert dtypes.logical_dtype(dtype) == expected
    assert dtypes.is_floating(dtype) == dtype.is_floating_point
    assert dtypes.is_integral(dtype) == (expected == torch.int64)
    assert dtypes.is_bool(dtype) == (dtype == torch.bool)
    assert dtypes.scale_for(dtype, 16) == (16 if dtype.is_floating_point else 0)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.qint8])
def test_unsupported_dtypes_raise_a_crypten_lite_error(dtype):
    with pytest.raises(DtypeError) as info:
        dtypes.logical_dtype(dtype)
    assert isinstance(info.value, CryptenLiteError) and isinstance(info.value, TypeError)
    assert str(dtype) in str(info.value)


CAST_TABLE = {
    (torch.float32, torch.float32): Cast.IDENTITY,
    (torch.float32, torch.float64): Cast.RETYPE,
    (torch.float32, torch.int32): Cast.TRUNCATE,
    (torch.float32, torch.bool): Cast.NONZERO,
    (torch.int64, torch.float32): Cast.SCALE_UP,
    (torch.int64, torch.int8): Cast.IDENTITY,
    (torch.int64, torch.bool): Cast.NONZERO,
    (torch.bool, torch.float32): Cast.SCALE_UP,
    (torch.bool, torch.int64): Cast.RETYPE,
    (torch.bool, torch.bool): Cast.IDENTITY,
}


@pytest.mark.parametrize(("src", "dst"), sorted(CAST_TABLE, key=str))
def test_cast_kind(src, dst):
    assert dtypes.cast_kind(src, dst) is CAST_TABLE[(src, dst)]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=20))
def test_reference_cast_is_torch_conversion(values):
    x = torch.tensor(values, dtype=torch.float64)
    assert torch.equal(dtypes.reference_cast(x, torch.int64), x.long())  # toward zero
    assert torch.equal(dtypes.reference_cast(x, torch.bool), x.bool())   # != 0
    assert torch.equal(dtypes.reference_cast(x, torch.float32), x.float())
    n = x.long()
    assert torch.equal(dtypes.reference_cast(n, torch.bool), n.bool())
    assert torch.equal(dtypes.reference_cast(n, torch.float64), n.double())


def test_reference_cast_truncates_toward_zero():
    x = torch.tensor([-2.7, -0.5, 0.5, 2.7])
    assert dtypes.reference_cast(x, torch.int64).tolist() == [-2, 0, 0, 2]


# --------------------------------------------------------------------------------------------
# The docs table is generated from the code
# --------------------------------------------------------------------------------------------

def test_docs_promotion_table_is_current():
    doc = pathlib.Path(__file__).parents[2] / "docs" / "names_and_types.md"
    assert dtypes.promotion_table_markdown() in doc.read_text(), (
        "docs/names_and_types.md is stale: paste the output of "
        "`python -c 'from crypten_lite.dtypes import promotion_table_markdown as t; "
        "print(t())'` into it")
