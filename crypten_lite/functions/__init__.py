"""Comparisons, piecewise-linear functions, reductions, pooling and nonlinear functions.

Importing this package attaches the functions to CrypTensor through ONE explicit table
(``METHODS``) and registers the torch functions of the same name (``TORCH``) with
crypten_lite.torch_functions, so that ``x.relu()``, ``crypten_lite.functions.relu(x)`` and
``torch.relu(x)`` / ``F.relu(x)`` all work. Protocols: crypten_lite.mpc.{binary, circuits,
convert}; domains and errors: docs/functions.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import torch_functions
from ..cryptensor import CrypTensor
from ..errors import UnsupportedError
from .comparisons import (abs_, clamp, eq, ge, gt, hardtanh, le, lt, maximum, minimum, ne, relu,
                          relu6, sign, where)
from .nonlinear import (cos, div_private, erf, exp, gelu, inv_sqrt, log, log_softmax, polynomial,
                        pow_, reciprocal, sigmoid, silu, sin, softmax, sqrt, tanh)
from .normalization import batch_norm, layer_norm, rms_norm
from .pooling import (adaptive_avg_pool2d, adaptive_max_pool2d, avg_pool2d, max_pool1d,
                      max_pool2d, relu_max_pool2d)
from .reductions import amax, amin, argmax, argmin, max_, min_
from .rounding import ceil, floor, trunc, trunc_toward_zero
from . import dropout as _dropout_mod
from .indexing import (__imatmul__, conv_transpose1d, ger, index_add, index_select, scatter,
                       scatter_add, take, trace, unfold)
from .sampling import bernoulli, rand, weighted_index, weighted_sample
from .statistics import (cosine_similarity, cossin, logsigmoid, norm, pos_pow, prod, softplus, std,
                         var)

abs = abs_      # noqa: A001 - module-level names mirror torch
max = max_      # noqa: A001
min = min_      # noqa: A001
pow = pow_      # noqa: A001
rsqrt = inv_sqrt
clip = clamp


def _max_method(self, dim=None, keepdim: bool = False, one_hot: bool = False, method: str = "tree"):
    if isinstance(dim, (CrypTensor, torch.Tensor)):
        return maximum(self, dim)
    return max_(self, dim, keepdim, one_hot, method)


def _min_method(self, dim=None, keepdim: bool = False, one_hot: bool = False, method: str = "tree"):
    if isinstance(dim, (CrypTensor, torch.Tensor)):
        return minimum(self, dim)
    return min_(self, dim, keepdim, one_hot, method)


def _where_method(self, condition, other):
    return where(condition, self, other)


# ----------------------------------------------------------------- CrypTensor methods
METHODS = {
    "lt": lt, "le": le, "gt": gt, "ge": ge, "eq": eq, "ne": ne,
    "__lt__": lt, "__le__": le, "__gt__": gt, "__ge__": ge, "__eq__": eq, "__ne__": ne,
    "sign": sign, "abs": abs_, "__abs__": abs_, "relu": relu, "where": _where_method,
    "clamp": clamp, "clip": clamp, "hardtanh": hardtanh, "relu6": relu6,
    "maximum": maximum, "minimum": minimum,
    "max": _max_method, "min": _min_method, "argmax": argmax, "argmin": argmin,
    "amax": amax, "amin": amin, "clamp_min": lambda x, min: clamp(x, min=min),
    "clamp_max": lambda x, max: clamp(x, max=max),
    "max_pool1d": max_pool1d, "max_pool2d": max_pool2d, "avg_pool2d": avg_pool2d,
    "relu_max_pool2d": relu_max_pool2d,
    "adaptive_avg_pool2d": adaptive_avg_pool2d, "adaptive_max_pool2d": adaptive_max_pool2d,
    "exp": exp, "log": log, "reciprocal": reciprocal, "_div_private": div_private,
    "sqrt": sqrt, "rsqrt": inv_sqrt, "inv_sqrt": inv_sqrt, "pow": pow_,
    "sigmoid": sigmoid, "tanh": tanh, "softmax": softmax, "log_softmax": log_softmax,
    "erf": erf, "gelu": gelu, "silu": silu, "layer_norm": layer_norm, "batch_norm": batch_norm,
    "rms_norm": rms_norm,
    "polynomial": polynomial, "cos": cos, "sin": sin,
    "floor": floor, "ceil": ceil, "trunc": trunc, "_trunc_toward_zero": trunc_toward_zero,
}


# The ops CrypTen's CrypTensor has beyond the ones above (issue 12), and in-place variants.
def _in_place(name: str):
    def method(self, *args, **kwargs):
        return self._inplace(getattr(self, name)(*args, **kwargs))
    method.__name__ = name + "_"
    method.__doc__ = f"In-place {name} (the share is replaced; same cost as {name})."
    return method


def _dropout_method(fn):
    def method(self, p: float = 0.5, training: bool = True, inplace: bool = False):
        return fn(self, p, training, inplace)
    method.__name__ = fn.__name__
    method.__doc__ = fn.__doc__
    return method


METHODS.update({
    "scatter": scatter, "scatter_add": scatter_add, "index_select": index_select,
    "index_add": index_add, "take": take, "unfold": unfold, "trace": trace, "ger": ger,
    "conv_transpose1d": conv_transpose1d, "__imatmul__": __imatmul__,
    "prod": prod, "var": var, "std": std, "norm": norm, "pos_pow": pos_pow,
    "cosine_similarity": cosine_similarity, "softplus": softplus, "logsigmoid": logsigmoid,
    "cossin": cossin, "bernoulli": bernoulli, "weighted_index": weighted_index,
    "weighted_sample": weighted_sample,
    "dropout": _dropout_method(_dropout_mod.dropout),
    "dropout1d": _dropout_method(_dropout_mod.dropout1d),
    "dropout2d": _dropout_method(_dropout_mod.dropout2d),
    "dropout3d": _dropout_method(_dropout_mod.dropout3d),
    "feature_dropout": _dropout_method(_dropout_mod.feature_dropout),
    "_feature_dropout": _dropout_method(_dropout_mod.feature_dropout),
})
for _name in ("scatter", "scatter_add", "index_add", "pow", "square", "abs", "relu", "sqrt", "exp",
              "log", "reciprocal", "sigmoid", "tanh", "clamp", "sign", "hardtanh", "relu6"):
    METHODS[_name + "_"] = _in_place(_name)
for _name, _fn in METHODS.items():
    setattr(CrypTensor, _name, _fn)


# -------------------------------------------------------------------- torch functions
def _first_private(fn):
    """torch.f(a, b) where only b may be private: comparisons flip inside _compare."""
    return lambda a, b, *args, **kwargs: fn(a, b)


def _torch_max(x, dim=None, keepdim=False, *, out=None):
    return _max_method(x, dim, keepdim)


def _torch_min(x, dim=None, keepdim=False, *, out=None):
    return _min_method(x, dim, keepdim)


def _softmax(x, dim=None, _stacklevel=3, dtype=None):
    return softmax(x, -1 if dim is None else dim)


def _log_softmax(x, dim=None, _stacklevel=3, dtype=None):
    return log_softmax(x, -1 if dim is None else dim)


def _pool(fn, indices=None):
    def impl(x, *args, **kwargs):
        if indices is not None:
            kwargs["return_indices"] = indices
        return fn(x, *args, **kwargs)
    return impl


def _drop_inplace(fn):
    def impl(x, *args, inplace=False, **kwargs):
        return fn(x, *args, **kwargs)
    return impl


def _layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    return layer_norm(x, normalized_shape, weight, bias, eps)


def _batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False,
                momentum=0.1, eps=1e-5):
    return batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)


def _pow(x, exponent):
    if not isinstance(x, CrypTensor):
        raise UnsupportedError("torch.pow with a private exponent is not supported; "
                               "use exp(y * log(x))")
    return pow_(x, exponent)


TORCH = {
    torch.lt: _first_private(lt), torch.le: _first_private(le), torch.gt: _first_private(gt),
    torch.ge: _first_private(ge), torch.eq: _first_private(eq), torch.ne: _first_private(ne),
    torch.less: _first_private(lt), torch.less_equal: _first_private(le),
    torch.greater: _first_private(gt), torch.greater_equal: _first_private(ge),
    torch.not_equal: _first_private(ne),
    torch.Tensor.lt: _first_private(lt), torch.Tensor.le: _first_private(le),
    torch.Tensor.gt: _first_private(gt), torch.Tensor.ge: _first_private(ge),
    torch.Tensor.eq: _first_private(eq), torch.Tensor.ne: _first_private(ne),
    torch.Tensor.__lt__: _first_private(lt), torch.Tensor.__le__: _first_private(le),
    torch.Tensor.__gt__: _first_private(gt), torch.Tensor.__ge__: _first_private(ge),
    torch.Tensor.__eq__: _first_private(eq), torch.Tensor.__ne__: _first_private(ne),
    torch.sign: sign, torch.abs: abs_, torch.absolute: abs_, torch.relu: relu,
    F.relu: _drop_inplace(relu), F.relu6: _drop_inplace(relu6), F.hardtanh: _drop_inplace(hardtanh),
    torch.where: where, torch.clamp: clamp, torch.clip: clamp,
    torch.maximum: maximum, torch.minimum: minimum,
    torch.max: _torch_max, torch.min: _torch_min, torch.argmax: argmax, torch.argmin: argmin,
    torch.amax: amax, torch.amin: amin, torch.clamp_min: lambda x, min: clamp(x, min=min),
    torch.clamp_max: lambda x, max: clamp(x, max=max), torch.special.expit: sigmoid,
    F.max_pool1d: _pool(max_pool1d), F.max_pool2d: _pool(max_pool2d),
    F.avg_pool2d: avg_pool2d, F.adaptive_avg_pool2d: adaptive_avg_pool2d,
    F.adaptive_max_pool2d: _pool(adaptive_max_pool2d),
    torch.exp: exp, torch.log: log, torch.reciprocal: reciprocal, torch.sqrt: sqrt,
    torch.rsqrt: inv_sqrt, torch.pow: _pow, torch.sigmoid: sigmoid, F.sigmoid: sigmoid,
    torch.tanh: tanh, F.tanh: tanh, torch.softmax: _softmax, F.softmax: _softmax,
    torch.log_softmax: _log_softmax, F.log_softmax: _log_softmax, torch.erf: erf,
    torch.special.erf: erf, F.gelu: gelu, F.silu: _drop_inplace(silu),
    F.layer_norm: _layer_norm, F.batch_norm: _batch_norm, torch.cos: cos, torch.sin: sin,
    torch.floor: floor, torch.ceil: ceil, torch.trunc: trunc,
}


def _torch_take(x, index):
    return take(x, index)


def _torch_var(fn):
    def impl(x, dim=None, unbiased=None, keepdim=False, *, correction=None, out=None):
        return fn(x, dim, unbiased, keepdim, correction=correction)
    return impl


def _torch_norm(x, p="fro", dim=None, keepdim=False, out=None, dtype=None):
    return norm(x, p, dim, keepdim)


def _vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None, out=None):
    return norm(x, ord, dim, keepdim)


def _torch_prod(x, dim=None, keepdim=False, *, dtype=None, out=None):
    return prod(x, dim, keepdim)


def _scatter_fn(fn):
    def impl(x, dim, index, src=None, value=None, *, reduce=None, out=None):
        if reduce is not None:
            raise UnsupportedError("scatter(reduce=...) is not supported on CrypTensors; use "
                                   "scatter_add")
        return fn(x, dim, index, src if src is not None else value)
    return impl


def _index_add(x, dim, index, source, *, alpha=1, out=None):
    return index_add(x, dim, index, source, alpha)


def _softplus(x, beta=1.0, threshold=20.0):
    return softplus(x, beta, threshold)


def _cosine(x1, x2, dim=1, eps=1e-8):
    return cosine_similarity(x1, x2, dim, eps)


def _torch_dropout(fn):
    """torch.dropout / torch.feature_dropout: (input, p, train) positional."""
    return lambda x, p, train: fn(x, p, train)


TORCH.update({
    torch.prod: _torch_prod, torch.var: _torch_var(var), torch.std: _torch_var(std),
    torch.norm: _torch_norm, torch.linalg.vector_norm: _vector_norm, torch.trace: trace,
    torch.ger: ger, torch.index_select: index_select, torch.take: _torch_take,
    torch.scatter: _scatter_fn(scatter), torch.scatter_add: _scatter_fn(scatter_add),
    torch.index_add: _index_add, torch.cosine_similarity: _cosine, F.cosine_similarity: _cosine,
    F.conv_transpose1d: conv_transpose1d, F.softplus: _softplus, F.logsigmoid: logsigmoid,
    F.dropout: _dropout_mod.dropout, F.dropout1d: _dropout_mod.dropout1d,
    F.dropout2d: _dropout_mod.dropout2d, F.dropout3d: _dropout_mod.dropout3d,
    torch.dropout: _torch_dropout(_dropout_mod.dropout),
    torch.feature_dropout: _torch_dropout(_dropout_mod.feature_dropout),
    # a public tensor's method with a CrypTensor operand (torch.zeros(3).scatter_add(0, i, x))
    torch.Tensor.scatter: _scatter_fn(scatter), torch.Tensor.scatter_add: _scatter_fn(scatter_add),
    torch.Tensor.index_add: _index_add,
    torch.bernoulli: lambda x, *args, generator=None, out=None: bernoulli(x),
})

# torch.nn.functional's max pools dispatch through private helpers (boolean_dispatch).
for _mod_name, _fn, _idx in (("_max_pool1d", max_pool1d, False), ("max_pool1d_with_indices", max_pool1d, True),
                             ("_max_pool2d", max_pool2d, False), ("max_pool2d_with_indices", max_pool2d, True),
                             ("_adaptive_max_pool2d", adaptive_max_pool2d, False),
                             ("adaptive_max_pool2d_with_indices", adaptive_max_pool2d, True)):
    if hasattr(F, _mod_name):
        TORCH[getattr(F, _mod_name)] = _pool(_fn, _idx)
if hasattr(F, "rms_norm"):
    TORCH[F.rms_norm] = rms_norm
for _func, _impl in TORCH.items():
    torch_functions.register(_func, _impl)

__all__ = sorted(["METHODS", "TORCH"] + [n for n in (
    "lt le gt ge eq ne sign abs relu where clamp clip hardtanh relu6 maximum minimum max min argmax amax amin "
    "argmin max_pool1d max_pool2d relu_max_pool2d avg_pool2d adaptive_avg_pool2d adaptive_max_pool2d exp log "
    "reciprocal div_private sqrt rsqrt inv_sqrt pow sigmoid tanh softmax log_softmax erf gelu silu "
    "layer_norm batch_norm rms_norm polynomial cos sin floor ceil trunc scatter scatter_add index_select "
    "index_add take unfold trace ger conv_transpose1d prod var std norm pos_pow cosine_similarity "
    "softplus logsigmoid cossin rand bernoulli weighted_index weighted_sample").split()])
