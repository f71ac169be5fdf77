"""Thread-safe mailbox: messages keyed by (src, seq), waited for with a deadline.

Transports deliver whole messages here; `take(src)` returns the next message from `src` in
sequence order, whatever order they arrived in, or raises CommunicationError when the peer
is known to be dead or the deadline passes.
"""

from __future__ import annotations

import threading
import time

import torch

from ..errors import CommunicationError


class Mailbox:
    """Messages waiting to be received, plus what is known about each peer's health."""

    def __init__(self, rank: int, world_size: int, timeout: float, max_pending: int = 1 << 16):
        self.rank = rank
        self.timeout = timeout
        self.max_pending = max_pending
        self._messages: dict[tuple[int, int], torch.Tensor] = {}
        self._next_seq = [0] * world_size
        self._failed: dict[int, str] = {}
        # Why each failed peer failed, as (rank of the party that failed first, short cause):
        # what this party passes on when it stops because of it (see GrpcCommunicator.abort).
        self._origin: dict[int, tuple[int, str]] = {}
        self._closed: set[int] = set()  # peers that closed their stream (no failure)
        self._cond = threading.Condition()

    def put(self, src: int, seq: int, tensor: torch.Tensor) -> None:
        """Deliver message `seq` from `src`; a duplicate or stale sequence number is refused."""
        with self._cond:
            if seq < self._next_seq[src] or (src, seq) in self._messages:
                raise CommunicationError(f"duplicate message {seq} from party {src}", peer=src)
            if len(self._messages) >= self.max_pending:
                raise CommunicationError(f"too many pending messages from party {src}", peer=src)
            self._messages[(src, seq)] = tensor
            self._cond.notify_all()

    def expected(self, src: int) -> int:
        """Sequence number of the next message take(src) returns."""
        with self._cond:
            return self._next_seq[src]

    def skip(self, src: int, seq: int) -> None:
        """Message `seq` from `src` was consumed as it arrived (a streamed opening), never
        delivered here: the next take(src) returns the one after it."""
        with self._cond:
            if seq != self._next_seq[src] or (src, seq) in self._messages:
                raise CommunicationError(f"message {seq} from party {src} out of sequence", peer=src)
            self._next_seq[src] += 1

    def fail(self, src: int | str, reason: str, origin: tuple[int, str] | None = None) -> None:
        """Record that `src` is gone (or every peer, with src='*'); wakes every waiter.

        The first reason recorded for a peer is kept. `origin` is (rank, short cause) of the
        party whose failure this one follows from (default: `src` itself, cause `reason`)."""
        with self._cond:
            targets = range(len(self._next_seq)) if src == "*" else [src]
            for peer in targets:
                if peer != self.rank and peer not in self._failed:
                    self._failed[peer] = reason
                    self._origin[peer] = origin or (peer, reason)
            self._cond.notify_all()

    def abort(self, src: int, origin: int, error: str) -> None:
        """`src` announced that it stopped because party `origin` failed with `error`."""
        if origin == src:
            self.fail(src, f"failed: {error}", (origin, error))
        else:
            self.fail(src, f"stopped because party {origin} failed: {error}", (origin, error))
            if 0 <= origin < len(self._next_seq):
                self.fail(origin, f"failed: {error} (reported by party {src})", (origin, error))

    def closed(self, src: int) -> None:
        """`src` closed its stream: every message it sent is here, no other will come.

        Leaving is not a failure (failure() stays None); a wait for one more message from it
        fails at once, and that is this party's own error (origin())."""
        with self._cond:
            self._closed.add(src)
            self._cond.notify_all()

    def failure(self, src: int) -> str | None:
        """Why `src` is known to be unusable, or None."""
        with self._cond:
            return self._failed.get(src)

    def origin(self, src: int) -> tuple[int, str] | None:
        """(rank, short cause) of the failure that made `src` unusable, or None."""
        with self._cond:
            if src not in self._origin and src in self._closed:
                return (self.rank, "CommunicationError")
            return self._origin.get(src)

    def first_failure(self) -> tuple[int, str] | None:
        """(rank, short cause) of the first peer failure this party saw, or None."""
        with self._cond:
            return next(iter(self._origin.values()), None)

    def ready(self, src: int) -> bool:
        """Whether take(src) would return or raise at once (its message is here, or `src` is
        known to have failed or closed)."""
        with self._cond:
            return ((src, self._next_seq[src]) in self._messages or src in self._failed
                    or src in self._closed)

    def take(self, src: int) -> torch.Tensor:
        """Next message from `src`; raises CommunicationError on a dead peer or at the deadline."""
        deadline = time.monotonic() + self.timeout
        with self._cond:
            key = (src, self._next_seq[src])
            while key not in self._messages:
                if src in self._failed:
                    reason = self._failed[src]
                    if reason.startswith(("failed: ", "stopped because")):
                        origin = self._origin[src][0]
                        raise CommunicationError(f"party {self.rank}: party {src} {reason}; see "
                                                 f"party {origin}'s output for the cause", peer=src)
                    raise CommunicationError(
                        f"party {self.rank}: party {src} is unreachable ({reason}); "
                        "check that process and its logs", peer=src)
                if src in self._closed:
                    raise CommunicationError(
                        f"party {self.rank}: party {src} closed its session (it finished or "
                        "exited) before sending this message; see its output", peer=src)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise CommunicationError(
                        f"party {self.rank}: no message from party {src} within {self.timeout:g} s "
                        "(CRYPTEN_LITE_TIMEOUT); the peer is slow, stuck or running a different "
                        "program", peer=src)
                self._cond.wait(min(remaining, 1.0))
            self._next_seq[src] += 1
            return self._messages.pop(key)
