"""CrypTen's `crypten.mpc`: MPCTensor, ptypes, run_multiprocess, provider checks."""

from __future__ import annotations

import contextlib
import functools
import io
import sys
from typing import Callable

from ...mpc import launcher
from .. import config as config_mod
from ..tensor import MPCTensor, arithmetic, binary, ptype
from . import provider


def run_multiprocess(world_size: int, timeout: float = 120.0):
    """Decorator: calling the function runs it on `world_size` parties (spawned processes
    over gRPC, plus the dealer for cfg.mpc.provider "TTP"); returns each rank's value.

    The function may live in a notebook cell or a script read from stdin (it travels by
    value to the launcher's own children), and so may the classes it uses (the classes of
    this process's __main__ are installed in each party's). cfg and the default cryptensor
    type are carried into the parties. What the parties print (crypten.print) is shown here,
    party by party in rank order, when the call returns (in a notebook: in the cell). The
    caller may itself be in a session (init() outside a launch gives one of one party): the
    parties build their own."""
    if world_size < 2:
        raise ValueError("crypten_lite runs 2 or more parties: run_multiprocess(world_size>=2)")

    def decorator(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            settings = config_mod.cfg.to_dict()
            from ..tensor import get_default_cryptensor_type
            kind = get_default_cryptensor_type()
            provider = config_mod.provider_name()
            protocol = config_mod.protocol_name()  # cfg.mpc.protocol "replicated": rss, 3 parties
            with launcher.PartyPool(world_size, provider, timeout, protocol=protocol) as pool:
                answers = pool.run(_in_party, fn, settings, kind, args, kwargs)
            # crypten.print's order: call by call, each call's output in rank order
            chunks = sorted((index, rank, seq, text) for rank, (_, printed) in enumerate(answers)
                            for seq, (index, text) in enumerate(printed))
            sys.stdout.write("".join(text for *_, text in chunks))
            sys.stdout.flush()
            return [value for value, _ in answers]
        return wrapper
    return decorator


def _in_party(fn, settings, kind, args, kwargs):
    """Runs in each party: CrypTen's settings, then the user's function; returns its value
    and what it printed (shown by the caller). On failure the output goes to this process's
    own stdout before the exception travels back."""
    from .. import init
    from ..tensor import set_default_cryptensor_type
    config_mod.cfg.reset()
    _apply(settings)
    set_default_cryptensor_type(kind)
    init()
    printed = _Printed()
    try:
        with contextlib.redirect_stdout(printed):
            value = fn(*args, **kwargs)
    except BaseException:
        sys.stdout.write("".join(text for _, text in printed.chunks))
        raise
    return value, printed.chunks


class _Printed(io.TextIOBase):
    """A party's stdout during run_multiprocess: (crypten.print calls so far, text) chunks."""

    def __init__(self):
        super().__init__()
        self.chunks: list[tuple[int, str]] = []

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        from .. import PRINT_CALLS
        if text:
            self.chunks.append((PRINT_CALLS["count"], text))
        return len(text)


def _apply(settings: dict, prefix: str = "") -> None:
    for k, v in settings.items():
        key = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict):
            _apply(v, key)
        else:
            config_mod.cfg[key] = v


def ttp_required() -> bool:
    """True when cfg.mpc.provider needs a helper process (crypten_lite: the dealer)."""
    return config_mod.provider_name() == "dealer"


def get_default_provider():
    """The provider class cfg.mpc.provider names (crypten_lite: dealer or TFP)."""
    return provider.TrustedFirstParty if config_mod.provider_name() == "tfp" else provider.TrustedThirdParty


def set_default_provider(provider_class) -> None:
    """Older CrypTen API: select TrustedFirstParty ("TFP") or TrustedThirdParty ("TTP")."""
    config_mod.cfg.mpc.provider = provider_class.NAME


@contextlib.contextmanager
def ConfigManager(*args, **kwargs):
    """Older CrypTen API: ConfigManager("max_method", "pairwise") sets functions.* keys."""
    pairs = dict(zip(args[::2], args[1::2]), **kwargs)
    overrides = {(k if "." in k else f"functions.{k}"): v for k, v in pairs.items()}
    with config_mod.cfg.temp_override(overrides):
        yield


__all__ = ["MPCTensor", "ptype", "arithmetic", "binary", "run_multiprocess", "ttp_required",
           "ConfigManager", "get_default_provider", "set_default_provider", "provider"]
