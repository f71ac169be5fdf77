"""Offline phase: a recorded plan's corrections are fetched ahead and used by the next run."""

from __future__ import annotations

import torch

import crypten_lite
from crypten_lite.mpc import offline
from crypten_lite.session import current


def planned_runs():
    x = crypten_lite.cryptensor(torch.linspace(-3, 3, 50), src=0)
    y = crypten_lite.cryptensor(torch.linspace(1, 2, 50), src=1)
    with offline.record() as plan:
        first = (x * y).relu().get_plain_text()
    provider = current().provider
    before = provider.stats["prefetched"]
    offline.prefetch(plan)
    second = (x * y).relu().get_plain_text()
    return len(plan), provider.stats["prefetched"] - before, torch.equal(first, second), \
        float((second - (torch.linspace(-3, 3, 50) * torch.linspace(1, 2, 50)).relu()).abs().max())


def test_prefetched_plan_is_used_and_correct(pool):
    results = pool.run(planned_runs)
    n, used, same, err = results[0]
    assert n > 0 and used == n  # rank 0 took every correction from the offline batch
    assert all(r[1] == 0 for r in results[1:])  # other parties never talk to the dealer
    assert err <= 1e-3
