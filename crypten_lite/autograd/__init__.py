"""Reverse-mode autograd on CrypTensors: graph nodes and a topological backward pass.

Every differentiable CrypTensor op records a Node (op name, inputs, saved values) through
`cryptensor._record`; gradient rules live in one table, `rules.RULES`, one entry per op.

Semantics follow torch.autograd:

* a leaf is a CrypTensor with `requires_grad=True` and no `grad_fn`; `backward()` *adds*
  into its `.grad` (gradient accumulation across calls; `Module.zero_grad()` /
  `Optimizer.zero_grad()` reset it to None);
* a tensor used several times (shared subexpression) receives the sum of the gradients of
  its uses: nodes run in reverse topological order, so each one runs once, after all its
  consumers;
* public operands (torch tensors, Python numbers) are constants and get no gradient;
* `backward(grad)` takes a CrypTensor or a public tensor of the output's shape; without it
  the output must have one element (the gradient is then 1).

Gradients are computed under `no_grad()`: the backward pass records nothing (no
higher-order gradients). The graph is kept after backward (like retain_graph=True); it is
freed with the output tensor.
"""

from __future__ import annotations

from typing import Any

import torch

from ..cryptensor import CrypTensor, _record
from ..errors import ProtocolError, UnsupportedError


class Node:
    """One recorded operation: `op` applied to `inputs`, with `saved` values for backward."""

    __slots__ = ("op", "inputs", "saved", "out_shape", "out_names")

    def __init__(self, op: str, inputs: tuple, saved: dict[str, Any], out):
        self.op = op
        self.inputs = inputs
        self.saved = saved
        # A Deferred output stays deferred: reading it here would compute it.
        self.saved["out"] = out if getattr(out, "_compute", None) is not None else out.detach()
        self.out_shape = tuple(out.shape)
        self.out_names = out._names

    def __repr__(self) -> str:
        return f"<{self.op}Backward>"


def _topological(root) -> list:
    """Tensors reachable from `root` through requires_grad inputs, consumers first."""
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
                if isinstance(i, CrypTensor) and i.requires_grad and id(i) not in seen:
                    stack.append((i, False))
    return order[::-1]


def _as_grad(tensor: CrypTensor, grad) -> CrypTensor:
    """The seed gradient of `backward` as a CrypTensor of the output's shape."""
    from ..cryptensor import default_precision

    if grad is None:
        if tensor.numel() != 1:
            raise UnsupportedError(
                f"backward() without a gradient needs a single-element output, got shape "
                f"{tuple(tensor.shape)}; pass grad= of that shape (e.g. out.backward(grad))")
        grad = torch.ones(tensor.shape, dtype=torch.float64)
    if not isinstance(grad, CrypTensor):
        grad = torch.as_tensor(grad, dtype=torch.float64)
        grad = CrypTensor._public(grad, default_precision(), torch.float32)
    if tuple(grad.shape) != tuple(tensor.shape):
        raise ProtocolError(f"backward: grad has shape {tuple(grad.shape)} but the output has shape "
                            f"{tuple(tensor.shape)}; pass a gradient of the output's shape")
    return grad


def backward(tensor: CrypTensor, grad=None) -> None:
    """Accumulate d(tensor)/d(leaf) . grad into every leaf's `.grad` (grad defaults to 1)."""
    from ..cryptensor import no_grad
    from .rules import RULES

    if not tensor.requires_grad:
        raise ProtocolError("backward() on a CrypTensor that does not require grad: create the "
                            "leaves with requires_grad=True (or call .requires_grad_())")
    grads = {id(tensor): _as_grad(tensor, grad)}
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
                raise UnsupportedError(f"no gradient rule for op {node.op!r}; add one to the table "
                                       "RULES in crypten_lite/autograd/rules.py")
            in_grads = rule(g, *node.inputs, **node.saved)
            if not isinstance(in_grads, tuple):
                in_grads = (in_grads,)
            for inp, ig in zip(node.inputs, in_grads):
                if ig is None or not isinstance(inp, CrypTensor) or not inp.requires_grad:
                    continue
                ig = _unbroadcast(ig, inp.shape)
                if ig._names is None and inp._names is not None:
                    ig._names = inp._names
                previous = grads.get(id(inp))
                grads[id(inp)] = ig if previous is None else previous.add(ig)


def _unbroadcast(grad: CrypTensor, shape) -> CrypTensor:
    """Sum a broadcast gradient back to `shape` (leading dims, then size-1 dims)."""
    shape = tuple(shape)
    if tuple(grad.shape) == shape:
        return grad
    lead = grad.dim() - len(shape)
    if lead > 0:
        grad = grad.sum(tuple(range(lead)))
    dims = tuple(i for i, s in enumerate(shape) if s == 1 and grad.shape[i] != 1)
    if dims:
        grad = grad.sum(dims, keepdim=True)
    return grad.reshape(shape)


def record(out: CrypTensor, op: str, inputs: tuple, **saved: Any) -> CrypTensor:
    """Record `out = op(*inputs)` for backward when grad mode is on and an input requires grad.

    For composite ops with a gradient of their own (like torch.autograd.Function): compute
    `out` under no_grad(), record it here, and add `RULES[op]` in rules.py.
    """
    return _record(out, op, inputs, **saved)


def _tensor_backward(self: CrypTensor, grad=None) -> None:
    """Accumulate gradients of this tensor into the `.grad` of every leaf it depends on."""
    backward(self, grad)


def _zero_grad(self: CrypTensor) -> None:
    self.grad = None


def _recorded(method, op: str, swap: bool = False):
    """Wrap a CrypTensor method that does not record itself so that it records `op`.

    Stop-gap for `CrypTensor.matmul` / `__rmatmul__` (cryptensor.py records conv but not
    matmul): if the method already recorded a node, nothing is added.
    """
    def wrapper(self, other, *args, **kwargs):
        out = method(self, other, *args, **kwargs)
        if isinstance(out, CrypTensor) and out.grad_fn is None:
            out = _record(out, op, (other, self) if swap else (self, other))
        return out
    wrapper.__name__ = method.__name__
    wrapper.__doc__ = method.__doc__
    wrapper._autograd_wrapped = True
    return wrapper


def _install() -> None:
    """Give CrypTensor its autograd entry points (idempotent)."""
    CrypTensor.backward = _tensor_backward
    CrypTensor.zero_grad_ = _zero_grad
    if not getattr(CrypTensor.matmul, "_autograd_wrapped", False):
        matmul = _recorded(CrypTensor.matmul, "matmul")
        CrypTensor.matmul = matmul
        CrypTensor.__matmul__ = matmul
    if not getattr(CrypTensor.__rmatmul__, "_autograd_wrapped", False):
        CrypTensor.__rmatmul__ = _recorded(CrypTensor.__rmatmul__, "matmul", swap=True)


_install()

__all__ = ["Node", "backward", "record"]
