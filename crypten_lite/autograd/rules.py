"""Gradient rules: one table, one entry per recorded op.

    RULES[op](grad_out, *inputs, **saved) -> one gradient per input (None: no gradient)

`inputs` are what the op recorded (CrypTensors, or public tensors and numbers, which get no
gradient); `saved` holds the op's keyword values plus `out`, the detached output. Rules run
under no_grad() and may return gradients of a broadcast shape: the engine sums them back to
each input's shape. Every rule is checked against torch.autograd in
tests/protocol/test_autograd.py.

Costs: linear rules (shape ops, sums, public products) are local; a product of two private
values costs one Beaver round (plus truncation); nonlinear rules reuse the forward output
(`out`) or what the forward saved, so that no comparison is recomputed where it can be
avoided.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F

from ..cryptensor import CrypTensor
from ..errors import UnsupportedError
from . import _unbroadcast


# ----------------------------------------------------------------------------- helpers
def _const(x):
    return x.detach() if isinstance(x, CrypTensor) else x


def _is_private(x) -> bool:
    return isinstance(x, CrypTensor)


def _tup(v, n: int) -> tuple[int, ...]:
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * n


def _bilinear(op: str, a, b, params: Sequence[int] = ()) -> CrypTensor:
    """op(a, b) for a bilinear op of crypten_lite.provider.correlations.TRIPLE_OPS.

    Private x private is one Beaver round; a public operand on either side is local.
    """
    if _is_private(a):
        return a._bilinear(op, b, tuple(params))
    return b._bilinear(op, a, tuple(params), swap=True)


def _mT(x):
    return x.transpose(-1, -2)


def _with_index_map(g: CrypTensor, x, op) -> CrypTensor:
    """Gradient of a gather-like op y = x.flatten()[idx]: scatter-add g back to x's shape.

    `op` maps a tensor of x's shape to the output; applied to the positions 0..numel-1 it
    gives idx (duplicates accumulate, like torch).
    """
    shape = tuple(x.shape)
    n = math.prod(shape)
    positions = op(torch.arange(n, dtype=torch.float64).reshape(shape))
    idx = positions.round().long().reshape(-1)
    share = g.share.new_zeros(n).index_add_(0, idx, g.share.reshape(-1))
    return g._new(share.reshape(shape), names=None)


def _dims_of(x, dim) -> tuple[int, ...]:
    if dim is None:
        return tuple(range(x.dim()))
    dims = dim if isinstance(dim, (tuple, list)) else (dim,)
    return tuple(sorted(x._dim(d) % max(x.dim(), 1) for d in dims))


def _expand_reduced(g: CrypTensor, x, dim, keepdim: bool) -> CrypTensor:
    """Broadcast the gradient of a reduction over `dim` back to x's shape."""
    if x.dim() == 0:  # a 0-d input reduced along 0 / -1: the gradient is g itself
        return g.reshape(())
    dims = _dims_of(x, dim)
    if not keepdim:
        shape = list(g.shape)
        for d in dims:
            shape.insert(d, 1)
        g = g.reshape(shape)
    return g.expand(tuple(x.shape))


# ------------------------------------------------------------------- arithmetic rules
def _div(g, a, b, out, **s):
    if not _is_private(b):
        return g.div(b)
    inv = s["reciprocal"] if "reciprocal" in s else b.detach().reciprocal()
    ga = g.mul(inv)
    return ga, ga.mul(out).neg()


def _matmul(g, a, b, **s):
    """torch.matmul rules, with 1-D operands promoted like torch does."""
    a1 = _const(a).unsqueeze(0) if a.dim() == 1 else _const(a)
    b1 = _const(b).unsqueeze(-1) if b.dim() == 1 else _const(b)
    batch = torch.broadcast_shapes(tuple(a1.shape[:-2]), tuple(b1.shape[:-2]))
    g1 = g.reshape(*batch, a1.shape[-2], b1.shape[-1])
    ga = _bilinear("matmul", g1, _mT(b1)) if _is_private(a) else None
    gb = _bilinear("matmul", _mT(a1), g1) if _is_private(b) else None
    if ga is not None:
        ga = _unbroadcast(ga, a1.shape).reshape(a.shape)
    if gb is not None:
        gb = _unbroadcast(gb, b1.shape).reshape(b.shape)
    return ga, gb


