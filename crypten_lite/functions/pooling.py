"""Pooling on CrypTensors: max (with indices), average, adaptive average and adaptive max.

Every pooling gathers its windows through a public index table (output position x window
slot -> flat input index, -1 for padding), so padding, stride, dilation, ceil_mode and the
variable windows of the adaptive variants are plain index arithmetic on shares. Max pooling
reduces each window with reductions.argmax_tree (first index wins on ties, like torch);
average pooling is a local sum followed by one division by the public window sizes.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Iterator

import torch

from ..cryptensor import CrypTensor, _record
from ..errors import ProtocolError
from ..mpc import protocol
from ._common import bool_tensor, float_view, public_share
from .comparisons import _needs_grad
from .reductions import argmax_pairwise, SENTINEL, argmax_tree


def _pair(v, n: int) -> tuple[int, ...]:
    if isinstance(v, (tuple, list)):
        if len(v) == 1:
            return tuple(v) * n
        return tuple(v)
    return (v,) * n


def _out_len(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    span = d * (k - 1) + 1
    num = size + 2 * p - span
    if num < 0:
        raise ProtocolError(f"pooling window {k} (dilation {d}) larger than the padded input {size + 2 * p}")
    out = (-(-num // s) if ceil_mode else num // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def window_table_1d(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool):
    """(positions (out, k) with -1 outside the input, in_pad mask (out, k))."""
    if p > (d * (k - 1) + 1) // 2:
        raise ProtocolError(f"padding {p} should be at most half the effective kernel size "
                            f"{d * (k - 1) + 1}")
    out = _out_len(size, k, s, p, d, ceil_mode)
    pos = torch.arange(out).unsqueeze(1) * s - p + torch.arange(k).unsqueeze(0) * d
    inside = (pos >= 0) & (pos < size)
    in_pad = (pos >= -p) & (pos < size + p)
    return torch.where(inside, pos, torch.full_like(pos, -1)), in_pad


def adaptive_table_1d(size: int, out: int):
    """torch's adaptive windows: [floor(i*size/out), ceil((i+1)*size/out)); padded by repeating
    the first index (harmless for max and its first-index tie rule); returns (table, lengths)."""
    starts = [(i * size) // out for i in range(out)]
    ends = [-(-((i + 1) * size) // out) for i in range(out)]
    kmax = max(e - s for s, e in zip(starts, ends))
    rows = [list(range(s, e)) + [s] * (kmax - (e - s)) for s, e in zip(starts, ends)]
    return torch.tensor(rows, dtype=torch.long), torch.tensor([e - s for s, e in zip(starts, ends)])


def _combine(tables: list[torch.Tensor], sizes: list[int]) -> torch.Tensor:
    """Per-dimension position tables -> flat table (prod(out), prod(k)), -1 if any is -1."""
    flat = tables[0]
    for t, size in zip(tables[1:], sizes[1:]):
        a = flat.unsqueeze(1).unsqueeze(3)          # (O1, 1, K1, 1)
        b = t.unsqueeze(0).unsqueeze(2)             # (1, O2, 1, K2)
        comb = torch.where((a < 0) | (b < 0), torch.full_like(a * b, -1), a * size + b)
        flat = comb.reshape(a.shape[0] * b.shape[1], a.shape[2] * b.shape[3])
    return flat


def _gather(share: torch.Tensor, spatial: int, table: torch.Tensor, fill: int) -> torch.Tensor:
    """share (..., *spatial dims) -> (B, O, K) windows; -1 entries get the public `fill`."""
    lead = share.shape[:share.dim() - spatial]
    flat = share.reshape(-1, math.prod(share.shape[share.dim() - spatial:]))
    col = public_share(torch.full((flat.shape[0], 1), fill, dtype=torch.int64))
    padded = torch.cat([flat, col], 1)
    idx = torch.where(table < 0, torch.full_like(table, flat.shape[1]), table)
    return padded[:, idx], lead


# Windows up to this size use all-pairs comparisons (6 + ceil(log2(k-1)) + 1 rounds instead
# of 7 per tree level): fewer rounds for the common 2x2 pools at a few more bytes.
PAIRWISE_MAX_WINDOW = 5

_FEWER_COMPARISONS: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "crypten_lite_pool_fewer_comparisons", default=None)


@contextlib.contextmanager
def fewer_comparisons(enabled: bool = True, bits: int = 64) -> Iterator[None]:
    """Inside the block, a max pooling that needs neither indices nor a gradient reduces each
    window of k candidates by a values-only tree (k - 1 comparisons, plus one for a fused
    ReLU) instead of all-pairs comparisons (k(k-1)/2, or k(k+1)/2 with the ReLU's zero, and
    the one-hot fold). The same results; for a 2x2 pool with its ReLU 4 comparisons instead
    of 10: about half the bytes and of the binary-circuit work, at 15 rounds instead of 6.
    For throughput where rounds are cheap (one machine, a LAN: `crypten-lite serve`); the
    default keeps the fewest rounds (a WAN).

    bits < 64 compares the low `bits` bits only (protocol.msb_low: a shorter circuit, about
    30 % fewer bytes again at bits=32), which is exact only while every pooled value lies
    in [-2^(bits-2), 2^(bits-2)) in ring units (so that every difference compared fits
    `bits` bits): |x| < 2^14 at 16 fractional bits for bits=32. Beyond, a window's maximum
    can be wrong; use it only where the activations are known to be bounded. Windows with
    padding (a sentinel far outside that range) always compare on 64 bits."""
    if not 2 <= bits <= 64:
        raise ValueError(f"fewer_comparisons: bits={bits} must be in 2..64")
    token = _FEWER_COMPARISONS.set(bits if enabled else None)
    try:
        yield
    finally:
        _FEWER_COMPARISONS.reset(token)


def _max_values_tree(flat: torch.Tensor, relu: bool, bits: int = 64) -> torch.Tensor:
    """Shares (R, k) -> shares of each row's max (and of max(row max, 0) with `relu`).
    bits: 64 for full-width comparisons; else comparisons of the low `bits` bits (short MSB,
    exact while every value and difference compared lies in [-2^(bits-1), 2^(bits-1)))."""
    if bits >= 64:
        vals, _ = argmax_tree(flat, True, False)
        if relu:  # [v > 0] * v: the MSB of -v and the bit * value product (one B2A round)
            _, (vals,) = protocol.msb_finish(-vals, False, [(tuple(vals.shape), vals)])
        return vals
    v = flat
    while v.shape[1] > 1:  # a level: max(l, r) = l + [l - r < 0] * (r - l)
        h = v.shape[1] // 2
        left, right = v[:, 0:2 * h:2], v[:, 1:2 * h:2]
        (prod,) = protocol.msb_low_mul([(left - right, right - left)], bits)
        v = torch.cat([left + prod, v[:, 2 * h:]], 1) if v.shape[1] % 2 else left + prod
    v = v[:, 0]
    if relu:
        (v,) = protocol.msb_low_mul([(-v, v)], bits)
    return v


def _max_windows(x: CrypTensor, spatial: int, table: torch.Tensor, out_shape, op: str,
                 return_indices: bool, relu: bool = False, **params):
    if x.dim() not in (spatial + 1, spatial + 2):
        raise ProtocolError(f"{op} expects a {spatial + 1}D or {spatial + 2}D input, got shape {tuple(x.shape)}")
    win, lead = _gather(x.share, spatial, table, -SENTINEL)
    b, o, k = win.shape
    flat = win.reshape(b * o, k)
    bits = _FEWER_COMPARISONS.get()
    if bits is not None and not return_indices and not _needs_grad(x):
        vals = _max_values_tree(flat, relu, bits if bool((table >= 0).all()) else 64)
        out = CrypTensor(vals.view(*lead, *out_shape), x.precision, x.dtype, x._names)
        return _record(out, op, (x,), **params)
    if relu:  # max(window, 0) = relu(max(window)): zero joins the candidates
        flat = torch.cat([flat, torch.zeros(b * o, 1, dtype=torch.int64)], 1)
    algorithm = argmax_pairwise if flat.shape[1] <= PAIRWISE_MAX_WINDOW else argmax_tree
    vals, oh = algorithm(flat, True, True)
    oh = oh[:, :k]
    out = CrypTensor(vals.view(*lead, *out_shape), x.precision, x.dtype, x._names)
    saved = {}
    if _needs_grad(x):
        saved = {"one_hot": bool_tensor(oh.view(b, o, k)), "index_table": table,
                 "input_shape": tuple(x.shape)}
    out = _record(out, op, (x,), **params, **saved)
    if not return_indices:
        return out
    idx = (oh.view(b, o, k) * table.clamp(min=0)).sum(-1)
    return out, CrypTensor(idx.view(*lead, *out_shape), 0, torch.int64)


def relu_max_pool2d(x: CrypTensor, kernel_size, stride=None, padding=0, dilation=1,
                    ceil_mode: bool = False) -> CrypTensor:
    """max_pool2d(relu(x)) (= relu(max_pool2d(x))) with the rounds of one pooling: 0 joins
    every window's candidates, so a 2x2 pool and its ReLU take 4 + 1 + 1 rounds (the 64-bit
    MSB of the 10 pairs, the AND of each candidate's 4 wins, the fold), not 5 + 10."""
    return max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode, _relu=True)


