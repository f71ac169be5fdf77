"""CrypTen's tensor types over crypten_lite's CrypTensor: MPCTensor, ptype, the "ptt" backend.

`MPCTensor` holds one core `crypten_lite.CrypTensor` (arithmetic sharing) or, with
`ptype.binary`, one XOR-shared word tensor; every op forwards to the core method of the
same name and wraps the result. Where CrypTen's semantics differ from crypten_lite's the
wrapper follows CrypTen: every value is fixed-point (integers, comparisons and bools come
back as float 0/1 tensors), `max(dim)` / `argmax` / `max_pool2d(return_indices=True)` give
one-hot indices, `ger` is the outer product.
"""

from __future__ import annotations

import enum
import functools
import logging
from typing import Any

import torch

from .. import encoding
from ..cryptensor import CrypTensor as CoreTensor
from ..errors import ProtocolError
from ..mpc import binary as binary_mod
from ..mpc import circuits, protocol, rss
from ..mpc.replicated import Replicated
from ..session import current, is_initialized
from . import config as config_mod

_REGISTRY: dict[str, type] = {}


class SecretBoolError(ProtocolError, RuntimeError):
    """bool() of a secret tensor (CrypTen raises RuntimeError)."""

_DEFAULT = {"name": "mpc"}


class CrypTensor:
    """Abstract base of CrypTen's encrypted tensor types (MPCTensor, the "ptt" backend)."""

    def __new__(cls, *args, **kwargs):
        if cls is CrypTensor:
            raise TypeError("CrypTensor is abstract: use crypten.cryptensor() or mpc.MPCTensor")
        return super().__new__(cls)

    __array_priority__ = 1000

    @staticmethod
    def set_grad_enabled(mode: bool) -> None:
        """Turn autograd recording on or off globally (CrypTen's CrypTensor.set_grad_enabled)."""
        from ..cryptensor import _GradMode
        _GradMode.enabled = bool(mode)


def register_cryptensor(name: str):
    """Class decorator registering a CrypTensor subclass under `name` (CrypTen API)."""
    def decorator(cls):
        if name in _REGISTRY:
            raise ValueError(f"cryptensor type {name!r} is already registered")
        if not issubclass(cls, CrypTensor):
            raise ValueError(f"{cls.__name__} must subclass crypten.CrypTensor")
        _REGISTRY[name] = cls
        return cls
    return decorator


def set_default_cryptensor_type(name: str) -> None:
    """Type `crypten.cryptensor()` builds: "mpc" (secret shared) or "ptt" (plaintext, debugging)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown cryptensor type {name!r}; registered: {sorted(_REGISTRY)}")
    _DEFAULT["name"] = name


def get_default_cryptensor_type() -> str:
    return _DEFAULT["name"]


def get_cryptensor_type(tensor) -> str:
    """Registered name of `tensor`'s type."""
    for name, cls in _REGISTRY.items():
        if type(tensor) is cls:
            return name
    raise ValueError(f"{type(tensor).__name__} is not a registered cryptensor type")


def cryptensor_class(name: str | None = None) -> type:
    return _REGISTRY[name or _DEFAULT["name"]]


class ptype(enum.Enum):
    """Sharing type of an MPCTensor: arithmetic (additive) or binary (XOR)."""

    arithmetic = 0
    binary = 1

    def to_tensor(self):
        return MPCTensor


arithmetic = ptype.arithmetic
binary = ptype.binary


# ------------------------------------------------------------------------- wrapping
def unwrap(value):
    """Core values of compat wrappers (recursively in lists, tuples and dicts)."""
    if isinstance(value, MPCTensor):
        return value._arithmetic_core()
    if isinstance(value, PlainTensor):
        return value._tensor
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        out = [unwrap(v) for v in value]
        return type(value)(out) if not hasattr(value, "_fields") else type(value)(*out)
    if isinstance(value, dict):
        return {k: unwrap(v) for k, v in value.items()}
    return value


def wrap(value):
    """MPCTensors for core CrypTensors (bool / int results become fixed-point 0/1, CrypTen's way)."""
    if isinstance(value, CoreTensor):
        return MPCTensor._from_core(value)
    if isinstance(value, tuple) and not isinstance(value, torch.Size):
        out = [wrap(v) for v in value]
        return tuple(out) if not hasattr(value, "_fields") else tuple(out)
    if isinstance(value, list):
        return [wrap(v) for v in value]
    return value


