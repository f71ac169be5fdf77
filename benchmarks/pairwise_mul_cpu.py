"""CPU seconds of each party while provider pairwise makes one elementwise product's triple
(mul_1M's offline phase: x * y recorded, then its plan prefetched), two party processes over
gRPC as `crypten-lite bench` runs them. A party's process CPU (its HE threads, the gRPC
transport, framing and MACs) moves far less with the machine's load than the wall clock,
which is why issue 29's elementwise changes were compared with it; the product is checked
against torch's.

    timeout 900 python benchmarks/pairwise_mul_cpu.py --n 1000000

Prints one JSON line: wall and CPU seconds of the prefetch per party, the offline bytes both
ways, the max error of the online product, the 1-minute load average.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def _party(n: int) -> dict:
    import crypten_lite
    from crypten_lite import bench, comm
    from crypten_lite.mpc import offline
    from crypten_lite.session import current
    a, b = bench._data(1, n), bench._data(2, n)
    x, y = crypten_lite.cryptensor(a, src=0), crypten_lite.cryptensor(b, src=1)
    with offline.record() as plan:
        x * y
    stats = current().provider.stats
    moved = stats["pairwise_bytes_sent"] + stats["pairwise_bytes_received"]
    cpu, wall = time.process_time(), time.perf_counter()
    offline.prefetch(plan)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    moved = stats["pairwise_bytes_sent"] + stats["pairwise_bytes_received"] - moved
    err = float((((x * y).get_plain_text()) - a * b).abs().max())
    return {"rank": comm.get().rank, "wall": wall, "cpu": cpu, "bytes": moved, "err": err}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="elements of the product")
    args = parser.parse_args()
    from crypten_lite.mpc import PartyPool
    with PartyPool(2, provider="pairwise", timeout=1800) as pool:
        res = sorted(pool.run(_party, args.n), key=lambda r: r["rank"])
    if max(r["err"] for r in res) > 1e-3:
        raise RuntimeError(f"the product's max error is {max(r['err'] for r in res)}")
    print(json.dumps({"mul": args.n, "wall_s": [round(r["wall"], 2) for r in res],
                      "cpu_s": [round(r["cpu"], 2) for r in res],
                      "offline_mb_both_ways": round(res[0]["bytes"] / 1e6, 1),
                      "max_error": res[0]["err"], "load": round(os.getloadavg()[0], 1)}))


if __name__ == "__main__":
    main()
