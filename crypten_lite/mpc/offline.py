"""Offline phase: fetch a program's correlated randomness before its inputs exist.

    with crypten_lite.mpc.offline.record() as plan:      # run the program once
        model(x)
    crypten_lite.mpc.offline.prefetch(plan)             # offline: one dealer round trip
    model(x2)                                           # online: no dealer latency

The plan is the public list of correlation requests (kinds, ops, shapes, parameters) a run
makes; it depends on the model and the input shapes, not on any value. Rank 0 asks the
dealer for all the corrections of the next run in one batch; other parties derive theirs
from their seeds as always. A request that does not follow the plan is fetched as usual.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from ..session import current


@contextlib.contextmanager
def record() -> Iterator[list]:
    """Record the correlation requests made inside the block; the list is filled at exit."""
    provider = current().provider
    plan: list = []
    provider.start_recording()
    try:
        yield plan
    finally:
        plan.extend(provider.stop_recording())


def prefetch(plan: list, wait: bool = True) -> None:
    """Fetch the corrections of the next run of `plan` now (rank 0; a no-op elsewhere)."""
    provider = current().provider
    provider.prefetch(plan)
    if wait:
        provider.wait_prefetched()
