"""Write the figures of README.md and docs/*.md from their one source.

    python scripts/gen_doc_figures.py                     # rewrite every figures block
    python scripts/gen_doc_figures.py --check             # exit 1 and name every stale block
    python scripts/gen_doc_figures.py --measure-costs     # rerun every workload, rewrite docs/costs.json
    python scripts/gen_doc_figures.py --measure-costs lenet_b1/2p digits_cnn/int8-eager/2p
    python scripts/gen_doc_figures.py --measure-examples  # run the training examples (minutes)
    python scripts/gen_doc_figures.py --measure-quantized     # quantized.md's agreement tables (a minute)
    python scripts/gen_doc_figures.py --measure-descriptions  # private_models.md's description sizes

Sources (all in docs/):

* ``costs.json``: exact online rounds, bytes sent per party and dealer bytes of every
  workload, keyed ``WORKLOAD/Np`` (the bench workloads, EXTRA_WORKLOADS below, the int8
  protocol steps QOPS, and the digits CNN of docs/quantized.md, whose entries also carry the
  agreement with torch of the run that measured them). Deterministic: ``--measure-costs`` computes them by running the workload
  between real parties (a PartyPool: separate processes, gRPC, the dealer), and
  tests/protocol/test_doc_costs.py plus tests/protocol/test_model_costs.py rerun them and
  assert every entry exactly.
* ``benchmarks.jsonl``: measured figures, one JSON line per run; for a workload measured
  several times the last line counts. Seconds and errors of ``crypten-lite bench --out
  docs/benchmarks.jsonl``; the training examples' rows (``"workload": "example"``) of
  ``--measure-examples``; the error table's rows (``"workload": "accuracy"``) of
  ``benchmarks/accuracy_table.py --json``. Lines of ``crypten-lite bench --protocol rss``
  (``"protocol": "rss"``) feed only docs/protocols.md's table, never the additive figures.
* ``end_to_end.jsonl``: four ``crypten-lite bench --parties 3`` runs of one session (additive
  and rss, each with and without ``--no-offline``), for docs/protocols.md's end-to-end table
  only; each line names the CPU that measured it (``cpu_model``).
* ``ring_gemm.jsonl``: ``benchmarks/limb_matmul.py --json`` lines (torch's int64 ring
  products against float64 limbs, per shape and CPU) for docs/ARCHITECTURE.md's table.
* the figures of other producers, each file or group with its provenance (command, commit,
  date, machine, and whether its script wrote it or it was transcribed once from the docs):
  ``netns_bench.jsonl`` (``benchmarks/netns_bench.py --json``: the network tables of
  deployment.md; their rounds and bytes come from costs.json), ``faults.json`` (fault
  detection timings), ``fuzz.json``, ``container.json`` (image, build, health-check and run
  times; the health-check timeout is read from docker-compose.yml), ``model_descriptions.json``
  (exact description sizes, ``--measure-descriptions``), ``quantized_agreement.json`` (the
  plaintext agreement tables of quantized.md, ``--measure-quantized``), ``crypten_compat.json``
  (CrypTen's tests on crypten_lite.compat, ``benchmarks/crypten_compat_tests.py``),
  ``quoted_figures.json`` (figures inside sentences and list items, checked rather than
  rendered: ``--check`` fails when a doc no longer says them), and ``external_figures.json``:
  measurements of OTHER systems (CrypTen, SPU), comparison only.

A block in a Markdown file is the text between ``<!-- figures:NAME -->`` and
``<!-- /figures -->``; RENDERERS[NAME] writes it. tests/unit/test_doc_figures.py fails when a
block differs from what this script writes now, when a benchmark or netns line disagrees with
costs.json (then rerun the bench for that workload: the message gives the command), or when a
quoted figure is no longer in its doc.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import functools
import json
import os
import pathlib
import re
import sys
import textwrap
from typing import Callable

ROOT = pathlib.Path(__file__).resolve().parents[1]
COSTS = ROOT / "docs" / "costs.json"
BENCH = ROOT / "docs" / "benchmarks.jsonl"
NETNS = ROOT / "docs" / "netns_bench.jsonl"  # benchmarks/netns_bench.py --json
# docs/NAME.json: figures of other producers, each with its provenance (see load_sources)
JSON_SOURCES = ("external_figures", "container", "faults", "fuzz", "crypten_compat", "model_descriptions",
                "quantized_agreement", "quoted_figures")
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(<!-- figures:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /figures -->)", re.S)

# Bench workloads in costs.json: (workload, parties). The README table lists these rows.
BENCH_KEYS = [(w, 2) for w in ("mul_1M", "mul_int_1M", "matmul_256", "matmul_int_256", "matmul_1024", "relu_1M",
                               "lt_1M", "softmax_1000x10", "lenet_b1", "lenet_b64", "resnet18_b1", "logreg_sgd_step",
                               "transport_16MB")] + \
             [(w, 3) for w in ("mul_1M", "mul_int_1M", "matmul_256", "matmul_int_256", "matmul_1024", "relu_1M",
                               "lt_1M", "softmax_1000x10", "lenet_b1", "lenet_b64", "resnet18_b1", "logreg_sgd_step")]
# Workloads of this script (not in `crypten-lite bench`):
# comparisons on 100,000 elements; one SGD step of the digits MLP (examples/train_mlp.py's
# model and batch); the bench's logistic-regression step with its loss value revealed.
EXTRA_KEYS = [(w, p) for p in (2, 3) for w in ("eq_100k", "sign_100k", "mlp_sgd_step")] + \
             [("logreg_sgd_step_loss", 2)]
# Examples run with `crypten-lite launch -n 2` by --measure-examples (rows in benchmarks.jsonl).
EXAMPLES = ("examples/train_logistic_regression.py", "examples/train_mlp.py")
# Private inference of examples/quantized_inference.py's digits CNN (DIGITS_IMAGES test images).
DIGITS_MODES = ("float", "int8-eager", "int8-fx", "int8-pt2e", "int8-eager-probabilistic")
DIGITS_IMAGES = 200


def key(workload: str, parties: int) -> str:
    return f"{workload}/{parties}p"


def load_costs() -> dict[str, dict]:
    return json.loads(COSTS.read_text())["costs"]


# The figures of a model that torch quantizes on the spot depend on the CPU: torch's float32
# calibration lands scales a float32 ulp apart (other AVX widths sum in another order), which
# changes requantization multipliers and so the integer program, and torch's own int8 kernels
# round a few values differently. Such figures are kept per CPU class (`cpu_class`): the main
# entries for the class named in the file's "cpu", others under "by_cpu".
CPU_DEPENDENT_PREFIX = "digits_cnn/int8-"


def cpu_class() -> str:
    """torch's CPU kernel class on this machine: AVX512, AVX2, ... (what its vectorized and
    quantized kernels dispatch on), with ``_AMX`` added on an AVX512 CPU with Intel's AMX tiles:
    there oneDNN takes its AMX kernels (its avx512_core_amx ISA), whose float32 sums round
    otherwise (measured: the digits CNN's eager output max abs 3.4e-07 on an Intel Xeon with
    AMX against 2.3e-07 on an AMD EPYC, both AVX512 to torch)."""
    import torch
    cap = torch.backends.cpu.get_cpu_capability()
    return cap + "_AMX" if cap.startswith("AVX512") and _has_amx() else cap


@functools.cache
def _has_amx() -> bool:
    """Whether this CPU has AMX tiles (Linux: /proc/cpuinfo's flags; False elsewhere), read
    once a process (the CPU does not change under it; cpu_class is asked per figure)."""
    try:
        flags = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " amx_tile" in flags and " amx_int8" in flags


def cost_entry(k: str, cpu: str | None = None) -> dict | None:
    """costs.json's entry for ``k`` on this CPU class (None: a CPU-dependent figure never
    measured on this class of CPU)."""
    data = json.loads(COSTS.read_text())
    cpu = cpu or cpu_class()
    if not k.startswith(CPU_DEPENDENT_PREFIX) or cpu == data["cpu"]:
        return data["costs"][k]
    return data.get("by_cpu", {}).get(cpu, {}).get(k)


def agreement_figures(cpu: str | None = None) -> dict | None:
    """quantized_agreement.json's flows for this CPU class (None: never measured on it)."""
    data = json.loads((ROOT / "docs" / "quantized_agreement.json").read_text())
    cpu = cpu or cpu_class()
    if cpu == data["cpu"]:
        return data["flows"]
    return data.get("by_cpu", {}).get(cpu, {}).get("flows")


def load_bench() -> dict[tuple[str, int, bool], dict]:
    """The last measured line of each (workload, parties, tls) in benchmarks.jsonl, additive
    protocol (lines without a protocol field are additive; rss lines are not mixed in)."""
    rows = {}
    for line in BENCH.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            if ("error" not in row and "tls" in row and row.get("protocol", "additive") == "additive"
                    and row.get("offline_phase", True)):
                rows[(row["workload"], row["parties"], row["tls"])] = row
    return rows


def bench_disagreements(costs: dict | None = None, bench: dict | None = None) -> list[str]:
    """Benchmark lines whose rounds or bytes differ from costs.json (stale measurements)."""
    costs, bench = costs or load_costs(), bench or load_bench()
    out = []
    for (workload, parties, tls), row in bench.items():
        c = costs.get(key(workload, parties))
        if c is None:
            out.append(f"{workload} ({parties} parties): in benchmarks.jsonl, missing in costs.json")
            continue
        measured = {"rounds": row["rounds"], "bytes_sent": row["bytes_sent_per_party"],
                    "dealer_bytes": row.get("offline_dealer_bytes", 0) + row.get("online_dealer_bytes", 0)}
        for field, value in measured.items():
            if c[field] != value:
                out.append(f"{workload} ({parties} parties, tls={tls}): benchmarks.jsonl has {field}={value}, "
                           f"the code does {c[field]}: rerun `crypten-lite bench --parties {parties} --only "
                           f"{workload}{' --tls' if tls else ''} --out docs/benchmarks.jsonl`")
    return out


# ------------------------------------------------------------------------------ renderers
def mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.3f}"


def readme_bench(costs: dict, bench: dict, sources: dict) -> str:
    lines = ["| workload | parties | TLS | online s (median) | rounds | MB sent / party | dealer MB (offline) "
             "| max error |", "|---|---|---|---|---|---|---|---|"]
    for tls in (False, True):
        for workload, parties in BENCH_KEYS:
            row = bench.get((workload, parties, tls))
            if row is None:
                continue
            c = costs[key(workload, parties)]
            lines.append(f"| {workload} | {parties} | {'yes' if tls else 'no'} | {row['seconds_median']:.3f} | "
                         f"{c['rounds']} | {mb(max(c['bytes_sent']))} | {c['dealer_bytes'] / 1e6:.2f} | "
                         f"{row['max_error']:.1e} |")
    busy = [f"{w} ({p} parties{', TLS' if t else ''}): {r['load_average_1min']:g}"
            for (w, p, t), r in bench.items() if r.get("load_average_1min", 0) > r.get("cpus", 2)]
    if busy:
        lines += ["", "Rows measured while the machine was busier than its cores (1-minute load average): "
                  + "; ".join(busy) + "."]
    return "\n".join(lines) + "\n"


def readme_transport(costs: dict, bench: dict, sources: dict) -> str:
    row = bench[("transport_16MB", 2, False)]
    return (f"The 16 MB transport exchange (`transport_16MB`) reaches {row['mb_per_s']:.0f} MB/s per direction "
            f"against\n{row['bare_grpc_mb_per_s']:.0f} MB/s for a bare gRPC echo of the same bytes measured in "
            "the same run (the bare echo\nruns client and server in one process).\n")


