"""The offline progress line of provider ``pairwise`` (rank 0's stderr): correlations made,
MB exchanged, MB/s and the time left, for long prefetch / make_store phases."""

from __future__ import annotations

import os
import sys
import threading
import time

from ..errors import ConfigError

PROGRESS_ENV = "CRYPTEN_LITE_PROGRESS"


def progress_wanted(rank: int) -> bool:
    """Whether this party draws the offline progress line: rank 0 only (one line per run),
    when CRYPTEN_LITE_PROGRESS=1 (`crypten-lite launch --progress` sets it) or, unless it is
    0, when stderr is a terminal."""
    forced = os.environ.get(PROGRESS_ENV, "")
    if forced not in ("", "0", "1"):
        raise ConfigError(f"{PROGRESS_ENV}={forced!r}: use 1 (draw the pairwise offline progress "
                          "line on stderr), 0 (never) or leave it unset (only on a terminal)")
    return rank == 0 and (forced == "1" or (forced != "0" and sys.stderr.isatty()))


# A correlation's work for the time left, in rough microseconds of this kind of machine per
# unit, by how it is made (benchmarks/pairwise_vs_cheetah.py's workloads, session 23): the OT
# kinds by their working set (ELEMENT_BYTES: about their OTs), elementwise HE products by
# their operands' elements, matmul / conv / weight triples by their operands' elements (a
# ciphertext's worth of work per element is larger there). The line then measures each class's
# own rate as it goes, so these only rank what has not started yet.
PRIOR_US = {"ot": 0.0015, "he-elementwise": 2.0, "he-product": 20.0}


def _prior(cls: str) -> float:
    """A class's prior microseconds per unit: "ot/<kind>" is timed per kind, priced as "ot"."""
    return PRIOR_US.get(cls.split("/")[0], 1.0)


class _Progress:
    """One stderr line for a long offline phase: correlations made, MB exchanged, MB/s and the
    time left. Redrawn at most once a second, also while one large correlation is being
    exchanged (a daemon ticker, stopped by done()). It shows counts, byte totals and seconds
    only, never a value, key or seed, and goes to stderr, not to the logging handlers.

    The time left: each correlation has a class (how it is made: `classes`, PRIOR_US's keys)
    and a weight in that class's units; a class's remaining units are timed at the seconds
    per unit its own correlations took so far (a step names the correlations it made, and the
    time since the last step is shared among them by weight), a class not started yet at the
    whole phase's seconds per prior microsecond. Without classes, one class."""

    TICK = 1.0   # seconds between redraws

    def __init__(self, weights: list[int], stats: dict, rank: int, classes: list[str] | None = None):
        self.total = len(weights)
        self.total_units = sum(weights)
        self.weights = list(weights)
        self.classes = list(classes) if classes is not None else [""] * len(weights)
        self.class_total: dict[str, int] = {}
        for c, w in zip(self.classes, self.weights):
            self.class_total[c] = self.class_total.get(c, 0) + w
        self.class_units = dict.fromkeys(self.class_total, 0)     # made so far, per class
        self.class_seconds = dict.fromkeys(self.class_total, 0.0)
        self.last = None       # when the last step ended (the next step's work starts there)
        self.current_class = ""
        self.stats = stats
        self.start = time.perf_counter()
        self.bytes0 = stats["pairwise_bytes_sent"] + stats["pairwise_bytes_received"]
        self.show = self.total > 0 and progress_wanted(rank)
        self.count = self.units = 0
        self.inside = 0.0      # fraction of the current correlation (`current` units) made
        self.current = 0
        self.drawn = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker = None
        if self.show:
            self._ticker = threading.Thread(target=self._tick, daemon=True,
                                            name="crypten-lite-pairwise-progress")
            self._ticker.start()

    def _tick(self) -> None:
        while not self._stop.wait(self.TICK):
            self._draw()

    def step(self, done: int, units: int, items: list[int] | None = None) -> None:
        """`done` correlations of `units` weight made so far; `items`: the plan positions this
        step made (their class and weight), which took the time since the last step."""
        if not self.show:
            return
        now = time.perf_counter()
        with self._lock:
            if items:
                spent = now - (self.last if self.last is not None else self.start)
                made = sum(self.weights[i] for i in items) or 1
                for i in items:
                    c = self.classes[i]
                    self.class_units[c] += self.weights[i]
                    self.class_seconds[c] += spent * self.weights[i] / made
            self.last = now
            self.count, self.units, self.inside = done, units, 0.0
        if done >= self.total:
            self._draw()

    def _left(self, elapsed: float, units: float) -> str:
        """The time left, as the class docstring says."""
        if not units:
            return "time left unknown"
        timed = {c: self.class_seconds[c] / self.class_units[c]
                 for c in self.class_total if self.class_units[c]}
        if not timed:             # no step named its items: the whole phase's rate
            return f"{elapsed / units * (self.total_units - units):.0f} s left"
        done_prior = sum(self.class_units[c] * _prior(c) for c in timed)
        per_prior = sum(self.class_seconds[c] for c in timed) / max(done_prior, 1e-12)
        left = 0.0
        for c, total in self.class_total.items():
            rest = total - self.class_units[c]
            if c == self.current_class:
                rest -= self.inside * self.current
            rest = max(rest, 0)
            left += rest * (timed[c] if c in timed else per_prior * _prior(c))
        if self.last is not None:   # the step under way has run since the last one ended
            left = max(left - (time.perf_counter() - self.last) * (self.inside == 0.0), 0.0)
        return f"{left:.0f} s left"

    def within(self, fraction: float) -> None:
        """`fraction` of the correlation being made now is done (a large one, in slices)."""
        self.inside = fraction

    def _draw(self) -> None:
        with self._lock:
            if self._stop.is_set() and self.count < self.total:
                return
            elapsed = time.perf_counter() - self.start
            mb = (self.stats["pairwise_bytes_sent"] + self.stats["pairwise_bytes_received"]
                  - self.bytes0) / 1e6
            units = self.units + self.inside * self.current
            left = self._left(elapsed, units)
            sys.stderr.write(f"\rpairwise offline: {self.count}/{self.total} correlations, "
                             f"{mb:.1f} MB, {mb / max(elapsed, 1e-9):.1f} MB/s, {left} ")
            sys.stderr.flush()
            self.drawn = True

    def done(self) -> None:
        """Stop the ticker and end the line (also when the phase failed)."""
        if not self.show:
            return
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(5.0)
        with self._lock:
            if self.drawn:
                sys.stderr.write("\n")
                sys.stderr.flush()
