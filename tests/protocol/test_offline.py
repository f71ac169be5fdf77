"""Offline phase: a recorded plan's corrections are fetched ahead and used by the next run
(additive: the dealer's corrections, bound to request counters; rss: truncation pairs the
three parties make themselves, at the end of this file)."""

from __future__ import annotations

import pytest
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


# --- runs that differ from the plan (issue 11): never a counter requested twice -----------


def _state():
    provider = current().provider
    return {"counter": provider.counter, "diverged": provider.stats["diverged"],
            "prefetched": provider.stats["prefetched"], "requests": provider.stats["requests"]}


def divergent_program():
    """Plan recorded on x.square(), run x * y: the run skips the prefetched range."""
    a, b = torch.linspace(-3, 3, 12), torch.linspace(1, 2, 12)
    x, y = crypten_lite.cryptensor(a, src=0), crypten_lite.cryptensor(b, src=1)
    with offline.record() as plan:
        x.square()
    before = _state()
    offline.prefetch(plan)
    start = current().provider.counter
    got = (x * y).get_plain_text()
    after = _state()
    return {"err": float((got - a * b).abs().max()), "plan": len(plan), "start": start,
            "before": before, "after": after}


def test_divergent_run_continues_past_the_prefetched_range(pool):
    results = pool.run(divergent_program)
    for r in results:
        assert r["err"] <= 1e-3
        assert r["after"]["diverged"] - r["before"]["diverged"] == 1
        assert r["after"]["prefetched"] == r["before"]["prefetched"]  # nothing prefetched was used
        # the product took the first counters after the prefetched range, on every party
        made = r["after"]["requests"] - r["before"]["requests"]
        assert r["after"]["counter"] == r["start"] + r["plan"] + made
    assert len({r["after"]["counter"] for r in results}) == 1


def _mlp(batch: int, w1: torch.Tensor, w2: torch.Tensor):
    g = torch.Generator().manual_seed(batch)  # test data only, never shares
    data = torch.randn(batch, w1.shape[0], generator=g)
    x = crypten_lite.cryptensor(data, src=1)
    h = (x @ crypten_lite.cryptensor(w1, src=0)).relu()
    out = (h @ crypten_lite.cryptensor(w2, src=0)).get_plain_text()
    return float((out - (data @ w1).relu() @ w2).abs().max())


def batch_size_change():
    """An MLP plan recorded at batch 8 and run at batch 3, with chunked elementwise requests
    (as at batch 2048 vs 100 with the default chunk size): correct, and the next prefetched
    run at batch 8 uses every prefetched correction."""
    from crypten_lite.mpc import binary
    g = torch.Generator().manual_seed(0)  # test data only, never shares
    w1, w2 = torch.randn(6, 16, generator=g) / 3, torch.randn(16, 2, generator=g) / 3
    saved = binary.MAX_CORRECTION_BYTES
    binary.MAX_CORRECTION_BYTES = 256  # 32 words per request: the hidden layer is chunked
    try:
        with offline.record() as plan:
            errs = [_mlp(8, w1, w2)]
        offline.prefetch(plan)
        before = _state()
        errs.append(_mlp(3, w1, w2))  # differs from the plan at its first request
        mid = _state()
        offline.prefetch(plan)
        errs.append(_mlp(8, w1, w2))  # follows the plan
        after = _state()
        errs.append(_mlp(3, w1, w2))  # past every plan
    finally:
        binary.MAX_CORRECTION_BYTES = saved
    return {"errs": errs, "plan": len(plan), "before": before, "mid": mid, "after": after,
            "end": _state()}


def test_plan_recorded_at_one_batch_size_run_at_another(pool2):
    results = pool2.run(batch_size_change)
    for r in results:
        assert max(r["errs"]) <= 2e-3, r["errs"]
        assert r["mid"]["diverged"] - r["before"]["diverged"] == 1
        assert r["after"]["diverged"] == r["mid"]["diverged"]
    rank0 = results[0]
    assert rank0["after"]["prefetched"] - rank0["mid"]["prefetched"] == rank0["plan"]
    assert len({r["end"]["counter"] for r in results}) == 1


