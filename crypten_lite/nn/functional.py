"""Functional layers and losses on public tensors and CrypTensors, mirroring torch.nn.functional.

Every function takes any mix of public torch tensors and CrypTensors: with no CrypTensor
operand it *is* the torch function (plaintext), otherwise it runs the private version.
Nonlinear functions are the CrypTensor methods of crypten_lite.functions (same names as
torch); their gradients are in crypten_lite/autograd/rules.py.

Dropout masks are public, drawn from a PRG whose seed the parties agree on by a coin
toss (crypten_lite.functions.dropout).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from ..autograd import record
from ..cryptensor import CrypTensor
from ..errors import UnsupportedError
from ..functions.dropout import (common_prg, dropout, dropout1d, dropout2d, dropout3d,  # noqa: F401
                                 dropout_mask, feature_dropout)


def is_private(*values) -> bool:
    """True if any value is a CrypTensor."""
    return any(isinstance(v, CrypTensor) for v in values)


def _tuple(v, n: int) -> tuple[int, ...]:
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * n


def _method(x: CrypTensor, name: str):
    fn = getattr(x, name, None)
    if fn is None:
        raise UnsupportedError(f"CrypTensor.{name} is not available: it comes with "
                               "crypten_lite.functions (call crypten_lite.init() first)")
    return fn


# --------------------------------------------------------------------------- linear
def linear(x, weight, bias=None):
    """x @ weight.T + bias; any operand may be public or private."""
    if not is_private(x, weight, bias):
        return F.linear(x, weight, bias)
    if isinstance(x, CrypTensor):
        out = x.matmul(weight.t())
    else:
        out = weight.t().__rmatmul__(x)  # public x: local product, recorded for autograd
    return out if bias is None else out.add(bias)


def _same_padding(weight_shape, dilation, dims: int):
    """Explicit F.pad amounts for padding='same' (stride 1), torch's left/right split."""
    pad = []
    for k, d in reversed(list(zip(weight_shape[2:], _tuple(dilation, dims)))):
        total = d * (k - 1)
        pad += [total // 2, total - total // 2]
    return pad


def _conv(op: str, dims: int, x, weight, bias, stride, padding, dilation, groups):
    if not is_private(x, weight, bias):
        fn = F.conv1d if dims == 1 else F.conv2d
        return fn(x, weight, bias, stride, padding, dilation, groups)
    if isinstance(padding, str):
        if padding == "valid":
            padding = 0
        elif padding == "same":
            x = pad(x, _same_padding(weight.shape, dilation, dims))
            padding = 0
        else:
            raise UnsupportedError(f"{op}: padding={padding!r}; use an int, a tuple, 'same' or 'valid'")
    if isinstance(x, CrypTensor):
        out = getattr(x, op)(weight, None, stride, padding, dilation, groups)
    else:
        # Public input, private weight: op(x, [w]) is local (the public operand on the left).
        params = (*_tuple(stride, dims), *_tuple(padding, dims), *_tuple(dilation, dims), groups)
        out = weight._bilinear(op, x, params, swap=True)
        out = record(out, op, (x, weight), stride=stride, padding=padding, dilation=dilation,
                     groups=groups)
    if bias is None:
        return out
    return out.add(bias.reshape(-1, *([1] * dims)))


def conv1d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _conv("conv1d", 1, x, weight, bias, stride, padding, dilation, groups)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _conv("conv2d", 2, x, weight, bias, stride, padding, dilation, groups)


def conv_transpose2d(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                     dilation=1):
    if not is_private(x, weight, bias):
        return F.conv_transpose2d(x, weight, bias, stride, padding, output_padding, groups, dilation)
    if isinstance(x, CrypTensor):
        out = x.conv_transpose2d(weight, None, stride, padding, output_padding, groups, dilation)
    else:
        params = (*_tuple(stride, 2), *_tuple(padding, 2), *_tuple(output_padding, 2),
                  *_tuple(dilation, 2), groups)
        out = weight._bilinear("conv_transpose2d", x, params, swap=True)
        out = record(out, "conv_transpose2d", (x, weight), stride=stride, padding=padding,
                     output_padding=output_padding, groups=groups, dilation=dilation)
    return out if bias is None else out.add(bias.reshape(-1, 1, 1))


def conv_transpose1d(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                     dilation=1):
    """1-D transposed convolution: conv_transpose2d over a height of 1 (any operand private)."""
    if not is_private(x, weight, bias):
        return F.conv_transpose1d(x, weight, bias, stride, padding, output_padding, groups, dilation)

    def one(v):
        return int(v[0]) if isinstance(v, (tuple, list)) else int(v)
    out = conv_transpose2d(x.unsqueeze(2), weight.unsqueeze(2), None, (1, one(stride)),
                           (0, one(padding)), (0, one(output_padding)), groups, (1, one(dilation)))
    out = out.squeeze(2)
    return out if bias is None else out.add(bias.reshape(-1, 1))


def pad(x, pad: Sequence[int], mode: str = "constant", value: float | None = None):
    if not is_private(x):
        return F.pad(x, list(pad), mode=mode, value=value)
    return x.pad(list(pad), mode=mode, value=0.0 if value is None else value)


# ----------------------------------------------------------------------- activations
def relu(x, inplace: bool = False):
    return _method(x, "relu")() if is_private(x) else F.relu(x)


def relu6(x, inplace: bool = False):
    """min(max(x, 0), 6) = relu(x) - relu(x - 6): two comparisons, exact gradient."""
    if not is_private(x):
        return F.relu6(x)
    if hasattr(x, "relu6"):
        return x.relu6()  # one comparison circuit for both bounds
    return relu(x).sub(relu(x.sub(6.0)))


def hardsigmoid(x, inplace: bool = False):
    """relu6(x + 3) / 6: one clamp (both bounds in one comparison circuit)."""
    if not is_private(x):
        return F.hardsigmoid(x)
    return relu6(x.add(3.0)).div(6)


def hardswish(x, inplace: bool = False):
    """x * relu6(x + 3) / 6: one clamp and one product."""
    if not is_private(x):
        return F.hardswish(x)
    return x.mul(relu6(x.add(3.0))).div(6)


def sigmoid(x):
    return _method(x, "sigmoid")() if is_private(x) else torch.sigmoid(x)


def tanh(x):
    return _method(x, "tanh")() if is_private(x) else torch.tanh(x)


def gelu(x, approximate: str = "none"):
    if not is_private(x):
        return F.gelu(x, approximate=approximate)
    return _method(x, "gelu")()


def silu(x, inplace: bool = False):
    if not is_private(x):
        return F.silu(x)
    fn = getattr(x, "silu", None)
    return fn() if fn is not None else x.mul(sigmoid(x))


def softmax(x, dim: int | None = None, dtype=None, _stacklevel: int = 3):
    if not is_private(x):
        return F.softmax(x, dim=dim, dtype=dtype)
    return _method(x, "softmax")(dim)


def log_softmax(x, dim: int | None = None, dtype=None, _stacklevel: int = 3):
    if not is_private(x):
        return F.log_softmax(x, dim=dim, dtype=dtype)
    return _method(x, "log_softmax")(dim)


def hardtanh(x, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False):
    """clamp(x, min_val, max_val), gradient 0 at the bounds (like torch)."""
    return _method(x, "hardtanh")(min_val, max_val) if is_private(x) else F.hardtanh(x, min_val, max_val)


def softplus(x, beta: float = 1.0, threshold: float = 20.0):
    return _method(x, "softplus")(beta, threshold) if is_private(x) else F.softplus(x, beta, threshold)


def logsigmoid(x):
    return _method(x, "logsigmoid")() if is_private(x) else F.logsigmoid(x)


def cosine_similarity(x1, x2, dim: int = 1, eps: float = 1e-8):
    if not is_private(x1, x2):
        return F.cosine_similarity(x1, x2, dim, eps)
    first = x1 if is_private(x1) else x2
    return _method(first, "cosine_similarity")(x1 if first is x2 else x2, dim, eps)


def flatten(x, start_dim: int = 0, end_dim: int = -1):
    return x.flatten(start_dim, end_dim)


# ----------------------------------------------------------------------- pooling
def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    if not is_private(x):
        return F.max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode, return_indices)
    if return_indices:
        raise UnsupportedError("max_pool2d(return_indices=True) is not supported on CrypTensors")
    return _method(x, "max_pool2d")(kernel_size, stride=stride, padding=padding,
                                    dilation=dilation, ceil_mode=ceil_mode)