def _as_float(core: CoreTensor) -> CoreTensor:
    return core if core.dtype.is_floating_point else core.to(torch.float32)


def _forward(fn):
    """A core method (or function) taking and returning compat tensors."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        return wrap(fn(*unwrap(args), **unwrap(kwargs)))
    return call


def _precision() -> int:
    return int(config_mod.cfg.encoder.precision_bits)


def _max_method() -> str:
    return "pairwise" if config_mod.cfg.functions.max_method == "pairwise" else "tree"


# -------------------------------------------------------------------------- MPCTensor
class MPCTensor(CrypTensor):
    """CrypTen's MPCTensor: a secret-shared tensor (thin wrapper over crypten_lite.CrypTensor).

    Under the replicated protocol (crypten_lite's rss) `share` follows CrypTen's
    `cfg.mpc.protocol = "replicated"`, where a party's share is ONE additive tensor: the getter
    gives this party's additive component x_rank (the same tensor on every call while the value
    is unchanged), and the setter takes one int64 tensor, held as an additive-only share until
    an op or a reveal needs the tensor; then every party re-replicates it in one round
    (`_rereplicate`). Setting a share is collective there, as every party's share is.
    """

    # under rss: (the replicated share, the tensor `share` gave for it, that tensor's version,
    # the share's component version) -- see `share`
    _handed = None

    @property
    def _tensor(self) -> CoreTensor:
        """The core tensor, its share re-replicated first if it was set to one additive tensor."""
        self._settle_handed()
        core = self._core
        if _pending(core.share):
            given = core.share
            core.share = _rereplicate(given, binary=False)
            self._handed = (core.share, given, given._version, core.share.a._version)
        return core

    @_tensor.setter
    def _tensor(self, core: CoreTensor) -> None:
        self._core = core

    @property
    def _binary(self):
        """The XOR-shared words (None for an arithmetic tensor), re-replicated first if set
        to one tensor under rss."""
        self._settle_handed()
        words = self._words
        if words is not None and _pending(words):
            self._words = _rereplicate(words, binary=True)
            self._handed = (self._words, words, words._version, self._words.a._version)
        return self._words

    @_binary.setter
    def _binary(self, words) -> None:
        self._words = words

    def _held(self) -> torch.Tensor:
        """This party's share as held now (no re-replication): for shapes."""
        return self._words if self._words is not None else self._core.share

    def _settle_handed(self) -> None:
        """A tensor that `share` gave out under rss and that was then written into in place
        becomes this party's share (CrypTen's getter gives the share itself)."""
        handed = self._handed
        if handed is None:
            return
        held, given, version, held_version = handed
        if self._held() is not held or held.a._version != held_version:
            self._handed = None  # the value changed since: `given` is a past share
        elif given._version != version:
            self._handed = None
            self._put_share(given)

    def _put_share(self, value: torch.Tensor) -> None:
        if self._words is not None:
            self._words = value
        else:
            self._core.share = value

    def __init__(self, tensor, ptype=ptype.arithmetic, device=None, *args, src: int = 0,
                 requires_grad: bool = False, precision: int | None = None,
                 broadcast_size: bool = False, **kwargs):
        if tensor is None:
            raise ValueError("MPCTensor needs a tensor (parties other than src may pass [])")
        s = current()
        if not isinstance(src, int) or not 0 <= src < s.world_size:
            raise ValueError(f"src must be a party rank 0..{s.world_size - 1}, got {src!r}")
        plain = None
        if s.rank == src:
            plain = tensor if isinstance(tensor, torch.Tensor) else torch.as_tensor(tensor)
            plain = plain.detach().to(torch.float64 if plain.dtype == torch.float64 else torch.float32)
        prec = _precision() if precision is None else precision
        core = CoreTensor.from_plain(plain, src=src, precision=prec, requires_grad=requires_grad)
        self._tensor = core
        self._binary = None
        if ptype == ptype.binary:
            self._to_binary_inplace()

    @classmethod
    def _from_core(cls, core: CoreTensor) -> "MPCTensor":
        out = object.__new__(cls)
        out._tensor = _as_float(core)
        out._binary = None
        return out

    @staticmethod
    def from_shares(share: torch.Tensor, precision: int | None = None, ptype=ptype.arithmetic, **kw):
        """An MPCTensor from this party's share (already at fixed-point scale)."""
        prec = _precision() if precision is None else precision
        out = MPCTensor._from_core(CoreTensor(share, prec, torch.float32))
        if ptype == ptype.binary:
            out._binary = share
            out._tensor = CoreTensor(protocol.public_share(torch.zeros_like(share)), prec, torch.float32)
        return out

    def new(self, *args, **kwargs) -> "MPCTensor":
        """A new MPCTensor (CrypTen: same type, fresh sharing)."""
        return MPCTensor(*args, **kwargs)

    # ------------------------------------------------------------ sharing type
    @property
    def ptype(self):
        return ptype.binary if self._binary is not None else ptype.arithmetic

    def _to_binary_inplace(self) -> None:
        self._binary = protocol.a2b(self._tensor.share)

    def _arithmetic_core(self) -> CoreTensor:
        if self._binary is not None:
            raise TypeError("this op needs an arithmetic MPCTensor: call .to(crypten.mpc.arithmetic)")
        return self._tensor

    def to(self, *args, **kwargs):
        """`.to(ptype)` converts the sharing (A2B, B2A: one conversion protocol); dtypes and
        devices are accepted and ignored (every MPCTensor is fixed point on the CPU)."""
        target = args[0] if args else kwargs.get("ptype")
        if isinstance(target, ptype):
            if target == self.ptype:
                return self
            out = object.__new__(MPCTensor)
            out._tensor = self._tensor
            out._binary = None
            if target == ptype.binary:
                out._binary = protocol.a2b(self._tensor.share)
            else:
                out._tensor = CoreTensor(_b2a_words(self._binary), self._tensor.precision, torch.float32)
            return out
        return self

    def arithmetic(self) -> "MPCTensor":
        return self.to(ptype.arithmetic)

    def binary(self) -> "MPCTensor":
        return self.to(ptype.binary)

    # ------------------------------------------------------------ reveal / shares
    def get_plain_text(self, dst: int | None = None):
        """Reveal to every party (or only to `dst`; the others get None)."""
        if self._binary is not None:
            if dst is not None:
                raise ValueError("binary MPCTensors reveal to every party (dst=None)")
            value = protocol.open_xor(self._binary)
            return encoding.decode(value, self._tensor.precision, torch.float32)
        return self._tensor.get_plain_text(dst)

    def reveal(self, dst: int | None = None):
        """CrypTen's reveal(): the value at its fixed-point scale."""
        return self.get_plain_text(dst)

    @property
    def share(self) -> torch.Tensor:
        """This party's share. Under rss (CrypTen's "replicated"): this party's additive (or,
        binary, XOR) component x_rank, the sum (xor) over the parties being the value; the same
        tensor while the value is unchanged, and exactly the tensor set by the setter."""
        self._settle_handed()
        held = self._held()
        if not isinstance(held, Replicated):
            return held  # one tensor per party (additive protocol), or set and not yet used
        handed = self._handed
        if handed is not None:
            return handed[1]
        given = held.a.clone()
        self._handed = (held, given, given._version, held.a._version)
        return given

    @share.setter
    def share(self, value: torch.Tensor) -> None:
        """Set this party's share (CrypTen). Under rss `value` is this party's additive (XOR
        for binary) component, one int64 tensor; every party sets its own, and the next op or
        reveal re-replicates them in one round. A Replicated is taken as it is."""
        self._handed = None
        if not isinstance(value, Replicated) and _rss_session():
            if not isinstance(value, torch.Tensor) or value.dtype != torch.int64:
                got = value.dtype if isinstance(value, torch.Tensor) else type(value).__name__
                raise TypeError(f"party {current().rank}: MPCTensor.share takes this party's share, "
                                f"an int64 tensor of ring elements (values at fixed-point scale 2^"
                                f"{self._core.precision}), got {got}; encode with "
                                "crypten.encoder / MPCTensor(...) or .long() an integer tensor")
        self._put_share(value)

    @property
    def encoder(self):
        return _Encoder(self._core.precision)

    # ------------------------------------------------------------ autograd state
    @property
    def requires_grad(self) -> bool:
        return self._core.requires_grad

    @requires_grad.setter
    def requires_grad(self, flag: bool) -> None:
        self._core.requires_grad = flag

    @property
    def grad(self):
        g = self._core.grad
        return None if g is None else wrap(g)

    @grad.setter
    def grad(self, value) -> None:
        self._core.grad = None if value is None else unwrap(value)

    def requires_grad_(self, flag: bool = True) -> "MPCTensor":
        self._core.requires_grad = flag
        return self

    def backward(self, grad_input=None, **kwargs) -> None:
        """Backpropagate; like CrypTen, a no-op on a tensor that does not require grad."""
        core = self._arithmetic_core()
        if not core.requires_grad:
            return
        core.backward(unwrap(grad_input))

    # ------------------------------------------------------------ CrypTen-specific ops
    def ger(self, other) -> "MPCTensor":
        return _forward(self._arithmetic_core().outer)(other)

    def max(self, dim=None, keepdim: bool = False, one_hot: bool = True):
        core = self._arithmetic_core()
        if isinstance(dim, (MPCTensor, PlainTensor, torch.Tensor)):
            return wrap(core.maximum(unwrap(dim)))
        out = core.max(dim, keepdim, one_hot=one_hot, method=_max_method())
        return wrap(tuple(out) if dim is not None else out)

    def min(self, dim=None, keepdim: bool = False, one_hot: bool = True):
        core = self._arithmetic_core()
        if isinstance(dim, (MPCTensor, PlainTensor, torch.Tensor)):
            return wrap(core.minimum(unwrap(dim)))
        out = core.min(dim, keepdim, one_hot=one_hot, method=_max_method())
        return wrap(tuple(out) if dim is not None else out)

    def argmax(self, dim=None, keepdim: bool = False, one_hot: bool = True):
        return wrap(self._arithmetic_core().argmax(dim, keepdim, one_hot=one_hot, method=_max_method()))

    def argmin(self, dim=None, keepdim: bool = False, one_hot: bool = True):
        return wrap(self._arithmetic_core().argmin(dim, keepdim, one_hot=one_hot, method=_max_method()))

    def max_pool2d(self, kernel_size, padding=0, stride=None, dilation=1, ceil_mode: bool = False,
                   return_indices: bool = False):
        """CrypTen's argument order (kernel_size, padding, stride); indices are one-hot."""
        core = self._arithmetic_core()
        out = core.max_pool2d(kernel_size, stride=stride, padding=padding, dilation=dilation,
                              ceil_mode=ceil_mode)
        if not return_indices:
            return wrap(out)
        return wrap(out), _pool_one_hot(self, out, kernel_size, padding, stride, dilation, ceil_mode)

    def where(self, condition, y) -> "MPCTensor":
        cond = unwrap(condition)
        if isinstance(cond, torch.Tensor):
            cond = cond.bool()
        return wrap(self._arithmetic_core().where(cond, unwrap(y)))

    # ------------------------------------------------------------ losses as methods
    def cross_entropy(self, target, skip_forward: bool = False):
        """Softmax cross-entropy with one-hot `target` (CrypTen's form), mean over the batch."""
        from ..nn import functional as nnf
        return _forward(nnf.cross_entropy)(self, target)

    def binary_cross_entropy(self, target, weights=None, skip_forward: bool = False):
        from ..nn import functional as nnf
        return _forward(nnf.binary_cross_entropy)(self, target, weights)

    def binary_cross_entropy_with_logits(self, target, weights=None, skip_forward: bool = False):
        from ..nn import functional as nnf
        return _forward(nnf.binary_cross_entropy_with_logits)(self, target, weights)

    def rappor_loss(self, target, alpha: float, skip_forward: bool = False):
        """CrypTen's RAPPOR loss: binary cross-entropy of p = alpha s + (1 - alpha)(1 - s),
        s = sigmoid(self) (labels flipped with probability 1 - alpha); gradients by autograd
        through the same ops (`skip_forward` accepted: the forward is computed anyway)."""
        prob = self.sigmoid().mul(2 * alpha - 1).add(1 - alpha)
        return prob.binary_cross_entropy(target)

    # ------------------------------------------------------------ binary ops
    def __xor__(self, other):
        return self._bitwise("xor", other)

    def __and__(self, other):
        return self._bitwise("and", other)

    def __or__(self, other):
        return self._bitwise("or", other)

    __rxor__, __rand__, __ror__ = __xor__, __and__, __or__

    def __invert__(self):
        return self._binary_result(protocol.xor_public(self._need_binary(), -1))

    def __lshift__(self, k: int):
        return self._binary_result(binary_mod.lshift(self._need_binary(), k))

    def __rshift__(self, k: int):
        return self._binary_result(binary_mod.rshift(self._need_binary(), k))

    def _need_binary(self) -> torch.Tensor:
        if self._binary is None:
            raise TypeError("bitwise ops need a binary MPCTensor: call .to(crypten.mpc.binary)")
        return self._binary

    def _binary_result(self, words: torch.Tensor) -> "MPCTensor":
        out = object.__new__(MPCTensor)
        out._tensor = CoreTensor(torch.zeros_like(words), self._tensor.precision, torch.float32)
        out._binary = words
        return out

    def _bitwise(self, op: str, other):
        x = binary_mod.BinaryShared(self._need_binary())
        y = binary_mod.BinaryShared(other._need_binary()) if isinstance(other, MPCTensor) else \
            encoding.encode(torch.as_tensor(other), self._tensor.precision)
        z = {"xor": lambda: x ^ y, "and": lambda: x & y, "or": lambda: x | y}[op]()
        return self._binary_result(z.share)

    # ------------------------------------------------------------ forwarding
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_tensor", "_binary", "_core", "_words"):
            raise AttributeError(name)
        core = self._arithmetic_core()
        attr = getattr(core, name)
        if not callable(attr):
            return wrap(attr)
        if name.endswith("_"):  # in-place: the same MPCTensor comes back (CrypTen)
            def inplace(*args, **kwargs):
                out = attr(*unwrap(args), **unwrap(kwargs))
                return self if out is core else wrap(out)
            return inplace
        return _forward(attr)

    def __setitem__(self, index, value) -> None:
        """Write into this tensor's shares in place: views (squeeze, [i], ...) see the change,
        as in CrypTen."""
        core = self._arithmetic_core()
        index = unwrap(index)
        if isinstance(value, MPCTensor):
            v = value._arithmetic_core()._rescaled(core.precision, core.dtype)
        else:
            v = protocol.public_share(encoding.encode(torch.as_tensor(unwrap(value)), core.precision))
        core.share[index] = v

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def is_cuda(self) -> bool:
        return False

    def shallow_copy(self) -> "MPCTensor":
        """A new MPCTensor sharing this one's underlying tensor."""
        out = object.__new__(MPCTensor)
        out._tensor, out._binary = self._core, self._words  # a share set under rss stays as set
        return out

    def set(self, value) -> "MPCTensor":
        """Make this tensor hold `value` (an MPCTensor, or a public tensor encrypted from src 0)."""
        if not isinstance(value, MPCTensor):
            value = MPCTensor(value)
        self._tensor, self._binary = value._core, value._words
        self._handed = None
        return self

    def pad(self, pad, mode: str = "constant", value=0):
        """F.pad; `value` may itself be an encrypted scalar."""
        core = self._arithmetic_core()
        if not isinstance(value, MPCTensor):
            return wrap(core.pad(tuple(pad), mode=mode, value=value))
        out = core.pad(tuple(pad), mode=mode, value=0.0)
        border = 1.0 - torch.nn.functional.pad(torch.ones(core.shape), tuple(pad), value=0.0)
        return wrap(out + value._arithmetic_core().mul(border))

    def dropout(self, p: float = 0.5, training: bool = True, inplace: bool = False):
        return self._dropout("dropout", p, training, inplace)

    def _feature_dropout(self, p: float = 0.5, training: bool = True, inplace: bool = False):
        return self._dropout("_feature_dropout", p, training, inplace)

    def dropout2d(self, p: float = 0.5, training: bool = True, inplace: bool = False):
        return self._dropout("_feature_dropout", p, training, inplace)

    dropout3d = dropout2d

    def _dropout(self, name: str, p: float, training: bool, inplace: bool):
        from ..functions import dropout as dropout_mod
        if inplace:
            logging.warning(f"CrypTen {name} does not support inplace computation during training.")
        fn = dropout_mod.dropout if name == "dropout" else dropout_mod.feature_dropout
        core = self._arithmetic_core()
        out = fn(core, p, training)
        if out is core:
            out = core.clone()
        if inplace:
            self._tensor = out
            return self
        return wrap(out)

    def __len__(self) -> int:
        return len(self._held())

    def __repr__(self) -> str:
        """CrypTen's form: this party's own share (it reveals nothing by itself; each party
        prints a different one), the plaintext hidden."""
        return (f"MPCTensor(\n\t_tensor={self.share}\n\tplain_text=HIDDEN\n"
                f"\tptype={self.ptype}\n)")

    def __bool__(self):
        raise SecretBoolError("an MPCTensor is secret and cannot be used as a Python bool; "
                              "reveal it with get_plain_text() first, or use crypten.where()")

    def __hash__(self):
        return id(self)

    def size(self, dim=None):
        return self._held().shape if dim is None else self._held().shape[dim]

    @property
    def shape(self) -> torch.Size:
        return self._held().shape

    def dim(self) -> int:
        return self._held().dim()

    def nelement(self) -> int:
        return self._held().numel()

    numel = nelement

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return wrap(func(*unwrap(args), **unwrap(kwargs or {})))