def functions_comm(costs: dict, bench: dict, sources: dict) -> str:
    def cell(workload: str, parties: int, per: int, digits: int = 1) -> str:
        c = costs[key(workload, parties)]
        return f"{c['rounds']} / {max(c['bytes_sent']) / per:.{digits}f}"
    def other(system: str, op: str) -> str:
        f = external(sources, system, op)
        return f"{f['rounds']} / {f['bytes_per_element']:g}"
    lt2, relu2 = costs[key("lt_1M", 2)], costs[key("relu_1M", 2)]
    return "\n".join([
        "| op | 2 parties: rounds / bytes | 3 parties: rounds / bytes | CrypTen (2p) | SPU (2p) |",
        "|---|---|---|---|---|",
        f"| lt, le, gt, ge (also vs public) | **{cell('lt_1M', 2, 10**6)}** | {cell('lt_1M', 3, 10**6)} | "
        f"{other('crypten', 'lt')} | {other('spu', 'lt')} |",
        f"| relu, abs | **{cell('relu_1M', 2, 10**6)}** | {cell('relu_1M', 3, 10**6)} | {other('crypten', 'relu')} | "
        f"{other('spu', 'relu')} |",
        f"| eq, ne | {cell('eq_100k', 2, 10**5)} | {cell('eq_100k', 3, 10**5)} | | |",
        f"| sign | {cell('sign_100k', 2, 10**5)} | {cell('sign_100k', 3, 10**5)} | | |",
        f"| softmax [1000, 10] (per logit) | {cell('softmax_1000x10', 2, 10**4, 0)} | "
        f"{cell('softmax_1000x10', 3, 10**4, 0)} | | |",
        "",
        f"(2 parties: 10^6 elements, lt = {max(lt2['bytes_sent']):,} bytes and relu = "
        f"{max(relu2['bytes_sent']):,} bytes exactly,\n`crypten-lite bench --only lt_1M --only relu_1M`; eq and sign "
        "on 10^5 elements, workloads of\n`scripts/gen_doc_figures.py`. The CrypTen and SPU columns are measurements of "
        f"those systems\n({systems(sources)}), not of this code: `docs/external_figures.json` says where they come "
        "from.)",
    ]) + "\n"


def functions_accuracy(costs: dict, bench: dict, sources: dict) -> str:
    rows = [json.loads(line) for line in BENCH.read_text().splitlines()
            if line.strip() and json.loads(line).get("workload") == "accuracy"]
    rows = list({r["function"]: r for r in rows}.values())  # the last measurement of each function
    lines = ["| function | domain | max abs error | max rel error | rounds | bytes/elt |", "|---|---|---|---|---|---|"]
    for r in rows:
        rel = f"{r['max_rel']:.2e} ({r['rel_where']})".replace("|", "\\|") if "max_rel" in r else "-"
        lines.append(f"| {r['function']} | [{r['lo']:g}, {r['hi']:g}] | {r['max_abs']:.2e} | {rel} | "
                     f"{r['rounds']} | {r['bytes_per_element']:.0f} |")
    commits = sorted({r.get("commit", "unknown") for r in rows})
    return "\n".join(lines) + f"\n\n(Measured at commit {', '.join(commits)}, {rows[0]['points'] if rows else 0:,} " \
        "points per function, 2 parties.)\n"


def training_resnet(costs: dict, bench: dict, sources: dict) -> str:
    c, row = costs[key("resnet18_b1", 2)], bench.get(("resnet18_b1", 2, False))
    load = f" (measured at a 1-minute load average of {row['load_average_1min']:g} on {row['cpus']} cores)" \
        if row and "load_average_1min" in row else ""
    seconds = f"{row['seconds_median']:.1f} s online{load} and " if row else ""
    return (f"The standard ResNet-18 (width 64, 11.2 M parameters, BatchNorm folded into the convolutions by\n"
            f"`from_pytorch(..., fold_batch_norm=True)`), one 32x32 image (`crypten-lite bench --only\n"
            f"resnet18_b1`): {seconds}{c['rounds']} rounds, {max(c['bytes_sent']) / 2**20:.1f} MiB sent per party, "
            f"{c['dealer_bytes'] / 2**20:.1f} MiB\nfrom the dealer; max abs logit error "
            f"{row['max_error']:.1e} against torch.\n" if row else "")


def quantized_mpc(costs: dict, bench: dict, sources: dict) -> str:
    names = {"float": "float (fixed point, `nn.from_pytorch`)", "int8-eager": "int8 eager", "int8-fx": "int8 FX",
             "int8-pt2e": "int8 PT2E (float last linear)",
             "int8-eager-probabilistic": "int8 eager, probabilistic truncation"}
    lines = []
    for parties in (2, 3):
        lines += [f"| {parties} parties, {DIGITS_IMAGES} images | private argmax = torch's (one run) | final outputs vs torch (one run) "
                  "| rounds | bytes sent per party (per image) | dealer bytes |", "| --- | --- | --- | --- | --- | --- |"]
        for mode in DIGITS_MODES:
            c = costs.get(key(f"digits_cnn/{mode}", parties))
            if c is None:
                continue
            a, sent = c["agreement"], max(c["bytes_sent"])
            outputs = (f"{a['int8_identical'] * 100:g}% of int8 values identical (max {a['max_steps']} steps)"
                       if "int8_identical" in a else f"max abs diff {a['max_abs_diff']:.1e}")
            if mode == "float":
                outputs += " (vs the float model)"
            ratio = "" if mode == "float" or key("digits_cnn/float", parties) not in costs else \
                f"; {sent / max(costs[key('digits_cnn/float', parties)]['bytes_sent']):.3f} x float"
            lines.append(f"| {names[mode]} | {a['argmax_agree'] * 100:g}% | {outputs} | {c['rounds']} | "
                         f"{sent / 1e6:.2f} MB ({sent / DIGITS_IMAGES / 1e3:.1f} KB{ratio}) | {c['dealer_bytes'] / 1e6:.2f} MB |")
        lines.append("")
    return "\n".join(lines[:-1]) + "\n"


def load_examples() -> dict[str, dict]:
    """The last measured row of each example script in benchmarks.jsonl."""
    rows = {}
    for line in BENCH.read_text().splitlines():
        if line.strip() and json.loads(line).get("workload") == "example":
            row = json.loads(line)
            rows[row["script"]] = row
    return rows


def training_steps(costs: dict, bench: dict, sources: dict) -> str:
    def cell(workload: str, parties: int) -> str:
        c = costs[key(workload, parties)]
        row = bench.get((workload, parties, False))
        ms = f"{row['seconds_median'] * 1000:.0f} ms, " if row else ""
        return f"{ms}{c['rounds']} rounds, {max(c['bytes_sent']) / 1024:.0f} KiB"
    return "\n".join([
        "| step (party 0) | 2 parties | 3 parties |", "|---|---|---|",
        f"| logistic regression, 100 features, batch 100, BCE-with-logits (`logreg_sgd_step`) | "
        f"{cell('logreg_sgd_step', 2)} | {cell('logreg_sgd_step', 3)} |",
        f"| the same, also revealing the loss value | {cell('logreg_sgd_step_loss', 2)} | |",
        f"| MLP 64-64-10, batch 64, cross-entropy, momentum 0.9 | {cell('mlp_sgd_step', 2)} | "
        f"{cell('mlp_sgd_step', 3)} |",
    ]) + "\n"


def training_examples(costs: dict, bench: dict, sources: dict) -> str:
    rows = load_examples()
    lines = ["| example | private test accuracy | plaintext torch (same init, same batches) | per SGD step, party 0 |",
             "|---|---|---|---|"]
    names = {"examples/train_logistic_regression.py": "(64 -> 10)", "examples/train_mlp.py": "(64 -> 64 -> 10, ReLU)"}
    commits = set()
    for script in EXAMPLES:
        r = rows.get(script)
        if r is None:
            continue
        commits.add(r["commit"])
        lines.append(f"| `{script.split('/')[-1]}` {names[script]} | {r['private_accuracy']:.2f}% | "
                     f"{r['torch_accuracy']:.2f}% | {r['ms_per_step']:.0f} ms, {r['rounds_per_step']} rounds, "
                     f"{r['kib_per_step']} KiB sent |")
    loads = [f"{r['load_average_1min']:g}" for r in rows.values() if "load_average_1min" in r]
    busy = f", 1-minute load average {' / '.join(loads)} on {rows[EXAMPLES[0]]['cpus']} cores" if loads else ""
    return "\n".join(lines) + f"\n\n(Measured at commit {', '.join(sorted(commits))}{busy} by " \
        "`python scripts/gen_doc_figures.py --measure-examples`.)\n"


# ------------------------------------------------- measured figures of other sources (docs/*.json)
# Each file records where its figures come from ("provenance": command, commit, date, machine,
# and whether they were re-measured or transcribed once from the docs).
def load_sources() -> dict:
    """The JSON sources of the figures that are not rounds, bytes or bench seconds."""
    out = {name: json.loads((ROOT / "docs" / f"{name}.json").read_text()) for name in JSON_SOURCES}
    out["netns_bench"] = [json.loads(line) for line in NETNS.read_text().splitlines() if line.strip()]
    health = re.search(r"x-healthcheck:.*?\n\s+timeout: (\d+)s", (ROOT / "docker-compose.yml").read_text(), re.S)
    out["compose_health_timeout_s"] = int(health[1]) if health else None
    out["rss_bench"] = load_bench_rss()
    out["end_to_end"] = load_end_to_end()
    out["ring_gemm"] = [json.loads(line) for line in RING_GEMM.read_text().splitlines() if line.strip()] \
        if RING_GEMM.exists() else []
    # benchmarks/grpc_floor.py, profile_reveal.py, profile_mul_stages.py, grpc_throughput.py --json
    for name in ("grpc_floor", "reveal_profile", "mul_profile", "grpc_throughput"):
        path = ROOT / "docs" / f"{name}.json"
        out[name] = json.loads(path.read_text()) if path.exists() else None
    return out


def load_bench_rss() -> dict[str, dict]:
    """The last `crypten-lite bench --parties 3 --protocol rss` line of each workload in
    benchmarks.jsonl (without TLS), a workload not run for a missing operation included."""
    rows = {}
    for line in BENCH.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            if (row.get("protocol") == "rss" and not row.get("tls") and row.get("offline_phase", True)
                    and ("error" not in row or "missing" in row)):
                rows[row["workload"]] = row
    return rows


# docs/protocols.md's end-to-end table: four `crypten-lite bench --parties 3` runs of one
# session on one machine (additive and rss, each with its offline phase and with
# --no-offline), kept apart from benchmarks.jsonl because their seconds compare only with each
# other (the machine that measured them is named in each line's cpu_model).
END_TO_END = ROOT / "docs" / "end_to_end.jsonl"
RING_GEMM = ROOT / "docs" / "ring_gemm.jsonl"


def architecture_ring_gemm(costs: dict, bench: dict, sources: dict) -> str:
    """docs/ARCHITECTURE.md: torch's int64 ring products against float64 limbs, per CPU
    (docs/ring_gemm.jsonl, written by benchmarks/limb_matmul.py --json; the last line of each
    shape on each CPU)."""
    last: dict[tuple[str, str], dict] = {}
    for row in sources["ring_gemm"]:
        last[(row["cpu_model"], row["shape"])] = row
    machines = list(dict.fromkeys(cpu for cpu, _ in last))
    lines = ["| product | " + " | ".join(f"{cpu}: int64 / limbs" for cpu in machines) + " |",
             "| --- |" + " --- |" * len(machines)]
    for shape in dict.fromkeys(s for _, s in last):
        cells = []
        for cpu in machines:
            r = last.get((cpu, shape))
            cells.append("" if r is None else f"{r['int64_seconds']:.3f} s / {r['limbs_seconds']:.3f} s "
                         f"({r['int64_seconds'] / r['limbs_seconds']:.1f}x{', equal' if r['equal'] else ', DIFFERENT'})")
        lines.append(f"| {shape} | " + " | ".join(cells) + " |")
    notes = []
    for cpu in machines:
        rows = [r for (c, _), r in last.items() if c == cpu]
        notes.append(f"{cpu}: torch kernels {rows[0]['torch_kernels']}, {rows[0]['threads']} threads, "
                     f"auto picks {rows[0]['auto']} (commit {rows[0]['commit']}, {rows[0]['date']}, "
                     f"load average {max(r['load_average_1min'] for r in rows)})")
    return "\n".join(lines) + "\n\n" + para(
        "(Medians of 3, `python benchmarks/limb_matmul.py --json docs/ring_gemm.jsonl`; " + "; ".join(notes) + ".)")


