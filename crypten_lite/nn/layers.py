"""Layers of crypten_lite.nn, with torch.nn's names, arguments, parameter names and shapes.

Parameters are initialized exactly as torch.nn initializes them (by building the torch layer
and copying its tensors): the model owner's plaintext initialization, not a secret. Each
layer also has `from_torch(module)`, used by crypten_lite.nn.from_pytorch.
"""

from __future__ import annotations

import torch

from ..cryptensor import CrypTensor
from ..errors import UnsupportedError
from . import functional as F
from .module import Module


def _copy(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().clone()


class _FromTorch:
    """Layers built from a torch layer of the same name: copy the constructor arguments that
    `_args` lists and every parameter and buffer."""

    _args: tuple[str, ...] = ()

    @classmethod
    def from_torch(cls, module: torch.nn.Module) -> Module:
        kwargs = {a: getattr(module, a) for a in cls._args}
        out = cls.__new__(cls)
        Module.__init__(out)
        for a, v in kwargs.items():
            object.__setattr__(out, a, v)
        for name, p in module._parameters.items():
            out.register_parameter(name, _copy(p))
        for name, b in module._buffers.items():
            out.register_buffer(name, _copy(b))
        out.train(module.training)
        return out


class Linear(_FromTorch, Module):
    """y = x W^T + b (weight [out_features, in_features])."""

    _args = ("in_features", "out_features")

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        ref = torch.nn.Linear(in_features, out_features, bias)
        self.in_features, self.out_features = in_features, out_features
        self.register_parameter("weight", _copy(ref.weight))
        self.register_parameter("bias", _copy(ref.bias))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class _ConvNd(_FromTorch, Module):
    _args = ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation",
             "groups", "padding_mode")
    _torch: type = torch.nn.Conv2d

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True, padding_mode: str = "zeros") -> None:
        super().__init__()
        ref = self._torch(in_channels, out_channels, kernel_size, stride=stride, padding=padding,
                          dilation=dilation, groups=groups, bias=bias, padding_mode=padding_mode)
        for a in self._args:
            object.__setattr__(self, a, getattr(ref, a))
        self.register_parameter("weight", _copy(ref.weight))
        self.register_parameter("bias", _copy(ref.bias))

    def _padded(self, x):
        if self.padding_mode == "zeros":
            return x, self.padding
        if isinstance(self.padding, str):
            raise UnsupportedError(f"padding={self.padding!r} with padding_mode={self.padding_mode!r}")
        amounts = []
        for p in reversed(self.padding):
            amounts += [p, p]
        return F.pad(x, amounts, mode=self.padding_mode), 0

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}")


class Conv1d(_ConvNd):
    _torch = torch.nn.Conv1d

    def forward(self, x):
        x, padding = self._padded(x)
        return F.conv1d(x, self.weight, self.bias, self.stride, padding, self.dilation, self.groups)


class Conv2d(_ConvNd):
    _torch = torch.nn.Conv2d

    def forward(self, x):
        x, padding = self._padded(x)
        return F.conv2d(x, self.weight, self.bias, self.stride, padding, self.dilation, self.groups)


class ConvTranspose2d(_FromTorch, Module):
    _args = ("in_channels", "out_channels", "kernel_size", "stride", "padding", "output_padding",
             "groups", "dilation")

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 output_padding=0, groups: int = 1, bias: bool = True, dilation=1) -> None:
        super().__init__()
        ref = torch.nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride, padding,
                                       output_padding, groups, bias, dilation)
        for a in self._args:
            object.__setattr__(self, a, getattr(ref, a))
        self.register_parameter("weight", _copy(ref.weight))
        self.register_parameter("bias", _copy(ref.bias))

    def forward(self, x):
        return F.conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding,
                                  self.output_padding, self.groups, self.dilation)


class _BatchNorm(_FromTorch, Module):
    _args = ("num_features", "eps", "momentum", "affine", "track_running_stats")
    _dims: tuple[int, ...] = (2,)

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True) -> None:
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.register_parameter("weight", torch.ones(num_features) if affine else None)
        self.register_parameter("bias", torch.zeros(num_features) if affine else None)
        if track_running_stats:
            self.register_buffer("running_mean", torch.zeros(num_features))
            self.register_buffer("running_var", torch.ones(num_features))
            self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def forward(self, x):
        if x.dim() not in self._dims:
            raise UnsupportedError(f"{type(self).__name__} expects {self._dims}-D input, got shape "
                                   f"{tuple(x.shape)}")
        use_batch = self.training or not self.track_running_stats
        if not use_batch:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                False, 0.0, self.eps)
        factor = self._factor() if self.training and self.track_running_stats else 0.0
        rm = self.running_mean if self.track_running_stats and self.training else None
        rv = self.running_var if self.track_running_stats and self.training else None
        if F.is_private(x) and rm is not None and not isinstance(rm, CrypTensor):
            # Statistics of private data are private: the running statistics become shared
            # (a trivial sharing of the public values, no traffic) and absorb them in place.
            from ..cryptensor import default_precision
            self.running_mean = CrypTensor._public(rm.double(), default_precision(), torch.float32)
            self.running_var = CrypTensor._public(rv.double(), default_precision(), torch.float32)
            rm, rv = self.running_mean, self.running_var
        return F.batch_norm(x, rm, rv, self.weight, self.bias, True, factor, self.eps)

    def _factor(self) -> float:
        if self.track_running_stats:
            self.num_batches_tracked = self.num_batches_tracked + 1
        if self.momentum is None:
            return 1.0 / float(self.num_batches_tracked)
        return self.momentum

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"