class _Encoder:
    """CrypTen's FixedPointEncoder view of a tensor's scale."""

    def __init__(self, precision_bits: int):
        self._precision_bits = precision_bits
        self._scale = 2 ** precision_bits

    @property
    def scale(self) -> int:
        return self._scale

    def __eq__(self, other):
        return isinstance(other, _Encoder) and other._scale == self._scale


def _rss_session() -> bool:
    return is_initialized() and protocol.is_rss()


def _pending(share: torch.Tensor) -> bool:
    """Whether `share` is one additive tensor set under rss (not yet re-replicated)."""
    return not isinstance(share, Replicated) and _rss_session()


def _rereplicate(additive: torch.Tensor, binary: bool) -> Replicated:
    """Replicated shares of the value of which every party holds one additive (binary: XOR)
    component, as CrypTen's share setter leaves it: the 3-party additive-to-replicated
    conversion, one round, 8 B per element per party. Party i adds a fresh zero sharing (the
    pairwise "rss-zero" streams, as every reshare) and sends its component to party i - 1,
    which then holds two of the three components (uniform to it: the mask hides even a
    sharing the user made lopsided)."""
    if additive.dtype != torch.int64:
        raise TypeError(f"party {current().rank}: a share set under rss must be an int64 tensor, "
                        f"got {additive.dtype}")
    if not binary:
        return rss.reshare(additive)
    s = current()
    nxt, prev = (s.rank + 1) % 3, (s.rank + 2) % 3
    shape = tuple(additive.shape)
    z = additive ^ s.pair_prg("rss-zero", nxt).draw(shape)
    z ^= s.pair_prg("rss-zero", prev).draw(shape)
    got = s.comm.exchange({prev: z}, [nxt])[nxt]
    if got.shape != z.shape or got.dtype != z.dtype:
        raise ProtocolError(f"party {s.rank}: re-replicating a binary share of shape {shape} "
                            f"here, but party {nxt} sent shape {tuple(got.shape)} ({got.dtype}); "
                            "every party must set its share of the same tensor")
    return Replicated(z, got, s.rank)


