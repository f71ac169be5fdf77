"""Streamed prefetch: the dealer prepares a whole plan's corrections, rank 0 pulls them in chunks.

An offline phase (crypten_lite.mpc.offline.prefetch) asks for every correction of the next
run at once. As one reply they would all sit in rank 0's memory for the whole run (1.6 GB for
BERT-base at sequence 128, twice while decoded), and no plan could exceed one gRPC message
(2 GiB). Instead (the dealer's checks are those of ``Correlations``, comm/dealer_rpc.py):

1. ``Prepare`` (offline): rank 0 sends the plan's authenticated batch. The dealer checks every
   request, claims every counter in its ledger (each is answered once), cuts the batch into
   chunks of whole requests of at most CHUNK_BYTES (and the session's max_message_bytes) of
   answers (`chunk_counts`; a larger request alone), the first ones small (chunk k at most
   FIRST_CHUNK_REQUESTS * 2**k requests), computes chunk 0 only, and answers with the number
   of requests of each chunk and chunk 0 itself (handed out there, never pulled: the offline
   phase is one exchange with the dealer, and it waits only for the plan's first requests).
   Every later chunk is computed when rank 0 pulls it, while the parties run: the offline
   phase and the run overlap (issue 32).
2. ``Pull`` (online, in the background): rank 0 asks for chunk i of the batch prepared at
   counter ``start``, with an HMAC under its request MAC key over (session, start, i)
   (`pull_mac`). The dealer hands each chunk out once and forgets it; a second pull of a chunk,
   a pull of a batch that a newer ``Prepare`` superseded, or a pull with another MAC is refused.
3. Rank 0 (`ChunkPuller`) keeps PULL_AHEAD chunks in flight ahead of the chunk in use and
   drops each request's answer when it is handed out: its memory for corrections is about
   (PULL_AHEAD + 1) * CHUNK_BYTES whatever the model's size, and so is each message.

Rounds and bytes between the parties are unchanged: only where rank 0's corrections wait
(at the dealer instead of in rank 0's memory) changes.
"""

from __future__ import annotations

import bisect
import hashlib
import hmac
import threading
from typing import Callable, Sequence

import torch

from .._proto import crypten_lite_pb2 as pb
from ..errors import CommunicationError, ProtocolError
from ..random import canonical

# Answer bytes per chunk (a request larger than this is a chunk of its own).
CHUNK_BYTES = 8 << 20
# Chunks rank 0 requests ahead of the one in use.
PULL_AHEAD = 2
# Requests of a prepared batch's chunk 0, the only one the dealer computes before it answers
# Prepare; chunk k holds at most FIRST_CHUNK_REQUESTS * 2**k (and CHUNK_BYTES of answers), so
# that the offline phase waits for the plan's first requests only and each later chunk is
# computed, pulled ahead, while the run uses the one before. LeNet b1's 36 requests: chunks
# of 4, 8, 16 and 8 (the dealer's CPU per request is mostly per-request work at that size).
FIRST_CHUNK_REQUESTS = 4


def chunk_counts(sizes: Sequence[int], chunk_bytes: int = CHUNK_BYTES,
                 first: int | None = None) -> list[int]:
    """Cut requests with answers of `sizes` bytes, in order, into chunks of whole requests of
    at most `chunk_bytes` (a larger request alone); the number of requests of each chunk.
    `first`: chunk k also holds at most first * 2**k requests (None: no such limit)."""
    counts: list[int] = []
    n = total = 0
    most = first if first is not None and first > 0 else None
    for size in sizes:
        if n and (total + size > chunk_bytes or (most is not None and n >= most)):
            counts.append(n)
            n = total = 0
            if most is not None:
                most *= 2
        n += 1
        total += size
    if n:
        counts.append(n)
    return counts


def pull_mac(key: bytes, session: str, start: int, chunk: int) -> bytes:
    """HMAC-SHA256 of one pull under rank 0's request MAC key."""
    return hmac.new(key, canonical("dealer-pull/v1", session, start, chunk), hashlib.sha256).digest()