class BatchNorm1d(_BatchNorm):
    _dims = (2, 3)


class BatchNorm2d(_BatchNorm):
    _dims = (4,)


class LayerNorm(_FromTorch, Module):
    _args = ("normalized_shape", "eps", "elementwise_affine")

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True) -> None:
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.normalized_shape, self.eps, self.elementwise_affine = shape, eps, elementwise_affine
        self.register_parameter("weight", torch.ones(shape) if elementwise_affine else None)
        self.register_parameter("bias", torch.zeros(shape) if elementwise_affine and bias else None)

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class Dropout(_FromTorch, Module):
    """Zeroes elements with probability p in training, with a public mask (see functional)."""

    _args = ("p",)

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        self.p = p

    def forward(self, x):
        return F.dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


# ------------------------------------------------------------------- stateless layers
class _Stateless(_FromTorch, Module):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__()


class ReLU(_Stateless):
    def forward(self, x):
        return F.relu(x)


class ReLU6(_Stateless):
    def forward(self, x):
        return F.relu6(x)


class GELU(_FromTorch, Module):
    _args = ("approximate",)

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, self.approximate)


class SiLU(_Stateless):
    def forward(self, x):
        return F.silu(x)


class Sigmoid(_Stateless):
    def forward(self, x):
        return F.sigmoid(x)


class Tanh(_Stateless):
    def forward(self, x):
        return F.tanh(x)


class Identity(_Stateless):
    def forward(self, x):
        return x


class Hardswish(_Stateless):
    def forward(self, x):
        return F.hardswish(x)


class Hardsigmoid(_Stateless):
    def forward(self, x):
        return F.hardsigmoid(x)


class FoldedBatchNorm(_FromTorch, Module):
    """An eval-mode BatchNorm folded into a per-channel affine map (crypten_lite.nn.inference)."""

    def forward(self, x):
        shape = (1, -1) + (1,) * (x.dim() - 2)
        return _affine(x, self.scale.reshape(shape), self.shift.reshape(shape))


def _affine(x, scale, shift):
    if F.is_private(x):
        return x.mul(scale).add(shift)
    if F.is_private(scale):
        return scale.mul(x).add(shift)
    return x * scale + shift


MASK_VALUE = -(2.0 ** 14)  # added to masked scores: the private softmax's exp is 0 there


def _attention_mask(attn_mask, key_padding_mask, shape: tuple):
    """One public additive mask of the scores' shape (N, heads, L, S), or None: boolean masks
    (True = not attended) become MASK_VALUE, float masks are added (-inf clamped to MASK_VALUE,
    which a fixed-point encoding holds)."""
    if attn_mask is None and key_padding_mask is None:
        return None

    def additive(m):
        return torch.where(m, MASK_VALUE, 0.0) if m.dtype == torch.bool else m.double().clamp(min=MASK_VALUE)
    n, h, length, s = shape
    out = torch.zeros(shape, dtype=torch.float64)
    if attn_mask is not None:  # (L, S) or (N * heads, L, S)
        a = additive(attn_mask)
        out = out + (a.reshape(n, h, length, s) if a.dim() == 3 else a)
    if key_padding_mask is not None:  # (N, S)
        out = out + additive(key_padding_mask).reshape(n, 1, 1, s)
    return out.clamp(min=MASK_VALUE).to(torch.float32)


