"""Provider pairwise against the dealer on small workloads, offline and online timed apart:
each party records the run, prefetches the plan (the offline phase: with pairwise the two
parties make every correlation with homomorphic encryption and oblivious transfer) and then
runs it again (online).
Prints one JSON line per (provider, workload): offline and online seconds (the slower party),
both parties' offline bytes (pairwise messages) and online bytes, rounds, max error.

    timeout 1500 python benchmarks/pairwise_small.py > docs/pairwise_small.jsonl
"""
import json
import os
import time

import torch

from crypten_lite.mpc import PartyPool


def work(name):
    import crypten_lite
    from crypten_lite.mpc import offline
    from crypten_lite.session import current
    from crypten_lite import comm
    g = torch.Generator().manual_seed(0)  # benchmark inputs only
    if name == "mul_65536":
        a, b = torch.randn(65536, generator=g), torch.randn(65536, generator=g)
        fn = lambda x, y: x * y
    elif name == "matmul_64":
        a, b = torch.randn(64, 64, generator=g), torch.randn(64, 64, generator=g)
        fn = lambda x, y: x @ y
    else:
        a, b = torch.randn(4096, generator=g), torch.randn(4096, generator=g)
        fn = lambda x, y: (x + y).relu()
    x, y = crypten_lite.cryptensor(a, src=0), crypten_lite.cryptensor(b, src=1)
    p = current().provider; c = comm.get()
    with offline.record() as plan:
        fn(x, y).get_plain_text()
    s0 = dict(p.stats); t0 = time.perf_counter()
    offline.prefetch(plan); c.barrier()
    off = time.perf_counter() - t0
    s1 = dict(p.stats)
    c.reset_communication_stats(); t0 = time.perf_counter()
    out = fn(x, y).get_plain_text()
    on = time.perf_counter() - t0
    st = c.get_communication_stats()
    return {"offline_s": off, "online_s": on, "online_bytes_sent": st["bytes_sent"], "rounds": st["rounds"],
            "offline_bytes_sent": s1.get("pairwise_bytes_sent", 0) - s0.get("pairwise_bytes_sent", 0),
            "err": float((out - fn(a, b)).abs().max())}


def main() -> None:
    for provider in ("pairwise", "dealer"):
        with PartyPool(2, provider=provider, timeout=900) as pool:
            for name in ("mul_65536", "matmul_64", "relu_4096"):
                r = pool.run(work, name)
                print(json.dumps({"provider": provider, "workload": name,
                                  "load": round(os.getloadavg()[0], 1),
                                  "offline_s": max(x["offline_s"] for x in r),
                                  "online_s": max(x["online_s"] for x in r),
                                  "offline_bytes_both": sum(x["offline_bytes_sent"] for x in r),
                                  "online_bytes_both": sum(x["online_bytes_sent"] for x in r),
                                  "rounds": r[0]["rounds"], "max_error": r[0]["err"]}), flush=True)


if __name__ == "__main__":
    main()
