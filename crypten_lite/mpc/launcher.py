"""Local multi-party launching: a persistent pool of party processes and run_multiprocess.

Parties are separate processes started with the `spawn` method (gRPC objects do not survive
fork), each building its own server and channels; under the additive protocol a dealer process
serves correlated randomness, under `rss` (3 parties, replicated sharing) there is none. Functions travel to the workers by value (cloudpickle), so that functions defined
in a notebook cell, in `python -c`, in a script read from stdin or inside another function
work; results come back through multiprocessing queues. Both are local IPC between the
launcher and its own children, never between parties (parties exchange only tensors).
The children do not re-run the launching script (unlike plain spawn): a script that calls
init() and run_multiprocess at top level would otherwise run again in every child.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing as mp
import os
import queue
import signal
import socket
import sys
import traceback
from typing import Any, Callable, Iterator

import cloudpickle

from ..config import PREFIX, PROTOCOLS
from ..errors import ConfigError, CryptenLiteError

_CTX = mp.get_context("spawn")
PROTOCOL_ENV = PREFIX + "PROTOCOL"
BIND_ENV = PREFIX + "BIND"
LOOPBACK = "127.0.0.1"


def resolve_protocol(world_size: int, protocol: str | None = None,
                     env: dict[str, str] | None = None) -> str:
    """The sharing scheme of a local session: `protocol` if given, else CRYPTEN_LITE_PROTOCOL
    from `env`, else from this process's environment, else "additive"; checked against
    `world_size` ("rss" needs exactly 3 parties) before any process starts."""
    chosen = protocol or (env or {}).get(PROTOCOL_ENV) or os.environ.get(PROTOCOL_ENV) or "additive"
    if chosen not in PROTOCOLS:
        raise ConfigError(f"protocol must be one of {PROTOCOLS}, got {chosen!r} ({PROTOCOL_ENV})")
    if chosen == "rss" and world_size != 3:
        raise ConfigError(
            f"protocol 'rss' (replicated secret sharing) needs exactly 3 parties, got "
            f"{world_size}; use protocol 'additive' for {world_size} parties")
    return chosen


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


# Session-wide settings a user may give in this process's environment: every launched party
# (and the dealer) gets them, unless `extra` says otherwise. The rest of the CRYPTEN_LITE_*
# variables (rank, addresses, provider, session, timeout, protocol) are the launcher's.
INHERITED = ("CRYPTEN_LITE_PRECISION", "CRYPTEN_LITE_TRUNCATION", "CRYPTEN_LITE_MAX_MESSAGE_BYTES",
             "CRYPTEN_LITE_MAX_MODEL_BYTES",
             "CRYPTEN_LITE_CONFIG", "CRYPTEN_LITE_TLS_DIR", "CRYPTEN_LITE_RING_GEMM",
             "CRYPTEN_LITE_HEAP_TRIM_MB", "CRYPTEN_LITE_PAIRWISE_OT", "CRYPTEN_LITE_NATIVE")


def inherited_settings() -> dict[str, str]:
    """The INHERITED settings set (non-empty) in this process's environment."""
    return {k: os.environ[k] for k in INHERITED if os.environ.get(k)}


def local_env(world_size: int, provider: str = "dealer", session: str | None = None,
              timeout: float = 60.0, extra: dict[str, str] | None = None,
              protocol: str | None = None) -> tuple[list[dict[str, str]], dict[str, str] | None]:
    """Environment of each party and of the dealer for a session on loopback.

    The protocol comes from :func:`resolve_protocol` (`protocol`, else CRYPTEN_LITE_PROTOCOL
    in `extra` or in this process's environment); under "rss" there is no dealer: the parties
    get no dealer address and the dealer environment is None. The session-wide settings of
    this process's environment (INHERITED: precision, truncation, ...) pass to every process;
    `extra` overrides them.

    Every process binds to loopback (CRYPTEN_LITE_BIND=127.0.0.1, which overrides a ``bind``
    of an inherited CRYPTEN_LITE_CONFIG file: a launched session must never listen on the
    network, in plaintext or not, because of a file meant for another deployment) unless
    `extra` sets CRYPTEN_LITE_BIND itself."""
    protocol = resolve_protocol(world_size, protocol, extra)
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
    common.update(inherited_settings())
    common[BIND_ENV] = LOOPBACK  # each party adds its own port (grpc_comm); the dealer's below
    common.update(extra or {})
    common[PROTOCOL_ENV] = protocol
    if protocol == "rss":
        del common["CRYPTEN_LITE_DEALER"]
    party_envs = [dict(common, CRYPTEN_LITE_RANK=str(r)) for r in range(world_size)]
    if protocol == "rss":
        return party_envs, None
    dealer_env = dict(common, CRYPTEN_LITE_RANK="0")
    if dealer_env[BIND_ENV] == LOOPBACK:
        dealer_env[BIND_ENV] = f"{LOOPBACK}:{ports[-1]}"
    return party_envs, dealer_env


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


