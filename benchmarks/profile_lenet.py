"""Where LeNet batch 1's end-to-end time goes, per party: offline phase, run, CPU by layer.

Two real party processes and the dealer process (PartyPool, gRPC) load LeNet (weights secret
on party 0, the image secret on party 1), record the correlation plan of one inference (after
a first one, which also masks the fixed weights), then run --n inferences, each with its own
offline phase (`offline.prefetch(plan)`: the plan to the dealer in one exchange before the
first op, which returns its first chunk of corrections; the rest are pulled in the run) and the forward with its result revealed, as `crypten-lite
bench --only lenet_b1` does. For each party it prints:

- wall seconds of the offline phase and of the run (medians), and the run's rounds;
- the offline phase's parts (medians, ms): `derive` (this party's seeded components of the
  plan's first requests, AES: provider._derive_ahead), `plans` (the parties' check that
  their plans agree: one all-gather, which waits for the slower party), `dealer` (rank 0:
  waiting for the dealer's answer to the plan, with chunk 0's corrections, which it computes
  then: wait_prefetched; the later chunks are computed and pulled during the run);
- the main thread's CPU time in the run (time.thread_time) and the whole process's
  (time.process_time: the rest is gRPC's threads sending and receiving);
- the main thread's CPU in the run by layer, from cProfile on the thread's CPU clock (so
  waits for the peer count nothing) over --n more inferences: each function's own time
  summed per part of the library (comm, binary circuits, arithmetic, provider, nn and
  functions, torch's operators, grpc, Python's own; numpy's operators, called as Python
  operators, count in their caller's part). cProfile adds its own cost to every Python
  call, so the shares are indicative; the times above are measured without it.

    python benchmarks/profile_lenet.py [--n 20] [--json out.jsonl]

Wall seconds depend on the load of the machine (the line ends with the 1-minute load
average); the CPU times and the rounds much less.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from crypten_lite.mpc.launcher import PartyPool

# LeNet b1's private model and plan (shared with profile_lenet_calls.py and dealer_plan_cpu.py)
LENET_MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "profile_lenet_model.py")

# Parts of the main thread's CPU: the first prefix that a function's file contains wins.
PARTS = [("comm (framing, mailbox, exchange)", ("crypten_lite/comm/",)),
         ("binary circuits (comparisons: MSB, max)", ("mpc/binary.py", "mpc/circuits.py", "mpc/convert.py",
                                                      "mpc/parallel.py", "mpc/protocol.py")),
         ("arithmetic (products, openings, truncation)", ("crypten_lite/mpc/",)),
         ("provider (correlations, PRG)", ("crypten_lite/provider/", "crypten_lite/random.py")),
         ("nn, functions, cryptensor", ("crypten_lite/",)),
         ("grpc (Python side)", ("grpc/",)),
         ("torch (Python side)", ("torch/",))]


def _part(filename: str, name: str) -> str:
    if filename == "~":  # a builtin: torch's and numpy's operators, Python's own
        if "torch" in name or "Tensor" in name:
            return "torch operators"
        if "lock" in name or "queue" in name.lower():
            return "locks and queues"
        return "Python builtins"
    path = filename.replace(os.sep, "/")
    for part, prefixes in PARTS:
        if any(p in path for p in prefixes):
            return part
    return "other Python"


def _party(n: int) -> dict:
    import cProfile
    import pstats

    import runpy

    from crypten_lite.mpc import offline
    from crypten_lite.session import current
    lenet_b1 = runpy.run_path(LENET_MODEL)  # by path: a party process cannot import benchmarks/
    setup = lenet_b1["private_lenet_b1"]()   # its first inference masks the fixed weights
    c, private, x, want = setup["comm"], setup["private"], setup["x"], setup["want"]
    plan = lenet_b1["recorded_plan"](setup)
    parts_ms: dict[str, list[float]] = {}
    provider = current().provider

    def timed(name: str, fn):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                parts_ms.setdefault(name, []).append((time.perf_counter() - start) * 1e3)
        return run
    provider._derive_ahead = timed("derive", provider._derive_ahead)
    provider.wait_prefetched = timed("dealer", provider.wait_prefetched)
    offline._check_plans = timed("plans", offline._check_plans)
    profile = cProfile.Profile(time.thread_time)
    rows = []
    for i in range(2 * n + 1):  # a warm-up, n timed, then n profiled (shares only)
        profiled = i > n
        c.barrier()
        start = time.perf_counter()
        offline.prefetch(plan)
        offline_s = time.perf_counter() - start
        c.reset_communication_stats()
        wall, cpu, proc = time.perf_counter(), time.thread_time(), time.process_time()
        if profiled:
            profile.enable()
        y = private(x).get_plain_text()
        if profiled:
            profile.disable()
            continue
        rows.append((offline_s, time.perf_counter() - wall, time.thread_time() - cpu,
                     time.process_time() - proc, c.get_communication_stats()["rounds"]))
    rows = rows[1:]
    offline_parts = {k: round(statistics.median(v[1:n + 1]), 2) for k, v in parts_ms.items()}
    parts: dict[str, float] = {}
    for (filename, _, name), (_, _, own, _, _) in pstats.Stats(profile).stats.items():
        part = _part(filename, name)
        parts[part] = parts.get(part, 0.0) + own
    total = sum(parts.values()) or 1.0
    med = lambda i: statistics.median(r[i] for r in rows)  # noqa: E731
    return {"rank": c.rank, "offline_s": med(0), "run_s": med(1), "end_to_end_s": statistics.median(
                r[0] + r[1] for r in rows),
            "offline_parts_ms": offline_parts,
            "main_thread_cpu_s": med(2), "process_cpu_s": med(3), "rounds": rows[-1][4],
            "max_error": float((y - want).abs().max()),
            "main_cpu_share": {k: round(v / total, 3) for k, v in sorted(parts.items(), key=lambda kv: -kv[1])}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20, help="inferences measured (after a warm-up)")
    parser.add_argument("--json", default="", help="append one JSON line per party to this file")
    args = parser.parse_args()
    if args.n < 1:
        parser.error("--n must be at least 1")
    with PartyPool(2, timeout=300) as pool:
        parties = pool.run(_party, args.n)
    load = round(os.getloadavg()[0], 2)
    for p in parties:
        p.update(n=args.n, load_average_1min=load, cpus=os.cpu_count())
        print(f"party {p['rank']}: offline {p['offline_s'] * 1e3:.1f} ms + run {p['run_s'] * 1e3:.1f} ms "
              f"(end to end {p['end_to_end_s'] * 1e3:.1f} ms, {p['rounds']} rounds); run CPU: main thread "
              f"{p['main_thread_cpu_s'] * 1e3:.1f} ms, process {p['process_cpu_s'] * 1e3:.1f} ms; "
              f"max error {p['max_error']:.2g}")
        print("    offline: " + ", ".join(f"{k} {v:.1f} ms" for k, v in p["offline_parts_ms"].items()))
        for part, share in p["main_cpu_share"].items():
            print(f"    {part:45} {share:6.1%}")
    print(f"(medians of {args.n} inferences; 1-minute load average {load} on {os.cpu_count()} cpus)")
    if args.json:
        with open(args.json, "a") as f:
            for p in parties:
                f.write(json.dumps(p) + "\n")
    for p in parties:
        print(json.dumps(p))
    return 0


if __name__ == "__main__":
    sys.exit(main())
