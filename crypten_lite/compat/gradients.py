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

__all__ = ["AutogradContext", "AutogradFunction"]
