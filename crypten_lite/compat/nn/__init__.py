"""CrypTen's `crypten.nn` over crypten_lite.nn: the same layers, CrypTen's module API.

Every crypten_lite layer is offered under its name with CrypTen's methods added
(`encrypt(mode=, src=)`, `set_parameter`, `update_parameters`, ...); its forward is
crypten_lite's, run on the wrapped tensors. A user's own `crypten.nn.Module` subclass
sees MPCTensors in its forward. `from_pytorch` converts with crypten_lite and returns the
same module tree with these classes.
"""

from __future__ import annotations

import logging
import sys

import torch

from ... import nn as core_nn
from ...cryptensor import CrypTensor as CoreTensor
from ...cryptensor import no_grad
from ...nn import module as core_module
from ..tensor import MPCTensor, unwrap, wrap
from . import functional  # noqa: F401


class _State:
    """True while a crypten_lite layer's own forward runs (it reads core tensors)."""

    in_core = False


_STATE = _State()


class _CompatModule:
    """CrypTen's Module methods, mixed into every crypten_lite module class."""

    _builtin = True  # a crypten_lite layer: its forward takes core CrypTensors

    def __call__(self, *args, **kwargs):
        if type(self)._builtin and self._parameters:
            _check_inputs(self, args)
        saved = _STATE.in_core
        try:
            if type(self)._builtin:
                _STATE.in_core = True
                return wrap(core_module.Module.__call__(self, *unwrap(args), **unwrap(kwargs)))
            _STATE.in_core = False
            return wrap(self.forward(*wrap(list(args)), **{k: wrap(v) for k, v in kwargs.items()}))
        finally:
            _STATE.in_core = saved

    def __getattr__(self, name: str):
        value = core_module.Module.__getattr__(self, name)
        return value if _STATE.in_core else wrap(value)

    # --------------------------------------------------------------- parameters
    def named_parameters(self, prefix: str = "", recurse: bool = True):
        for name, p in core_module.Module.named_parameters(self, prefix, recurse):
            yield name, wrap(p)

    def parameters(self, recurse: bool = True):
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True):
        for name, b in core_module.Module.named_buffers(self, prefix, recurse):
            yield name, wrap(b)

    def buffers(self, recurse: bool = True):
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def register_parameter(self, name: str, value, requires_grad: bool = True) -> None:
        core_module.Module.register_parameter(self, name, unwrap(value))

    def register_buffer(self, name: str, value, persistent: bool = True) -> None:
        core_module.Module.register_buffer(self, name, unwrap(value))

    def set_parameter(self, name: str, value) -> None:
        """Replace parameter `name` (a torch tensor before encrypt(), a CrypTensor after)."""
        if name not in self._parameters:
            raise ValueError(f"{type(self).__name__} has no parameter {name!r}")
        self._parameters[name] = unwrap(value) if not isinstance(value, torch.Tensor) else value.detach()

    def set_buffer(self, name: str, value) -> None:
        if name not in self._buffers:
            raise ValueError(f"{type(self).__name__} has no buffer {name!r}")
        self._buffers[name] = unwrap(value) if not isinstance(value, torch.Tensor) else value.detach()

    def state_dict(self, destination=None, prefix: str = "", keep_vars: bool = False):
        return {k: wrap(v) for k, v in core_module.Module.state_dict(self, prefix).items()}

    def load_state_dict(self, state_dict, strict: bool = True):
        return core_module.Module.load_state_dict(self, unwrap(dict(state_dict)), strict)

    def _core_parameters(self):
        for _, p in core_module.Module.named_parameters(self):
            yield p

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self._core_parameters():
            if isinstance(p, CoreTensor):
                p.grad = None

    def requires_grad_(self, requires_grad: bool = True):
        for p in self._core_parameters():
            if isinstance(p, CoreTensor):
                p.requires_grad = requires_grad
        return self

    # --------------------------------------------------------------- encryption
    def encrypt(self, mode: bool = True, src: int = 0):
        """Secret-share the parameters of party `src` (mode=False: decrypt)."""
        if not mode:
            return self.decrypt()
        if self.encrypted:
            return self
        return core_module.Module.encrypt(self, src=src)

    def decrypt(self):
        if not self.encrypted:
            return self
        return core_module.Module.decrypt(self)

    def update_parameters(self, learning_rate: float, grad_threshold: float = 100) -> None:
        """p -= learning_rate * p.grad for every parameter with a gradient (CrypTen's SGD step)."""
        with no_grad():
            for p in self._core_parameters():
                if isinstance(p, CoreTensor) and p.grad is not None:
                    p.sub_(p.grad.mul(learning_rate))
                elif isinstance(p, torch.Tensor) and p.grad is not None:
                    with torch.no_grad():
                        p.sub_(p.grad * learning_rate)

    def cuda(self, device=None):
        raise NotImplementedError("crypten_lite keeps shares on the CPU")


