"""A reveal where the parties hold shares of different shapes fails on every party.

Regression test of issue 11, finding 5: `get_plain_text()` where the parties' programs diverged
(party 1 reshaped or summed its share, the others did not) printed silent garbage (4x3 vs 3x4,
values near 1e14) or a raw torch broadcasting error (12 vs 1 element). Every receiver now
compares each sender's shape and dtype (from the message header) with its own before summing
and raises ProtocolError naming both; the check costs no round and no byte.
"""

from __future__ import annotations

import pytest
import torch

import crypten_lite
from crypten_lite import comm
from crypten_lite.errors import ProtocolError

DIVERGENT = 1  # the party whose program diverges


def _diverged(kind: str):
    """A CrypTensor of shape 4x3 everywhere, except 3x4 (or one element) at party 1."""
    x = crypten_lite.cryptensor(torch.arange(12.0).reshape(4, 3) if crypten_lite.get_rank() == 0 else None)
    if crypten_lite.get_rank() != DIVERGENT:
        return x if kind == "transpose" else x.reshape(12)
    return x.reshape(3, 4) if kind == "transpose" else x.sum()  # local ops: no message


def party_reveal(kind: str, dst: int | None):
    """Outcome of a reveal of diverged shares: ('error', message) or ('value', result)."""
    c = comm.get()
    y = _diverged(kind)
    c.reset_communication_stats()
    try:
        got = y.get_plain_text(dst)
        out = ("value", got)
    except ProtocolError as e:
        out = ("error", str(e))
    st = c.get_communication_stats()
    # the same session still works afterwards (nothing is left in flight)
    ok = crypten_lite.cryptensor(torch.ones(2) if crypten_lite.get_rank() == 0 else None)
    return out, (int(st["rounds"]), int(st["bytes_sent"])), ok.get_plain_text().tolist()


def party_consistent_costs():
    """A consistent reveal: the value, rounds and bytes (unchanged by the check)."""
    c = comm.get()
    x = crypten_lite.cryptensor(torch.arange(12.0).reshape(4, 3) if crypten_lite.get_rank() == 0 else None)
    c.reset_communication_stats()
    value = x.get_plain_text()
    st = c.get_communication_stats()
    return value, int(st["rounds"]), int(st["bytes_sent"])


SHAPES = {"transpose": ("(4, 3)", "(3, 4)"), "sum": ("(12,)", "()")}


@pytest.mark.parametrize("kind", ["transpose", "sum"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_reveal_of_diverged_shapes_fails_on_every_party(pool2, pool3, world_size, kind):
    pool = pool2 if world_size == 2 else pool3
    results = pool.run(party_reveal, kind, None)
    mine, theirs = SHAPES[kind]
    for rank, ((status, message), (rounds, nbytes), after) in enumerate(results):
        assert status == "error", (rank, message)
        assert "every party must reveal the same tensor" in message
        # both shapes named: this party's and the divergent peer's (or, at the divergent
        # party, the first peer's)
        if rank == DIVERGENT:
            assert f"shape {theirs} (torch.int64) here" in message, message
            assert f"party 0 sent shape {mine}" in message, message
        else:
            assert f"shape {mine} (torch.int64) here" in message, message
            assert f"party {DIVERGENT} sent shape {theirs}" in message, message
        elements = 12 if (rank != DIVERGENT or kind == "transpose") else 1
        assert (rounds, nbytes) == (1, 8 * elements * (world_size - 1))  # no extra byte
        assert after == [1.0, 1.0]


@pytest.mark.parametrize("dst", [0, DIVERGENT])
@pytest.mark.parametrize("world_size", [2, 3])
def test_reveal_to_one_party_fails_there(pool2, pool3, world_size, dst):
    """With dst, only dst receives anything, so only dst can (and does) raise; the other
    parties get None, as from every dst reveal, never a value."""
    pool = pool2 if world_size == 2 else pool3
    results = pool.run(party_reveal, "transpose", dst)
    for rank, ((status, message), _, after) in enumerate(results):
        if rank == dst:
            assert status == "error" and "(4, 3)" in message and "(3, 4)" in message, message
        else:
            assert (status, message) == ("value", None)
        assert after == [1.0, 1.0]


@pytest.mark.parametrize("world_size", [2, 3])
def test_consistent_reveal_costs_one_round_and_no_extra_byte(pool2, pool3, world_size):
    pool = pool2 if world_size == 2 else pool3
    for value, rounds, nbytes in pool.run(party_consistent_costs):
        assert torch.equal(value, torch.arange(12.0).reshape(4, 3))
        assert (rounds, nbytes) == (1, 12 * 8 * (world_size - 1))


def party_compare_diverged():
    """A comparison where party 1 compares 6 elements and the others 8 (a local slice: no
    message): the comparison's masked opening carries another number of words from party 1."""
    x = crypten_lite.cryptensor(torch.linspace(-2, 2, 12) if crypten_lite.get_rank() == 0 else None)
    y = x[:6] if crypten_lite.get_rank() == DIVERGENT else x[:8]
    try:
        out = ("value", (y > 0).get_plain_text())
    except ProtocolError as e:
        out = ("error", str(e))
    ok = crypten_lite.cryptensor(torch.ones(2) if crypten_lite.get_rank() == 0 else None)
    return out, ok.get_plain_text().tolist()


def test_comparison_of_diverged_sizes_fails_on_every_party(pool2):
    """The binary circuit's opening compares every party's message size with what its own
    program expects (a shorter message was a torch error, or broadcast silently)."""
    for rank, ((status, message), after) in enumerate(pool2.run(party_compare_diverged)):
        assert status == "error", (rank, message)
        assert "every party must run the same program" in message, message
        assert after == [1.0, 1.0]