# ------------------------------------------------------------------- convolutions
def _conv_input_grad(g, w, input_shape, stride, padding, dilation, groups, dims: int):
    """d conv(x, w) / dx as a transposed convolution (conv1d through conv_transpose2d)."""
    stride, padding, dilation = _tup(stride, dims), _tup(padding, dims), _tup(dilation, dims)
    k = tuple(w.shape[2:])
    spatial_in, spatial_out = input_shape[2:], tuple(g.shape[2:])
    out_pad = tuple(spatial_in[i] - ((spatial_out[i] - 1) * stride[i] - 2 * padding[i]
                                     + dilation[i] * (k[i] - 1) + 1) for i in range(dims))
    if dims == 1:
        g, w = g.unsqueeze(2), w.unsqueeze(2)
        stride, padding, dilation, out_pad = ((1,) + stride, (0,) + padding, (1,) + dilation,
                                              (0,) + out_pad)
    params = (*stride, *padding, *out_pad, *dilation, groups)  # TRIPLE_OPS layout
    gx = _bilinear("conv_transpose2d", g, w, params)
    return gx.squeeze(2) if dims == 1 else gx


def _conv_weight_grad(x, g, weight_shape, stride, padding, dilation, groups, dims: int):
    """d conv(x, w) / dw as one convolution of x (batch as channels) with g (grouped).

    out[i, o] = sum_n x[n, group(o) * C/G + i] (*) g[n, o]: input Z[C/G, G*N, ...],
    weight g^T[O, N, ...], stride and dilation swapped, then cropped to the kernel size.
    """
    stride, padding, dilation = _tup(stride, dims), _tup(padding, dims), _tup(dilation, dims)
    n, c = x.shape[0], x.shape[1]
    spatial = tuple(x.shape[2:])
    cg = c // groups
    lead = (2, 1, 0) + tuple(range(3, 3 + dims))
    z = x.reshape(n, groups, cg, *spatial).permute(*lead).reshape(cg, groups * n, *spatial)
    gt = g.transpose(0, 1)
    op = "conv1d" if dims == 1 else "conv2d"
    gw = _bilinear(op, z, gt, (*dilation, *padding, *stride, groups))
    for i, k in enumerate(weight_shape[2:]):
        if gw.shape[2 + i] != k:
            gw = gw.narrow(2 + i, 0, k)
    return gw.transpose(0, 1)


def _conv(dims: int):
    def rule(g, x, w, stride=1, padding=0, dilation=1, groups=1, **s):
        gx = _conv_input_grad(g, _const(w), tuple(x.shape), stride, padding, dilation, groups,
                              dims) if _is_private(x) else None
        gw = _conv_weight_grad(_const(x), g, tuple(w.shape), stride, padding, dilation, groups,
                               dims) if _is_private(w) else None
        return gx, gw
    return rule


def _conv_transpose2d(g, x, w, stride=1, padding=0, output_padding=0, groups=1, dilation=1, **s):
    """y = conv_transpose(x, w) is the adjoint of conv(., w): <y, g> = <x, conv(g, w)>."""
    stride, padding, dilation = _tup(stride, 2), _tup(padding, 2), _tup(dilation, 2)
    gx = gw = None
    if _is_private(x):
        gx = _bilinear("conv2d", g, _const(w), (*stride, *padding, *dilation, groups))
    if _is_private(w):
        gw = _conv_weight_grad(g, _const(x), tuple(w.shape), stride, padding, dilation, groups, 2)
    return gx, gw


# ------------------------------------------------------------------------ shape rules
def _permute(g, x, dims, **s):
    inverse = [0] * len(dims)
    for i, d in enumerate(dims):
        inverse[d % len(dims)] = i
    return g.permute(*inverse)