def prefetch_twice():
    """A second prefetch before the first plan ran starts after the first range."""
    a, b = torch.linspace(-1, 1, 5), torch.linspace(2, 3, 5)
    x, y = crypten_lite.cryptensor(a, src=0), crypten_lite.cryptensor(b, src=1)
    with offline.record() as plan:
        x * y
    start = current().provider.counter
    offline.prefetch(plan)
    offline.prefetch(plan)
    second = current().provider.counter
    err = float(((x * y).get_plain_text() - a * b).abs().max())
    return {"err": err, "start": start, "second": second, "plan": len(plan), **_state()}


def test_second_prefetch_never_reuses_counters(pool2):
    results = pool2.run(prefetch_twice)
    for r in results:
        assert r["err"] <= 1e-3
        assert r["second"] == r["start"] + r["plan"]  # the first range is never requested again
    assert results[0]["prefetched"] >= results[0]["plan"]


def mismatched_plans():
    """Parties passing different plans to prefetch: a clear error on every party."""
    from crypten_lite.errors import ProtocolError
    x = crypten_lite.cryptensor(torch.ones(4), src=0)
    with offline.record() as plan:
        x.square()
    if current().rank == 1:
        plan = [(k, o, tuple((s + 1,) for s, in shapes), p) for k, o, shapes, p in plan]
    try:
        offline.prefetch(plan)
        error = ""
    except ProtocolError as e:
        error = str(e)
    offline.prefetch([])  # both ranges have the same length: every party continues after them
    still = float((x.square().get_plain_text() - 1).abs().max())
    return error, still


def test_parties_with_different_plans_get_a_clear_error(pool2):
    for error, still in pool2.run(mismatched_plans):
        assert "plan" in error and "differs" in error
        assert still <= 1e-3


# --- the same offline API under rss (3 parties, no dealer) --------------------------------
# There the plan lists truncation pairs and random bits ([(bits, n)], bits 0: random bits),
# which prefetch makes now between the parties themselves (crypten_lite.mpc.rss). Pairs are
# not bound to one request counter: any later truncation by the same bit count takes them
# from the stock, in order, each once; a truncation the stock cannot cover runs the helper
# truncation (two rounds, no pair). Every party function below ends with an empty stock (the pool's session is shared
# by the other rss tests, whose exact costs assume none was prefetched).


def _rss_stock(plan) -> dict:
    from crypten_lite.mpc import rss
    return {bits: rss.stocked(bits) for bits in sorted({b for b, _ in plan})}


def _rss_cost(fn):
    from crypten_lite import comm
    c = comm.get()
    c.reset_communication_stats()
    out = fn()
    st = c.get_communication_stats()
    return out, (st["rounds"], st["bytes_sent"])


def rss_planned_runs():
    a, b = torch.linspace(-3, 3, 50), torch.linspace(1, 2, 50)
    x, y = crypten_lite.cryptensor(a, src=0), crypten_lite.cryptensor(b, src=1)
    with offline.record() as plan:
        first, online_cost = _rss_cost(lambda: (x * y).relu().get_plain_text())
    offline.prefetch(plan)
    stocked = _rss_stock(plan)
    second, prefetched_cost = _rss_cost(lambda: (x * y).relu().get_plain_text())
    ref = (a * b).relu()
    return {"plan": [tuple(p) for p in plan], "stocked": stocked, "left": _rss_stock(plan),
            "online": online_cost, "prefetched": prefetched_cost,
            "err": max(float((got - ref).abs().max()) for got in (first, second))}


def test_rss_prefetched_plan_is_used_and_correct(pool3_rss):
    results = pool3_rss.run(rss_planned_runs)
    for r in results:
        # one truncation of 50 products (16 bits); the ReLU (B2A folded into its MSB) and
        # the reveal need no pair
        assert r["plan"] == [(16, 50)] and r["stocked"] == {16: 50} and r["left"] == {16: 0}
        assert r["err"] <= 1e-3
    # rounds: product 2 (no pair stocked: the helper truncation) -> 1 (the pair made
    # offline), ReLU 6, reveal 1; bytes sent per party (the helper, party 50 mod 3 = 2, sends 16 B more
    # per product element without pairs; the ReLU's 50 elements are one chunk of one word:
    # party 2 plays role 1 and sends more)
    assert [r["online"] for r in results] == [(9, 2640), (9, 2640), (9, 3912)]
    assert [r["prefetched"] for r in results] == [(8, 2640), (8, 2640), (8, 3112)]


