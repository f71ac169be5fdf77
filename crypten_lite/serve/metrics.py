"""Counters of one serving party: requests, errors by kind, latency percentiles, batch sizes."""

from __future__ import annotations

import collections
import json
import threading


class Metrics:
    """Thread-safe counters; `snapshot()` is what the Info call and /metrics return."""

    def __init__(self, window: int = 4096):
        self._lock = threading.Lock()
        self.requests = 0
        self.answered = 0
        self.errors: collections.Counter = collections.Counter()
        self.batches = 0
        self.planned_batches = 0  # batches whose recorded plan held to the end (all prefetched)
        self.batch_samples: collections.Counter = collections.Counter()
        self._latency: collections.deque = collections.deque(maxlen=window)

    def request(self) -> None:
        with self._lock:
            self.requests += 1

    def done(self, seconds: float) -> None:
        with self._lock:
            self.answered += 1
            self._latency.append(seconds)

    def error(self, kind: str) -> None:
        with self._lock:
            self.errors[kind] += 1

    def batch(self, samples: int) -> None:
        with self._lock:
            self.batches += 1
            self.batch_samples[samples] += 1

    def planned(self) -> None:
        with self._lock:
            self.planned_batches += 1

    def snapshot(self) -> dict:
        with self._lock:
            lat = sorted(self._latency)
            pct = {}
            for p in (50, 90, 99):
                pct[f"p{p}_ms"] = round(1000 * lat[min(len(lat) - 1, len(lat) * p // 100)], 3) if lat else None
            return {"requests": self.requests, "answered": self.answered,
                    "errors": dict(self.errors), "batches": self.batches,
                    "planned_batches": self.planned_batches,
                    "batch_samples": {str(k): v for k, v in sorted(self.batch_samples.items())},
                    "latency": pct}

    def json(self) -> str:
        return json.dumps(self.snapshot(), sort_keys=True)