def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    if not is_private(x):
        return F.avg_pool2d(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                            divisor_override)
    return _method(x, "avg_pool2d")(kernel_size, stride=stride, padding=padding,
                                    ceil_mode=ceil_mode, count_include_pad=count_include_pad,
                                    divisor_override=divisor_override)


def adaptive_avg_pool2d(x, output_size):
    if not is_private(x):
        return F.adaptive_avg_pool2d(x, output_size)
    return _method(x, "adaptive_avg_pool2d")(output_size)


# ----------------------------------------------------------------------- normalization
def layer_norm(x, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    if not is_private(x, weight, bias):
        return F.layer_norm(x, normalized_shape, weight, bias, eps)
    if not is_private(x):  # public input, private affine parameters
        out = F.layer_norm(x, normalized_shape, None, None, eps)
        out = out if weight is None else out * weight
        return out if bias is None else out + bias
    return _method(x, "layer_norm")(tuple(normalized_shape), weight, bias, eps)


def _bn_shape(x, v):
    return v.reshape(1, -1, *([1] * (x.dim() - 2)))


def batch_norm(x, running_mean, running_var, weight=None, bias=None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5):
    """torch.nn.functional.batch_norm; on a private input, CrypTensor.batch_norm (which
    updates private running statistics in place in training)."""
    if not is_private(x, running_mean, running_var, weight, bias):
        return F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)
    if is_private(x):
        return _method(x, "batch_norm")(running_mean, running_var, weight, bias, training,
                                        momentum, eps)
    if training:
        raise UnsupportedError("batch_norm in training on a public input with private "
                               "parameters: share the input first")
    # Public input, private statistics or affine parameters (evaluation).
    inv_std = _inv_sqrt(running_var.add(eps)) if is_private(running_var) else \
        torch.rsqrt(running_var + eps)
    out = (x - _bn_shape(x, running_mean)) * _bn_shape(x, inv_std)
    out = out if weight is None else out * _bn_shape(x, weight)
    return out if bias is None else out + _bn_shape(x, bias)


