"""Where a private product's time goes: mul of N elements between 2 real parties, by category.

Two party processes (gRPC, the dealer process) run x * y with its offline phase (the dealer's
corrections fetched before, as `crypten-lite bench` does), then profile --profiled more
products with cProfile and sort each party's time into: waiting for the peer (the transport:
the peer's message in flight, and the peer itself being slower), sending (framing and queuing
the message: the one copy of copy-on-send), PRG (AES-CTR keystream of the shares and the
triple), packing the opening (the differences x - a, y - b written into the one message:
torch.sub, formerly torch.cat), truncation, and the Beaver arithmetic with the rest of the
Python around it. Prints one line per party, milliseconds per product, with the CPU time of
the party process and its minor page faults per product (unprofiled runs), and that CPU time
split by thread (`cpu_threads_ms`: the main thread, which makes the differences, sums the
peer's chunks and recombines, against gRPC's threads; the roles and the kernel's count
they come from are transport_cpu.py's).

    python benchmarks/profile_mul.py [--n 1000000] [--profiled 3]

Seconds depend on the load of the machine; the line records the 1-minute load average.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

import torch

import crypten_lite
from crypten_lite import comm
from crypten_lite.mpc.launcher import PartyPool
from transport_cpu import _split, _thread_times  # benchmarks/, the script's own folder

# cProfile entries (function name, file suffix) per category; whatever is left is "beaver+python".
CATEGORIES = {
    "wait_for_peer": [("<method 'acquire' of '_thread.lock' objects>", "")],
    "send_framing": [("_send", "grpc_comm.py")],
    "prg": [("keystream_ring", "random.py")],
    "pack_opening": [("<built-in method torch.cat>", ""), ("<built-in method torch.sub>", "")],
    "truncation": [("truncate", "truncation.py")],
}


def _party(n: int, profiled: int) -> dict:
    import cProfile
    import pstats

    from crypten_lite.mpc import offline
    c = comm.get()
    g = torch.Generator().manual_seed(1)  # insecure-ok: benchmark inputs, not shares
    a, b = torch.randn(n, generator=g), torch.randn(n, generator=g)  # insecure-ok: inputs
    x, y = crypten_lite.cryptensor(a, src=0), crypten_lite.cryptensor(b, src=1)
    with offline.record() as plan:
        x * y
    online, cpu, faults, splits = [], [], [], []
    for _ in range(5):
        offline.prefetch(plan)
        c.barrier()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        threads = _thread_times()
        start, cpu_start = time.perf_counter(), time.process_time()
        x * y
        online.append(time.perf_counter() - start)
        cpu.append(time.process_time() - cpu_start)
        if threads:
            splits.append(_split(threads, _thread_times(), 1, 1e-3))
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    profile = cProfile.Profile()
    total = 0.0
    for _ in range(profiled):
        offline.prefetch(plan)
        c.barrier()
        start = time.perf_counter()
        profile.enable()
        x * y
        profile.disable()
        total += time.perf_counter() - start
    stats = pstats.Stats(profile).stats
    out = {"rank": c.rank, "online_ms_median": statistics.median(online) * 1e3,
           # CPU time of the party process (every thread) and pages first touched, per
           # product: less sensitive to the machine's load than wall time.
           "cpu_ms_median": statistics.median(cpu) * 1e3,
           "minor_page_faults_median": int(statistics.median(faults)),
           "profiled_ms_per_mul": total / profiled * 1e3}
    if splits:  # each role's median over the unprofiled products
        out["cpu_threads_ms"] = {role: round(statistics.median(s.get(role, 0.0) for s in splits), 2)
                                 for role in sorted({r for s in splits for r in s})}
    used = 0.0
    for category, names in CATEGORIES.items():
        seconds = 0.0
        for (filename, _, function), (_, _, tottime, cumtime, _) in stats.items():
            for name, suffix in names:
                if function == name and filename.endswith(suffix):
                    seconds += cumtime if suffix else tottime
        out[category + "_ms"] = seconds / profiled * 1e3
        used += seconds
    out["beaver_and_python_ms"] = max(0.0, total - used) / profiled * 1e3
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--profiled", type=int, default=3)
    args = parser.parse_args()
    with PartyPool(2, timeout=300) as pool:
        rows = pool.run(_party, args.n, args.profiled)
    for row in rows:
        row.update(n=args.n, load_average_1min=round(os.getloadavg()[0], 1), cpus=os.cpu_count())
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
