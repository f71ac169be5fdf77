"""Providers of correlated randomness: the dealer service (default) and TFP (insecure, tests).

A provider hands each protocol its share of a correlated value. Both providers use the same
seeded derivation (`correlations.py`): a party derives its share from its seed with the dealer
and only rank 0 receives a correcting share. With the dealer, that correction comes over gRPC
and is requested as early as possible, so that it arrives while the parties are still
exchanging the masked operands; with TFP, rank 0 computes it from seeds everybody can derive.
An offline phase's corrections are prepared by the dealer and pulled in chunks while the run
consumes them (comm/dealer_prefetch.py): rank 0 holds a few chunks, not the whole plan's.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import threading
from collections import OrderedDict
from typing import Callable

import numpy as np
import torch

from ..comm.dealer_prefetch import ChunkPuller
from ..comm.dealer_rpc import DealerClient, Request
from ..config import Config
from ..errors import CommunicationError, ProtocolError, UnsupportedError
from ..random import canonical, subkey
from . import correlations
from .correlations import CORRECTING_RANK

log = logging.getLogger("crypten_lite.provider")


class Correlation:
    """One correlated value: this party's seeded components, corrections fetched on demand.

    `shapes`: the components' shapes when the seeded ones are one keystream_parts call's
    parts in order and the corrections one answer's (as Provider.get makes them), so that
    rows() checks their memory at the ends only, for a span within one of the two (before
    `_cut`, or from it on); without shapes, or across the cut, it checks every part. (One
    attribute instead of the two, dropping the shapes when a correction shares the seeded
    parts' memory, costs a look at every correction: about 2 us a correlation.)"""

    def __init__(self, parts: list[torch.Tensor], fetch: Callable[[], list[torch.Tensor]] | None,
                 shapes: tuple | None = None):
        self._parts = parts
        self._fetch = fetch
        self._shapes = shapes
        self._cut = len(parts)  # components from here on are rank 0's corrections (one answer)

    def __getitem__(self, j: int) -> torch.Tensor:
        part = self._parts[j]
        if part is None:
            raise ProtocolError(f"component {j} of this correlated value is rank 0's correction: "
                                "read it through corrected()")
        return part

    def corrected(self) -> tuple[torch.Tensor, ...]:
        """All components, rank 0's correcting ones replaced (waits for the dealer once), as
        a tuple: the caller cannot change this correlation's components by changing it."""
        if self._fetch is not None:
            fixes = self._fetch()
            self._fetch = None
            # Corrections replace the last components (c, or rt and msb), in order.
            self._cut = len(self._parts) - len(fixes)
            self._parts[self._cut:] = fixes
        if type(self._parts) is not tuple:   # complete from here on: kept as the tuple returned
            self._parts = tuple(self._parts)
        return self._parts

    def rows(self, start: int, count: int) -> np.ndarray | None:
        """Components start .. start + count - 1 (the corrected ones after corrected()) as
        ONE numpy [count, words] array on their memory, when they are consecutive 1-D parts of
        equal size of one tensor (a request's keystream, random.keystream_parts, or the
        dealer's joined corrections, _unjoin); else None. One conversion instead of one per
        component (a masked polynomial has up to 29)."""
        parts = self._parts[start:start + count]
        if self._shapes is None or start < self._cut < start + count:
            return consecutive_rows(parts)
        # parts of one split (the seeded ones' or the one answer's) in order, of the shapes
        # the request gives them: consecutive in one memory if the ends lie as they would
        words = _equal_words(self._shapes, start, count)
        if words is None or not parts or parts[0] is None or parts[-1] is None:
            return None
        return _rows_of(parts[0], parts[-1], count, words)


@functools.lru_cache(maxsize=1024)
def _equal_words(shapes: tuple, start: int, count: int) -> int | None:
    """The words of each of components start .. start + count - 1 if all are 1-D of one size."""
    chosen = shapes[start:start + count]
    if len(chosen) != count or any(len(shape) != 1 or shape != chosen[0] for shape in chosen):
        return None
    return chosen[0][0]


def _rows_of(first: torch.Tensor, last: torch.Tensor, count: int, words: int) -> np.ndarray | None:
    """The [count, words] numpy view from `first` to `last` in their common base's memory,
    if they lie there as consecutive parts of `words` words would; else None."""
    base = first._base
    # each end contiguous too: a strided view (base[0:8:2]) has the offsets of a part of
    # `words` words but not its memory
    if (base is None or last._base is not base or first.dim() != 1 or first.numel() != words
            or last.numel() != words or first.dtype != torch.int64 or not base.is_contiguous()
            or not first.is_contiguous() or not last.is_contiguous()):
        return None
    offset = first.storage_offset()
    if last.storage_offset() != offset + (count - 1) * words:
        return None
    offset -= base.storage_offset()
    return base.numpy().reshape(-1)[offset:offset + count * words].reshape(count, words)


def consecutive_rows(parts) -> np.ndarray | None:
    """`parts` (1-D int64 tensors) as one numpy [len(parts), words] view of their common
    memory if each is the next `words` words of the same contiguous tensor; else None.
    Checks every part (parts of unknown origin)."""
    if not parts or any(part is None for part in parts):
        return None
    base, words, start = parts[0]._base, parts[0].numel(), parts[0].storage_offset()
    if any(part._base is not base or part.dim() != 1 or part.numel() != words
           or part.storage_offset() != start + j * words or not part.is_contiguous()
           for j, part in enumerate(parts)):
        return None
    return _rows_of(parts[0], parts[-1], len(parts), words)


def _spec(kind: str, op: str, shapes, params) -> tuple:
    """A request's public description (kind, op, shapes, params) in one canonical form
    (memoised: a comparison's requests repeat a few shapes, and a masked polynomial's params
    are about 30 integers).

    The memo is keyed by canonical forms only (str, tuples of int: immutable), each stored
    under itself; a request equal to one of them (np.int64, True, torch.Size compare and hash
    as the ints) is that form. Never keyed by the caller's objects: a tensor hashes by identity
    and can change in place, so a cache keyed by it answered its old value."""
    try:
        hit = _SPECS.get((kind, op, tuple(shapes), tuple(params)))
    except TypeError:  # a shape given as a list: not hashable
        hit = None
    if hit is not None and type(kind) is str and type(op) is str:  # str(kind) is kind
        return hit
    spec = _spec_of(kind, op, shapes, params)
    if len(_SPECS) < _SPECS_MAX:
        _SPECS[spec] = spec
    return spec


_SPECS: dict = {}  # canonical spec -> itself (see _spec)
_SPECS_MAX = 4096


def _spec_of(kind: str, op: str, shapes, params) -> tuple:
    return (str(kind), str(op), tuple(tuple(int(s) for s in shape) for shape in shapes),
            tuple(int(p) for p in params))


@functools.lru_cache(maxsize=4096)
def _entry_encoding(entry: tuple) -> bytes:
    """canonical()'s encoding of one plan entry (kind, op, shapes, params) inside a sequence."""
    return canonical(entry)[5:]  # without the one-field tuple around it


def _relative(spec: tuple, index: dict[int, int]) -> tuple:
    """A recorded weight_triple whose mask was drawn in the same recording names the mask by
    its plan position (-1 - position), so that a replay with a freshly masked model (new mask
    counters) matches the plan; a mask drawn before the recording keeps its counter."""
    kind, op, shapes, params = spec
    if kind == "weight_triple" and params and params[0] in index:
        return (kind, op, shapes, (-1 - index[params[0]],) + params[1:])
    return spec


def _absolute(spec: tuple, start: int) -> tuple:
    """The inverse of _relative for a plan prefetched at counter `start`."""
    kind, op, shapes, params = spec
    if kind == "weight_triple" and params and params[0] < 0:
        return (kind, op, shapes, (start - 1 - params[0],) + params[1:])
    return spec


# Bytes of seeded components a party derives ahead in an offline phase (prefetch), for the
# plan's first requests: the run's keystream work moves offline, within a bounded memory.
DERIVE_AHEAD_BYTES = 32 << 20


class Provider:
    """Base provider: counters, seeded derivation and the offline plan; subclasses supply
    rank 0's corrections.

    Counters and the plan are kept identically by every party: requests and plans are public
    and every party makes the same ones in the same order, so a party never needs to tell
    another which counter comes next.
    """

    name = "provider"

    def __init__(self, config: Config, seed: bytes):
        self.rank = config.rank
        self.world_size = config.world_size
        self._key = subkey(seed, "correlations")
        self.counter = 0
        self.stats = {"requests": 0, "dealer_bytes": 0, "prefetched": 0, "diverged": 0}
        self._recording: list[tuple] | None = None
        # The prefetched range [plan_start, plan_start + len(plan)): the plan's specs, and on
        # rank 0 the (already requested) corrections of each counter not yet used.
        self._plan: list[tuple] = []
        self._plan_start = 0
        self._prefetched: dict[int, Callable[[], list[torch.Tensor]]] = {}
        self._stream: _Prefetch | None = None  # rank 0, dealer: the prefetched batch's pulls
        # This party's seeded components of the plan's first requests, derived in the offline
        # phase (at most DERIVE_AHEAD_BYTES): counter -> components, each used once.
        self._derived: dict[int, list] = {}

    def _corrections(self, request: Request) -> Callable[[], list[torch.Tensor]]:
        raise NotImplementedError

    def _batch_corrections(self, requests: list[Request]) -> list[Callable[[], list[torch.Tensor]]]:
        return [self._corrections(r) for r in requests]

    def _prefetch_corrections(self, requests: list[Request]) -> list[Callable[[], list[torch.Tensor]]]:
        """The corrections of an offline phase's batch (default: as one batch)."""
        return self._batch_corrections(requests)

    def _drop_prefetched(self) -> None:
        """Forget the prefetched corrections not used (and stop pulling them)."""
        self._prefetched = {}
        self._derived = {}
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def get(self, kind: str, shapes, op: str = "", params=()) -> Correlation:
        """This party's share of a fresh correlated value of `kind`."""
        spec = _spec(kind, op, shapes, params)
        _, _, shapes, params = spec
        request = Request(kind, self._next_counter(spec), op, shapes, params)
        self.stats["requests"] += 1
        if self._recording is not None:
            self._record_index[request.counter] = len(self._recording)
            self._recording.append(_relative(spec, self._record_index))
        fetch = None
        if self.rank == CORRECTING_RANK:
            fetch = self._prefetched.pop(request.counter, None)
            if fetch is not None:
                self.stats["prefetched"] += 1
            else:
                fetch = self._corrections(request)
        parts = self._derived.pop(request.counter, None)
        if parts is None:
            parts = self._derive(request.counter, kind, op, shapes, params)
        return Correlation(parts, fetch, correlations.request_shapes(kind, op, shapes, params))

    def _drawn(self, kind: str, op: str, shapes, params) -> tuple[int, int]:
        """(components of a request, how many of them this party draws): rank 0 never draws
        the ones the dealer's corrections replace (nor does the dealer, for rank 0)."""
        n = len(correlations.request_shapes(kind, op, shapes, params))
        if self.rank != CORRECTING_RANK:
            return n, n
        return n, n - correlations.correction_count(kind, params)

    def _derive(self, counter: int, kind: str, op: str, shapes, params) -> list:
        """This party's seeded components of request `counter` (None for the corrected ones)."""
        n, upto = self._drawn(kind, op, shapes, params)
        parts = correlations.derive(self._key, counter, kind, op, shapes, params, upto)
        return parts + [None] * (n - upto)

    def _derive_ahead(self) -> None:
        """Offline phase: derive the seeded components of the plan's first requests now (in
        plan order, up to DERIVE_AHEAD_BYTES), so that the run only takes them. Requests and
        counters are those the run makes (a run that leaves the plan drops them unused:
        _next_counter), and each is taken once, so every component is still used once."""
        budget = DERIVE_AHEAD_BYTES
        for i, (kind, op, shapes, params) in enumerate(self._plan):
            n, upto = self._drawn(kind, op, shapes, params)
            sizes = correlations.request_shapes(kind, op, shapes, params)[:upto]
            nbytes = 8 * sum(math.prod(shape) for shape in sizes)
            if nbytes > budget:
                return
            budget -= nbytes
            self._derived[self._plan_start + i] = self._derive(self._plan_start + i, kind, op, shapes, params)

    def _next_counter(self, spec: tuple) -> int:
        """The counter of the next request. Inside the prefetched range, a request that differs
        from the plan skips the rest of the range: its counters were answered for the plan's
        requests, and the dealer answers each counter only once (same decision on every party,
        since requests and plan are the same everywhere)."""
        k = self.counter
        end = self._plan_start + len(self._plan)
        if self._plan_start <= k < end and self._plan[k - self._plan_start] != spec:
            planned = self._plan[k - self._plan_start]
            log.info("request %d (%s/%s %s) differs from the prefetched plan (%s/%s %s): "
                     "continuing past the prefetched range at counter %d", k, spec[0],
                     spec[1] or "-", list(spec[2]), planned[0], planned[1] or "-",
                     list(planned[2]), end)
            self.stats["diverged"] += 1
            self._plan = []
            self._drop_prefetched()
            k = end
        self.counter = k + 1
        return k

    # -------------------------------------------------------------- offline phase
    def start_recording(self) -> None:
        """Record the specs (kind, op, shapes, params) of every request from now on."""
        self._recording = []
        self._record_index: dict[int, int] = {}

    def stop_recording(self) -> list[tuple]:
        plan, self._recording = self._recording or [], None
        return plan

    def prefetch(self, plan: list[tuple], announce: Callable[[bytes], None] | None = None) -> None:
        """Offline phase (every party, with the same plan): the next len(plan) counters are
        planned as `plan` (a recorded run of the same program); rank 0 asks the dealer now, in
        one batch, for their corrections. The range starts after any earlier prefetched range,
        whose unused counters were answered already and are never requested again.

        `announce(plan_digest())` is called once the plan is set and the dealer asked, before
        this party derives its seeded components (offline.prefetch sends the digest to the
        other parties there and checks theirs after deriving). This prefetch sends nothing to
        the other parties itself."""
        start = max(self.counter, self._plan_start + len(self._plan))
        self.counter = start
        self._plan = [_absolute(_spec(*entry), start) for entry in plan]
        self._plan_start = start
        self._drop_prefetched()
        if self.rank == CORRECTING_RANK and plan:
            # asked first: the dealer prepares the batch while this party derives its own
            # seeded components (_derive_ahead), instead of after
            requests = [Request(kind, start + i, op, shapes, params)
                        for i, (kind, op, shapes, params) in enumerate(self._plan)]
            self._prefetched = dict(zip((r.counter for r in requests), self._prefetch_corrections(requests)))
        if announce is not None:
            announce(self.plan_digest())
        self._derive_ahead()

    def plan_digest(self) -> bytes:
        """SHA-256 of the prefetched range and its plan (parties compare it: see offline):
        canonical("plan/v1", start, len(plan), [[kind, op, shapes, params], ...]), each
        entry's encoding cached (_entry_encoding; the same bytes as canonical's)."""
        plan = self._plan
        head = canonical("plan/v1", self._plan_start, len(plan), ())
        body = b"".join(_entry_encoding(entry) for entry in plan)
        # canonical's empty sequence ends the head; the plan's sequence of entries replaces it
        return hashlib.sha256(head[:-5] + b"t" + len(plan).to_bytes(4, "little") + body).digest()

    def wait_prefetched(self) -> None:
        """Block until the prefetched corrections are ready (end of the offline phase): with
        the dealer, prepared by it and their first chunk received; else received."""
        if self._stream is not None:
            self._stream.puller()
        elif self._prefetched:
            first = min(self._prefetched)
            self._prefetched[first]()

    def close(self) -> None:
        pass


class DealerProvider(Provider):
    """Correlated randomness from the dealer service (secure if the dealer does not collude)."""

    name = "dealer"

    def __init__(self, config: Config):
        self.client = DealerClient(config)
        super().__init__(config, self.client.seed)

    def _corrections(self, request: Request) -> Callable[[], list[torch.Tensor]]:
        return self._batch_corrections([request])[0]

    def _batch_corrections(self, requests: list[Request]) -> list[Callable[[], list[torch.Tensor]]]:
        """One dealer round trip for the whole batch; each request's answer on demand."""
        result = self.client.request_batch(requests)
        answers: list[list[torch.Tensor]] = []

        def fetcher(i: int) -> Callable[[], list[torch.Tensor]]:
            def fetch() -> list[torch.Tensor]:
                if not answers:
                    answers.extend(result())
                    self.stats["dealer_bytes"] += sum(t.numel() * t.element_size()
                                                      for answer in answers for t in answer)
                return _unjoin(requests[i], answers[i])
            return fetch
        return [fetcher(i) for i in range(len(requests))]

    def _prefetch_corrections(self, requests: list[Request]) -> list[Callable[[], list[torch.Tensor]]]:
        """The dealer prepares the batch now (offline); each request's corrections are
        pulled, a few chunks ahead, when the run needs them (comm/dealer_prefetch.py)."""
        total = sum(_answer_bytes(r.kind, r.op, r.shapes, r.params, self.world_size,
                                  self.client.config.max_message_bytes) for r in requests)
        stream = self._stream = _Prefetch(self.client.prepare(requests), total, self.stats)

        def fetcher(i: int) -> Callable[[], list[torch.Tensor]]:
            return lambda: _unjoin(requests[i], stream.puller().answer(i))
        return [fetcher(i) for i in range(len(requests))]

    def close(self) -> None:
        self._drop_prefetched()
        self.client.close()


@functools.lru_cache(maxsize=4096)
def _answer_bytes(kind: str, op: str, shapes: tuple, params: tuple, world_size: int,
                  max_message_bytes: int) -> int:
    """correlations.check_request, cached (a plan repeats its requests' shapes at every prefetch)."""
    return correlations.check_request(kind, op, shapes, params, world_size, max_message_bytes)


@functools.lru_cache(maxsize=4096)
def _corrections_layout(kind: str, op: str, shapes: tuple, params: tuple) -> tuple:
    """(shapes of a request's corrections, their sizes, whether every one is 1-D)."""
    n = correlations.correction_count(kind, params)
    wanted = tuple(tuple(s) for s in correlations.component_shapes(kind, op, shapes, params)[-n:]) if n else ()
    return wanted, [math.prod(shape) for shape in wanted], all(len(shape) == 1 for shape in wanted)


def _unjoin(request: Request, answer: list[torch.Tensor]) -> list[torch.Tensor]:
    """A request's corrections as the dealer sent them: one tensor each, or, for several small
    ones, one flat tensor of them all in order (DealerServer.answer), cut here by their shapes.
    Anything else is the dealer's error (CommunicationError), never a wrong correlation."""
    kind, op, shapes, params = request.kind, request.op, request.shapes, request.params
    wanted, sizes, flat = _corrections_layout(kind, op, shapes, params)
    n = len(wanted)
    if len(answer) == n and n != 1:
        return answer
    if len(answer) == n and tuple(answer[0].shape) == wanted[0]:
        return answer
    if (len(answer) == 1 and n > 1 and answer[0].dim() == 1 and answer[0].numel() == sum(sizes)
            and answer[0].dtype == torch.int64):
        parts = answer[0].split_with_sizes(sizes)
        return list(parts) if flat else [part.view(shape) for part, shape in zip(parts, wanted)]
    raise CommunicationError(f"party {CORRECTING_RANK}: the dealer's answer to request {request.counter} "
                             f"({kind}/{op or '-'}) holds {[tuple(t.shape) for t in answer]}, expected "
                             f"{n} corrections of shapes {wanted}; check that the dealer runs the "
                             "same crypten_lite version as the parties", peer="dealer")


class _Prefetch:
    """Rank 0's prefetched batch: prepared by the dealer (offline), then pulled in chunks.
    Its bytes count as dealer bytes once the dealer has prepared it (the offline phase's)."""

    def __init__(self, ready: Callable[[], ChunkPuller], nbytes: int, stats: dict):
        self._ready = ready
        self._nbytes = nbytes
        self._stats = stats
        self._puller: ChunkPuller | None = None
        self._closed = False
        self._lock = threading.Lock()

    def puller(self) -> ChunkPuller:
        """The batch's ChunkPuller (the first call waits for the dealer's Prepare)."""
        with self._lock:
            if self._closed:
                raise ProtocolError("the prefetched corrections were dropped (the run left the "
                                    "plan, or a new prefetch replaced it)")
            if self._puller is None:
                puller = self._ready()
                puller.start()
                self._puller = puller
                self._stats["dealer_bytes"] += self._nbytes
            return self._puller

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._puller is not None:
                self._puller.close()


def tfp_seed(session: str, rank: int) -> bytes:
    """TFP seeds are derivable by anybody: that is why TFP is insecure."""
    return hashlib.sha256(f"crypten_lite/tfp/{session}/{rank}".encode()).digest()


class TfpProvider(Provider):
    """Trusted first party: rank 0 computes every correction itself. INSECURE, tests only."""

    name = "tfp"

    def __init__(self, config: Config):
        super().__init__(config, tfp_seed(config.session, config.rank))
        self._keys = {r: subkey(tfp_seed(config.session, r), "correlations")
                      for r in range(config.world_size)}
        if config.rank == 0:
            log.warning("provider 'tfp' is INSECURE: party 0 can derive every party's randomness. "
                        "Use it only for tests and debugging; the default 'dealer' is secure.")

    def _corrections(self, request: Request) -> Callable[[], list[torch.Tensor]]:
        fixes = _tfp_handler(self._keys, request)
        return lambda: fixes


class OnePartyProvider(TfpProvider):
    """The provider of a session of one party (init() outside a launch): rank 0 derives its
    correlated values and their corrections itself, as the dealer would for one party. One
    party has no privacy to lose; the session warns about that (session.init_single_process)."""

    name = "one-party"

    def __init__(self, config: Config):
        if config.world_size != 1:
            raise ProtocolError(f"OnePartyProvider serves a session of one party, not "
                                f"{config.world_size}; use the dealer provider")
        Provider.__init__(self, config, tfp_seed(config.session, 0))
        self._keys = {0: subkey(tfp_seed(config.session, 0), "correlations")}


# Bytes of weight masks B the dealer keeps (least recently used dropped first): every
# weight_triple of a weight needs its B, which is as large as the weight.
MASK_CACHE_BYTES = 2 << 30


class DealerHandler:
    """What the dealer service accepts and computes (plugged into DealerServer). The weight
    masks B are kept (up to `mask_cache_bytes`), not derived again for every call."""

    def __init__(self, mask_cache_bytes: int = MASK_CACHE_BYTES):
        self._mask_cache_bytes = mask_cache_bytes
        self._masks: OrderedDict[tuple, torch.Tensor] = OrderedDict()
        self._mask_bytes = 0
        self._lock = threading.Lock()

    def check(self, request: Request, world_size: int, max_component_bytes: int) -> int:
        """Refuse a request no protocol makes (ProtocolError); else its answer's bytes."""
        return correlations.check_request(request.kind, request.op, request.shapes,
                                          request.params, world_size, max_component_bytes)

    def weight_mask(self, keys: dict[int, bytes], counter: int, shape: tuple) -> torch.Tensor:
        """B of the weight_mask request at `counter` (cached; never written by its users)."""
        key = (tuple(sorted(keys.items())), counter, tuple(shape))
        with self._lock:
            b = self._masks.get(key)
            if b is not None:
                self._masks.move_to_end(key)
                return b
        b = correlations.weight_mask_of(keys, counter, shape)
        nbytes = b.numel() * b.element_size()
        if nbytes <= self._mask_cache_bytes:
            with self._lock:
                if key not in self._masks:
                    self._masks[key] = b
                    self._mask_bytes += nbytes
                while self._mask_bytes > self._mask_cache_bytes:
                    _, old = self._masks.popitem(last=False)
                    self._mask_bytes -= old.numel() * old.element_size()
        return b

    def __call__(self, keys: dict[int, bytes], request: Request) -> list[torch.Tensor]:
        """Rank 0's corrections for `request`, from every rank's correlation key."""
        return correlations.corrections(keys, request.counter, request.kind, request.op,
                                        request.shapes, request.params, self.weight_mask)


dealer_handler = DealerHandler()
_tfp_handler = DealerHandler(mask_cache_bytes=0)  # TFP: rank 0 keeps no masks beside its model


class NoProvider(Provider):
    """The provider of a session without a dealer (protocol "rss"): every request is refused
    by name. Offline recording and prefetching are no-ops (nothing to fetch)."""

    name = "none"

    def __init__(self, config: Config):
        super().__init__(config, bytes(32))
        self._protocol = config.protocol

    def get(self, kind: str, shapes, op: str = "", params=()) -> Correlation:
        what = f"{kind}/{op}" if op else kind
        raise UnsupportedError(
            f"party {self.rank}: protocol {self._protocol!r} has no dealer, but a protocol asked "
            f"for correlated randomness ({what} of shapes {[tuple(s) for s in shapes]}): this op "
            "has no replicated implementation yet; run it with CRYPTEN_LITE_PROTOCOL=additive")

    def _corrections(self, request: Request) -> Callable[[], list[torch.Tensor]]:
        raise UnsupportedError(f"protocol {self._protocol!r} has no dealer")


def make(config: Config, comm=None) -> Provider:
    """The provider named by `config.provider` (`comm`: the session's transport, which the
    pairwise provider uses for its offline exchanges)."""
    if config.provider == "tfp":
        return TfpProvider(config)
    if config.provider == "pairwise":
        from . import he, ot
        from .pairwise import PairwiseProvider
        he._sealapi()   # TenSEAL (SEAL) and PyNaCl (the base OTs) checked before anything is
        ot._sodium()    # made or exchanged (PyNaCl's was raised only at the first OT)
        return PairwiseProvider(config, comm)
    return DealerProvider(config)