class MultiheadAttention(_FromTorch, Module):
    """torch.nn.MultiheadAttention (packed q/k/v projection, no masks, no added bias_k/v):
    scores q k^T / sqrt(d) per head, softmax, then the output projection `out_proj`."""

    _args = ("embed_dim", "num_heads", "batch_first", "dropout")

    @classmethod
    def from_torch(cls, module: torch.nn.Module) -> Module:
        if not module._qkv_same_embed_dim or module.bias_k is not None or module.add_zero_attn:
            raise UnsupportedError("MultiheadAttention with kdim/vdim != embed_dim, add_bias_kv or "
                                   "add_zero_attn is not supported by from_pytorch")
        out = super().from_torch(module)
        for name in [n for n, v in out._parameters.items() if v is None]:
            del out._parameters[name]
        out.add_module("out_proj", Linear.from_torch(module.out_proj))
        return out

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        if F.is_private(key_padding_mask, attn_mask):
            raise UnsupportedError("MultiheadAttention with a secret-shared mask is not supported")
        if is_causal and attn_mask is None:
            raise UnsupportedError("MultiheadAttention(is_causal=True) without attn_mask")
        if self.training and self.dropout:
            raise UnsupportedError("MultiheadAttention with attention dropout in training mode")
        if not self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        e, h = self.embed_dim, self.num_heads
        d = e // h
        w, b = self.in_proj_weight, self.in_proj_bias
        parts = []
        for i, t in enumerate((query, key, value)):
            part = F.linear(t, w[i * e:(i + 1) * e], None if b is None else b[i * e:(i + 1) * e])
            n, length = part.shape[0], part.shape[1]
            parts.append(part.reshape(n, length, h, d).transpose(1, 2))
        q, k, v = parts
        scores = q.mul(1.0 / d ** 0.5).matmul(k.transpose(-2, -1))
        mask = _attention_mask(attn_mask, key_padding_mask, tuple(scores.shape))
        if mask is not None:
            scores = scores.add(mask) if F.is_private(scores) else scores + mask
        attn = F.softmax(scores, -1)
        out = attn.matmul(v).transpose(1, 2).reshape(q.shape[0], q.shape[2], e)
        out = self.out_proj(out)
        if not self.batch_first:
            out = out.transpose(0, 1)
        if not need_weights:
            return out, None
        return out, attn.mean(1) if average_attn_weights else attn


class Softmax(_FromTorch, Module):
    _args = ("dim",)

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return F.softmax(x, self.dim)


class LogSoftmax(Softmax):
    def forward(self, x):
        return F.log_softmax(x, self.dim)


class Flatten(_FromTorch, Module):
    _args = ("start_dim", "end_dim")

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        return x.flatten(self.start_dim, self.end_dim)


class MaxPool2d(_FromTorch, Module):
    _args = ("kernel_size", "stride", "padding", "dilation", "ceil_mode")

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices: bool = False,
                 ceil_mode: bool = False) -> None:
        super().__init__()
        if return_indices:
            raise UnsupportedError("MaxPool2d(return_indices=True) is not supported on CrypTensors")
        self.kernel_size, self.stride, self.padding = kernel_size, stride or kernel_size, padding
        self.dilation, self.ceil_mode = dilation, ceil_mode

    def forward(self, x):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation,
                            self.ceil_mode)


class AvgPool2d(_FromTorch, Module):
    _args = ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override")

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
                 count_include_pad: bool = True, divisor_override=None) -> None:
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride or kernel_size, padding
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad
        self.divisor_override = divisor_override

    def forward(self, x):
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                            self.count_include_pad, self.divisor_override)


class AdaptiveAvgPool2d(_FromTorch, Module):
    _args = ("output_size",)

    def __init__(self, output_size) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, x):
        return F.adaptive_avg_pool2d(x, self.output_size)


class AdaptiveMaxPool2d(_FromTorch, Module):
    """torch.nn.AdaptiveMaxPool2d (variable windows; with return_indices, torch's indices)."""

    _args = ("output_size", "return_indices")

    def __init__(self, output_size, return_indices: bool = False) -> None:
        super().__init__()
        self.output_size, self.return_indices = output_size, return_indices

    def forward(self, x):
        if not isinstance(x, CrypTensor):
            return torch.nn.functional.adaptive_max_pool2d(x, self.output_size, self.return_indices)
        return x.adaptive_max_pool2d(self.output_size, return_indices=self.return_indices)


# ------------------------------------------------------------------------- losses
class _Loss(_FromTorch, Module):
    _args = ("reduction",)

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction


class MSELoss(_Loss):
    def forward(self, x, target):
        return F.mse_loss(x, target, self.reduction)


class L1Loss(_Loss):
    def forward(self, x, target):
        return F.l1_loss(x, target, self.reduction)


class BCELoss(_Loss):
    def __init__(self, weight=None, reduction: str = "mean") -> None:
        super().__init__(reduction)
        self.register_buffer("weight", weight)

    def forward(self, x, target):
        return F.binary_cross_entropy(x, target, self.weight, self.reduction)


class BCEWithLogitsLoss(BCELoss):
    def forward(self, x, target):
        return F.binary_cross_entropy_with_logits(x, target, self.weight, self.reduction)


class CrossEntropyLoss(_Loss):
    """Class-index targets (public or private int64) or one-hot / probability targets."""

    def forward(self, x, target):
        return F.cross_entropy(x, target, reduction=self.reduction)


class NLLLoss(_Loss):
    def forward(self, x, target):
        return F.nll_loss(x, target, reduction=self.reduction)
