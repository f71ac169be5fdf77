"""CrypTen 0.4.1 (TFP provider) beside `crypten-lite bench`, in one run: mul 1M, matmul 256, matmul 1024.

CrypTen runs from its own virtual environment (`bash benchmarks/peer_envs.sh crypten` prints its
python), never as a dependency of crypten_lite: this script starts that python on a small
program (CRYPTEN_PROGRAM below) that runs two CrypTen parties (crypten.mpc.run_multiprocess,
torch.distributed over loopback) and times each op end to end: from shares of x and y to shares
of the product, its triple made by CrypTen's TFP provider (party 0 deals, no communication)
and its one opening round and truncation included. The crypten_lite side is
`crypten-lite bench` twice in the same run: with its offline phase (online seconds, the dealer's
corrections fetched before) and with --no-offline (end to end: the dealer's corrections fetched
online). Both sides: 2 parties on this machine, median of --repeat runs after a warm-up.

    python benchmarks/vs_crypten.py [--repeat 5] [--json out.jsonl]

Seconds depend on the load of the machine: the rows record the 1-minute load average.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

OPS = {"mul_1M": ("mul", (1_000_000,), (1_000_000,)),
       "matmul_256": ("matmul", (256, 256), (256, 256)),
       "matmul_1024": ("matmul", (1024, 1024), (1024, 1024))}

CRYPTEN_PROGRAM = r'''
import json, statistics, sys, time
import torch
import crypten
import crypten.communicator as comm
from crypten import mpc

OPS = json.loads(sys.argv[1]); REPEAT = int(sys.argv[2]); OUT = sys.argv[3]

@mpc.run_multiprocess(world_size=2)
def main():
    crypten.cfg.mpc.provider = "TFP"
    rows = {}
    g = torch.Generator().manual_seed(1)
    for name, (op, ashape, bshape) in OPS.items():
        a, b = torch.randn(*ashape, generator=g), torch.randn(*bshape, generator=g)
        x, y = crypten.cryptensor(a, src=0), crypten.cryptensor(b, src=1)
        times = []
        for i in range(REPEAT + 1):  # the first is a warm-up
            comm.get().barrier()
            start = time.perf_counter()
            z = x * y if op == "mul" else x.matmul(y)
            seconds = time.perf_counter() - start
            if i:
                times.append(seconds)
        want = a * b if op == "mul" else a @ b
        diff = (z.get_plain_text() - want).abs()
        rows[name] = {"seconds_median": statistics.median(times), "seconds_min": min(times),
                      "seconds_max": max(times), "max_error": float(diff.max()),
                      "elements_off_by_more_than_0.01": int((diff > 0.01).sum()),
                      "elements": diff.numel()}
    if comm.get().get_rank() == 0:
        with open(OUT, "w") as f:
            json.dump(rows, f)

main()
'''


def peer_python(name: str) -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    return subprocess.run(["bash", os.path.join(here, "peer_envs.sh"), name], check=True,
                          capture_output=True, text=True).stdout.strip().splitlines()[-1]


def crypten_rows(repeat: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "crypten.json")
        program = os.path.join(tmp, "crypten_ops.py")
        with open(program, "w") as f:
            f.write(CRYPTEN_PROGRAM)
        subprocess.run([peer_python("crypten"), program, json.dumps(OPS), str(repeat), out],
                       check=True, timeout=1800, cwd=tmp)
        with open(out) as f:
            return json.load(f)


def ours(repeat: int, offline: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.jsonl")
        cmd = [sys.executable, "-m", "crypten_lite.cli", "bench", "--repeat", str(repeat), "--out", out]
        for name in OPS:
            cmd += ["--only", name]
        if not offline:
            cmd.append("--no-offline")
        subprocess.run(cmd, check=True, timeout=1800, stderr=subprocess.DEVNULL)
        with open(out) as f:
            return {r["workload"]: r for r in map(json.loads, f)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", default="", help="append one JSON line per workload to this file")
    args = parser.parse_args()
    online, e2e = ours(args.repeat, True), ours(args.repeat, False)
    peer = crypten_rows(args.repeat)
    load = round(os.getloadavg()[0], 1)
    print(f"{'workload':12} {'ours online s':>13} {'ours dealer s':>13} {'ours e2e s':>10} "
          f"{'CrypTen TFP s':>13} {'e2e ratio':>9}")
    lines = []
    for name in OPS:
        mine, mine_e2e, theirs = online[name], e2e[name], peer[name]
        row = {"workload": name, "parties": 2, "ours_online_s": mine["seconds_median"],
               "ours_offline_s": mine["offline_seconds"], "ours_end_to_end_s": mine_e2e["seconds_median"],
               "ours_max_error": mine_e2e["max_error"], "crypten_tfp_s": theirs["seconds_median"],
               "crypten_tfp_min_s": theirs["seconds_min"], "crypten_max_error": theirs["max_error"],
               "crypten_elements_off_by_more_than_0.01": theirs["elements_off_by_more_than_0.01"],
               "elements": theirs["elements"],
               "end_to_end_ratio": mine_e2e["seconds_median"] / theirs["seconds_median"],
               "repeat": args.repeat, "load_average_1min": load, "cpus": os.cpu_count()}
        lines.append(row)
        print(f"{name:12} {row['ours_online_s']:>13.4f} {row['ours_offline_s']:>13.4f} "
              f"{row['ours_end_to_end_s']:>10.4f} {row['crypten_tfp_s']:>13.4f} {row['end_to_end_ratio']:>9.2f}")
    print(f"(2 parties each; 1-minute load average {load} on {os.cpu_count()} cpus)")
    if args.json:
        with open(args.json, "a") as f:
            for row in lines:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
