"""Where provider pairwise's offline phase goes, per correlation kind: a workload's plan is
recorded, then prefetched (timed); each party's `PairwiseProvider.by_kind` gives, per kind
(and op), the correlations made, the bytes both ways and the seconds. One JSON line per
kind (rank 0's view; both parties take part in every exchange), plus a total line.

    timeout 900 python benchmarks/pairwise_breakdown.py --workload lenet_b1
    timeout 900 python benchmarks/pairwise_breakdown.py --workload relu --n 65536
    timeout 1800 python benchmarks/pairwise_breakdown.py --workload lenet_b64

--served (LeNet): a later inference of the loaded model, the one a service runs: a first
forward draws the weight masks (and each party keeps the peer's encrypted B, he_kept.py),
then a later forward's plan is recorded and prefetched (no weight_mask in it):

    timeout 900 python benchmarks/pairwise_breakdown.py --workload lenet_b1 --served

--workload bert_layer: one BERT encoder layer (benchmarks/pairwise_vs_cheetah.py's model and
input builders and its party job: the plan recorded under the dealer provider, then
prefetched under pairwise and the layer run online, checked against torch); its lines also
name, per kind, the shapes of the largest correlations (--top of them), and the single
largest correlations of the whole plan follow (kind "largest #i"):

    timeout 900 python benchmarks/pairwise_breakdown.py --workload bert_layer --bert-seq 32
"""

from __future__ import annotations

import argparse
import json
import os
import time


def _run(workload: str, n: int, served: bool = False) -> dict:
    import torch

    import crypten_lite
    from crypten_lite import bench, comm, nn
    from crypten_lite.mpc import offline
    from crypten_lite.session import current
    if workload == "relu":
        x = crypten_lite.cryptensor(bench._data(7, n, scale=10), src=0)
        program = x.relu
    else:
        batch = 64 if workload == "lenet_b64" else 1
        model = bench._lenet().eval()
        images = bench._data(11, batch, 1, 28, 28)
        private = nn.from_pytorch(model, torch.zeros(1, 1, 28, 28), fold_batch_norm=True)
        private.encrypt(src=0)
        private.eval()
        x = crypten_lite.cryptensor(images if comm.get().rank == 1 else None, src=1)

        def program():
            with torch.no_grad():
                return private(x)
    if served:           # a loaded model's later inference: its weight masks drawn (B kept)
        program()
    with offline.record() as plan:
        program()
    provider = current().provider
    provider.by_kind.clear()
    start = time.perf_counter()
    offline.prefetch(plan)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "by_kind": {k: list(v) for k, v in provider.by_kind.items()}}