def _b2a_words(words: torch.Tensor) -> torch.Tensor:
    """Arithmetic shares of XOR-shared 64-bit words (one round: B2A of every bit)."""
    flat = words.reshape(-1)
    bits = (flat.unsqueeze(-1) >> torch.arange(64)) & 1
    packed = circuits.pack_bits(bits.reshape(-1))
    arith = protocol.b2a(packed, bits.numel()).view(-1, 64)
    weights = torch.ones(64, dtype=torch.int64) << torch.arange(64)
    return (arith * weights).sum(-1).view(words.shape)


def _pool_one_hot(x: MPCTensor, out: CoreTensor, kernel_size, padding, stride, dilation=1,
                  ceil_mode: bool = False):
    """One-hot position of each window's maximum, CrypTen's layout (..., oh, ow, kh, kw)."""
    def pair(v):
        return (v, v) if isinstance(v, int) else tuple(v)
    k, p, d = pair(kernel_size), pair(padding), pair(dilation)
    s = k if stride is None else pair(stride)
    oh, ow = out.shape[-2], out.shape[-1]
    core = x._arithmetic_core()
    h, w = core.shape[-2], core.shape[-1]
    # windows that reach past the input (padding, ceil_mode) see a very negative filler
    need_h = (oh - 1) * s[0] + d[0] * (k[0] - 1) + 1
    need_w = (ow - 1) * s[1] + d[1] * (k[1] - 1) + 1
    pads = (p[1], max(0, need_w - w - p[1]), p[0], max(0, need_h - h - p[0]))
    padded = core.pad(pads, value=-(2.0 ** 20)) if any(pads) else core
    span = (d[0] * (k[0] - 1) + 1, d[1] * (k[1] - 1) + 1)
    windows = padded.unfold(-2, span[0], s[0]).unfold(-2, span[1], s[1])
    windows = windows[..., :oh, :ow, ::d[0], ::d[1]]
    flat = windows.reshape(*windows.shape[:-2], k[0] * k[1])
    onehot = flat.argmax(-1, one_hot=True, method=_max_method())
    return wrap(onehot.reshape(*windows.shape[:-2], k[0], k[1]))


