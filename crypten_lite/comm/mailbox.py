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

    def fail(self, src: int | str, reason: str) -> None:
        """Record that `src` is gone (or every peer, with src='*'); wakes every waiter."""
        with self._cond:
            targets = range(len(self._next_seq)) if src == "*" else [src]
            for peer in targets:
                if peer != self.rank:
                    self._failed.setdefault(peer, reason)
            self._cond.notify_all()

    def failure(self, src: int) -> str | None:
        """Why `src` is known to be unusable, or None."""
        with self._cond:
            return self._failed.get(src)

    def take(self, src: int) -> torch.Tensor:
        """Next message from `src`; raises CommunicationError on a dead peer or at the deadline."""
        deadline = time.monotonic() + self.timeout
        with self._cond:
            key = (src, self._next_seq[src])
            while key not in self._messages:
                if src in self._failed:
                    raise CommunicationError(
                        f"party {self.rank}: party {src} is unreachable ({self._failed[src]}); "
                        "check that process and its logs", peer=src)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise CommunicationError(
                        f"party {self.rank}: no message from party {src} within {self.timeout:g} s "
                        "(CRYPTEN_LITE_TIMEOUT); the peer is slow, stuck or running a different "
                        "program", peer=src)
                self._cond.wait(min(remaining, 1.0))
            self._next_seq[src] += 1
            return self._messages.pop(key)
