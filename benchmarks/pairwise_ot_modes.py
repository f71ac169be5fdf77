"""Provider pairwise's comparisons under its two OT extensions, back to back: a ReLU's
offline phase (its recorded plan prefetched) with silent OT (ferret, the default) and with
IKNP (CRYPTEN_LITE_PAIRWISE_OT=iknp). One JSON line per run: the mode, OTs made, bytes of
both parties, wall seconds and each party's CPU seconds (all threads), the load.

    timeout 900 python benchmarks/pairwise_ot_modes.py --n 131072 --out docs/pairwise_ot_modes.jsonl

(docs/protocols.md quotes the lines of docs/pairwise_ot_modes.jsonl; a test checks it.)
"""

from __future__ import annotations

import argparse
import json
import os
import time


def _relu_offline(n: int) -> dict:
    import crypten_lite
    from crypten_lite import bench
    from crypten_lite.mpc import offline
    from crypten_lite.session import current
    x = crypten_lite.cryptensor(bench._data(7, n, scale=10), src=0)
    with offline.record() as plan:
        x.relu()
    provider = current().provider
    before = provider.stats["pairwise_bytes_sent"] + provider.stats["pairwise_bytes_received"]
    made = provider._ot.made
    wall, cpu = time.perf_counter(), time.process_time()
    offline.prefetch(plan)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    after = provider.stats["pairwise_bytes_sent"] + provider.stats["pairwise_bytes_received"]
    return {"mode": provider._ot.mode, "ots": provider._ot.made - made,
            "mb_both_ways": round((after - before) / 1e6, 2), "seconds": round(wall, 2),
            "cpu_seconds": round(cpu, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=131072, help="ReLU elements")
    parser.add_argument("--repeat", type=int, default=1, help="runs per mode, alternating")
    parser.add_argument("--out", default="", help="also write the lines to this file (replaced)")
    args = parser.parse_args()
    from crypten_lite.mpc import PartyPool
    lines = []
    for _ in range(args.repeat):
        for mode in ("ferret", "iknp"):
            with PartyPool(2, provider="pairwise", timeout=1800,
                           env={"CRYPTEN_LITE_PAIRWISE_OT": mode}) as pool:
                got = pool.run(_relu_offline, args.n)
            row = dict(got[0], workload=f"relu_{args.n}",
                       cpu_seconds=[g["cpu_seconds"] for g in got],
                       load_average_1min=round(os.getloadavg()[0], 1))
            lines.append(json.dumps(row))
            print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
