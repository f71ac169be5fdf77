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

--only bert_layer: one BERT encoder layer (transformers' BertLayer; BERT-base by default:
hidden 768, 12 heads, FFN 3072, seq 128, batch 1; --bert-hidden/--bert-heads/--bert-ffn/
--bert-seq for other sizes), weights private to party 0, input to party 1, under the dealer
provider (a recording run, then a timed one), pairwise (one timed run: the dealer's recorded
plan prefetched, then online; CRYPTEN_LITE_PROGRESS=1 draws its offline progress) and SPU CHEETAH (the same layer in jax.numpy, the same weights
and input); every max error is against torch's forward of the layer. Rows are appended to
--out as each system finishes:

    timeout 2400 python benchmarks/pairwise_vs_cheetah.py --only bert_layer --out bert_layer.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time

# crypten_lite workload -> SPU workload (benchmarks/spu_cheetah.py), None: not measured there
WORKLOADS = {"mul_1M": "mul_1M", "matmul_256": "matmul_256", "relu_1M": "relu_1M",
             "softmax_1000x10": "softmax_1000x10", "lenet_b1": "lenet_b1", "lenet_b64": "lenet_b64"}
# and "bert_layer" (bert_layer_rows, spu_bert_row below: not a crypten_lite.bench workload)


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


# ---------------------------------------------------------------- bert_layer: one BERT encoder layer
# transformers' BertLayer (eval, eager attention, exact GELU, LayerNorm eps 1e-12): weights
# private to party 0 (shipped in-band by from_pytorch and shared), input private to party 1.
BERT_BASE = {"hidden": 768, "heads": 12, "ffn": 3072, "seq": 128}