def _inv_sqrt(x: CrypTensor) -> CrypTensor:
    for name in ("inv_sqrt", "rsqrt"):
        fn = getattr(x, name, None)
        if fn is not None:
            return fn()
    return _method(x, "sqrt")().reciprocal()


# ----------------------------------------------------------------------- dropout
# dropout, dropout1d/2d/3d, feature_dropout, common_prg, dropout_mask: imported above from
# crypten_lite.functions.dropout (public masks from the parties' common PRG).


# ----------------------------------------------------------------------- losses
def _reduce(loss, reduction: str):
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise UnsupportedError(f"reduction={reduction!r}; use 'mean', 'sum' or 'none'")


def _diff(x, y):
    return x.sub(y) if is_private(x) else y.neg().add(x)


def mse_loss(x, target, reduction: str = "mean"):
    if not is_private(x, target):
        return F.mse_loss(x, target, reduction=reduction)
    return _reduce(_diff(x, target).square(), reduction)


def l1_loss(x, target, reduction: str = "mean"):
    if not is_private(x, target):
        return F.l1_loss(x, target, reduction=reduction)
    return _reduce(_method(_diff(x, target), "abs")(), reduction)


def binary_cross_entropy(x, target, weight=None, reduction: str = "mean"):
    """-(y log p + (1 - y) log(1 - p)), p private probabilities (log by approximation)."""
    if not is_private(x, target, weight):
        return F.binary_cross_entropy(x, target, weight, reduction=reduction)
    one_minus_x = x.neg().add(1.0)
    one_minus_y = target.neg().add(1.0) if is_private(target) else 1.0 - target
    loss = x.log().mul(target).add(one_minus_x.log().mul(one_minus_y)).neg()
    if weight is not None:
        loss = loss.mul(weight)
    return _reduce(loss, reduction)