def _repeat(g, x, input_shape, sizes, **s):
    padded = (1,) * (len(sizes) - len(input_shape)) + tuple(input_shape)
    split = []
    for r, n in zip(sizes, padded):
        split += [r, n]
    g = g.reshape(split).sum(tuple(range(0, 2 * len(sizes), 2)))
    return g.reshape(input_shape)


def _align(g, x, permutation, input_shape, permuted_shape, **s):
    """align_to / align_as: a permutation plus inserted size-1 dims (named tensors)."""
    inverse = [0] * len(permutation)
    for i, d in enumerate(permutation):
        inverse[d] = i
    return g.reshape(permuted_shape).permute(*inverse)


def _narrow(g, x, dim, start, input_shape, **s):
    d = dim % len(input_shape)
    length = g.shape[d]
    pad = [0, 0] * (len(input_shape) - d)
    pad[-2], pad[-1] = start, input_shape[d] - start - length
    return g._new(F.pad(g.share, pad))


def _pad(g, x, pad, mode="constant", **s):
    if mode == "constant":
        return g._new(F.pad(g.share, [-p for p in pad]))
    return _with_index_map(g, x, lambda t: F.pad(t, list(pad), mode=mode))


def _gather(g, x, dim, index, input_shape, **s):
    share = g.share.new_zeros(input_shape).scatter_add_(dim, index, g.share)
    return g._new(share)


def _roll(g, x, shifts, dims=None, **s):
    neg = tuple(-v for v in shifts) if isinstance(shifts, (tuple, list)) else -shifts
    return g.roll(neg, dims)


def _pad_share(share: torch.Tensor, shape) -> torch.Tensor:
    """share zero-padded at the end of every dim up to `shape` (torch allows a scatter src
    larger than the index: its extra elements get no gradient)."""
    pad = []
    for have, want in reversed(list(zip(share.shape, shape))):
        pad += [0, want - have]
    return F.pad(share, pad) if any(pad) else share


def _scatter(g, x, src, dim, index, **s):
    """x.scatter(dim, index, src): x's gradient is g with the overwritten positions zeroed,
    src's is g gathered at the index (duplicates: each source element gets its own)."""
    gx = g._new(g.share.scatter(dim, index, 0)) if _is_private(x) else None
    gs = None
    if _is_private(src):
        gs = g._new(_pad_share(g.share.gather(dim, index), tuple(src.shape)))
    return gx, gs


def _scatter_add(g, x, src, dim, index, **s):
    gs = g._new(_pad_share(g.share.gather(dim, index), tuple(src.shape))) if _is_private(src) else None
    return g, gs


def _index_select(g, x, dim, index, input_shape, **s):
    share = g.share.new_zeros(input_shape).index_add_(dim, index, g.share)
    return g._new(share)


def _take(g, x, index, input_shape, **s):
    n = math.prod(input_shape)
    share = g.share.new_zeros(n).index_add_(0, index.reshape(-1), g.share.reshape(-1))
    return g._new(share.reshape(input_shape))


def _trace(g, x, **s):
    eye = torch.eye(x.shape[0], x.shape[1], dtype=torch.int64)
    return g._new(eye * g.share)


def _polynomial_private(g, x, coeffs, out, terms, **s):
    """p(x) = sum_i c_i x^(i+1), secret c: dp/dx = sum_i (i+1) c_i x^i, dp/dc_i = x^(i+1)."""
    k = coeffs.shape[0]
    c = coeffs.detach().reshape(k, *([1] * x.dim()))
    gx = gc = None
    if _is_private(x):
        deriv = c.narrow(0, 0, 1).sum(0)
        if k > 1:
            weights = torch.arange(2, k + 1, dtype=torch.float64).reshape(k - 1, *([1] * x.dim()))
            deriv = deriv.add(c.narrow(0, 1, k - 1).mul(terms.narrow(0, 0, k - 1)).mul(weights).sum(0))
        gx = g.mul(deriv)
    if _is_private(coeffs):
        gc = terms.mul(g.unsqueeze(0)).reshape(k, -1).sum(1)
    return gx, gc


