"""Local multi-party launching: a persistent pool of party processes and run_multiprocess.

Parties are separate processes started with the `spawn` method (gRPC objects do not survive
fork), each building its own server and channels; a dealer process serves correlated
randomness. Functions travel to the workers by reference (module and name), results come
back through multiprocessing queues (local IPC between the launcher and its own children,
never between parties).
"""

from __future__ import annotations

import functools
import importlib
import multiprocessing as mp
import os
import queue
import signal
import socket
import sys
import traceback
from typing import Any, Callable

from ..errors import CryptenLiteError

_CTX = mp.get_context("spawn")


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct TCP ports free right now on `host`."""
    sockets, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            sockets.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in sockets:
            s.close()
    return ports


def local_env(world_size: int, provider: str = "dealer", session: str | None = None,
              timeout: float = 60.0, extra: dict[str, str] | None = None) -> tuple[list[dict[str, str]], dict[str, str]]:
    """Environment of each party and of the dealer for a session on loopback."""
    ports = free_ports(world_size + 1)
    parties = ",".join(f"127.0.0.1:{p}" for p in ports[:world_size])
    common = {
        "CRYPTEN_LITE_WORLD_SIZE": str(world_size),
        "CRYPTEN_LITE_PARTIES": parties,
        "CRYPTEN_LITE_DEALER": f"127.0.0.1:{ports[-1]}",
        "CRYPTEN_LITE_PROVIDER": provider,
        "CRYPTEN_LITE_SESSION": session or f"local-{os.getpid()}-{ports[0]}",
        "CRYPTEN_LITE_TIMEOUT": str(timeout),
    }
    common.update(extra or {})
    party_envs = [dict(common, CRYPTEN_LITE_RANK=str(r)) for r in range(world_size)]
    return party_envs, dict(common, CRYPTEN_LITE_RANK="0")


def _apply_env(env: dict[str, str]) -> None:
    for key in [k for k in os.environ if k.startswith("CRYPTEN_LITE_")]:
        del os.environ[key]
    os.environ.update(env)


def dealer_main(env: dict[str, str]) -> None:
    """Entry point of a dealer process (runs until terminated)."""
    _apply_env(env)
    from ..comm.dealer_rpc import DealerServer
    from ..config import Config
    from ..provider import dealer_handler

    config = Config.from_env()
    server = DealerServer(config, dealer_handler)
    signal.signal(signal.SIGTERM, lambda *a: (server.stop(), sys.exit(0)))
    server.wait()


def _resolve(ref: tuple[str, str]) -> Callable:
    module, qualname = ref
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return getattr(obj, "__wrapped__", obj)


def _worker(env: dict[str, str], tasks, results) -> None:
    _apply_env(env)
    import torch
    torch.set_num_threads(1)
    import crypten_lite
    rank = int(env["CRYPTEN_LITE_RANK"])
    try:
        crypten_lite.init()
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
        return
    results.put((rank, True, "ready"))
    while True:
        task = tasks.get()
        if task is None:
            break
        ref, args, kwargs = task
        try:
            value = _resolve(ref)(*args, **kwargs)
            results.put((rank, True, value))
        except BaseException:
            results.put((rank, False, traceback.format_exc()))
    crypten_lite.uninit()


class PartyFailure(CryptenLiteError):
    """A party raised while running a function; carries every failing rank's traceback."""


class PartyPool:
    """`world_size` party processes (plus a dealer) that stay up between calls."""

    def __init__(self, world_size: int, provider: str = "dealer", timeout: float = 60.0,
                 env: dict[str, str] | None = None):
        self.world_size = world_size
        self.provider = provider
        self.timeout = timeout
        self.extra_env = env or {}
        self._procs: list = []
        self._start()

    def _start(self) -> None:
        party_envs, dealer_env = local_env(self.world_size, self.provider, timeout=self.timeout,
                                           extra=self.extra_env)
        self._results = _CTX.Queue()
        self._tasks = [_CTX.Queue() for _ in range(self.world_size)]
        self._procs = []
        if self.provider == "dealer":
            dealer = _CTX.Process(target=dealer_main, args=(dealer_env,), daemon=True)
            dealer.start()
            self._procs.append(dealer)
        for rank, env in enumerate(party_envs):
            p = _CTX.Process(target=_worker, args=(env, self._tasks[rank], self._results), daemon=True)
            p.start()
            self._procs.append(p)
        self._collect("start")

    def _collect(self, what: str) -> list[Any]:
        values: dict[int, Any] = {}
        failures: dict[int, str] = {}
        deadline_each = self.timeout + 60
        while len(values) + len(failures) < self.world_size:
            try:
                rank, ok, value = self._results.get(timeout=deadline_each)
            except queue.Empty:
                self.close()
                raise PartyFailure(f"parties did not finish {what} within {deadline_each:g} s") from None
            (values if ok else failures)[rank] = value
        if failures:
            self.close()
            detail = "\n".join(f"--- party {r} ---\n{tb}" for r, tb in sorted(failures.items()))
            raise PartyFailure(f"{what} failed on parties {sorted(failures)}:\n{detail}")
        return [values[r] for r in range(self.world_size)]

    def run(self, fn: Callable, *args, **kwargs) -> list[Any]:
        """Run fn(*args, **kwargs) on every party; the list of each rank's return value."""
        if not self._procs:
            self._start()
        fn = getattr(fn, "__wrapped__", fn)
        ref = (fn.__module__, fn.__qualname__)
        if "<locals>" in fn.__qualname__:
            raise CryptenLiteError("run_multiprocess needs a module-level function (spawned "
                                   "parties import it by name)")
        for q in self._tasks:
            q.put((ref, args, kwargs))
        return self._collect(f"{fn.__qualname__}")

    def close(self) -> None:
        """Stop every process (no process is left behind)."""
        for q in getattr(self, "_tasks", []):
            try:
                q.put(None)
            except (OSError, ValueError):
                pass
        for p in self._procs:
            p.join(timeout=3)
        for p in self._procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=3)
            if p.is_alive():
                p.kill()
                p.join()
        self._procs = []

    def __enter__(self) -> "PartyPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_multiprocess(world_size: int, provider: str = "dealer", timeout: float = 60.0):
    """Decorator: calling the function runs it on `world_size` parties; returns each rank's value.

    The function must be defined at module level (parties are spawned processes that import
    it). Raises PartyFailure with the failing rank's traceback.
    """
    def decorator(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with PartyPool(world_size, provider, timeout) as pool:
                return pool.run(fn, *args, **kwargs)
        return wrapper
    return decorator
