"""Dynamic batching agreed by every party: the leader (party 0) decides, everyone follows.

Each tick, every party announces to the leader the requests it newly holds shares for
(key = authenticated client id + request id, the shape the client announced, the time left)
and those whose client went away; the leader keeps one entry per key and decides:

* a request every party holds, with the same shape everywhere, is *ready*; ready requests
  form one batch (oldest first, at most `max_batch` samples) once `max_batch` samples are
  ready, the oldest has waited `max_wait` seconds, or (with `gap`) no new request came for
  `gap` seconds;
* a request whose parties announced different shapes fails, for that client only;
* a request not held by every party before its deadline fails (deadline);
* a request whose client went away at any party is dropped.

The decision travels back to every party in the same tick (crypten_lite.serve.server). Only
public metadata is announced: keys, shapes and times, never a share.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import torch

# Bytes of one announcement or decision a party accepts (a tick's metadata is far smaller).
MAX_CONTROL_BYTES = 8 << 20


def pack(obj) -> torch.Tensor:
    """A JSON object as a uint8 tensor (control messages between the parties; no pickle)."""
    data = json.dumps(obj, separators=(",", ":")).encode()
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)


def unpack(t: torch.Tensor) -> dict:
    """The JSON object of a control message (refuses an oversized or malformed one)."""
    if t.dtype != torch.uint8 or t.dim() != 1 or t.numel() > MAX_CONTROL_BYTES:
        raise ValueError("malformed control message between the serving parties")
    obj = json.loads(bytes(t.numpy()).decode())
    if not isinstance(obj, dict):
        raise ValueError("malformed control message between the serving parties")
    return obj


def bucket(n: int, max_batch: int) -> int:
    """The batch size `n` samples run at: the next power of two up to 8, then the next
    multiple of 8, at most max(max_batch, n). Few sizes, so that the plan of each (its public
    correlation requests, mpc.offline) is recorded once and prefetched for every later batch;
    at most 1/8 of a batch above 8 samples is padding."""
    if n < 1:
        raise ValueError(f"a batch of {n} samples")
    size = 1 << (n - 1).bit_length() if n <= 8 else -(-n // 8) * 8
    return min(size, max(max_batch, n))


@dataclass
class _Entry:
    first: float
    deadline: float
    shapes: dict[int, tuple[int, ...]] = field(default_factory=dict)
    cancelled: bool = False


class Scheduler:
    """The leader's view of every party's pending requests (pure logic, no I/O)."""

    def __init__(self, world_size: int, max_batch: int, max_wait: float, gap: float | None = None):
        self.world_size = world_size
        self.max_batch = max_batch
        self.max_wait = max_wait
        # With `gap`, a batch also closes once no party announced a new share for `gap`
        # seconds (the burst of concurrent clients is in): full batches under load without
        # holding a lone request for max_wait.
        self.gap = gap
        self.last_new = float("-inf")
        self.entries: dict[str, _Entry] = {}

    def announce(self, party: int, new: list, cancel: list, now: float | None = None) -> None:
        """Party `party`'s announcement: new [key, shape, seconds left] and cancelled keys."""
        now = time.monotonic() if now is None else now
        for key, shape, left in new:
            e = self.entries.get(key)
            if e is None:
                e = self.entries[key] = _Entry(now, now + float(left))
            self.last_new = now  # a share came in
            e.deadline = min(e.deadline, now + float(left))
            e.shapes[party] = tuple(int(d) for d in shape)
        for key in cancel:
            if key in self.entries:
                self.entries[key].cancelled = True

    def decide(self, now: float | None = None) -> tuple[list[str], list[tuple[str, str, str]]]:
        """(keys of the batch to run now, possibly empty; [(key, error kind, message)])."""
        now = time.monotonic() if now is None else now
        fails, ready = [], []
        for key, e in list(self.entries.items()):
            if e.cancelled:
                fails.append((key, "cancelled", "the client cancelled the request"))
            elif len(e.shapes) == self.world_size and len(set(e.shapes.values())) > 1:
                seen = ", ".join(f"party {p}: {s}" for p, s in sorted(e.shapes.items()))
                fails.append((key, "invalid", f"the parties received shares of different shapes "
                                              f"({seen}): send every party the same shape"))
            elif now > e.deadline:
                held = sorted(e.shapes)
                why = ("its deadline passed before a batch could run it" if len(held) == self.world_size
                       else f"only parties {held} of {self.world_size} received its shares before "
                            "its deadline: send one share to every party")
                fails.append((key, "deadline", f"request not computed: {why}"))
            elif len(e.shapes) == self.world_size:
                ready.append((e.first, key))
        for key, _, _ in fails:
            del self.entries[key]
        ready.sort()
        batch, samples = [], 0
        for _, key in ready:
            n = next(iter(self.entries[key].shapes.values()))[0]
            if samples + n > self.max_batch:
                break
            batch.append(key)
            samples += n
        quiet = self.gap is not None and now - self.last_new >= self.gap
        if batch and (samples >= self.max_batch or now - ready[0][0] >= self.max_wait
                      or len(batch) < len(ready) or quiet):
            for key in batch:
                del self.entries[key]
            return batch, fails
        return [], fails
