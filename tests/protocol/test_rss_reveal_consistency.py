"""Under rss too, a reveal where the parties hold shares of different shapes fails, naming both
shapes (tests/protocol/test_reveal_consistency.py for the additive protocol; same party
functions). A replicated opening sends each party's second component to its prev only, so a
party checks the one peer it hears from: with party 1 diverged (3x4 or a sum, 4x3 elsewhere),
party 0 (which hears from 1) and party 1 (which hears from 2) raise ProtocolError; party 2
hears from party 0, whose components agree with its own, and gets the right value. A single
tensor travels in its own shape, so a transposed share (same size) is caught as well; the
check costs no round and no byte."""

from __future__ import annotations

import pytest
import torch

from test_reveal_consistency import SHAPES, party_consistent_costs, party_reveal


@pytest.mark.parametrize("kind", ["transpose", "sum"])
def test_reveal_of_diverged_shapes_fails_rss(pool3_rss, kind):
    mine, theirs = SHAPES[kind]
    results = pool3_rss.run(party_reveal, kind, None)
    expected = {0: (mine, 1, theirs), 1: (theirs, 2, mine)}   # rank -> (its shape, peer, peer's)
    for rank, ((status, message), (rounds, nbytes), after) in enumerate(results):
        if rank in expected:
            here, peer, sent = expected[rank]
            assert status == "error", (rank, message)
            assert "every party must reveal the same tensor" in message
            assert f"shape {here} (torch.int64) here" in message, message
            assert f"party {peer} sent shape {sent}" in message, message
        else:
            assert status == "value" and torch.equal(message.reshape(-1), torch.arange(12.0)), message
        elements = 1 if (rank == 1 and kind == "sum") else 12
        assert (rounds, nbytes) == (1, 8 * elements)          # to one peer; no extra byte
        assert after == [1.0, 1.0]


@pytest.mark.parametrize("dst", [0, 1])
def test_reveal_to_one_party_fails_there_rss(pool3_rss, dst):
    for rank, ((status, message), _, after) in enumerate(pool3_rss.run(party_reveal, "transpose", dst)):
        if rank == dst:
            assert status == "error" and "(4, 3)" in message and "(3, 4)" in message, message
        else:
            assert (status, message) == ("value", None)
        assert after == [1.0, 1.0]


def test_consistent_reveal_costs_rss(pool3_rss):
    for value, rounds, nbytes in pool3_rss.run(party_consistent_costs):
        assert torch.equal(value, torch.arange(12.0).reshape(4, 3))
        assert (rounds, nbytes) == (1, 12 * 8)
