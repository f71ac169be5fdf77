"""The party's session: configuration, communicator, provider and pairwise PRGs.

`crypten_lite.init()` builds one from the environment; `uninit()` tears it down. Nothing
happens at import time.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import sys
import threading
from dataclasses import dataclass, field

import crypten_lite.comm as comm_module  # not `from . import`: that asks the lazy package first
from . import config as config_module
from .comm.communicator import Communicator
from .config import Config
from .errors import CommunicationError, ConfigError, NotInitializedError, report_uncaught
from .provider import Provider
from .random import PRG, BufferedPRG, subkey

log = logging.getLogger("crypten_lite")


@dataclass
class Session:
    """Everything a party needs to run protocols."""

    config: Config
    comm: Communicator
    provider: Provider
    pair_prgs: dict[int, PRG] = field(default_factory=dict)
    # Seeds agreed with each peer in the handshake; pair_prg() derives one stream per purpose.
    pair_seeds: dict[int, bytes] = field(default_factory=dict, repr=False)
    _purpose_prgs: dict[tuple[str, int], PRG] = field(default_factory=dict, repr=False)
    # Protocol "rss": truncation pairs made ahead of time, per bit count (mpc.rss).
    rss_stock: dict = field(default_factory=dict, repr=False)
    rss_recording: list | None = field(default=None, repr=False)

    def pair_prg(self, purpose: str, peer: int) -> PRG:
        """The PRG this party shares with `peer` for `purpose` (a random.PURPOSES name): both
        derive the same key, and draw the same values as long as they draw in the same order."""
        key = (purpose, peer)
        if key not in self._purpose_prgs:
            if peer not in self.pair_seeds:
                raise ConfigError(f"party {self.rank} has no seed agreed with party {peer}")
            self._purpose_prgs[key] = BufferedPRG(subkey(self.pair_seeds[peer], purpose))
        return self._purpose_prgs[key]

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def world_size(self) -> int:
        return self.comm.world_size

    def close(self) -> None:
        try:
            self.provider.close()
        finally:
            self.comm.close()


_session: Session | None = None


def current() -> Session:
    """The active session; raises NotInitializedError with what to do otherwise."""
    if _session is None:
        raise NotInitializedError(
            "crypten_lite is not initialized: call crypten_lite.init() first (without a launch "
            "it gives a session of one party in this process, which has no privacy; for N "
            "parties start the script with `crypten-lite launch -n 2 script.py` or call a "
            "run_multiprocess function)")
    return _session


def is_initialized() -> bool:
    return _session is not None


def install(session: Session) -> None:
    global _session
    _session = session
    comm_module.set_current(session.comm)
    config_module.set_current(session.config)


def init(config: Config | None = None, **overrides) -> Session:
    """Join the session described by `config` (default: the CRYPTEN_LITE_* environment)."""
    from .comm.grpc_comm import GrpcCommunicator
    from .provider import NoProvider, make as make_provider

    global _session
    if _session is not None:
        log.warning("crypten_lite.init() called twice; keeping the existing session")
        return _session
    _install_excepthook()  # before joining: an error of init() is short too
    config = config or Config.from_env(**overrides)
    if config.world_size < 2:
        raise ConfigError(
            "crypten_lite needs at least 2 parties: set CRYPTEN_LITE_WORLD_SIZE and "
            "CRYPTEN_LITE_PARTIES, or start the script with `crypten-lite launch -n 2 script.py`")
    comm = GrpcCommunicator(config)
    try:
        # Replicated sharing needs no correlated randomness: no dealer is contacted, and a
        # protocol that would still ask for a correlation gets a clear error naming it.
        provider = NoProvider(config) if config.protocol == "rss" else make_provider(config, comm)
    except BaseException:
        comm.close()
        raise
    session = Session(config, comm, provider,
                      {p: BufferedPRG(subkey(seed, "przs")) for p, seed in comm.pair_seeds.items()},
                      dict(comm.pair_seeds))
    install(session)
    # threading's exit hooks run before atexit and join the gRPC server's worker threads,
    # which wait on peer streams: close the transport first so that exit never hangs.
    threading._register_atexit(uninit)  # noqa: SLF001 (documented CPython hook)
    atexit.register(uninit)
    return session


# -- one party in this process (a notebook, `python script.py` without a launch) -----------
SINGLE_PROCESS_WARNING = (
    "crypten_lite: no parties are configured (no CRYPTEN_LITE_WORLD_SIZE / _PARTIES / _CONFIG), "
    "so this process runs a session of ONE party (world size 1) in-process. One party gives NO "
    "privacy: every value is in this process. Use it to try the API; for private computation "
    "start parties with `crypten-lite launch -n 2 script.py` or call a run_multiprocess function.")


class SingleProcessWarning(UserWarning):
    """init() outside a launch: a session of one party, which gives no privacy."""


_warned_single = False


def init_single_process(precision: int | None = None) -> Session:
    """A session of one party in this process (what init() gives where no launch configured
    any): the same protocols and code paths as N parties, over the in-process transport with
    one mailbox and a provider of one party (rank 0 derives its own correlated values, as the
    dealer would). Warns once per process that one party gives no privacy."""
    from .comm.inprocess import InProcessCommunicator, InProcessHub
    from .provider import OnePartyProvider

    global _warned_single
    if _session is not None:
        log.warning("crypten_lite.init() called twice; keeping the existing session")
        return _session
    if not _warned_single:
        _warned_single = True
        import warnings
        warnings.warn(SINGLE_PROCESS_WARNING, SingleProcessWarning, stacklevel=3)
    # Session-wide settings of the environment (precision, truncation, timeout) still apply.
    config = Config.from_env(rank=0, world_size=1, parties=(), dealer="", provider="tfp",
                             protocol="additive", session=f"single-process-{os.getpid()}",
                             precision=precision)
    _install_excepthook()  # `python script.py`: a crypten_lite error is short here too
    comm = InProcessCommunicator(InProcessHub(1, config.timeout), 0)
    session = Session(config, comm, OnePartyProvider(config), {}, {})
    install(session)
    return session


# -- one failure stops the session ---------------------------------------------------------
# `crypten-lite launch` sets this to a file per rank: a script that raises writes there which
# party its failure comes from, so that the launcher names the party that failed first.
REPORT_FILE_ENV = "CRYPTEN_LITE_REPORT_FILE"
_previous_excepthook = sys.excepthook


def failure_origin(exc: BaseException) -> tuple[int, str]:
    """(rank, exception type) of the party whose failure `exc` follows from.

    This party's own rank and `exc`'s type, unless `exc` (or an exception it was raised from)
    is a CommunicationError about a peer known to have failed: then that failure's origin."""
    session = current()
    seen: BaseException | None = exc
    for _ in range(16):
        if seen is None:
            break
        if isinstance(seen, CommunicationError) and isinstance(seen.peer, int):
            known = session.comm.peer_failure(seen.peer)
            if known is not None:
                return known
        seen = seen.__cause__ or seen.__context__
    return session.rank, type(exc).__name__


