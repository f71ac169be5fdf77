"""The markdown tables of docs/protocols.md ("Provider pairwise: measured") from the JSON lines
that benchmarks/pairwise_small.py and benchmarks/pairwise_vs_cheetah.py (full and --quick) wrote
(docs/pairwise_small.jsonl, docs/pairwise_vs_cheetah.jsonl, docs/pairwise_quick.jsonl); tests
check the doc against them."""

from __future__ import annotations

import json
import pathlib

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"


def small_table() -> str:
    rows = [json.loads(line) for line in (DOCS / "pairwise_small.jsonl").read_text().splitlines()]
    out = ["| workload | provider | offline s | offline MB (both) | online s | online bytes (both) | rounds | load |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['workload']} | {r['provider']} | {r['offline_s']:.2f} | "
                   f"{r['offline_bytes_both'] / 1e6:.1f} | {r['online_s']:.3f} | {r['online_bytes_both']} | "
                   f"{r['rounds']} | {r['load']} |")
    return "\n".join(out)


def side_by_side() -> str:
    rows = [json.loads(line) for line in (DOCS / "pairwise_vs_cheetah.jsonl").read_text().splitlines()]
    out = ["| system | workload | end to end | of which offline | MB (both parties) | load |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("end_to_end_seconds") is not None:
            e2e = f"{r['end_to_end_seconds']:.2f} s"
        else:
            e2e = f"not finished ({r.get('error')})"
        off = f"{r['offline_seconds']:.2f} s" if r.get("offline_seconds") is not None else "-"
        mb = f"{r['bytes_both_parties'] / 1e6:.1f}" if r.get("bytes_both_parties") else "not reported"
        system = r["system"] + (f" (OT: {r['pairwise_ot']})" if r.get("pairwise_ot") else "")
        out.append(f"| {system} | {r['workload']} | {e2e} | {off} | {mb} | {r.get('load_average_1min')} |")
    return "\n".join(out)


def breakdown_table() -> str:
    """Where the offline phase goes, per correlation kind (docs/pairwise_breakdown.jsonl, from
    `python benchmarks/pairwise_breakdown.py --workload W --out docs/pairwise_breakdown.jsonl`;
    the last run of each workload)."""
    runs: dict[str, list[dict]] = {}
    current: list[dict] = []
    for line in (DOCS / "pairwise_breakdown.jsonl").read_text().splitlines():
        row = json.loads(line)
        current.append(row)
        if row["kind"] == "total (prefetch)":
            runs[row["workload"]], current = current, []
    out = ["| workload | correlation kind (op) | correlations | MB both ways | seconds |",
           "|---|---|---|---|---|"]
    for workload, rows in runs.items():
        for r in rows:
            if r["kind"] == "total (prefetch)":
                out.append(f"| {workload} | whole prefetch (load {r['load_average_1min']}, {r['date']}) | | | "
                           f"{r['seconds']:.2f} |")
            else:
                out.append(f"| {workload} | {r['kind']} | {r['correlations']} | {r['mb_both_ways']:.1f} | "
                           f"{r['seconds']:.2f} |")
    return "\n".join(out)


def bert_breakdown_table() -> str:
    """Where one BERT-base layer's offline phase goes under pairwise, per correlation kind,
    with the shapes of each kind's largest correlation (docs/pairwise_bert_breakdown.jsonl,
    from `python benchmarks/pairwise_breakdown.py --workload bert_layer --bert-seq S --out
    docs/pairwise_bert_breakdown.jsonl`; the last run of each size)."""
    runs: dict[str, list[dict]] = {}
    current: list[dict] = []
    for line in (DOCS / "pairwise_bert_breakdown.jsonl").read_text().splitlines():
        row = json.loads(line)
        current.append(row)
        if row["kind"] == "total (prefetch)":
            runs[row["workload"]], current = current, []
    out = ["| workload | correlation kind (op) | correlations | MB both ways | seconds | largest (shapes: MB, s) |",
           "|---|---|---|---|---|---|"]
    for workload, rows in runs.items():
        for r in rows:
            if r["kind"] == "total (prefetch)":
                out.append(f"| {workload} | whole prefetch ({r['plan_requests']} requests; load "
                           f"{r['load_average_1min']}, {r['date']}) | | | {r['seconds']:.2f} | online "
                           f"{r['online_seconds']:.2f} s, {r['rounds']} rounds, {r['online_mb_both_ways']} MB |")
            elif "correlations" in r:
                big = r.get("largest", [{}])[0]
                shapes = " x ".join("[" + ",".join(map(str, s)) + "]" for s in big.get("shapes", [])
                                    if not isinstance(s, str))
                shapes += "".join(f" (first of {s[1:]} batched)" for s in big.get("shapes", []) if isinstance(s, str))
                out.append(f"| {workload} | {r['kind']} | {r['correlations']} | {r['mb_both_ways']:.1f} | "
                           f"{r['seconds']:.2f} | {shapes}: {big.get('mb')} MB, {big.get('seconds')} s |")
    return "\n".join(out)


def quick_table() -> str:
    """The table of `python benchmarks/pairwise_vs_cheetah.py --quick` (docs/pairwise_quick.jsonl)."""
    import sys
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    try:
        from pairwise_vs_cheetah import quick_table as render
    finally:
        sys.path.pop(0)
    rows = [json.loads(line) for line in (DOCS / "pairwise_quick.jsonl").read_text().splitlines()]
    return render(rows)


if __name__ == "__main__":
    print(small_table())
    print()
    print(side_by_side())
    print()
    print(quick_table())
    print()
    print(breakdown_table())
    print()
    print(bert_breakdown_table())
