"""Short comparisons and exact rounding on arithmetic shares of small integers (int8 inference).

Everything here goes through the protocol interface (:mod:`crypten_lite.mpc.protocol`), so the
same code runs on additive shares (any N, the dealer's correlations: the protocols below live
in :mod:`crypten_lite.mpc.intops`) and on replicated shares (3 parties, no dealer:
:mod:`crypten_lite.mpc.rss_int`, :mod:`crypten_lite.mpc.rss_binary`). No rank is tested here.
docs/quantized.md gives the rss figures. The protocols, their steps and their additive costs
(short MSB, clamp, max pooling, rounding division) are described in :mod:`crypten_lite.mpc.intops`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from crypten_lite.errors import ProtocolError
from crypten_lite.mpc import circuits, protocol
from crypten_lite.mpc.intops import BIAS_BITS, MAX_BITS, lane_mask, next_pow2  # noqa: F401  (re-exported)
from crypten_lite.quantized.ir import bits_for

DEFAULT_CARRY_BITS = 16

Bound = int | torch.Tensor


# ------------------------------------------------------------------------ small helpers
def public_share(value: torch.Tensor | int, like: torch.Tensor) -> torch.Tensor:
    """A public integer as a share broadcast to ``like``'s shape (protocol.public_share)."""
    v = torch.as_tensor(value, dtype=torch.int64)
    return protocol.public_share(torch.zeros(torch.broadcast_shapes(v.shape, like.shape), dtype=torch.int64) + v)


def _bounds(v: Bound) -> tuple[int, int]:
    if isinstance(v, torch.Tensor):
        return int(v.min()), int(v.max())
    return int(v), int(v)


# ------------------------------------------------------------------------ short MSB
def msb_low(x: torch.Tensor, m: int) -> torch.Tensor:
    """Packed binary shares of bit ``m - 1`` of ``x mod 2**m`` (``x``: arithmetic shares).

    That bit is ``x < 0`` whenever ``-2**(m-1) <= x < 2**(m-1)``. Rounds (2 parties):
    ``log2(next_pow2(m))``; see the module docstring (protocol.msb_low).
    """
    if not 1 <= m <= 64:
        raise ProtocolError(f"msb_low: width {m} must be in 1..64")
    return protocol.msb_low(x, m)


