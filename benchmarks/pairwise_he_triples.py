"""LeNet's HE triples under provider pairwise, two parties in one process (threads, the
in-process transport, no gRPC): conv1 [1,1,28,28]x[6,1,5,5], conv2 [1,6,12,12]x[16,6,5,5]
and fc1 [1,256]x[256,120], each checked against its relation. Prints the offline bytes (both
ways, as rank 0 counts them) and seconds of the three triples together, after a warm-up
product that moves the public keys:

    timeout 600 python benchmarks/pairwise_he_triples.py
"""

from __future__ import annotations

import json
import os
import threading
import time

import torch

from crypten_lite.comm.inprocess import InProcessCommunicator, InProcessHub
from crypten_lite.config import Config
from crypten_lite.provider.pairwise import PairwiseProvider

REQUESTS = [("conv2d", [(1, 1, 28, 28), (6, 1, 5, 5)], (1, 1, 0, 0, 1, 1, 1)),
            ("conv2d", [(1, 6, 12, 12), (16, 6, 5, 5)], (1, 1, 0, 0, 1, 1, 1)),
            ("matmul", [(1, 256), (256, 120)], ())]


def _both(fns):
    out = [None, None]

    def run(r):
        out[r] = fns[r]()
    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
        if t.is_alive():
            raise RuntimeError("a party hung")
    return out


def main() -> None:
    hub = InProcessHub(2, timeout=600.0)
    seed = os.urandom(32)
    comms = [InProcessCommunicator(hub, r) for r in range(2)]
    for r, c in enumerate(comms):
        c.pair_seeds = {1 - r: seed}
    cfg = [Config(rank=r, world_size=2, provider="pairwise", session="he-triples") for r in range(2)]
    providers = _both([lambda r=r: PairwiseProvider(cfg[r], comms[r]) for r in range(2)])

    def run(p):
        p.get("triple", [(1,), (1,)], "mul").corrected()
        used = p.stats["pairwise_bytes_sent"] + p.stats["pairwise_bytes_received"]
        start = time.perf_counter()
        got = [[t.clone() for t in p.get("triple", shapes, op, params).corrected()]
               for op, shapes, params in REQUESTS]
        seconds = time.perf_counter() - start
        return got, p.stats["pairwise_bytes_sent"] + p.stats["pairwise_bytes_received"] - used, seconds
    (g0, nbytes, seconds), (g1, _, _) = _both([lambda p=p: run(p) for p in providers])
    for (op, _, params), a, b in zip(REQUESTS, g0, g1):
        x, y, z = (u + v for u, v in zip(a, b))
        want = (torch.nn.functional.conv2d(x, y) if op == "conv2d" else x @ y)
        if not torch.equal(z, want):
            raise SystemExit(f"{op}: the triple does not hold")
    print(json.dumps({"triples": "lenet conv1+conv2+fc1", "bytes_both_ways": nbytes,
                      "seconds": round(seconds, 2), "load_average_1min": round(os.getloadavg()[0], 1)}))


if __name__ == "__main__":
    main()
