"""layer_norm and batch_norm on CrypTensors (statistics in MPC, 1/sqrt by nonlinear.inv_sqrt)."""

from __future__ import annotations

from typing import Sequence

import torch

from ..cryptensor import CrypTensor, _record, no_grad
from .comparisons import _needs_grad
from .nonlinear import inv_sqrt
from . import fast
from .. import encoding


def _bcast(v, x: CrypTensor):
    """A per-channel vector (C,) viewed as (1, C, 1, ..., 1) against x (N, C, ...)."""
    shape = (1, -1) + (1,) * (x.dim() - 2)
    return v.reshape(shape) if isinstance(v, CrypTensor) else torch.as_tensor(v).reshape(shape)


def layer_norm(x: CrypTensor, normalized_shape: Sequence[int] | int, weight=None, bias=None,
               eps: float = 1e-5) -> CrypTensor:
    """(x - mean) / sqrt(var + eps) * weight + bias over the trailing `normalized_shape` dims.

    var + eps must lie in inv_sqrt's domain [6.1e-5, 4.2e6). Saves `x_hat`, `inv_std`.
    """
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
    if dims:  # functions/fast.py: variance at 2^-24, octave polynomials for 1/sqrt
        return _layer_norm_fast(x, dims, weight, bias, eps)
    with no_grad():
        xd = x.detach() if x.dtype.is_floating_point else x.detach().float()
        mean = xd.mean(dims, keepdim=True)
        centered = xd.sub(mean)
        var = centered.square().mean(dims, keepdim=True)
        inv_std = inv_sqrt(var.add(eps))
        x_hat = centered.mul(inv_std)
        out = x_hat
        if weight is not None:
            out = out.mul(weight.detach() if isinstance(weight, CrypTensor) else weight)
        if bias is not None:
            out = out.add(bias.detach() if isinstance(bias, CrypTensor) else bias)
    out = CrypTensor(out.share, out.precision, out.dtype, x._names)
    inputs = (x, weight, bias)
    saved = {"x_hat": x_hat, "inv_std": inv_std} if _needs_grad(*inputs) else {}
    return _record(out, "layer_norm", inputs, normalized_shape=tuple(normalized_shape), eps=eps, **saved)


def _layer_norm_fast(x: CrypTensor, dims, weight, bias, eps: float) -> CrypTensor:
    """LayerNorm between 2 parties: functions.fast.layer_norm_share (8 rounds,
    var + eps in [6.1e-5, 32768)); the weight multiplies in the variance's round."""
    grad = _needs_grad(x, weight, bias)
    with no_grad():
        xd = x.detach() if x.dtype.is_floating_point else x.detach().float()
        centered = xd.sub(xd.mean(dims, keepdim=True))
        p = centered.precision
        gamma = None
        if isinstance(weight, CrypTensor):
            gamma = weight.detach().float() if not weight.dtype.is_floating_point else weight.detach()
            if gamma.precision != p:
                raise ValueError(f"layer_norm: a weight at precision {gamma.precision}, the input at {p}")
            gamma = gamma.share.reshape(-1)
        elif weight is not None:  # public: encoded, multiplied locally
            gamma = encoding.encode(torch.as_tensor(weight, dtype=torch.float64).reshape(-1), p)
        out, saved = _normalized_rows(centered, x, dims, gamma, weight is not None
                                      and not isinstance(weight, CrypTensor), eps, grad)
        if bias is not None:
            out = out.add(bias.detach() if isinstance(bias, CrypTensor) else bias)
    out = CrypTensor(out.share, out.precision, out.dtype, x._names)
    return _record(out, "layer_norm", (x, weight, bias), normalized_shape=tuple(x.shape[k] for k in dims),
                   eps=eps, **saved)


def _normalized_rows(rows_of: CrypTensor, x: CrypTensor, dims, gamma, public: bool, eps: float,
                     grad: bool) -> tuple[CrypTensor, dict]:
    """fast.layer_norm_share over the `dims` rows of `rows_of` (x centered for layer_norm, x
    itself for rms_norm): the output in x's shape and names, and the x_hat and inv_std the
    autograd rule needs when `grad`."""
    d = 1
    for k in dims:
        d *= x.shape[k]
    p, dtype = rows_of.precision, rows_of.dtype
    got = fast.layer_norm_share(rows_of.share.reshape(-1, d), p, eps, gamma, public_weight=public, saved=grad)
    saved = {}
    if grad:
        got, x_hat, inv_std = got
        keep = [1 if k in dims else x.shape[k] for k in range(x.dim())]
        saved = {"x_hat": CrypTensor(x_hat.view(x.shape), p, dtype, x._names),
                 "inv_std": CrypTensor(inv_std.view(keep), p, dtype)}
    return CrypTensor(got.view(x.shape), p, dtype, x._names), saved


