"""CrypTen 0.4's public API over crypten_lite:  `import crypten_lite.compat as crypten`.

A thin adapter: tensors are crypten_lite CrypTensors behind CrypTen's MPCTensor interface,
layers are crypten_lite's layers with CrypTen's module methods, parties are crypten_lite's
gRPC parties and dealer. What maps one to one and what differs: docs/crypten_migration.md.
"""

from __future__ import annotations

import builtins
import io
import logging
import os
from typing import Any, Callable

import torch

import crypten_lite as _core
from .. import session as _session
from ..random import PRG, fresh_seed
from ..cryptensor import no_grad, enable_grad, is_grad_enabled  # noqa: F401
from . import common, communicator, debug, gradients, mpc, nn, optim  # noqa: F401
from .config import cfg
from .tensor import (CrypTensor, MPCTensor, PlainTensor, get_cryptensor_type,  # noqa: F401
                     get_default_cryptensor_type, register_cryptensor,
                     set_default_cryptensor_type, unwrap, wrap)
from .tensor import cryptensor_class as _cryptensor_class
from . import config  # noqa: F401,E402

__version__ = "0.4.1+crypten_lite"


def init(config_file: str | None = None, party_name=None, device=None) -> None:
    """Join the party's session (CRYPTEN_LITE_* environment, as set by run_multiprocess or
    `crypten-lite launch`); without one, this process is a launcher (notebook, script)."""
    if config_file is not None:
        cfg.load_config(config_file)
    if _session.is_initialized():
        return
    overrides = {}
    if _JOINS["count"] and os.environ.get("CRYPTEN_LITE_SESSION"):
        # joining again after uninit(): every party counts the same, so they agree on a
        # fresh session name (the dealer binds each session to one set of party keys)
        overrides["session"] = f"{os.environ['CRYPTEN_LITE_SESSION']}.{_JOINS['count']}"
    if "CRYPTEN_LITE_PROVIDER" not in os.environ and (
            os.environ.get("CRYPTEN_LITE_WORLD_SIZE") or os.environ.get("CRYPTEN_LITE_PARTIES")):
        overrides["provider"] = config.provider_name()
    if "CRYPTEN_LITE_PROTOCOL" not in os.environ and (
            os.environ.get("CRYPTEN_LITE_WORLD_SIZE") or os.environ.get("CRYPTEN_LITE_PARTIES")):
        overrides["protocol"] = config.protocol_name()
    _core.init(**overrides)


_JOINS = {"count": 0}


def uninit() -> None:
    if _core.is_initialized():
        _JOINS["count"] += 1
    _core.uninit()


def is_initialized() -> bool:
    return _core.is_initialized()


def get_rank() -> int:
    return _core.get_rank()


def get_world_size() -> int:
    return _core.get_world_size()


def cryptensor(*args, cryptensor_type: str | None = None, **kwargs):
    """Encrypt a tensor (src=0 by default) as the default cryptensor type ("mpc" or "ptt")."""
    return _cryptensor_class(cryptensor_type)(*args, **kwargs)


def is_encrypted_tensor(obj) -> bool:
    return isinstance(obj, CrypTensor)


def set_grad_enabled(mode: bool):
    return enable_grad() if mode else no_grad()


# ------------------------------------------------------------------------ tensor functions
def cat(tensors, dim: int = 0):
    if any(isinstance(t, PlainTensor) for t in tensors):
        return PlainTensor._of(torch.cat([unwrap(t) for t in tensors], dim))
    return wrap(_core.cat(unwrap(list(tensors)), dim))


def stack(tensors, dim: int = 0):
    if any(isinstance(t, PlainTensor) for t in tensors):
        return PlainTensor._of(torch.stack([unwrap(t) for t in tensors], dim))
    return wrap(_core.stack(unwrap(list(tensors)), dim))


def where(condition, input, other):
    """Elementwise condition ? input : other (condition public bool or encrypted 0/1)."""
    cond = unwrap(condition)
    if isinstance(cond, torch.Tensor):
        cond = cond.bool()
    if isinstance(input, PlainTensor) or isinstance(other, PlainTensor):
        return PlainTensor._of(torch.where(cond.bool() if isinstance(cond, torch.Tensor) else cond,
                                           unwrap(input), unwrap(other)))
    return wrap(_core.where(cond, unwrap(input), unwrap(other)))