@contextlib.contextmanager
def _children_skip_main() -> Iterator[None]:
    """Hide the launching script from spawn while children start.

    spawn re-imports the parent's __main__ in every child (as __mp_main__) so that functions
    pickled by name resolve there. Tasks travel by value here, so the children need no
    __main__, and re-running it would repeat a top-level init() or run_multiprocess call."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def main_classes() -> dict[str, type]:
    """The classes defined in this process's __main__ (notebook cells, the launching script)
    that cloudpickle can carry by value: the parties install them in their own __main__, so
    that what refers to them by name (torch.load of a model a party saved itself, CrypTen's
    `model_class=`) finds them there as it would in the notebook."""
    main = sys.modules.get("__main__")
    found = {}
    for name, value in list(getattr(main, "__dict__", {}).items()):
        if isinstance(value, type) and value.__module__ == "__main__" and value.__name__ == name:
            try:
                cloudpickle.dumps(value)
            except Exception:  # noqa: BLE001 (a class that cannot travel stays behind)
                continue
            found[name] = value
    return found


def _load_task(payload: bytes) -> tuple[Callable, tuple, dict]:
    """The (function, args, kwargs) the launcher serialized with cloudpickle; the launcher's
    __main__ classes (main_classes) are installed in this process's __main__ first."""
    fn, args, kwargs, classes = cloudpickle.loads(payload)
    main = sys.modules.get("__main__")
    if main is not None:
        for name, cls in classes.items():
            setattr(main, name, cls)
    return getattr(fn, "__wrapped__", fn), args, kwargs


def _worker(env: dict[str, str], tasks, results) -> None:
    _apply_env(env)
    import torch
    torch.set_num_threads(1)
    import crypten_lite
    rank = int(env["CRYPTEN_LITE_RANK"])
    try:
        from crypten_lite.mpc.offline import tune_malloc
        tune_malloc()  # before init: the transport's threads then share the main heap
        crypten_lite.init()
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
        return
    results.put((rank, True, "ready"))
    while True:
        task = tasks.get()
        if task is None:
            break
        try:
            fn, args, kwargs = _load_task(task)
            value = fn(*args, **kwargs)
            results.put((rank, True, value))
        except BaseException as e:
            # One failure stops the session: the peers' waits on this party fail at once
            # (the pool is closed after a failed call, so the session is not reused).
            from ..session import abort, failure_origin
            origin = failure_origin(e)
            abort(e)
            results.put((rank, False, (traceback.format_exc(), origin)))
    crypten_lite.uninit()


def _failure_report(what: str, failures: dict[int, Any]) -> str:
    """The party that failed first (its traceback first), then those that stopped because of it."""
    reports = {r: v if isinstance(v, tuple) else (v, (r, "")) for r, v in failures.items()}
    first = sorted(r for r, (_, origin) in reports.items() if origin[0] == r)
    named = {origin for _, origin in reports.values() if origin[0] not in failures}
    order = first + sorted(r for r in reports if r not in first)
    lines = []
    if first:
        lines.append(f"{what} failed on part{'ies' if len(first) > 1 else 'y'} " + ", ".join(
            f"{r} ({reports[r][1][1]})" if reports[r][1][1] else str(r) for r in first))
    for rank, error in sorted(named):
        lines.append(f"{what} failed on party {rank} ({error})")
    consequences = [r for r in order if r not in first]
    if not lines:
        lines.append(f"{what} failed on parties {', '.join(map(str, order))}")
    elif consequences:
        lines[-1] += (f"; part{'ies' if len(consequences) > 1 else 'y'} "
                      f"{', '.join(map(str, consequences))} stopped because of it")
    lines[-1] += ":"
    lines += [f"--- party {r} ---\n{reports[r][0]}" for r in order]
    return "\n".join(lines)


class PartyFailure(CryptenLiteError):
    """A party raised while running a function; carries every failing rank's traceback."""


POLL_S = 1.0    # PartyPool: how often a wait for answers checks that every party process lives
DRAIN_S = 5.0   # and, once one died, how long it waits for the others' answers (their errors)