def binary_cross_entropy_with_logits(x, target, weight=None, reduction: str = "mean",
                                     pos_weight=None):
    """BCE on logits. The forward value is softplus(x) - x*y = relu(x) - x*y +
    log(1 + exp(-|x|)); the gradient is recorded as one node, (sigmoid(x) - y) / n, so that
    backward costs one product rather than the derivatives of every approximation.
    """
    if not is_private(x, target, weight, pos_weight):
        return F.binary_cross_entropy_with_logits(x, target, weight, reduction=reduction,
                                                  pos_weight=pos_weight)
    if pos_weight is not None:
        raise UnsupportedError("binary_cross_entropy_with_logits(pos_weight=...) is not supported "
                               "on CrypTensors")
    from ..cryptensor import Deferred, no_grad
    with no_grad():
        xd = x.detach() if is_private(x) else x
        td = target.detach() if is_private(target) else target

        def value():
            # softplus(x) = relu(x) + log(1 + exp(-|x|)), relu(x) = (x + |x|) / 2.
            magnitude = _method(xd, "abs")()
            relu_x = xd.add(magnitude).div(2)
            softplus = relu_x.add(_method(magnitude.neg(), "exp")().add(1.0).log())
            loss = softplus.sub(xd.mul(td)) if is_private(xd) else softplus.sub(td.mul(xd))
            if weight is not None:
                loss = loss.mul(weight)
            return _reduce(loss, reduction)
        # The loss value (abs, exp, log: ~36 rounds) is computed only if somebody reads it;
        # a training step that only calls backward() needs the sigmoid alone.
        ref = xd if is_private(xd) else td
        shape = () if reduction in ("mean", "sum") else torch.broadcast_shapes(tuple(x.shape), tuple(target.shape))
        out = Deferred(value, shape, ref.precision, ref.dtype)
        sig = _method(xd, "sigmoid")()
    return record(out, "binary_cross_entropy_with_logits", (x, target), weight=weight,
                  reduction=reduction, sigmoid=sig)


def _one_hot(target, logits):
    """Class-index targets -> one-hot of the logits' shape (class dim 1); else unchanged."""
    classes = logits.shape[1]
    if tuple(target.shape) == tuple(logits.shape) and (not isinstance(target, torch.Tensor)
                                                       or target.is_floating_point()):
        return target  # one-hot or probabilities already
    if isinstance(target, CrypTensor):
        # Private class indices: compare with the public class numbers (one comparison each).
        shape = [1] * (target.dim() + 1)
        shape[1] = classes
        classes_t = torch.arange(classes).reshape(shape)
        return _method(target.unsqueeze(1), "eq")(classes_t).float()
    hot = F.one_hot(target.long(), classes).double()
    return hot.movedim(-1, 1) if hot.dim() > 2 else hot


def cross_entropy(x, target, weight=None, reduction: str = "mean", label_smoothing: float = 0.0):
    """Softmax cross-entropy with class-index (public or private) or one-hot targets.

    loss = -sum_c y_c log_softmax(x)_c; through autograd its gradient is
    softmax(x) - y (divided by the batch size for 'mean').
    """
    if not is_private(x, target, weight):
        return F.cross_entropy(x, target, weight, reduction=reduction, label_smoothing=label_smoothing)
    if weight is not None or label_smoothing:
        raise UnsupportedError("cross_entropy(weight=..., label_smoothing=...) is not supported on "
                               "CrypTensors")
    hot = _one_hot(target, x)
    logp = log_softmax(x, 1)
    per_sample = (logp.mul(hot) if is_private(logp) else hot.mul(logp)).sum(1).neg()
    return _reduce(per_sample, reduction)


def smooth_l1_loss(x, target, reduction: str = "mean", beta: float = 1.0):
    """0.5 d^2 / beta where |d| < beta, else |d| - beta / 2 (d = x - target): one abs (its
    comparison bit selects the branch), one Beaver round for the square, one for the select."""
    if not is_private(x, target):
        return F.smooth_l1_loss(x, target, reduction=reduction, beta=beta)
    d = _diff(x, target)
    a = _method(d, "abs")()
    if beta == 0:
        return _reduce(a, reduction)
    small = _method(a, "lt")(beta)
    quad = d.square().mul(0.5 / beta)
    return _reduce(_where(small, quad, a.sub(beta / 2)), reduction)


