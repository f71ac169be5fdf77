"""One HE matrix-product triple under provider pairwise, sliced to a working-set budget by the
old fixed rule (the batch, then the larger output dimension) or by pairwise_slices' search,
back to back in one session: bytes both ways (deterministic), offline messages, each
party's CPU seconds and peak resident growth, wall seconds (load-dependent). One JSON line
per run.

    timeout 900 python benchmarks/pairwise_matmul_slices.py
    timeout 1800 python benchmarks/pairwise_matmul_slices.py --m 128 --runs old:128,new:128,new:512

(--m/--k/--n: BERT-base's first FFN product at seq m is [m, 768] x [768, 3072]; --runs:
rule:budget_MB pairs, rule old or new.)
"""

from __future__ import annotations

import argparse
import json
import os
import time


def _old_rule(shape, cost, budget, memo):
    """The rule pairwise_slices.best_split replaced (for comparison only)."""
    b, m, k, n = shape
    if max(b, m, n) == 1 or cost(*shape) <= budget:
        return cost(*shape), None
    return 0, (0 if b > 1 else (3 if n >= m else 1))


def _party(shapes: list, budget_mb: float, rule: str) -> dict:
    from crypten_lite import bench
    from crypten_lite.mpc import offline
    from crypten_lite.provider import pairwise_slices
    from crypten_lite.session import current
    p = current().provider
    saved, chunk = pairwise_slices.best_split, p._chunk
    if rule == "old":
        pairwise_slices.best_split = _old_rule
    p.set_chunk_bytes(int(budget_mb * (1 << 20)))
    offline._release_free_heap()
    bench._reset_peak_memory()
    base = bench._peak_memory_bytes()
    moved = p.stats["pairwise_bytes_sent"] + p.stats["pairwise_bytes_received"]
    messages = p._seq_out
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        p.get("triple", shapes, "matmul", ())
    finally:
        pairwise_slices.best_split = saved
        p.set_chunk_bytes(chunk)
    return {"seconds": round(time.perf_counter() - wall, 2), "cpu_seconds": round(time.process_time() - cpu, 2),
            "mb_both_ways": round((p.stats["pairwise_bytes_sent"] + p.stats["pairwise_bytes_received"] - moved) / 1e6, 1),
            "messages_sent": p._seq_out - messages,
            "peak_growth_mb": round((bench._peak_memory_bytes() - base) / 2 ** 20)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=32)
    parser.add_argument("--k", type=int, default=768)
    parser.add_argument("--n", type=int, default=3072)
    parser.add_argument("--runs", default="old:128,new:128")
    parser.add_argument("--out", help="append the lines to this file")
    args = parser.parse_args()
    from crypten_lite.mpc import PartyPool
    shapes = [[1, args.m, args.k], [args.k, args.n]]
    with PartyPool(2, provider="pairwise", timeout=1800) as pool:
        for run in args.runs.split(","):
            rule, budget = run.split(":")
            if rule not in ("old", "new"):
                raise SystemExit(f"--runs {run}: rule old or new")
            got = pool.run(_party, shapes, float(budget), rule)
            line = {"shapes": shapes, "rule": rule, "budget_mb": float(budget), "mb_both_ways": got[0]["mb_both_ways"],
                    "cpu_seconds": [g["cpu_seconds"] for g in got], "seconds": got[0]["seconds"],
                    "peak_growth_mb": [g["peak_growth_mb"] for g in got], "messages_sent": [g["messages_sent"] for g in got],
                    "load_average_1min": round(os.getloadavg()[0], 1), "date": time.strftime("%Y-%m-%d")}
            print(json.dumps(line), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