def max_pool2d(x: CrypTensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
               return_indices: bool = False, _relu: bool = False):
    """2D max pooling like torch.nn.functional.max_pool2d (indices into each H*W plane)."""
    k, s = _pair(kernel_size, 2), _pair(stride if stride not in (None, []) else kernel_size, 2)
    p, d = _pair(padding, 2), _pair(dilation, 2)
    h, w = x.shape[-2], x.shape[-1]
    th, _ = window_table_1d(h, k[0], s[0], p[0], d[0], ceil_mode)
    tw, _ = window_table_1d(w, k[1], s[1], p[1], d[1], ceil_mode)
    table = _combine([th, tw], [h, w])
    return _max_windows(x, 2, table, (th.shape[0], tw.shape[0]), "max_pool2d", return_indices,
                        relu=_relu, kernel_size=k, stride=s, padding=p, dilation=d, ceil_mode=ceil_mode)


def max_pool1d(x: CrypTensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
               return_indices: bool = False):
    """1D max pooling like torch.nn.functional.max_pool1d."""
    k, s = _pair(kernel_size, 1)[0], _pair(stride if stride not in (None, []) else kernel_size, 1)[0]
    p, d = _pair(padding, 1)[0], _pair(dilation, 1)[0]
    table, _ = window_table_1d(x.shape[-1], k, s, p, d, ceil_mode)
    return _max_windows(x, 1, table, (table.shape[0],), "max_pool1d", return_indices,
                        kernel_size=k, stride=s, padding=p, dilation=d, ceil_mode=ceil_mode)


