"""Write the figures of README.md and docs/*.md from their one source.

    python scripts/gen_doc_figures.py                     # rewrite every figures block
    python scripts/gen_doc_figures.py --check             # exit 1 and name every stale block
    python scripts/gen_doc_figures.py --measure-costs     # rerun every workload, rewrite docs/costs.json
    python scripts/gen_doc_figures.py --measure-costs lenet_b1/2p digits_cnn/int8-eager/2p
    python scripts/gen_doc_figures.py --measure-examples  # run the training examples (minutes)

Sources (both in docs/):

* ``costs.json``: exact online rounds, bytes sent per party and dealer bytes of every
  workload, keyed ``WORKLOAD/Np`` (the bench workloads, EXTRA_WORKLOADS below, and the digits
  CNN of docs/quantized.md, whose entries also carry the agreement with torch of the run that
  measured them). Deterministic: ``--measure-costs`` computes them by running the workload
  between real parties (a PartyPool: separate processes, gRPC, the dealer), and
  tests/protocol/test_doc_costs.py plus tests/protocol/test_model_costs.py rerun them and
  assert every entry exactly.
* ``benchmarks.jsonl``: measured figures, one JSON line per run; for a workload measured
  several times the last line counts. Seconds and errors of ``crypten-lite bench --out
  docs/benchmarks.jsonl``; the training examples' rows (``"workload": "example"``) of
  ``--measure-examples``; the error table's rows (``"workload": "accuracy"``) of
  ``benchmarks/accuracy_table.py --json``.

A block in a Markdown file is the text between ``<!-- figures:NAME -->`` and
``<!-- /figures -->``; RENDERERS[NAME] writes it. tests/unit/test_doc_figures.py fails when a
block differs from what this script writes now, or when a benchmark line disagrees with
costs.json (then rerun the bench for that workload: the message gives the command).
"""

from __future__ import annotations

import argparse
import copy
import difflib
import json
import os
import pathlib
import re
import sys
from typing import Callable

ROOT = pathlib.Path(__file__).resolve().parents[1]
COSTS = ROOT / "docs" / "costs.json"
BENCH = ROOT / "docs" / "benchmarks.jsonl"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(<!-- figures:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /figures -->)", re.S)

# Bench workloads in costs.json: (workload, parties). The README table lists these rows.
BENCH_KEYS = [(w, 2) for w in ("mul_1M", "matmul_256", "matmul_1024", "relu_1M", "lt_1M", "softmax_1000x10",
                               "lenet_b1", "lenet_b64", "resnet18_b1", "logreg_sgd_step", "transport_16MB")] + \
             [(w, 3) for w in ("mul_1M", "relu_1M", "lt_1M", "softmax_1000x10", "lenet_b1", "logreg_sgd_step")]
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


def load_bench() -> dict[tuple[str, int, bool], dict]:
    """The last measured line of each (workload, parties, tls) in benchmarks.jsonl, additive
    protocol (lines without a protocol field are additive; rss lines are not mixed in)."""
    rows = {}
    for line in BENCH.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            if "error" not in row and "tls" in row and row.get("protocol", "additive") == "additive":
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


