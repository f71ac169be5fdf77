"""Two protocols in the same rounds (crypten_lite.mpc.parallel), between real parties with
the dealer and under rss (3 parties, the side protocol's requests riding in rss_binary's
circuit rounds): a side protocol riding in a comparison circuit's rounds gives the same
results as run alone, costs the rounds of the longer of the two and the bytes of both, and a
party whose side protocol sends another size is refused with a clear error."""

from __future__ import annotations

import pytest
import torch

import crypten_lite
from crypten_lite.mpc.launcher import PartyFailure

from _costs import cost_pair  # tests/protocol/_costs.py


def _side(x, y, rounds):
    """A protocol in rounds: `rounds` successive products (x * y, then the result * y, ...)."""
    from crypten_lite.functions.fast import products_gen
    z = x
    for _ in range(rounds):
        (z,) = yield from products_gen([("mul", z, y)])
    return z


def party_alongside(long_side: int):
    from crypten_lite.mpc import protocol
    from crypten_lite.mpc.parallel import alongside, drive
    g = torch.Generator().manual_seed(11)
    a, b = torch.randint(-50, 50, (64,), generator=g), torch.randint(-3, 4, (64,), generator=g)
    v = torch.randint(-1000, 1000, (300,), generator=g)
    x = crypten_lite.cryptensor(a, src=0, precision=0).share
    y = crypten_lite.cryptensor(b, src=1, precision=0).share
    w = crypten_lite.cryptensor(v, src=0, precision=0).share

    def msb():
        return protocol.msb_low(w, 16)

    def opened(t):
        return protocol.open_(t)

    out = {}
    words_alone, out["msb"] = cost_pair(msb)
    prod_alone, out["side2"] = cost_pair(lambda: drive(_side(x, y, 2)))
    (words, prod), out["both2"] = cost_pair(lambda: alongside(msb, _side(x, y, 2)))
    (words5, prod5), out["both5"] = cost_pair(lambda: alongside(msb, _side(x, y, long_side)))
    out["same_words"] = bool((protocol.open_xor(words) == protocol.open_xor(words_alone)).all())
    out["prod2"] = opened(prod).tolist()
    out["prod2_alone"] = opened(prod_alone).tolist()
    out["prod5"] = opened(prod5).tolist()
    out["expect2"] = (a * b * b).tolist()
    out["expect5"] = (a * b ** long_side).tolist()
    return out


@pytest.mark.parametrize("pool_name, circuit_rounds", [("pool2", 3), ("pool3_rss", 4)], ids=["2pc", "3rss"])
def test_side_protocol_rides_in_the_circuit_rounds(request, pool_name, circuit_rounds):
    long_side = circuit_rounds + 2
    r = request.getfixturevalue(pool_name).run(party_alongside, long_side)[0]
    assert r["same_words"]
    assert r["prod2"] == r["prod2_alone"] == r["expect2"]
    assert r["prod5"] == r["expect5"]
    msb_rounds, msb_bytes = r["msb"]
    side_rounds, side_bytes = r["side2"]
    assert side_rounds == 2 and msb_rounds == circuit_rounds
    # the side's 2 rounds ride in the circuit's: rounds of the longer, bytes of both
    assert r["both2"] == (msb_rounds, msb_bytes + side_bytes)
    # a longer side: the circuit's rounds carry some, the other 2 are paid after it
    assert r["both5"][0] == long_side


def party_diverged():
    from crypten_lite.mpc import protocol
    from crypten_lite.mpc.parallel import alongside
    from crypten_lite.session import current
    n = 8 if current().rank == 0 else 9          # party 1's side protocol sends another size
    x = torch.zeros(n, dtype=torch.int64)
    w = torch.zeros(32, dtype=torch.int64)

    def side():
        parts = yield x
        return parts

    alongside(lambda: protocol.msb_low(w, 16), side())


def test_a_diverged_side_protocol_is_refused(pool2):
    with pytest.raises(PartyFailure, match="programs diverged"):
        pool2.run(party_diverged)


def party_diverged_rss():
    from crypten_lite.mpc import protocol
    from crypten_lite.mpc.parallel import alongside
    from crypten_lite.session import current
    rank = current().rank
    n = 9 if rank == 1 else 8                     # party 1's side protocol sends another size
    w = crypten_lite.cryptensor(torch.zeros(32, dtype=torch.int64), src=0, precision=0).share

    def side():
        got = yield ({(rank + 2) % 3: torch.zeros(n, dtype=torch.int64)}, {(rank + 1) % 3: 8})
        return got

    alongside(lambda: protocol.msb_low(w, 16), side())


def test_a_diverged_side_protocol_is_refused_under_rss(pool3_rss):
    with pytest.raises(PartyFailure, match="programs diverged"):
        pool3_rss.run(party_diverged_rss)
