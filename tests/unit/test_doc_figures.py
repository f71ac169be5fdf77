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
            measured.setdefault(row["function"].split(" ")[0], row["rounds"])
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