class PartyPool:
    """`world_size` party processes (plus a dealer under the additive protocol with the dealer
    provider) that stay up between calls.

    `protocol`: "additive" or "rss" (3 parties, no dealer); default CRYPTEN_LITE_PROTOCOL from
    `env`, else from this process's environment, else "additive"."""

    def __init__(self, world_size: int, provider: str = "dealer", timeout: float = 60.0,
                 env: dict[str, str] | None = None, protocol: str | None = None):
        self.world_size = world_size
        self.provider = provider
        self.timeout = timeout
        self.extra_env = env or {}
        self.protocol = resolve_protocol(world_size, protocol, self.extra_env)
        self._procs: list = []
        self._start()

    def _start(self) -> None:
        party_envs, dealer_env = local_env(self.world_size, self.provider, timeout=self.timeout,
                                           extra=self.extra_env, protocol=self.protocol)
        self._results = _CTX.Queue()
        self._tasks = [_CTX.Queue() for _ in range(self.world_size)]
        self._procs = []
        if dealer_env is not None and self.provider == "dealer":
            dealer = _CTX.Process(target=dealer_main, args=(dealer_env,), daemon=True)
            with _children_skip_main():
                dealer.start()
            self._procs.append(dealer)
        for rank, env in enumerate(party_envs):
            p = _CTX.Process(target=_worker, args=(env, self._tasks[rank], self._results), daemon=True)
            with _children_skip_main():
                p.start()
            self._procs.append(p)
        self._collect("start")

    def _collect(self, what: str) -> list[Any]:
        """Every party's answer; a party process that dies without answering (a crash, the
        kernel's out-of-memory killer) is a PartyFailure naming it within POLL_S seconds, not
        a wait for the whole deadline."""
        values: dict[int, Any] = {}
        failures: dict[int, str] = {}
        deadline_each = self.timeout + 60
        waited = 0.0
        while len(values) + len(failures) < self.world_size:
            try:
                rank, ok, value = self._results.get(timeout=POLL_S)
            except queue.Empty:
                waited += POLL_S
                dead = self._dead_parties(set(values) | set(failures))
                if dead:
                    self._drain(values, failures)
                    for rank, desc in dead.items():
                        if rank not in values and rank not in failures:
                            failures[rank] = (f"party {rank}'s process exited ({desc}) while running "
                                              f"{what}, without an answer\n", (rank, f"its process {desc}"))
                    break
                if waited >= deadline_each:
                    self.close()
                    raise PartyFailure(f"parties did not finish {what} within {deadline_each:g} s") from None
                continue
            waited = 0.0
            (values if ok else failures)[rank] = value
        if failures:
            self.close()
            raise PartyFailure(_failure_report(what, failures))
        return [values[r] for r in range(self.world_size)]

    def _dead_parties(self, answered: set[int]) -> dict[int, str]:
        """{rank: how its process ended} for the party processes that exited unasked."""
        dead = {}
        for rank, p in enumerate(self._procs[-self.world_size:] if self._procs else []):
            if rank in answered or p.exitcode is None:
                continue
            code = p.exitcode
            if code < 0:
                try:
                    name = signal.Signals(-code).name
                except ValueError:
                    name = f"signal {-code}"
                hint = " (the kernel's out-of-memory killer sends it)" if -code == signal.SIGKILL else ""
                dead[rank] = f"was killed by {name}{hint}"
            else:
                dead[rank] = f"exited with status {code}"
        return dead

    def _drain(self, values: dict, failures: dict) -> None:
        """Answers still in the queue (the live parties' errors about the dead one)."""
        while len(values) + len(failures) < self.world_size:
            try:
                rank, ok, value = self._results.get(timeout=DRAIN_S)
            except queue.Empty:
                return
            (values if ok else failures)[rank] = value

    def run(self, fn: Callable, *args, **kwargs) -> list[Any]:
        """Run fn(*args, **kwargs) on every party; the list of each rank's return value."""
        if not self._procs:
            self._start()
        fn = getattr(fn, "__wrapped__", fn)
        try:
            payload = cloudpickle.dumps((fn, args, kwargs, main_classes()))
        except Exception as e:
            raise CryptenLiteError(f"run_multiprocess cannot send {fn.__qualname__} and its "
                                   f"arguments to the parties: {e}") from e
        for q in self._tasks:
            q.put(payload)
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


def run_multiprocess(world_size: int, provider: str = "dealer", timeout: float = 60.0,
                     protocol: str | None = None):
    """Decorator: calling the function runs it on `world_size` parties; returns each rank's value.

    The function may be defined anywhere (module, notebook cell, `python -c`, stdin, another
    function): it travels to the spawned parties by value. Raises PartyFailure with the
    failing rank's traceback. `protocol` as for PartyPool ("rss": 3 parties, no dealer).
    """
    if protocol is not None:
        resolve_protocol(world_size, protocol)  # a wrong protocol fails here, not at the call

    def decorator(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with PartyPool(world_size, provider, timeout, protocol=protocol) as pool:
                return pool.run(fn, *args, **kwargs)
        return wrapper
    return decorator