def _vs_cheetah():
    """benchmarks/pairwise_vs_cheetah.py as a module (loaded by path: the party processes
    cannot import benchmarks/ by name)."""
    import importlib.util
    import sys
    name = "_pairwise_vs_cheetah"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, os.path.join(os.path.dirname(os.path.abspath(__file__)), "pairwise_vs_cheetah.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


def _instrument(provider) -> list:
    """Wrap the provider's makers (this party's instance only): one record per exchange,
    [label, shapes, bytes both ways, seconds] (a batch: its first member's shapes and the
    number of members)."""
    records: list = []

    def moved() -> tuple[int, float]:
        st = provider.stats
        return st["pairwise_bytes_sent"] + st["pairwise_bytes_received"], st["pairwise_seconds"]

    def wrap(method, label):
        def run(*args):
            b0, s0 = moved()
            out = method(*args)
            b1, s1 = moved()
            records.append(label(*args) + [b1 - b0, round(s1 - s0, 3)])
            return out
        return run
    provider._make = wrap(provider._make, lambda counter, kind, op, shapes, params: [
        f"{kind}/{op}" if op else kind, [list(s) for s in shapes]])
    for attr, what in (("_make_elementwise", "elementwise batch"), ("_make_ot_batch", "batch")):
        def label(start, group, what=what):
            kind, op, shapes, _ = provider._plan[group[0]]
            return [f"{kind} {what}" if what == "batch" else what,
                    [list(s) for s in shapes] + [f"x{len(group)}"]]
        setattr(provider, attr, wrap(getattr(provider, attr), label))
    return records


def _bert_party(sizes: dict, plan: list | None) -> dict:
    """pairwise_vs_cheetah's bert_layer party job, with this party's makers instrumented."""
    from crypten_lite.session import current
    provider = current().provider
    records = _instrument(provider) if plan is not None else []
    if plan is not None:
        provider.by_kind.clear()
    got = _vs_cheetah()._bert_layer_party(sizes, plan)
    got["records"] = records
    got["by_kind"] = {k: list(v) for k, v in getattr(provider, "by_kind", {}).items()}
    return got


def _run_bert(sizes: dict) -> dict:
    from crypten_lite.mpc import PartyPool
    with PartyPool(2, provider="dealer", timeout=1800) as pool:
        plan = pool.run(_bert_party, sizes, None)[0]["plan"]
    with PartyPool(2, provider="pairwise", timeout=3600) as pool:
        runs = pool.run(_bert_party, sizes, plan)
    got = runs[0]
    return {"seconds": got["offline_seconds"], "by_kind": got["by_kind"], "records": got["records"],
            "online_seconds": got["online_seconds"], "rounds": got["rounds"],
            "online_mb_both_ways": round(sum(r["bytes_sent"] for r in runs) / 1e6, 1),
            "max_error": got["max_error"], "plan_requests": len(plan), "diverged": got["diverged"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=["lenet_b1", "lenet_b64", "relu", "bert_layer"],
                        default="lenet_b1")
    parser.add_argument("--n", type=int, default=65536, help="relu: elements")
    parser.add_argument("--bert-hidden", type=int, default=768)
    parser.add_argument("--bert-heads", type=int, default=12)
    parser.add_argument("--bert-ffn", type=int, default=3072)
    parser.add_argument("--bert-seq", type=int, default=128)
    parser.add_argument("--top", type=int, default=3, help="bert_layer: largest correlations shown")
    parser.add_argument("--served", action="store_true",
                        help="lenet: a later inference of the loaded model (its weight masks drawn and "
                             "their B kept by a first forward: provider/he_kept.py), not a first one")
    parser.add_argument("--out", help="append the lines to this file (docs/pairwise_breakdown.jsonl feeds "
                        "docs/protocols.md's table: benchmarks/pairwise_tables.py)")
    args = parser.parse_args()
    from crypten_lite.mpc import PartyPool
    name = args.workload if args.workload != "relu" else f"relu_{args.n}"
    if args.workload == "bert_layer":
        sizes = {"hidden": args.bert_hidden, "heads": args.bert_heads, "ffn": args.bert_ffn,
                 "seq": args.bert_seq}
        got = _run_bert(sizes)
        name = "bert_layer_h{hidden}_a{heads}_f{ffn}_s{seq}".format(**sizes)
    else:
        with PartyPool(2, provider="pairwise", timeout=1800) as pool:
            got = pool.run(_run, args.workload, args.n, args.served)[0]
        if args.served:
            name += "_served"
    load = round(os.getloadavg()[0], 1)
    records = got.get("records", [])
    lines = []
    for kind, (count, nbytes, seconds) in sorted(got["by_kind"].items(), key=lambda kv: -kv[1][2]):
        line = {"workload": name, "kind": kind, "correlations": count, "mb_both_ways": round(nbytes / 1e6, 1),
                "seconds": round(seconds, 2)}
        mine = sorted((r for r in records if r[0] == kind), key=lambda r: -r[2])[:args.top]
        if mine:
            line["largest"] = [{"shapes": r[1], "mb": round(r[2] / 1e6, 1), "seconds": r[3]} for r in mine]
        lines.append(line)
    for i, r in enumerate(sorted(records, key=lambda r: -r[2])[:args.top if records else 0]):
        lines.append({"workload": name, "kind": f"largest #{i + 1}", "of": r[0], "shapes": r[1],
                      "mb_both_ways": round(r[2] / 1e6, 1), "seconds": r[3]})
    total = {"workload": name, "kind": "total (prefetch)", "seconds": round(got["seconds"], 2)}
    for key in ("plan_requests", "diverged", "online_seconds", "rounds", "online_mb_both_ways", "max_error"):
        if key in got:
            total[key] = round(got[key], 4) if isinstance(got[key], float) else got[key]
    lines.append(dict(total, load_average_1min=load, date=time.strftime("%Y-%m-%d")))
    for line in lines:
        print(json.dumps(line))
    if args.out:
        with open(args.out, "a") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)


if __name__ == "__main__":
    main()
