"""In-process transport for fast unit tests: parties are threads sharing mailboxes.

Protocol tests must also run over gRPC (tests/protocol); this one exists for quick checks
of protocol math without sockets.
"""

from __future__ import annotations

import threading

import torch

from .communicator import Communicator
from .mailbox import Mailbox


class InProcessHub:
    """The shared mailboxes of one simulated session."""

    def __init__(self, world_size: int, timeout: float = 30.0):
        self.world_size = world_size
        self.mailboxes = [Mailbox(r, world_size, timeout) for r in range(world_size)]
        self._seq = [[0] * world_size for _ in range(world_size)]
        self._lock = threading.Lock()

    def deliver(self, src: int, dst: int, tensor: torch.Tensor) -> None:
        with self._lock:
            seq = self._seq[src][dst]
            self._seq[src][dst] += 1
        self.mailboxes[dst].put(src, seq, tensor.clone())


class InProcessCommunicator(Communicator):
    """Communicator of one thread-party attached to an InProcessHub."""

    def __init__(self, hub: InProcessHub, rank: int):
        super().__init__(rank, hub.world_size)
        self.hub = hub

    def _send(self, tensor: torch.Tensor, dst: int) -> None:
        self.hub.deliver(self.rank, dst, tensor)

    def _recv(self, src: int) -> torch.Tensor:
        return self.hub.mailboxes[self.rank].take(src)
