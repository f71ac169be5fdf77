"""transport_16MB against raw TCP, alternated: --rounds runs of `crypten-lite bench --only
transport_16MB --only raw_tcp_16MB --repeat R`, each a fresh pair of party processes that
measures both rows in the same run, one after the other.

    python benchmarks/transport_vs_tcp.py [--rounds 5] [--repeat 5] [--json out.jsonl]

Prints each round's medians and ratio with the 1-minute load average before it, then the
median ratio over the rounds (a single run's ratio moves with whatever else the machine is
doing; rounds minutes apart show how much). The figure issue 32 compares with 1.5x is
`times_raw_tcp` of the transport row: transport_16MB's time as a multiple of raw TCP's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys


def one_round(repeat: int) -> dict:
    """One bench run of both rows: their median seconds, the ratio, and the load before it."""
    load = os.getloadavg()[0]
    out = subprocess.run([sys.executable, "-m", "crypten_lite.cli", "bench", "--only", "transport_16MB",
                          "--only", "raw_tcp_16MB", "--repeat", str(repeat)],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    rows = {r["workload"]: r for r in (json.loads(line) for line in out.splitlines() if line.startswith("{"))}
    grpc, tcp = rows["transport_16MB"], rows["raw_tcp_16MB"]
    return {"load_average_1min": round(load, 2), "transport_ms": round(grpc["seconds_median"] * 1e3, 2),
            "raw_tcp_ms": round(tcp["seconds_median"] * 1e3, 2),
            "transport_gb_per_s": round(grpc["gb_per_s"], 3), "raw_tcp_gb_per_s": round(tcp["gb_per_s"], 3),
            "times_raw_tcp": round(grpc["times_raw_tcp"], 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=5, help="bench --repeat of each round")
    parser.add_argument("--json", default="", help="append the rounds and their summary as one JSON line")
    args = parser.parse_args()
    rounds = []
    for i in range(args.rounds):
        r = one_round(args.repeat)
        rounds.append(r)
        print(f"round {i + 1}: load {r['load_average_1min']:5.2f}  transport_16MB {r['transport_ms']:7.2f} ms "
              f"({r['transport_gb_per_s']:.2f} GB/s)  raw_tcp_16MB {r['raw_tcp_ms']:7.2f} ms "
              f"({r['raw_tcp_gb_per_s']:.2f} GB/s)  {r['times_raw_tcp']:.2f}x", flush=True)
    ratios = [r["times_raw_tcp"] for r in rounds]
    summary = {"rounds": rounds, "times_raw_tcp_median": statistics.median(ratios),
               "times_raw_tcp_min": min(ratios), "times_raw_tcp_max": max(ratios), "cpus": os.cpu_count()}
    print(f"transport_16MB / raw_tcp_16MB over {len(rounds)} rounds: median {summary['times_raw_tcp_median']:.2f}x "
          f"(min {min(ratios):.2f}x, max {max(ratios):.2f}x); issue 32's target: 1.5x")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(summary) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