# ----------------------------------------------------------------- plaintext backend
class PlainTensor(CrypTensor):
    """The "ptt" backend: CrypTensor's method surface computed in the clear (debugging only)."""

    def __init__(self, tensor, *args, src: int = 0, requires_grad: bool = False, **kwargs):
        if tensor is None:
            raise ValueError("PlainTensor needs a tensor")
        t = tensor if isinstance(tensor, torch.Tensor) else torch.as_tensor(tensor)
        t = t.detach().clone().float() if not t.dtype.is_floating_point else t.detach().clone()
        self._tensor = t.requires_grad_(requires_grad)

    @classmethod
    def _of(cls, t: torch.Tensor) -> "PlainTensor":
        out = object.__new__(cls)
        out._tensor = t if t.dtype.is_floating_point else t.float()
        return out

    def get_plain_text(self, dst: int | None = None) -> torch.Tensor:
        return self._tensor.detach().clone()

    reveal = get_plain_text

    def set(self, value) -> "PlainTensor":
        """CrypTen's set: this tensor takes `value`'s data, in place (returns itself)."""
        data = _plain_unwrap(value)
        self._tensor = torch.as_tensor(data, dtype=self._tensor.dtype).detach().clone()
        return self

    def __getattr__(self, name: str):
        if name.startswith("__") or name == "_tensor":
            raise AttributeError(name)
        if not hasattr(self._tensor, name) and name in _PLAIN_METHODS:
            fn = _PLAIN_METHODS[name]
            return _plain_forward(lambda *a, **k: fn(self._tensor, *a, **k))
        attr = getattr(self._tensor, name)
        if callable(attr):
            return _plain_forward(attr)
        return _plain_wrap(attr)

    @property
    def requires_grad(self) -> bool:
        return self._tensor.requires_grad

    @requires_grad.setter
    def requires_grad(self, flag: bool) -> None:
        self._tensor.requires_grad_(flag)

    @property
    def grad(self):
        g = self._tensor.grad
        return None if g is None else PlainTensor._of(g)

    @grad.setter
    def grad(self, value) -> None:
        self._tensor.grad = None if value is None else _plain_unwrap(value)

    def backward(self, grad_input=None, **kwargs) -> None:
        self._tensor.backward(_plain_unwrap(grad_input))

    def ger(self, other):
        return _plain_forward(torch.outer)(self, other)

    def __setitem__(self, index, value):
        self._tensor[index] = _plain_unwrap(value)

    def __len__(self):
        return len(self._tensor)

    def __repr__(self) -> str:
        return f"PlainTensor({self._tensor!r})"

    def size(self, dim=None):
        return self._tensor.size() if dim is None else self._tensor.size(dim)

    @property
    def shape(self):
        return self._tensor.shape

    @property
    def share(self) -> torch.Tensor:
        return self._tensor

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _plain_wrap(func(*_plain_unwrap(args), **_plain_unwrap(kwargs or {})))