def sign_words(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Packed binary shares of ``[x < 0]`` for ``-2**bits <= x < 2**bits``."""
    if bits >= 63:
        return protocol.msb_words(x)
    return msb_low(x, bits + 1)


def sign_mul(pairs, bits: int) -> list[torch.Tensor]:
    """Shares of ``[x < 0] * v`` for each ``(x, v)`` (``v`` of ``x``'s shape,
    ``-2**bits <= x < 2**bits``): protocol.msb_low_mul, or the 64-bit MSB for ``bits >= 63``."""
    if bits >= 63:
        return [protocol.msb_finish(x, False, [(tuple(x.shape), v)])[1][0] for x, v in pairs]
    return protocol.msb_low_mul(pairs, bits + 1)


# ------------------------------------------------------------------------ clamp
def clamp(x: torch.Tensor, lo: Bound | None, hi: Bound | None, bits: int) -> torch.Tensor:
    """Shares of ``min(max(x, lo), hi)`` for ``-2**bits <= x < 2**bits`` and public bounds.

    ``lo`` / ``hi``: None, ints or int64 tensors broadcasting against ``x``. Cost: one short
    MSB call on ``bits + 2`` bits (both comparisons together) and one bit-times-value round.
    """
    if lo is None and hi is None:
        return x
    if lo is not None and hi is not None and _bounds(lo)[0] > _bounds(hi)[1]:
        raise ProtocolError(f"clamp: lower bound {lo} above upper bound {hi}")
    x_lo, x_hi = -(1 << bits), (1 << bits) - 1
    diffs, width_bits = [], 0
    for bound in (lo, hi):
        if bound is None:
            continue
        b_lo, b_hi = _bounds(bound)
        d = public_share(bound, x) - x  # [x > bound] = [bound - x < 0]
        diffs.append(d)
        width_bits = max(width_bits, bits_for(b_lo - x_hi, b_hi - x_lo))
    shape = diffs[0].shape
    n = diffs[0].numel()
    if protocol.is_rss() or len(diffs) == 1:
        # lo + [x > lo] (x - lo) - [x > hi] (x - hi): the products folded into the short MSB
        # (rss: 1 + log2(W/2) + 1 rounds in all; additive: one short MSB and one product round)
        prods = sign_mul([(d, -d) for d in diffs], width_bits)
        if lo is None:
            return x.expand(shape) - prods[0]
        out = public_share(lo, x) + prods[0]
        return out - prods[1] if hi is not None else out
    words = sign_words(torch.cat([d.reshape(-1) for d in diffs]), width_bits)
    bits_all = circuits.unpack_bits(words, len(diffs) * n)
    if lo is not None and hi is not None:
        b_lo, b_hi = bits_all[:n], bits_all[n:]
        sel = circuits.pack_bits(b_lo ^ b_hi)
        (hi_a,), (prod,) = protocol.finish([(circuits.pack_bits(b_hi), n)], [(sel, tuple(shape), -diffs[0])])
        gap = torch.as_tensor(hi, dtype=torch.int64) - torch.as_tensor(lo, dtype=torch.int64)
        return public_share(lo, x) + prod + hi_a.view(shape) * gap


# ------------------------------------------------------------------------ max pooling
def pool_out_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """Output length of a pooling window, as torch computes it."""
    num = size + 2 * p - d * (k - 1) - 1
    if num < 0:
        raise ProtocolError(f"pooling window {k} (dilation {d}) larger than the padded input {size + 2 * p}")
    out = (-(-num // s) if ceil_mode else num // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:  # the last window must start inside
        out -= 1
    return out


def windows(share: torch.Tensor, fill: int, kernel_size, stride, padding, dilation, ceil_mode: bool) -> torch.Tensor:
    """(N, C, H, W) shares -> (N, C, Ho, Wo, kh * kw) windows; padding holds the public ``fill``."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel_size, stride, padding, dilation
    h, w = share.shape[-2:]
    ho = pool_out_size(h, kh, sh, ph, dh, ceil_mode)
    wo = pool_out_size(w, kw, sw, pw, dw, ceil_mode)
    span_h, span_w = dh * (kh - 1) + 1, dw * (kw - 1) + 1
    extra_h = max(0, (ho - 1) * sh + span_h - (h + 2 * ph))
    extra_w = max(0, (wo - 1) * sw + span_w - (w + 2 * pw))
    pads = (pw, pw + extra_w, ph, ph + extra_h)
    xp = F.pad(share, pads)
    if fill and any(pads):  # the public fill in the padding (protocol.add_public: no rank test)
        border = F.pad(torch.zeros(share.shape, dtype=torch.int64), pads, value=1)
        xp = protocol.add_public(xp, border * fill)
    win = xp.unfold(-2, span_h, sh).unfold(-2, span_w, sw)[..., ::dh, ::dw]
    win = win[..., :ho, :wo, :, :]
    return win.reshape(*win.shape[:-2], kh * kw)


def max_rows(v: torch.Tensor, bits: int) -> torch.Tensor:
    """Shares of the max over the last axis; ``-2**bits <= v < 2**bits``.

    ``ceil(log2 k)`` levels; a level is one short MSB on ``bits + 2`` bits and one
    bit-times-value round.
    """
    while v.shape[-1] > 1:
        half = v.shape[-1] // 2
        left, right = v[..., :half], v[..., half:2 * half]
        diff = right - left  # [left > right] = [right - left < 0]
        (prod,) = sign_mul([(diff, -diff)], bits + 1)
        best = right + prod
        v = torch.cat([best, v[..., 2 * half:]], -1) if v.shape[-1] % 2 else best
    return v[..., 0]


def max_pool2d(x: torch.Tensor, kernel_size, stride, padding, dilation, ceil_mode: bool, bits: int) -> torch.Tensor:
    """``F.max_pool2d`` on shares of ``-2**bits <= x < 2**bits`` (padding never wins)."""
    win = windows(x, -(1 << bits), kernel_size, stride, padding, dilation, ceil_mode)
    return max_rows(win, bits)


def sum_pool2d(x: torch.Tensor, kernel_size, stride, padding, ceil_mode: bool) -> torch.Tensor:
    """Window sums with zero padding (local)."""
    return windows(x, 0, kernel_size, stride, padding, (1, 1), ceil_mode).sum(-1)


# ------------------------------------------------------------------------ rounding division
def round_shift(x: torch.Tensor, shift: int, bits: int, rounding: str = "half_up",
                carry_bits: int = DEFAULT_CARRY_BITS, method: str = "auto") -> torch.Tensor:
    """Shares of ``round(x / 2**shift)`` for ``-2**bits <= x < 2**bits`` (``bits <= 61``).

    ``rounding``: ``"half_up"`` or ``"half_even"``. ``method`` (additive): ``"local"``
    (2 parties), ``"dealer"`` (any N), ``"auto"`` (local for 2 parties) or
    ``"probabilistic"`` (:func:`crypten_lite.mpc.truncation.truncate_exact` of
    ``x + 2**(shift-1)``: one round, but the result is one too large with probability equal
    to the fraction dropped, so about half the values differ from the rounded result; for
    measurements only). Under rss: ``"auto"`` (exact for every shift, no dealer) or
    ``"probabilistic"`` (protocol.round_shift).
    """
    return protocol.round_shift(x, shift, bits, rounding, carry_bits, method)


# ------------------------------------------------------------------ requantize and clamp
def can_fuse(shift: int, rounding: str, lo, hi, in_bits: int, out_bits: int) -> bool:
    """Whether :func:`requantize_clamp` applies (2 parties under the additive protocol, half-up,
    a clamp, short outputs)."""
    return (protocol.has_requantize_clamp() and shift > 0 and rounding == "half_up" and in_bits <= MAX_BITS
            and (lo is not None or hi is not None) and _window_bits(lo, hi, out_bits) <= min(32, 64 - shift)
            and shift <= BIAS_BITS)


def _window_bits(lo, hi, out_bits: int) -> int:
    bounds = [b for b in (lo, hi) if b is not None]
    b_lo = min(_bounds(b)[0] for b in bounds)
    b_hi = max(_bounds(b)[1] for b in bounds)
    # t + offset in [-2**out_bits, 2**out_bits) (+1: the rounding's carry approximation)
    return bits_for(-(1 << out_bits) - b_hi, (1 << out_bits) - b_lo) + 1


def requantize_clamp(v: torch.Tensor, shift: int, offset: int, lo: Bound | None, hi: Bound | None,
                     out_bits: int, carry_bits: int = DEFAULT_CARRY_BITS) -> torch.Tensor:
    """2 parties (additive): ``clamp(floor((v + 2**(shift-1)) / 2**shift) + offset, lo, hi)``
    in 6 rounds (:func:`crypten_lite.mpc.intops.requantize_clamp`: the rounding and the
    clamp's comparisons run together, 4 rounds fewer than the separate steps)."""
    return protocol.requantize_clamp(v, shift, offset, lo, hi, _window_bits(lo, hi, out_bits), carry_bits)


__all__ = [
    "can_fuse",
    "clamp",
    "max_pool2d",
    "max_rows",
    "requantize_clamp",
    "msb_low",
    "next_pow2",
    "round_shift",
    "sign_words",
    "sum_pool2d",
    "windows",
]
