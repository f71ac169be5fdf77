"""Secret random bits (protocol.random_words) under every protocol: no communication, fresh on
every call, uniform once opened; under rss the replicated components agree between the two
parties that hold each of them (component j comes from the PRG stream of pair (j, j-1)).
rand / bernoulli / weighted_sample / dropout on top of it: tests/protocol/test_crypten_ops.py
(test_random_and_dropout, all three pools)."""

from __future__ import annotations

import torch

from crypten_lite import comm
from crypten_lite.mpc import protocol
from crypten_lite.mpc.replicated import Replicated


def party_words():
    c = comm.get()
    c.reset_communication_stats()
    w1 = protocol.random_words(64)
    w2 = protocol.random_words(64)
    st = c.get_communication_stats()
    cost = (int(st["rounds"]), int(st["bytes_sent"]))
    comps = [(w.a, w.b) if isinstance(w, Replicated) else (w, None) for w in (w1, w2)]
    return cost, comps, protocol.open_xor(w1), protocol.open_xor(w2)


def test_random_words(pool_all):
    r = pool_all.run(party_words)
    for cost, _, o1, o2 in r:
        assert cost == (0, 0)                                # made without a message
        assert torch.equal(o1, r[0][2]) and torch.equal(o2, r[0][3])
    o1, o2 = r[0][2], r[0][3]
    assert not torch.equal(o1, o2)                           # fresh on every call
    bits = torch.cat([(o >> torch.arange(64).unsqueeze(1)) & 1 for o in (o1, o2)]).double()
    # 8192 bits: mean 0.5 +- 0.0055 (1 sigma); 0.04 is 7 sigma
    assert abs(bits.mean().item() - 0.5) < 0.04
    if pool_all.protocol == "rss":
        for k in range(2):
            comps = [p[1][k] for p in r]
            for i in range(3):                               # party i's b is party i+1's a
                assert torch.equal(comps[i][1], comps[(i + 1) % 3][0])
            opened = comps[0][0] ^ comps[1][0] ^ comps[2][0]
            assert torch.equal(opened, r[0][2 + k])
            for i in range(3):                               # no party holds the value alone
                assert not torch.equal(comps[i][0] ^ comps[i][1], opened)