def readme_bench(costs: dict, bench: dict) -> str:
    lines = ["| workload | parties | TLS | online s (median of 3) | rounds | MB sent / party | dealer MB (offline) "
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


def readme_transport(costs: dict, bench: dict) -> str:
    row = bench[("transport_16MB", 2, False)]
    return (f"The 16 MB transport exchange (`transport_16MB`) reaches {row['mb_per_s']:.0f} MB/s per direction "
            f"against\n{row['bare_grpc_mb_per_s']:.0f} MB/s for a bare gRPC echo of the same bytes measured in "
            "the same run (the bare echo\nruns client and server in one process).\n")


def functions_comm(costs: dict, bench: dict) -> str:
    def cell(workload: str, parties: int, per: int, digits: int = 1) -> str:
        c = costs[key(workload, parties)]
        return f"{c['rounds']} / {max(c['bytes_sent']) / per:.{digits}f}"
    lt2, relu2 = costs[key("lt_1M", 2)], costs[key("relu_1M", 2)]
    return "\n".join([
        "| op | 2 parties: rounds / bytes | 3 parties: rounds / bytes | CrypTen (2p) | SPU (2p) |",
        "|---|---|---|---|---|",
        f"| lt, le, gt, ge (also vs public) | **{cell('lt_1M', 2, 10**6)}** | {cell('lt_1M', 3, 10**6)} | 8 / 216 "
        "| 7 / 56 |",
        f"| relu, abs | **{cell('relu_1M', 2, 10**6)}** | {cell('relu_1M', 3, 10**6)} | 9 / 232 | 8 / 72 |",
        f"| eq, ne | {cell('eq_100k', 2, 10**5)} | {cell('eq_100k', 3, 10**5)} | | |",
        f"| sign | {cell('sign_100k', 2, 10**5)} | {cell('sign_100k', 3, 10**5)} | | |",
        f"| softmax [1000, 10] (per logit) | {cell('softmax_1000x10', 2, 10**4, 0)} | "
        f"{cell('softmax_1000x10', 3, 10**4, 0)} | | |",
        "",
        f"(2 parties: 10^6 elements, lt = {max(lt2['bytes_sent']):,} bytes and relu = "
        f"{max(relu2['bytes_sent']):,} bytes exactly,\n`crypten-lite bench --only lt_1M --only relu_1M`; eq and sign "
        "on 10^5 elements, workloads of\n`scripts/gen_doc_figures.py`.)",
    ]) + "\n"


def functions_accuracy(costs: dict, bench: dict) -> str:
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


def training_resnet(costs: dict, bench: dict) -> str:
    c, row = costs[key("resnet18_b1", 2)], bench.get(("resnet18_b1", 2, False))
    load = f" (measured at a 1-minute load average of {row['load_average_1min']:g} on {row['cpus']} cores)" \
        if row and "load_average_1min" in row else ""
    seconds = f"{row['seconds_median']:.1f} s online{load} and " if row else ""
    return (f"The standard ResNet-18 (width 64, 11.2 M parameters, BatchNorm folded into the convolutions by\n"
            f"`from_pytorch(..., fold_batch_norm=True)`), one 32x32 image (`crypten-lite bench --only\n"
            f"resnet18_b1`): {seconds}{c['rounds']} rounds, {max(c['bytes_sent']) / 2**20:.1f} MiB sent per party, "
            f"{c['dealer_bytes'] / 2**20:.1f} MiB\nfrom the dealer; max abs logit error "
            f"{row['max_error']:.1e} against torch.\n" if row else "")


def quantized_mpc(costs: dict, bench: dict) -> str:
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


def training_steps(costs: dict, bench: dict) -> str:
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


def training_examples(costs: dict, bench: dict) -> str:
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


RENDERERS: dict[str, Callable[[dict, dict], str]] = {
    "training-steps": training_steps,
    "training-examples": training_examples,
    "readme-bench": readme_bench,
    "readme-transport": readme_transport,
    "functions-comm": functions_comm,
    "functions-accuracy": functions_accuracy,
    "training-resnet": training_resnet,
    "quantized-mpc": quantized_mpc,
}


def render(path: pathlib.Path, costs: dict, bench: dict) -> str:
    """The text of `path` with every figures block rewritten."""
    def sub(m: re.Match) -> str:
        name = m["name"]
        if name not in RENDERERS:
            raise SystemExit(f"{path.relative_to(ROOT)}: unknown figures block {name!r} (known: {sorted(RENDERERS)})")
        return m.group(1) + RENDERERS[name](costs, bench) + m.group(4)
    return BLOCK.sub(sub, path.read_text())


def stale_blocks() -> list[str]:
    """One message per block whose text differs from what render() writes, with the diff."""
    costs, bench = load_costs(), load_bench()
    out = []
    for path in DOCS:
        old = path.read_text()
        new = render(path, costs, bench)
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
        if not wanted and not digits:
            continue
        with PartyPool(parties, timeout=600) as pool:
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
    entries = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in data["costs"].items())
    COSTS.write_text('{\n "about": ' + json.dumps(data["about"]) + ',\n "costs": {\n' + entries + "\n }\n}\n")


def all_cost_keys() -> list[str]:
    return ([key(w, p) for w, p in BENCH_KEYS + EXTRA_KEYS]
            + [key(f"digits_cnn/{m}", p) for p in (2, 3) for m in DIGITS_MODES
               if p == 2 or not m.endswith("probabilistic")])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only report stale blocks (exit 1 if any)")
    parser.add_argument("--measure-costs", nargs="*", metavar="KEY",
                        help="rerun these workloads (default: all) and update docs/costs.json first")
    parser.add_argument("--measure-examples", action="store_true",
                        help="run the training examples and append their figures to docs/benchmarks.jsonl first")
    args = parser.parse_args(argv)
    if args.measure_examples:
        measure_examples()
    if args.measure_costs is not None:
        keys = args.measure_costs or all_cost_keys()
        unknown = sorted(set(keys) - set(all_cost_keys()))
        if unknown:
            parser.error(f"unknown cost keys {unknown}; known: {all_cost_keys()}")
        data = json.loads(COSTS.read_text()) if COSTS.exists() else {"costs": {}}
        data["costs"].update(measure(keys))
        data["costs"] = {k: data["costs"][k] for k in all_cost_keys() if k in data["costs"]}
        write_costs(data)
    if args.check:
        problems = stale_blocks() + bench_disagreements()
        print("\n\n".join(problems) or "every figure is up to date")
        return 1 if problems else 0
    costs, bench = load_costs(), load_bench()
    for path in DOCS:
        new = render(path, costs, bench)
        if new != path.read_text():
            path.write_text(new)
            print(f"updated {path.relative_to(ROOT)}")
    for problem in bench_disagreements(costs, bench):
        print(f"warning: {problem}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
