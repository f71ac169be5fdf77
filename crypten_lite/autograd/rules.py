"""Gradient rules: one entry per recorded op, (grad_out, *inputs, **saved) -> input grads."""

from __future__ import annotations

import torch

from ..cryptensor import CrypTensor


def _const(x):
    return x.detach() if isinstance(x, CrypTensor) else x


RULES = {
    "clone": lambda g, x, **s: g,
    "add": lambda g, a, b, **s: (g, g),
    "sub": lambda g, a, b, **s: (g, g.neg()),
    "neg": lambda g, x, **s: g.neg(),
    "mul": lambda g, a, b, **s: (g.mul(_const(b)), g.mul(_const(a)) if isinstance(b, CrypTensor) else None),
    "square": lambda g, x, **s: g.mul(x.detach()).mul(2),
    "div": lambda g, a, b, **s: g.div(b),
    "reshape": lambda g, x, input_shape, **s: g.reshape(input_shape),
    "transpose": lambda g, x, dim0, dim1, **s: g.transpose(dim0, dim1),
    "to": lambda g, x, **s: g,
}