def rand(*sizes, device=None, cryptensor_type: str | None = None):
    """Encrypted uniform [0, 1) values that no party knows: each party shares its own random
    fixed-point fraction (from its AES PRG) and the sum is taken mod 1."""
    size = sizes[0] if len(sizes) == 1 and isinstance(sizes[0], (tuple, list, torch.Size)) else sizes
    prec = int(cfg.encoder.precision_bits)
    s = _session.current()
    total = None
    for party in range(s.world_size):
        mine = None
        if s.rank == party:
            words = PRG(fresh_seed()).draw(tuple(size))  # this party's secret contribution
            mine = (words & ((1 << prec) - 1)).float() / 2 ** prec
        part = _core.cryptensor(mine, src=party)
        total = part if total is None else total + part
    # the sum is in [0, world_size): keep its fractional part
    from ..functions import floor
    return wrap(total - floor(total))


def bernoulli(probs):
    """Encrypted 0/1 samples with public probabilities `probs`."""
    return rand(tuple(torch.as_tensor(probs).shape)) < torch.as_tensor(probs)


# ---------------------------------------------------------------------------- save / load
def save(obj: Any, f, src: int = 0, save_closure: Callable = torch.save, **kwargs) -> None:
    """Save this party's own shares of `obj` (an MPCTensor, or a dict / list of them such as
    an encrypted state_dict) as plain tensors and metadata; public values as they are."""
    save_closure(_to_record(obj), f)


def load(f, load_closure: Callable = torch.load, **kwargs):
    """Load what save() wrote at this party (its own file; nothing crosses the wire)."""
    return _from_record(load_closure(f))


_SHARE_FORMAT = "crypten_lite.compat/share-v1"


