"""Security review round 2, finding 3: every opening checks the FULL shape of what it reveals,
whatever the rank, under every protocol, at no extra round and no extra byte.

The attack: a tensor of more dimensions than a message header holds (16) travels flat, and so
do the several values of one opening; the receivers compared only the element count. Party 0
revealed (2, 1 x 15, 3) and party 1 a transposed (3, 1 x 15, 2): no error, garbage values
(under rss three different answers). Now the header of every opening message carries a digest
of the full shapes (Frame.tag, comm.communicator.shape_tag), compared by every receiver.

Each party function returns (status, message or value, (rounds, bytes_sent)) and then shows
that the session still works.
"""

from __future__ import annotations

import pytest
import torch

import crypten_lite
from crypten_lite import comm
from crypten_lite.errors import ProtocolError
from crypten_lite.mpc import protocol

DIVERGENT = 1
HIGH = (2,) + (1,) * 15 + (3,)           # 17 dimensions: travels flat
WIDE = (2, 1, 3, 1, 1, 2) + (1,) * 14    # 20 dimensions


def _values(shape) -> torch.Tensor:
    n = 1
    for d in shape:
        n *= d
    return torch.arange(float(n)).reshape(shape)


def _outcome(fn):
    c = comm.get()
    c.reset_communication_stats()
    try:
        out = ("value", fn())
    except ProtocolError as e:
        out = ("error", str(e))
    st = c.get_communication_stats()
    ok = crypten_lite.cryptensor(torch.ones(2) if crypten_lite.get_rank() == 0 else None)
    return out, (int(st["rounds"]), int(st["bytes_sent"])), ok.get_plain_text().tolist()


def party_high_rank_reveal(diverge: bool, shape=HIGH):
    x = crypten_lite.cryptensor(_values(shape) if crypten_lite.get_rank() == 0 else None)
    if diverge and crypten_lite.get_rank() == DIVERGENT:
        x = x.transpose(0, len(shape) - 1)   # same element count, other shape: local, no message
    return _outcome(lambda: x.get_plain_text())


def party_swapped_opening(diverge: bool):
    """One opening of two values, (2, 3) and (3, 2), whose shapes party 1 swaps (same total)."""
    rank = crypten_lite.get_rank()
    a = crypten_lite.cryptensor(_values((2, 3)) if rank == 0 else None)
    b = crypten_lite.cryptensor(_values((3, 2)) + 100 if rank == 0 else None)
    if diverge and rank == DIVERGENT:
        a, b = a.reshape(3, 2), b.reshape(2, 3)
    return _outcome(lambda: protocol.open_many([a.share, b.share]))


def party_binary_high_rank(diverge: bool):
    """A binary (xor) opening of a 17-dimension tensor (additive protocol's open_xor)."""
    rank = crypten_lite.get_rank()
    x = crypten_lite.cryptensor(_values(HIGH) if rank == 0 else None)
    share = x.share
    if diverge and rank == DIVERGENT:
        share = share.transpose(0, len(HIGH) - 1)
    return _outcome(lambda: protocol.open_xor(share))


def _erring_ranks(pool) -> set[int]:
    """Ranks that must raise: every party under the additive protocol (each hears from every
    other); under rss the ones that hear from the diverged party or are it (0 and 1)."""
    return {0, 1} if pool.protocol == "rss" else set(range(pool.world_size))


def _sent_bytes(pool, elements: int) -> int:
    return 8 * elements * (1 if pool.protocol == "rss" else pool.world_size - 1)


@pytest.mark.parametrize("shape", [HIGH, WIDE], ids=["17dims", "20dims"])
def test_high_rank_transposed_reveal_fails(pool_all, shape):
    n = int(torch.tensor(shape).prod())
    for rank, ((status, message), costs, after) in enumerate(pool_all.run(party_high_rank_reveal, True, shape)):
        if rank in _erring_ranks(pool_all):
            assert status == "error", (rank, message)
            assert "other shapes" in message or "sent shape" in message, message
            assert "every party must reveal the same tensor" in message, message
        else:  # rss: party 2 hears from party 0 only, whose shares agree with its own
            assert status == "value" and torch.equal(message, _values(shape)), message
        assert costs == (1, _sent_bytes(pool_all, n))   # no extra round, no extra byte
        assert after == [1.0, 1.0]


@pytest.mark.parametrize("shape", [HIGH, WIDE], ids=["17dims", "20dims"])
def test_high_rank_consistent_reveal_is_right_at_the_same_cost(pool_all, shape):
    n = int(torch.tensor(shape).prod())
    for (status, value), costs, _ in pool_all.run(party_high_rank_reveal, False, shape):
        assert status == "value" and torch.equal(value, _values(shape))
        assert costs == (1, _sent_bytes(pool_all, n))


def test_swapped_shapes_in_one_opening_fail(pool_all):
    for rank, ((status, message), costs, after) in enumerate(pool_all.run(party_swapped_opening, True)):
        if rank in _erring_ranks(pool_all):
            assert status == "error" and "other shapes" in message, (rank, message)
        assert costs == (1, _sent_bytes(pool_all, 12))
        assert after == [1.0, 1.0]


def test_consistent_opening_of_several_values(pool_all):
    scale = 1 << 16  # the pools' fixed-point precision (default)
    for (status, values), costs, _ in pool_all.run(party_swapped_opening, False):
        assert status == "value"
        a, b = values
        assert torch.equal(a, (_values((2, 3)) * scale).long())
        assert torch.equal(b, ((_values((3, 2)) + 100) * scale).long())
        assert costs == (1, _sent_bytes(pool_all, 12))


def test_binary_high_rank_opening_fails(pool):
    for rank, ((status, message), costs, after) in enumerate(pool.run(party_binary_high_rank, True)):
        assert status == "error" and "other shapes" in message, (rank, message)
        assert costs == (1, _sent_bytes(pool, 6))
        assert after == [1.0, 1.0]