def _check_inputs(layer, args) -> None:
    """CrypTen's rules for a layer with parameters: an unencrypted layer takes public tensors
    (its torch parameters then record torch gradients), an encrypted one takes encrypted
    inputs; the other pairings raise as CrypTen's do."""
    from ..tensor import CrypTensor as CompatTensor
    private = any(isinstance(a, (CompatTensor, CoreTensor)) for a in args)
    public = any(isinstance(a, torch.Tensor) for a in args)
    if not layer.encrypted:
        if private:
            raise RuntimeError(f"{type(layer).__name__} is not encrypted but got an encrypted input: "
                               "call encrypt() on the module first (CrypTen's rule)")
        if public and torch.is_grad_enabled():
            for p in layer._parameters.values():
                if isinstance(p, torch.Tensor) and p.is_floating_point() and not p.requires_grad:
                    p.requires_grad_(True)
    elif public and not private:
        raise NotImplementedError(f"{type(layer).__name__} is encrypted but got a public input: "
                                  "encrypt the input with crypten.cryptensor (CrypTen's rule)")


class Module(_CompatModule, core_module.Module):
    """Base class of a user's CrypTen model: its forward receives MPCTensors."""

    _builtin = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "_builtin" not in cls.__dict__ and "forward" in cls.__dict__:
            cls._builtin = False


_CLASSES: dict[type, type] = {core_module.Module: Module}


def adopt(module: core_module.Module) -> core_module.Module:
    """Give every module of a crypten_lite tree its CrypTen-compatible class (in place)."""
    for m in core_module.Module.modules(module):
        cls = type(m)
        if issubclass(cls, _CompatModule):
            continue
        m.__class__ = _compat_class(cls)
    return module


def _compat_class(core_cls: type) -> type:
    if core_cls not in _CLASSES:
        _CLASSES[core_cls] = type(core_cls.__name__, (_CompatModule, core_cls),
                                  {"__module__": __name__, "forward": _core_forward(core_cls)})
    return _CLASSES[core_cls]


def _core_forward(core_cls: type):
    """forward of a crypten_lite layer called directly (CrypTen's `layer.forward(x)`, as
    Tutorial 5 does): the core forward on unwrapped tensors, MPCTensors out; called by the
    layer's own __call__ (in core), the core forward as it is."""
    core = core_cls.forward

    def forward(self, *args, **kwargs):
        if _STATE.in_core:
            return core(self, *args, **kwargs)
        _STATE.in_core = True
        try:
            return wrap(core(self, *unwrap(args), **unwrap(kwargs)))
        finally:
            _STATE.in_core = False
    forward.__doc__ = core.__doc__
    return forward


def from_pytorch(pytorch_model: torch.nn.Module, dummy_input, **kwargs):
    """CrypTen's from_pytorch: a crypten.nn module with the torch model's public parameters.

    CrypTen only reads the dummy input's shape (tutorials pass torch.empty): garbage values
    (not finite, or huge) are replaced by a fixed pattern for crypten_lite's conversion check. As in CrypTen, the
    model keeps its layers (no eval-mode BatchNorm folding unless fold_batch_norm=True): the
    state dict keys are torch's and the model can be trained."""
    kwargs.setdefault("fold_batch_norm", False)
    dummy = dummy_input  # torch.empty garbage: the check runs on a pattern (checkable_dummy)
    src = getattr(pytorch_model, "src", None)
    if isinstance(pytorch_model, torch.nn.Module):
        pytorch_model = _plain_parameters_as_parameters(pytorch_model)
    if isinstance(src, int) and "src" not in kwargs:
        # A model from load_from_party: only party `src` holds it; its architecture travels
        # in-band (a description, never a pickle) and the others rebuild it.
        from ... import session
        if session.current().rank != src:
            pytorch_model = None
        kwargs["src"] = src
    model = adopt(core_nn.from_pytorch(pytorch_model, dummy, **kwargs))
    from . import onnx_names  # CrypTen's ONNX node names resolve in model._modules
    onnx_names.attach(model, pytorch_model, dummy_input, kwargs.get("src"))
    return model


