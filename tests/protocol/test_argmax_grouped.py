"""argmax_grouped (crypten_lite.functions.reductions): the grouped tournament for long vectors
against torch.argmax / torch.max, ties included (torch's rule: the first largest index), at 2
and 3 parties (additive with a dealer) and 3 parties under rss; exact rounds and bytes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import crypten_lite
import crypten_lite.functions as cf
from crypten_lite import comm
from crypten_lite.functions.reductions import _level_rounds, grouped_plan

SIZES = (1, 2, 3, 7, 40, 100)


def _inputs(k: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(k)  # test data only
    a = torch.randint(-3, 3, (4, k), generator=g).double() / 4          # many ties
    a[1] = 1.5                                                           # a whole row of ties
    a[2, -1] = 2.0                                                       # the last one wins alone
    if k > 1:
        a[3, k // 2:] = 2.0                                              # ties across groups
    return a


def grouped_results():
    out = {}
    for k in SIZES:
        a = _inputs(k)
        x = crypten_lite.cryptensor(a, src=0)
        oh = x.argmax(1, one_hot=True, method="grouped")
        out[f"argmax_one_hot_{k}"] = bool(torch.equal(oh.get_plain_text(), F.one_hot(a.argmax(1), k).bool()))
        out[f"argmax_{k}"] = bool(torch.equal(x.argmax(1, method="grouped").get_plain_text(), a.argmax(1)))
        out[f"argmin_{k}"] = bool(torch.equal(x.argmin(0, method="grouped").get_plain_text(), a.argmin(0)))
        v, i = cf.max(x, 1, method="grouped")
        out[f"max_{k}"] = bool(torch.equal(v.get_plain_text().double(), a.max(1).values)
                               and torch.equal(i.get_plain_text(), a.max(1).indices))
        v, i = cf.min(x, 1, method="grouped")
        out[f"min_{k}"] = bool(torch.equal(v.get_plain_text().double(), a.min(1).values)
                               and torch.equal(i.get_plain_text(), a.min(1).indices))
        out[f"flat_{k}"] = bool(torch.equal(x.argmax(method="grouped").get_plain_text(), a.argmax()))
    ints = torch.randint(-1000, 1000, (2, 333), generator=torch.Generator().manual_seed(9))
    ints[1, 100] = ints[1, 300] = 5000                                   # a tie far apart
    xi = crypten_lite.cryptensor(ints, src=1)
    out["int_333"] = bool(torch.equal(xi.argmax(1, method="grouped").get_plain_text(), ints.argmax(1)))
    return out


def grouped_costs():
    c = comm.get()
    x = crypten_lite.cryptensor(torch.zeros(1, 100), src=0)
    out = {}
    for method in ("grouped", "tree"):
        c.reset_communication_stats()
        x.argmax(-1, one_hot=True, method=method)
        st = c.get_communication_stats()
        out[method] = (int(st["rounds"]), int(st["bytes_sent"]))
    return out


def test_plans():
    assert grouped_plan(1) == () and grouped_plan(2) is None and grouped_plan(7) == (7,)
    assert grouped_plan(100) == (5, 20) and grouped_plan(50257) == (5, 17, 592)
    for k in (3, 5, 40, 100, 1000, 50257):
        plan = grouped_plan(k)
        n = k
        for g in plan:
            n = -(-n // g)
        assert n == 1, (k, plan)
    # the vocabulary of GPT-2: 23 rounds between 2 parties, against 16 tree levels of 5
    assert sum(_level_rounds(g) for g in grouped_plan(50257)) == 23


def test_grouped_matches_torch(pool_all):
    for party in pool_all.run(grouped_results):
        assert all(party.values()), [k for k, ok in party.items() if not ok]


# (rounds, bytes sent by party 0) of argmax(one_hot=True) over 100 values, one row
COSTS = {(2, "additive"): {"grouped": (14, 9488), "tree": (35, 10832)},
         (3, "additive"): {"grouped": (16, 31456), "tree": (42, 25744)},
         (3, "rss"): {"grouped": (23, 9768), "tree": (42, 11136)}}


@pytest.mark.parametrize("parties,protocol", list(COSTS))
def test_grouped_costs(parties, protocol):
    from tests.conftest import get_pool
    r = get_pool(parties, protocol=protocol).run(grouped_costs)[0]
    if parties == 2:
        assert r["grouped"][0] == sum(_level_rounds(g) for g in grouped_plan(100)) == 14
        assert r["tree"][0] == 7 * 5
        assert r["grouped"][1] < r["tree"][1]       # the plan never sends more than the tree
    assert r["grouped"][0] < r["tree"][0]
    assert r == COSTS[(parties, protocol)]
