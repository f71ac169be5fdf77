"""Providers of correlated randomness: the dealer service (default) and TFP (insecure, tests).

A provider hands each protocol its share of a correlated value. Both providers use the same
seeded derivation (`correlations.py`): a party derives its share from its seed with the dealer
and only rank 0 receives a correcting share. With the dealer, that correction comes over gRPC
and is requested as early as possible, so that it arrives while the parties are still
exchanging the masked operands; with TFP, rank 0 computes it from seeds everybody can derive.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Callable

import torch

from ..comm.dealer_rpc import DealerClient, Request
from ..config import Config
from . import correlations
from .correlations import CORRECTING_RANK

log = logging.getLogger("crypten_lite.provider")


class Correlation:
    """One correlated value: this party's seeded components, corrections fetched on demand."""

    def __init__(self, parts: list[torch.Tensor], fetch: Callable[[], list[torch.Tensor]] | None):
        self._parts = parts
        self._fetch = fetch

    def __getitem__(self, j: int) -> torch.Tensor:
        return self._parts[j]

    def corrected(self) -> list[torch.Tensor]:
        """All components, rank 0's correcting ones replaced (waits for the dealer once)."""
        if self._fetch is not None:
            fixes = self._fetch()
            self._fetch = None
            n = len(fixes)
            # Corrections replace the last components (c, or rt and msb), in order.
            self._parts[len(self._parts) - n:] = fixes
        return self._parts


class Provider:
    """Base provider: counters and seeded derivation; subclasses supply rank 0's corrections."""

    name = "provider"

    def __init__(self, config: Config, seed: bytes):
        self.rank = config.rank
        self.world_size = config.world_size
        self._seed = seed
        self.counter = 0
        self.stats = {"requests": 0, "dealer_bytes": 0, "prefetched": 0}
        self._recording: list[tuple] | None = None
        self._prefetched: dict[int, tuple[tuple, Callable[[], list[torch.Tensor]]]] = {}

    def _corrections(self, request: Request) -> Callable[[], list[torch.Tensor]]:
        raise NotImplementedError

    def _batch_corrections(self, requests: list[Request]) -> list[Callable[[], list[torch.Tensor]]]:
        return [self._corrections(r) for r in requests]

    def get(self, kind: str, shapes, op: str = "", params=()) -> Correlation:
        """This party's share of a fresh correlated value of `kind`."""
        shapes = tuple(tuple(int(s) for s in shape) for shape in shapes)
        params = tuple(int(p) for p in params)
        request = Request(kind, self.counter, op, shapes, params)
        self.counter += 1
        self.stats["requests"] += 1
        spec = (kind, op, shapes, params)
        if self._recording is not None:
            self._recording.append(spec)
        parts = correlations.derive(self._seed, request.counter, kind, op, shapes, params)
        fetch = None
        if self.rank == CORRECTING_RANK:
            planned = self._prefetched.pop(request.counter, None)
            if planned is not None and planned[0] == spec:
                fetch = planned[1]
                self.stats["prefetched"] += 1
            else:
                fetch = self._corrections(request)
        return Correlation(parts, fetch)

    # -------------------------------------------------------------- offline phase
    def start_recording(self) -> None:
        """Record the specs (kind, op, shapes, params) of every request from now on."""
        self._recording = []

    def stop_recording(self) -> list[tuple]:
        plan, self._recording = self._recording or [], None
        return plan

    def prefetch(self, plan: list[tuple]) -> None:
        """Offline phase: ask the dealer now, in one batch, for the corrections of the next
        len(plan) requests, assuming they follow `plan` (a recorded run of the same program).
        A request that turns out different is simply fetched again when it comes."""
        self._prefetched.clear()
        if self.rank != CORRECTING_RANK or not plan:
            return
        requests = [Request(kind, self.counter + i, op, shapes, params)
                    for i, (kind, op, shapes, params) in enumerate(plan)]
        for r, fetch in zip(requests, self._batch_corrections(requests)):
            self._prefetched[r.counter] = ((r.kind, r.op, r.shapes, r.params), fetch)

    def wait_prefetched(self) -> None:
        """Block until the prefetched corrections have arrived (end of the offline phase)."""
        if self._prefetched:
            first = min(self._prefetched)
            self._prefetched[first][1]()

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
                return answers[i]
            return fetch
        return [fetcher(i) for i in range(len(requests))]

    def close(self) -> None:
        self.client.close()


def tfp_seed(session: str, rank: int) -> bytes:
    """TFP seeds are derivable by anybody: that is why TFP is insecure."""
    return hashlib.sha256(f"crypten_lite/tfp/{session}/{rank}".encode()).digest()


class TfpProvider(Provider):
    """Trusted first party: rank 0 computes every correction itself. INSECURE, tests only."""

    name = "tfp"

    def __init__(self, config: Config):
        super().__init__(config, tfp_seed(config.session, config.rank))
        self._seeds = {r: tfp_seed(config.session, r) for r in range(config.world_size)}
        if config.rank == 0:
            log.warning("provider 'tfp' is INSECURE: party 0 can derive every party's randomness. "
                        "Use it only for tests and debugging; the default 'dealer' is secure.")

    def _corrections(self, request: Request) -> Callable[[], list[torch.Tensor]]:
        fixes = correlations.corrections(self._seeds, request.counter, request.kind, request.op,
                                         request.shapes, request.params)
        return lambda: fixes


def dealer_handler(seeds: dict[int, bytes], request: Request) -> list[torch.Tensor]:
    """What the dealer service computes for one request (plugged into DealerServer)."""
    return correlations.corrections(seeds, request.counter, request.kind, request.op,
                                    request.shapes, request.params)


def make(config: Config) -> Provider:
    """The provider named by `config.provider`."""
    if config.provider == "tfp":
        return TfpProvider(config)
    return DealerProvider(config)
