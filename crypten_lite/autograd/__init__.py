"""Reverse-mode autograd on CrypTensors: graph nodes and a topological backward pass.

Every differentiable CrypTensor op records a Node (op name, inputs, saved values); gradient
rules live in one table, `rules.RULES`, one entry per op.
"""

from __future__ import annotations

from typing import Any

from ..errors import UnsupportedError


class Node:
    """One recorded operation: `op` applied to `inputs`, with `saved` values for backward."""

    __slots__ = ("op", "inputs", "saved", "out_shape", "out_names")

    def __init__(self, op: str, inputs: tuple, saved: dict[str, Any], out):
        self.op = op
        self.inputs = inputs
        self.saved = saved
        self.saved["out"] = out.detach()
        self.out_shape = tuple(out.shape)
        self.out_names = out._names

    def __repr__(self) -> str:
        return f"<{self.op}Backward>"


def _topological(root) -> list:
    order, seen = [], set()
    stack = [(root, False)]
    while stack:
        t, done = stack.pop()
        if done:
            order.append(t)
            continue
        if id(t) in seen:
            continue
        seen.add(id(t))
        stack.append((t, True))
        if t.grad_fn is not None:
            for i in t.grad_fn.inputs:
                if hasattr(i, "grad_fn") and getattr(i, "requires_grad", False) and id(i) not in seen:
                    stack.append((i, False))
    return order[::-1]


def backward(tensor, grad=None) -> None:
    """Accumulate d(tensor)/d(leaf) into every leaf's `.grad` (grad defaults to ones)."""
    from ..cryptensor import CrypTensor, no_grad
    from .rules import RULES

    if grad is None:
        if tensor.numel() != 1:
            raise UnsupportedError("backward() without a gradient needs a single-element output; "
                                   "pass grad= of the output's shape")
        import torch
        grad = CrypTensor._public(torch.ones(tensor.shape, dtype=torch.float64),
                                  tensor.precision or 16, torch.float32)
    grads = {id(tensor): grad}
    with no_grad():
        for t in _topological(tensor):
            g = grads.pop(id(t), None)
            if g is None:
                continue
            if t.grad_fn is None:
                t.grad = g if t.grad is None else t.grad.add(g)
                continue
            node = t.grad_fn
            rule = RULES.get(node.op)
            if rule is None:
                raise UnsupportedError(f"no gradient rule for op {node.op!r}; add one to "
                                       "crypten_lite/autograd/rules.py RULES")
            in_grads = rule(g, *node.inputs, **node.saved)
            if not isinstance(in_grads, tuple):
                in_grads = (in_grads,)
            for inp, ig in zip(node.inputs, in_grads):
                if ig is None or not isinstance(inp, CrypTensor) or not inp.requires_grad:
                    continue
                ig = _unbroadcast(ig, inp.shape)
                if id(inp) in grads:
                    grads[id(inp)] = grads[id(inp)].add(ig)
                else:
                    grads[id(inp)] = ig
                    if ig._names is None and inp._names is not None:
                        ig._names = inp._names


def _unbroadcast(grad, shape):
    """Sum a broadcast gradient back to `shape`."""
    shape = tuple(shape)
    if tuple(grad.shape) == shape:
        return grad
    while grad.dim() > len(shape):
        grad = grad.sum(0)
    for i, s in enumerate(shape):
        if s == 1 and grad.shape[i] != 1:
            grad = grad.sum(i, keepdim=True)
    return grad