def _cat(g, *inputs, dim, sizes, **s):
    grads, offset = [], 0
    for n in sizes:
        grads.append(g.narrow(dim, offset, n))
        offset += n
    return tuple(grads)


def _to(g, x, **s):
    return g.to(x.dtype) if x.dtype.is_floating_point else None


# ------------------------------------------------------------------- nonlinear rules
# Each reuses the forward output (`out`) and what the forward saved; the fallbacks recompute
# with the same CrypTensor methods the forward used.
def _relu(g, x, out, mask=None, **s):
    if mask is None:
        mask = x.detach().gt(0)
    return g.mul(mask)


def _softmax(g, x, out, dim, **s):
    return out.mul(g.sub(g.mul(out).sum(dim, keepdim=True)))


def _log_softmax(g, x, out, dim, **s):
    soft = s.get("softmax")
    if soft is None:
        soft = out.exp()
    return g.sub(soft.mul(g.sum(dim, keepdim=True)))


def _sqrt(g, x, out, **s):
    return g.mul(out.reciprocal()).mul(0.5)


def _log(g, x, out, **s):
    return g.mul(x.detach().reciprocal())


def _div_private(g, a, b, out, reciprocal=None, **s):
    inv = reciprocal if reciprocal is not None else b.detach().reciprocal()
    ga = g.mul(inv)
    return (ga if _is_private(a) else None), ga.mul(out).neg()


def _erf(g, x, out, **s):
    return g.mul(x.detach().square().neg().exp()).mul(2.0 / math.sqrt(math.pi))


# erf(x) ~ tanh(a x + b x^3) in crypten_lite.functions.nonlinear (ERF_A, ERF_B): gelu's cdf is
# sigmoid(z(x)); its derivative is that of the same approximation, cdf (1 - cdf) z'(x).
_ERF_A, _ERF_B = 1.129, 0.1005
_TANH_C = math.sqrt(2.0 / math.pi)


def _gelu(g, x, out, cdf, approximate="none", **s):
    """d/dx x cdf(x) = cdf + x cdf (1 - cdf) z'(x), z the sigmoid argument of the forward."""
    xd = x.detach()
    if cdf is None:  # the forward's piecewise polynomial saves none: sigmoid form, now
        from ..functions.nonlinear import gelu_cdf
        cdf = gelu_cdf(xd, approximate)
    x2 = xd.square()
    if approximate == "tanh":
        dz = x2.mul(2 * _TANH_C * 3 * 0.044715).add(2 * _TANH_C)
    else:  # z = 2 (a x' + b x'^3), x' = x / sqrt(2)
        dz = x2.mul(2 * _ERF_B * 3 / 2 ** 1.5).add(2 * _ERF_A / math.sqrt(2.0))
    dcdf = cdf.sub(cdf.square()).mul(dz)
    return g.mul(cdf.add(xd.mul(dcdf)))


def _silu(g, x, out, sigmoid, **s):
    """d/dx x s(x) = s (1 + x (1 - s))."""
    xd = x.detach()
    if sigmoid is None:  # the forward's piecewise polynomial saves none: computed now
        from ..functions.nonlinear import silu_sigmoid
        sigmoid = silu_sigmoid(xd)
    return g.mul(sigmoid.mul(xd.sub(xd.mul(sigmoid)).add(1.0)))


def _polynomial(g, x, out, coeffs, **s):
    """p(x) = sum_i c_i x^i (i >= 1): p'(x) = c_1 + sum_{i >= 2} i c_i x^(i - 1)."""
    if len(coeffs) == 1:
        return g.mul(coeffs[0])
    tail = [(i + 2) * c for i, c in enumerate(coeffs[1:])]
    return g.mul(x.detach().polynomial(tail).add(coeffs[0]))


