"""One failure stops the session (issue 15): a party that raises tells every peer at once.

The party sends an abort frame (the rank that failed first and the exception's type, never
its message) to every peer; their waits on it fail at once with a CommunicationError naming
that party, long before CRYPTEN_LITE_TIMEOUT (600 s here). `crypten-lite launch` is covered
in test_launch.py; here it is run_multiprocess / PartyPool, and the mailbox rules.
"""

from __future__ import annotations

import pytest
import torch

import crypten_lite
from crypten_lite.comm.mailbox import Mailbox
from crypten_lite.errors import CommunicationError
from crypten_lite.mpc import PartyFailure, PartyPool, run_multiprocess


def raise_in_protocol(wait_on: dict[int, int]):
    """Rank 1 raises after one private product; rank r waits for a message from wait_on[r].

    Rank 1 raises only once every other party has told it, from inside the try block, that it
    is there: a party still finishing the reveal could otherwise see the failure there, first
    from a third party's report (which can overtake rank 1's last data, on another stream),
    and name it differently from what the test expects."""
    rank = crypten_lite.get_rank()
    comm = crypten_lite.comm.get()
    x = crypten_lite.cryptensor(torch.ones(4), src=0)
    (x * x).get_plain_text()
    if rank == 1:
        for peer in wait_on:
            comm.recv(peer)  # "I am inside the try block"
        raise ValueError("secret value 12345")
    try:
        comm.send(torch.zeros(1), 1)
        comm.recv(wait_on[rank])
    except CommunicationError as e:
        assert e.peer == wait_on[rank]
        raise


@pytest.mark.timeout(240)  # hang guard, far below the parties' 600 s timeout
def test_pool_party_that_raises_stops_the_others_at_once():
    """Rank 2 waits on rank 1, rank 0 waits on rank 2: rank 2 fails because of rank 1 and
    passes the cause on, so rank 0's error names rank 1 too."""
    with PartyPool(3, timeout=600) as pool:
        with pytest.raises(PartyFailure) as info:
            pool.run(raise_in_protocol, {0: 2, 2: 1})
    message = str(info.value)
    first = message.splitlines()[0]
    assert first == ("raise_in_protocol failed on party 1 (ValueError); parties 0, 2 stopped "
                     "because of it:"), message
    blocks = message.split("--- party ")[1:]
    assert [b.split(" ---")[0] for b in blocks] == ["1", "0", "2"]  # the cause first
    assert "ValueError: secret value 12345" in blocks[0]
    assert ("CommunicationError: party 2: party 1 failed: ValueError; see party 1's output"
            in blocks[2]), blocks[2]
    assert ("CommunicationError: party 0: party 2 stopped because party 1 failed: ValueError"
            in blocks[1]), blocks[1]
    for block in blocks[1:]:
        assert "12345" not in block  # the abort carries the type, never the message
        assert "within 600 s" not in block  # not the timeout error


@run_multiprocess(world_size=2, timeout=600)
def raise_in_protocol_2pc():
    return raise_in_protocol({0: 1})


@pytest.mark.timeout(240)
def test_run_multiprocess_party_that_raises_stops_the_other():
    with pytest.raises(PartyFailure) as info:
        raise_in_protocol_2pc()
    message = str(info.value)
    assert message.startswith("raise_in_protocol_2pc failed on party 1 (ValueError); party 0 "
                              "stopped because of it:"), message
    assert "party 0: party 1 failed: ValueError" in message
    assert "within 600 s" not in message


def test_mailbox_abort_names_the_party_that_failed_first():
    box = Mailbox(rank=0, world_size=3, timeout=600)
    box.put(2, 0, torch.ones(1))
    box.abort(2, origin=1, error="ValueError")
    assert torch.equal(box.take(2), torch.ones(1))  # what arrived before still counts
    with pytest.raises(CommunicationError, match="party 0: party 2 stopped because party 1 failed: "
                                                 "ValueError") as info:
        box.take(2)
    assert info.value.peer == 2
    with pytest.raises(CommunicationError, match="party 0: party 1 failed: ValueError"):
        box.take(1)
    assert box.origin(2) == box.origin(1) == (1, "ValueError")
    box.abort(1, origin=1, error="KeyError")  # the first cause recorded is kept
    assert box.origin(1) == (1, "ValueError")


def test_mailbox_closed_peer_fails_the_next_wait_at_once():
    box = Mailbox(rank=0, world_size=2, timeout=600)
    box.put(1, 0, torch.zeros(2))
    box.closed(1)
    assert torch.equal(box.take(1), torch.zeros(2))
    with pytest.raises(CommunicationError, match="party 1 closed its session"):
        box.take(1)
    assert box.origin(1) == (0, "CommunicationError")  # waiting for more is this party's error
