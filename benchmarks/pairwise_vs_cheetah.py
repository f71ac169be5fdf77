"""Provider pairwise (two parties, no dealer) against SPU 0.9.5's CHEETAH, end to end, and
against the dealer provider, on this machine in the same run.

crypten_lite rows come from `crypten_lite.bench.run` (2 parties over gRPC, a recorded
offline phase prefetched before each timed run): end to end = offline seconds + online
seconds; bytes = the online bytes both parties sent + the correlation bytes both received
(from the dealer, or from each other with pairwise). SPU rows come from
benchmarks/spu_cheetah.py in SPU's own venv (bash benchmarks/peer_envs.sh spu).
Writes JSON lines to --out and prints the markdown table of docs/protocols.md.

    timeout 3600 python benchmarks/pairwise_vs_cheetah.py --repeat 1 --out docs/pairwise_vs_cheetah.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

# crypten_lite workload -> SPU workload (benchmarks/spu_cheetah.py), None: not measured there
WORKLOADS = {"mul_1M": "mul_1M", "matmul_256": "matmul_256", "relu_1M": "relu_1M",
             "softmax_1000x10": "softmax_1000x10", "lenet_b1": None, "lenet_b64": None,
             "bert_base_layer_seq128": None}


def crypten_lite_rows(names: list[str], provider: str, repeat: int) -> list[dict]:
    from crypten_lite import bench
    out = []
    for row in bench.run(names, 2, provider, repeat):
        if "seconds_median" in row:
            online_bytes = sum(row["bytes_sent_per_party"])
            corr = sum(row.get("offline_dealer_bytes_per_party", [])) + \
                sum(row.get("online_dealer_bytes_per_party", []))
            row = dict(row, system=f"crypten_lite-{provider}",
                       end_to_end_seconds=row["offline_seconds"] + row["seconds_median"],
                       bytes_both_parties=online_bytes + corr)
        else:
            row = dict(row, system=f"crypten_lite-{provider}")
        out.append(row)
    return out


def spu_rows(names: list[str], repeat: int) -> list[dict]:
    py = subprocess.run(["bash", os.path.join(os.path.dirname(__file__), "peer_envs.sh"), "spu"],
                        capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    args = [py, os.path.join(os.path.dirname(__file__), "spu_cheetah.py"), "--repeat", str(repeat)]
    for n in names:
        args += ["--only", n]
    done = subprocess.run(args, capture_output=True, text=True, timeout=3000)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    for r in rows:
        r["end_to_end_seconds"] = r["seconds_median"]
    return rows


def table(rows: list[dict]) -> str:
    def cell(system: str, workload: str) -> str:
        for r in rows:
            if r.get("system") == system and r.get("workload") == workload and "end_to_end_seconds" in r:
                mb = r.get("bytes_both_parties")
                extra = f" / {mb / 1e6:.1f} MB" if mb else ""
                off = f" ({r['offline_seconds']:.2f} s offline)" if "offline_seconds" in r else ""
                return f"{r['end_to_end_seconds']:.2f} s{off}{extra}"
        return "not measured"
    lines = ["| workload | pairwise (no dealer) | dealer provider | SPU CHEETAH |", "|---|---|---|---|"]
    for w, spu in WORKLOADS.items():
        if not any(r.get("workload") in (w, spu) for r in rows):
            continue
        lines.append(f"| {w} | {cell('crypten_lite-pairwise', w)} | {cell('crypten_lite-dealer', w)} "
                     f"| {cell('spu-0.9.5-cheetah', spu) if spu else 'not measured'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=sorted(WORKLOADS))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-spu", action="store_true")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    names = args.only or list(WORKLOADS)
    rows = crypten_lite_rows(names, "pairwise", args.repeat) + crypten_lite_rows(names, "dealer", args.repeat)
    if not args.no_spu:
        rows += spu_rows([WORKLOADS[n] for n in names if WORKLOADS[n]], args.repeat)
    load = os.getloadavg()[0]
    for r in rows:
        r.setdefault("load_average_1min", round(load, 1))
    if args.out:
        with open(args.out, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print(table(rows))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
