"""crypten_lite: private machine learning by secure multiparty computation, PyTorch-style.

    import crypten_lite
    crypten_lite.init()
    x = crypten_lite.cryptensor(torch.tensor([1.0, 2.0]), src=0)
    print((x * x).get_plain_text())

Layers, from the bottom (a layer never imports one above it): config/errors, encoding/random,
comm, provider, session, mpc, cryptensor, autograd, nn/optim, quantized, cli.

One exception: `crypten-lite health` (the containers' health check, run every few seconds)
needs grpc only, so in that command the package skips importing torch and the API below
(_health_check_only); everywhere else importing the package loads everything, as usual.
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

from .config import Config
from .errors import (CommunicationError, ConfigError, CryptenLiteError, NotInitializedError,
                     ProtocolError, UnsupportedError)

__version__ = "0.1.0"


def _health_check_only() -> bool:
    """True in a `crypten-lite health ...` process: it must answer well inside the compose
    health check's timeout, and importing torch alone takes seconds on a loaded machine."""
    return (os.path.basename(sys.argv[0] if sys.argv else "") == "crypten-lite"
            and sys.argv[1:2] == ["health"])


_FULL = not _health_check_only()

if _FULL:
    import torch

    from . import comm
    from .cryptensor import CrypTensor, cat, enable_grad, is_grad_enabled, no_grad, stack
    from .session import is_initialized
    from .session import init as _init
    from .session import uninit
else:
    def __getattr__(name: str):
        raise AttributeError(f"crypten_lite.{name} is not loaded in a `crypten-lite health` "
                             "process (see crypten_lite/__init__.py)")


def init(config: Config | None = None, **overrides) -> None:
    """Join the session described by the CRYPTEN_LITE_* environment (or `config`).

    Where nothing describes a session (no config, no overrides, no CRYPTEN_LITE_WORLD_SIZE,
    _PARTIES or _CONFIG), this process is a launcher, as in a script or notebook that calls
    init() and then a run_multiprocess function: init() only loads the extensions, the
    parties build their own sessions, and an op outside them says how to start parties."""
    _load_extensions()
    if config is None and not overrides and not _session_described():
        import logging
        logging.getLogger("crypten_lite").info(
            "init(): no session configured; launcher mode (run_multiprocess starts parties)")
        return
    _init(config, **overrides)


def _session_described() -> bool:
    return any(os.environ.get(f"CRYPTEN_LITE_{k}") for k in ("WORLD_SIZE", "PARTIES", "CONFIG"))


def get_rank() -> int:
    """This party's rank."""
    return comm.get().rank


def get_world_size() -> int:
    """Number of computing parties."""
    return comm.get().world_size


def cryptensor(tensor=None, src: int = 0, precision: int | None = None, requires_grad: bool = False,
               names: Sequence[str | None] | None = None, ptype=None) -> CrypTensor:
    """Secret-share `tensor`, held by party `src` (other parties may pass None)."""
    if tensor is not None and not isinstance(tensor, torch.Tensor):
        tensor = torch.as_tensor(tensor)
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


# Higher layers (importing them has no side effects: nothing runs until init()).
if _FULL:
    from . import autograd, functions, mpc, nn, optim  # noqa: E402
    from .functions import where  # noqa: E402
    from .serialization import load_from_party, save_from_party  # noqa: E402
    from .quantized.tensor import (QuantizedCrypTensor, dequantize,  # noqa: E402
                                   quantize_per_channel, quantize_per_tensor)
    from . import quantized  # noqa: E402

__all__ = [
    "autograd", "functions", "mpc", "nn", "optim", "where", "save_from_party", "load_from_party",
    "init", "uninit", "is_initialized", "get_rank", "get_world_size", "cryptensor", "CrypTensor",
    "cat", "stack", "no_grad", "enable_grad", "is_grad_enabled", "comm", "Config",
    "CryptenLiteError", "ConfigError", "CommunicationError", "ProtocolError", "UnsupportedError",
    "NotInitializedError",
]
