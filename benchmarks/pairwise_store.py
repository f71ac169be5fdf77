"""Provider pairwise: an offline phase made ahead into each party's store, then used.

    python benchmarks/pairwise_store.py [--n 64]

Two parties (PartyPool); the program is a [n, n] @ [n, n] product, a ReLU and an elementwise
product. Prints, per party, the correlations of the plan, the offline exchange (MB) and
seconds of make_store, the store's size on disk, and the seconds of prefetch from the store
and of the online run that uses it (nothing is made online: made_online 0). Wall-clock
figures depend on the machine's load: note `uptime` beside them."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch

from crypten_lite.mpc.launcher import PartyPool


def _program(n: int):
    import crypten_lite
    x = crypten_lite.cryptensor(torch.arange(n * n, dtype=torch.float32).view(n, n) / (n * n), src=0)
    w = crypten_lite.cryptensor(torch.ones(n, n) / n, src=1)
    y = x.matmul(w).relu() * x
    return y.get_plain_text()


def _party(n: int, root: str) -> dict:
    from crypten_lite.mpc import offline
    from crypten_lite.provider.store import resolve_dir
    from crypten_lite.session import current
    with offline.record() as plan:
        _program(n)
    p = current().provider
    b0 = p.stats["pairwise_bytes_sent"] + p.stats["pairwise_bytes_received"]
    t0 = time.perf_counter()
    offline.make_store(plan, f"{root}/store-{{rank}}", key_file=f"{root}/key-{{rank}}")
    make_s = time.perf_counter() - t0
    exchanged = p.stats["pairwise_bytes_sent"] + p.stats["pairwise_bytes_received"] - b0
    d = resolve_dir(f"{root}/store-{{rank}}", current().rank)
    disk = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    made = p.stats["pairwise_made"]
    t0 = time.perf_counter()
    offline.prefetch(plan, store=f"{root}/store-{{rank}}", key_file=f"{root}/key-{{rank}}")
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    _program(n)
    online_s = time.perf_counter() - t0
    return {"rank": current().rank, "correlations": len(plan), "make_s": round(make_s, 2),
            "offline_mb": round(exchanged / 1e6, 2), "store_mb": round(disk / 1e6, 3),
            "load_s": round(load_s, 3), "online_s": round(online_s, 3),
            "made_online": p.stats["pairwise_made"] - made}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=64)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as root, PartyPool(2, provider="pairwise", timeout=900) as pool:
        for row in pool.run(_party, args.n, root):
            print(json.dumps({"n": args.n, "load": os.getloadavg()[0], **row}))


if __name__ == "__main__":
    main()
