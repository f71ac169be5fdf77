"""QuantizedCrypTensor: secret-shared integers with a public scale and zero point.

Mirrors a torch quantized tensor: ``int_repr()``, ``q_scale()``, ``q_zero_point()``,
``q_per_channel_scales()``, ``q_per_channel_zero_points()``, ``q_per_channel_axis()``,
``qscheme()``, ``dequantize()``, and ``get_plain_text()`` which reveals a torch quantized
tensor. The integers are a CrypTensor of dtype int64 (scale 1); scales and zero points are
public, as in the programs of :mod:`crypten_lite.quantized`.

:func:`quantize_per_tensor` / :func:`quantize_per_channel` quantize a float CrypTensor in
MPC: ``clamp(round(x / scale) + zero_point, qmin, qmax)`` with the ratio
``2**-precision / scale`` as an integer multiplier and a power-of-two shift, the rounding
of :func:`crypten_lite.quantized.mpc_ops.round_shift` (ties to even where one can occur,
like torch) and short comparisons for the final clamp. Without a ``bound`` on ``|x|`` the
value is first clamped to the quantization range in fixed point with full 64-bit
comparisons; with ``bound`` every comparison is short.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from crypten_lite import torch_functions
from crypten_lite.cryptensor import CrypTensor, default_precision
from crypten_lite.errors import ProtocolError
from crypten_lite.mpc.protocol import open_, truncate
from crypten_lite.quantized import mpc_ops
from crypten_lite.quantized.ir import FIXED, Node, bits_for
from crypten_lite.quantized.requant import common_multipliers, tie_possible

QRANGES = {torch.quint8: (0, 255), torch.qint8: (-128, 127), torch.qint32: (-(1 << 31), (1 << 31) - 1)}
# Extra fractional bits of the public scale in dequantize(), removed by one truncation.
DEQUANT_EXTRA_BITS = 20
MULTIPLIER_BITS = 24


def dtype_for_range(lo: int, hi: int) -> torch.dtype:
    """The torch quantized dtype whose range holds [lo, hi]."""
    for dtype in (torch.quint8, torch.qint8):
        qmin, qmax = QRANGES[dtype]
        if qmin <= lo and hi <= qmax:
            return dtype
    return torch.qint32


class QuantizedCrypTensor:
    """Secret integers ``q`` with public ``scale`` / ``zero_point``: ``real = (q - zp) * scale``.

    Per tensor: ``scale`` a float, ``zero_point`` an int. Per channel: 1-D tensors of scales
    and zero points along ``axis``.
    """

    def __init__(self, int_repr: CrypTensor, scale, zero_point, dtype: torch.dtype = torch.quint8,
                 axis: int | None = None):
        if dtype not in QRANGES:
            raise ValueError(f"dtype must be one of {list(QRANGES)}, got {dtype}")
        self._int = int_repr
        self.dtype = dtype
        self.axis = axis
        if axis is None:
            self._scale = float(scale)
            self._zero_point = int(zero_point)
        else:
            self._scale = torch.as_tensor(scale, dtype=torch.float64).reshape(-1)
            self._zero_point = torch.as_tensor(zero_point, dtype=torch.int64).reshape(-1)
            if self._scale.numel() != int_repr.shape[axis] or self._zero_point.numel() != int_repr.shape[axis]:
                raise ValueError(f"{self._scale.numel()} scales / {self._zero_point.numel()} zero points "
                                 f"for {int_repr.shape[axis]} channels along axis {axis}")

    # --- torch's quantized-tensor API -----------------------------------------------
    @property
    def shape(self) -> torch.Size:
        return self._int.shape

    def size(self, dim: int | None = None):
        return self._int.size(dim)

    def dim(self) -> int:
        return self._int.dim()

    def numel(self) -> int:
        return self._int.numel()

    @property
    def is_quantized(self) -> bool:
        return True

    def qscheme(self) -> torch.qscheme:
        return torch.per_tensor_affine if self.axis is None else torch.per_channel_affine

    def int_repr(self) -> CrypTensor:
        """The secret integers (an int64 CrypTensor)."""
        return self._int

    def q_scale(self) -> float:
        self._per_tensor("q_scale")
        return self._scale

    def q_zero_point(self) -> int:
        self._per_tensor("q_zero_point")
        return self._zero_point

    def q_per_channel_scales(self) -> torch.Tensor:
        self._per_channel("q_per_channel_scales")
        return self._scale.clone()

    def q_per_channel_zero_points(self) -> torch.Tensor:
        self._per_channel("q_per_channel_zero_points")
        return self._zero_point.clone()

    def q_per_channel_axis(self) -> int:
        self._per_channel("q_per_channel_axis")
        return self.axis

    def dequantize(self, precision: int | None = None) -> CrypTensor:
        """``(q - zero_point) * scale`` as a float CrypTensor (one truncation, error 2**-precision)."""
        p = default_precision() if precision is None else precision
        zp, scale = self._channel_view(self._zero_point), self._channel_view(self._scale)
        centred = self._int.share - mpc_ops.public_share(zp, self._int.share)
        factor = torch.round(torch.as_tensor(scale, dtype=torch.float64) * 2.0 ** (p + DEQUANT_EXTRA_BITS))
        share = truncate(centred * factor.to(torch.int64), DEQUANT_EXTRA_BITS)
        return CrypTensor(share, p, torch.float32)

    def get_plain_text(self, dst: int | None = None) -> torch.Tensor | None:
        """Reveal as a torch quantized tensor (to every party, or to ``dst`` only)."""
        q = open_(self._int.share, dst)
        if q is None:
            return None
        if self.axis is None:
            return torch._make_per_tensor_quantized_tensor(q.to(_int_dtype(self.dtype)), self._scale,
                                                           self._zero_point)
        return torch._make_per_channel_quantized_tensor(q.to(_int_dtype(self.dtype)), self._scale,
                                                        self._zero_point, self.axis)

    def __repr__(self) -> str:
        if self.axis is None:
            q = f"scale={self._scale:.6g}, zero_point={self._zero_point}"
        else:
            q = f"per-channel axis={self.axis}, {self._scale.numel()} channels"
        return f"QuantizedCrypTensor(shape={list(self.shape)}, dtype={self.dtype}, {q})"

    # --- helpers --------------------------------------------------------------------
    def _per_tensor(self, what: str) -> None:
        if self.axis is not None:
            raise RuntimeError(f"{what}() is for per-tensor quantization; this tensor is per channel "
                               "(use q_per_channel_scales / q_per_channel_zero_points)")

    def _per_channel(self, what: str) -> None:
        if self.axis is None:
            raise RuntimeError(f"{what}() is for per-channel quantization; this tensor is per tensor")

    def _channel_view(self, v):
        if self.axis is None:
            return v
        shape = [1] * self.dim()
        shape[self.axis] = -1
        return v.reshape(shape)


def _int_dtype(dtype: torch.dtype) -> torch.dtype:
    return {torch.quint8: torch.uint8, torch.qint8: torch.int8, torch.qint32: torch.int32}[dtype]


# ---------------------------------------------------------------------- quantize in MPC
def _quantize_share(x: CrypTensor, scales: Sequence[float], zero_points: Sequence[int], qmin: int, qmax: int,
                    view: Sequence[int], bound: float | None) -> torch.Tensor:
    """Shares of clamp(round(x / scale) + zp, qmin, qmax), channel constants shaped ``view``."""
    p = x.precision
    enc = x.share
    scales_t = torch.tensor(list(scales), dtype=torch.float64)
    zps = [int(z) for z in zero_points]

    def public(values):
        t = torch.tensor(values, dtype=torch.int64)
        return int(t[0]) if len(values) == 1 else t.reshape(list(view))

    # fixed-point bounds past which the result is qmin / qmax anyway
    lo_x = [math.floor((qmin - z - 1) * s * 2.0 ** p) for s, z in zip(scales_t.tolist(), zps)]
    hi_x = [math.ceil((qmax - z + 1) * s * 2.0 ** p) for s, z in zip(scales_t.tolist(), zps)]
    if bound is None:
        enc = mpc_ops.clamp(enc, public(lo_x), public(hi_x), 62)
        x_lo, x_hi = min(lo_x), max(hi_x)
    else:
        b = math.ceil(float(bound) * 2.0 ** p) + 1
        x_lo, x_hi = -b, b
    x_bits = bits_for(x_lo, x_hi)
    m_bits = min(MULTIPLIER_BITS, mpc_ops.MAX_BITS - x_bits)
    if m_bits < 8:
        raise ProtocolError(f"quantize: {x_bits}-bit inputs leave no room for the multiplier; pass a smaller bound")
    ms, shift = common_multipliers([2.0 ** -p / s for s in scales_t.tolist()], m_bits)
    v = enc * public(ms)
    v_bits = bits_for(min(x_lo * m for m in ms), max(x_hi * m for m in ms))
    ties = any(tie_possible(m, shift, 0, x_lo, x_hi) for m in ms)
    t = mpc_ops.round_shift(v, shift, v_bits, "half_even" if ties else "half_up")
    t = t + mpc_ops.public_share(public(zps), t)
    t_lo = min(min(x_lo * m for m in ms) >> shift, 0) + min(zps)
    t_hi = -((-max(x_hi * m for m in ms)) >> shift) + max(zps)
    return mpc_ops.clamp(t, qmin, qmax, bits_for(t_lo - 1, t_hi + 1))


def quantize_per_tensor(x: CrypTensor, scale: float, zero_point: int, dtype: torch.dtype,
                        bound: float | None = None) -> QuantizedCrypTensor:
    """``torch.quantize_per_tensor`` on a CrypTensor, in MPC (result within one step of torch's).

    ``bound``: a public bound on ``|x|`` that makes every comparison short; without it ``x``
    is first clamped with full-width comparisons.
    """
    qmin, qmax = _qrange(dtype)
    share = _quantize_share(_float(x), [scale], [zero_point], qmin, qmax, (), bound)
    return QuantizedCrypTensor(CrypTensor(share, 0, torch.int64), scale, zero_point, dtype)


def quantize_per_channel(x: CrypTensor, scales, zero_points, axis: int, dtype: torch.dtype,
                         bound: float | None = None) -> QuantizedCrypTensor:
    """``torch.quantize_per_channel`` on a CrypTensor, in MPC (scales / zero points along ``axis``)."""
    qmin, qmax = _qrange(dtype)
    scales = torch.as_tensor(scales, dtype=torch.float64).reshape(-1)
    zps = torch.as_tensor(zero_points, dtype=torch.int64).reshape(-1)
    axis = axis % x.dim()
    if scales.numel() != x.shape[axis] or zps.numel() != x.shape[axis]:
        raise ValueError(f"quantize_per_channel: {scales.numel()} scales and {zps.numel()} zero points "
                         f"for {x.shape[axis]} channels along axis {axis}")
    view = [1] * x.dim()
    view[axis] = -1
    share = _quantize_share(_float(x), scales.tolist(), zps.tolist(), qmin, qmax, view, bound)
    return QuantizedCrypTensor(CrypTensor(share, 0, torch.int64), scales, zps, dtype, axis)


def dequantize(q: QuantizedCrypTensor) -> CrypTensor:
    """``torch.dequantize`` of a QuantizedCrypTensor."""
    return q.dequantize()


def _qrange(dtype: torch.dtype) -> tuple[int, int]:
    if dtype not in QRANGES:
        raise ValueError(f"dtype must be one of {list(QRANGES)}, got {dtype}")
    return QRANGES[dtype]


def _float(x: CrypTensor) -> CrypTensor:
    if not isinstance(x, CrypTensor):
        raise TypeError(f"expected a CrypTensor, got {type(x).__name__}")
    return x


def encode_private_input(node: Node, x: CrypTensor) -> torch.Tensor:
    """Shares of a program's encoded input from a CrypTensor every party holds."""
    a = node.attrs
    if a["kind"] == FIXED:
        # The program's bounds assume the input range (executor.input_range); a secret input
        # cannot be checked there, so it is clamped into it first (two full-width comparisons
        # per element), at the CrypTensor's own precision so that the shift cannot overflow.
        shift = a["frac_bits"] - x.precision
        lo, hi = node.out.lo, node.out.hi
        if shift >= 0:
            bounds = (-((-lo) >> shift), hi >> shift)  # within [lo, hi] once shifted back
        else:
            bounds = (lo << -shift, hi << -shift)
        share = mpc_ops.clamp(x.share, bounds[0], bounds[1], 62)
        if shift >= 0:
            return share << shift
        return mpc_ops.round_shift(share, -shift, mpc_ops.MAX_BITS, "half_up")
    dtype = torch.quint8 if a["qmin"] >= 0 else torch.qint8
    q = quantize_per_tensor(x, a["scale"], a["zero_point"], dtype)
    if (a["qmin"], a["qmax"]) != QRANGES[dtype]:
        return mpc_ops.clamp(q.int_repr().share, a["qmin"], a["qmax"], 9)
    return q.int_repr().share


def _torch_quantize_per_tensor(x, scale, zero_point, dtype):
    return quantize_per_tensor(x, float(scale), int(zero_point), dtype)


def _torch_quantize_per_channel(x, scales, zero_points, axis, dtype):
    return quantize_per_channel(x, scales, zero_points, axis, dtype)


# Importing this module attaches the methods to CrypTensor and lets torch's functions take a
# CrypTensor (as crypten_lite.functions does): x.quantize_per_tensor(0.1, 0, torch.quint8),
# torch.quantize_per_tensor(x, 0.1, 0, torch.quint8).
METHODS = {"quantize_per_tensor": quantize_per_tensor, "quantize_per_channel": quantize_per_channel}
TORCH = {torch.quantize_per_tensor: _torch_quantize_per_tensor,
         torch.quantize_per_channel: _torch_quantize_per_channel}
for _name, _fn in METHODS.items():
    setattr(CrypTensor, _name, _fn)
for _func, _impl in TORCH.items():
    torch_functions.register(_func, _impl)

__all__ = ["METHODS", "QuantizedCrypTensor", "TORCH", "dequantize", "dtype_for_range", "encode_private_input",
           "quantize_per_channel", "quantize_per_tensor"]
