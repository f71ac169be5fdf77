"""Module: the base of crypten_lite layers, with torch.nn.Module's API plus encrypt/decrypt.

A module's parameters and buffers are either all public torch tensors (as built, or after
`decrypt()`) or secret-shared CrypTensors (after `encrypt(src=...)`: party `src` owns the
values, the other parties contribute nothing but the architecture). Forward passes accept
public or encrypted inputs either way; public parameters are constants for autograd (to
train, encrypt the model: encrypted parameters are leaves with requires_grad=True).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Iterator

import torch

from ..cryptensor import CrypTensor
from ..errors import ProtocolError, UnsupportedError
from ..mpc.offline import mapped_transients, own_mapping

def _share(value: torch.Tensor, src: int, requires_grad: bool, precision: int | None) -> CrypTensor:
    # Only `src` contributes its values; the other parties' values serve the shape check alone.
    out = CrypTensor.from_plain(value.detach(), src=src, precision=precision)
    share = out.share
    if type(share) is torch.Tensor and share.device.type == "cpu":
        # kept as long as the model: a large share in a mapping of its own, off the heap that
        # the operations' temporaries reuse (crypten_lite.mpc.offline.own_mapping)
        out.share = own_mapping(share)
    out.requires_grad = requires_grad
    return out


class Module:
    """Base class of every crypten_lite layer (mirrors torch.nn.Module)."""

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_encrypted", False)

    # ------------------------------------------------------------------ registration
    def register_parameter(self, name: str, value) -> None:
        """Add a parameter (a public torch tensor, a CrypTensor, or None)."""
        if isinstance(value, torch.Tensor):
            value = value.detach()
        self._parameters[name] = value

    def register_buffer(self, name: str, value, persistent: bool = True) -> None:
        """Add a buffer (state that is not trained, e.g. BatchNorm running statistics)."""
        if isinstance(value, torch.Tensor):
            value = value.detach()
        self._buffers[name] = value

    def add_module(self, name: str, module: "Module | None") -> None:
        if module is not None and not isinstance(module, Module):
            raise UnsupportedError(f"{type(module).__name__} is not a crypten_lite.nn.Module; convert "
                                   "torch modules with crypten_lite.nn.from_pytorch")
        self._modules[name] = module

    register_module = add_module

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, Module):
            self._modules[name] = value
        elif name in self._parameters:
            self.register_parameter(name, value)
        elif name in self._buffers:
            self.register_buffer(name, value)
        elif name in self._modules:
            self._modules[name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        for table in ("_parameters", "_buffers", "_modules"):
            d = self.__dict__.get(table)
            if d is not None and name in d:
                return d[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        for table in (self._parameters, self._buffers, self._modules):
            if name in table:
                del table[name]
                return
        object.__delattr__(self, name)

    # ------------------------------------------------------------------ forward
    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    # Dimension names a module expects of its first input, e.g. ("N", "C", "H", "W");
    # None accepts anything. Unnamed input dims match any name (PyTorch 1.3 rules).
    expected_names: tuple | None = None

    def __call__(self, *args, **kwargs):
        if self.expected_names is not None and args and getattr(args[0], "_names", None) is not None:
            self._check_names(args[0])
        return self.forward(*args, **kwargs)

    def _check_names(self, x) -> None:
        from ..names import NamedDimError
        expected, got = tuple(self.expected_names), tuple(x.names)
        if len(expected) != len(got) or any(e is not None and g is not None and e != g
                                             for e, g in zip(expected, got)):
            raise NamedDimError(
                f"{type(self).__name__} expects input dims named {expected} but got {got}; "
                f"use x.align_to(*{expected}) or x.rename(...) first")

    # ------------------------------------------------------------------ traversal
    def named_modules(self, prefix: str = "", memo: set | None = None) -> Iterator[tuple[str, "Module"]]:
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, m in self._modules.items():
            if m is not None:
                yield from m.named_modules(f"{prefix}.{name}" if prefix else name, memo)

    def modules(self) -> Iterator["Module"]:
        for _, m in self.named_modules():
            yield m

    def named_children(self) -> Iterator[tuple[str, "Module"]]:
        for name, m in self._modules.items():
            if m is not None:
                yield name, m

    def children(self) -> Iterator["Module"]:
        for _, m in self.named_children():
            yield m

    def _named(self, table: str, prefix: str, recurse: bool):
        seen = set()
        modules = self.named_modules(prefix) if recurse else [(prefix, self)]
        for mprefix, m in modules:
            for name, v in getattr(m, table).items():
                if v is None or id(v) in seen:
                    continue
                seen.add(id(v))
                yield (f"{mprefix}.{name}" if mprefix else name), v

    def named_parameters(self, prefix: str = "", recurse: bool = True):
        """(name, value) of every parameter, values public tensors or CrypTensors."""
        yield from self._named("_parameters", prefix, recurse)

    def parameters(self, recurse: bool = True):
        for _, v in self.named_parameters(recurse=recurse):
            yield v

    def named_buffers(self, prefix: str = "", recurse: bool = True):
        yield from self._named("_buffers", prefix, recurse)

    def buffers(self, recurse: bool = True):
        for _, v in self.named_buffers(recurse=recurse):
            yield v

    def apply(self, fn: Callable[["Module"], None]) -> "Module":
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    # ------------------------------------------------------------------ modes
    def train(self, mode: bool = True) -> "Module":
        """Training mode (Dropout active, BatchNorm on batch statistics)."""
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        for p in self.parameters():
            if isinstance(p, CrypTensor):
                p.requires_grad = requires_grad
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the gradients of every encrypted parameter."""
        for p in self.parameters():
            if isinstance(p, CrypTensor):
                p.grad = None

    def to(self, *args, **kwargs) -> "Module":
        return self  # shares live on the CPU; device moves are no-ops

    def cpu(self) -> "Module":
        return self

    # ------------------------------------------------------------------ encryption
    @property
    def encrypted(self) -> bool:
        """True after encrypt(): parameters and floating buffers are CrypTensors."""
        return self._encrypted

    def encrypt(self, src: int = 0, precision: int | None = None) -> "Module":
        """Secret-share every parameter and floating buffer from party `src` (in place).

        Party `src` contributes its values; every other party runs the same architecture and
        contributes nothing (its own values are ignored, only their shapes are checked). One
        broadcast of each shape, no other traffic. Parameters become leaves requiring grad.
        """
        if self._encrypted:
            raise ProtocolError(f"{type(self).__name__} is already encrypted; decrypt() first")
        with mapped_transients():  # each share's transients leave no heap hole (offline.py)
            self._share_all(src, precision)
        return self

    def _share_all(self, src: int, precision: int | None) -> None:
        for m in self.modules():
            for name, v in list(m._parameters.items()):
                if isinstance(v, torch.Tensor):
                    m._parameters[name] = _share(v, src, True, precision)
                    # a weight reused across calls: products with it open W - B once
                    # (crypten_lite.mpc.fixed), the same bytes as a triple on first use
                    m._parameters[name]._fixed_owner = (m._parameters[name], "")
            for name, v in list(m._buffers.items()):
                if isinstance(v, torch.Tensor) and v.is_floating_point():
                    m._buffers[name] = _share(v, src, False, precision)
            object.__setattr__(m, "_encrypted", True)

    def decrypt(self, dst: int | None = None) -> "Module":
        """Reveal every parameter and buffer (to all parties, or only to `dst`) in place.

        With `dst`, the other parties are left with a module whose values are None.
        """
        for m in self.modules():
            for table in (m._parameters, m._buffers):
                for name, v in list(table.items()):
                    if isinstance(v, CrypTensor):
                        table[name] = v.get_plain_text(dst)
            object.__setattr__(m, "_encrypted", False)
        return self

    # ------------------------------------------------------------------ state
    def state_dict(self, prefix: str = "", keep_vars: bool = False) -> "OrderedDict[str, Any]":
        """Parameters and buffers by dotted name (public tensors or CrypTensors)."""
        out: OrderedDict[str, Any] = OrderedDict()
        for mprefix, m in self.named_modules(prefix.rstrip(".")):
            for table in (m._parameters, m._buffers):
                for name, v in table.items():
                    if v is not None:
                        out[f"{mprefix}.{name}" if mprefix else name] = v
        return out

    def load_state_dict(self, state_dict: dict, strict: bool = True):
        """Copy values in by name; public values into a public module, CrypTensors anywhere.

        Loading CrypTensors marks the module encrypted; loading public tensors into an
        encrypted module is refused (share them first: crypten_lite.cryptensor or encrypt()).
        Returns (missing_keys, unexpected_keys) like torch.
        """
        own = {}
        for mprefix, m in self.named_modules():
            for table in ("_parameters", "_buffers"):
                for name in getattr(m, table):
                    own[f"{mprefix}.{name}" if mprefix else name] = (m, table, name)
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        if strict and (missing or unexpected):
            raise ProtocolError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        any_private = False
        for key, value in state_dict.items():
            if key not in own:
                continue
            m, table, name = own[key]
            current = getattr(m, table)[name]
            if current is not None and value is not None and tuple(current.shape) != tuple(value.shape):
                raise ProtocolError(f"load_state_dict: {key} has shape {tuple(value.shape)}, the "
                                    f"module expects {tuple(current.shape)}")
            if isinstance(value, CrypTensor):
                any_private = True
                value = value.detach().requires_grad_(table == "_parameters")
            elif self._encrypted and isinstance(value, torch.Tensor) and value.is_floating_point():
                raise ProtocolError(f"load_state_dict: {key} is a public tensor but the module is "
                                    "encrypted; load CrypTensors (crypten_lite.load_from_party) "
                                    "or decrypt() the module first")
            elif isinstance(value, torch.Tensor):
                value = value.detach().clone()
            getattr(m, table)[name] = value
        if any_private:
            for m in self.modules():
                object.__setattr__(m, "_encrypted", True)
        return missing, unexpected

    # ------------------------------------------------------------------ display
    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"({name}): " + repr(m).replace("\n", "\n  ") for name, m in self.named_children()]
        head = f"{type(self).__name__}({self.extra_repr()}"
        if not lines:
            return head + ")"
        return head + "\n  " + "\n  ".join(lines) + "\n)"