def _to_record(obj):
    if isinstance(obj, MPCTensor):
        return {"format": _SHARE_FORMAT, "share": obj.share.clone(),
                "precision": obj._core.precision, "ptype": obj.ptype.name,
                "requires_grad": obj.requires_grad}
    if isinstance(obj, dict):
        return {k: _to_record(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_record(v) for v in obj)
    return obj


def _from_record(record):
    if isinstance(record, dict) and record.get("format") == _SHARE_FORMAT:
        out = MPCTensor.from_shares(record["share"], precision=record["precision"],
                                    ptype=getattr(mpc.ptype, record["ptype"]))
        out.requires_grad = bool(record["requires_grad"])
        return out
    if isinstance(record, dict):
        return {k: _from_record(v) for k, v in record.items()}
    if isinstance(record, (list, tuple)):
        return type(record)(_from_record(v) for v in record)
    return record


def save_from_party(obj: Any, f, src: int = 0, save_closure: Callable = torch.save, **kwargs) -> None:
    """Party `src` saves plaintext `obj` with save_closure; the others do nothing."""
    if get_rank() == src:
        save_closure(obj, f)


def _owner_load(f, **kwargs):
    """load_from_party's default load_closure: torch.load of the file party `src` saved
    itself (its own model: a whole torch module needs weights_only=False, which is safe only
    because the file is the owner's own; no other party ever reads it)."""
    kwargs.setdefault("weights_only", False)
    return torch.load(f, **kwargs)


class RemoteModule(torch.nn.Module):
    """What load_from_party returns for a torch module at the parties other than its owner:
    a placeholder without weights or class. crypten.nn.from_pytorch(it, dummy_input) rebuilds
    the owner's architecture in-band (the owner broadcasts a description, never a pickle);
    encrypt(src=src) then shares the owner's weights."""

    def __init__(self, src: int):
        super().__init__()
        self.src = src

    def forward(self, *args, **kwargs):
        raise TypeError(f"party {get_rank()} does not hold party {self.src}'s model (load_from_party "
                        f"gives it to party {self.src} only): convert it with crypten.nn.from_pytorch("
                        f"model, dummy_input) and encrypt(src={self.src}), then run the private model")


def load_from_party(f=None, preloaded=None, encrypted: bool = False, model_class=None,
                    src: int = 0, load_closure: Callable = _owner_load, **kwargs):
    """Party `src` loads a tensor or a torch module (from its own file `f` with
    load_closure(f, **kwargs), or `preloaded`); the other parties pass nothing.

    A tensor comes back secret-shared from `src` (an MPCTensor with `.src`). A torch module
    comes back as it is at `src` and as a RemoteModule elsewhere, both with `.src`:
    crypten.nn.from_pytorch(model, dummy_input) then carries the architecture in-band (no
    pickle crosses between parties) and encrypt(src=src) shares the weights. Every party gets
    a TypeError when what `src` loaded is neither."""
    if encrypted:
        raise NotImplementedError("encrypted=True: use crypten.load on each party's own file")
    c = communicator.get()
    if not isinstance(src, int) or not 0 <= src < c.get_world_size():
        raise ValueError(f"load_from_party: src must be a rank in 0..{c.get_world_size() - 1}, got {src!r}")
    kind = torch.zeros(1, dtype=torch.int64)
    value = None
    if c.get_rank() == src:
        if (f is None) == (preloaded is None):
            raise ValueError("load_from_party: party src gives exactly one of f and preloaded")
        value = preloaded if preloaded is not None else load_closure(f, **kwargs)
        kind[0] = 1 if isinstance(value, torch.Tensor) else (2 if isinstance(value, torch.nn.Module) else 0)
    kind = c._core.broadcast(kind if c.get_rank() == src else None, src)
    if int(kind[0]) == 0:
        raise TypeError(f"load_from_party: party {src} loaded something that is neither a tensor nor "
                        "a torch module" + (f" ({type(value).__name__})" if value is not None else ""))
    if int(kind[0]) == 2:
        model = value if c.get_rank() == src else RemoteModule(src)
        model.src = src
        return model
    out = cryptensor(value if c.get_rank() == src else [], src=src)
    out.src = src
    return out


def print(*args, in_order: bool = False, dst=0, **kwargs) -> None:  # noqa: A001 (CrypTen's name)
    """CrypTen's print: builtins.print at party `dst` only (an int or a list of ranks), or,
    with in_order=True, at every party in rank order (a barrier after each). Inside
    run_multiprocess what the parties print is shown by the calling process, rank by rank."""
    _print_with(builtins.print, args, in_order, dst, kwargs)


def log(*args, in_order: bool = False, dst=0, **kwargs) -> None:
    """CrypTen's log: logging.info with print's rules for which parties output."""
    _print_with(lambda *a, **k: logging.info(*a, **k), args, in_order, dst, kwargs)


# crypten.print calls so far in this process: every party makes the same calls, so the
# number orders what the parties of run_multiprocess printed as CrypTen shows it.
PRINT_CALLS = {"count": 0}
# Called after each crypten.print / log call (run_multiprocess's parties: the call is done here).
PRINT_HOOKS: list[Callable[[], None]] = []


def _print_with(out: Callable, args, in_order: bool, dst, kwargs) -> None:
    PRINT_CALLS["count"] += 1
    try:
        if not is_initialized():
            out(*args, **kwargs)
            return
        c = communicator.get()
        if in_order:
            for rank in range(c.get_world_size()):
                if rank == c.get_rank():
                    out(*args, **kwargs)
                c.barrier()
        elif c.get_rank() in (dst if isinstance(dst, (list, tuple, set)) else (dst,)):
            out(*args, **kwargs)
    finally:
        for hook in PRINT_HOOKS:
            hook()


def print_communication_stats() -> None:
    communicator.get().print_communication_stats()


def reset_communication_stats() -> None:
    communicator.get().reset_communication_stats()


def get_communication_stats() -> dict:
    return communicator.get().get_communication_stats()


def __getattr__(name: str):
    if name == "generators":  # CrypTen's torch generators of this session (compat/_generators.py)
        import importlib
        return importlib.import_module(__name__ + "._generators").current()
    raise AttributeError(f"module 'crypten' (crypten_lite.compat) has no attribute {name!r}")


def manual_seed(next_seed: int, local_seed: int, global_seed: int) -> None:
    """CrypTen's manual_seed of its torch generators (debug mode only; compat/_generators.py)."""
    import importlib
    importlib.import_module(__name__ + "._generators").manual_seed(next_seed, local_seed, global_seed)


__all__ = [
    "init", "uninit", "is_initialized", "cryptensor", "CrypTensor", "MPCTensor", "cfg", "cat",
    "stack", "where", "rand", "bernoulli", "save", "load", "save_from_party", "load_from_party",
    "get_default_cryptensor_type", "set_default_cryptensor_type", "register_cryptensor",
    "get_cryptensor_type", "is_encrypted_tensor", "no_grad", "enable_grad", "set_grad_enabled",
    "communicator", "mpc", "nn", "optim", "gradients", "common", "debug", "print", "log",
    "print_communication_stats", "reset_communication_stats", "get_communication_stats",
    "manual_seed",
]