def _pow(g, x, out, exponent, **s):
    e = float(exponent)
    if e == 2:
        return g.mul(x.detach()).mul(2.0)
    if e == 1:
        return g
    return g.mul(x.detach().pow(e - 1)).mul(e)


def _normalized_input_grad(dxhat, x_hat, inv_std, dims):
    """d/dx of (x - mean) * inv_std over `dims` (batch statistics): the classic formula."""
    mean_d = dxhat.mean(dims, keepdim=True)
    mean_dx = dxhat.mul(x_hat).mean(dims, keepdim=True)
    return dxhat.sub(mean_d).sub(x_hat.mul(mean_dx)).mul(inv_std)


def _layer_norm(g, x, weight, bias, out, x_hat, inv_std, normalized_shape, **s):
    dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
    dxhat = g.mul(_const(weight)) if weight is not None else g
    gx = _normalized_input_grad(dxhat, x_hat, inv_std, dims) if _is_private(x) else None
    gw = g.mul(x_hat) if _is_private(weight) else None
    gb = g if _is_private(bias) else None
    return gx, gw, gb


def _rms_norm(g, x, weight, out, x_hat, inv_std, normalized_shape, **s):
    """x_hat = x inv_std (no centering): dx = (dxhat - x_hat mean(dxhat x_hat)) inv_std."""
    dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
    dxhat = g.mul(_const(weight)) if weight is not None else g
    gx = None
    if _is_private(x):
        gx = dxhat.sub(x_hat.mul(dxhat.mul(x_hat).mean(dims, keepdim=True))).mul(inv_std)
    gw = g.mul(x_hat) if _is_private(weight) else None
    return gx, gw


def _batch_norm(g, x, weight, bias, out, x_hat, inv_std, training, dims, **s):
    def channel(v):
        return v.reshape((1, -1) + (1,) * (x.dim() - 2))
    dxhat = g.mul(channel(_const(weight))) if weight is not None else g
    gx = None
    if _is_private(x):
        gx = _normalized_input_grad(dxhat, x_hat, inv_std, dims) if training else dxhat.mul(inv_std)
    gw = g.mul(x_hat).sum(dims) if _is_private(weight) else None
    gb = g.sum(dims) if _is_private(bias) else None
    return gx, gw, gb


def _where(g, a, b, condition, **s):
    """where(condition, a, b): condition public (bool tensor) or private (bool CrypTensor)."""
    cond = condition.detach() if _is_private(condition) else torch.as_tensor(condition, dtype=torch.bool)
    ga = g.mul(cond) if _is_private(a) else None
    if not _is_private(b):
        return ga, None
    return ga, g.sub(ga if ga is not None else g.mul(cond))


def _clamp(g, x, lo=None, hi=None, below=None, above=None, **s):
    """clamp(x, min, max): inputs (x, min, max), saved below / above = where x is held at
    min / max (None for an absent bound); there the gradient goes to the bound."""
    hit = None  # [x held at a bound]
    for m in (below, above):
        if m is not None:
            hit = m if hit is None else hit.add(m)
    gx = g if hit is None else g.sub(g.mul(hit))
    return (gx, g.mul(below) if _is_private(lo) else None, g.mul(above) if _is_private(hi) else None)


def _zero(g, x, **s):
    """Gradient of a piecewise-constant op: zeros of x's shape (torch gives zeros, not None)."""
    return g._new(g.share.new_zeros(tuple(x.shape)), names=None)


def _extreme(g, x, dim=None, keepdim=False, one_hot=None, **s):
    """max / min: the gradient goes to the selected element (the saved one-hot)."""
    if dim is not None and not keepdim:
        g = g.unsqueeze(dim)
    return g.expand(tuple(x.shape)).mul(one_hot)


