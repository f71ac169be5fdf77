"""CPU time of one serving batch: LeNet, batch 64, the private forward of `crypten-lite serve`
(2 additive parties with the dealer, functions.pooling.fewer_comparisons at --bits, the plan
recorded once and its corrections prefetched before each forward, as the service does).
Prints one JSON line per party: CPU ms per forward of the party process (every thread,
time.process_time), at party 0 the dealer's CPU ms per prefetch + forward (its process's
user+system time from /proc, in clock ticks: 10 ms steps), rounds, bytes and the largest
error against torch's forward; with --profile N, the top self-time functions of N profiled
forwards (cProfile on CPU time; --dump DIR keeps the party{rank}.prof files). CPU time, not
wall time: the machine is shared (its load average is printed beside).

    python benchmarks/profile_serve_forward.py [--batch 64] [--runs 5] [--bits 64] [--profile 0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch


def _dealer_cpu(pid: int) -> float:
    """User+system seconds of process `pid` (the dealer, every thread) from /proc, or nan."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError):
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _party(batch: int, runs: int, bits: int, profiled: int, top: int, dump: str, dealer_pid: int) -> dict:
    import cProfile
    import pstats

    import crypten_lite
    from crypten_lite import comm, nn
    from crypten_lite.cryptensor import no_grad
    from crypten_lite.functions.pooling import fewer_comparisons
    from crypten_lite.mpc import offline
    from crypten_lite.serve.server import build_model

    c = comm.get()
    model, shape = build_model("lenet")
    private = nn.from_pytorch(model if c.rank == 0 else None, (1, *shape), src=0)
    private = private.encrypt(src=0).eval()
    a = torch.randn(batch, *shape, generator=torch.Generator().manual_seed(1))  # insecure-ok: input
    x = crypten_lite.cryptensor(a, src=0)
    with torch.no_grad():
        want = model(a)
    with no_grad(), fewer_comparisons(True, bits):
        with offline.record() as plan:
            private(x)
        cpu, dealer, rounds, sent = [], [], 0, 0
        for _ in range(runs):
            c.barrier()
            d0 = _dealer_cpu(dealer_pid) if c.rank == 0 else 0.0   # the prefetch's work too
            offline.prefetch(plan)
            c.barrier()
            c.reset_communication_stats()
            t0 = time.process_time()
            y = private(x)
            cpu.append(time.process_time() - t0)
            st = c.get_communication_stats()
            rounds, sent = int(st["rounds"]), int(st["bytes_sent"])
            c.barrier()
            if c.rank == 0:
                dealer.append(_dealer_cpu(dealer_pid) - d0)
        err = float((y.get_plain_text() - want).abs().max())
        out = {"rank": c.rank, "batch": batch, "bits": bits,
               "cpu_ms_median": round(statistics.median(cpu) * 1e3, 1),
               "cpu_ms_min": round(min(cpu) * 1e3, 1), "rounds": rounds, "bytes_sent": sent,
               "max_abs_err": err}
        if c.rank == 0:
            out["dealer_cpu_ms_median"] = round(statistics.median(dealer) * 1e3, 1)
        if profiled:
            prof = cProfile.Profile(time.process_time)
            for _ in range(profiled):
                offline.prefetch(plan)
                c.barrier()
                prof.enable()
                private(x)
                prof.disable()
            if dump:
                prof.dump_stats(os.path.join(dump, f"party{c.rank}.prof"))
            stats = pstats.Stats(prof).stats
            rows = sorted(((v[2], v[3], v[1], f"{os.path.basename(k[0])}:{k[1]}:{k[2]}")
                           for k, v in stats.items()), reverse=True)[:top]
            out["top_self"] = [(name, round(t / profiled * 1e3, 2), round(cum / profiled * 1e3, 2),
                                n // profiled) for t, cum, n, name in rows]
    return out


def main() -> int:
    from crypten_lite.mpc.launcher import PartyPool
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--bits", type=int, default=64)
    p.add_argument("--profile", type=int, default=0, help="profiled forwards (0: none)")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--dump", default="", help="folder for party{rank}.prof (cProfile files)")
    args = p.parse_args()
    with PartyPool(2, timeout=600) as pool:
        rows = pool.run(_party, args.batch, args.runs, args.bits, args.profile, args.top, args.dump,
                        pool._procs[0].pid)  # the dealer: started first
    for row in rows:
        top = row.pop("top_self", None)
        row["load_average_1min"] = round(os.getloadavg()[0], 1)
        print(json.dumps(row))
        for name, self_ms, cum_ms, calls in top or ():
            print(f"  {self_ms:8.2f} self {cum_ms:8.2f} cum {calls:6d}x  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