# What each pattern of benchmarks/grpc_floor.py is (its module docstring says more).
GRPC_PATTERNS = {
    "tcp": "plain socket, TCP_NODELAY: the wire",
    "tcp_exchange": "both send, then both receive: a reveal's shape",
    "bidi_sync": "one bidirectional stream, queue-fed",
    "unary_sync": "one unary call per round trip",
    "unary_stream_single": "replies on `SingleThreadedUnaryStream`, pings unary",
    "push_pair": "crypten_lite's pattern until issue 32: a client stream each way, handler thread -> queue",
    "aio_bidi": "grpc.aio, one event loop per process, no other thread",
    "push_pair_exchange": "the pattern above in a reveal's shape, none of crypten_lite's code",
    "push_pair_direct_exchange": "as above, the main thread reads the server's request iterator",
    "subscribe_pair_exchange": "each side subscribes to the other, read with `SingleThreadedUnaryStream` (issue 32's transport subscribes, read through the channel's thread)",
    "unary_future_exchange": "one unary call per message, not awaited",
}
REVEAL_STAGES = {
    "send": "op above the transport before sending (shares, packing; Beaver's differences for mul)",
    "queued": "framing and queuing the message (`_Outbox.send`)",
    "dequeued": "hand-off to the handler thread of the peer's subscription",
    "accepted": "gRPC: sender's core, loopback, receiver's core and channel thread, main thread woken",
    "put": "checks, tensor and mailbox (`_Inbox._accept`)",
    "woken": "message out of the mailbox (`GrpcCommunicator._recv` returns)",
    "done": "op above the transport after receiving (sum, decode; Beaver's recombination, truncation)",
}


def architecture_grpc_floor(costs: dict, bench: dict, sources: dict) -> str:
    """docs/ARCHITECTURE.md: the 64-byte round trip of each gRPC Python pattern against raw TCP
    (docs/grpc_floor.json, written by benchmarks/grpc_floor.py --json)."""
    run = sources["grpc_floor"]
    if run is None:
        return "(not measured yet: `python benchmarks/grpc_floor.py --json docs/grpc_floor.json`)\n"
    lines = ["| pattern | median us | x raw TCP | min us | p90 us |", "| --- | --- | --- | --- | --- |"]
    for r in run["patterns"]:
        what = GRPC_PATTERNS.get(r["pattern"], "")
        lines.append(f"| `{r['pattern']}`{' (' + what + ')' if what else ''} | {r['median_us']:.1f} | "
                     f"{r['ratio_to_tcp']:.1f} | {r['min_us']:.1f} | {r['p90_us']:.1f} |")
    return "\n".join(lines) + "\n\n" + para(
        f"(`{run['command'].strip()}`, {run['date']}, {run['samples']} round trips per pattern, grpc "
        f"{run['grpc']}, {run['cpus']} CPUs, 1-minute load average {run['load_average_1min']}.)")


def architecture_reveal_stages(costs: dict, bench: dict, sources: dict) -> str:
    """docs/ARCHITECTURE.md: the median of each stage of a small opening between two real
    parties (docs/reveal_profile.json, written by benchmarks/profile_reveal.py --json)."""
    run = sources["reveal_profile"]
    if run is None:
        return "(not measured yet: `python benchmarks/profile_reveal.py --json docs/reveal_profile.json`)\n"
    ops = run["ops"]
    lines = ["| stage | " + " | ".join(o["op"] for o in ops) + " |", "| --- |" + " --- |" * len(ops)]
    for stage, what in REVEAL_STAGES.items():
        lines.append(f"| {what} | " + " | ".join(f"{o['stage_us_median'].get(stage, 0):.0f}" for o in ops) + " |")
    lines.append("| whole op, median | " + " | ".join(f"{o['median_us']:.0f}" for o in ops) + " |")
    cpu = run["cpu_per_message"]
    return "\n".join(lines) + "\n\n" + para(
        f"(Microseconds, medians over both directions; `{run['command'].strip()}`, {run['date']}, "
        f"{run['cpus']} CPUs, 1-minute load average "
        f"{max([run['load_average_1min']] + [o['load_average_1min'] for o in ops])}. crypten_lite's own "
        f"transport code, CPU time alone in one thread: {cpu['send_us']} us to frame and queue a message, "
        f"{cpu['receive_us']} us to parse, check and deliver it.)")


# Each stage of benchmarks/profile_mul_stages.py (its module docstring says more).
MUL_STAGES = {
    "triple": "the prefetched triple handed over (`provider.get`)",
    "fill": "x - a and y - b written straight into the 4 frames, each queued as written (`streamed.send_filled`)",
    "idle": "last frame queued -> the peer's first chunk in hand",
    "read": "the rest of the wait: gRPC handing the peer's chunks over, checks",
    "sum": "the peer's chunks summed with this party's values, chunk by chunk",
    "recombine": "Beaver c + e b + a d (+ e d on rank 0) and the truncation, range by range",
    "total": "whole product",
    "peer_fill_to_first_chunk": "wire: peer starts filling -> its first chunk here",
    "peer_fill_done_to_last_chunk": "wire: peer's last frame queued -> its last chunk summed here",
    "faults_main": "minor page faults, main thread (count)",
}


def architecture_mul_stages(costs: dict, bench: dict, sources: dict) -> str:
    """docs/ARCHITECTURE.md: the median of each stage of mul 1M on both parties
    (docs/mul_profile.json, written by benchmarks/profile_mul_stages.py --json)."""
    run = sources["mul_profile"]
    if run is None:
        return "(not measured yet: `python benchmarks/profile_mul_stages.py --json docs/mul_profile.json`)\n"
    parties = run["parties"]
    lines = ["| stage | " + " | ".join(f"party {p['rank']}" for p in parties) + " |",
             "| --- |" + " --- |" * len(parties)]
    for stage, what in MUL_STAGES.items():
        fmt = (lambda v: f"{v:.0f}") if stage.startswith("faults") else (lambda v: f"{v:.2f}")
        lines.append(f"| {what} | " + " | ".join(fmt(p[stage]) for p in parties) + " |")
    return "\n".join(lines) + "\n\n" + para(
        f"(Milliseconds unless counted, medians over {parties[0]['products']} products of {run['n']:,} "
        f"elements; `{run['command'].strip()}`, {run['date']}, commit {run['commit']}, {run['cpus']} CPUs, "
        f"torch threads {parties[0]['torch_threads']}, 1-minute load average "
        f"{' -> '.join(str(v) for v in run['load_average_1min'])}.)")


