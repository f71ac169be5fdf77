"""The Communicator interface: point-to-point and collective operations on tensors.

Every protocol talks to its peers only through this interface, which also keeps the exact
statistics the tests assert: `rounds` (one per collective or send; a protocol that opens
several values at once must pack them in one call), `bytes_sent` / `bytes_received` (tensor
payload only), `messages` (sent), and `seconds` spent inside communication calls.

Every sending call (send, exchange, broadcast, all_gather, gather, all_reduce, barrier) has
copy-on-send semantics: the peer receives the tensor as it was when the call was made, so the
caller may modify it in place as soon as the call returns (tests/integration/test_copy_on_send.py).
"""

from __future__ import annotations

import abc
import hashlib
import time
from typing import Sequence

import torch

from ..errors import CommunicationError, ProtocolError
from ..random import canonical

REDUCE_OPS = {
    "sum": lambda a, b: a + b,
    "xor": lambda a, b: a ^ b,
}


# A message may carry a tag: a digest of the logical shapes of the values it carries (an
# opening of several values travels flat, so its header's shape says only their total size).
# It travels in the message header (grpc: Frame.tag), not counted as payload, and the receiver
# compares it with its own (mpc.primitives.check_agree, mpc.rss._check).
MAX_TAG_BYTES = 32
_TAG_ATTR = "_crypten_lite_shape_tag"


# The tag of a side channel's error notice (provider pairwise's ERROR frame). It may reach a
# peer that has already left its exchange (the exchange's last message was the one found
# tampered), so whatever that peer reads next from the sender may be the online protocol's
# receive: there it is a ProtocolError (_timed_recv), never a share. Only error notices
# carry it: no other message's bytes change.
OFFLINE_ERROR_TAG = b"crypten_lite/offline-error"


def offline_error(rank: int, src: int) -> ProtocolError:
    """What a party reads where its peer's ERROR notice (OFFLINE_ERROR_TAG) meets an online
    receive: the peer's offline exchange failed, not a share or a diverged program."""
    return ProtocolError(f"party {rank}: party {src} stopped its offline exchange with an error "
                         "after this party had finished it (the exchange's last message was "
                         f"refused there); see party {src}'s output")


def shape_tag(shapes) -> bytes:
    """16-byte digest of a list of shapes (each of any rank; their order and ranks count)."""
    return hashlib.sha256(canonical("crypten-lite/shapes/v1",
                                    [tuple(int(d) for d in s) for s in shapes])).digest()[:16]


def with_tag(tensor: torch.Tensor, tag: bytes) -> torch.Tensor:
    """`tensor` (a new tensor object sharing its memory: the caller's is left untagged) whose
    message carries `tag` in its header."""
    if len(tag) > MAX_TAG_BYTES:
        raise CommunicationError(f"a message tag has at most {MAX_TAG_BYTES} bytes, got {len(tag)}")
    out = tensor.detach()
    setattr(out, _TAG_ATTR, bytes(tag))
    return out


def tag_received(tensor: torch.Tensor, tag: bytes) -> torch.Tensor:
    """`tensor` itself, carrying `tag`: for a tensor a transport has just made from a received
    message (nothing else holds it), where with_tag's new tensor object would only cost time.
    `tag` is bytes of at most MAX_TAG_BYTES (the transport checked the header)."""
    setattr(tensor, _TAG_ATTR, tag)
    return tensor


def tag_of(tensor: torch.Tensor) -> bytes:
    """The tag `tensor`'s message carries (b"" if none)."""
    return getattr(tensor, _TAG_ATTR, b"")


def payload_bytes(tensor: torch.Tensor) -> int:
    """Bytes a tensor occupies on the wire (raw elements, no framing)."""
    return tensor.numel() * tensor.element_size()