class PreparedBatch:
    """The dealer's side: a prepared batch's chunks, computed ahead or when pulled, each
    handed out once. `compute(requests)` gives the reply answering a chunk's requests."""

    def __init__(self, start: int, requests: Sequence, counts: Sequence[int], sizes: Sequence[int],
                 compute: Callable[[Sequence], pb.CorrelationReply]):
        self.start = start
        self.counts = list(counts)
        self._offsets = [0]
        for n in self.counts:
            self._offsets.append(self._offsets[-1] + n)
        self._requests = list(requests)
        self._bytes = [sum(sizes[a:b]) for a, b in zip(self._offsets, self._offsets[1:])]
        self._compute = compute
        self._ready: dict[int, pb.CorrelationReply] = {}
        self._delivered: set[int] = set()
        self._lock = threading.Lock()
        self.held = 0  # answer bytes computed and not yet delivered

    def _chunk(self, i: int) -> pb.CorrelationReply:
        reply = self._compute(self._requests[self._offsets[i]:self._offsets[i + 1]])
        self._requests[self._offsets[i]:self._offsets[i + 1]] = [None] * self.counts[i]
        return reply

    def compute_ahead(self, budget: int) -> None:
        """Compute chunks in order while the held bytes stay within `budget` (at least one)."""
        for i in range(len(self.counts)):
            if i in self._ready or i in self._delivered:
                continue
            if self._ready and self.held + self._bytes[i] > budget:
                return
            self._ready[i] = self._chunk(i)
            self.held += self._bytes[i]

    def take(self, i: int) -> pb.CorrelationReply:
        """Chunk i's reply, once (ProtocolError for a chunk out of range or delivered)."""
        with self._lock:
            if not 0 <= i < len(self.counts):
                raise ProtocolError(f"chunk {i} of the batch prepared at counter {self.start} does "
                                    f"not exist (it has {len(self.counts)})")
            if i in self._delivered:
                raise ProtocolError(f"chunk {i} of the batch prepared at counter {self.start} was "
                                    "already delivered; the dealer hands each chunk out once")
            self._delivered.add(i)
            reply = self._ready.pop(i, None)
            if reply is not None:
                self.held -= self._bytes[i]
        return reply if reply is not None else self._chunk(i)


class ChunkPuller:
    """Rank 0's side: the answers of a prepared batch, by request index, pulled ahead.

    `pull(chunk)` sends one Pull and returns a function waiting for its answers (one list of
    tensors per request of the chunk). Answers are handed out once, in any order. `first`:
    chunk 0's answers, already received (with the dealer's Prepare reply): never pulled."""

    def __init__(self, counts: Sequence[int], pull: Callable[[int], Callable[[], list[list[torch.Tensor]]]],
                 ahead: int | None = None, first: list[list[torch.Tensor]] | None = None):
        self._offsets = [0]
        for n in counts:
            self._offsets.append(self._offsets[-1] + n)
        self._pull = pull
        self._ahead = max(1, PULL_AHEAD if ahead is None else ahead)
        self._pending: dict[int, Callable[[], list[list[torch.Tensor]]]] = {}  # chunk -> answers
        self._answers: dict[int, list[torch.Tensor]] = {}                     # request -> answer
        self._issued = 0   # chunks [0, _issued) have been pulled
        self._closed = False
        self._lock = threading.Lock()
        if first is not None and self.chunks:
            self._pending[0] = lambda: first
            self._issued = 1

    @property
    def chunks(self) -> int:
        return len(self._offsets) - 1

    def _issue(self, through: int) -> None:
        while self._issued <= min(through, self.chunks - 1):
            self._pending[self._issued] = self._pull(self._issued)
            self._issued += 1

    def _receive(self, chunk: int) -> None:
        answers = self._pending.pop(chunk)()
        first = self._offsets[chunk]
        if len(answers) != self._offsets[chunk + 1] - first:
            raise CommunicationError(f"the dealer's chunk {chunk} does not match the prepared batch",
                                     peer="dealer")
        for j, answer in enumerate(answers):
            self._answers[first + j] = answer

    def start(self) -> None:
        """Pull the first chunks and wait for the first one (end of the offline phase)."""
        with self._lock:
            self._issue(self._ahead - 1)
            if self.chunks:
                self._receive(0)

    def answer(self, index: int) -> list[torch.Tensor]:
        """The answer of request `index` of the batch (waits for its chunk), handed out once."""
        with self._lock:
            if self._closed:
                raise ProtocolError("the prefetched corrections were dropped (the run left the "
                                    "plan, or a new prefetch replaced it)")
            if index not in self._answers:
                chunk = bisect.bisect_right(self._offsets, index) - 1
                if not 0 <= chunk < self.chunks or (chunk < self._issued and chunk not in self._pending):
                    raise ProtocolError(f"prefetched request {index} was already handed out")
                self._issue(chunk)
                self._receive(chunk)
                self._issue(chunk + self._ahead)
            return self._answers.pop(index)

    def close(self) -> None:
        """Drop every answer not yet handed out (nothing more is pulled)."""
        with self._lock:
            self._closed = True
            self._answers.clear()
            self._pending.clear()

    def held(self) -> int:
        """Received answers not yet handed out (requests)."""
        return len(self._answers)