# ------------------------------------------------------------------------- pooling
def _max_pool(spatial: int):
    def rule(g, x, one_hot, index_table, input_shape, **s):
        """Route each output's gradient to its window's (saved, one-hot) maximum."""
        b, o, k = one_hot.shape
        routed = g.reshape(b, o, 1).mul(one_hot)  # bool one-hot: one Beaver round, no truncation
        plane = math.prod(input_shape[len(input_shape) - spatial:])
        idx = torch.where(index_table < 0, torch.full_like(index_table, plane), index_table)
        share = routed.share.new_zeros(b, plane + 1)  # a sharing of zeros (any protocol)
        share.index_add_(1, idx.reshape(-1), routed.share.reshape(b, o * k))
        return routed._new(share[:, :plane].reshape(input_shape))
    return rule


def _window_matrix(size: int, pool) -> torch.Tensor:
    """(out, size) 0/1 matrix: which input positions each 1-D window covers."""
    basis = torch.eye(size, dtype=torch.float64).reshape(size, 1, size, 1)
    return (pool(basis).reshape(size, -1) > 0).double().t()


def _separable_pool_grad(g, x, input_shape, pool_h, pool_w, pool_2d):
    """Average pooling = A_h X A_w^T / D: gradient A_h^T (G / D) A_w, with public A and D."""
    h, w = input_shape[-2], input_shape[-1]
    a_h, a_w = _window_matrix(h, pool_h), _window_matrix(w, pool_w)
    ones = torch.ones(1, 1, h, w, dtype=torch.float64)
    window_sum = (a_h @ ones[0, 0] @ a_w.t())
    inv_divisor = pool_2d(ones)[0, 0] / window_sum
    y = g.mul(inv_divisor).matmul(a_w)                      # (..., oh, w)
    return y.transpose(-1, -2).matmul(a_h).transpose(-1, -2)  # (..., h, w)


def _avg_pool2d(g, x, input_shape, kernel_size, stride, padding, ceil_mode=False,
                count_include_pad=True, divisor_override=None, **s):
    k, st, p = _tup(kernel_size, 2), _tup(stride, 2), _tup(padding, 2)

    def pool_1d(i):
        kern, strd, pad = [1, 1], [1, 1], [0, 0]
        kern[0], strd[0], pad[0] = k[i], st[i], p[i]
        return lambda t: F.avg_pool2d(t, tuple(kern), tuple(strd), tuple(pad), ceil_mode,
                                      True, 1)
    return _separable_pool_grad(
        g, x, input_shape, pool_1d(0), pool_1d(1),
        lambda t: F.avg_pool2d(t, k, st, p, ceil_mode, count_include_pad, divisor_override))


def _adaptive_avg_pool2d(g, x, input_shape, output_size, **s):
    oh, ow = output_size
    return _separable_pool_grad(
        g, x, input_shape, lambda t: F.adaptive_avg_pool2d(t, (oh, 1)),
        lambda t: F.adaptive_avg_pool2d(t, (ow, 1)), lambda t: F.adaptive_avg_pool2d(t, (oh, ow)))


def _bce_with_logits(g, x, y, out, sigmoid, weight=None, reduction="mean", **s):
    """d/dx = (sigmoid(x) - y) w / n; d/dy = -x w / n (n = numel for 'mean', else 1)."""
    scale = 1.0 / x.numel() if reduction == "mean" else 1.0

    def times_g(factor):
        factor = factor.mul(weight) if weight is not None else factor
        return g.mul(factor.mul(scale) if scale != 1.0 else factor)

    gx = times_g(sigmoid.sub(_const(y))) if _is_private(x) else None
    gy = times_g(_const(x).neg() if _is_private(x) else -x) if _is_private(y) else None
    return gx, gy


