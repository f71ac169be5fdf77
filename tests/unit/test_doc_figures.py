"""The figures in README.md and docs/ are the ones their sources give, and the docs stay in the repo.

Rounds and bytes come from docs/costs.json (asserted against the running code by
tests/protocol/test_doc_costs.py and test_model_costs.py); seconds come from
docs/benchmarks.jsonl. scripts/gen_doc_figures.py writes every `<!-- figures:NAME -->` block;
a failure here names the stale block and line: rerun the generator (and, for a benchmark
line that disagrees with costs.json, the bench command it prints).
"""

from __future__ import annotations

import copy
import importlib.util
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_doc_figures", ROOT / "scripts" / "gen_doc_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _generator()


def test_every_figures_block_matches_its_sources():
    stale = gen.stale_blocks()
    assert not stale, "\n\n".join(stale)


def test_benchmark_lines_agree_with_the_exact_costs():
    problems = gen.bench_disagreements()
    assert not problems, "\n".join(problems)


def test_every_block_has_a_renderer_and_every_renderer_a_block():
    found = gen.blocks_in_docs()
    assert set(found) == set(gen.RENDERERS), (sorted(found), sorted(gen.RENDERERS))
    for path in gen.DOCS:
        text = path.read_text()
        assert text.count("<!-- figures:") == text.count("<!-- /figures -->"), f"unbalanced markers in {path}"


def test_a_changed_cost_or_seconds_makes_a_block_stale():
    """The check can fail: a different rounds, bytes or seconds figure changes the docs."""
    costs, bench = gen.load_costs(), gen.load_bench()
    readme = ROOT / "README.md"
    current = gen.render(readme, costs, bench)
    changed = copy.deepcopy(costs)
    changed["lenet_b1/2p"]["rounds"] += 1
    assert gen.render(readme, changed, bench) != current
    changed = copy.deepcopy(costs)
    changed["relu_1M/2p"]["bytes_sent"] = [b + 8_000 for b in changed["relu_1M/2p"]["bytes_sent"]]
    assert gen.render(ROOT / "docs" / "functions.md", changed, bench) != gen.render(
        ROOT / "docs" / "functions.md", costs, bench)
    slower = copy.deepcopy(bench)
    slower[("mul_1M", 2, False)]["seconds_median"] += 0.5
    assert gen.render(readme, costs, slower) != current


def test_docs_name_no_file_outside_the_repository():
    """No doc, comment, docstring or message points at design notes outside the repository."""
    design = re.compile(r"DESIGN\.md|\.\./shared|shared/DESIGN")
    relative = re.compile(r"\]\(\.\./|`\.\./")  # a Markdown link or a quoted path leaving the folder
    offenders = []
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "Dockerfile", ROOT / "docker-compose.yml",
             ROOT / "pyproject.toml"]
    for folder in ("crypten_lite", "tests", "examples", "benchmarks", "scripts", "protos"):
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".proto", ".sh", ".md")
                  and "_proto" not in p.parts and p.resolve() != pathlib.Path(__file__).resolve()]
    for path in files:
        if not path.exists():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if design.search(line) or (path.suffix == ".md" and relative.search(line)):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "references outside the repository:\n" + "\n".join(offenders)


def test_docs_link_only_to_files_that_exist():
    link = re.compile(r"\]\((?!https?://)([\w./-]+\.(?:md|py|yml|toml|sh|proto|json|jsonl)|[\w./-]+/)[)#]")
    missing = []
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for target in link.findall(path.read_text()):
            if not (path.parent / target).exists():
                missing.append(f"{path.relative_to(ROOT)} -> {target}")
    assert not missing, missing


