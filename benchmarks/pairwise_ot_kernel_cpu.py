"""Provider pairwise's OT kernel alone: thread CPU per 1M OTs of each role, two CorrelatedOT
objects (mode ferret) in one process over in-memory queues (no gRPC, no framing), one thread
each, so each party's figure is its own thread's CPU clock (time.thread_time), which the other
party's work and the machine's load move much less than wall time.

Per repeat, in direction 0 (rank 0 holds the choice bits, rank 1 Delta), warm pools (the base
OTs and the first iteration made before timing):

* ``silent``: SilentCOT.take_parts of --m COTs: the receiver's and the sender's CPU (GGM trees,
  puncturing, the LPN code), and the COT relation M = K ^ b*Delta checked on every output;
* ``random_ot``: CorrelatedOT.random_ot(free=True) of --m OTs (silent COTs plus the
  correlation-robust hash: one per OT for the chooser, two for the other party) and
  prepare(keys, --bits) (the packed pad rows), checked: the chooser's rows equal the other
  party's first rows XOR (choice & second rows).

One JSON line per repeat and a median line (ms per 1M OTs, per role) with the load average:

    python benchmarks/pairwise_ot_kernel_cpu.py
    python benchmarks/pairwise_ot_kernel_cpu.py --repeat 7 --m 1048576 --bits 8

PYTHONPATH=<a checkout of another commit> measures that commit with this same script (the
A/B of an optimisation: alternate the two, a few pairs, and compare the medians).
CRYPTEN_LITE_NATIVE=0 measures the numpy path of this tree (crypten_lite/_native: the native
kernels off).

``--kernels`` instead times each native kernel against the numpy code it replaces on one
thread (thread CPU, best of --repeat, ms): the TCCR hash of 1M blocks, one step's GGM trees
(512 trees of depth 10, level sums), one step's LPN code (524,288 outputs), prepare's
transpose of 1M keys' first byte and IKNP's 128 x 1M transpose; the AES ones with VAES and
with 128-bit AES-NI only where the CPU has VAES.

    python benchmarks/pairwise_ot_kernel_cpu.py --kernels --repeat 7
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import threading
import time

import numpy as np


def _pair():
    from crypten_lite.provider import ot
    boxes = [queue.Queue(), queue.Queue()]

    def make(r):
        o = ot.CorrelatedOT(r, lambda d: boxes[1 - r].put(d),
                            lambda: boxes[r].get(timeout=120), os.urandom, mode="ferret")
        # every step made on the party's own thread, so that its thread CPU clock sees all
        # of it (a step made ahead runs on a thread of its own: the same work, moved)
        o.silent_ahead = False
        return o
    return [make(0), make(1)]


def _both(fns):
    """Run fns[r]() on two threads: (results, thread CPU seconds of each)."""
    res, cpu, err = [None, None], [0.0, 0.0], [None, None]

    def run(r):
        try:
            t = time.thread_time()
            res[r] = fns[r]()
            cpu[r] = time.thread_time() - t
        except BaseException as e:  # noqa: BLE001 - re-raised below
            err[r] = e
    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
        if t.is_alive():
            raise RuntimeError("pairwise_ot_kernel_cpu: a party did not finish within 300 s")
    for e in err:
        if e is not None:
            raise e
    return res, cpu


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t)
    return round(1e3 * best, 2)


def kernels(repeat: int) -> None:
    """Each native kernel against its numpy reference, one thread (ms, best of `repeat`)."""
    from crypten_lite import _native
    from crypten_lite.provider import ferret, ot
    k = _native.kernels()
    if k is None:
        raise SystemExit(f"pairwise_ot_kernel_cpu --kernels: {_native.describe()}")
    rng = np.random.default_rng(7)
    m, g = 1 << 20, ferret.GROUP
    blocks = rng.integers(0, 256, size=(m, 16), dtype=np.uint8)
    out = np.empty((m, 2), dtype=np.uint64)
    os.environ[_native.ENV] = "0"
    ref_hash = ot._Hash()
    del os.environ[_native.ENV]
    rows = ferret._indices(0, g * ferret.LEAVES)
    table = rng.integers(0, 1 << 63, size=(ferret.K, 2), dtype=np.uint64).view(np.complex128).reshape(-1)
    acc = np.zeros((g * ferret.LEAVES, 2), dtype=np.uint64)
    roots = rng.integers(0, 1 << 63, size=(1, g, 2), dtype=np.uint64)

    def ggm_numpy():
        exp, nodes = ferret._Expander(), roots
        for _ in range(ferret.DEPTH):
            nodes = exp(nodes)
            half = nodes.shape[0] // 2
            ferret._fold(nodes[:half]), ferret._fold(nodes[half:])

    def ggm_native():
        nodes = np.empty((ferret.LEAVES, g, 2), dtype=np.uint64)
        nodes[0] = roots[0]
        folds = np.empty((g, 2, 2), dtype=np.uint64)
        for level in range(ferret.DEPTH):
            k.ggm_level(ferret._KEYS[0], ferret._KEYS[1], nodes, 1 << level, g, folds, None,
                        level == ferret.DEPTH - 1)
    iknp = rng.integers(0, 256, size=(128, m // 8), dtype=np.uint8)
    row = {"numpy": {
        "tccr_1M": _best(lambda: ref_hash(blocks, 0, 1, out=out), repeat),
        "ggm_512_trees": _best(ggm_numpy, repeat),
        "lpn_524288": _best(lambda: ferret._encode(acc, table, rows, acc.shape[0]), repeat),
        "transpose_1M_x_1B": _best(lambda: ot._transpose(np.ascontiguousarray(blocks[:, :1])), repeat),
        "transpose_128_x_1M": _best(lambda: ot._transpose(iknp), repeat)}}
    widths = [True, False] if _native.aes() is not None and k.set_wide(True) else [False]
    for wide in widths:
        name = "native_vaes" if wide else "native_aesni"
        if _native.aes() is not None:
            k.set_wide(wide)
        row[name] = {
            "tccr_1M": _best(lambda: k.tccr(ot._FIXED_KEY, blocks, out, 0, 1), repeat)
            if _native.aes() is not None else None,
            "ggm_512_trees": _best(ggm_native, repeat) if _native.aes() is not None else None,
            "lpn_524288": _best(lambda: k.lpn_encode(acc, table, rows, ferret.D), repeat),
            "transpose_1M_x_1B": _best(lambda: ot.transpose(blocks, 1), repeat),
            "transpose_128_x_1M": _best(lambda: ot.transpose(iknp), repeat)}
    if _native.aes() is not None:
        k.set_wide(True)
    print(json.dumps({"kernels_ms": row, "repeat": repeat, "path": _native.describe(),
                      "load_average_1min": round(os.getloadavg()[0], 1)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=1 << 20, help="OTs per measurement (multiple of 8)")
    parser.add_argument("--bits", type=int, default=8, help="prepare: pad bits per OT")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--label", default="")
    parser.add_argument("--kernels", action="store_true",
                        help="time each native kernel against its numpy code instead")
    args = parser.parse_args()
    if args.kernels:
        kernels(args.repeat)
        return
    from crypten_lite.provider import ferret
    p = _pair()
    _both([p[0].setup, p[1].setup])
    _both([lambda r=r: p[r]._silent_pool(0).take_parts(ferret.N) for r in range(2)])   # warm
    delta = p[1]._delta
    per = 1e3 * (1 << 20) / args.m            # seconds -> ms per 1M OTs
    rows = []
    for i in range(args.repeat):
        got, cpu_s = _both([lambda r=r: p[r]._silent_pool(0).take_parts(args.m) for r in range(2)])
        for (bits, mine), (_, theirs) in zip(got[0], got[1]):
            if not np.array_equal(mine, theirs ^ (bits[:, None] * delta[None, :])):
                raise AssertionError("silent COTs: M != K ^ b*Delta")

        def job(r):
            keys = p[r].random_ot(None, args.m, 0, free=True)
            choice = keys.choice
            p[r].prepare(keys, args.bits)
            return keys, choice
        got, cpu_r = _both([lambda r=r: job(r) for r in range(2)])
        (k0, choice), (k1, _) = got
        c = np.packbits(choice, bitorder="little")
        if not np.array_equal(k0.rows[0], k1.rows[0] ^ (c[None, :] & k1.rows[1])):
            raise AssertionError("random_ot + prepare: the chooser's pad rows are not pad_c")
        rows.append({"run": i + 1, "silent_ms_per_1M": [round(per * cpu_s[0], 1), round(per * cpu_s[1], 1)],
                     "random_ot_prepare_ms_per_1M": [round(per * cpu_r[0], 1), round(per * cpu_r[1], 1)]})
        print(json.dumps({"label": args.label, **rows[-1]}), flush=True)
    med = {k: [round(statistics.median(r[k][j] for r in rows), 1) for j in (0, 1)]
           for k in ("silent_ms_per_1M", "random_ot_prepare_ms_per_1M")}
    print(json.dumps({"label": args.label, "run": "median", "roles": ["receiver/chooser", "sender/other"],
                      "m": args.m, "bits": args.bits, **med,
                      "bytes_sent_by_sender": p[1]._silent[0].bytes_sent,
                      "cots_produced": p[1]._silent[0].produced,
                      "load_average_1min": round(os.getloadavg()[0], 1)}))


if __name__ == "__main__":
    main()