RULES = {
    # arithmetic
    "clone": lambda g, x, **s: g,
    "add": lambda g, a, b, **s: (g, g),
    "sub": lambda g, a, b, **s: (g, g.neg()),
    "neg": lambda g, x, **s: g.neg(),
    "mul": lambda g, a, b, **s: (g.mul(_const(b)) if _is_private(a) else None,
                                 g.mul(_const(a)) if _is_private(b) else None),
    "square": lambda g, x, **s: g.mul(x.detach()).mul(2),
    "div": _div,
    "matmul": _matmul,
    "conv1d": _conv(1),
    "conv2d": _conv(2),
    "conv_transpose2d": _conv_transpose2d,
    "to": _to,
    # reductions
    "sum": lambda g, x, dim=None, keepdim=False, **s: _expand_reduced(g, x, dim, keepdim),
    "mean": lambda g, x, dim=None, keepdim=False, out=None, **s: _expand_reduced(
        g.div(x.numel() // max(1, out.numel())), x, dim, keepdim),
    "cumsum": lambda g, x, dim, **s: g.flip(dim).cumsum(dim).flip(dim),
    # shape
    "reshape": lambda g, x, input_shape, **s: g.reshape(input_shape),
    "transpose": lambda g, x, dim0, dim1, **s: g.transpose(dim0, dim1),
    "permute": _permute,
    "expand": lambda g, x, input_shape, **s: _unbroadcast(g, input_shape),
    "repeat": _repeat,
    "narrow": _narrow,
    "getitem": lambda g, x, index, **s: _with_index_map(g, x, lambda t: t[index]),
    "gather": _gather,
    "scatter": _scatter,
    "scatter_add": _scatter_add,
    "index_select": _index_select,
    "index_add": lambda g, x, src, dim, index, **s: (g, g.index_select(dim, index)),
    "take": _take,
    "unfold": lambda g, x, dim, size, step, **s: _with_index_map(g, x, lambda t: t.unfold(dim, size, step)),
    "trace": _trace,
    "pad": _pad,
    "roll": _roll,
    "flip": lambda g, x, dims, **s: g.flip(dims),
    "cat": _cat,
    "align": _align,
    "rename": lambda g, x, **s: g,
    "refine_names": lambda g, x, **s: g,
    # nonlinear (crypten_lite.functions)
    "relu": _relu,
    "abs": lambda g, x, neg, **s: g.sub(g.mul(neg).mul(2)),
    "sign": _zero,        # piecewise constant: a zero gradient (not None), like torch
    "floor": _zero,
    "ceil": _zero,
    "trunc": _zero,
    "clamp": _clamp,
    "max": _extreme,
    "min": _extreme,
    "sigmoid": lambda g, x, out, **s: g.mul(out.sub(out.square())),
    "tanh": lambda g, x, out, **s: g.sub(g.mul(out.square())),
    "exp": lambda g, x, out, **s: g.mul(out),
    "log": _log,
    "reciprocal": lambda g, x, out, **s: g.mul(out.square()).neg(),
    "div_private": _div_private,
    "sqrt": _sqrt,
    "inv_sqrt": lambda g, x, out, **s: g.mul(out.square().mul(out)).mul(-0.5),
    "erf": _erf,
    "gelu": _gelu,
    "silu": _silu,
    "cos": lambda g, x, out, sin, **s: g.mul(sin).neg(),
    "sin": lambda g, x, out, cos, **s: g.mul(cos),
    "polynomial": _polynomial,
    "polynomial_private": _polynomial_private,
    "pow": _pow,
    "layer_norm": _layer_norm,
    "rms_norm": _rms_norm,
    "batch_norm": _batch_norm,
    "softmax": _softmax,
    "log_softmax": _log_softmax,
    "where": _where,
    "max_pool1d": _max_pool(1),
    "max_pool2d": _max_pool(2),
    "adaptive_max_pool2d": _max_pool(2),
    "avg_pool2d": _avg_pool2d,
    "adaptive_avg_pool2d": _adaptive_avg_pool2d,
    # losses with a gradient of their own (crypten_lite.nn.functional)
    "binary_cross_entropy_with_logits": _bce_with_logits,
}


def rule_for(op: str):
    """The gradient rule of `op`, or UnsupportedError naming the table to extend."""
    try:
        return RULES[op]
    except KeyError:
        raise UnsupportedError(f"no gradient rule for op {op!r}; add one to RULES in "
                               "crypten_lite/autograd/rules.py") from None
