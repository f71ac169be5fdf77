"""LeNet batch 1's five HE weight triples per inference under provider pairwise, with the
peer's weight-mask ciphertexts kept across inferences (provider/he_kept.py) against the same
triples made as any triple (each party's fresh A encrypted and sent, the peer's B as
plaintext). Two in-process parties on two threads (no gRPC, one process): CPU seconds of
both parties together per inference (TenSEAL holds the GIL inside SEAL calls, so the two
threads mostly take turns: the CPU figure is the one to compare), wall seconds, bytes both
parties sent; the first inference (keys, the kept B) is not timed. Every triple is checked
(C = op(A, B) in Z_2^64 against torch).

    timeout 600 python benchmarks/pairwise_kept.py --repeat 5

One JSON line per mode (kept, as before), medians of --repeat inferences.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

CONV = (1, 1, 0, 0, 1, 1, 1)           # stride 1, padding 0, dilation 1, groups 1
LENET = [("conv2d", (1, 1, 28, 28), (6, 1, 5, 5), CONV), ("conv2d", (1, 6, 12, 12), (16, 6, 5, 5), CONV),
         ("matmul", (1, 256), (256, 120), ()), ("matmul", (1, 120), (120, 84), ()),
         ("matmul", (1, 84), (84, 10), ())]


def _run_both(fns, timeout: float = 300.0) -> list:
    import threading
    out: list = [None, None]
    errors: list = []

    def run(i):
        try:
            out[i] = fns[i]()
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)
    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if errors or any(t.is_alive() for t in threads):
        raise RuntimeError(f"a party failed: {errors}")
    return out


def measure(kept: bool, repeat: int) -> dict:
    from crypten_lite.comm.inprocess import InProcessCommunicator, InProcessHub
    from crypten_lite.config import Config
    from crypten_lite.provider import he_kept
    from crypten_lite.provider.correlations import TRIPLE_OPS
    from crypten_lite.provider.pairwise import PairwiseProvider
    hub = InProcessHub(2, timeout=300.0)
    seed = os.urandom(32)
    comms = [InProcessCommunicator(hub, r) for r in range(2)]
    for r, c in enumerate(comms):
        c.pair_seeds = {1 - r: seed}
    cfg = [Config(rank=r, world_size=2, provider="pairwise", session="kept-bench") for r in range(2)]
    ps = _run_both([lambda r=r: PairwiseProvider(cfg[r], comms[r]) for r in range(2)])
    original = he_kept.cross
    if not kept:
        he_kept.cross = lambda *args, **kwargs: None
    try:
        masks = []
        for op, xs, ws, p in LENET:
            got = _run_both([lambda q=q: q.get("weight_mask", [ws]).corrected() for q in ps])
            masks.append((ps[0].counter - 1, got[0][0] + got[1][0]))

        def inference():
            for (op, xs, ws, p), (counter, b) in zip(LENET, masks):
                got = _run_both([lambda q=q: q.get("weight_triple", [xs, ws], op, (counter, *p)).corrected()
                                 for q in ps])
                a, c = got[0][0] + got[1][0], got[0][1] + got[1][1]
                if not torch.equal(c, TRIPLE_OPS[op](a, b, p)):
                    raise RuntimeError(f"wrong weight triple for {op} {xs} x {ws}")
        inference()                         # keys and (kept) the peer's B: not timed
        cpu, wall, sent = [], [], []
        for _ in range(repeat):
            before = sum(q.stats["pairwise_bytes_sent"] for q in ps)
            c, w = time.process_time(), time.perf_counter()
            inference()
            cpu.append(time.process_time() - c)
            wall.append(time.perf_counter() - w)
            sent.append(sum(q.stats["pairwise_bytes_sent"] for q in ps) - before)
    finally:
        he_kept.cross = original
        for q in ps:
            q.close()
    return {"lenet_b1_weight_triples": "kept B" if kept else "as any triple",
            "cpu_s_both_parties": round(statistics.median(cpu), 3),
            "wall_s": round(statistics.median(wall), 3),
            "mb_sent_both_parties": round(statistics.median(sent) / 1e6, 2),
            "repeat": repeat, "load_average_1min": round(os.getloadavg()[0], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("CRYPTEN_LITE_HE_THREADS", "1")
    for kept in (True, False):
        print(json.dumps(measure(kept, args.repeat)), flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
