"""The torch functions a CrypTensor answers through __torch_function__: one explicit table."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .cryptensor import CrypTensor, cat, stack


def _flip(method):
    """torch.f(public, private) -> private.method(public) for commutative ops."""
    def impl(a, b, *args, **kwargs):
        if not isinstance(a, CrypTensor):
            a, b = b, a
        return getattr(a, method)(b, *args, **kwargs)
    return impl


def _sub(a, b, alpha=1):
    if not isinstance(a, CrypTensor):
        return b.neg().add(a) if alpha == 1 else b.mul(-alpha).add(a)
    return a.sub(b if alpha == 1 else b * alpha)


def _add(a, b, alpha=1):
    if alpha != 1:
        b = b * alpha
    return _flip("add")(a, b)


def _matmul(a, b):
    if isinstance(a, CrypTensor):
        return a.matmul(b)
    return b.__rmatmul__(a)


def _div(a, b, rounding_mode=None):
    if isinstance(a, CrypTensor):
        return a.div(b, rounding_mode=rounding_mode)
    return b.__rtruediv__(a)


def _method(name):
    return lambda x, *args, **kwargs: getattr(x, name)(*args, **kwargs)


TORCH_FUNCTIONS = {
    torch.add: _add,
    torch.sub: _sub,
    torch.subtract: _sub,
    torch.mul: _flip("mul"),
    torch.multiply: _flip("mul"),
    torch.div: _div,
    torch.divide: _div,
    torch.true_divide: _div,
    torch.matmul: _matmul,
    torch.mm: _matmul,
    torch.bmm: _matmul,
    torch.mv: _matmul,
    torch.dot: _method("dot"),
    torch.outer: _method("outer"),
    torch.neg: _method("neg"),
    torch.negative: _method("neg"),
    torch.square: _method("square"),
    torch.sum: _method("sum"),
    torch.mean: _method("mean"),
    torch.cumsum: _method("cumsum"),
    torch.reshape: _method("reshape"),
    torch.flatten: _method("flatten"),
    torch.transpose: _method("transpose"),
    torch.t: _method("t"),
    torch.permute: _method("permute"),
    torch.squeeze: _method("squeeze"),
    torch.unsqueeze: _method("unsqueeze"),
    torch.narrow: _method("narrow"),
    torch.split: _method("split"),
    torch.chunk: _method("chunk"),
    torch.unbind: _method("unbind"),
    torch.select: _method("select"),
    torch.gather: _method("gather"),
    torch.roll: _method("roll"),
    torch.flip: _method("flip"),
    torch.cat: lambda tensors, dim=0: cat(tensors, dim),
    torch.concat: lambda tensors, dim=0: cat(tensors, dim),
    torch.stack: lambda tensors, dim=0: stack(tensors, dim),
    F.conv1d: _method("conv1d"),
    F.conv2d: _method("conv2d"),
    F.conv_transpose2d: _method("conv_transpose2d"),
    F.pad: _method("pad"),
}
TORCH_FUNCTIONS[torch.Tensor.__getitem__] = lambda x, idx: x[idx]

# Operators with a public torch tensor on the left (p + x calls torch.Tensor.__add__(p, x)).
TORCH_FUNCTIONS.update({
    torch.Tensor.__add__: _add,
    torch.Tensor.__radd__: _add,
    torch.Tensor.__sub__: _sub,
    torch.Tensor.__rsub__: lambda a, b: _sub(b, a),
    torch.Tensor.__mul__: _flip("mul"),
    torch.Tensor.__rmul__: _flip("mul"),
    torch.Tensor.__matmul__: _matmul,
    torch.Tensor.__rmatmul__: lambda a, b: _matmul(b, a),
    torch.Tensor.__truediv__: _div,
    torch.Tensor.__rtruediv__: lambda a, b: _div(b, a),
    torch.Tensor.__div__ if hasattr(torch.Tensor, "__div__") else torch.Tensor.div: _div,
    torch.Tensor.add: _add,
    torch.Tensor.sub: _sub,
    torch.Tensor.mul: _flip("mul"),
    torch.Tensor.matmul: _matmul,
})


def register(func, impl) -> None:
    """Let a higher module (comparisons, nonlinear functions, nn) add torch functions."""
    TORCH_FUNCTIONS[func] = impl