class Communicator(abc.ABC):
    """Messages between the `world_size` parties of one session; subclasses move the bytes."""

    rank: int
    world_size: int
    # A side protocol whose int64 openings ride in all_gather's messages (mpc.parallel).
    rider = None
    rss_rider = None  # mpc.rss_binary's side protocol riding in its rounds (alongside)

    def __init__(self, rank: int, world_size: int):
        self.rank = rank
        self.world_size = world_size
        self.reset_communication_stats()

    # -- transport primitives, implemented by subclasses ---------------------------------
    @abc.abstractmethod
    def _send(self, tensor: torch.Tensor, dst: int) -> None:
        """Queue a snapshot of `tensor` for party `dst` (must not block on the receiver, and
        must not keep a view of the tensor's memory: copy-on-send, see the module docstring)."""

    @abc.abstractmethod
    def _recv(self, src: int) -> torch.Tensor:
        """Next message from `src`, waiting at most the configured timeout."""

    def close(self) -> None:
        """Release the transport (idempotent)."""

    def abort(self, origin: int, error: str) -> None:
        """Tell every peer that party `origin` failed with `error` (an exception type name,
        never a message), so that their waits on this party fail at once (transports that
        can; the default does nothing)."""

    def peer_failure(self, peer: int) -> tuple[int, str] | None:
        """(rank, short cause) of the failure known to have made `peer` unusable, or None."""
        return None

    # -- statistics ------------------------------------------------------------------------
    def get_communication_stats(self) -> dict[str, float]:
        """Counters since the last reset: rounds, bytes_sent, bytes_received, messages, seconds."""
        return dict(self._stats)

    def reset_communication_stats(self) -> None:
        """Set every counter to zero."""
        self._stats = {"rounds": 0, "bytes_sent": 0, "bytes_received": 0, "messages": 0,
                       "seconds": 0.0}

    def _count_send(self, tensor: torch.Tensor) -> None:
        if getattr(tensor, "is_replicated_share", False):
            # A replicated share is two components; a protocol sends one of them by name.
            raise CommunicationError(f"party {self.rank}: a replicated share cannot be sent as "
                                     "one tensor; send its component .a or .b")
        self._stats["bytes_sent"] += payload_bytes(tensor)
        self._stats["messages"] += 1

    def _timed_recv(self, src: int) -> torch.Tensor:
        start = time.perf_counter()
        try:
            tensor = self._recv(src)
        finally:
            self._stats["seconds"] += time.perf_counter() - start
        self._stats["bytes_received"] += payload_bytes(tensor)
        if getattr(tensor, _TAG_ATTR, None) == OFFLINE_ERROR_TAG:
            raise offline_error(self.rank, src)
        return tensor

    def _check_peer(self, peer: int, what: str) -> None:
        if not isinstance(peer, int) or not 0 <= peer < self.world_size or peer == self.rank:
            raise CommunicationError(
                f"party {self.rank}: {what} {peer} is not another party of world_size "
                f"{self.world_size}", peer=peer)

    # -- public API ---------------------------------------------------------------------
    def send(self, tensor: torch.Tensor, dst: int) -> None:
        """Send `tensor` to party `dst` (one round)."""
        self._check_peer(dst, "destination")
        self._stats["rounds"] += 1
        self._count_send(tensor)
        self._send(tensor, dst)

    def recv(self, src: int) -> torch.Tensor:
        """Receive the next tensor sent by party `src`."""
        self._check_peer(src, "source")
        return self._timed_recv(src)

    def exchange(self, outgoing: dict[int, torch.Tensor], sources: Sequence[int],
                 rounds: int = 1) -> dict[int, torch.Tensor]:
        """Send each `outgoing[dst]` and receive one tensor from each of `sources`: one round.

        `rounds=0` is for one-way announcements that carry only public metadata (an input's
        shape): counted in bytes and messages, not as a protocol round."""
        self._stats["rounds"] += rounds
        for dst, tensor in outgoing.items():
            self._check_peer(dst, "destination")
            self._count_send(tensor)
            self._send(tensor, dst)
        return {src: self._timed_recv(src) for src in sources}

    def peers(self) -> list[int]:
        """Ranks of every other party."""
        return [r for r in range(self.world_size) if r != self.rank]

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every party's tensor, in rank order (one round). While a side protocol rides
        (mpc.parallel.alongside), its pending opening travels in the same int64 message."""
        if self.rider is not None and tensor.dtype == torch.int64:
            return self.rider.ride(tensor, self._all_gather)
        return self._all_gather(tensor)

    def _all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        got = self.exchange({p: tensor for p in self.peers()}, self.peers())
        got[self.rank] = tensor
        return [got[r] for r in range(self.world_size)]

    def sum_streamed(self, shape, tag: bytes, fill, on_range=None, mismatch=None) -> torch.Tensor | None:
        """The sum over every party of an int64 tensor of `shape`, each party's values written
        by `fill(start, end, out)` (its flat elements [start, end) into `out`), its message
        carrying `tag`: one round, the same message, bytes and counts as all_gather then a
        sum, but a transport that streams writes the values straight into its frames and
        sums the peers' chunks as they arrive, calling `on_range(start, end, total)` on each
        range of the flat total as soon as it is summed (the caller's work overlaps the rest
        of the wire). A peer whose message has another shape, dtype or tag raises
        `mismatch(peer, shape, dtype_name, tag)` once its message is in.

        Returns None where this transport does not stream (the default, and for small
        messages): nothing was sent or counted, and the caller opens the usual way."""
        return None

    def gather(self, tensor: torch.Tensor, dst: int) -> list[torch.Tensor] | None:
        """Every party's tensor at `dst` (rank order), None elsewhere (one round)."""
        if self.rank == dst:
            got = self.exchange({}, self.peers())
            got[self.rank] = tensor
            return [got[r] for r in range(self.world_size)]
        self.exchange({dst: tensor}, [])
        return None

    def broadcast(self, tensor: torch.Tensor | None, src: int, rounds: int = 1) -> torch.Tensor:
        """`src`'s tensor at every party (one round)."""
        if self.rank == src:
            if tensor is None:
                raise CommunicationError(f"party {self.rank}: broadcast source has no tensor")
            self.exchange({p: tensor for p in self.peers()}, [], rounds)
            return tensor
        return self.exchange({}, [src], rounds)[src]

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Sum (or xor) of every party's tensor, at every party (one round)."""
        if op not in REDUCE_OPS:
            raise ValueError(f"all_reduce op must be one of {sorted(REDUCE_OPS)}, got {op!r}")
        parts = self.all_gather(tensor)
        out = parts[0].clone()
        for part in parts[1:]:
            out = REDUCE_OPS[op](out, part)
        return out

    def barrier(self) -> None:
        """Wait until every party reaches this point (one round, one byte each)."""
        self.all_gather(torch.zeros(1, dtype=torch.uint8))
