"""The pairwise progress line's time left, by class (pairwise_progress._Progress): each class of
correlation timed at its own measured rate, one not started yet at the phase's rate scaled by
the classes' priors. A fake clock: nothing here depends on timing."""

from __future__ import annotations

import re

import pytest

from crypten_lite.provider import pairwise_progress as pp


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(pp.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(pp._Progress, "TICK", 3600.0)
    monkeypatch.setenv(pp.PROGRESS_ENV, "1")
    return now


def _left(bar, capsys) -> float:
    bar._draw()
    return float(re.findall(r"([0-9.]+) s left", capsys.readouterr().err)[-1])


def test_a_cheap_class_of_many_elements_does_not_inflate_the_time_left(clock, capsys):
    """relu's plan: a few expensive requests (binary_monomials: most of the OT work) and many
    elements of a cheap one (bit_mul). Weighted by elements, the cheap one looked like 3/4 of
    the work and the line said about 10x the real time left; by class and working set it is
    the measured rate times what is left."""
    stats = {"pairwise_bytes_sent": 0, "pairwise_bytes_received": 0}
    weights = [400, 400, 100, 100]              # OT working set: monomials, then bit_mul
    bar = pp._Progress(weights, stats, rank=0, classes=["ot"] * 4)
    clock[0] += 4.0                              # the first request took 4 s
    bar.step(1, 400, [0])
    assert _left(bar, capsys) == pytest.approx(6.0)      # 600 units at 0.01 s a unit
    clock[0] += 4.0
    bar.step(2, 800, [1])
    assert _left(bar, capsys) == pytest.approx(2.0)
    bar.done()


def test_a_class_not_started_is_timed_by_the_priors(clock, capsys):
    stats = {"pairwise_bytes_sent": 0, "pairwise_bytes_received": 0}
    # HE products first (10 operand elements: 200 prior us), then OTs (1e6 bytes: 1500 prior us)
    bar = pp._Progress([10, 1_000_000], stats, rank=0, classes=["he-product", "ot"])
    clock[0] += 2.0
    bar.step(1, 10, [0])                         # 200 prior us took 2 s: 0.01 s a prior us
    assert _left(bar, capsys) == pytest.approx(15.0)     # 1500 prior us of OTs
    bar.current, bar.current_class = 1_000_000, "ot"
    bar.within(0.6)                              # 60% of the OT correlation made (in slices)
    assert _left(bar, capsys) == pytest.approx(6.0)
    bar.done()


def test_without_classes_the_phase_rate(clock, capsys):
    stats = {"pairwise_bytes_sent": 0, "pairwise_bytes_received": 0}
    bar = pp._Progress([10, 30], stats, rank=0)
    clock[0] += 1.0
    bar.step(1, 10)
    assert _left(bar, capsys) == pytest.approx(3.0)
    bar.done()


def _relu_plan(n):
    import crypten_lite
    from crypten_lite import bench
    from crypten_lite.mpc import offline
    with offline.record() as plan:
        crypten_lite.cryptensor(bench._data(7, n, scale=10), src=0).relu()
    return [tuple(e[:4]) for e in plan]


def test_relu_plan_weighs_the_monomials_not_the_many_bit_mul_elements():
    """A relu's plan (recorded, dealer pool): its bit_mul requests have three times the
    elements of its binary_monomials, but about an eighth of the OT work; the weights follow
    the work (by elements, the time left of relu 1M read about 10x too high)."""
    import math

    from crypten_lite.provider.pairwise import _work
    from tests.conftest import get_pool
    plan = get_pool(2).run(_relu_plan, 4096)[0]
    by_kind: dict[str, list[int]] = {}
    for kind, op, shapes, params in plan:
        cls, w = _work(kind, op, shapes, params)
        assert cls == f"ot/{kind}"
        e = by_kind.setdefault(kind, [0, 0])
        e[0] += w
        e[1] += sum(math.prod(tuple(s)) for s in shapes)
    assert set(by_kind) == {"binary_monomials", "bit_mul"}
    assert by_kind["bit_mul"][1] > 2 * by_kind["binary_monomials"][1]     # elements
    assert by_kind["binary_monomials"][0] > 5 * by_kind["bit_mul"][0]     # work
