"""CrypTen's `crypten.gradients`: custom autograd functions over MPCTensors.

    class Cube(crypten.gradients.AutogradFunction):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x * x
        @staticmethod
        def backward(ctx, grad_output):
            (x,) = ctx.saved_tensors
            return grad_output * 3 * x * x

`AutogradFunction.apply` runs forward without recording, and records one crypten_lite
autograd node whose backward calls the user's backward.
"""

from __future__ import annotations

import torch

from ..autograd import rules as _rules
from ..cryptensor import CrypTensor as CoreTensor
from ..cryptensor import _record, no_grad
from .tensor import unwrap, wrap


class AutogradContext:
    """Carries values from forward to backward (CrypTen's ctx)."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.context = []
        self.non_differentiable = []
        self.is_complex = False

    def save_for_backward(self, *values) -> None:
        self.context.extend(values)

    def save_multiple_for_backward(self, values) -> None:
        self.context.extend(values)

    def mark_non_differentiable(self, *values) -> None:
        self.non_differentiable.extend(values)

    @property
    def saved_tensors(self):
        return tuple(self.context)


class AutogradFunction:
    """Base class of a custom differentiable function (forward / backward staticmethods)."""

    @classmethod
    def apply(cls, *inputs, **kwargs):
        ctx = AutogradContext()
        with no_grad():
            out = cls.forward(ctx, *inputs, **kwargs)
        core_out = unwrap(out)
        core_in = tuple(unwrap(i) for i in inputs)
        if isinstance(core_out, CoreTensor):
            core_out = core_out.detach()
            return wrap(_record(core_out, "compat_custom", core_in, fn=cls, ctx=ctx))
        return out

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, grad_output):
        raise NotImplementedError


class AutogradBatchNorm(AutogradFunction):
    """CrypTen's `get_grad_fn("batchnorm")`: batch normalization with an explicit backward.

    forward(ctx, x, weight, bias, running_mean=None, running_var=None, training=False,
    eps=1e-5, momentum=0.1, inv_var=None): statistics over every dimension but 1 (C). In
    training the batch's (biased, as torch normalises) variance normalises and the running
    statistics, if given, are updated in place (unbiased variance, as torch); otherwise the
    running statistics are used. backward(ctx, grad_output) gives the gradients of x, weight
    and bias (the statistics are differentiated in training, as torch does)."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean=None, running_var=None, training=False,
                eps=1e-05, momentum=0.1, inv_var=None):
        dims = [d for d in range(x.dim()) if d != 1]
        shape = [1] * x.dim()
        shape[1] = x.shape[1]
        if training:
            mean = x.mean(dims)
            centered = x - mean.reshape(shape)
            variance = centered.square().mean(dims)
            count = x.numel() // x.shape[1]
            if running_mean is not None and running_var is not None:
                unbiased = variance * (count / max(count - 1, 1))
                running_mean.set(running_mean * (1.0 - momentum) + mean * momentum)
                running_var.set(running_var * (1.0 - momentum) + unbiased * momentum)
        else:
            if running_mean is None or running_var is None:
                raise ValueError("batchnorm: give running_mean and running_var when training is False")
            mean, variance = running_mean, running_var
            centered = x - mean.reshape(shape)
        if training or inv_var is None:
            inv_var = (1.0 / torch.sqrt(variance + eps) if isinstance(variance, torch.Tensor)
                       else (variance + eps).inv_sqrt())
        inv_var = inv_var.reshape(shape)
        weight, bias = weight.reshape(shape), bias.reshape(shape)
        x_norm = centered * inv_var
        ctx.save_multiple_for_backward((x_norm, weight, inv_var, training, dims))
        return x_norm * weight + bias

    @staticmethod
    def backward(ctx, grad_output):
        x_norm, weight, inv_var, training, dims = ctx.saved_tensors
        grad_bias = grad_output.sum(dims)
        grad_weight = (grad_output * x_norm).sum(dims)
        grad_norm = grad_output * weight
        if training:  # d/dx of (x - mean) / std with the batch's mean and std
            count = grad_output.numel() // grad_output.shape[1]
            shape = inv_var.shape
            mean_grad = grad_norm.sum(dims).reshape(shape) * (1.0 / count)
            mean_grad_norm = (grad_norm * x_norm).sum(dims).reshape(shape) * (1.0 / count)
            grad_norm = grad_norm - mean_grad - x_norm * mean_grad_norm
        return grad_norm * inv_var, grad_weight, grad_bias


# CrypTen's FUNCTION_REGISTRY, as far as crypten_lite offers it by name (its own autograd
# differentiates every op; these are the functions CrypTen's tests call directly).
FUNCTION_REGISTRY = {"batchnorm": AutogradBatchNorm}


def get_grad_fn(name: str):
    """The autograd function registered as `name` (CrypTen's get_grad_fn): None if unknown."""
    return FUNCTION_REGISTRY.get(name)


def _custom_rule(grad, *inputs, fn, ctx, **saved):
    grads = fn.backward(ctx, wrap(grad))
    if not isinstance(grads, tuple):
        grads = (grads,)
    return tuple(unwrap(g) for g in grads)


def _register() -> None:
    table = getattr(_rules, "RULES", None)
    if isinstance(table, dict) and "compat_custom" not in table:
        table["compat_custom"] = _custom_rule


_register()

__all__ = ["AutogradContext", "AutogradFunction", "AutogradBatchNorm", "get_grad_fn"]