def batch_norm(x: CrypTensor, running_mean=None, running_var=None, weight=None, bias=None,
               training: bool = False, momentum: float = 0.1, eps: float = 1e-5) -> CrypTensor:
    """Batch normalization like torch.nn.functional.batch_norm (input (N, C, ...)).

    training=True normalizes with the batch statistics (biased variance) and updates
    private running statistics in place (public ones cannot absorb private statistics and
    are left alone); training=False uses the running statistics (public ones are inverted
    in plaintext). Saves `x_hat`, `inv_std` for autograd.
    """
    dims = (0,) + tuple(range(2, x.dim()))
    with no_grad():
        xd = x.detach() if x.dtype.is_floating_point else x.detach().float()
        if training or running_mean is None:
            mean = xd.mean(dims, keepdim=True)
            centered = xd.sub(mean)
            var = centered.square().mean(dims, keepdim=True)
            inv_std = inv_sqrt(var.add(eps))
            if training:
                n = x.numel() // x.shape[1]
                for stat, value in ((running_mean, mean), (running_var, var.mul(n / max(n - 1, 1)))):
                    if isinstance(stat, CrypTensor):
                        stat._inplace(stat.mul(1 - momentum).add(value.reshape(-1).mul(momentum)))
        else:
            centered = xd.sub(_bcast(running_mean.detach() if isinstance(running_mean, CrypTensor)
                                     else running_mean, x))
            if isinstance(running_var, CrypTensor):
                inv_std = inv_sqrt(_bcast(running_var.detach(), x).add(eps))
            else:
                inv_std = _bcast(torch.rsqrt(torch.as_tensor(running_var, dtype=torch.float64) + eps), x)
        x_hat = centered.mul(inv_std)
        out = x_hat
        if weight is not None:
            out = out.mul(_bcast(weight.detach() if isinstance(weight, CrypTensor) else weight, x))
        if bias is not None:
            out = out.add(_bcast(bias.detach() if isinstance(bias, CrypTensor) else bias, x))
    out = CrypTensor(out.share, out.precision, out.dtype, x._names)
    inputs = (x, weight, bias)
    saved = {"x_hat": x_hat, "inv_std": inv_std} if _needs_grad(*inputs) else {}
    return _record(out, "batch_norm", inputs, training=training, eps=eps, dims=dims, **saved)


def rms_norm(x: CrypTensor, normalized_shape: Sequence[int] | int, weight=None,
             eps: float | None = None) -> CrypTensor:
    """x / sqrt(mean(x^2) + eps) * weight over the trailing `normalized_shape` dims (like
    torch.nn.functional.rms_norm; eps None: float32's machine epsilon).

    One square per element and ONE inv_sqrt per row (mean(x^2) + eps must lie in inv_sqrt's
    domain [6.1e-5, 4.2e6); between 2 parties the 6-round fast path of layer_norm, [6.1e-5,
    32768), with its own autograd rule). Otherwise built from recorded ops, so autograd
    follows them."""
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    if tuple(x.shape[x.dim() - len(normalized_shape):]) != tuple(normalized_shape):
        raise ValueError(f"rms_norm: normalized_shape {tuple(normalized_shape)} does not match "
                         f"the trailing dims of an input of shape {tuple(x.shape)}")
    eps = torch.finfo(torch.float32).eps if eps is None else float(eps)
    dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
    xf = x if x.dtype.is_floating_point else x.float()
    # the fast path of layer_norm on the uncentered rows (x_hat and inv_std saved for the
    # rms_norm rule when a gradient is needed); a secret weight at another precision takes
    # the recorded ops below
    gamma, public = None, False
    if isinstance(weight, CrypTensor) and weight.precision == xf.precision:
        gamma = weight.detach().share.reshape(-1)
    elif weight is not None and not isinstance(weight, CrypTensor):
        gamma, public = encoding.encode(torch.as_tensor(weight, dtype=torch.float64).reshape(-1), xf.precision), True
    if weight is None or gamma is not None:
        grad = _needs_grad(x, weight)
        with no_grad():
            out, saved = _normalized_rows(xf.detach(), x, dims, gamma, public, eps, grad)
        return _record(out, "rms_norm", (x, weight), normalized_shape=tuple(normalized_shape), eps=eps,
                       **saved)
    inv_rms = inv_sqrt(xf.square().mean(dims, keepdim=True).add(eps))
    out = xf.mul(inv_rms)
    if weight is not None:
        out = out.mul(weight)
    return out