def architecture_grpc_throughput(costs: dict, bench: dict, sources: dict) -> str:
    """docs/ARCHITECTURE.md: 16 MiB each way over gRPC Python against raw TCP, same run
    (docs/grpc_throughput.json, written by benchmarks/grpc_throughput.py --json)."""
    run = sources["grpc_throughput"]
    if run is None:
        return "(not measured yet: `python benchmarks/grpc_throughput.py --json docs/grpc_throughput.json`)\n"
    lines = ["| pattern | chunk MiB | streams | median ms | GB/s per direction | x raw TCP | CPU ms |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in run["patterns"]:
        chunk = "-" if r["pattern"] == "tcp" else f"{r['chunk_mib']:g}"
        lines.append(f"| `{r['pattern']}` | {chunk} | {r['streams']} | {r['median_ms']:.1f} | "
                     f"{r['gb_per_s']:.2f} | {r['ratio_to_tcp']:.2f} | {r.get('cpu_ms', float('nan')):.1f} |")
    return "\n".join(lines) + "\n\n" + para(
        f"(`{run['command'].strip()}`, {run['date']}, {run['repeat']} exchanges per pattern, round "
        f"robin; CPU ms: the measuring process's CPU time per exchange, every thread, less "
        f"sensitive to the load than the wall time; grpc {run['grpc']}, {run['cpus']} CPUs, 1-minute load average "
        f"{' -> '.join(str(v) for v in run['load_average_1min'])}.)")


def load_end_to_end() -> dict[tuple[str, str, bool], dict]:
    """The last line of each (workload, protocol, offline phase) in docs/end_to_end.jsonl."""
    rows = {}
    if END_TO_END.exists():
        for line in END_TO_END.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                if "error" not in row and row.get("parties") == 3 and not row.get("tls"):
                    rows[(row["workload"], row["protocol"], row.get("offline_phase", True))] = row
    return rows


# Workloads of docs/protocols.md's side-by-side table (3 parties).
PROTOCOL_WORKLOADS = ("mul_1M", "mul_int_1M", "matmul_256", "matmul_int_256", "matmul_1024", "relu_1M", "lt_1M",
                      "softmax_1000x10", "lenet_b1", "lenet_b64", "resnet18_b1", "logreg_sgd_step")


def protocols_bench(costs: dict, bench: dict, sources: dict) -> str:
    """docs/protocols.md: each workload at 3 parties, additive (costs.json's exact rounds and
    bytes, bench seconds) beside rss (its bench line)."""
    lines = ["| workload | additive: rounds | MB sent / party | dealer MB | online s | rss: rounds | "
             "MB sent / party | offline MB / party | online s | rss max error |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    busy = []
    for workload in PROTOCOL_WORKLOADS:
        c, a = costs.get(key(workload, 3)), bench.get((workload, 3, False))
        additive = (f"{c['rounds']} | {mb(max(c['bytes_sent']))} | {c['dealer_bytes'] / 1e6:.2f}"
                    if c else "- | - | -") + (f" | {a['seconds_median']:.3f}" if a and c else " | -")
        r = sources["rss_bench"].get(workload)
        if r is None:
            rss = "not measured | | | |"
        elif "missing" in r:
            rss = f"not run: lacks {r['missing']} | | | |"
        else:
            offline = max(r.get("offline_bytes_sent_per_party") or [0])
            rss = (f"{r['rounds']} | {mb(max(r['bytes_sent_per_party']))} | {mb(offline)} | "
                   f"{r['seconds_median']:.3f} | {r['max_error']:.1e}")
            if r.get("load_average_1min", 0) > r.get("cpus", 2):
                busy.append(f"{workload} {r['load_average_1min']:g}")
        lines.append(f"| {workload} | {additive} | {rss} |")
    if busy:
        lines += ["", "rss rows measured while the machine was busier than its cores (1-minute load average): "
                  + "; ".join(busy) + "."]
    return "\n".join(lines) + "\n"


def protocols_end_to_end(costs: dict, bench: dict, sources: dict) -> str:
    """docs/protocols.md: seconds end to end at 3 parties (docs/end_to_end.jsonl): each
    protocol's offline phase plus its online run, and runs without an offline phase (`bench
    --no-offline`: the dealer answers online; rss truncates by the helper truncation)."""
    e2e = sources["end_to_end"]
    lines = ["| workload | additive: offline + online s | additive, no offline phase: rounds, s | "
             "rss: offline + online s | rss, no offline phase: rounds, MB sent / party, s |",
             "|---|---|---|---|---|"]
    machines, slower, compared, ring = set(), [], 0, {}
    for workload in PROTOCOL_WORKLOADS + ("bert_layer_tiny",):
        a, na = e2e.get((workload, "additive", True)), e2e.get((workload, "additive", False))
        r, nr = e2e.get((workload, "rss", True)), e2e.get((workload, "rss", False))
        if not any((a, na, r, nr)):
            continue
        machines |= {row.get("cpu_model", "unknown") for row in (a, na, r, nr) if row}
        for row in (a, na, r, nr):
            if row:
                ring.setdefault(row.get("ring_gemm") or "int64 (before the limbs)", []).append(row)
        both = (lambda row: f"{row['offline_seconds']:.3f} + {row['seconds_median']:.3f} = "
                f"{row['offline_seconds'] + row['seconds_median']:.3f}" if row else "not measured")
        cells = [both(a), f"{na['rounds']}, {na['seconds_median']:.3f}" if na else "not measured", both(r),
                 (f"{nr['rounds']}, {mb(max(nr['bytes_sent_per_party']))}, {nr['seconds_median']:.3f}"
                  if nr else "not measured")]
        lines.append(f"| {workload} | " + " | ".join(cells) + " |")
        if all((a, na, r, nr)):
            compared += 1
            totals = [a["offline_seconds"] + a["seconds_median"], na["seconds_median"],
                      r["offline_seconds"] + r["seconds_median"]]
            if nr["seconds_median"] >= min(totals):
                slower.append(workload)
    lines += ["", f"rss without an offline phase is the fastest of the four end to end on "
              f"{compared - len(slower)} of the {compared} workloads measured all four ways"
              + (f" (not on: {', '.join(slower)})" if slower else "")
              + ". Measured on: " + "; ".join(sorted(machines)) + ". Large ring products ran as "
              + "; ".join(f"{how} in {len(rows)} of the {sum(map(len, ring.values()))} runs"
                          for how, rows in sorted(ring.items(), key=lambda kv: -len(kv[1])))
              + " (docs/ARCHITECTURE.md, \"Ring products\")."]
    return "\n".join(lines) + "\n"


def protocols_aby3(costs: dict, bench: dict, sources: dict) -> str:
    """docs/protocols.md: issue 14's SPU ABY3 figures (docs/external_figures.json, "aby3")
    beside the rss bench lines and the 3-party additive ones, with the issue's targets (at
    least 2x faster than ABY3 in seconds; LeNet's rounds and MB; lt <= 7 rounds and 24 B,
    ReLU <= 7 rounds and 32 B per element per party)."""
    ext, rss = sources["external_figures"]["aby3"], sources["rss_bench"]
    f = ext["figures"]

    def mine(workload: str, with_mb: bool) -> str:
        r = rss.get(workload)
        if r is None or "missing" in r:
            return "not measured"
        out = f"{r['seconds_median']:.3f} s"
        return out + (f", {r['rounds']} rounds, {mb(max(r['bytes_sent_per_party']))} MB" if with_mb else "")

    def additive(workload: str) -> str:
        a = bench.get((workload, 3, False))
        return f"{a['seconds_median']:.3f} s" if a and key(workload, 3) in costs else "-"


    def per_output(workload: str, n: int = 10**6) -> str:
        """Rounds and bytes per output element (largest party) of an rss bench line."""
        r = rss.get(workload)
        if r is None or "missing" in r:
            return "not measured"
        return f"{r['rounds']} round{'s' if r['rounds'] != 1 else ''}, {max(r['bytes_sent_per_party']) / n:.2f} B"

    lines = [f"| workload | {ext['system']} {ext['version']} ABY3 | target | crypten_lite rss | "
             "crypten_lite additive, 3 parties + dealer |", "|---|---|---|---|---|"]
    for w in ("mul_1M", "relu_1M", "lenet_b1", "lenet_b64"):
        with_mb = "mb_sent_per_party" in f[w]
        theirs = f"{f[w]['seconds']:g} s" + (f", {f[w]['mb_sent_per_party']:g} MB" if with_mb else "")
        more = {"lenet_b1": ", <= 40 rounds, <= 0.4 MB", "lenet_b64": ", <= 25 MB"}.get(w, "")
        lines.append(f"| {w} | {theirs} | <= {f[w]['seconds'] / 2:g} s{more} | {mine(w, with_mb)} | {additive(w)} |")
    lines.append("| mul / matmul, per output element | | 1 round, 8 B | protocol product (integer tensors): "
                 f"{per_output('mul_int_1M', 10**6)} (`mul_int_1M`), {per_output('matmul_int_256', 256 * 256)} "
                 f"(`matmul_int_256`); fixed point, exact truncation fused: {per_output('mul_1M', 10**6)} "
                 f"(`mul_1M`), {per_output('matmul_256', 256 * 256)} (`matmul_256`) | - |")
    for name, w, bound in (("lt", "lt_1M", (7, 24)), ("relu", "relu_1M", (7, 32))):
        lines.append(f"| {name}, per element | {f[name]['rounds']} rounds, {f[name]['bytes_per_element']:g} B | "
                     f"<= {bound[0]} rounds, <= {bound[1]} B | {per_output(w)} | - |")
    return "\n".join(lines) + "\n"


def external(sources: dict, system: str, workload: str) -> dict:
    """The figures of another system (docs/external_figures.json) for one workload."""
    for f in sources["external_figures"]["figures"]:
        if f["system"] == system and f["workload"] == workload:
            return f
    raise KeyError(f"docs/external_figures.json has no {system} figures for {workload}")


def systems(sources: dict) -> str:
    return " and ".join(f"{s['system']} {s['version']}" for s in sources["external_figures"]["systems"].values())


def para(text: str) -> str:
    """One paragraph, its lines filled to 100 columns (the renderers' prose)."""
    return textwrap.fill(" ".join(text.split()), 100, break_long_words=False, break_on_hyphens=False) + "\n"


def span(values, fmt: str = "g", unit: str = "") -> str:
    lo, hi = (f"{v:{fmt}}" for v in values)
    return f"{lo}{unit}" if lo == hi else f"{lo}-{hi}{unit}"


def readme_external(costs: dict, bench: dict, sources: dict) -> str:
    def lenet(system: str, workload: str) -> str:
        f = external(sources, system, workload)
        parts = [f"{f['seconds']:g} s"] + ([f"{f['rounds']} rounds"] if "rounds" in f else []) + \
            [f"{f['mb_sent_per_party']:g} MB"]
        return ", ".join(parts)
    relu_c, relu_s = external(sources, "crypten", "relu"), external(sources, "spu", "relu")
    ext = sources["external_figures"]
    return para(f"Figures of other systems, for comparison only: measured for {systems(sources)} (not for this code)\n"
                f"on {ext['provenance']['machine']}; `docs/external_figures.json` says where they come from. "
                f"CrypTen / SPU:\nLeNet batch 1 {lenet('crypten', 'lenet_b1')} / {lenet('spu', 'lenet_b1')}; batch 64 "
                f"{lenet('crypten', 'lenet_b64')} / {lenet('spu', 'lenet_b64')};\nCrypTen's logistic-regression step "
                f"{external(sources, 'crypten', 'logreg_sgd_step')['seconds']:g} s; ReLU {relu_c['rounds']} rounds, "
                f"{relu_c['bytes_per_element']:g} B per element (CrypTen) and\n{relu_s['rounds']} rounds, "
                f"{relu_s['bytes_per_element']:g} B (SPU).\n")


def readme_image(costs: dict, bench: dict, sources: dict) -> str:
    image = sources["container"]["image"]
    return para(f"The image measured {image['size_gb']:g} GB (torch {image['torch']}, scikit-learn) in the container "
                f"test's run of\n{image['provenance']['date']} (`docs/container.json`).\n")


def deployment_health(costs: dict, bench: dict, sources: dict) -> str:
    h = sources["container"]["health"]
    c, host = h["container"], h["host"]
    return para(f"Health checks run `crypten-lite health --target NAME:PORT` (the standard gRPC health service);\n"
                f"that command imports grpc only, not torch ({span(c['grpc_only_s'], unit=' s')} in the container against "
                f"{span(c['whole_package_s'], unit=' s')} with\nthe whole package, measured at load average "
                f"{c['load_average']} on 2 cores; {span(host['grpc_only_s'])} s against "
                f"{span(host['whole_package_s'], unit=' s')} on\nthe host at {host['load_average']} load; "
                f"{h['provenance']['date']}), so it answers inside its {sources['compose_health_timeout_s']} s timeout "
                "(`docker-compose.yml`).\n")


def deployment_image(costs: dict, bench: dict, sources: dict) -> str:
    image, ex = sources["container"]["image"], sources["container"]["example_online"]
    return para("The image (`Dockerfile`) installs a CPU-only torch from PyTorch's CPU index by default (build\n"
                f"argument `TORCH_PIP_ARGS`; PyPI's Linux torch is the CUDA build: an image of {image['cuda_torch_image_gb']:g} "
                "GB) and the\n`examples` extra (scikit-learn) that the parties' script needs. `BASE_IMAGE` (default\n"
                "`python:3.11-slim`) and `TORCH_VERSION` are build arguments too; where no registry is\n"
                "reachable, `scripts/docker_base_image.sh` builds a local Debian 12 base with debootstrap.\n"
                "Party 0 trains its model on its own digits, shares the weights; party 1 shares its images; both\n"
                "print the same `private prediction: [...]` line and the online cost\n"
                f"(`online: {ex['seconds']:.2f} s, {ex['rounds']} rounds, {ex['mb_sent']:.2f} MB sent by this party` in a "
                "run of the example;\nrounds and bytes are the same in every run, the seconds depend on the machine).\n")


def minutes(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m} min {s} s" if m and s else f"{m} min" if m else f"{s} s"


def deployment_container_test(costs: dict, bench: dict, sources: dict) -> str:
    i = sources["container"]["image"]
    lo, hi = i["rebuild_s"]
    return para(f"Measured in a passing run ({i['provenance']['date']}, `docs/container.json`): image {i['size_gb']:g} GB "
                f"(torch\n{i['torch']}, scikit-learn); debootstrap base {minutes(i['debootstrap_base_s'])}; first image build "
                f"{minutes(i['first_build_s'])},\nrebuild after a code change {minutes(lo)} to {minutes(hi)} (at load average "
                f"{i['rebuild_load_average']}); the whole test with engine,\nbase and torch layer already there "
                f"{i['whole_test_min']} min at load average {span(i['whole_test_load_average'])} (the compose run about "
                f"{i['compose_run_min']} min\nof it, party 0's training included; predictions `{i['predictions']}` in the "
                f"container and\nunder launch); `down --volumes` {minutes(i['down_s'])}.\n")


def deployment_compose_netns(costs: dict, bench: dict, sources: dict) -> str:
    n = sources["container"]["compose_netns"]
    return para(f"The test takes {span(n['seconds'], unit=' s')} on an idle machine, mostly party 0 training its model "
                f"({n['provenance']['date']}).\n")


RATE_NAMES = {"unlimited": "unlimited", "100mbit": "100 Mbit/s", "10mbit": "10 Mbit/s"}
NETNS_LABELS = {"example:private_inference": ("examples/private_inference.py, 16 img", "private inference"),
                "matmul_256": ("matmul 256x256 (`matmul_256`)", "matmul 256"),
                "lenet_b1": ("LeNet-5, batch 1 (`lenet_b1`)", "LeNet batch 1"),
                "logreg_sgd_step": ("logistic regression SGD step, 100x100 (`logreg_sgd_step`)", "logreg SGD step")}


def netns_rows(sources: dict) -> dict[tuple[str, str], dict]:
    """(workload, rate) -> the last line of docs/netns_bench.jsonl without a delay."""
    return {(r["workload"], r["rate"]): r for r in sources["netns_bench"] if r.get("delay", "0ms") == "0ms"}


def quoted_disagreements(sources: dict | None = None) -> list[str]:
    """Figures of docs/quoted_figures.json (inside sentences and list items) that a doc no longer says."""
    sources = sources or load_sources()
    out = []
    for f in sources["quoted_figures"]["figures"]:
        text = " ".join((ROOT / f["doc"]).read_text().split())
        want = f["text"].format(*f["values"])
        if want not in text:
            out.append(f"{f['doc']} should say {want!r} (docs/quoted_figures.json: {f['what']})")
    return out


def netns_disagreements(costs: dict | None = None, sources: dict | None = None) -> list[str]:
    """Lines of docs/netns_bench.jsonl whose rounds or bytes differ from costs.json."""
    costs, sources = costs or load_costs(), sources or load_sources()
    out = []
    for r in sources["netns_bench"]:
        c = costs.get(key(r["workload"], 2))
        if c is None or "rounds" not in r:
            continue
        for field, got in (("rounds", r["rounds"]), ("bytes_sent", r.get("bytes_sent_per_party", c["bytes_sent"]))):
            if got != c[field]:
                out.append(f"docs/netns_bench.jsonl: {r['workload']} at {r['rate']} has {field}={got}, the code does "
                           f"{c[field]}: rerun `sudo python benchmarks/netns_bench.py --json docs/netns_bench.jsonl`")
    return out


def _cost_of(workload: str, rows: dict, costs: dict) -> tuple[int, float, float | None]:
    """Rounds, MB sent per party and dealer MB: costs.json for a bench workload, else the measured line."""
    c = costs.get(key(workload, 2))
    if c is not None:
        return c["rounds"], max(c["bytes_sent"]) / 1e6, c["dealer_bytes"] / 1e6
    r = rows[(workload, "unlimited")]
    return r["rounds"], r.get("mb_sent_per_party", max(r.get("bytes_sent_per_party", [0])) / 1e6), None


def deployment_network(costs: dict, bench: dict, sources: dict) -> str:
    rows = netns_rows(sources)
    rates = [rate for rate in RATE_NAMES if any(k[1] == rate for k in rows)]
    first = rows[("matmul_256", "unlimited")]
    rtts = [r["rtt_ms"] for r in rows.values() if r.get("rtt_ms") is not None]
    rtt_text = f"RTT {span((min(rtts), max(rtts)), '.2f')} ms between the parties" if rtts else "RTT < 0.1 ms"
    load = [r["load_average_1min"] for r in rows.values() if "load_average_1min" in r]
    if load:
        rtt_text += f"; 1-minute load average {span((min(load), max(load)))} on {first.get('cpus', '?')} cores"
    lines = [para(f"Measured by `benchmarks/netns_bench.py` (commit {first.get('commit', '?')}, {first['date']}; "
             "`docs/netns_bench.jsonl`, its\nlines " + ("transcribed once from this page" if first.get("measured") ==
                                                     "transcribed" else "as the script wrote them")
             + f"): dealer and two parties in separate network namespaces on a bridge\n({rtt_text}), mutual TLS, "
             "each host's egress shaped with `tc ... tbf` (burst 256 kbit, queue 50 ms).\nOnline phase, seconds of the "
             "slowest party; the bench workloads fetch the dealer's corrections in\nan offline phase first (last column, "
             "at 10 Mbit/s), the example fetches them during its run;\nrounds and bytes as in `docs/costs.json`:"), 
             "| workload (2 parties) | R | MB sent / party | dealer MB | " + " | ".join(RATE_NAMES[r] for r in rates)
             + " | offline at 10 Mbit/s |", "|---|---:|---:|---:|" + "---:|" * len(rates) + "---:|"]
    workloads = [w for w in NETNS_LABELS if (w, "unlimited") in rows]
    for w in workloads:
        rounds, mb, dealer = _cost_of(w, rows, costs)
        off = rows.get((w, "10mbit"), {}).get("offline_seconds")
        lines.append(f"| {NETNS_LABELS[w][0]} | {rounds} | {mb:.2f} | {'-' if dealer is None else f'{dealer:.2f}'} | "
                     + " | ".join(f"{rows[(w, r)]['seconds']:.2f} s" if (w, r) in rows else "-" for r in rates)
                     + f" | {'(in the run)' if off is None else f'{off:.2f} s'} |")
    ex = rows[("example:private_inference", "10mbit")]
    repeat = rows[("matmul_256", "unlimited")]["repeat"]
    lo, hi = ex.get("seconds_range_of_3_runs", (ex["seconds"], ex["seconds"]))
    varied = f", which varied between {lo:g} and {hi:g} s at 10 Mbit/s over three runs" if lo != hi else ""
    lines += ["", para(f"(Medians of {repeat} runs for the bench workloads, one run for the example{varied}; "
                       "differences under 0.1 s are noise on this VM.)")]
    # what the table says about the links (from its rounded seconds)
    m_mb = _cost_of("matmul_256", rows, costs)[1]
    seconds = {r: rows[("matmul_256", r)]["seconds"] for r in rates}
    eff = {r: m_mb * 8 / (seconds[r] - seconds["unlimited"]) for r in ("100mbit", "10mbit")}
    m_dealer = _cost_of("matmul_256", rows, costs)[2]
    off = rows[("matmul_256", "10mbit")]["offline_seconds"]
    ex_rounds, ex_mb, _ = _cost_of("example:private_inference", rows, costs)
    ex_unl = rows[("example:private_inference", "unlimited")]["seconds"]
    predicted = ex_unl + ex_mb * 8 / eff["10mbit"]
    l_rounds, l_mb, _ = _cost_of("lenet_b1", rows, costs)
    l_extra = rows[("lenet_b1", "10mbit")]["seconds"] - rows[("lenet_b1", "unlimited")]["seconds"]
    lines += [para(
        f"Bandwidth. The bulk exchange (`matmul_256`: {m_mb:.2f} MB each way at once, one round) reached\n"
        f"{eff['100mbit']:.0f} Mbit/s on the 100 Mbit/s link and {eff['10mbit']:.1f} Mbit/s on the 10 Mbit/s one "
        f"({eff['100mbit']:.0f} % and {eff['10mbit'] * 10:.0f} % of\nthe shaped rate, from the seconds above), while the "
        f"one-way offline transfer of the dealer's {m_dealer:.2f} MB\nreached {m_dealer * 8 / off:.1f} Mbit/s "
        f"({off:.2f} s). So the loss comes from both directions being saturated together,\nprobably each direction's "
        "ACKs queueing behind the other's data in the 50 ms tbf queue. With\nthat effective bandwidth the model "
        f"predicts the example at 10 Mbit/s as {ex_unl:.2f} + {ex_mb * 8:.1f} Mbit /\n{eff['10mbit']:.1f} Mbit/s = "
        f"{predicted:.1f} s (measured {span((lo, hi))} s). Workloads whose bytes are spread over many rounds do\n"
        f"better than the bulk figure: LeNet's extra {l_extra:.2f} s at 10 Mbit/s is what its {l_mb * 8:.1f} Mbit take "
        f"at the\nfull rate ({l_mb * 8 / 10:.2f} s), compute overlapping the transfers. Budget the bytes term at "
        "60-100 % of the\nnominal rate, the low end when both parties send at once."),
        para("Latency. This kernel has no `sch_netem`, so delay was not emulated (`netns_bench.py --delay 20ms` "
             "does it where netem exists). Each round costs one RTT, so the rounds above give:"),
        "| workload | R | + at 1 ms RTT (LAN) | + at 20 ms (region) | + at 80 ms (intercontinental) |",
        "|---|---:|---:|---:|---:|"]
    for w in workloads:
        rounds = _cost_of(w, rows, costs)[0]
        cells = [rounds * rtt for rtt in (0.001, 0.020, 0.080)]
        lines.append(f"| {NETNS_LABELS[w][1]} | {rounds} | "
                     + " | ".join(f"{t:.1f} s" if t >= 1 else f"{t:.2f} s" for t in cells) + " |")
    return "\n".join(lines) + "\n"


def deployment_faults(costs: dict, bench: dict, sources: dict) -> str:
    k = sources["faults"]["kill_detection"]
    runs = k["runs"]
    lines = [f"Time from SIGKILL to the survivor's error line, over {len(runs)} runs of {k['kills_per_run']} kills each "
             f"({len(runs) * k['kills_per_run']} kills;\n{k['provenance']['date']}, commit {k['provenance']['commit']}, "
             "`docs/faults.json`):", "", "| run | min | median | max |", "|-----|----:|-------:|----:|"]
    lines += [f"| {r['run']} | {r['min_ms']:.1f} ms | {r['median_ms']:.1f} ms | {r['max_ms']:.1f} ms |" for r in runs]
    slow = [r["max_ms"] for r in runs if r["max_ms"] >= 500]
    outliers = f", and the {'one ' if len(slow) == 1 else ''}{' / '.join(f'{s / 1000:.1f} s' for s in slow)} " \
        f"outlier{'s' if len(slow) > 1 else ''}," if slow else ""
    worst = max(r["max_ms"] for r in runs) / 1000
    lines += ["", para(f"(the spread{outliers} is CPU scheduling on the loaded VM; the worst, {worst:.2f} s, is far "
                       f"from the {k['timeout_s']} s deadline).")]
    return "\n".join(lines)


def deployment_kill_loop(costs: dict, bench: dict, sources: dict) -> str:
    k = sources["faults"]["kill_loop"]
    a, *rest = k["runs"]
    text = (f"With the machine's two cores loaded far beyond capacity (load average about {a['load_average']:g}), "
            f"{a['mid_protocol']} of\n{a['kills']} kills landed mid-protocol and {a['reported']} were reported, "
            f"{a['hangs']} hangs: kill to error {a['min_ms']:g} ms min,\n{a['median_ms']:g} ms median, "
            f"{a['max_ms']:g} ms max")
    for b in rest:
        text += (f"; again with {b['extra_load']} (load average about {b['load_average']:g}):\n"
                 f"{b['mid_protocol']} of {b['kills']}, {b['hangs']} hangs, {b['min_ms']:g} ms min, "
                 f"{b['median_ms']:g} ms median, {b['max_ms']:g} ms max")
    return para(text + f" ({k['provenance']['date']}, `docs/faults.json`).")


def deployment_fuzz(costs: dict, bench: dict, sources: dict) -> str:
    f = sources["fuzz"]
    mem = ", ".join(f"{who} +{mib} MiB" for who, mib in f["memory_growth_mib"].items())
    return para(f"Figures of the last run ({f['provenance']['date']}, `docs/fuzz.json`): {f['frames']:,} frames "
                f"({f['frames_first_pass']:,} in the\nfirst pass, {f['frames_during_computation']:,} during the computation), "
                f"{f['rpcs']:,} RPCs, {f['frames_per_s']} frames/s from the\nsingle-threaded Python fuzzer "
                f"({span(f['frames_per_s_range_across_runs'])} frames/s across runs, depending on the load); "
                f"{f['crashes']} crashes,\n{f['wrong_results']} wrong results, every server healthy afterwards; memory "
                f"growth over the whole\nfuzzing: {mem} (peak RSS {span(f['peak_rss_mib_range'])} MiB).\n")


def description_sizes() -> dict:
    """Exact sizes of the float model descriptions docs/private_models.md quotes (deterministic:
    the architecture alone; no parties needed): the test suite's vendor CNN and ResNet-18."""
    import importlib.util
    import torch
    import crypten_lite
    from crypten_lite.models import build_model
    from crypten_lite.nn import graph_desc

    spec = importlib.util.spec_from_file_location("_vendor_models", ROOT / "tests" / "protocol" / "_vendor_models.py")
    vendor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vendor)
    resnet_torch = build_model(64)
    cnn = crypten_lite.nn.from_pytorch(vendor.float_cnn(), torch.zeros(1, 1, 8, 8), fold_batch_norm=True)
    resnet = crypten_lite.nn.from_pytorch(resnet_torch, torch.zeros(1, 3, 32, 32), fold_batch_norm=True, check=False)
    return {"vendor_cnn_bytes": len(graph_desc.describe_graph(cnn, [[1, 1, 8, 8]])),
            "resnet18_bytes": len(graph_desc.describe_graph(resnet, [[1, 3, 32, 32]])),
            "resnet18_float32_parameter_bytes": 4 * sum(p.numel() for p in resnet_torch.parameters())}


def private_models_sizes(costs: dict, bench: dict, sources: dict) -> str:
    d = sources["model_descriptions"]["sizes"]
    return para("The description is small: for a float model it holds no tensor data at all (the digits CNN of "
                f"the tests: {d['vendor_cnn_bytes']:,} bytes; ResNet-18 with BatchNorm folded: {d['resnet18_bytes']:,} "
                f"bytes, for a model of {d['resnet18_float32_parameter_bytes'] / 2**20:.1f} MiB of float32 parameters; "
                "`docs/model_descriptions.json`, written by `python scripts/gen_doc_figures.py --measure-descriptions` "
                "and asserted by `tests/protocol/test_inband_models.py`, which recomputes them). An "
                "int8 program adds its public constants (a few KB for the examples' digits CNNs; "
                "`examples/quantized_inference.py` prints the figure).")


def _digits_test_module():
    """tests/unit/test_quantized_digits.py: the digits CNN and the agreement figures of quantized.md."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("_quantized_digits", ROOT / "tests" / "unit" / "test_quantized_digits.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure_quantized() -> dict:
    """The agreement figures of every flow (deterministic; about a minute)."""
    import warnings
    warnings.filterwarnings("ignore")
    digits = _digits_test_module()
    model, calib, x, y = digits.digits_data()
    return {flow: digits.flow_figures(flow, digits.quantize_flow(flow, model, calib), x, y)
            for flow in ("eager", "fx", "pt2e")}


def sci(value: float) -> str:
    """2.4e-6, not 2.4e-06."""
    return re.sub(r"e([+-])0*(\d)", r"e\1\2", f"{value:.1e}")


def pct(fraction: float) -> str:
    if fraction == 1:
        return "100%"
    text = f"{100 * fraction:.2f}".rstrip("0").rstrip(".")
    return "> 99.99%" if text == "100" else f"{text}%"


FLOW_NAMES = {"eager": "eager", "fx": "FX", "pt2e": "PT2E"}


def quantized_agreement(costs: dict, bench: dict, sources: dict) -> str:
    flows = sources["quantized_agreement"]["flows"]
    lines = ["| flow | int8 values (every layer torch exposes) | output | class agreement | accuracy torch / program |",
             "| --- | --- | --- | --- | --- |"]
    for flow, f in flows.items():
        what = "layers" if f["int8_layers"] == f["layers"] else "quantize / dequantize nodes"
        out = (f"int8, {pct(f['output_identical'])} identical" if f["output_kind"] == "quant"
               else f"float (last linear), max abs diff {sci(f['output_max_abs'])}")
        lines.append(f"| {FLOW_NAMES[flow]} | {pct(f['int8_identical'])} identical on all {f['int8_layers']} {what} | "
                     f"{out} | {pct(f['class_agreement'])} | {100 * f['accuracy_torch']:.1f}% / "
                     f"{100 * f['accuracy_program']:.1f}% |")
    fixed = max(f["fixed_max_abs"] for f in flows.values())
    return "\n".join(lines) + "\n\n" + para(
        "In the PT2E graph the second conv, the residual add and the cat stay float; in fixed point they are "
        f"within {sci(fixed)} (a few units of `2**-20`, torch's float32 rounding) of torch.")


def quantized_cpu(costs: dict, bench: dict, sources: dict) -> str:
    """quantized.md: the figures of the other CPU classes (agreement and digits costs)."""
    agreement = sources["quantized_agreement"]
    by_cost = json.loads(COSTS.read_text()).get("by_cpu", {})
    out = [para(
        "**Other CPUs.** torch's float32 calibration and its int8 kernels are not the same on every CPU, "
        "so these figures are kept per class of CPU (torch's kernel class, "
        "`torch.backends.cpu.get_cpu_capability()`; the tests compare with the figures of the class they run on). "
        f"The tables above are from {agreement['cpu']}.")]
    for cpu in sorted(set(agreement.get("by_cpu", {})) | set(by_cost)):
        parts = []
        entry = agreement.get("by_cpu", {}).get(cpu)
        if entry:
            flows = entry["flows"]
            for flow, f in flows.items():
                main = agreement["flows"][flow]
                widest = f["multipliers"][0]["widest_truncation_bits"]
                parts.append(f"{FLOW_NAMES[flow]} {pct(f['int8_identical'])} of int8 values identical on its worst layer "
                             f"({pct(main['int8_identical'])} above), widest truncation {widest} bits "
                             f"({main['multipliers'][0]['widest_truncation_bits']} above)")
        privately = []
        for k, c in by_cost.get(cpu, {}).items():
            if costs.get(k) and (c["rounds"], c["bytes_sent"]) != (costs[k]["rounds"], costs[k]["bytes_sent"]):
                mode, parties = k.split("/")[1], k.split("/")[2]
                privately.append(f"{mode} at {parties[:-1]} parties {c['rounds']} rounds and "
                                 f"{max(c['bytes_sent']) / 1e6:.2f} MB per party ({costs[k]['rounds']} and "
                                 f"{max(costs[k]['bytes_sent']) / 1e6:.2f} MB in the table below)")
        same = sorted(k.split("/")[1] for k, c in by_cost.get(cpu, {}).items()
                      if costs.get(k) and (c["rounds"], c["bytes_sent"]) == (costs[k]["rounds"], costs[k]["bytes_sent"]))
        where = entry["provenance"].get("cpu_model") if entry else None
        text = f"On {cpu}" + (f" (measured on {where})" if where else "") + ": " + "; ".join(parts) + "."
        if privately:
            text += " Privately: " + "; ".join(privately) + "; " + \
                ("the other int8 modes cost the same as below." if same else "") 
        out.append(para(text))
    out.append(para(
        "Both differences are torch's. Its float32 calibration sums in another order with other vector widths, so "
        "some scales land a float32 ulp apart, which changes requantization multipliers and with them the integer "
        "program. And its int8 kernels compute a few values differently. On CPUs without AVX-512 VNNI, torch's x86 "
        "int8 convs and linears add pairs of uint8 x int8 products in int16 with saturation: where large activations "
        "meet large weights, torch's output is not the exact integer result, and crypten_lite's, which is exact, "
        "differs from it there (the digits CNN's second conv on AVX2 above; inputs far outside the calibration "
        "range, which reach the ends of the uint8 range). The 7-bit activation range of torch's x86 qconfig keeps "
        "most calibrated values clear of it. Its quantized average pooling rounds ties differently for "
        "channels-last and contiguous inputs without AVX-512: `compare_layers` and `output_agreement` score a "
        "program against the better of torch's two answers."))
    return "\n".join(out)


def quantized_multipliers(costs: dict, bench: dict, sources: dict) -> str:
    flows = sources["quantized_agreement"]["flows"]
    lines = ["| `multiplier_bits`, `max_bits` | " + " | ".join(FLOW_NAMES[f] for f in flows) + " | widest truncation |",
             "| --- | --- | --- | --- | --- |"]
    settings = [(r["multiplier_bits"], r["max_bits"]) for r in flows["eager"]["multipliers"]]
    for i, (mb, mx) in enumerate(settings):
        cells, widths = [], {}
        for flow, f in flows.items():
            r = f["multipliers"][i]
            if "unsupported" in r:
                cells.append("needs `frac_bits` below 20")
                continue
            cells.append(pct(r["int8_identical"]) + (f" (max {r['max_steps']})" if r["max_steps"] > 1 else ""))
            widths[flow] = r["widest_truncation_bits"]
        common = widths.get("eager")
        other = [f"{w} {FLOW_NAMES[flow]}" for flow, w in widths.items() if w != common]
        widest = f"{common} bits" + (f" ({', '.join(other)})" if other else "")
        default = " (default)" if (mb, mx) == (24, 62) else ""
        lines.append(f"| {mb}, {mx}{default} | " + " | ".join(cells) + f" | {widest} |")
    prov = sources["quantized_agreement"]["provenance"]
    return "\n".join(lines) + "\n\n" + para(
        f"(`docs/quantized_agreement.json`, written by `{prov['command']}` at commit {prov['commit']}, "
        f"{prov['date']}; `tests/unit/test_quantized_digits.py` recomputes every figure of both tables and "
        "compares.)")


def quantized_steps(costs: dict, bench: dict, sources: dict) -> str:
    def c(name: str, parties: int = 2) -> dict:
        return costs[key(f"quantized_ops/{name}", parties)]

    def per(name: str, parties: int = 2, count: int = QOPS_ELEMENTS) -> str:
        return f"{round(max(c(name, parties)['bytes_sent']) / count, 3):g}"
    msb, clamp1, clamp2, pool = c("msb16"), c("clamp1"), c("clamp2"), c("maxpool2x2")
    rnd, requant, up, even = c("round33"), c("requant_clamp"), c("round2"), c("round2_even")
    clamp_rounds = f"{clamp2['rounds']}" if clamp1["rounds"] == clamp2["rounds"] else \
        f"{clamp1['rounds']} / {clamp2['rounds']}"
    extra = (max(even["bytes_sent"]) - max(up["bytes_sent"])) / QOPS_ELEMENTS
    rows = [
        "| step | protocol (2 parties) | rounds | bytes per element and party |", "| --- | --- | --- | --- |",
        "| comparison `x < 0`, `x` on `m <= 16` bits | short MSB: carry tree over the `m` low bits of the shares, "
        f"level 1 from one masked opening, lane-packed (`msb_low`) | {msb['rounds']} | {per('msb16')} (64 bits: "
        f"{c('msb64')['rounds']}, {per('msb64')}) |",
        "| clamp, one bound / two bounds | `lo + [x > lo](x - lo)`; two bounds with ONE bit-times-value product: "
        f"`lo + (b_lo ^ b_hi)(x - lo) + (hi - lo) b_hi` | {clamp_rounds} | {per('clamp1')} / {per('clamp2')} |",
        "| max pooling | windows gathered locally (padding `-2**bits`), `ceil(log2 k)` levels of `b + [a > b](a - b)` "
        f"on `bits + 2` bits | {pool['rounds'] // 2} per level | {per('maxpool2x2', count=3 * QOPS_ELEMENTS)} per "
        "comparison |",
        f"| rounding `round(v / 2**k)` | exact carry of the shares' low bits (below) | {rnd['rounds']} | "
        f"{per('round33')} |",
        "| rounding then clamp (a layer's requantization) | the clamp's comparisons from the shares' high bits with "
        "the rounding's carry as carry-in, all trees in lockstep (`requantize_clamp`) | "
        f"{requant['rounds']} ({rnd['rounds'] + clamp2['rounds']} in sequence) | {per('requant_clamp')} (two bounds) |",
        "| `half_even` (pooling ties) | tie bit `[v mod 2**(k+1) == 2**(k-1)]` by two short MSBs and a NOR, "
        f"subtracted in the rounding's B2A | +{even['rounds'] - up['rounds']} | +{round(extra, 3):g} (k = 2) |",
    ]
    msb3, rnd3 = c("msb16", 3), c("round33", 3)
    return "\n".join(rows) + "\n\n" + para(
        f"(Exact, `docs/costs.json`: {QOPS_ELEMENTS:,} values shared by party 0; comparisons on 15-bit values, clamps of "
        "9-bit values to [0, 255], 2x2 pooling of 8-bit values, rounding of 42-bit values by `2**33`, a "
        "requantization by `2**20` into [0, 255], half_even on a division by 4; asserted by "
        "`tests/protocol/test_doc_costs.py`.)") + "\n" + para(
        "With 3 or more parties the short MSB first reduces the N shares to two by carry-save layers (one round "
        f"each; at 3 parties {msb3['rounds']} rounds, {per('msb16', 3)} bytes sent per element by each party), and "
        "the rounding opens `c = v + r` with a dealer mask (`trunc_exact`) and compares `c` with `r`'s XOR-shared "
        f"bits: {rnd3['rounds']} rounds, {per('round33', 3)} bytes sent per element by each party (to the two "
        "others); the rounding and the clamp then run one after the other.")


def quantized_probabilistic(costs: dict, bench: dict, sources: dict) -> str:
    a = costs[key("digits_cnn/int8-eager-probabilistic", 2)]["agreement"]
    return para("Measured on the digits CNN below (`MpcBackend(truncation=\"probabilistic\")`, "
                f"{DIGITS_IMAGES} images, last row of the 2-party table, one run): only "
                f"{a['int8_identical'] * 100:g}% of the final int8 outputs are identical to torch's, up to "
                f"{a['max_steps']} steps apart, and the private argmax agrees with torch's on "
                f"{a['argmax_agree'] * 100:g}% of the images.")


# Values of the digits CNN (examples/quantized_inference.py) per image: conv1's 8 x 8 x 8 outputs, the
# 2x2 max pooling's 8 x 4 x 4 outputs (3 comparisons each), the Beaver-opened inputs of conv1 (64),
# conv2 (128) and the linear (64), and the weights opened once per run (72 + 576 + 640).
DIGITS_VALUES = {"conv1_outputs": 512, "pool_outputs": 128, "beaver_inputs": 256, "weights": 1288}


def quantized_bytes(costs: dict, bench: dict, sources: dict) -> str:
    def per(name: str) -> float:
        return max(costs[key(f"quantized_ops/{name}", 2)]["bytes_sent"]) / QOPS_ELEMENTS
    v = DIGITS_VALUES
    parts = {"rounding": v["conv1_outputs"] * per("round33"),
             "pooling": v["pool_outputs"] * per("maxpool2x2"),  # per() of the pooling: 3 comparisons per output
             "clamp": v["pool_outputs"] * per("clamp1"),
             "beaver": 8 * (v["beaver_inputs"] + v["weights"] / DIGITS_IMAGES)}
    total = max(costs[key("digits_cnn/int8-eager", 2)]["bytes_sent"]) / DIGITS_IMAGES
    kb = {k: f"{b / 1000:.1f}" for k, b in parts.items()}
    return para(
        "Where the bytes go (2 parties, eager, per image; the step table's exact per-element bytes times the CNN's "
        f"values): the first conv's rounding on {v['conv1_outputs']} values ({kb['rounding']} KB), the 2x2 max "
        f"pooling ({3 * v['pool_outputs']} short comparisons, {kb['pooling']} KB), its clamp ({v['pool_outputs']} "
        f"values, {kb['clamp']} KB), the Beaver openings of the convs' and the linear's {v['beaver_inputs']} inputs "
        f"and, once per {DIGITS_IMAGES} images, their {v['weights']:,} weights ({kb['beaver']} KB), the remaining "
        f"requantizations with their clamps (the rest of the {total / 1000:.1f} KB: about "
        f"{(total - sum(parts.values())) / 1000:.0f} KB). The float run pays "
        f"{per('msb64'):g}-byte MSBs for every ReLU and pooling comparison, and its local truncations cost nothing.")


def migration_acceptance(costs: dict, bench: dict, sources: dict) -> str:
    """CrypTen's test files on crypten_lite.compat: one row per file and variant class, then
    the totals over every test of every variant (excluded ones named in the doc)."""
    data = sources["crypten_compat"]
    rows = data["rows"]

    def passed(r: dict) -> int:
        return r["verified"] if r.get("verified") is not None else r["first_run"]
    lines = ["| file | variant | tests | excluded | run | passed | pass rate of those run |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        variant = f"{r['variant']} ({r['variant_note']})" if r.get("variant_note") else r["variant"]
        tests, public = r["tests_in_file"] or 0, r["public"] or 0
        if r.get("verified") is None or r["verified"] == r["first_run"]:
            cell = f"{r['first_run']}"
        else:
            cell = f"{r['first_run']} first run, {r['verified']} verified"
        rate = f"{100 * passed(r) / public:.0f} %" if public else "-"
        lines.append(f"| {r['file']} | {variant} | {tests} | {tests - public} | {public} | {cell} | {rate} |")
    total = sum(r["tests_in_file"] or 0 for r in rows)
    run = sum(r["public"] or 0 for r in rows)
    ok = sum(passed(r) for r in rows)
    totals: dict = {}
    for r in rows:
        t = totals.setdefault(r["variant"], [0, 0])
        t[0], t[1] = t[0] + passed(r), t[1] + (r["public"] or 0)
    by_variant = ", ".join(f"{v} {p} of {n}" for v, (p, n) in totals.items() if n)
    records = [r["run"] for r in rows if "run" in r] + [x for r in rows for x in r.get("reruns", [])]
    dates = sorted({x["date"] for x in records})
    commits = sorted({x["commit"] for x in records})
    return "\n".join(lines) + "\n\n" + para(
        f"Every variant of every file: {total} tests, {total - run} of them excluded (listed below), "
        f"{run} run. Passed: {ok} of the {run} run ({100 * ok / run:.1f} %), {ok} of all {total} "
        f"({100 * ok / total:.1f} %). By variant, of the tests run: {by_variant}.") + "\n" + para(
        f"(`docs/crypten_compat.json`, written by `benchmarks/crypten_compat_tests.py --json` "
        f"({', '.join(dates)}, commit{'s' if len(commits) > 1 else ''} {', '.join(commits)}); each row "
        "keeps its own run record. \"verified\": with the tests of a row rerun on their own after a "
        "fix (`--rerun`, each rerun with its own record).)")


RENDERERS: dict[str, Callable[[dict, dict, dict], str]] = {
    "protocols-bench": protocols_bench,
    "protocols-aby3": protocols_aby3,
    "protocols-end-to-end": protocols_end_to_end,
    "architecture-ring-gemm": architecture_ring_gemm,
    "architecture-grpc-floor": architecture_grpc_floor,
    "architecture-reveal-stages": architecture_reveal_stages,
    "architecture-mul-stages": architecture_mul_stages,
    "architecture-grpc-throughput": architecture_grpc_throughput,
    "training-steps": training_steps,
    "training-examples": training_examples,
    "readme-bench": readme_bench,
    "readme-transport": readme_transport,
    "functions-comm": functions_comm,
    "functions-accuracy": functions_accuracy,
    "training-resnet": training_resnet,
    "quantized-mpc": quantized_mpc,
    "readme-external": readme_external,
    "readme-image": readme_image,
    "deployment-health": deployment_health,
    "deployment-image": deployment_image,
    "deployment-container-test": deployment_container_test,
    "deployment-compose-netns": deployment_compose_netns,
    "deployment-network": deployment_network,
    "deployment-faults": deployment_faults,
    "deployment-kill-loop": deployment_kill_loop,
    "deployment-fuzz": deployment_fuzz,
    "migration-acceptance": migration_acceptance,
    "private-models-sizes": private_models_sizes,
    "quantized-agreement": quantized_agreement,
    "quantized-multipliers": quantized_multipliers,
    "quantized-cpu": quantized_cpu,
    "quantized-steps": quantized_steps,
    "quantized-probabilistic": quantized_probabilistic,
    "quantized-bytes": quantized_bytes,
}


def render(path: pathlib.Path, costs: dict, bench: dict, sources: dict | None = None) -> str:
    """The text of `path` with every figures block rewritten (sources: load_sources())."""
    sources = load_sources() if sources is None else sources

    def sub(m: re.Match) -> str:
        name = m["name"]
        if name not in RENDERERS:
            raise SystemExit(f"{path.relative_to(ROOT)}: unknown figures block {name!r} (known: {sorted(RENDERERS)})")
        return m.group(1) + RENDERERS[name](costs, bench, sources) + m.group(4)
    return BLOCK.sub(sub, path.read_text())


def stale_blocks() -> list[str]:
    """One message per block whose text differs from what render() writes, with the diff."""
    costs, bench, sources = load_costs(), load_bench(), load_sources()
    out = []
    for path in DOCS:
        old = path.read_text()
        new = render(path, costs, bench, sources)
        if old == new:
            continue
        old_blocks = {m["name"]: m["body"] for m in BLOCK.finditer(old)}
        for m in BLOCK.finditer(new):
            if old_blocks.get(m["name"]) != m["body"]:
                diff = "\n".join(difflib.unified_diff(old_blocks.get(m["name"], "").splitlines(),
                                                      m["body"].splitlines(), "in the doc", "from the sources",
                                                      lineterm="", n=0))
                out.append(f"{path.relative_to(ROOT)}: figures block {m['name']!r} is stale "
                           f"(run python scripts/gen_doc_figures.py):\n{diff}")
    return out


def blocks_in_docs() -> dict[str, list[str]]:
    """Block name -> files that contain it."""
    found: dict[str, list[str]] = {}
    for path in DOCS:
        for m in BLOCK.finditer(path.read_text()):
            found.setdefault(m["name"], []).append(str(path.relative_to(ROOT)))
    return found


# ------------------------------------------------------------------------ measuring costs
def _digits_party(program, images, options: dict) -> dict:
    """Online cost of one private run of the digits CNN as examples/quantized_inference.py
    counts it: weights from party 0, images from party 1, the output revealed to everybody."""
    import crypten_lite
    from crypten_lite import comm
    from crypten_lite.quantized import QuantizedCrypTensor, run_private
    from crypten_lite.session import current

    c, provider = comm.get(), current().provider
    c.barrier()
    c.reset_communication_stats()
    dealer_before = provider.stats["dealer_bytes"]
    secret = run_private(program, images if crypten_lite.get_rank() == 1 else None, reveal=False, **options)
    quant = isinstance(secret, QuantizedCrypTensor)
    out = (secret.int_repr() if quant else secret).get_plain_text()
    return {**c.get_communication_stats(), "dealer_bytes": provider.stats["dealer_bytes"] - dealer_before,
            "output": out, "int8_output": quant}


def _cost(results: list[dict]) -> dict:
    return {"rounds": int(results[0]["rounds"]), "bytes_sent": [int(r["bytes_sent"]) for r in results],
            "dealer_bytes": int(results[0].get("dealer_bytes", 0) + results[0].get("offline_dealer_bytes", 0))}


def eq_100k() -> dict:
    """x == y on 100,000 private elements (party 0's x, party 1's y)."""
    import torch
    import crypten_lite
    from crypten_lite import bench
    g = torch.Generator().manual_seed(16)  # insecure-ok: benchmark inputs, not shares
    a = torch.randint(-3, 4, (100_000,), generator=g).float()
    b = torch.randint(-3, 4, (100_000,), generator=g).float()
    x, y = crypten_lite.cryptensor(a, src=0), crypten_lite.cryptensor(b, src=1)
    return bench._measure(lambda: (bench._reveal_after(lambda: x == y), a == b))


def sign_100k() -> dict:
    """sign(x) on 100,000 private elements."""
    import torch
    import crypten_lite
    from crypten_lite import bench
    a = bench._data(17, 100_000, scale=10)
    x = crypten_lite.cryptensor(a, src=0)
    return bench._measure(lambda: (bench._reveal_after(lambda: x.sign()), a.sign()))


def mlp_sgd_step() -> dict:
    """One SGD step (momentum 0.9) of a 64-64-10 MLP on a batch of 64, cross-entropy on
    one-hot targets: party 0's model, party 1's data (examples/train_mlp.py's step)."""
    import torch
    import crypten_lite
    from crypten_lite import bench, comm, nn, optim
    rank = comm.get().rank
    torch.manual_seed(0)  # insecure-ok: benchmark inputs and public model init, not shares
    features = bench._data(18, 64, 64)
    labels = torch.nn.functional.one_hot(torch.arange(64) % 10, 10).float()
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    model.encrypt(src=0)
    x = crypten_lite.cryptensor(features if rank == 1 else None, src=1)
    y = crypten_lite.cryptensor(labels if rank == 1 else None, src=1)
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        return torch.zeros(1), None
    return bench._measure(step)


def logreg_sgd_step_loss() -> dict:
    """The bench's logreg_sgd_step, also revealing the loss value."""
    from crypten_lite import bench
    return bench.logreg_step(read_loss=True)


EXTRA_WORKLOADS = {"eq_100k": eq_100k, "sign_100k": sign_100k, "mlp_sgd_step": mlp_sgd_step,
                   "logreg_sgd_step_loss": logreg_sgd_step_loss}


# The protocol steps of docs/quantized.md's "step" table (crypten_lite.quantized.mpc_ops), each
# on QOPS_ELEMENTS values shared by party 0: key -> (what, parties it is measured at).
QOPS_ELEMENTS = 1024
QOPS = {"msb16": (2, 3), "msb64": (2,), "clamp1": (2,), "clamp2": (2,), "maxpool2x2": (2,), "round33": (2, 3),
        "round2": (2,), "round2_even": (2,), "requant_clamp": (2,)}


def quantized_ops() -> dict[str, dict]:
    """Exact cost of each mpc_ops step on QOPS_ELEMENTS int64 values (party function)."""
    import torch
    import crypten_lite
    from crypten_lite import comm
    from crypten_lite.mpc import primitives
    from crypten_lite.quantized import mpc_ops
    from crypten_lite.session import current

    g = torch.Generator().manual_seed(19)  # insecure-ok: benchmark inputs, not shares
    n, c, provider = QOPS_ELEMENTS, comm.get(), current().provider

    def values(bits: int, shape=(QOPS_ELEMENTS,)) -> torch.Tensor:
        x = torch.randint(-(1 << bits), 1 << bits, shape, generator=g)
        return primitives.share(x if crypten_lite.get_rank() == 0 else None, 0, shape)
    steps = {
        "msb16": (lambda x: mpc_ops.msb_low(x, 16), 15),
        "msb64": (lambda x: mpc_ops.msb_low(x, 64), 62),
        "clamp1": (lambda x: mpc_ops.clamp(x, 0, None, 9), 9),
        "clamp2": (lambda x: mpc_ops.clamp(x, 0, 255, 9), 9),
        "round33": (lambda x: mpc_ops.round_shift(x, 33, 42), 41),
        "round2": (lambda x: mpc_ops.round_shift(x, 2, 10), 9),  # a 2x2 average pooling's division
        "round2_even": (lambda x: mpc_ops.round_shift(x, 2, 10, "half_even"), 9),
        "requant_clamp": (lambda x: mpc_ops.requantize_clamp(x, 20, 7, 0, 255, out_bits=10), 28),
    }
    out = {}
    for name in QOPS:
        if c.world_size not in QOPS[name]:
            continue
        if name == "maxpool2x2":  # 2x2 windows over 64x64 values: 1024 outputs, 3 comparisons each
            x = values(8, (1, 1, 64, 64))
            run = lambda: mpc_ops.max_pool2d(x, (2, 2), (2, 2), (0, 0), (1, 1), False, bits=8)  # noqa: E731
        else:
            fn, bits = steps[name]
            x = values(bits)
            run = lambda: fn(x)  # noqa: E731
        c.barrier()
        c.reset_communication_stats()
        before = provider.stats["dealer_bytes"]
        run()
        stats = c.get_communication_stats()
        out[name] = {"rounds": int(stats["rounds"]), "bytes_sent": int(stats["bytes_sent"]),
                     "dealer_bytes": int(provider.stats["dealer_bytes"] - before)}
    return out


def qops_costs(pool) -> dict[str, dict]:
    """costs.json entries of the mpc_ops steps, run between the pool's parties."""
    results = pool.run(quantized_ops)
    parties = len(results)
    return {key(f"quantized_ops/{name}", parties): {
        "rounds": results[0][name]["rounds"], "bytes_sent": [r[name]["bytes_sent"] for r in results],
        "dealer_bytes": results[0][name]["dealer_bytes"], "elements": QOPS_ELEMENTS}
        for name in results[0]}


def bench_cost(pool, workload: str) -> dict:
    """Exact cost of a bench workload or one of EXTRA_WORKLOADS, run between the pool's parties."""
    from crypten_lite import bench
    fn = EXTRA_WORKLOADS.get(workload) or bench.WORKLOADS[workload]
    return _cost(pool.run(fn))


def _digits_float_party(model, images) -> dict:
    """The float model through nn.from_pytorch (fixed point), counted like _digits_party."""
    import crypten_lite
    from crypten_lite import comm
    from crypten_lite.session import current

    private = crypten_lite.nn.from_pytorch(model, images[:2])
    private.encrypt(src=0)
    private.eval()
    c, provider = comm.get(), current().provider
    c.barrier()
    c.reset_communication_stats()
    dealer_before = provider.stats["dealer_bytes"]
    x = crypten_lite.cryptensor(images if crypten_lite.get_rank() == 1 else None, src=1)
    out = private(x).get_plain_text()
    return {**c.get_communication_stats(), "dealer_bytes": provider.stats["dealer_bytes"] - dealer_before,
            "output": out}


_DIGITS: dict = {}


def digits_costs(pool, modes) -> dict[str, dict]:
    """Exact cost of each int8 mode on the digits CNN of examples/quantized_inference.py."""
    import torch
    sys.path.insert(0, str(ROOT / "examples"))
    import cloudpickle
    import quantized_inference as demo
    from crypten_lite.quantized import from_quantized

    cloudpickle.register_pickle_by_value(demo)  # the parties need DigitsNet's code, not its module

    if "model" not in _DIGITS:  # trained once per process (seeded: the same model every time)
        train_x, train_y, test_x, _ = demo.load_data()
        _DIGITS.update(model=demo.train(train_x, train_y), calib=train_x[:400], images=test_x[:DIGITS_IMAGES])
    model, images = _DIGITS["model"], _DIGITS["images"]
    out = {}
    if "float" in modes:
        plain = copy.deepcopy(model).eval()
        for name in ("skip", "join"):  # FloatFunctional modules the float forward never calls
            if hasattr(plain, name):
                delattr(plain, name)
        results = pool.run(_digits_float_party, plain, images)
        with torch.no_grad():
            ref = model(images)
        got = results[0]["output"]
        out["float"] = {**_cost(results), "agreement": {
            "argmax_agree": round(float((got.argmax(1) == ref.argmax(1)).double().mean()), 4),
            "max_abs_diff": float(f"{float((got - ref).abs().max()):.1e}")}}
    for mode in [m for m in modes if m != "float"]:
        qmodel = demo.quantize(model, _DIGITS["calib"], mode.split("-")[1])
        program = from_quantized(qmodel, images[:2])
        options = {"truncation": "probabilistic"} if mode.endswith("probabilistic") else {}
        results = pool.run(_digits_party, program, images, options)
        with torch.no_grad():
            ref = qmodel(images)
        got, info = results[0]["output"], program.output_info
        if results[0]["int8_output"]:
            steps = (got - (torch.round(ref.double() / info.scale).long() + info.zero_point)).abs()
            agreement = {"int8_identical": round(float((steps == 0).double().mean()), 4),
                         "max_steps": int(steps.max())}
            got = info.to_real(got)
        else:
            agreement = {"max_abs_diff": float(f"{float((got - ref).abs().max()):.1e}")}
        agreement["argmax_agree"] = round(float((got.argmax(1) == ref.argmax(1)).double().mean()), 4)
        out[mode] = {**_cost(results), "agreement": agreement}
    return out


def measure(keys: list[str]) -> dict[str, dict]:
    from crypten_lite.mpc import PartyPool

    out: dict[str, dict] = {}
    for parties in (2, 3):
        wanted = [w for w, p in BENCH_KEYS + EXTRA_KEYS if p == parties and key(w, p) in keys]
        digits = [m for m in DIGITS_MODES if key(f"digits_cnn/{m}", parties) in keys]
        qops = any(k.startswith("quantized_ops/") and k.endswith(f"/{parties}p") for k in keys)
        if not wanted and not digits and not qops:
            continue
        with PartyPool(parties, timeout=600) as pool:
            if qops:
                out.update(qops_costs(pool))
            for workload in wanted:
                out[key(workload, parties)] = bench_cost(pool, workload)
                print(f"{key(workload, parties)}: {out[key(workload, parties)]}", file=sys.stderr)
            for mode, cost in (digits_costs(pool, digits) if digits else {}).items():
                out[key(f"digits_cnn/{mode}", parties)] = cost
                print(f"{key(f'digits_cnn/{mode}', parties)}: {cost}", file=sys.stderr)
    return out


def measure_examples() -> None:
    """Run each of EXAMPLES with `crypten-lite launch -n 2` and append its figures to benchmarks.jsonl."""
    import subprocess
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip() or "unknown"
    accuracy = re.compile(r"private test accuracy ([\d.]+)%, plaintext torch ([\d.]+)%")
    step = re.compile(r"per SGD step \(party 0\): (\d+) ms, (\d+) rounds, (\d+) KiB sent")
    for script in EXAMPLES:
        out = subprocess.run(["crypten-lite", "launch", "-n", "2", script], cwd=ROOT, capture_output=True,
                             text=True, timeout=1800).stdout
        a, s = accuracy.search(out), step.search(out)
        if not (a and s):
            raise SystemExit(f"{script}: no figures in its output:\n{out[-2000:]}")
        row = {"workload": "example", "script": script, "parties": 2, "commit": commit,
               "private_accuracy": float(a[1]), "torch_accuracy": float(a[2]), "ms_per_step": int(s[1]),
               "rounds_per_step": int(s[2]), "kib_per_step": int(s[3]),
               "load_average_1min": round(os.getloadavg()[0], 1), "cpus": os.cpu_count()}
        with BENCH.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(row, file=sys.stderr)


def write_costs(data: dict) -> None:
    """costs.json with one line per entry (readable diffs)."""
    def block(costs: dict, indent: str) -> str:
        return ",\n".join(f"{indent}{json.dumps(k)}: {json.dumps(v)}" for k, v in costs.items())

    by_cpu = ",\n".join(f"  {json.dumps(cpu)}: {{\n{block(entries, '   ')}\n  }}"
                         for cpu, entries in data.get("by_cpu", {}).items())
    COSTS.write_text('{\n "about": ' + json.dumps(data["about"]) + ',\n "cpu": ' + json.dumps(data["cpu"])
                     + ',\n "costs": {\n' + block(data["costs"], "  ") + "\n },\n \"by_cpu\": {\n"
                     + by_cpu + "\n }\n}\n")


def all_cost_keys() -> list[str]:
    return ([key(w, p) for w, p in BENCH_KEYS + EXTRA_KEYS]
            + [key(f"digits_cnn/{m}", p) for p in (2, 3) for m in DIGITS_MODES
               if p == 2 or not m.endswith("probabilistic")]
            + [key(f"quantized_ops/{name}", p) for p in (2, 3) for name, ps in QOPS.items() if p in ps])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only report stale blocks (exit 1 if any)")
    parser.add_argument("--measure-costs", nargs="*", metavar="KEY",
                        help="rerun these workloads (default: all) and update docs/costs.json first")
    parser.add_argument("--measure-descriptions", action="store_true",
                        help="recompute the model description sizes of docs/model_descriptions.json first")
    parser.add_argument("--measure-quantized", action="store_true",
                        help="recompute docs/quantized_agreement.json (quantized.md's agreement tables; a minute) first")
    parser.add_argument("--measure-examples", action="store_true",
                        help="run the training examples and append their figures to docs/benchmarks.jsonl first")
    args = parser.parse_args(argv)
    if args.measure_examples:
        measure_examples()
    if args.measure_quantized:
        import subprocess
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip() or "unknown"
        path = ROOT / "docs" / "quantized_agreement.json"
        data = json.loads(path.read_text())
        cpu = cpu_class()
        target = data if cpu == data["cpu"] else data.setdefault("by_cpu", {}).setdefault(cpu, {"provenance": {}})
        target["flows"] = measure_quantized()
        target["provenance"].update(commit=commit, date=__import__("time").strftime("%Y-%m-%d"),
                                    measured="by this script", command="python scripts/gen_doc_figures.py --measure-quantized",
                                    cpu_model=__import__("crypten_lite.bench", fromlist=["cpu_model"]).cpu_model())
        path.write_text(json.dumps(data, indent=1) + "\n")
    if args.measure_descriptions:
        path = ROOT / "docs" / "model_descriptions.json"
        data = json.loads(path.read_text())
        data["sizes"] = description_sizes()
        path.write_text(json.dumps(data, indent=1) + "\n")
    if args.measure_costs is not None:
        keys = args.measure_costs or all_cost_keys()
        unknown = sorted(set(keys) - set(all_cost_keys()))
        if unknown:
            parser.error(f"unknown cost keys {unknown}; known: {all_cost_keys()}")
        data = json.loads(COSTS.read_text())
        cpu = cpu_class()
        for k, entry in measure(keys).items():
            if k.startswith(CPU_DEPENDENT_PREFIX) and cpu != data["cpu"]:
                data.setdefault("by_cpu", {}).setdefault(cpu, {})[k] = entry
            else:
                data["costs"][k] = entry
        data["costs"] = {k: data["costs"][k] for k in all_cost_keys() if k in data["costs"]}
        for cpu, entries in data.get("by_cpu", {}).items():
            data["by_cpu"][cpu] = {k: entries[k] for k in all_cost_keys() if k in entries}
        write_costs(data)
    if args.check:
        problems = stale_blocks() + bench_disagreements() + netns_disagreements() + quoted_disagreements()
        print("\n\n".join(problems) or "every figure is up to date")
        return 1 if problems else 0
    costs, bench, sources = load_costs(), load_bench(), load_sources()
    for path in DOCS:
        new = render(path, costs, bench, sources)
        if new != path.read_text():
            path.write_text(new)
            print(f"updated {path.relative_to(ROOT)}")
    for problem in bench_disagreements(costs, bench) + netns_disagreements(costs, sources) + \
            quoted_disagreements(sources):
        print(f"warning: {problem}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