def bert_layer_model(hidden: int, heads: int, ffn: int):
    """The layer (a torch module returning the hidden states), seeded weights: torch's Linear
    init, and LayerNorm gains and biases drawn too (not 1 and 0), so that no part of the
    layer's math is left out of the check."""
    import torch
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertLayer

    class BertLayerBlock(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = BertLayer(BertConfig(hidden_size=hidden, num_attention_heads=heads,
                                              intermediate_size=ffn, hidden_act="gelu",
                                              attn_implementation="eager"))

        def forward(self, x):
            out = self.layer(x)
            return out[0] if isinstance(out, tuple) else out

    torch.manual_seed(0)  # insecure-ok: benchmark model init, not shares
    block = BertLayerBlock()
    g = torch.Generator().manual_seed(23)  # insecure-ok: benchmark model init, not shares
    with torch.no_grad():
        for ln in (block.layer.attention.output.LayerNorm, block.layer.output.LayerNorm):
            ln.weight.copy_(1 + 0.2 * torch.randn(hidden, generator=g))  # insecure-ok: benchmark weights
            ln.bias.copy_(0.1 * torch.randn(hidden, generator=g))  # insecure-ok: benchmark weights
    return block.eval()


def bert_layer_input(hidden: int, seq: int):
    """Party 1's private input: hidden states [1, seq, hidden], N(0, 1)."""
    from crypten_lite import bench
    return bench._data(24, 1, seq, hidden)


def write_bert_npz(sizes: dict, path: str) -> None:
    """The layer's weights (as x @ W), input and torch's output, for spu_cheetah.py --bert-npz
    (numpy arrays only: read back with allow_pickle=False)."""
    import numpy as np
    import torch
    model = bert_layer_model(sizes["hidden"], sizes["heads"], sizes["ffn"])
    x = bert_layer_input(sizes["hidden"], sizes["seq"])
    layer = model.layer
    att, out = layer.attention, layer.output
    lin = {"q": att.self.query, "k": att.self.key, "v": att.self.value, "o": att.output.dense,
           "1": layer.intermediate.dense, "2": out.dense}
    with torch.no_grad():
        ref = model(x)
    arrays = {f"w{k}": m.weight.detach().t().numpy() for k, m in lin.items()}
    arrays.update({f"b{k}": m.bias.detach().numpy() for k, m in lin.items()})
    for i, ln in ((1, att.output.LayerNorm), (2, out.LayerNorm)):
        arrays[f"ln{i}_g"], arrays[f"ln{i}_b"] = ln.weight.detach().numpy(), ln.bias.detach().numpy()
    eps = att.output.LayerNorm.eps
    np.savez(path, x=x.numpy(), torch_out=ref.numpy(), heads=np.int64(sizes["heads"]),
             eps=np.float64(eps), **arrays)


def _bert_layer_party(sizes: dict, plan: list | None) -> dict:
    """One party's private forward of a freshly loaded layer (its first forward: every weight's
    mask drawn and D opened, as LeNet's rows above). plan None: recorded (returned); else the
    plan's correlations are made first (offline, timed apart) and the forward runs online."""
    import torch
    import crypten_lite
    from crypten_lite import bench, comm, nn
    from crypten_lite.mpc import offline
    from crypten_lite.session import current
    c, provider = comm.get(), current().provider
    rank = c.rank
    x = bert_layer_input(sizes["hidden"], sizes["seq"])
    model = bert_layer_model(sizes["hidden"], sizes["heads"], sizes["ffn"]) if rank == 0 else None
    ref = None
    if rank == 0:
        with torch.no_grad():
            ref = model(x)
    private = nn.from_pytorch(model, torch.zeros_like(x), src=0)
    private.encrypt(src=0)
    private.eval()
    model = None
    xs = crypten_lite.cryptensor(x if rank == 1 else None, src=1)
    stats = getattr(provider, "stats", {})
    prefetched_before, diverged_before = stats.get("prefetched", 0), stats.get("diverged", 0)
    offline._release_free_heap()
    bench._reset_peak_memory()
    offline_seconds, offline_corr, offline_sent = 0.0, 0, 0
    if plan is not None:
        c.reset_communication_stats()
        before = bench._dealer_bytes(provider)
        start = time.perf_counter()
        offline.prefetch(plan)
        offline_seconds = time.perf_counter() - start
        offline_corr = bench._dealer_bytes(provider) - before
        offline_sent = c.get_communication_stats()["bytes_sent"]
    c.barrier()
    c.reset_communication_stats()
    before = bench._dealer_bytes(provider)
    recorded: list = []
    start = time.perf_counter()
    with crypten_lite.no_grad():
        if plan is None:
            with offline.record() as recorded:
                y = private(xs)
        else:
            y = private(xs)
    seconds = time.perf_counter() - start
    online = c.get_communication_stats()
    online_corr = bench._dealer_bytes(provider) - before
    peak = bench._peak_memory_bytes()
    got = y.get_plain_text()
    return {"online_seconds": seconds, "offline_seconds": offline_seconds,
            "rounds": online["rounds"], "bytes_sent": online["bytes_sent"],
            "offline_correlation_bytes": offline_corr, "offline_bytes_sent": offline_sent,
            "online_correlation_bytes": online_corr, "peak_memory_bytes": peak,
            "max_error": float((got.double() - ref.double()).abs().max()) if ref is not None else None,
            "prefetched": stats.get("prefetched", 0) - prefetched_before,
            "diverged": stats.get("diverged", 0) - diverged_before,
            "plan": recorded if plan is None else None}


def _bert_row(provider: str, sizes: dict, runs: list[dict], plan_len: int) -> dict:
    """The workload's row from both parties' results (bytes: both parties' online messages and
    the correlation bytes both received, from the dealer or from each other)."""
    offline_s = max(r["offline_seconds"] for r in runs)
    online_s = max(r["online_seconds"] for r in runs)
    corr = sum(r["offline_correlation_bytes"] + r["online_correlation_bytes"] for r in runs)
    row = {"system": f"crypten_lite-{provider}", "workload": "bert_layer", **sizes,
           "offline_seconds": offline_s, "online_seconds": online_s,
           "end_to_end_seconds": offline_s + online_s,
           "offline_bytes_both_parties": sum(r["offline_correlation_bytes"] + r["offline_bytes_sent"] for r in runs),
           "online_bytes_both_parties": sum(r["bytes_sent"] for r in runs),
           "bytes_both_parties": corr + sum(r["bytes_sent"] for r in runs),
           "rounds": runs[0]["rounds"], "max_error": runs[0]["max_error"],
           "peak_memory_mb_per_party": [round(r["peak_memory_bytes"] / 2 ** 20, 1) for r in runs],
           "plan_requests": plan_len, "prefetched": runs[0]["prefetched"], "diverged": runs[0]["diverged"],
           "load_average_1min": round(os.getloadavg()[0], 1)}
    if provider == "pairwise":
        row["pairwise_ot"] = os.environ.get("CRYPTEN_LITE_PAIRWISE_OT", "") or "ferret"
    return row


# A pool's deadline bounds each whole run (launcher: PartyPool._collect), and one pairwise run
# of BERT-base's layer took over 21 minutes at load 11 here: an hour, bounded by the caller's
# `timeout` in the command above.
BERT_POOL_TIMEOUT_S = 3600


def bert_layer_rows(sizes: dict, dealer_pool=None, pairwise_pool=None, log=None) -> list[dict]:
    """bert_layer under the dealer provider (one recording run, then one timed: offline
    prefetch + online) and under pairwise (one timed run, prefetching the plan recorded under
    the dealer: a plan lists requests, which depend on the program and shapes alone, never on
    the provider; `diverged` in the row says whether the run kept to it). Pools may be given
    (tests); else each is started and closed here."""
    from crypten_lite.mpc import PartyPool
    rows = []
    # the parties draw pairwise's offline progress line (rank 0's stderr) when asked to, and
    # use the OT extension named here
    env = {k: os.environ[k] for k in ("CRYPTEN_LITE_PROGRESS", "CRYPTEN_LITE_PAIRWISE_OT") if k in os.environ}
    with contextlib.ExitStack() as stack:
        if dealer_pool is None:
            dealer_pool = stack.enter_context(PartyPool(2, provider="dealer", timeout=BERT_POOL_TIMEOUT_S, env=env))
        plan = dealer_pool.run(_bert_layer_party, sizes, None)[0]["plan"]
        rows.append(_bert_row("dealer", sizes, dealer_pool.run(_bert_layer_party, sizes, plan), len(plan)))
        if log:
            log(rows[-1])
        if pairwise_pool is None:
            stack.close()   # the dealer's processes gone before pairwise's start
            pairwise_pool = stack.enter_context(PartyPool(2, provider="pairwise", timeout=BERT_POOL_TIMEOUT_S,
                                                          env=env))
        rows.insert(0, _bert_row("pairwise", sizes, pairwise_pool.run(_bert_layer_party, sizes, plan), len(plan)))
        if log:
            log(rows[0])
    return rows


def spu_bert_row(sizes: dict, timeout: float = 3000) -> dict:
    """bert_layer under SPU 0.9.5 CHEETAH (spu_cheetah.py --bert-npz in SPU's venv) on the same
    weights and input; max_error against the same torch forward."""
    import tempfile
    py = subprocess.run(["bash", os.path.join(os.path.dirname(__file__), "peer_envs.sh"), "spu"],
                        capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bert_layer.npz")
        write_bert_npz(sizes, path)
        done = subprocess.run([py, os.path.join(os.path.dirname(__file__), "spu_cheetah.py"),
                               "--bert-npz", path, "--repeat", "1"],
                              capture_output=True, text=True, timeout=timeout)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not rows:
        errors = [line for line in done.stderr.splitlines() if line.startswith("RuntimeError: SPU")]
        return {"system": "spu-0.9.5-cheetah", "workload": "bert_layer", **sizes, "end_to_end_seconds": None,
                "error": (errors or done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1][:500]}
    row = dict(rows[0], **sizes, end_to_end_seconds=rows[0]["seconds_median"])
    row["load_average_1min"] = round(os.getloadavg()[0], 1)
    return row


def bert_table(rows: list[dict]) -> str:
    """One line per system of a bert_layer run."""
    lines = ["| system | end to end | of which offline | MB (both parties) | peak MB per party | max error | load |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("end_to_end_seconds") is None:
            lines.append(f"| {r['system']} | failed: {r.get('error')} | | | | | |")
            continue
        off = f"{r['offline_seconds']:.2f} s" if "offline_seconds" in r else "-"
        mb = f"{r['bytes_both_parties'] / 1e6:.1f}" if r.get("bytes_both_parties") else "not reported"
        peak = r.get("peak_memory_mb_per_party") or (f"{r['peak_memory_mb_both_parties']:.0f} (both, one process)"
                                                     if r.get("peak_memory_mb_both_parties") else "-")
        lines.append(f"| {r['system']} | {r['end_to_end_seconds']:.2f} s | {off} | {mb} | {peak} | "
                     f"{r['max_error']:.2e} | {r.get('load_average_1min')} |")
    return "\n".join(lines)


def bert(args) -> None:
    """--only bert_layer: the three systems on one layer at --bert-* sizes, rows to --out."""
    sizes = {"hidden": args.bert_hidden, "heads": args.bert_heads, "ffn": args.bert_ffn, "seq": args.bert_seq}
    if sizes["hidden"] % sizes["heads"]:
        raise SystemExit(f"--bert-hidden {sizes['hidden']} is not a multiple of --bert-heads {sizes['heads']}")

    def log(row: dict) -> None:
        print(json.dumps(row), file=sys.stderr, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    systems = set(args.bert_systems.split(","))
    if not systems <= {"spu", "crypten_lite"}:
        raise SystemExit(f"--bert-systems {args.bert_systems}: name spu and/or crypten_lite")
    rows = []
    if "spu" in systems and not args.no_spu:   # first: pairwise, the longest, last
        rows.append(spu_bert_row(sizes))       # (a run cut short keeps the others' rows)
        log(rows[-1])
    if "crypten_lite" in systems:
        rows = bert_layer_rows(sizes, log=log) + rows
    print(bert_table(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="scaled-down workloads, a few minutes; writes docs/pairwise_quick.jsonl")
    parser.add_argument("--only", action="append", choices=sorted(WORKLOADS) + ["bert_layer"])
    parser.add_argument("--bert-hidden", type=int, default=BERT_BASE["hidden"])
    parser.add_argument("--bert-heads", type=int, default=BERT_BASE["heads"])
    parser.add_argument("--bert-ffn", type=int, default=BERT_BASE["ffn"])
    parser.add_argument("--bert-seq", type=int, default=BERT_BASE["seq"])
    parser.add_argument("--bert-systems", default="spu,crypten_lite",
                        help="bert_layer: spu, crypten_lite (dealer and pairwise) or both")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-spu", action="store_true")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    if args.quick:
        quick(args.no_spu)
        return
    names = args.only or list(WORKLOADS) + ["bert_layer"]
    if "bert_layer" in names:
        bert(args)
        names = [n for n in names if n != "bert_layer"]
        if not names:
            return
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
