"""Communication layer: the Communicator interface and its transports (gRPC, in-process).

Only this package imports grpc or the generated protobuf modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import NotInitializedError

if TYPE_CHECKING:
    from .communicator import Communicator

_current: Communicator | None = None


def __getattr__(name: str):
    # Communicator (and torch with it) is imported on first use, so that importing a light
    # module of this package (health, tls) does not import torch: see crypten_lite/__init__.py.
    if name == "Communicator":
        from .communicator import Communicator
        return Communicator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get() -> Communicator:
    """The active Communicator of this party (after crypten_lite.init())."""
    if _current is None:
        raise NotInitializedError("no active session: call crypten_lite.init() first (without a "
                                  "launch it gives a session of one party in this process, which "
                                  "has no privacy; for N parties run under `crypten-lite launch` "
                                  "or in a run_multiprocess function)")
    return _current


def set_current(comm: Communicator | None) -> None:
    """Install the active Communicator (init/uninit)."""
    global _current
    _current = comm


def is_set() -> bool:
    return _current is not None


__all__ = ["Communicator", "get", "set_current", "is_set"]