def huber_loss(x, target, reduction: str = "mean", delta: float = 1.0):
    """delta * smooth_l1(beta=delta): 0.5 d^2 where |d| < delta, else delta (|d| - delta/2)."""
    if not is_private(x, target):
        return F.huber_loss(x, target, reduction=reduction, delta=delta)
    return smooth_l1_loss(x, target, reduction, delta).mul(delta)


def _where(cond, a, b):
    from ..functions import where
    return where(cond, a, b)


def nll_loss(x, target, weight=None, reduction: str = "mean"):
    if not is_private(x, target, weight):
        return F.nll_loss(x, target, weight, reduction=reduction)
    hot = _one_hot(target, x)
    return _reduce(x.mul(hot).sum(1).neg(), reduction)


def _install() -> None:
    """Loss methods on CrypTensor (CrypTen has x.binary_cross_entropy(y), ...) and the torch
    functions of this module that a CrypTensor answers (F.mse_loss(x, y), F.linear, ...)."""
    from .. import torch_functions

    for name, fn in (("binary_cross_entropy", binary_cross_entropy),
                     ("binary_cross_entropy_with_logits", binary_cross_entropy_with_logits),
                     ("cross_entropy", cross_entropy), ("nll_loss", nll_loss),
                     ("mse_loss", mse_loss), ("l1_loss", l1_loss),
                     ("smooth_l1_loss", smooth_l1_loss), ("huber_loss", huber_loss)):
        setattr(CrypTensor, name, fn)
    for func, impl in ((F.binary_cross_entropy, binary_cross_entropy),
                       (F.binary_cross_entropy_with_logits, binary_cross_entropy_with_logits),
                       (F.cross_entropy, cross_entropy), (F.nll_loss, nll_loss),
                       (F.mse_loss, mse_loss), (F.l1_loss, l1_loss),
                       (F.smooth_l1_loss, smooth_l1_loss), (F.huber_loss, huber_loss),
                       (F.linear, linear), (F.hardtanh, hardtanh),
                       (F.conv_transpose1d, conv_transpose1d)):  # also a public input
        torch_functions.register(func, _torch_signature(impl))


def _torch_signature(fn):
    """torch's functional losses pass every keyword (size_average=None, reduce=None,
    ignore_index=-100, weight=None, ...): drop those at their neutral value that `fn` does
    not take, refuse the others."""
    import inspect
    accepted = set(inspect.signature(fn).parameters)
    neutral = {"size_average": None, "reduce": None, "ignore_index": -100, "weight": None,
               "pos_weight": None, "inplace": False}

    def impl(*args, **kwargs):
        for key in [k for k in kwargs if k not in accepted]:
            value = kwargs[key]
            if key in neutral and (value is None if neutral[key] is None else
                                   not isinstance(value, torch.Tensor) and value == neutral[key]):
                del kwargs[key]
            else:
                raise UnsupportedError(f"{fn.__name__}({key}=...) is not supported on CrypTensors")
        return fn(*args, **kwargs)
    impl.__name__ = fn.__name__
    return impl


_install()

__all__ = [
    "linear", "conv1d", "conv2d", "conv_transpose2d", "pad", "relu", "relu6", "sigmoid", "tanh",
    "gelu", "silu", "softmax", "log_softmax", "flatten", "max_pool2d", "avg_pool2d",
    "adaptive_avg_pool2d", "layer_norm", "batch_norm", "dropout", "mse_loss", "l1_loss",
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "cross_entropy", "nll_loss",
    "is_private", "common_prg", "dropout_mask", "conv_transpose1d", "hardtanh", "softplus",
    "logsigmoid", "cosine_similarity", "smooth_l1_loss", "huber_loss", "dropout1d", "dropout2d",
    "dropout3d", "feature_dropout", "hardswish", "hardsigmoid",
]
