"""Provider pairwise (two parties, no dealer) against SPU 0.9.5's CHEETAH, end to end, and
against the dealer provider, on this machine in the same run.

crypten_lite rows come from `crypten_lite.bench.run` (2 parties over gRPC, a recorded
offline phase prefetched before each timed run): end to end = offline seconds + online
seconds; bytes = the online bytes both parties sent + the correlation bytes both received
(from the dealer, or from each other with pairwise). SPU rows come from
benchmarks/spu_cheetah.py in SPU's own venv (bash benchmarks/peer_envs.sh spu).
Writes JSON lines to --out and prints the markdown table of docs/protocols.md.

    timeout 3600 python benchmarks/pairwise_vs_cheetah.py --repeat 1 --out docs/pairwise_vs_cheetah.jsonl

--quick (a few minutes): the same comparison on scaled-down workloads (mul 65536, matmul 64,
relu 16384, softmax [1000,10], LeNet batch 1), each run once to record its offline plan and
once timed (offline prefetch, then online), SPU on the same sizes; writes
docs/pairwise_quick.jsonl (replacing it) and prints the table that docs/protocols.md shows:

    timeout 900 python benchmarks/pairwise_vs_cheetah.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

# crypten_lite workload -> SPU workload (benchmarks/spu_cheetah.py), None: not measured there
WORKLOADS = {"mul_1M": "mul_1M", "matmul_256": "matmul_256", "relu_1M": "relu_1M",
             "softmax_1000x10": "softmax_1000x10", "lenet_b1": "lenet_b1", "lenet_b64": "lenet_b64",
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
            if provider == "pairwise":   # which OT extension made the binary correlations
                row["pairwise_ot"] = os.environ.get("CRYPTEN_LITE_PAIRWISE_OT", "") or "ferret"
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


# --quick: crypten_lite workload -> SPU workload (benchmarks/spu_cheetah.py)
QUICK = {"mul_65536": "mul_65536", "matmul_64": "matmul_64", "relu_16384": "relu_16384",
         "softmax_1000x10": "softmax_1000x10", "lenet_b1": "lenet_b1"}


def _quick_workload(name: str) -> dict:
    """One party's run of a --quick workload through bench._measure (its offline plan is kept
    per name: the first call records it, the second prefetches it, timed)."""
    import crypten_lite
    from crypten_lite import bench
    if name == "mul_65536":
        a, b = bench._data(1, 65536), bench._data(2, 65536)
        x, y = crypten_lite.cryptensor(a, src=0), crypten_lite.cryptensor(b, src=1)
        return bench._measure(lambda: (bench._reveal_after(lambda: x * y), a * b), plan_name=name)
    if name == "matmul_64":
        a, b = bench._data(3, 64, 64), bench._data(4, 64, 64)
        x, y = crypten_lite.cryptensor(a, src=0), crypten_lite.cryptensor(b, src=1)
        return bench._measure(lambda: (bench._reveal_after(lambda: x @ y), a @ b), plan_name=name)
    if name == "relu_16384":
        a = bench._data(7, 16384, scale=10)
        x = crypten_lite.cryptensor(a, src=0)
        return bench._measure(lambda: (bench._reveal_after(lambda: x.relu()), a.relu()), plan_name=name)
    return bench.WORKLOADS[name]()


def quick_rows(provider: str) -> list[dict]:
    from crypten_lite.mpc import PartyPool
    rows = []
    with PartyPool(2, provider=provider, timeout=900) as pool:
        for name in QUICK:
            pool.run(_quick_workload, name)              # records the offline plan
            r = pool.run(_quick_workload, name)          # offline (prefetch) + online, timed
            online = max(x["seconds"] for x in r)
            offline = max(x["offline_seconds"] for x in r)
            corr = sum(x["offline_dealer_bytes"] + x["dealer_bytes"] for x in r)
            rows.append({"system": f"crypten_lite-{provider}", "workload": name,
                         "offline_seconds": offline, "online_seconds": online,
                         "end_to_end_seconds": offline + online,
                         "offline_bytes_both_parties": corr,
                         "online_bytes_both_parties": sum(x["bytes_sent"] for x in r),
                         "bytes_both_parties": corr + sum(x["bytes_sent"] for x in r),
                         "rounds": r[0]["rounds"], "max_error": r[0]["max_error"],
                         "load_average_1min": round(os.getloadavg()[0], 1)})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def quick_table(rows: list[dict]) -> str:
    """The --quick table (docs/protocols.md): one line per workload, the three systems."""
    def cell(system: str, workload) -> str:
        for r in rows:
            if r.get("system") == system and r.get("workload") == workload:
                if r.get("end_to_end_seconds") is None:
                    return "failed"
                mb = r.get("bytes_both_parties")
                off = f" ({r['offline_seconds']:.2f} s offline)" if "offline_seconds" in r else ""
                return f"{r['end_to_end_seconds']:.2f} s{off}" + (f" / {mb / 1e6:.1f} MB" if mb else "")
        return "not measured"
    load = max((r.get("load_average_1min", 0) for r in rows), default=0)
    lines = ["| workload (quick) | pairwise (no dealer) | dealer provider | SPU 0.9.5 CHEETAH |",
             "|---|---|---|---|"]
    for w, spu in QUICK.items():
        lines.append(f"| {w} | {cell('crypten_lite-pairwise', w)} | {cell('crypten_lite-dealer', w)} | "
                     f"{cell('spu-0.9.5-cheetah', spu) if spu else 'not measured'} |")
    lines.append(f"\nEnd to end = offline + online seconds (SPU: its whole run); bytes: both parties' "
                 f"online messages and correlation traffic (SPU 0.9.5's Python API reports none); "
                 f"highest 1-minute load average during the run: {load}.")
    return "\n".join(lines)


def quick(no_spu: bool) -> None:
    rows = quick_rows("pairwise") + quick_rows("dealer")
    if not no_spu:
        rows += spu_rows([s for s in QUICK.values() if s], 1)
    for r in rows:
        r.setdefault("load_average_1min", round(os.getloadavg()[0], 1))
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "pairwise_quick.jsonl")
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(quick_table(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="scaled-down workloads, a few minutes; writes docs/pairwise_quick.jsonl")
    parser.add_argument("--only", action="append", choices=sorted(WORKLOADS))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-spu", action="store_true")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    if args.quick:
        quick(args.no_spu)
        return
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
