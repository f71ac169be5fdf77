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


class _Progress:
    """One stderr line for a long offline phase: correlations made, MB exchanged, MB/s and the
    time left (from the elements made so far). Redrawn at most once a second, also while one
    large correlation is being exchanged (a daemon ticker, stopped by done()). It shows counts,
    byte totals and seconds only, never a value, key or seed, and goes to stderr, not to the
    logging handlers."""

    TICK = 1.0   # seconds between redraws

    def __init__(self, weights: list[int], stats: dict, rank: int):
        self.total = len(weights)
        self.total_units = sum(weights)
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

    def step(self, done: int, units: int) -> None:
        """`done` correlations of `units` elements made so far."""
        if not self.show:
            return
        self.count, self.units, self.inside = done, units, 0.0
        if done >= self.total:
            self._draw()

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
            left = (f"{elapsed / units * (self.total_units - units):.0f} s left"
                    if units else "time left unknown")
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
