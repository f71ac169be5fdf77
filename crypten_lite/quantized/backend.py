"""The operations a quantized program needs, and their exact plaintext implementation.

A :class:`Backend` holds integer tensors in its own representation (``Value``: a torch
int64 tensor for :class:`PlainBackend`, secret shares for an MPC backend) and implements
the small set of integer operations below. Every operation is something MPC can do:

* local (no communication in MPC): :meth:`~Backend.add`, :meth:`~Backend.sub`,
  :meth:`~Backend.add_public`, :meth:`~Backend.mul_public`, :meth:`~Backend.sum_pool2d`,
  :meth:`~Backend.cat`, :meth:`~Backend.reshape`, :meth:`~Backend.permute`,
  :meth:`~Backend.index_select`;
* multiplications (Beaver triples): :meth:`~Backend.mul`, :meth:`~Backend.matmul`,
  :meth:`~Backend.conv2d` (the weight is a secret :meth:`~Backend.weight`);
* truncation by a public power of two: :meth:`~Backend.truncate`;
* comparisons: :meth:`~Backend.clamp`, :meth:`~Backend.max_pool2d`.

Public arguments (shifts, multipliers, bounds, shapes) are plain Python ints or torch
tensors. Comparisons and truncations carry a ``bits`` hint: every element of the input
satisfies ``-2**bits <= x < 2**bits`` (a sound static bound computed by the converter), so
an MPC backend can compare on ``bits + 1`` bits instead of the whole ring; for int8 values
that is about 9 to 20 bits instead of 64.
"""

from __future__ import annotations

import abc
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from crypten_lite.errors import ProtocolError
from crypten_lite.quantized.ir import Rescale

Value = Any  # a backend's tensor type
Public = int | torch.Tensor

_EXACT_FLOAT_BITS = 52  # int64 values this small are exact in float64


