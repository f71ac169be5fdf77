"""Two protocols in the same rounds: a side protocol whose openings ride in the messages of
a main protocol's rounds.

A round is one message to every peer and one from each (``Communicator.all_gather``); two
independent computations whose rounds overlap need not pay for both. A *protocol in rounds*
is a generator: it yields the flat int64 message it sends next and receives every party's
message of that round (rank order), which it combines itself (a sum for an arithmetic
opening, an XOR for a binary one: ``opened_sums`` / ``opened_xors``)::

    def side():
        parts = yield torch.cat([(x - a).reshape(-1), (y - b).reshape(-1)])
        e, d = split(opened_sums(parts), [x, y])      # one round: two openings
        ...
        return result

``drive(side())`` runs it alone, one all_gather per message. ``alongside(main, side())``
runs ``main`` (ordinary direct-style protocol code, e.g. a comparison circuit) and, at each
of main's all_gather rounds, appends the side protocol's pending message to the same
message; the rounds main does not have for it, the side protocol pays after main returns.
Every party runs the same program, so the messages line up (a round whose sizes differ
between parties raises ProtocolError). Under rss a protocol in rounds yields requests
({dst: words}, {src: numel}) instead (rss_binary's form: a round there is messages to some
peers, not an all_gather), and rides in the rounds of the binary protocols that
rss_binary._run drives (the comparison circuits); the same functions (fast.products_gen,
protocol.truncate_many_gen, protocol.finish_gen) yield the form of the session's protocol. The side protocol's correlations are requested when it is advanced,
inside main's rounds: the order is the same on every party, so a prefetched plan records it
like any other.
"""

from __future__ import annotations

from typing import Callable, Generator, Sequence, TypeVar

import torch

from ..comm.communicator import shape_tag, tag_of, with_tag
from ..errors import ProtocolError
from ..session import current

T = TypeVar("T")
R = TypeVar("R")
SideProtocol = Generator[Sequence[torch.Tensor], list, R]


def opened_sums(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """The arithmetic opening of a round's messages: their sum."""
    out = parts[0].clone()
    for p in parts[1:]:
        out += p
    return out


def opened_xors(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """The binary opening of a round's messages: their XOR."""
    out = parts[0].clone()
    for p in parts[1:]:
        out ^= p
    return out


def split(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """flat cut into tensors of the shapes of `like`, in order."""
    out, off = [], 0
    for t in like:
        out.append(flat[off:off + t.numel()].view(t.shape))
        off += t.numel()
    return out


def drive(gen: SideProtocol) -> R:
    """Run a protocol in rounds on its own: one all_gather per message it yields (under rss:
    one exchange per request, rss_binary._run)."""
    if current().config.protocol == "rss":
        from . import rss_binary
        return rss_binary._run(gen)
    return _Rider(gen, None).finish()


class _Rider:
    """A protocol in rounds riding on the communicator's all_gather rounds (comm.rider)."""

    def __init__(self, gen: SideProtocol, prev: "_Rider | None"):
        self.gen, self.prev = gen, prev
        self.message: torch.Tensor | None = None
        self.parts: list | None = None
        self.started = self.done = False
        self.value = None

    def _advance(self) -> None:
        try:
            if not self.started:
                self.started = True
                self.message = next(self.gen)
            else:
                parts, self.parts = self.parts, None
                self.message = self.gen.send(parts)
        except StopIteration as stop:
            self.done, self.value, self.message = True, stop.value, None

    def _pending(self) -> torch.Tensor | None:
        if self.message is None and not self.done:
            self._advance()
        return None if self.done else self.message

    def ride(self, tensor: torch.Tensor, gather: Callable) -> list[torch.Tensor]:
        """all_gather of `tensor` with this side protocol's pending message in it."""
        inner = self.prev.ride if self.prev is not None else (lambda t, g: g(t))
        extra = self._pending()
        if extra is None:
            return inner(tensor, gather)
        flat = tensor.reshape(-1)
        tag, extra_tag = tag_of(tensor), tag_of(extra)
        payload = torch.cat([flat, extra])
        if tag or extra_tag:  # both messages' shape digests travel in the merged header
            payload = with_tag(payload, shape_tag([(len(tag),), tuple(tag), tuple(extra_tag)]))
        parts = inner(payload, gather)
        n = flat.numel()
        for r, part in enumerate(parts):
            if part.shape != payload.shape or tag_of(part) != tag_of(payload):
                raise ProtocolError(
                    f"party {current().rank}: a round carrying {payload.numel()} values here got "
                    f"{part.numel()} from party {r}, or values of other shapes (the digest in "
                    "its header differs); the parties' programs diverged")
        # Every party's digests equal this party's (checked): each part carries them.
        self.parts = [with_tag(part[n:], extra_tag) if extra_tag else part[n:] for part in parts]
        self.message = None
        return [with_tag(part[:n].view(tensor.shape), tag) if tag else part[:n].view(tensor.shape)
                for part in parts]

    def finish(self):
        """Run what is left of the side protocol in rounds of its own; its return value."""
        comm = current().comm
        while True:
            if self.message is None and not self.done:
                self._advance()
            if self.done:
                return self.value
            self.parts = comm.all_gather(self.message)
            self.message = None


def alongside(main: Callable[[], T], side: SideProtocol) -> tuple[T, R]:
    """(main(), the side protocol's result), the side protocol's openings riding in main's
    rounds (under rss: its requests riding in the rounds of the protocols main drives
    through rss_binary._run, rss_binary._Rider)."""
    s = current()
    if s.config.protocol == "rss":   # its rider rides in rss_binary._run's exchanges
        from .rss_binary import _Rider as rider_class
        attr = "rss_rider"
    else:
        rider_class, attr = _Rider, "rider"
    comm = s.comm
    rider = rider_class(side, getattr(comm, attr, None))
    setattr(comm, attr, rider)
    try:
        out = main()
    finally:
        setattr(comm, attr, rider.prev)
    return out, rider.finish()
