"""benchmarks/dealer_plan_cpu.py's measurement on a small plan (its figures are in
docs/ARCHITECTURE.md, "LeNet batch 1: where its time goes"): every stage is reported, and a
request's small corrections travel as one tensor."""

from __future__ import annotations

import importlib.util
import pathlib

from crypten_lite.provider import correlations

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "dealer_plan_cpu.py"


def test_dealer_plan_cpu_reports_every_stage():
    spec = importlib.util.spec_from_file_location("dealer_plan_cpu", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    plan = [["triple", "mul", [[6], [6]], []],
            ["binary_monomials", "", [[5]], list(correlations.monomial_params([-1, -1, -1], [3, 5, 6, 7]))],
            ["trunc", "", [[4]], [16]]]
    figures = script.measure(plan, 1)
    for stage in ("rank 0: batch (protobuf, MAC)", "dealer: parse and check",
                  "dealer: corrections (derive, compute, protobuf)",
                  "dealer: chunk 0, before it answers Prepare", "dealer: reply serialized",
                  "rank 0: reply decoded and cut", "party 0: its seeded components",
                  "party 1: its seeded components"):
        assert figures[stage] >= 0, stage
    assert figures["tensors in the reply"] == 3  # the 4 monomials and trunc's 2: one tensor each
