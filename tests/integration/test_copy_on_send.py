"""Copy-on-send: what a peer receives is the tensor as it was when the sending call was made.

Regression test of issue 11, finding 4: the gRPC outbox kept a view of the tensor's memory and
serialized it later on the stream's thread, so a tensor modified in place right after
`send` / `broadcast` reached the peer modified (120 of 120 in a probe). Here every sending call
of the Communicator is followed at once by an in-place change of the tensor sent, many times,
over real gRPC between party processes; every received tensor must be the original.
"""

from __future__ import annotations

import pytest
import torch

from crypten_lite import comm
from crypten_lite.comm.grpc_comm import CHUNK_BYTES

ITERATIONS = 150
SMALL = 4096                   # elements: one frame
LARGE = CHUNK_BYTES // 8 + 17  # int64 elements: two chunks (the multi-frame path)


def _original(i: int, src: int, n: int) -> torch.Tensor:
    """The value party `src` sends in iteration `i` (known to every party)."""
    return torch.arange(n, dtype=torch.int64) * 7 + i * 1000 + src


def _changed(t: torch.Tensor) -> None:
    t.fill_(-1)  # in place, immediately after the call


def party_send_then_modify(world_size: int) -> dict[str, int]:
    """Every sending call, each followed at once by an in-place change; counts wrong receipts."""
    c = comm.get()
    rank, peers = c.rank, c.peers()
    wrong = {"send": 0, "exchange": 0, "broadcast": 0, "all_gather": 0, "gather": 0,
             "all_reduce": 0, "large": 0}
    checked = dict.fromkeys(wrong, 0)

    def check(what: str, got: torch.Tensor, expected: torch.Tensor) -> None:
        checked[what] += 1
        if not torch.equal(got, expected):
            wrong[what] += 1

    for i in range(ITERATIONS):
        # send / recv around a ring
        t = _original(i, rank, SMALL)
        c.send(t, (rank + 1) % world_size)
        _changed(t)
        src = (rank - 1) % world_size
        check("send", c.recv(src), _original(i, src, SMALL))
        # exchange with every peer
        t = _original(i, rank, SMALL)
        got = c.exchange({p: t for p in peers}, peers)
        _changed(t)
        for p in peers:
            check("exchange", got[p], _original(i, p, SMALL))
        # broadcast from a rotating source
        root = i % world_size
        t = _original(i, root, SMALL) if rank == root else None
        out = c.broadcast(t, root)
        if rank == root:
            _changed(t)
        else:
            check("broadcast", out, _original(i, root, SMALL))
        # all_gather, gather, all_reduce: the call returns before the peer's copy is sent
        t = _original(i, rank, SMALL)
        parts = c.all_gather(t)
        _changed(t)
        for p in peers:
            check("all_gather", parts[p], _original(i, p, SMALL))
        t = _original(i, rank, SMALL)
        parts = c.gather(t, root)
        _changed(t)
        if rank == root:
            for p in peers:
                check("gather", parts[p], _original(i, p, SMALL))
        t = _original(i, rank, SMALL)
        total = c.all_reduce(t)
        _changed(t)
        check("all_reduce", total, sum(_original(i, r, SMALL) for r in range(world_size)))
    for i in range(4):  # messages of several chunks
        t = _original(i, rank, LARGE)
        c.send(t, (rank + 1) % world_size)
        _changed(t)
        src = (rank - 1) % world_size
        check("large", c.recv(src), _original(i, src, LARGE))
    c.barrier()
    return {"wrong": wrong, "checked": checked}


@pytest.mark.parametrize("world_size", [2, 3])
def test_in_place_change_after_send_never_reaches_the_peer(pool2, pool3, world_size):
    pool = pool2 if world_size == 2 else pool3
    results = pool.run(party_send_then_modify, world_size)
    for rank, res in enumerate(results):
        assert all(n == 0 for n in res["wrong"].values()), (rank, res)
        assert res["checked"]["send"] == ITERATIONS and res["checked"]["large"] == 4
        assert res["checked"]["exchange"] == ITERATIONS * (world_size - 1)
        assert res["checked"]["all_gather"] == ITERATIONS * (world_size - 1)
