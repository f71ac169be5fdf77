"""Two parties of an in-process test as two threads (HE engines joined by queues, providers on
an in-process hub): shared by the pairwise unit tests."""

from __future__ import annotations

import threading
from typing import Callable


def run_both(fns: list[Callable], join_timeout: float = 300.0, capture: bool = False) -> list:
    """Run fns[r]() for r = 0, 1 on two threads; a thread still running after join_timeout
    fails the test ("a party hung"). Returns both results, re-raising the first party's
    exception; with `capture`, each rank's (result, exception) instead, for a test that
    inspects the errors."""
    out: list = [(None, None), (None, None)]

    def run(r: int) -> None:
        try:
            out[r] = (fns[r](), None)
        except Exception as e:  # noqa: BLE001 (re-raised or returned below)
            out[r] = (None, e)
    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_timeout)
        assert not t.is_alive(), "a party hung"
    if capture:
        return out
    for _, e in out:
        if e is not None:
            raise e
    return [value for value, _ in out]


def record_sends(comms: list) -> list[list[bytes]]:
    """Wrap each communicator's _send so that every tensor it sends is also kept (its raw
    bytes), per rank: what a test then searches for secrets that must not be on the wire.
    stop_recording(comms) puts the real _send back (communicators a fixture shares)."""
    sent: list[list[bytes]] = [[] for _ in comms]
    for r, c in enumerate(comms):
        real = c._recorded_from = c._send

        def send(tensor, dst, r=r, real=real):
            sent[r].append(tensor.numpy().tobytes())
            real(tensor, dst)
        c._send = send
    return sent


def stop_recording(comms: list) -> None:
    """Undo record_sends."""
    for c in comms:
        c._send = c.__dict__.pop("_recorded_from")