def _plain_parameters_as_parameters(pytorch_model: torch.nn.Module) -> torch.nn.Module:
    """A copy of the model whose plain tensors in `_parameters` (CrypTen's Tutorial 5 sets
    `layer._parameters['weight'] = torch.eye(3) * 5`) are nn.Parameters, as torch's ONNX
    export (CrypTen's converter) treated them; the model itself when there are none."""
    if not any(v is not None and not isinstance(v, torch.nn.Parameter)
               for m in pytorch_model.modules() for v in m._parameters.values()):
        return pytorch_model
    import copy
    model = copy.deepcopy(pytorch_model)
    for m in model.modules():
        for name, v in list(m._parameters.items()):
            if v is not None and not isinstance(v, torch.nn.Parameter):
                m._parameters[name] = torch.nn.Parameter(v.detach().clone(), requires_grad=v.is_floating_point())
    return model


_LAYERS = [name for name in core_nn.__all__ if isinstance(getattr(core_nn, name), type)
           and issubclass(getattr(core_nn, name), core_module.Module) and name != "Module"]
for _name in _LAYERS:
    globals()[_name] = _compat_class(getattr(core_nn, _name))

# CrypTen's extra names for the same layers.
Hardtanh = None  # set below when crypten_lite's functional hardtanh is available


class _Func(Module):
    """A layer that applies one CrypTensor method (CrypTen's ONNX-style layers)."""

    _builtin = False
    _method = ""

    def __init__(self, *args, **kwargs):
        super().__init__()
        object.__setattr__(self, "_call_args", args)
        object.__setattr__(self, "_call_kwargs", kwargs)

    def forward(self, x, *more):
        return getattr(x, self._method)(*more, *self._call_args, **self._call_kwargs)


def _func_layer(name: str, method: str) -> type:
    return type(name, (_Func,), {"_method": method, "__module__": __name__,
                                 "__doc__": f"CrypTen's {name}: x.{method}(...)"})


class Hardtanh(Module):
    """hardtanh(x, min_val, max_val)."""

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False):
        super().__init__()
        _warn_inplace("Hardtanh", inplace)
        self.min_val, self.max_val = min_val, max_val

    def forward(self, x):
        return x.hardtanh(self.min_val, self.max_val)


def _warn_inplace(name: str, inplace: bool) -> None:
    if inplace:
        logging.warning(f"CrypTen {name} module does not support inplace computation.")


def _inplace_layer(core_name: str, warn_name: str):
    base = _compat_class(getattr(core_nn, core_name))

    def __init__(self, *args, inplace: bool = False, **kwargs):
        _warn_inplace(warn_name, inplace)
        base.__init__(self, *args, **kwargs)
    return type(core_name, (base,), {"__init__": __init__, "__module__": __name__})


ReLU = _inplace_layer("ReLU", "ReLU")
ReLU6 = _inplace_layer("ReLU6", "ReLU6")
Dropout = _inplace_layer("Dropout", "Dropout")


class DropoutNd(Module):
    """Channel dropout (CrypTen's Dropout2d / Dropout3d): whole channels are zeroed."""

    _warn_name = "DropoutNd"

    def __init__(self, p: float = 0.5, inplace: bool = False):
        super().__init__()
        _warn_inplace(self._warn_name, inplace)
        self.p = p

    def forward(self, x):
        return x._feature_dropout(self.p, training=self.training)


class Dropout2d(DropoutNd):
    pass


class Dropout3d(DropoutNd):
    pass


class GlobalAveragePool(Module):
    """Mean over every spatial dim, keeping them as size 1 (ONNX GlobalAveragePool)."""

    def forward(self, x):
        dims = tuple(range(2, x.dim()))
        return x.mean(dims, keepdim=True) if dims else x
# CrypTen's ONNX-era modules (forward([x, y]) for several inputs) and its Graph container.
from .onnx import (Add, BatchNormalization, Concat, Constant, ConstantOfShape, Div, Equal, Erf, Exp, Expand,  # noqa: E402,F401
                   Gather, Gemm, Graph, MatMul, Mean, Mul, Pow, Range, Reshape, Shape, Slice, Sqrt,
                   Squeeze, Sub, Sum, Transpose, Unsqueeze, Where)


# `crypten.nn.module` (CrypTen's module file): compat/nn/module.py re-exports these classes.


# ------------------------------------------------------------------------ containers
class ModuleDict(_compat_class(core_module.ModuleDict)):
    """torch.nn.ModuleDict's methods (CrypTen): a dict or (name, module) pairs."""

    def __init__(self, modules=None):
        pairs = modules.items() if isinstance(modules, dict) else (modules or [])
        super().__init__()
        for name, m in pairs:
            self.add_module(name, m)

    def pop(self, key: str):
        return self._modules.pop(key)

    def clear(self) -> None:
        self._modules.clear()


