"""Logical dtypes of a CrypTensor and torch's type promotion, as pure functions.

A CrypTensor's shares are always int64 ring elements; its *logical* dtype says what the
shares mean and what ``get_plain_text()`` returns (docs/design.md section 7):

- a floating dtype (torch.float32 by default; float64 / float16 / bfloat16 are kept as
  given): fixed point with ``precision`` fractional bits;
- torch.int64 (every integer dtype maps here): scale 1;
- torch.bool: 0 / 1 at scale 1.

Mixed operations follow ``torch.result_type``. Rather than re-deriving torch's category
rules (tensors vs 0-dim tensors vs Python scalars), :func:`result_type` asks torch itself,
on tiny dummy tensors of the right dtype and dimensionality: it is exact by construction,
pure, and cheap (cached). :func:`promote_op` adds the per-op rules (true division of
integers gives a float, comparisons give bool...) and maps the result to a logical dtype.

Errors are :class:`DtypeError`.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Any, Literal

import torch

from .errors import CryptenLiteError

__all__ = [
    "Cast", "DtypeError", "FAMILIES", "OP_FAMILY", "Operand", "OperandLike", "cast_kind",
    "is_bool", "is_floating", "is_integral", "logical_dtype", "operand", "promote_op",
    "promotion_table_markdown", "reference_cast", "result_type", "scale_for",
]


class DtypeError(CryptenLiteError, TypeError):
    """A dtype a CrypTensor cannot hold, or a dtype combination an op does not accept."""


_INTEGRAL = frozenset(
    getattr(torch, name) for name in
    ("uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64")
    if hasattr(torch, name))


def is_floating(dtype: torch.dtype) -> bool:
    """True for floating dtypes (stored in fixed point)."""
    return dtype.is_floating_point


def is_integral(dtype: torch.dtype) -> bool:
    """True for integer dtypes, signed or not (bool is not integral here)."""
    return dtype in _INTEGRAL


def is_bool(dtype: torch.dtype) -> bool:
    """True for torch.bool."""
    return dtype == torch.bool


def logical_dtype(dtype: torch.dtype) -> torch.dtype:
    """The logical dtype a CrypTensor uses for values of `dtype`.

    Floating dtypes are kept (so ``get_plain_text()`` gives back the dtype given), integer
    dtypes become torch.int64, bool stays bool. Complex, quantized and sub-byte dtypes raise.
    """
    if dtype.is_floating_point:
        return dtype
    if dtype in _INTEGRAL:
        return torch.int64
    if dtype == torch.bool:
        return torch.bool
    raise DtypeError(
        f"a CrypTensor cannot hold dtype {dtype}; supported: floating dtypes (fixed point), "
        "integer dtypes (as int64) and bool. Convert the input first, e.g. with .float()")


def scale_for(dtype: torch.dtype, precision: int) -> int:
    """Fractional bits of the encoding of `dtype`: `precision` for floats, 0 for int / bool."""
    return precision if logical_dtype(dtype).is_floating_point else 0


# --------------------------------------------------------------------------------------------
# Operands and torch.result_type
# --------------------------------------------------------------------------------------------

Kind = Literal["tensor", "zero_dim", "scalar"]


@dataclass(frozen=True)
class Operand:
    """What type promotion needs to know about one operand.

    `kind` is "tensor" (at least 1 dim, private or public), "zero_dim" (a 0-dim tensor) or
    "scalar" (a Python bool / int / float; `dtype` is then torch.bool / int64 / float64).
    """

    dtype: torch.dtype
    kind: Kind = "tensor"


OperandLike = Operand | torch.dtype | bool | int | float | type | Any
"""Accepted by :func:`operand`: an Operand; a torch.dtype (an n-dim tensor of that dtype);
a Python scalar or the type bool / int / float; or any object with ``dtype`` and ``dim()``
or ``ndim`` (a torch.Tensor, a CrypTensor)."""

_SCALAR_DTYPES = {bool: torch.bool, int: torch.int64, float: torch.float64}
_SCALAR_VALUES = {torch.bool: False, torch.int64: 0, torch.float64: 0.0}


def operand(x: OperandLike) -> Operand:
    """Describe `x` as an :class:`Operand` (see :data:`OperandLike`)."""
    if isinstance(x, Operand):
        return x
    if isinstance(x, torch.dtype):
        return Operand(x, "tensor")
    if isinstance(x, type) and x in _SCALAR_DTYPES:
        return Operand(_SCALAR_DTYPES[x], "scalar")
    for python_type in (bool, int, float):  # bool first: bool is a subclass of int
        if isinstance(x, python_type):
            return Operand(_SCALAR_DTYPES[python_type], "scalar")
    dtype = getattr(x, "dtype", None)
    if isinstance(dtype, torch.dtype):
        ndim = x.dim() if callable(getattr(x, "dim", None)) else getattr(x, "ndim", None)
        if isinstance(ndim, int):
            return Operand(dtype, "zero_dim" if ndim == 0 else "tensor")
    raise DtypeError(
        f"cannot use {type(x).__name__} as an operand; expected a tensor, a torch.dtype or "
        "a Python bool / int / float")


def _dummy(op: Operand) -> torch.Tensor | bool | int | float:
    if op.kind == "scalar":
        if op.dtype not in _SCALAR_VALUES:
            raise DtypeError(f"a Python scalar operand has dtype bool, int64 or float64, "
                             f"not {op.dtype}")
        return _SCALAR_VALUES[op.dtype]
    return torch.zeros(() if op.kind == "zero_dim" else (1,), dtype=op.dtype)


@functools.lru_cache(maxsize=1024)
def _result_type(a: Operand, b: Operand, default: torch.dtype) -> torch.dtype:
    del default  # part of the cache key only: torch's answer depends on the default dtype
    return torch.result_type(_dummy(a), _dummy(b))


def result_type(a: OperandLike, b: OperandLike) -> torch.dtype:
    """Exactly ``torch.result_type`` of two operands (no mapping to a logical dtype)."""
    return _result_type(operand(a), operand(b), torch.get_default_dtype())


# --------------------------------------------------------------------------------------------
# Per-op promotion
# --------------------------------------------------------------------------------------------

FAMILIES = ("arithmetic", "true_divide", "floor_divide", "comparison", "logical", "matmul")
"""Op families :func:`promote_op` knows; see :data:`OP_FAMILY` for op names."""

OP_FAMILY: dict[str, str] = {
    **{f: f for f in FAMILIES},
    "add": "arithmetic", "sub": "arithmetic", "mul": "arithmetic", "rsub": "arithmetic",
    "div": "true_divide", "truediv": "true_divide",
    "floordiv": "floor_divide",
    **{op: "comparison" for op in ("eq", "ne", "lt", "le", "gt", "ge")},
    **{op: "logical" for op in ("logical_and", "logical_or", "logical_xor")},
    "mm": "matmul", "bmm": "matmul", "mv": "matmul", "dot": "matmul",
}
"""Op name (or family name) -> family."""


def _fail(op: str, a: Operand, b: Operand, why: str) -> DtypeError:
    return DtypeError(f"{op}: {why} (operands: {a.kind} of {a.dtype}, {b.kind} of {b.dtype})")


def promote_op(op: str, a: OperandLike, b: OperandLike) -> torch.dtype:
    """Logical dtype of ``op(a, b)``; `op` is a family of :data:`FAMILIES` or an op name.

    - arithmetic (add, sub, mul): ``result_type``; "sub" / "rsub" refuse bool operands, as
      torch does.
    - true_divide (div): ``result_type``, but integers and bools give the default float
      dtype.
    - floor_divide: ``result_type``; two bools are refused (torch has no bool kernel).
    - comparison (eq, ne, lt, le, gt, ge) and logical (logical_and / or / xor): bool.
    - matmul (mm, bmm, mv, dot): both operands must be tensors of at least 1 dim. torch
      requires equal dtypes; crypten_lite promotes with ``result_type`` instead. A bool
      result is refused.

    The torch dtype is mapped with :func:`logical_dtype` (e.g. int8 -> int64).
    """
    if op not in OP_FAMILY:
        raise DtypeError(f"unknown op {op!r} for type promotion; known: {sorted(OP_FAMILY)}")
    family = OP_FAMILY[op]
    x, y = operand(a), operand(b)
    if family in ("comparison", "logical"):
        result_type(x, y)  # still refuses dtypes torch cannot promote
        return torch.bool
    if family == "matmul" and (x.kind != "tensor" or y.kind != "tensor"):
        raise _fail(op, x, y, "both operands must be tensors of at least 1 dim")
    if op in ("sub", "rsub") and torch.bool in (x.dtype, y.dtype):
        raise _fail(op, x, y, "subtraction with a bool operand is not supported; use "
                              "logical_xor for two bools, or convert with .long() first")
    dtype = result_type(x, y)
    if family == "true_divide" and not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    if family == "floor_divide" and dtype == torch.bool:
        raise _fail(op, x, y, "floor division of two bools is not supported; convert with "
                              ".long() first")
    if family == "matmul" and dtype == torch.bool:
        raise _fail(op, x, y, "matmul of bools is not supported; convert with .long() first")
    return logical_dtype(dtype)


# --------------------------------------------------------------------------------------------
# Conversions (.float(), .long(), .bool(), .to(dtype))
# --------------------------------------------------------------------------------------------

class Cast(enum.Enum):
    """What converting a CrypTensor between logical dtypes does to its fixed-point encoding."""

    IDENTITY = "identity"  # same logical dtype: nothing to do
    RETYPE = "retype"      # same encoding, new presented dtype (float -> float, bool -> int)
    SCALE_UP = "scale_up"  # int / bool -> float: multiply the encoding by 2^precision
    TRUNCATE = "truncate"  # float -> int: divide by 2^precision rounding toward zero
    NONZERO = "nonzero"    # int / float -> bool: x != 0


def cast_kind(src: torch.dtype, dst: torch.dtype) -> Cast:
    """The :class:`Cast` from logical dtype `src` to (the logical dtype of) `dst`.

    Semantics are torch's: ``.long()`` of a float truncates toward zero, ``.bool()`` is
    ``!= 0``. Note that with fixed point a float smaller than 2^-precision in magnitude is
    already 0, so ``.bool()`` of it is False.
    """
    src, dst = logical_dtype(src), logical_dtype(dst)
    if src == dst:
        return Cast.IDENTITY
    if dst == torch.bool:
        return Cast.NONZERO
    if dst.is_floating_point:
        return Cast.RETYPE if src.is_floating_point else Cast.SCALE_UP
    return Cast.TRUNCATE if src.is_floating_point else Cast.RETYPE


def reference_cast(values: torch.Tensor, dst: torch.dtype) -> torch.Tensor:
    """Plaintext reference of a conversion to `dst` (what the secure version must return)."""
    dst = logical_dtype(dst)
    kind = cast_kind(values.dtype, dst)
    if kind is Cast.NONZERO:
        return values != 0
    if kind is Cast.TRUNCATE:
        return torch.trunc(values).to(dst)
    return values.to(dst)


# --------------------------------------------------------------------------------------------
# Documentation table
# --------------------------------------------------------------------------------------------

_ROW_OPERANDS = {
    "private bool": Operand(torch.bool), "private int64": Operand(torch.int64),
    "private float32": Operand(torch.float32),
}
_COLUMN_OPERANDS = {
    "bool tensor": Operand(torch.bool), "int64 tensor": Operand(torch.int64),
    "float32 tensor": Operand(torch.float32), "float64 tensor": Operand(torch.float64),
    "0-dim int64": Operand(torch.int64, "zero_dim"),
    "0-dim float64": Operand(torch.float64, "zero_dim"),
    "`True`": Operand(torch.bool, "scalar"), "`2`": Operand(torch.int64, "scalar"),
    "`2.5`": Operand(torch.float64, "scalar"),
}


def _cell(op: str, a: Operand, b: Operand) -> str:
    try:
        return str(promote_op(op, a, b)).removeprefix("torch.")
    except DtypeError:
        return "error"


def promotion_table_markdown(ops: tuple[str, ...] = ("add", "sub", "div", "floor_divide")
                             ) -> str:
    """Markdown tables of :func:`promote_op` for a private left operand (docs generator)."""
    header = "| left \\ right | " + " | ".join(_COLUMN_OPERANDS) + " |"
    rule = "|" + "---|" * (len(_COLUMN_OPERANDS) + 1)
    parts = []
    for op in ops:
        rows = [f"| {name} | " + " | ".join(_cell(op, a, b) for b in _COLUMN_OPERANDS.values())
                + " |" for name, a in _ROW_OPERANDS.items()]
        parts.append("\n".join([f"`{op}`:", "", header, rule, *rows]))
    return "\n\n".join(parts) + "\n"
