"""CrypTen's `crypten.mpc`: MPCTensor, ptypes, run_multiprocess, provider checks."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import shutil
import sys
import tempfile
import threading
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
    type are carried into the parties. What the parties print is shown here while they run
    (in a notebook: in the cell), in CrypTen's order: crypten.print call by call, each call's
    output rank by rank, as soon as every party has made that call; anything else a party
    prints right after it (PrintStream). The caller may itself be in a session (init()
    outside a launch gives one of one party): the parties build their own."""
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
            with PrintStream(world_size) as stream:
                with launcher.PartyPool(world_size, provider, timeout, protocol=protocol) as pool:
                    return pool.run(_in_party, fn, settings, kind, stream.folder, args, kwargs)
        return wrapper
    return decorator


def _in_party(fn, settings, kind, folder, args, kwargs):
    """Runs in each party: CrypTen's settings, then the user's function; what it prints goes
    to this party's file in `folder` (PrintStream), shown by the caller as it comes."""
    from .. import PRINT_CALLS, PRINT_HOOKS, init
    from ..tensor import set_default_cryptensor_type
    config_mod.cfg.reset()
    _apply(settings)
    set_default_cryptensor_type(kind)
    init()
    from ... import session
    rank = session.current().rank
    with open(os.path.join(folder, f"{rank}.jsonl"), "a", encoding="utf-8") as out:
        base = PRINT_CALLS["count"]

        def record(entry: dict) -> None:
            out.write(json.dumps(entry) + "\n")
            out.flush()

        def done() -> None:
            record({"done": PRINT_CALLS["count"] - base})

        printed = _Printed(lambda text: record({"i": PRINT_CALLS["count"] - base, "t": text}))
        record({"done": 0})
        PRINT_HOOKS.append(done)
        try:
            with contextlib.redirect_stdout(printed):
                return fn(*args, **kwargs)
        finally:
            PRINT_HOOKS.remove(done)
            record({"end": True})


class _Printed(io.TextIOBase):
    """A party's stdout during run_multiprocess: each write goes to `emit`."""

    def __init__(self, emit: Callable[[str], None]):
        super().__init__()
        self._emit = emit

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if text:
            self._emit(text)
        return len(text)


class PrintStream:
    """What the parties of one run_multiprocess call print, shown by the caller while they run.

    Each party appends JSON lines to its own file in a private temporary folder (0700, this
    user's; no pickle): {"i": k, "t": text} for text printed after its k-th crypten.print call
    began, {"done": k} once its k-th call is done. A thread here shows the text of call k,
    rank by rank, once every party is done with call k (CrypTen's order: in_order output rank
    by rank, calls in order); text a party prints after that comes as it arrives. Whatever is
    left is shown when the call returns or fails."""

    POLL_S = 0.05

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.folder = tempfile.mkdtemp(prefix="crypten-lite-print-")
        self._offsets = [0] * world_size
        self._partial = [""] * world_size
        self._done = [-1] * world_size
        self._pending: list[tuple[int, int, int, str]] = []
        self._seq = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="crypten-lite-print", daemon=True)

    def __enter__(self) -> "PrintStream":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._show(final=True)
        shutil.rmtree(self.folder, ignore_errors=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.POLL_S):
            self._show(final=False)

    def _read(self) -> None:
        for rank in range(self.world_size):
            try:
                with open(os.path.join(self.folder, f"{rank}.jsonl"), encoding="utf-8") as f:
                    f.seek(self._offsets[rank])
                    data = f.read()
                    self._offsets[rank] = f.tell()
            except FileNotFoundError:
                continue
            lines = (self._partial[rank] + data).split("\n")
            self._partial[rank] = lines.pop()
            for line in lines:
                entry = json.loads(line)
                if "t" in entry:
                    self._pending.append((int(entry["i"]), rank, self._seq, str(entry["t"])))
                    self._seq += 1
                elif "done" in entry:
                    self._done[rank] = max(self._done[rank], int(entry["done"]))

    def _show(self, final: bool) -> None:
        with self._lock:
            self._read()
            ready = min(self._done)
            show = sorted(c for c in self._pending if final or c[0] <= ready)
            if not show:
                return
            self._pending = [c for c in self._pending if c not in show]
            sys.stdout.write("".join(text for *_, text in show))
            sys.stdout.flush()


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


__all__ = ["MPCTensor", "ptype", "arithmetic", "binary", "run_multiprocess", "PrintStream", "ttp_required",
           "ConfigManager", "get_default_provider", "set_default_provider", "provider"]