class ModuleList(_compat_class(core_module.ModuleList)):
    """torch.nn.ModuleList's methods (CrypTen): insert and del renumber the entries."""

    def _renumber(self, items) -> None:
        self._modules.clear()
        for i, m in enumerate(items):
            self._modules[str(i)] = m

    def insert(self, index: int, module) -> None:
        items = list(self._modules.values())
        items.insert(index, module)
        self._renumber(items)

    def __delitem__(self, idx) -> None:
        items = list(self._modules.values())
        del items[idx]
        self._renumber(items)


_CLASSES[core_module.ModuleDict] = ModuleDict
_CLASSES[core_module.ModuleList] = ModuleList


# ---------------------------------------------------------------------------- losses
def _loss_layer(core_name: str):
    base = _compat_class(getattr(core_nn, core_name))

    def __init__(self, *args, skip_forward: bool = False, **kwargs):
        # CrypTen's skip_forward only saved work; the value is computed either way here
        base.__init__(self, *args, **kwargs)
        if not hasattr(self, "reduction"):
            object.__setattr__(self, "reduction", kwargs.get("reduction", "mean"))
    return type(core_name, (base,), {"__init__": __init__, "__module__": __name__})


for _name in ("MSELoss", "L1Loss", "BCELoss", "BCEWithLogitsLoss", "CrossEntropyLoss", "NLLLoss"):
    globals()[_name] = _loss_layer(_name)


class CosineSimilarity(Module):
    """Cosine similarity along `dim` (torch.nn.CosineSimilarity)."""

    def __init__(self, dim: int = 1, eps: float = 1e-8):
        super().__init__()
        self.dim, self.eps = dim, eps

    def forward(self, x1, x2):
        return x1.cosine_similarity(x2, dim=self.dim, eps=self.eps)


def _load_state_dict(self, state_dict, strict: bool = True):
    from ..tensor import CrypTensor as CompatTensor
    encrypted = any(isinstance(v, (CompatTensor, CoreTensor)) for v in dict(state_dict).values())
    if encrypted != bool(self.encrypted):
        raise AssertionError("cannot load an encrypted state dict into an unencrypted module "
                             "(or the reverse): encrypt() or decrypt() the module first")
    return core_module.Module.load_state_dict(self, unwrap(dict(state_dict)), strict)


_CompatModule.load_state_dict = _load_state_dict


class Conv(Module):
    """CrypTen's Conv: forward((input, weight[, bias])) with fixed stride, padding, dilation."""

    def __init__(self, stride=1, padding=0, dilation=1, groups: int = 1):
        super().__init__()
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups

    def forward(self, x):
        inputs = list(x) if isinstance(x, (list, tuple)) else [x]
        inp, weight = inputs[0], inputs[1]
        bias = inputs[2] if len(inputs) > 2 else None
        op = {3: "conv1d", 4: "conv2d"}.get(inp.dim())
        if op is None:
            raise ValueError(f"Conv supports 1-D and 2-D convolutions, got a {inp.dim()}-D input")
        return getattr(inp, op)(weight, bias=bias, stride=self.stride, padding=self.padding,
                                dilation=self.dilation, groups=self.groups)


from . import init  # noqa: E402,F401


class BatchNorm3d(_compat_class(core_nn.layers._BatchNorm)):
    """crypten_lite's batch normalization on (N, C, D, H, W) inputs."""

    _dims = (5,)


class AdaptiveMaxPool2d(Module):
    """Adaptive 2-D max pooling (torch.nn.AdaptiveMaxPool2d)."""

    def __init__(self, output_size, return_indices: bool = False):
        super().__init__()
        self.output_size, self.return_indices = output_size, return_indices

    def forward(self, x):
        return x.adaptive_max_pool2d(self.output_size, return_indices=self.return_indices)


class Parameter(Module):
    """CrypTen's Parameter module: one tensor (public or encrypted) that forward returns; a
    parameter when trainable, else a buffer."""

    def __init__(self, param, trainable: bool = True):
        super().__init__()
        from ..tensor import CrypTensor as CompatTensor
        if not isinstance(param, (torch.Tensor, CompatTensor)):
            # CrypTen raises AssertionError here; the compat layer follows it
            raise AssertionError(f"Parameter needs a torch tensor or a CrypTensor, got {type(param).__name__}")
        object.__setattr__(self, "trainable", trainable)
        if trainable:
            self.register_parameter("data", param)
        else:
            self.register_buffer("data", param)
        if isinstance(param, CompatTensor):
            object.__setattr__(self, "_encrypted", True)

    @property
    def requires_grad(self) -> bool:
        return self.trainable

    def forward(self, x=None):
        return self.data


from . import module  # noqa: E402,F401 (crypten.nn.module: CrypTen's path of these classes)
