"""In-process transport: parties are threads sharing mailboxes.

It serves quick checks of protocol math without sockets (protocol tests must also run over
gRPC, tests/protocol) and the session of one party that init() gives outside a launch
(session.init_single_process: one mailbox, no peers).
"""

from __future__ import annotations

import threading

import torch

from .communicator import Communicator, tag_of, with_tag
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
        copy = tensor.clone()
        tag = tag_of(tensor)  # the header's tag travels with the copy, as over gRPC
        self.mailboxes[dst].put(src, seq, with_tag(copy, tag) if tag else copy)


class InProcessCommunicator(Communicator):
    """Communicator of one thread-party attached to an InProcessHub."""

    def __init__(self, hub: InProcessHub, rank: int):
        super().__init__(rank, hub.world_size)
        self.hub = hub

    def _send(self, tensor: torch.Tensor, dst: int) -> None:
        self.hub.deliver(self.rank, dst, tensor)

    def _recv(self, src: int) -> torch.Tensor:
        return self.hub.mailboxes[self.rank].take(src)