def adaptive_max_pool2d(x: CrypTensor, output_size, return_indices: bool = False):
    """Adaptive 2D max pooling like torch (variable windows)."""
    h, w = x.shape[-2], x.shape[-1]
    oh, ow = _pair(output_size, 2)
    oh, ow = oh or h, ow or w
    th, _ = adaptive_table_1d(h, oh)
    tw, _ = adaptive_table_1d(w, ow)
    table = _combine([th, tw], [h, w])
    return _max_windows(x, 2, table, (oh, ow), "adaptive_max_pool2d", return_indices,
                        output_size=(oh, ow))


def _avg_windows(x: CrypTensor, table: torch.Tensor, divisor: torch.Tensor, out_shape, op: str,
                 **params) -> CrypTensor:
    x = float_view(x)
    win, lead = _gather(x.share, 2, table, 0)
    total = CrypTensor(win.sum(-1).view(*lead, *out_shape), x.precision, x.dtype)
    out = total.div(divisor.view(*out_shape).to(torch.float64))
    out = CrypTensor(out.share, out.precision, out.dtype, x._names)
    return _record(out, op, (x,), input_shape=tuple(x.shape), **params)


def avg_pool2d(x: CrypTensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override=None) -> CrypTensor:
    """2D average pooling like torch.nn.functional.avg_pool2d."""
    k, s = _pair(kernel_size, 2), _pair(stride if stride not in (None, []) else kernel_size, 2)
    p = _pair(padding, 2)
    h, w = x.shape[-2], x.shape[-1]
    th, ph = window_table_1d(h, k[0], s[0], p[0], 1, ceil_mode)
    tw, pw = window_table_1d(w, k[1], s[1], p[1], 1, ceil_mode)
    table = _combine([th, tw], [h, w])
    if divisor_override:
        divisor = torch.full((table.shape[0],), float(divisor_override))
    elif count_include_pad:
        divisor = (ph.sum(1).unsqueeze(1) * pw.sum(1).unsqueeze(0)).reshape(-1).double()
    else:
        divisor = (table >= 0).sum(1).double()
    return _avg_windows(x, table, divisor, (th.shape[0], tw.shape[0]), "avg_pool2d",
                        kernel_size=k, stride=s, padding=p, ceil_mode=ceil_mode,
                        count_include_pad=count_include_pad, divisor_override=divisor_override)


def adaptive_avg_pool2d(x: CrypTensor, output_size) -> CrypTensor:
    """Adaptive 2D average pooling like torch (variable windows)."""
    h, w = x.shape[-2], x.shape[-1]
    oh, ow = _pair(output_size, 2)
    oh, ow = oh or h, ow or w
    sh, sw = [(i * h) // oh for i in range(oh)], [(i * w) // ow for i in range(ow)]
    eh, ew = [-(-((i + 1) * h) // oh) for i in range(oh)], [-(-((i + 1) * w) // ow) for i in range(ow)]
    kh, kw = max(e - s for s, e in zip(sh, eh)), max(e - s for s, e in zip(sw, ew))
    th = torch.tensor([list(range(s, e)) + [-1] * (kh - (e - s)) for s, e in zip(sh, eh)])
    tw = torch.tensor([list(range(s, e)) + [-1] * (kw - (e - s)) for s, e in zip(sw, ew)])
    table = _combine([th, tw], [h, w])
    divisor = (table >= 0).sum(1).double()
    return _avg_windows(x, table, divisor, (oh, ow), "adaptive_avg_pool2d", output_size=(oh, ow))