def _plain_unwrap(value):
    if isinstance(value, PlainTensor):
        return value._tensor
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        return type(value)(_plain_unwrap(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain_unwrap(v) for k, v in value.items()}
    return value


def _plain_wrap(value):
    if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
        return PlainTensor._of(value)
    if isinstance(value, tuple) and not isinstance(value, torch.Size):
        return tuple(_plain_wrap(v) for v in value)
    if isinstance(value, list):
        return [_plain_wrap(v) for v in value]
    return value


def _plain_forward(fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        return _plain_wrap(fn(*_plain_unwrap(args), **_plain_unwrap(kwargs)))
    return call


# Operators: Python looks dunder methods up on the type, so forward each explicitly.
_OPERATORS = ("add sub mul truediv matmul pow radd rsub rmul rtruediv rmatmul neg abs lt le gt ge "
              "eq ne iadd isub imul itruediv getitem").split()
for _op in _OPERATORS:
    _dunder = f"__{_op}__"

    def _mpc_op(self, *args, _name=_dunder):
        if _name in ("__iadd__", "__isub__", "__imul__", "__itruediv__"):
            getattr(self._arithmetic_core(), _name[3:-2] + "_")(*unwrap(args))
            return self
        return wrap(getattr(self._arithmetic_core(), _name)(*unwrap(args)))

    def _plain_op(self, *args, _name=_dunder):
        if _name in ("__iadd__", "__isub__", "__imul__", "__itruediv__"):
            self._tensor = getattr(self._tensor, _name)(*_plain_unwrap(args))
            return self
        return _plain_wrap(getattr(self._tensor, _name)(*_plain_unwrap(args)))

    setattr(MPCTensor, _dunder, _mpc_op)
    setattr(PlainTensor, _dunder, _plain_op)

# CrypTen's x @= y returns the product as a new tensor (the operand keeps its value and graph).
MPCTensor.__imatmul__ = MPCTensor.__matmul__
PlainTensor.__imatmul__ = PlainTensor.__matmul__


def _plain_dropout(name: str, fn):
    def dropout(x, p: float = 0.5, training: bool = True, inplace: bool = False):
        if inplace:
            logging.warning(f"CrypTen {name} does not support inplace computation during training.")
        return fn(x, p, training)
    return dropout


def _plain_cross_entropy(x, target, skip_forward: bool = False):
    """CrypTen's form: one-hot (or probability) targets, mean over the batch."""
    return -(target * torch.nn.functional.log_softmax(x, 1)).sum() / x.size(0)


def _plain_rappor(x, target, alpha: float, skip_forward: bool = False):
    prob = torch.sigmoid(x) * (2 * alpha - 1) + (1 - alpha)
    return torch.nn.functional.binary_cross_entropy(prob, target)


def _plain_polynomial(x, coeffs, func: str = "mul"):
    """CrypTen's polynomial: coeffs of x^1, x^2, ... (no constant term)."""
    coeffs = coeffs.tolist() if isinstance(coeffs, torch.Tensor) else list(coeffs)
    return sum(c * x.pow(i + 1) for i, c in enumerate(coeffs))


_TF = torch.nn.functional
# The CrypTensor methods that torch.Tensor lacks, for the "ptt" backend (CrypTen's semantics).
_PLAIN_METHODS = {
    "conv1d": _TF.conv1d, "conv2d": _TF.conv2d, "conv_transpose1d": _TF.conv_transpose1d,
    "conv_transpose2d": _TF.conv_transpose2d, "avg_pool2d": _TF.avg_pool2d,
    "max_pool2d": _TF.max_pool2d, "adaptive_avg_pool2d": _TF.adaptive_avg_pool2d,
    "adaptive_max_pool2d": _TF.adaptive_max_pool2d,
    "dropout": _plain_dropout("dropout", _TF.dropout),
    "_feature_dropout": _plain_dropout("_feature_dropout", torch.feature_dropout),
    "dropout2d": _plain_dropout("dropout2d", _TF.dropout2d), "dropout3d": _plain_dropout("dropout3d", _TF.dropout3d),
    "cosine_similarity": lambda x, y, dim=1, eps=1e-8: _TF.cosine_similarity(x, y, dim, eps),
    "binary_cross_entropy": lambda x, t, weights=None, skip_forward=False: _TF.binary_cross_entropy(x, t, weights),
    "binary_cross_entropy_with_logits": lambda x, t, weights=None, skip_forward=False:
        _TF.binary_cross_entropy_with_logits(x, t, weights),
    "cross_entropy": _plain_cross_entropy, "rappor_loss": _plain_rappor,
    "hardtanh": lambda x, min_value=-1.0, max_value=1.0: _TF.hardtanh(x, min_value, max_value),
    "relu6": _TF.relu6, "pos_pow": lambda x, p: x.pow(p), "polynomial": _plain_polynomial,
    "inv_sqrt": torch.rsqrt,
    "pad": lambda x, pad, value=0, mode="constant": _TF.pad(x, pad, mode=mode, value=value),
    "batchnorm": lambda x, weight=None, bias=None, running_mean=None, running_var=None,
        training=False, eps=1e-5, momentum=0.1, inv_var=None:
        _TF.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps),
}

register_cryptensor("mpc")(MPCTensor)
register_cryptensor("ptt")(PlainTensor)