class Backend(abc.ABC):
    """Integer tensor operations used by :func:`crypten_lite.quantized.executor.run`.

    All values are integer tensors; ``Value`` is the backend's own type. Every method
    mirrors torch semantics on int64 tensors except where stated.
    """

    # --- data in and out -------------------------------------------------------------
    @abc.abstractmethod
    def input(self, x: torch.Tensor) -> Value:
        """The data owner's plaintext int64 tensor (already quantized) as a backend value."""

    @abc.abstractmethod
    def weight(self, w: torch.Tensor) -> Value:
        """A model owner's plaintext int64 parameter as a backend value (secret in MPC).

        Called once per weight per :func:`run`; an MPC backend may memoize by ``id(w)``.
        """

    @abc.abstractmethod
    def reveal(self, x: Value) -> torch.Tensor:
        """The plaintext int64 tensor."""

    @abc.abstractmethod
    def shape(self, x: Value) -> torch.Size:
        """Public shape of a value."""

    # --- local linear operations ----------------------------------------------------
    @abc.abstractmethod
    def add(self, x: Value, y: Value) -> Value:
        """``x + y`` (broadcasting; ``y`` may be a weight such as a bias)."""

    @abc.abstractmethod
    def sub(self, x: Value, y: Value) -> Value:
        """``x - y``."""

    @abc.abstractmethod
    def add_public(self, x: Value, c: Public) -> Value:
        """``x + c`` for a public int or int64 tensor ``c`` (broadcasting)."""

    @abc.abstractmethod
    def mul_public(self, x: Value, c: Public) -> Value:
        """``x * c`` for a public int or int64 tensor ``c`` (broadcasting)."""

    # --- multiplications ------------------------------------------------------------
    @abc.abstractmethod
    def mul(self, x: Value, y: Value) -> Value:
        """Elementwise ``x * y`` of two backend values."""

    @abc.abstractmethod
    def matmul(self, x: Value, w: Value) -> Value:
        """``x @ w``: ``x`` is ``(..., K)``, ``w`` a weight ``(K, O)``."""

    @abc.abstractmethod
    def conv2d(
        self,
        x: Value,
        w: Value,
        stride: tuple[int, int],
        padding: tuple[int, int],
        dilation: tuple[int, int],
        groups: int,
    ) -> Value:
        """``torch.nn.functional.conv2d(x, w, None, ...)`` with zero padding, no bias."""

    # --- truncation and comparisons -------------------------------------------------
    @abc.abstractmethod
    def truncate(self, x: Value, shift: int, bits: int, rounding: str) -> Value:
        """``round(x / 2**shift)``; ``-2**bits <= x < 2**bits``.

        ``rounding="half_up"``: ``floor((x + 2**(shift-1)) / 2**shift)`` (arithmetic shift
        of ``x`` plus half). ``rounding="half_even"``: ties go to the even result, as torch's
        ``nearbyint``; the converter asks for it only where an exact tie can occur.
        """

    @abc.abstractmethod
    def clamp(self, x: Value, lo: int | None, hi: int | None, bits: int) -> Value:
        """``min(max(x, lo), hi)`` with public bounds (None: unbounded side).

        ``-2**bits <= x < 2**bits``, so ``x - lo`` and ``hi - x`` fit in ``bits + 2`` bits.
        """

    @abc.abstractmethod
    def max_pool2d(
        self,
        x: Value,
        kernel_size: tuple[int, int],
        stride: tuple[int, int],
        padding: tuple[int, int],
        dilation: tuple[int, int],
        ceil_mode: bool,
        bits: int,
    ) -> Value:
        """``torch.nn.functional.max_pool2d``; padding never wins; ``|x|`` as in clamp."""

    # --- local data movement --------------------------------------------------------
    @abc.abstractmethod
    def sum_pool2d(
        self,
        x: Value,
        kernel_size: tuple[int, int],
        stride: tuple[int, int],
        padding: tuple[int, int],
        ceil_mode: bool,
    ) -> Value:
        """Window sums with zero padding (``avg_pool2d`` times the window size)."""

    @abc.abstractmethod
    def cat(self, xs: Sequence[Value], dim: int) -> Value:
        """``torch.cat``."""

    @abc.abstractmethod
    def reshape(self, x: Value, shape: Sequence[int]) -> Value:
        """``torch.reshape``."""

    @abc.abstractmethod
    def permute(self, x: Value, dims: Sequence[int]) -> Value:
        """``torch.permute``."""

    @abc.abstractmethod
    def index_select(self, x: Value, dim: int, index: torch.Tensor) -> Value:
        """``torch.index_select`` with a public int64 index."""

    # --- composite (a backend may fuse the steps) -------------------------------------
    def rescale(self, v: Value, rs: Rescale, bias: Value | None = None) -> Value:
        """``clamp(round((v' * multiplier + bias) / 2**shift) + offset, lo, hi)`` (an
        :class:`~crypten_lite.quantized.ir.Rescale`), step by step with the methods above.

        An MPC backend may override it to overlap the truncation and the clamp's comparisons.
        """
        if rs.pre_shift:
            v = self.truncate(v, rs.pre_shift, rs.pre_bits, "half_up")
        if not (isinstance(rs.multiplier, int) and rs.multiplier == 1):
            v = self.mul_public(v, rs.multiplier)
        if bias is not None:
            v = self.add(v, bias)
        if rs.shift:
            v = self.truncate(v, rs.shift, rs.in_bits, rs.rounding)
        if rs.offset:
            v = self.add_public(v, rs.offset)
        if rs.lo is not None or rs.hi is not None:
            v = self.clamp(v, rs.lo, rs.hi, rs.out_bits)
        return v


