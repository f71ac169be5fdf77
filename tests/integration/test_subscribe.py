"""The subscription transport (comm/grpc_comm.py, issue 32): each party reads its peer's
messages on the thread that waits for them, a blocked read ends at its deadline, a goodbye or a
lost peer ends a wait at once. Two real GrpcCommunicators (gRPC servers and channels, plaintext
loopback) in one process."""

from __future__ import annotations

import concurrent.futures
import threading

import pytest
import torch

from crypten_lite.comm import grpc_comm
from crypten_lite.config import Config
from crypten_lite.errors import CommunicationError
from crypten_lite.mpc.launcher import free_ports


def _pair(timeout: float) -> list[grpc_comm.GrpcCommunicator]:
    ports = free_ports(2)
    parties = tuple(f"127.0.0.1:{p}" for p in ports)
    session = f"subscribe-{ports[0]}"
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # both handshakes at once
        futures = [pool.submit(grpc_comm.GrpcCommunicator,
                               Config(rank=r, world_size=2, session=session, timeout=timeout,
                                      parties=parties)) for r in range(2)]
        return [f.result(timeout=120) for f in futures]


def test_messages_are_read_by_the_waiting_thread_and_arrive_whole(monkeypatch):
    readers: set[int] = set()
    accept = grpc_comm._Inbox._accept

    def recorded(self, src, frame, partial):
        readers.add(threading.get_ident())
        return accept(self, src, frame, partial)
    monkeypatch.setattr(grpc_comm._Inbox, "_accept", recorded)
    comms = _pair(timeout=60)
    try:
        big = torch.arange(600_000)  # two chunks
        small = torch.tensor([1.5, -2.0])

        def party(c, out):
            c.send(big if c.rank == 0 else small, 1 - c.rank)
            out.append(c.recv(1 - c.rank))
            c.send(small * (c.rank + 1), 1 - c.rank)
            out.append(c.recv(1 - c.rank))
        got: list[list[torch.Tensor]] = [[], []]
        other = threading.Thread(target=party, args=(comms[1], got[1]))
        other.start()
        party(comms[0], got[0])
        other.join(timeout=60)
        assert not other.is_alive()
        assert torch.equal(got[0][0], small) and torch.equal(got[1][0], big)
        assert torch.equal(got[0][1], small * 2) and torch.equal(got[1][1], small)
        # No handler thread or mailbox in between: the two waiting threads take their own.
        assert readers == {threading.get_ident(), other.ident}
    finally:
        for c in comms:
            c.close()


def test_a_blocked_read_ends_at_its_deadline_and_the_peer_counts_as_failed():
    comms = _pair(timeout=1.0)
    try:
        with pytest.raises(CommunicationError, match="CRYPTEN_LITE_TIMEOUT") as err:
            comms[1].recv(0)  # party 0 sends nothing: the watchdog cancels the read
        assert err.value.peer == 0
        assert comms[1].mailbox.failure(0)  # its subscription is gone: later waits fail at once
        with pytest.raises(CommunicationError, match="party 0 is unreachable"):
            comms[1].recv(0)
    finally:
        for c in comms:
            c.close()


def test_a_goodbye_ends_the_next_wait_at_once_and_is_not_a_failure():
    comms = _pair(timeout=60)
    try:
        comms[0].send(torch.tensor([3]), 1)
        comms[0].close()
        assert torch.equal(comms[1].recv(0), torch.tensor([3]))  # sent before the goodbye
        with pytest.raises(CommunicationError, match="closed its session") as err:
            comms[1].recv(0)
        assert err.value.peer == 0 and comms[1].mailbox.failure(0) is None
    finally:
        for c in comms:
            c.close()