def abort(exc: BaseException) -> None:
    """Tell every peer that this party stops because of `exc` (its type name only, never its
    message): their waits on this party fail at once with a CommunicationError naming the
    party that failed first. Called for an uncaught exception (sys.excepthook, installed by
    init()) and by run_multiprocess's workers; call it yourself where an exception is caught
    and the process lives on (a notebook), then uninit()."""
    if _session is None:
        return
    origin, error = failure_origin(exc)
    _session.comm.abort(origin, error)


def _install_excepthook() -> None:
    """Make an uncaught crypten_lite error a two-line report (see _excepthook), once."""
    global _previous_excepthook
    if sys.excepthook is not _excepthook:
        _previous_excepthook, sys.excepthook = sys.excepthook, _excepthook


def _excepthook(exc_type, exc, tb) -> None:
    session = _session
    origin = None
    if session is not None:
        try:
            origin = failure_origin(exc)
            path = os.environ.get(REPORT_FILE_ENV)
            if path:
                with open(path, "w") as f:
                    json.dump({"rank": session.rank, "origin": origin[0], "error": origin[1]}, f)
        except Exception:  # noqa: BLE001 (reporting must never hide the exception itself)
            log.exception("could not report this party's failure")
    # a crypten_lite error: where it stopped the script and its message (no traceback unless
    # CRYPTEN_LITE_TRACEBACK=1); anything else: the previous hook's traceback
    report_uncaught(exc_type, exc, tb, _previous_excepthook)
    if session is not None and origin is not None:
        session.comm.abort(*origin)


def uninit() -> None:
    """Leave the session and release its transport (idempotent)."""
    global _session
    if _session is None:
        return
    session, _session = _session, None
    comm_module.set_current(None)
    config_module.set_current(None)
    session.close()