class PlainBackend(Backend):
    """Exact int64 arithmetic on plaintext torch tensors: the reference backend.

    With ``check_bits=True`` (the default) every ``bits`` hint is verified and a violation
    raises :class:`~crypten_lite.errors.ProtocolError`, which tests the converter's bounds.
    """

    def __init__(self, check_bits: bool = True):
        self.check_bits = check_bits

    def _check(self, x: torch.Tensor, bits: int, op: str) -> None:
        if not self.check_bits or x.numel() == 0:
            return
        lo, hi = (int(v) for v in torch.aminmax(x))
        if lo < -(1 << bits) or hi >= (1 << bits):
            raise ProtocolError(
                f"{op}: values in [{lo}, {hi}] exceed the declared {bits}-bit bound "
                f"{list(x.shape)}; the converter's bound is wrong"
            )

    @staticmethod
    def _int(x: torch.Tensor, op: str) -> torch.Tensor:
        if x.dtype != torch.int64:
            raise TypeError(f"{op}: PlainBackend works on int64 tensors, got {x.dtype}")
        return x

    def input(self, x: torch.Tensor) -> torch.Tensor:
        return self._int(x, "input").clone()

    def weight(self, w: torch.Tensor) -> torch.Tensor:
        return self._int(w, "weight")

    def reveal(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def shape(self, x: torch.Tensor) -> torch.Size:
        return x.shape

    def add(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y

    def sub(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x - y

    def add_public(self, x: torch.Tensor, c: Public) -> torch.Tensor:
        return x + c

    def mul_public(self, x: torch.Tensor, c: Public) -> torch.Tensor:
        return x * c

    def mul(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * y

    def matmul(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if _float_exact(x, w, w.shape[0]):
            return torch.matmul(x.to(torch.float64), w.to(torch.float64)).round().to(torch.int64)
        return torch.matmul(x, w)

    def conv2d(self, x, w, stride, padding, dilation, groups):
        if _float_exact(x, w, w[0].numel()):  # float64 kernels are much faster than int64 ones
            y = F.conv2d(x.to(torch.float64), w.to(torch.float64), None, stride, padding, dilation, groups)
            return y.round().to(torch.int64)
        return F.conv2d(x, w, None, stride, padding, dilation, groups)

    def truncate(self, x: torch.Tensor, shift: int, bits: int, rounding: str) -> torch.Tensor:
        self._check(x, bits, "truncate")
        if shift == 0:
            return x
        half = 1 << (shift - 1)
        if rounding == "half_up":
            return (x + half) >> shift
        if rounding != "half_even":
            raise ValueError(f"unknown rounding {rounding!r}")
        q = x >> shift
        r = x - (q << shift)
        return q + ((r > half) | ((r == half) & (q & 1).bool())).to(torch.int64)

    def clamp(self, x: torch.Tensor, lo: int | None, hi: int | None, bits: int) -> torch.Tensor:
        self._check(x, bits, "clamp")
        return torch.clamp(x, lo, hi)

    def max_pool2d(self, x, kernel_size, stride, padding, dilation, ceil_mode, bits):
        self._check(x, bits, "max_pool2d")
        if bits > _EXACT_FLOAT_BITS:
            raise ProtocolError(f"max_pool2d: {bits}-bit values are not exact in float64")
        y = F.max_pool2d(x.to(torch.float64), kernel_size, stride, padding, dilation, ceil_mode)
        return y.to(torch.int64)

    def sum_pool2d(self, x, kernel_size, stride, padding, ceil_mode):
        kh, kw = kernel_size
        ph, pw = padding
        # pad with zeros explicitly, then a stride-s conv with a ones kernel per channel
        # (exact in int64, unlike avg_pool2d which is float only)
        c = x.shape[1]
        ones = torch.ones(c, 1, kh, kw, dtype=torch.int64)
        h_out = _pool_out(x.shape[2], kh, stride[0], ph, ceil_mode)
        w_out = _pool_out(x.shape[3], kw, stride[1], pw, ceil_mode)
        extra_h = max(0, (h_out - 1) * stride[0] + kh - (x.shape[2] + 2 * ph))
        extra_w = max(0, (w_out - 1) * stride[1] + kw - (x.shape[3] + 2 * pw))
        xp = F.pad(x, (pw, pw + extra_w, ph, ph + extra_h))
        return self.conv2d(xp, ones, tuple(stride), (0, 0), (1, 1), c)

    def cat(self, xs: Sequence[torch.Tensor], dim: int) -> torch.Tensor:
        return torch.cat(list(xs), dim)

    def reshape(self, x: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
        return x.reshape(list(shape))

    def permute(self, x: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
        return x.permute(list(dims))

    def index_select(self, x: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
        return torch.index_select(x, dim, index)


def _float_exact(x: torch.Tensor, w: torch.Tensor, fan_in: int) -> bool:
    """Whether every product sum of x and w is an integer below 2**53 (exact in float64)."""
    if x.numel() == 0 or w.numel() == 0:
        return True
    bound = int(x.abs().max()) * int(w.abs().max()) * fan_in
    return bound < 1 << _EXACT_FLOAT_BITS


def _pool_out(size: int, k: int, s: int, p: int, ceil_mode: bool) -> int:
    """Output length of a pooling window, as torch computes it."""
    num = size + 2 * p - k
    out = (-(-num // s) if ceil_mode else num // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:  # last window must start inside the input
        out -= 1
    return out
