"""The protocol tests' one measure of what a block costs: exact rounds and bytes on this party."""
from __future__ import annotations

from typing import Any, Callable

from crypten_lite import comm


def cost(fn: Callable[[], Any], barrier: bool = False) -> tuple[Any, int, int]:
    """(fn()'s result, rounds, bytes this party sent while running it).

    barrier=True lines the parties up first (one uncounted barrier), for a block that follows
    one where the parties' last messages go one way only (an input sharing)."""
    c = comm.get()
    if barrier:
        c.barrier()
    c.reset_communication_stats()
    out = fn()
    st = c.get_communication_stats()
    return out, int(st["rounds"]), int(st["bytes_sent"])


def cost_pair(fn: Callable[[], Any]) -> tuple[Any, tuple[int, int]]:
    """(fn()'s result, (rounds, bytes)), the parties lined up first: the form the tests
    compare with their expected (rounds, bytes) constants."""
    out, rounds, sent = cost(fn, barrier=True)
    return out, (rounds, sent)
