"""CrypTensor: the user-facing secret-shared tensor.

A CrypTensor holds this party's additive share (int64 ring elements) of a tensor, its
fixed-point `precision` (0 for integer and bool tensors), its logical `dtype`, optional
dimension `names`, and autograd state. Protocols live in `crypten_lite.mpc`; this class
decides scales, dtypes and names, and records the autograd graph.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from . import encoding
from . import names as names_mod
from .errors import ProtocolError, UnsupportedError
from .mpc import fixed, primitives, protocol
from .mpc.protocol import truncate
from .session import current

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def default_precision() -> int:
    return current().config.precision


def logical_dtype(dtype: torch.dtype) -> torch.dtype:
    """float dtypes stay (float16/bfloat16 become float32); integers -> int64; bool stays."""
    if dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    if dtype.is_floating_point:
        return dtype
    if dtype == torch.bool:
        return torch.bool
    return torch.int64


def _is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


class _GradMode:
    enabled = True


class no_grad:
    """Context manager (and decorator) disabling autograd recording, like torch.no_grad."""

    def __enter__(self):
        self._prev = _GradMode.enabled
        _GradMode.enabled = False

    def __exit__(self, *exc):
        _GradMode.enabled = self._prev

    def __call__(self, fn):
        def wrapper(*args, **kwargs):
            with self.__class__():
                return fn(*args, **kwargs)
        return wrapper


class enable_grad(no_grad):
    """Context manager re-enabling autograd recording inside no_grad (crypten_lite's or
    torch's)."""

    def __enter__(self):
        self._prev = _GradMode.enabled
        _GradMode.enabled = True
        self._torch = torch.enable_grad()
        self._torch.__enter__()

    def __exit__(self, *exc):
        self._torch.__exit__(*exc)
        _GradMode.enabled = self._prev


def is_grad_enabled() -> bool:
    """Whether operations record autograd nodes: off inside crypten_lite.no_grad() and, as
    for torch tensors, inside torch.no_grad() / torch.inference_mode()."""
    return _GradMode.enabled and torch.is_grad_enabled()


class CrypTensor:
    """A secret-shared tensor (arithmetic sharing over Z_2^64 with fixed-point encoding)."""

    __array_priority__ = 1000

    def __init__(self, share: torch.Tensor, precision: int, dtype: torch.dtype = torch.float32,
                 names: tuple | None = None, requires_grad: bool = False):
        self.share = share
        self.precision = precision
        self.dtype = dtype
        self._names = names if names is None or any(n is not None for n in names) else None
        self.requires_grad = requires_grad
        self.grad: CrypTensor | None = None
        self.grad_fn = None  # autograd node (crypten_lite.autograd)

    # ----------------------------------------------------------------- construction / reveal
    @classmethod
    def from_plain(cls, tensor: torch.Tensor | None, src: int = 0, precision: int | None = None,
                   requires_grad: bool = False, names: Sequence[str | None] | None = None) -> "CrypTensor":
        """Secret-share `tensor` held by party `src` (other parties may pass None)."""
        s = current()
        tensor, not_a_tensor = _as_input(tensor)
        encoded, refuse = None, ""
        if s.rank == src and not_a_tensor:
            # refused through the announcement, so that no party waits for a share
            refuse, tensor = not_a_tensor, torch.zeros(0)
        elif s.rank == src and tensor is not None:
            # Encoded (and range-checked) while still plaintext, before anything is sent: an
            # input outside the fixed-point range is refused on every party (announce).
            own = logical_dtype(primitives.CODES_DTYPE[primitives.DTYPE_CODES.get(tensor.dtype, 0)])
            own_prec = (precision if precision is not None else s.config.precision) if _is_float(own) else 0
            try:
                encoded = encoding.encode(tensor, own_prec)
            except ProtocolError as e:
                refuse = str(e)
        shape, src_dtype = primitives.announce(tensor, src, refuse)
        if not_a_tensor:  # at a party other than src: take part as a party without input
            protocol.share(None, src, shape)  # (its randomness stays in step), then refuse
            raise ProtocolError(f"party {s.rank}: {not_a_tensor}")
        dtype = logical_dtype(src_dtype)
        prec = (precision if precision is not None else s.config.precision) if _is_float(dtype) else 0
        if encoded is not None and encoded.shape != shape:
            encoded = encoded.reshape(shape)
        if names is None and tensor is not None:
            names = getattr(tensor, "names", None)  # older torch with named tensors
        out = cls(protocol.share(encoded, src, shape), prec, dtype, requires_grad=requires_grad,
                  names=names_mod.normalize(names, len(shape)) if names is not None else None)
        return out

    @classmethod
    def _public(cls, tensor: torch.Tensor, precision: int, dtype: torch.dtype) -> "CrypTensor":
        """The trivial sharing of a public value (no communication)."""
        return cls(protocol.public_share(encoding.encode(tensor, precision)), precision, dtype)

    def get_plain_text(self, dst: int | None = None, named: bool = False):
        """Reveal the value (to every party, or only to party `dst`; others get None)."""
        value = protocol.open_(self.share, dst)
        if value is None:
            return None
        plain = encoding.decode(value, self.precision, self.dtype)
        if named:
            return plain, self.names
        return plain

    def reveal(self, dst: int | None = None):
        """Alias of get_plain_text (CrypTen name)."""
        return self.get_plain_text(dst)

    def _new(self, share: torch.Tensor, precision: int | None = None, dtype: torch.dtype | None = None,
             names: tuple | None = None) -> "CrypTensor":
        return CrypTensor(share, self.precision if precision is None else precision,
                          self.dtype if dtype is None else dtype, names)

    # ----------------------------------------------------------------------- properties
    @property
    def shape(self) -> torch.Size:
        return self.share.shape

    def size(self, dim: int | str | None = None):
        if dim is None:
            return self.share.shape
        return self.share.shape[self._dim(dim)]

    def dim(self) -> int:
        return self.share.dim()

    ndim = property(dim)

    def numel(self) -> int:
        return self.share.numel()

    def nelement(self) -> int:
        return self.share.numel()

    def __len__(self) -> int:
        return len(self.share)

    @property
    def names(self) -> tuple:
        return self._names if self._names is not None else (None,) * self.dim()

    @property
    def is_floating_point(self) -> bool:
        return _is_float(self.dtype)

    def _dim(self, dim):
        if isinstance(dim, str):
            return names_mod.resolve_dim(self.names, dim)
        return dim

    # ------------------------------------------------------------------ named dimensions
    def rename(self, *names, **mapping) -> "CrypTensor":
        """New names for the dims: positional (all, `...` allowed) or old=new keywords."""
        if len(names) == 1 and names[0] is None and not mapping:
            return _record(self._new(self.share, names=None), "rename", (self,))
        out = self._new(self.share, names=names_mod.rename(self.names, *names, **mapping))
        return _record(out, "rename", (self,))

    def rename_(self, *names, **mapping) -> "CrypTensor":
        self._names = self.rename(*names, **mapping)._names
        return self

    def refine_names(self, *names) -> "CrypTensor":
        """Name unnamed dims (PyTorch 1.3 semantics, `...` allowed)."""
        if len(names) == 1 and isinstance(names[0], (list, tuple)):
            names = tuple(names[0])
        out = self._new(self.share, names=names_mod.refine_names(self.names, *names))
        return _record(out, "refine_names", (self,))

    def align_to(self, *order) -> "CrypTensor":
        """Permute (and add size-1 dims) so the dims follow `order` (`...` allowed)."""
        return self._aligned(names_mod.align_to(self.names, *order))

    def align_as(self, other: "CrypTensor") -> "CrypTensor":
        return self._aligned(names_mod.align_as(self.names, other.names))

    def _aligned(self, a) -> "CrypTensor":
        share = self.share.permute(a.permutation).reshape(a.view_shape(self.shape))
        out = self._new(share, names=a.names)
        return _record(out, "align", (self,), permutation=a.permutation, input_shape=self.shape,
                       permuted_shape=tuple(self.share.permute(a.permutation).shape))

    def unflatten(self, dim, sizes) -> "CrypTensor":
        """Split `dim` into several; `sizes` may be a named shape ((name, size), ...)."""
        d = self._dim(dim)
        named = sizes and isinstance(next(iter(sizes)), (tuple, list))
        plain_sizes = tuple(s for _, s in sizes) if named else tuple(sizes)
        shape = tuple(self.shape[:d]) + plain_sizes + tuple(self.shape[d + 1:])
        if named:
            names = names_mod.unflatten(self.names, d, sizes)
        elif self._names is not None:
            names = tuple(self.names[:d]) + (None,) * len(plain_sizes) + tuple(self.names[d + 1:])
        else:
            names = None
        return self._shape_op("reshape", lambda t: t.reshape(shape), names=names, input_shape=self.shape)

    def _named_flatten(self, dims, out_dim: str) -> "CrypTensor":
        names, start, end = names_mod.named_flatten(self.names, dims, out_dim)
        return self._shape_op("reshape", lambda t: t.flatten(start, end), names=names,
                              input_shape=self.shape)

    def __bool__(self):
        raise ProtocolError("a CrypTensor is secret and cannot be used as a Python bool; "
                            "reveal it with get_plain_text() first, or use crypten_lite.where()")

    __nonzero__ = __bool__

    def _no_plain(self, what: str):
        raise ProtocolError(f"{what} of a CrypTensor would need its secret value; reveal it with "
                            "get_plain_text() first (for example x.get_plain_text().item())")

    def item(self):
        """Refused: a secret has no Python value (reveal with get_plain_text() first)."""
        self._no_plain("item()")

    def tolist(self):
        """Refused: a secret has no Python value (reveal with get_plain_text() first)."""
        self._no_plain("tolist()")

    def numpy(self, *args, **kwargs):
        """Refused: a secret has no NumPy value (reveal with get_plain_text() first)."""
        self._no_plain("numpy()")

    def __float__(self):
        self._no_plain("float()")

    def __int__(self):
        self._no_plain("int()")

    def __index__(self):
        self._no_plain("use as an index (operator.index)")

    def __complex__(self):
        self._no_plain("complex()")

    def __array__(self, *args, **kwargs):
        self._no_plain("numpy.asarray()")

    def __repr__(self) -> str:
        names = f", names={self._names}" if self._names else ""
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"CrypTensor(shape={tuple(self.shape)}, dtype={self.dtype}{names}{grad}, encrypted=True)"

    def __hash__(self):
        return id(self)

    def clone(self) -> "CrypTensor":
        return _record(self._new(self.share.clone(), names=self._names), "clone", (self,))

    def detach(self) -> "CrypTensor":
        return self._new(self.share, names=self._names)

    def requires_grad_(self, flag: bool = True) -> "CrypTensor":
        self.requires_grad = flag
        return self

    # ------------------------------------------------------------------- scale helpers
    def _rescaled(self, precision: int, dtype: torch.dtype) -> torch.Tensor:
        """Share at a higher precision (local, exact)."""
        if precision < self.precision:
            return truncate(self.share, self.precision - precision)
        return self.share << (precision - self.precision) if precision != self.precision else self.share

    def _encode_public(self, other, target_dtype: torch.dtype) -> tuple[torch.Tensor, int]:
        """Encode a public operand: integers at scale 1, floats at the session precision."""
        t = torch.as_tensor(other)
        if _is_float(t.dtype):
            if _is_float(target_dtype) and torch.equal(t, torch.round(t)) and t.abs().max() < 2 ** 40 if t.numel() else False:
                return encoding.encode(t.long(), 0), 0
            prec = self.precision if _is_float(self.dtype) else default_precision()
            return encoding.encode(t, prec), prec
        return encoding.encode(t, 0), 0

    def _result_dtype(self, other) -> torch.dtype:
        return result_type(self, other)

    def _target_precision(self, dtype: torch.dtype, other: "CrypTensor | None" = None) -> int:
        if not _is_float(dtype):
            return 0
        precs = [self.precision if _is_float(self.dtype) else 0]
        if other is not None and _is_float(other.dtype):
            precs.append(other.precision)
        p = max(precs)
        return p if p > 0 else default_precision()

    # ------------------------------------------------------------------ arithmetic
    def add(self, other) -> "CrypTensor":
        """self + other (private or public)."""
        return self._add(other, 1)

    def sub(self, other) -> "CrypTensor":
        return self._add(other, -1)

    def _add(self, other, sign: int) -> "CrypTensor":
        dtype = self._arith_dtype(other)
        if isinstance(other, CrypTensor):
            prec = self._target_precision(dtype, other)
            share = self._rescaled(prec, dtype) + sign * other._rescaled(prec, dtype)
            names = _unify(self, other)
            return _record(self._new(share, prec, dtype, names), "add" if sign > 0 else "sub", (self, other))
        prec = self._target_precision(dtype)
        encoded = encoding.encode(torch.as_tensor(other), prec)
        share = protocol.add_public(self._rescaled(prec, dtype), sign * encoded)
        names = _unify(self, other)
        return _record(self._new(share, prec, dtype, names), "add" if sign > 0 else "sub", (self, other))

    def _arith_dtype(self, other) -> torch.dtype:
        dtype = self._result_dtype(other)
        if dtype == torch.bool:  # bool + bool is bool in torch only for logical ops; keep int
            dtype = torch.int64
        return dtype

    def neg(self) -> "CrypTensor":
        dtype = torch.int64 if self.dtype == torch.bool else self.dtype
        return _record(self._new(-self.share, dtype=dtype, names=self._names), "neg", (self,))

    def mul(self, other) -> "CrypTensor":
        """Elementwise product; private x private uses one Beaver round."""
        dtype = self._arith_dtype(other)
        target = self._target_precision(dtype, other if isinstance(other, CrypTensor) else None)
        if isinstance(other, CrypTensor):
            share = self._product("mul", self.share, other.share, (), self.precision + other.precision, target)
        else:
            encoded, pprec = self._encode_public(other, dtype)
            share = self._fit(self.share * encoded, self.precision + pprec, target)
        return _record(self._new(share, target, dtype, _unify(self, other)), "mul", (self, other))

    @staticmethod
    def _product(op: str, x: torch.Tensor, y: torch.Tensor, params: Sequence[int], prec: int,
                 target: int) -> torch.Tensor:
        """Shares of op(x, y) (private operands, result at `prec`) brought to `target`: the
        truncation goes with the product (one round under rss, as the protocol layer fuses)."""
        if prec > target:
            return protocol.mul_trunc(op, x, y, params, prec - target)
        share = protocol.mul(op, x, y, params)
        return share << (target - prec) if prec < target else share

    def _fit(self, share: torch.Tensor, prec: int, target: int) -> torch.Tensor:
        if prec > target:
            return truncate(share, prec - target)
        if prec < target:
            return share << (target - prec)
        return share

    def square(self) -> "CrypTensor":
        dtype = torch.int64 if self.dtype == torch.bool else self.dtype
        bits = self.precision  # x^2 is at 2 * precision
        share = protocol.square_trunc(self.share, bits) if bits else protocol.square(self.share)
        return _record(self._new(share, dtype=dtype, names=self._names), "square", (self,))

    def div(self, other, rounding_mode: str | None = None) -> "CrypTensor":
        """Division by a public scalar or tensor (private divisors: see reciprocal)."""
        if isinstance(other, CrypTensor):
            if hasattr(self, "_div_private"):
                return self._div_private(other)
            raise UnsupportedError("division by a private tensor needs crypten_lite's reciprocal")
        if rounding_mode is not None:
            raise UnsupportedError("div with rounding_mode is not supported on CrypTensors")
        divisor = torch.as_tensor(other, dtype=torch.float64)
        if (divisor == 0).any():
            raise ProtocolError("division by zero (public divisor contains 0)")
        x = self if _is_float(self.dtype) else self.float()
        # Encode 1/d with extra bits so that a large divisor keeps ~precision significant bits.
        extra = max(0, int(math.ceil(math.log2(float(divisor.abs().max())))) + 1)
        p = x.precision + extra
        share = truncate(x.share * encoding.encode(1.0 / divisor, p), p)
        out = x._new(share, names=_unify(x, other))
        return _record(out, "div", (self, other))

    truediv = div

    def matmul(self, other) -> "CrypTensor":
        """Matrix product (batched, vector cases like torch.matmul)."""
        return _record(self._bilinear("matmul", other, ()), "matmul", (self, other))

    def _bilinear(self, op: str, other, params: Sequence[int], public_fn: Callable | None = None,
                  swap: bool = False) -> "CrypTensor":
        from .provider.correlations import TRIPLE_OPS
        fn = TRIPLE_OPS[op]
        if isinstance(other, CrypTensor):
            dtype = self._arith_dtype(other)
            target = self._target_precision(dtype, other)
            owner = None if swap else getattr(other, "_fixed_owner", None)
            if owner is not None and fixed.enabled():
                # a model weight: W - B opened once per loaded model (mpc/fixed.py)
                share = self._fit(fixed.product(op, self.share, other.share, params, *owner),
                                  self.precision + other.precision, target)
            else:
                share = self._product(op, self.share, other.share, params,
                                      self.precision + other.precision, target)
        else:
            dtype = self._arith_dtype(other)
            target = self._target_precision(dtype)
            encoded, pprec = self._encode_public(other, dtype)
            share = fn(encoded, self.share, params) if swap else fn(self.share, encoded, params)
            share = self._fit(share, self.precision + pprec, target)
        out = self._new(share, target, dtype)
        if op == "matmul":
            out._names = _pair_names(self, other, names_mod.matmul, swap)
        elif self._names is not None:
            out._names = names_mod.conv_or_pool(self.names)
        return out

    def dot(self, other, weights=None) -> "CrypTensor":
        """sum(self * other), or sum(self * weights * other) (CrypTen's weighted dot)."""
        x = self if weights is None else self.mul(weights)
        return x.mul(other).sum()

    def outer(self, other) -> "CrypTensor":
        return self.unsqueeze(1).mul(other.unsqueeze(0) if isinstance(other, CrypTensor)
                                     else torch.as_tensor(other).unsqueeze(0))

    def conv1d(self, weight, bias=None, stride=1, padding=0, dilation=1, groups=1) -> "CrypTensor":
        params = (*_tuple(stride, 1), *_tuple(padding, 1), *_tuple(dilation, 1), groups)
        out = self._bilinear("conv1d", weight, params)
        out = _record(out, "conv1d", (self, weight), stride=stride, padding=padding,
                      dilation=dilation, groups=groups)
        return out if bias is None else out.add(_bias_view(bias, 1))

    def conv2d(self, weight, bias=None, stride=1, padding=0, dilation=1, groups=1) -> "CrypTensor":
        params = (*_tuple(stride, 2), *_tuple(padding, 2), *_tuple(dilation, 2), groups)
        out = self._bilinear("conv2d", weight, params)
        out = _record(out, "conv2d", (self, weight), stride=stride, padding=padding,
                      dilation=dilation, groups=groups)
        return out if bias is None else out.add(_bias_view(bias, 2))

    def conv_transpose2d(self, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                         dilation=1) -> "CrypTensor":
        params = (*_tuple(stride, 2), *_tuple(padding, 2), *_tuple(output_padding, 2),
                  *_tuple(dilation, 2), groups)
        out = self._bilinear("conv_transpose2d", weight, params)
        out = _record(out, "conv_transpose2d", (self, weight), stride=stride, padding=padding,
                      output_padding=output_padding, groups=groups, dilation=dilation)
        return out if bias is None else out.add(_bias_view(bias, 2))

    # ------------------------------------------------------------------ reductions
    def sum(self, dim=None, keepdim: bool = False) -> "CrypTensor":
        if dim is None:
            out = self._new(self.share.sum(), names=None)
        else:
            d = self._dims(dim)
            out = self._new(self.share.sum(d, keepdim=keepdim), names=_reduce_names(self, d, keepdim))
        if self.dtype == torch.bool:
            out.dtype = torch.int64
        return _record(out, "sum", (self,), dim=dim, keepdim=keepdim)

    def mean(self, dim=None, keepdim: bool = False) -> "CrypTensor":
        total = self.sum(dim, keepdim)
        count = self.numel() // max(1, total.numel()) if dim is not None or True else 1
        if dim is None:
            count = self.numel()
        return total.div(count) if _is_float(total.dtype) else total.float().div(count)

    def cumsum(self, dim) -> "CrypTensor":
        d = self._dim(dim)
        return _record(self._new(self.share.cumsum(d), names=self._names), "cumsum", (self,), dim=d)

    def _dims(self, dim):
        if isinstance(dim, (tuple, list)):
            return tuple(self._dim(d) for d in dim)
        return self._dim(dim)

    # ------------------------------------------------------------------ dtype conversion
    def float(self) -> "CrypTensor":
        return self.to(torch.float32)

    def double(self) -> "CrypTensor":
        return self.to(torch.float64)

    def long(self) -> "CrypTensor":
        return self.to(torch.int64)

    def int(self) -> "CrypTensor":
        return self.to(torch.int64)

    def bool(self) -> "CrypTensor":
        """x != 0 as a bool CrypTensor (a float below one fixed-point unit counts as 0)."""
        return self.to(torch.bool)

    def to(self, dtype=None, *args, **kwargs) -> "CrypTensor":
        """Convert the logical dtype (float -> int truncates toward zero, like torch)."""
        if not isinstance(dtype, torch.dtype):
            return self  # device moves are no-ops on CPU shares
        target = logical_dtype(dtype)
        if target == self.dtype:
            return self
        if _is_float(target):
            prec = default_precision() if not _is_float(self.dtype) else self.precision
            out = self._new(self._rescaled(prec, target), prec, target, self._names)
        elif target == torch.bool:
            if hasattr(self, "ne"):
                return self.ne(0)
            raise UnsupportedError("conversion to bool needs comparisons")
        elif _is_float(self.dtype):
            out = self._trunc_toward_zero()
        else:
            out = self._new(self.share, 0, target, self._names)
        return _record(out, "to", (self,), dtype=dtype)

    type = to

    def _trunc_toward_zero(self) -> "CrypTensor":
        """Exact int64 of a float tensor, rounding toward zero like torch's .long()."""
        with no_grad():
            t = CrypTensor(truncate(self.share, self.precision), 0, torch.int64, self._names)
            rest = self - t  # in [-1, 2): the truncation protocol may be one unit off
            t = t - (rest < 0).long() + (rest >= 1).long()  # now floor(x)
            fractional = (self - t) > 0
            return t + ((self < 0) * fractional).long()

    # ------------------------------------------------------------------ shape ops
    def _shape_op(self, name: str, fn: Callable[[torch.Tensor], torch.Tensor], names=None,
                  **saved) -> "CrypTensor":
        out = self._new(fn(self.share), names=names)
        return _record(out, name, (self,), **saved)

    def reshape(self, *shape) -> "CrypTensor":
        shape = _shape_arg(shape)
        return self._shape_op("reshape", lambda t: t.reshape(shape), input_shape=self.shape)

    def view(self, *shape) -> "CrypTensor":
        shape = _shape_arg(shape)
        return self._shape_op("reshape", lambda t: t.reshape(shape), input_shape=self.shape)

    def view_as(self, other) -> "CrypTensor":
        return self.view(other.shape)

    def reshape_as(self, other) -> "CrypTensor":
        return self.reshape(other.shape)

    def flatten(self, start_dim=0, end_dim=-1, *args) -> "CrypTensor":
        if isinstance(start_dim, (list, tuple)) and hasattr(self, "_named_flatten"):
            return self._named_flatten(start_dim, end_dim)
        s, e = self._dim(start_dim), self._dim(end_dim)
        return self._shape_op("reshape", lambda t: t.flatten(s, e), input_shape=self.shape,
                              names=_names_call("flatten", self, s, e))

    def transpose(self, dim0, dim1) -> "CrypTensor":
        d0, d1 = self._dim(dim0), self._dim(dim1)
        return self._shape_op("transpose", lambda t: t.transpose(d0, d1), dim0=d0, dim1=d1,
                              names=_names_call("transpose", self, d0, d1))

    def t(self) -> "CrypTensor":
        if self.dim() < 2:
            return self
        out = self.transpose(0, 1)
        owner = getattr(self, "_fixed_owner", None)
        if owner is not None:  # a model weight's transpose (F.linear): its own fixed mask
            out._fixed_owner = (owner[0], owner[1] + "t")
        return out

    @property
    def T(self) -> "CrypTensor":
        return self.permute(*reversed(range(self.dim())))

    def permute(self, *dims) -> "CrypTensor":
        dims = tuple(self._dim(d) for d in _shape_arg(dims))
        return self._shape_op("permute", lambda t: t.permute(dims), dims=dims,
                              names=_names_call("permute", self, dims))

    def squeeze(self, dim=None) -> "CrypTensor":
        d = None if dim is None else self._dim(dim)
        fn = (lambda t: t.squeeze()) if d is None else (lambda t: t.squeeze(d))
        names = None
        if self._names is not None:
            names = names_mod.squeeze(self.names, d, shape=tuple(self.shape))
        return self._shape_op("reshape", fn, input_shape=self.shape, names=names)

    def unsqueeze(self, dim) -> "CrypTensor":
        return self._shape_op("reshape", lambda t: t.unsqueeze(dim), input_shape=self.shape,
                              names=_names_call("unsqueeze", self, dim))

    def expand(self, *sizes) -> "CrypTensor":
        sizes = _shape_arg(sizes)
        return self._shape_op("expand", lambda t: t.expand(sizes), input_shape=self.shape,
                              names=_names_call("expand", self, len(sizes)))

    def expand_as(self, other) -> "CrypTensor":
        return self.expand(other.shape)

    def repeat(self, *sizes) -> "CrypTensor":
        sizes = _shape_arg(sizes)
        return self._shape_op("repeat", lambda t: t.repeat(sizes), input_shape=self.shape, sizes=sizes)

    def narrow(self, dim, start: int, length: int) -> "CrypTensor":
        d = self._dim(dim)
        return self._shape_op("narrow", lambda t: t.narrow(d, start, length), dim=d, start=start,
                              input_shape=self.shape, names=self._names)

    def __getitem__(self, index) -> "CrypTensor":
        index = _plain_index(index)
        return self._shape_op("getitem", lambda t: t[index], index=index, input_shape=self.shape,
                              names=_names_call("index", self, index))

    def __setitem__(self, index, value) -> None:
        index = _plain_index(index)
        if isinstance(value, CrypTensor):
            v = value._rescaled(self.precision, self.dtype)
        else:
            v = protocol.public_share(encoding.encode(torch.as_tensor(value), self.precision))
        self.share = self.share.clone()
        self.share[index] = v

    def split(self, split_size, dim=0) -> tuple["CrypTensor", ...]:
        d = self._dim(dim)
        sizes = [t.shape[d] for t in self.share.split(split_size, d)]
        out, start = [], 0
        for n in sizes:
            out.append(self.narrow(d, start, n))
            start += n
        return tuple(out)

    def chunk(self, chunks: int, dim=0) -> tuple["CrypTensor", ...]:
        d = self._dim(dim)
        size = -(-self.shape[d] // chunks)
        return self.split(size, d)

    def unbind(self, dim=0) -> tuple["CrypTensor", ...]:
        d = self._dim(dim)
        return tuple(self.select(d, i) for i in range(self.shape[d]))

    def select(self, dim, index: int) -> "CrypTensor":
        d = self._dim(dim)
        idx = (slice(None),) * d + (index,)
        return self[idx]

    def pad(self, pad: Sequence[int], mode: str = "constant", value: float | None = None) -> "CrypTensor":
        value = 0.0 if value is None else value
        if mode != "constant":
            out = self._shape_op("pad", lambda t: F.pad(t, pad, mode=mode), pad=tuple(pad), mode=mode,
                                 names=self._names)
            return out
        if value == 0:
            return self._shape_op("pad", lambda t: F.pad(t, pad), pad=tuple(pad), mode=mode,
                                  names=self._names)
        ones = torch.ones(self.shape, dtype=torch.int64)
        mask = F.pad(ones, pad, value=0)
        out = self._shape_op("pad", lambda t: F.pad(t, pad), pad=tuple(pad), mode=mode, names=self._names)
        fill = (1 - mask).to(torch.float64) * value
        return out.add(fill)

    def gather(self, dim, index: torch.Tensor) -> "CrypTensor":
        index = _plain_index(index)
        d = self._dim(dim)
        return self._shape_op("gather", lambda t: t.gather(d, index), dim=d, index=index,
                              input_shape=self.shape, names=self._names)

    def roll(self, shifts, dims=None) -> "CrypTensor":
        return self._shape_op("roll", lambda t: t.roll(shifts, dims), shifts=shifts, dims=dims,
                              names=self._names)

    def flip(self, dims) -> "CrypTensor":
        return self._shape_op("flip", lambda t: t.flip(dims), dims=dims, names=self._names)

    def contiguous(self) -> "CrypTensor":
        return self

    def cpu(self) -> "CrypTensor":
        return self

    # ------------------------------------------------------------------ operators
    __add__ = add
    __radd__ = add
    __sub__ = sub
    __mul__ = mul
    __rmul__ = mul
    __matmul__ = matmul
    __truediv__ = div
    __neg__ = neg

    def __rsub__(self, other):
        return self.neg().add(other)

    def __rmatmul__(self, other):
        return _record(self._bilinear("matmul", other, (), swap=True), "matmul", (other, self))

    def __rtruediv__(self, other):
        if hasattr(self, "reciprocal"):
            return self.reciprocal().mul(other)
        raise UnsupportedError("division by a private tensor needs crypten_lite's reciprocal")

    def __iadd__(self, other):
        return self.add(other)

    def __isub__(self, other):
        return self.sub(other)

    def __imul__(self, other):
        return self.mul(other)

    def __itruediv__(self, other):
        return self.div(other)

    def __pow__(self, exponent):
        if hasattr(self, "pow"):
            return self.pow(exponent)
        if isinstance(exponent, int) and exponent == 2:
            return self.square()
        raise UnsupportedError("pow needs crypten_lite's nonlinear functions")

    def add_(self, other):
        return self._inplace(self.add(other))

    def sub_(self, other):
        return self._inplace(self.sub(other))

    def mul_(self, other):
        return self._inplace(self.mul(other))

    def div_(self, other):
        return self._inplace(self.div(other))

    def neg_(self):
        return self._inplace(self.neg())

    def _inplace(self, result: "CrypTensor") -> "CrypTensor":
        node = result.grad_fn
        if node is not None and any(i is self for i in node.inputs):
            # result = op(self, ...): the node must keep self's OLD value and autograd state,
            # or the graph would loop on self (torch: version counters).
            if self.grad_fn is None and self.requires_grad:
                raise ProtocolError("an in-place op on a leaf CrypTensor that requires grad; "
                                    "use the out-of-place op (x = x.add(y)) or no_grad()")
            old = CrypTensor(self.share, self.precision, self.dtype, self._names, self.requires_grad)
            old.grad_fn = self.grad_fn
            node.inputs = tuple(old if i is self else i for i in node.inputs)
        self.share, self.precision, self.dtype = result.share, result.precision, result.dtype
        self._names, self.grad_fn = result._names, result.grad_fn
        self.requires_grad = self.requires_grad or result.requires_grad
        return self

    def copy_(self, other: "CrypTensor") -> "CrypTensor":
        self.share = other._rescaled(self.precision, self.dtype).clone()
        return self

    def set_(self, other: "CrypTensor") -> "CrypTensor":
        self.share, self.precision, self.dtype = other.share, other.precision, other.dtype
        return self

    # ------------------------------------------------------------------ torch interop
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        from .torch_functions import TORCH_FUNCTIONS
        impl = TORCH_FUNCTIONS.get(func)
        if impl is None:
            name = getattr(func, "__name__", str(func))
            raise UnsupportedError(f"torch.{name} is not supported on CrypTensors; use the "
                                   "CrypTensor method of the same name or see crypten_lite's docs")
        return impl(*args, **kwargs)


class Deferred(CrypTensor):
    """A CrypTensor computed on first use: a loss whose value nobody reads costs nothing.

    Its shape, dtype, precision and autograd node are known at once; the shares (and the
    protocol rounds behind them) are computed when something reads `.share`. Every party runs
    the same program, so every party computes it at the same point of the protocol.
    """

    def __init__(self, compute: Callable[[], CrypTensor], shape, precision: int, dtype: torch.dtype,
                 names: tuple | None = None):
        self._compute = compute
        self._shape = torch.Size(shape)
        super().__init__(None, precision, dtype, names)

    @property
    def share(self) -> torch.Tensor:
        if self._share is None:
            with no_grad():
                value = self._compute()
            self._share, self._compute = value.share, None
        return self._share

    @share.setter
    def share(self, value) -> None:
        self._share = value

    @property
    def shape(self) -> torch.Size:
        return self._shape

    def size(self, dim=None):
        return self._shape if dim is None else self._shape[self._dim(dim)]

    def dim(self) -> int:
        return len(self._shape)

    def numel(self) -> int:
        return math.prod(self._shape)


# ---------------------------------------------------------------------------- helpers
def _as_input(value) -> tuple[torch.Tensor | None, str]:
    """(`value` as a tensor, "") or (None, why it is not one: its type, never its value)."""
    if value is None or isinstance(value, torch.Tensor):
        return value, ""
    try:
        tensor = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        tensor = None
    if tensor is None or tensor.is_complex():
        return None, (f"cryptensor() takes a torch.Tensor, a number or a (nested) "
                      f"list of numbers to share, got a {type(value).__name__}; convert it first "
                      "(e.g. torch.tensor(...)), or pass None at the parties that have no input")
    return tensor, ""


def _dtype_probe(x):
    """A stand-in with x's dtype category and dimensionality for torch.result_type."""
    if isinstance(x, CrypTensor):
        return torch.zeros(() if x.dim() == 0 else (1,), dtype=x.dtype)
    if isinstance(x, torch.Tensor):
        return torch.zeros(() if x.dim() == 0 else (1,), dtype=x.dtype)
    if isinstance(x, (bool, int, float)):
        return x
    return torch.as_tensor(x)


def result_type(a, b) -> torch.dtype:
    """Logical dtype of a binary op on a and b, following torch.result_type exactly."""
    return logical_dtype(torch.result_type(_dtype_probe(a), _dtype_probe(b)))


def _tuple(v, n: int) -> tuple[int, ...]:
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * n


def _shape_arg(shape) -> tuple:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
        return tuple(shape[0])
    return tuple(shape)


def _bias_view(bias, spatial: int):
    if isinstance(bias, CrypTensor):
        return bias.reshape(-1, *([1] * spatial))
    return torch.as_tensor(bias).reshape(-1, *([1] * spatial))


def _plain_index(index):
    if isinstance(index, CrypTensor):
        raise UnsupportedError("indexing by a private tensor is not supported; use where() or a "
                               "one-hot product instead")
    return index


def _names_call(rule: str, x: CrypTensor, *args):
    """Output names of `rule` applied to x (None when x is unnamed: nothing to infer)."""
    if x._names is None:
        return None
    return getattr(names_mod, rule)(x.names, *args)


def _reduce_names(x: CrypTensor, dims, keepdim: bool):
    if x._names is None:
        return None
    return names_mod.reduce(x.names, dims, keepdim)


def _full_names(x) -> tuple:
    if isinstance(x, CrypTensor):
        return x.names
    return (None,) * torch.as_tensor(x).dim()


def _unify(a, b):
    """Names of a broadcasting binary op (PyTorch 1.3 right-aligned unification)."""
    an = a._names if isinstance(a, CrypTensor) else None
    bn = b._names if isinstance(b, CrypTensor) else None
    if an is None and bn is None:
        return None
    return names_mod.unify(_full_names(a), _full_names(b))


def _pair_names(a, b, rule, swap: bool = False):
    if not (isinstance(a, CrypTensor) and a._names is not None) and not (
            isinstance(b, CrypTensor) and b._names is not None):
        return None
    left, right = (_full_names(b), _full_names(a)) if swap else (_full_names(a), _full_names(b))
    return rule(left, right)


def _record(out: CrypTensor, op: str, inputs: tuple, **saved: Any) -> CrypTensor:
    """Attach an autograd node to `out` when grad mode is on and an input requires grad."""
    if is_grad_enabled() and any(isinstance(i, CrypTensor) and i.requires_grad for i in inputs):
        from .autograd import Node
        out.grad_fn = Node(op, inputs, saved, out)
        out.requires_grad = True
    return out


def cat(tensors: Sequence[CrypTensor], dim=0) -> CrypTensor:
    """Concatenate CrypTensors along `dim` (public tensors are encoded and mixed in)."""
    private = [t for t in tensors if isinstance(t, CrypTensor)]
    if not private:
        raise UnsupportedError("crypten_lite.cat needs at least one CrypTensor")
    ref0 = private[0]
    tensors = [t if isinstance(t, CrypTensor) else
               CrypTensor._public(torch.as_tensor(t), ref0.precision if _is_float(ref0.dtype) else 0,
                                  ref0.dtype if _is_float(ref0.dtype) or not torch.as_tensor(t).is_floating_point()
                                  else torch.float32) for t in tensors]
    ref = tensors[0]
    d = ref._dim(dim)
    dtype = ref.dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    prec = max(t.precision for t in tensors) if _is_float(dtype) else 0
    if _is_float(dtype) and prec == 0:
        prec = default_precision()
    share = torch.cat([t._rescaled(prec, dtype) for t in tensors], d)
    names = None
    if any(t._names is not None for t in tensors):
        from . import names as names_mod
        names = names_mod.cat([t.names for t in tensors], d)
    out = CrypTensor(share, prec, dtype, names)
    return _record(out, "cat", tuple(tensors), dim=d, sizes=[t.shape[d] for t in tensors])


def stack(tensors: Sequence[CrypTensor], dim=0) -> CrypTensor:
    """Stack CrypTensors along a new dimension `dim`."""
    return cat([t.unsqueeze(dim) for t in tensors], dim)
