"""Where provider pairwise's offline phase goes, per correlation kind: a workload's plan is
recorded, then prefetched (timed); each party's `PairwiseProvider.by_kind` gives, per kind
(and op), the correlations made, the bytes both ways and the seconds. One JSON line per
kind (rank 0's view; both parties take part in every exchange), plus a total line.

    timeout 900 python benchmarks/pairwise_breakdown.py --workload lenet_b1
    timeout 900 python benchmarks/pairwise_breakdown.py --workload relu --n 65536
    timeout 1800 python benchmarks/pairwise_breakdown.py --workload lenet_b64
"""

from __future__ import annotations

import argparse
import json
import os
import time


def _run(workload: str, n: int) -> dict:
    import torch

    import crypten_lite
    from crypten_lite import bench, comm, nn
    from crypten_lite.mpc import offline
    from crypten_lite.session import current
    if workload == "relu":
        x = crypten_lite.cryptensor(bench._data(7, n, scale=10), src=0)
        program = x.relu
    else:
        batch = 64 if workload == "lenet_b64" else 1
        model = bench._lenet().eval()
        images = bench._data(11, batch, 1, 28, 28)
        private = nn.from_pytorch(model, torch.zeros(1, 1, 28, 28), fold_batch_norm=True)
        private.encrypt(src=0)
        private.eval()
        x = crypten_lite.cryptensor(images if comm.get().rank == 1 else None, src=1)

        def program():
            with torch.no_grad():
                return private(x)
    with offline.record() as plan:
        program()
    provider = current().provider
    provider.by_kind.clear()
    start = time.perf_counter()
    offline.prefetch(plan)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "by_kind": {k: list(v) for k, v in provider.by_kind.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=["lenet_b1", "lenet_b64", "relu"], default="lenet_b1")
    parser.add_argument("--n", type=int, default=65536, help="relu: elements")
    parser.add_argument("--out", help="append the lines to this file (docs/pairwise_breakdown.jsonl feeds "
                        "docs/protocols.md's table: benchmarks/pairwise_tables.py)")
    args = parser.parse_args()
    from crypten_lite.mpc import PartyPool
    with PartyPool(2, provider="pairwise", timeout=1800) as pool:
        got = pool.run(_run, args.workload, args.n)[0]
    name = args.workload if args.workload != "relu" else f"relu_{args.n}"
    load = round(os.getloadavg()[0], 1)
    lines = [{"workload": name, "kind": kind, "correlations": count, "mb_both_ways": round(nbytes / 1e6, 1),
              "seconds": round(seconds, 2)}
             for kind, (count, nbytes, seconds) in sorted(got["by_kind"].items(), key=lambda kv: -kv[1][2])]
    lines.append({"workload": name, "kind": "total (prefetch)", "seconds": round(got["seconds"], 2),
                  "load_average_1min": load, "date": time.strftime("%Y-%m-%d")})
    for line in lines:
        print(json.dumps(line))
    if args.out:
        with open(args.out, "a") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)


if __name__ == "__main__":
    main()
