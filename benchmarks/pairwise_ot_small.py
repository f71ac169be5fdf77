"""Provider pairwise: the OT correlations of one small inference (LeNet batch 1 by default),
per inference in a warm session. The model's recorded plan is filtered to its OT kinds
(binary_monomials, bit, bit_mul, binary_triple, trunc, trunc_exact) and prefetched
--repeat times in one session (the session's one-time costs, base OTs and the silent pools'
bootstrap, fall in the recording pass, whose correlations are made on demand, so every
prefetch is a warm one). One JSON line per run: the offline messages each party sent, the
MB each party sent, the OTs made, the silent
COTs produced per direction, wall and CPU seconds of rank 0 and 1, per-kind [correlations,
MB both ways, seconds], and the load; a summary line with the medians of the runs.

    timeout 600 python benchmarks/pairwise_ot_small.py
    timeout 900 python benchmarks/pairwise_ot_small.py --batch 64 --repeat 3
    timeout 600 python benchmarks/pairwise_ot_small.py --out docs/pairwise_ot_small.jsonl

The library measured is the one Python imports: PYTHONPATH=<a checkout of another commit>
measures that commit with this same script (--label names it in the lines).

The messages, bytes and OT counts do not depend on load (the COTs produced per direction
depend on where the pools' steps fall, so they alternate between runs); the seconds do.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

OT_KINDS = ("binary_monomials", "bit", "bit_mul", "binary_triple", "trunc", "trunc_exact")


def _party(batch: int, repeat: int) -> list:
    import torch

    import crypten_lite
    from crypten_lite import bench, comm, nn
    from crypten_lite.mpc import offline
    from crypten_lite.session import current
    model = bench._lenet().eval()
    images = bench._data(11, batch, 1, 28, 28)
    private = nn.from_pytorch(model, torch.zeros(1, 1, 28, 28), fold_batch_norm=True)
    private.encrypt(src=0)
    private.eval()
    x = crypten_lite.cryptensor(images if comm.get().rank == 1 else None, src=1)
    with offline.record() as plan:
        with torch.no_grad():
            private(x)
    ot_plan = [e for e in plan if e[0] in OT_KINDS]
    p = current().provider
    runs = []
    for _ in range(repeat):
        p.by_kind.clear()
        made, seq = p._ot.made, p._seq_out
        sent = p.stats["pairwise_bytes_sent"]
        produced = [s.produced if s is not None else 0 for s in p._ot._silent]
        wall, cpu = time.perf_counter(), time.process_time()
        p.prefetch(ot_plan)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        runs.append({
            "messages_sent": p._seq_out - seq,
            "mb_sent": round((p.stats["pairwise_bytes_sent"] - sent) / 1e6, 3),
            "ots": p._ot.made - made,
            "cots_produced": [(s.produced if s is not None else 0) - b
                              for s, b in zip(p._ot._silent, produced)],
            "seconds": round(wall, 3), "cpu_seconds": round(cpu, 3),
            "by_kind": {k: [v[0], round(v[1] / 1e6, 2), round(v[2], 3)] for k, v in p.by_kind.items()}})
    p._drop_prefetched()
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1, help="LeNet batch")
    parser.add_argument("--repeat", type=int, default=5, help="prefetches of the plan, one session")
    parser.add_argument("--out", default="", help="also append the lines to this file")
    parser.add_argument("--label", default="", help="a label for the lines (e.g. the commit measured)")
    args = parser.parse_args()
    from crypten_lite.mpc import PartyPool
    with PartyPool(2, provider="pairwise", timeout=1800) as pool:
        got = pool.run(_party, args.batch, args.repeat)
    load = round(os.getloadavg()[0], 1)
    name = f"lenet_b{args.batch} OT kinds" + (f" ({args.label})" if args.label else "")
    lines = []
    for i, (r0, r1) in enumerate(zip(got[0], got[1])):
        row = {"workload": name, "run": i + 1,
               "messages_sent": [r0["messages_sent"], r1["messages_sent"]],
               "mb_sent": [r0["mb_sent"], r1["mb_sent"]], "ots": r0["ots"],
               "cots_produced": r0["cots_produced"],
               "seconds": [r0["seconds"], r1["seconds"]],
               "cpu_seconds": [r0["cpu_seconds"], r1["cpu_seconds"]], "by_kind": r0["by_kind"]}
        lines.append(row)
    warm = list(lines)
    if warm:
        lines.append({"workload": name, "run": "median", "runs": len(warm),
                      "seconds": statistics.median(max(r["seconds"]) for r in warm),
                      "cpu_seconds": [statistics.median(r["cpu_seconds"][k] for r in warm) for k in (0, 1)],
                      "messages_sent": [statistics.median_low(r["messages_sent"][k] for r in warm)
                                        for k in (0, 1)],
                      "mb_sent_median": [statistics.median(r["mb_sent"][k] for r in warm) for k in (0, 1)],
                      "load_average_1min": load, "date": time.strftime("%Y-%m-%d")})
    text = [json.dumps(line) for line in lines]
    print("\n".join(text))
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n".join(text) + "\n")


if __name__ == "__main__":
    main()
