"""Fixed-point encoding into the ring Z_2^64 (held as torch.int64, wrapping arithmetic).

A real value v is encoded as round(v * 2^precision); integer and bool tensors use scale 1.
Pure functions: no session, no randomness.
"""

from __future__ import annotations

import torch

from .errors import ProtocolError

RING_BITS = 64
# Largest magnitude an encoded value may have so that a product of two fits the ring with
# room for the truncation: encoded values must stay below 2^62 in magnitude.
MAX_ENCODED = 2 ** 62


def scale_of(precision: int) -> int:
    """Scale 2^precision of a fixed-point encoding."""
    return 1 << precision


def encode(tensor: torch.Tensor | float | int, precision: int) -> torch.Tensor:
    """Encode a real or integer tensor as int64 ring elements at `precision` fractional bits.

    Raises ProtocolError (without the values) if any element is outside the encodable range.
    """
    t = torch.as_tensor(tensor)
    if t.dtype == torch.bool:
        t = t.long()
    if not t.is_floating_point() and not t.is_complex():
        t = t.long()
        if precision == 0:
            return t.clone()
        limit = MAX_ENCODED >> precision
        if t.numel() and (t.abs().max() >= limit):
            raise ProtocolError(
                f"integer input out of the fixed-point range: |x| must be < 2^{62 - precision} "
                f"at precision {precision}; lower the precision or rescale the input")
        return t * scale_of(precision)
    t = t.double()
    if not torch.isfinite(t).all():
        raise ProtocolError("input contains NaN or infinity; only finite values can be encoded")
    scaled = torch.round(t * scale_of(precision))
    if scaled.numel() and scaled.abs().max() >= MAX_ENCODED:
        raise ProtocolError(
            f"input out of the fixed-point range: |x| must be < 2^{62 - precision} at precision "
            f"{precision} (largest magnitude allowed {2.0 ** (62 - precision):.3g}); "
            "rescale the input or lower the precision")
    return scaled.long()


def decode(encoded: torch.Tensor, precision: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode int64 ring elements at `precision` fractional bits into `dtype`."""
    if dtype == torch.bool:
        return encoded != 0
    if not dtype.is_floating_point:
        if precision == 0:
            return encoded.to(dtype)
        # Integer result of a scaled encoding: round to nearest.
        return torch.div(encoded + (1 << (precision - 1)), scale_of(precision),
                         rounding_mode="floor").to(dtype)
    if precision == 0:
        return encoded.to(dtype)
    # Split into integer and fractional parts so float64 keeps every bit of large values.
    high = torch.div(encoded, scale_of(precision), rounding_mode="floor")
    low = encoded - high * scale_of(precision)
    return (high.double() + low.double() / scale_of(precision)).to(dtype)


def wrap_add(*terms: torch.Tensor) -> torch.Tensor:
    """Sum in Z_2^64 (torch int64 addition already wraps)."""
    out = terms[0].clone()
    for t in terms[1:]:
        out += t
    return out