def rss_runs_that_differ_from_the_plan():
    """Plan recorded on x.square() (12 elements); then x * y (12: takes the pairs), x * y
    again (stock empty: the helper truncation), a plan of 12 run on 5 then on 7 elements."""
    from crypten_lite.mpc import rss
    a, b = torch.linspace(-3, 3, 12), torch.linspace(1, 2, 12)
    x, y = crypten_lite.cryptensor(a, src=0), crypten_lite.cryptensor(b, src=1)
    with offline.record() as plan:
        x.square()
    out = {"plan": [tuple(p) for p in plan], "errs": [], "costs": [], "stock": []}

    def product(n):
        got, cost = _rss_cost(lambda: x[:n] * y[:n])
        out["errs"].append(float((got.get_plain_text() - a[:n] * b[:n]).abs().max()))
        out["costs"].append(cost)
        out["stock"].append(rss.stocked(16))

    offline.prefetch(plan)
    product(12)                       # another op of the same size: the stocked pairs
    product(12)                       # nothing stocked: the helper truncation
    offline.prefetch(plan)
    offline.prefetch(plan)            # two prefetches: 24 pairs, used in order, each once
    out["twice"] = rss.stocked(16)
    for n in (5, 7, 12):
        product(n)
    return out


def test_rss_runs_that_differ_from_the_plan_are_correct(pool3_rss):
    results = pool3_rss.run(rss_runs_that_differ_from_the_plan)
    for r in results:
        assert r["plan"] == [(16, 12)] and r["twice"] == 24
        assert max(r["errs"]) <= 1e-3, r["errs"]
        assert r["stock"] == [0, 0, 19, 12, 0]
        # stocked pairs: one round, 16 B per product; none stocked: the helper truncation,
        # two rounds, 16 B per product (32 B on the helper)
        for i, n in ((0, 12), (2, 5), (3, 7), (4, 12)):
            assert r["costs"][i] == (1, 16 * n), (i, r["costs"][i])
    # 12 elements: the helper is party 12 mod 3 = 0
    assert [r["costs"][1] for r in results] == [(2, 32 * 12), (2, 16 * 12), (2, 16 * 12)]


def rss_mismatched_plans():
    from crypten_lite.errors import ProtocolError
    x = crypten_lite.cryptensor(torch.ones(4), src=0)
    with offline.record() as plan:
        x.square()
    if current().rank == 1:
        plan = [(bits, n + 1) for bits, n in plan]
    try:
        offline.prefetch(plan)
        error = ""
    except ProtocolError as e:
        error = str(e)
    offline.prefetch([])
    from crypten_lite.mpc import rss
    still = float((x.square().get_plain_text() - 1).abs().max())
    return error, still, rss.stocked(16)


def test_rss_parties_with_different_plans_get_a_clear_error(pool3_rss):
    for error, still, left in pool3_rss.run(rss_mismatched_plans):
        assert "plan" in error and "differs" in error
        assert still <= 1e-3 and left == 0      # nothing was made for the refused plan


# --- streamed prefetch (comm/dealer_prefetch.py): chunks pulled a bounded number ahead -----


def streamed_run():
    """A prefetched run whose corrections come in many small chunks, one pulled ahead."""
    from crypten_lite.comm import dealer_prefetch
    dealer_prefetch.PULL_AHEAD = 1
    a, b = torch.linspace(-3, 3, 50), torch.linspace(1, 2, 50)
    x, y = crypten_lite.cryptensor(a, src=0), crypten_lite.cryptensor(b, src=1)

    def program():
        z = x * y
        for _ in range(3):
            z = (z * y).relu()
        return z.get_plain_text()
    with offline.record() as plan:
        first = program()
    provider = current().provider
    before = provider.stats["prefetched"]
    offline.prefetch(plan)
    chunks, most = 0, 0
    if provider._stream is not None:
        puller = provider._stream.puller()
        chunks = puller.chunks
        receive = puller._receive

        def counting(chunk):
            nonlocal most
            receive(chunk)
            most = max(most, len(puller._pending))
        puller._receive = counting
    second = program()
    want = a * b
    for _ in range(3):
        want = (want * b).relu()
    return {"plan": len(plan), "used": provider.stats["prefetched"] - before, "chunks": chunks,
            "in_flight": most, "err": float((second - want).abs().max()),
            "first_err": float((first - want).abs().max())}