def test_nonlinear_table_rounds_agree_with_the_measured_rows():
    """functions.md's method table repeats the 2-party rounds of the measured accuracy rows
    (docs/benchmarks.jsonl): the two must say the same."""
    import json
    measured = {}
    for line in (ROOT / "docs" / "benchmarks.jsonl").read_text().splitlines():
        row = json.loads(line) if line.strip() else {}
        if row.get("workload") == "accuracy" and row.get("parties") == 2:
            measured[row["function"].split(" ")[0]] = row["rounds"]  # the last line counts
    names = {"div": "x", "inv_sqrt": "inv_sqrt", "softmax": "softmax"}
    text = (ROOT / "docs" / "functions.md").read_text()
    section = text.split("## Nonlinear functions", 1)[1].split("\n## ", 1)[0]
    checked = 0
    for row in section.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`"):
            continue
        rounds = re.match(r"\d+", cells[3])
        if not rounds:
            continue
        for fn in re.findall(r"`(\w+)`", cells[0]):
            key = names.get(fn, fn)
            if key in measured:
                assert int(rounds.group()) == measured[key], (fn, cells[3], measured[key])
                checked += 1
    assert checked >= 10, checked


# Each JSON source: a changed value in it changes the block that shows it (the check can fail).
SOURCE_CHANGES = [
    # (source, change, file, block)
    ("external_figures", lambda s: s["figures"][0].update(seconds=0.36), "README.md", "readme-external"),
    ("external_figures", lambda s: s["figures"][5].update(rounds=10), "docs/functions.md", "functions-comm"),
    ("external_figures", lambda s: s["aby3"]["figures"]["lenet_b1"].update(seconds=0.2), "docs/protocols.md",
     "protocols-aby3"),
    ("container", lambda s: s["image"].update(size_gb=1.38), "README.md", "readme-image"),
    ("container", lambda s: s["image"].update(first_build_s=203), "docs/deployment.md", "deployment-container-test"),
    ("container", lambda s: s["image"].update(cuda_torch_image_gb=5.3), "docs/deployment.md", "deployment-image"),
    ("container", lambda s: s["example_online"].update(rounds=23), "docs/deployment.md", "deployment-image"),
    ("container", lambda s: s["health"]["container"].update(grpc_only_s=[1.8, 4.2]), "docs/deployment.md",
     "deployment-health"),
    ("compose_health_timeout_s", None, "docs/deployment.md", "deployment-health"),
    ("container", lambda s: s["compose_netns"].update(seconds=[26, 45]), "docs/deployment.md",
     "deployment-compose-netns"),
    # (the last line: a line of the newest run, which the block renders)
    ("netns_bench", lambda s: s[-1].update(seconds=s[-1]["seconds"] + 0.01), "docs/deployment.md", "deployment-network"),
    ("faults", lambda s: s["kill_detection"]["runs"][0].update(median_ms=37.0), "docs/deployment.md",
     "deployment-faults"),
    ("faults", lambda s: s["kill_loop"]["runs"][1].update(max_ms=1419), "docs/deployment.md", "deployment-kill-loop"),
    ("fuzz", lambda s: s.update(frames=12048), "docs/deployment.md", "deployment-fuzz"),
    ("crypten_compat", lambda s: s["rows"][3].update(verified=49), "docs/crypten_migration.md",
     "migration-acceptance"),
    ("model_descriptions", lambda s: s["sizes"].update(resnet18_bytes=17042), "docs/private_models.md",
     "private-models-sizes"),
    ("quantized_agreement", lambda s: s["flows"]["fx"].update(accuracy_program=0.84), "docs/quantized.md",
     "quantized-agreement"),
    ("quantized_agreement", lambda s: s["flows"]["pt2e"].update(fixed_max_abs=3.9e-6), "docs/quantized.md",
     "quantized-agreement"),
    ("quantized_agreement", lambda s: s["flows"]["eager"]["multipliers"][3].update(int8_identical=0.98),
     "docs/quantized.md", "quantized-multipliers"),
]


def _block(text: str, name: str) -> str:
    return next(m["body"] for m in gen.BLOCK.finditer(text) if m["name"] == name)


@pytest.mark.parametrize("source,change,doc,block", SOURCE_CHANGES,
                         ids=[f"{s}->{b}" for s, _, _, b in SOURCE_CHANGES])
def test_a_changed_source_value_makes_its_block_stale(source, change, doc, block):
    costs, bench, sources = gen.load_costs(), gen.load_bench(), gen.load_sources()
    current = _block(gen.render(ROOT / doc, costs, bench, sources), block)
    assert current == _block((ROOT / doc).read_text(), block)
    changed = copy.deepcopy(sources)
    if change is None:
        changed[source] += 1
    else:
        change(changed[source])
    assert _block(gen.render(ROOT / doc, costs, bench, changed), block) != current


def test_every_json_source_says_where_its_figures_come_from():
    """Each measured group names how, when and where it was measured, and whether it was
    re-measured by its script or transcribed once from the docs."""
    sources = gen.load_sources()

    def provenances(value):
        if isinstance(value, dict):
            if "provenance" in value:
                yield value["provenance"]
            for v in value.values():
                yield from provenances(v)
        elif isinstance(value, list):
            for v in value:
                yield from provenances(v)
    found = [p for name in ("external_figures", "container", "faults", "fuzz", "crypten_compat", "quoted_figures")
             for p in provenances(sources[name])]
    found += sources["netns_bench"]  # every line carries its own
    assert len(found) >= 10
    for p in found:
        assert p.get("command") and p.get("date") and p.get("how" if "how" in p else "measured"), p
    assert "not for crypten_lite" in sources["external_figures"]["about"]


def test_netns_lines_agree_with_the_exact_costs():
    """A netns_bench line that records rounds or bytes must give costs.json's (a stale run)."""
    assert not gen.netns_disagreements()
    costs, sources = gen.load_costs(), copy.deepcopy(gen.load_sources())
    c = costs["lenet_b1/2p"]
    sources["netns_bench"].append({"workload": "lenet_b1", "rate": "unlimited", "delay": "0ms", "seconds": 0.1,
                                   "rounds": c["rounds"] + 1, "bytes_sent_per_party": c["bytes_sent"]})
    assert any("rounds=" in p for p in gen.netns_disagreements(costs, sources))


def test_rtt_table_and_netns_cost_columns_follow_costs_json():
    """Rounds and bytes of docs/deployment.md's network tables are costs.json's, not transcribed."""
    costs, bench, sources = gen.load_costs(), gen.load_bench(), gen.load_sources()
    doc = ROOT / "docs" / "deployment.md"
    current = _block(gen.render(doc, costs, bench, sources), "deployment-network")
    changed = copy.deepcopy(costs)
    changed["lenet_b1/2p"]["rounds"] = 38
    new = _block(gen.render(doc, changed, bench, sources), "deployment-network")
    assert "| LeNet batch 1 | 38 | 0.04 s | 0.76 s | 3.0 s |" in new and new != current


def test_acceptance_totals_are_computed_from_the_rows():
    sources = copy.deepcopy(gen.load_sources())
    doc = ROOT / "docs" / "crypten_migration.md"
    text = _block(gen.render(doc, gen.load_costs(), gen.load_bench(), sources), "migration-acceptance")
    rows = sources["crypten_compat"]["rows"]
    passed = sum(r["verified"] if r.get("verified") is not None else r["first_run"] for r in rows)
    total = sum(r["tests_in_file"] or 0 for r in rows)
    run = sum(r["public"] or 0 for r in rows)
    flat = " ".join(text.split())
    assert f"Passed: {passed} of the {run} run ({100 * passed / run:.1f} %), {passed} of all {total}" in flat
    assert all("run" in r for r in rows)  # every row was measured by benchmarks/crypten_compat_tests.py
    next(r for r in rows if r.get("verified") is None and r["first_run"] > 0)["first_run"] -= 1
    changed = " ".join(_block(gen.render(doc, gen.load_costs(), gen.load_bench(), sources),
                              "migration-acceptance").split())
    assert f"Passed: {passed - 1} of the {run} run" in changed


def test_limits_and_inline_costs_in_the_docs_are_the_code_s():
    """Figures in running text that are configuration constants or exact costs say what the code
    and costs.json say (a changed constant makes this fail until the sentence follows)."""
    from crypten_lite.comm import grpc_comm
    from crypten_lite.config import Config
    from crypten_lite.nn import graph_desc

    options = dict(grpc_comm.GRPC_OPTIONS)
    costs = gen.load_costs()
    expected = {
        "README.md": [f"{max(costs['mul_1M/2p']['bytes_sent']) // 10**6} bytes per element per party for mul"],
        "docs/deployment.md": [
            f"gRPC keepalive ({options['grpc.keepalive_time_ms'] / 1000:g} s ping, "
            f"{options['grpc.keepalive_timeout_ms'] / 1000:g} s timeout)",
            f"frames over the {grpc_comm.CHUNK_BYTES >> 20} MiB limit",
            f"`CRYPTEN_LITE_MAX_MESSAGE_BYTES` (default {Config.max_message_bytes >> 30} GiB)"],
        "docs/design.md": [f"large tensors are chunked ({grpc_comm.CHUNK_BYTES >> 20} MiB)"],
        "docs/functions.md": [f"| {costs['softmax_1000x10/2p']['rounds']} / 23 (dim 10) |",
                              f"softmax {costs['softmax_1000x10/3p']['rounds']})"],
        "docs/ARCHITECTURE.md": [f"chunks of {grpc_comm.CHUNK_BYTES >> 20} MiB",
                                 f"`LOOKAHEAD_BYTES` ({grpc_comm.LOOKAHEAD_BYTES >> 20} MiB",
                                 f"every {grpc_comm.WATCH_TICK:g} s"],
        "docs/private_models.md": [
            f"more than {graph_desc.MAX_DESCRIPTION_BYTES >> 20} MiB in all, a tensor of more than "
            f"2^{graph_desc.MAX_ELEMENTS.bit_length() - 1} elements or {graph_desc.MAX_DIMS} dimensions, values "
            f"nested more than {graph_desc.MAX_DEPTH} deep"],
    }
    missing = []
    for doc, phrases in expected.items():
        text = " ".join((ROOT / doc).read_text().split())
        missing += [f"{doc}: {p!r}" for p in phrases if p not in text]
    assert not missing, "the docs no longer state the code's figure:\n" + "\n".join(missing)


def test_the_quantized_step_table_follows_costs_json():
    costs, bench, sources = gen.load_costs(), gen.load_bench(), gen.load_sources()
    doc = ROOT / "docs" / "quantized.md"
    current = _block(gen.render(doc, costs, bench, sources), "quantized-steps")
    assert current == _block(doc.read_text(), "quantized-steps")
    probabilistic = _block(gen.render(doc, costs, bench, sources), "quantized-probabilistic")
    changed = copy.deepcopy(costs)
    changed["digits_cnn/int8-eager-probabilistic/2p"]["agreement"]["int8_identical"] = 0.2
    assert _block(gen.render(doc, changed, bench, sources), "quantized-probabilistic") != probabilistic
    per_image = _block(gen.render(doc, costs, bench, sources), "quantized-bytes")
    changed = copy.deepcopy(costs)
    changed["quantized_ops/round33/2p"]["bytes_sent"] = [6000, 6000]
    assert _block(gen.render(doc, changed, bench, sources), "quantized-bytes") != per_image
    for k, field, value in (("quantized_ops/clamp1/2p", "bytes_sent", [14000, 14000]),
                            ("quantized_ops/round2_even/2p", "rounds", 6),
                            ("quantized_ops/round33/3p", "bytes_sent", [31489] * 3)):
        changed = copy.deepcopy(costs)
        changed[k][field] = value
        assert _block(gen.render(doc, changed, bench, sources), "quantized-steps") != current, k


def test_functions_md_msb_derivation_adds_up_to_the_measured_costs():
    """functions.md derives the comparison and equality costs step by step; the steps must add
    up to costs.json's exact per-element figures (lt_1M, eq_100k at 2 parties)."""
    text = " ".join((ROOT / "docs" / "functions.md").read_text().split())
    costs = gen.load_costs()
    level1 = re.search(r"Level 1, one round, ([\d.]+) bytes per element per party", text)
    tree = re.search(r"Carry tree, (\w+) rounds.*?the levels send ([\d., and]+) bytes per element", text)
    b2a = re.search(r"B2A, one round, 1/(\d+) word per element", text)
    assert level1 and tree and b2a, "functions.md's MSB steps moved: update this test"
    words = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7}
    tree_bytes = [float(v) for v in re.findall(r"[\d.]+", tree[2])]
    lt = costs["lt_1M/2p"]
    assert 1 + words[tree[1]] + 1 == lt["rounds"]
    assert float(level1[1]) + sum(tree_bytes) + 8 / int(b2a[1]) == max(lt["bytes_sent"]) / 10**6
    eq = re.search(r"\((\d+) rounds, lane-packed, ([\d.]+) bytes\) then B2A", text)
    c = costs["eq_100k/2p"]
    assert eq and int(eq[1]) + 1 == c["rounds"]
    # (10^5 elements: the last lane-packed word carries 12 bytes more than the per-element figure)
    assert abs(float(eq[2]) + 8 / int(b2a[1]) - max(c["bytes_sent"]) / 10**5) < 0.001


def test_a_fresh_netns_bench_run_renders_and_replaces_the_transcribed_lines():
    """Lines as benchmarks/netns_bench.py --json writes them (the script's own format) take
    over from the transcribed ones: seconds, RTT and load come from them."""
    costs, bench, sources = gen.load_costs(), gen.load_bench(), copy.deepcopy(gen.load_sources())
    run = {"delay": "0ms", "rtt_ms": 0.012, "measured": "by this script", "repeat": 5, "commit": "abc1234",
           "date": "2026-12-24", "cpus": 2, "command": "sudo python benchmarks/netns_bench.py", "load_average_1min": 1.5}
    for rate, factor in (("unlimited", 1), ("100mbit", 2), ("10mbit", 9)):
        sources["netns_bench"].append({"workload": "example:private_inference", "seconds": 0.5 * factor, "rounds": 22,
                                       "bytes_sent_per_party": [900000, 900000], "rate": rate, **run})
        for w in ("matmul_256", "lenet_b1", "logreg_sgd_step"):
            c = costs[f"{w}/2p"]
            sources["netns_bench"].append({"workload": w, "seconds": 0.01 * factor, "rounds": c["rounds"],
                                           "bytes_sent_per_party": c["bytes_sent"], "offline_seconds": 0.3,
                                           "dealer_bytes": c["dealer_bytes"], "rate": rate, **run})
    assert not gen.netns_disagreements(costs, sources)
    text = " ".join(_block(gen.render(ROOT / "docs" / "deployment.md", costs, bench, sources),
                           "deployment-network").split())
    assert "commit abc1234, 2026-12-24" in text and "as the script wrote them" in text
    assert "RTT 0.01 ms" in text and "load average 1.5 on 2 cores" in text
    assert "| 0.90 | - | 0.50 s | 1.00 s | 4.50 s | (in the run) |" in text


def test_quoted_figures_are_what_the_docs_say():
    """Figures inside sentences and list items (docs/quoted_figures.json) are checked: the doc
    must say each one, and a changed value in the source is reported."""
    sources = copy.deepcopy(gen.load_sources())
    assert not gen.quoted_disagreements(sources)
    assert len(sources["quoted_figures"]["figures"]) >= 7
    sources["quoted_figures"]["figures"][-1]["values"][1] = 700_000
    assert any("700,000" in p for p in gen.quoted_disagreements(sources))
