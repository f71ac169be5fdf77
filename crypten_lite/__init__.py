"""crypten_lite: private machine learning by secure multiparty computation, PyTorch-style.

    import crypten_lite
    crypten_lite.init()
    x = crypten_lite.cryptensor(torch.tensor([1.0, 2.0]), src=0)
    print((x * x).get_plain_text())

Layers, from the bottom (a layer never imports one above it): config/errors, encoding/random,
comm, provider, session, mpc, cryptensor, autograd, nn/optim, quantized, cli.

Importing the package is light (config and errors only, no torch): everything else loads on
the first access of any other public name (PEP 562 `__getattr__`), all at once, so that
CrypTensor has its methods from functions/ whichever name comes first. The containers' health
check (`crypten-lite health`, run every few seconds) therefore never imports torch.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Sequence

from .config import Config
from .errors import (CommunicationError, ConfigError, CryptenLiteError, NotInitializedError,
                     ProtocolError, UnsupportedError)

__version__ = "0.1.0"


_LAZY = {
    "torch": ("torch", None), "comm": ("crypten_lite.comm", None),
    "CrypTensor": ("crypten_lite.cryptensor", "CrypTensor"), "cat": ("crypten_lite.cryptensor", "cat"),
    "stack": ("crypten_lite.cryptensor", "stack"), "no_grad": ("crypten_lite.cryptensor", "no_grad"),
    "enable_grad": ("crypten_lite.cryptensor", "enable_grad"),
    "is_grad_enabled": ("crypten_lite.cryptensor", "is_grad_enabled"),
    "is_initialized": ("crypten_lite.session", "is_initialized"),
    "_init": ("crypten_lite.session", "init"), "uninit": ("crypten_lite.session", "uninit"),
    "autograd": ("crypten_lite.autograd", None), "functions": ("crypten_lite.functions", None),
    "mpc": ("crypten_lite.mpc", None), "nn": ("crypten_lite.nn", None),
    "optim": ("crypten_lite.optim", None), "quantized": ("crypten_lite.quantized", None),
    "where": ("crypten_lite.functions", "where"),
    "save_from_party": ("crypten_lite.serialization", "save_from_party"),
    "load_from_party": ("crypten_lite.serialization", "load_from_party"),
    "QuantizedCrypTensor": ("crypten_lite.quantized.tensor", "QuantizedCrypTensor"),
    "dequantize": ("crypten_lite.quantized.tensor", "dequantize"),
    "quantize_per_channel": ("crypten_lite.quantized.tensor", "quantize_per_channel"),
    "quantize_per_tensor": ("crypten_lite.quantized.tensor", "quantize_per_tensor"),
}


def _load_all() -> None:
    """Bind every lazy name (imports torch and the whole API, once)."""
    import importlib
    g = globals()
    for name, (module, attr) in _LAZY.items():
        if name not in g:
            mod = importlib.import_module(module)
            g[name] = mod if attr is None else getattr(mod, attr)


def _importing_the_package() -> bool:
    """True while a crypten_lite module is still executing (an import in progress): then a
    lazy name is resolved alone, so that `from . import comm` inside the package never
    pulls in the modules that import it."""
    return any(getattr(getattr(m, "__spec__", None), "_initializing", False)
               for n, m in list(sys.modules.items()) if n.startswith("crypten_lite."))


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'crypten_lite' has no attribute {name!r}")
    module, attr = _LAZY[name]
    if _importing_the_package():
        import importlib
        mod = importlib.import_module(module)
        return mod if attr is None else getattr(mod, attr)
    _load_all()
    return globals()[name]


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


def init(config: Config | None = None, **overrides) -> None:
    """Join the session described by the CRYPTEN_LITE_* environment (or `config`).

    Where nothing describes a session (no config, no overrides, no CRYPTEN_LITE_WORLD_SIZE,
    _PARTIES or _CONFIG), as in a notebook or `python script.py`, this process gets a session
    of one party (world size 1, as CrypTen's init() gives): every op works, with the same
    protocols, and a warning says once that one party gives no privacy. run_multiprocess
    functions still start their own parties, each with its own session."""
    _load_all()
    _load_extensions()
    if config is None and not overrides and not _session_described():
        from .session import init_single_process
        init_single_process()
        return
    _init(config, **overrides)


def _session_described() -> bool:
    return any(os.environ.get(f"CRYPTEN_LITE_{k}") for k in ("WORLD_SIZE", "PARTIES", "CONFIG"))


def get_rank() -> int:
    """This party's rank."""
    _load_all()
    return comm.get().rank


def get_world_size() -> int:
    """Number of computing parties."""
    _load_all()
    return comm.get().world_size


def cryptensor(tensor=None, src: int = 0, precision: int | None = None, requires_grad: bool = False,
               names: Sequence[str | None] | None = None, ptype=None) -> CrypTensor:
    """Secret-share `tensor`, held by party `src` (other parties may pass None)."""
    _load_all()
    # from_plain converts numbers and lists, and refuses anything else on every party
    out = CrypTensor.from_plain(tensor, src=src, precision=precision, requires_grad=requires_grad,
                                names=names)
    return out


_EXTENSIONS_LOADED = False


def _load_extensions() -> None:
    """Import the modules that add methods to CrypTensor (comparisons, functions, names)."""
    global _EXTENSIONS_LOADED
    if _EXTENSIONS_LOADED:
        return
    import importlib
    for name in ("crypten_lite.functions", "crypten_lite.quantized.tensor"):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
    _EXTENSIONS_LOADED = True


class _Package(types.ModuleType):
    """The function `cryptensor` keeps its name when the submodule of the same name loads
    (the import system would otherwise bind the submodule over it)."""

    def __setattr__(self, name, value):
        if name == "cryptensor" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)

    def __reduce__(self):
        # pickled by reference, as a plain module is (cloudpickle's run_multiprocess functions)
        import importlib
        return importlib.import_module, (self.__name__,)


sys.modules[__name__].__class__ = _Package

__all__ = [
    "autograd", "functions", "mpc", "nn", "optim", "where", "save_from_party", "load_from_party",
    "init", "uninit", "is_initialized", "get_rank", "get_world_size", "cryptensor", "CrypTensor",
    "cat", "stack", "no_grad", "enable_grad", "is_grad_enabled", "comm", "Config",
    "CryptenLiteError", "ConfigError", "CommunicationError", "ProtocolError", "UnsupportedError",
    "NotInitializedError",
]