def test_streamed_prefetch_uses_every_correction_once_with_bounded_pulls():
    from crypten_lite.mpc import PartyPool
    # chunks of at most max_message_bytes: this plan's corrections come in dozens of chunks
    with PartyPool(2, provider="dealer", timeout=600,
                   env={"CRYPTEN_LITE_MAX_MESSAGE_BYTES": "1024"}) as pool:
        rank0, rank1 = pool.run(streamed_run)
    assert rank0["used"] == rank0["plan"] > 0 and rank1["used"] == 0
    # pulled ahead: PULL_AHEAD (1), and a chunk whose requests the run takes out of order
    assert rank0["chunks"] > 10 and rank0["in_flight"] <= 2
    assert max(r[k] for r in (rank0, rank1) for k in ("err", "first_err")) <= 1e-2


# --- a model's first forward masks its fixed weights: its plan holds only for a fresh copy ---


def model_plans():
    """A converted model, encrypted: the first forward's plan draws the weight masks and
    diverges on the next forward of the same model; a plan recorded on the second forward is
    used whole by the third (what the service does)."""
    from crypten_lite.nn import from_pytorch
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))
    private = from_pytorch(net if current().rank == 0 else None, (1, 8), src=0)
    private.encrypt(src=0)
    private.eval()
    x = torch.randn(4, 8)
    out = {}
    with crypten_lite.no_grad():
        for name in ("first", "second"):
            with offline.record() as plan:
                private(crypten_lite.cryptensor(x, src=0))
            before = _state()
            offline.prefetch(plan)
            y = private(crypten_lite.cryptensor(x, src=0)).get_plain_text()
            out[name] = {"masks": offline.draws_weight_masks(plan), "len": len(plan),
                         "diverged": _state()["diverged"] - before["diverged"],
                         "used": _state()["prefetched"] - before["prefetched"],
                         "err": float((y - net(x).detach()).abs().max())}
    return out


def test_first_forward_plan_draws_masks_and_a_later_plan_is_used_whole(pool2):
    results = pool2.run(model_plans)
    for r in results:
        first, second = r["first"], r["second"]
        assert first["masks"] and first["diverged"] == 1      # replayed on the same model
        # the second forward's plan (recorded after the masks) is used whole by the third
        assert not second["masks"] and second["diverged"] == 0
        assert second["len"] < first["len"]
        assert max(first["err"], second["err"]) <= 1e-3
    assert results[0]["second"]["used"] == results[0]["second"]["len"]  # rank 0 took the batch


# --- the dealer computes a prefetched plan's later chunks during the run (issue 32): a dealer
# that dies after the offline phase is a clear error on both parties, not a hang -------------

_after_offline: dict = {}


def prefetch_then_wait():
    """Record a plan of several chunks and prefetch it: the offline phase ends with chunk 0."""
    x = crypten_lite.cryptensor(torch.linspace(-3, 3, 50), src=0)
    y = crypten_lite.cryptensor(torch.linspace(1, 2, 50), src=1)

    def program():
        z = x * y
        for _ in range(3):
            z = (z * y).relu()
        return z.get_plain_text()
    with offline.record() as plan:
        program()
    offline.prefetch(plan)
    _after_offline["program"] = program
    stream = current().provider._stream
    return stream.puller().chunks if stream is not None else 0


def run_prefetched():
    return _after_offline.pop("program")()


def test_a_dealer_dead_after_the_offline_phase_is_a_clear_error_on_every_party():
    import os
    import signal

    from crypten_lite.mpc import PartyPool
    from crypten_lite.mpc.launcher import PartyFailure
    with PartyPool(2, provider="dealer", timeout=30) as pool:
        chunks = pool.run(prefetch_then_wait)[0]
        assert chunks >= 3  # chunk 2 is pulled during the run, after the kill
        dealer = pool._procs[0]
        os.kill(dealer.pid, signal.SIGKILL)
        dealer.join(10)
        with pytest.raises(PartyFailure) as info:
            pool.run(run_prefetched)
    text = str(info.value)
    # rank 0's pull fails naming the dealer; party 1 stops because of it (not its own timeout)
    assert "CommunicationError" in text and "the dealer at" in text, text
    assert "party 1" in text and "CRYPTEN_LITE_TIMEOUT" not in text, text