class Sequential(Module):
    """Modules applied in order."""

    def __init__(self, *modules) -> None:
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], (dict, OrderedDict)):
            for name, m in modules[0].items():
                self.add_module(name, m)
        else:
            for i, m in enumerate(modules):
                self.add_module(str(i), m)

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x

    def __getitem__(self, idx):
        items = list(self._modules.values())
        if isinstance(idx, slice):
            return Sequential(*items[idx])
        return items[idx]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def append(self, module: Module) -> "Sequential":
        self.add_module(str(len(self)), module)
        return self


class ModuleList(Module):
    """A list of modules (registered, so they are encrypted and trained with the parent)."""

    def __init__(self, modules=None) -> None:
        super().__init__()
        for m in modules or []:
            self.append(m)

    def append(self, module: Module) -> "ModuleList":
        self.add_module(str(len(self._modules)), module)
        return self

    def extend(self, modules) -> "ModuleList":
        for m in modules:
            self.append(m)
        return self

    def __getitem__(self, idx):
        items = list(self._modules.values())
        return ModuleList(items[idx]) if isinstance(idx, slice) else items[idx]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())


class ModuleDict(Module):
    """A dict of modules by name."""

    def __init__(self, modules=None) -> None:
        super().__init__()
        for name, m in (modules or {}).items():
            self.add_module(name, m)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, module)

    def __contains__(self, key: str) -> bool:
        return key in self._modules

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def keys(self):
        return self._modules.keys()

    def values(self):
        return self._modules.values()

    def items(self):
        return self._modules.items()
