"""bench's lenet_b1_served: a loaded model's later queries (the model encrypted and its weight
masks drawn once per party process), under the dealer and under pairwise, with the online cost
of every query exact and the same for both providers (nothing above the provider changes)."""

from __future__ import annotations

import pytest

from crypten_lite import bench
from tests.conftest import get_pool

SERVED = {"rounds": 27, "bytes_sent": 261528}   # no opening of the weights' masked values
FRESH_BYTES = 615048                             # lenet_b1: a fresh model opens them


@pytest.mark.parametrize("provider", ["dealer", "pairwise"])
def test_served_queries_reuse_the_loaded_model(provider):
    pool = get_pool(2, provider=provider)
    first = pool.run(bench.lenet_b1_served)      # loads the model, a first forward, records
    later = [pool.run(bench.lenet_b1_served) for _ in range(2)]   # prefetched queries
    for r in [first] + later:
        assert [p["rounds"] for p in r] == [SERVED["rounds"]] * 2
        assert [p["bytes_sent"] for p in r] == [SERVED["bytes_sent"]] * 2
        assert SERVED["bytes_sent"] < FRESH_BYTES
        assert r[0]["max_error"] <= 1e-2
    for r in later:
        # every correlation of a later query came in its offline phase: none fetched online
        # (the dealer sends party 1's only as seeds: its offline bytes may be 0)
        assert all(p["dealer_bytes"] == 0 for p in r) and r[0]["offline_dealer_bytes"] > 0
        if provider == "pairwise":   # its offline messages to the other party count as sent
            assert all(p["offline_bytes_sent"] > 100_000 for p in r)
    if provider == "dealer":   # the same plan, the same correlation bytes (pairwise's silent
        # OT pools send their trees where their steps fall, so its bytes move by a step)
        assert later[0][0]["offline_dealer_bytes"] == later[1][0]["offline_dealer_bytes"]


def test_pairwise_rows_name_the_ot_path_the_parties_ran(monkeypatch):
    """A pairwise bench row says which OT loops ran (native kernels or numpy); the numpy
    path forced by CRYPTEN_LITE_NATIVE=0 is named so (the launcher passes it to the parties)."""
    from crypten_lite import _native
    monkeypatch.setenv("CRYPTEN_LITE_NATIVE", "0")
    row = bench.run(["mul_4"], 2, "pairwise", 1)[0]
    assert row["ot_kernel"] == _native.describe() == "numpy (CRYPTEN_LITE_NATIVE=0)"
    assert "ot_kernel" not in bench.run(["mul_4"], 2, "dealer", 1)[0]
