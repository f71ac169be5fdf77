"""docs/transformers.md's cost table is the one docs/transformer_split.json gives (written by
benchmarks/transformer_split.py from the running code; its bert_layer_tiny entry is asserted
exactly by tests/protocol/test_transformer_blocks.py)."""

from __future__ import annotations

import copy
import importlib.util
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _split():
    spec = importlib.util.spec_from_file_location("transformer_split", ROOT / "benchmarks" / "transformer_split.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _block(text: str, marker: str = "transformer-split") -> str:
    start = text.index(f"<!-- {marker} -->\n") + len(f"<!-- {marker} -->\n")
    return text[start:text.index(f"\n<!-- /{marker} -->")]


def test_table_matches_the_json():
    data = json.loads((ROOT / "docs" / "transformer_split.json").read_text())
    doc = (ROOT / "docs" / "transformers.md").read_text()
    assert _block(doc) == _split().render(data), (
        "docs/transformers.md is stale: rerun python benchmarks/transformer_split.py and paste render()")
    assert "gpt2_small_token" in data
    assert _block(doc, "gpt2-token") == _split().render_gpt2(data), (
        "docs/transformers.md's GPT-2 row is stale: rerun python benchmarks/transformer_split.py --gpt2 "
        "and paste render_gpt2()")
    assert {"additive", "rss"} <= set(data["three_parties"])
    assert _block(doc, "three-parties") == _split().render_three(data), (
        "docs/transformers.md's 3-party table is stale: rerun python benchmarks/transformer_split.py "
        "--three and paste render_three()")


def test_phases_add_up_and_a_changed_figure_is_caught():
    split = _split()
    data = json.loads((ROOT / "docs" / "transformer_split.json").read_text())
    for name, layer in data["layers"].items():
        for field in ("rounds", "dealer_bytes"):
            assert sum(p[field] for p in layer["phases"].values()) == layer["total"][field], (name, field)
        assert [sum(p["bytes_sent"][i] for p in layer["phases"].values()) for i in range(2)] == \
            layer["total"]["bytes_sent"], name
    changed = copy.deepcopy(data)
    changed["layers"]["bert_base_layer_seq128"]["total"]["rounds"] += 1
    assert split.render(changed) != split.render(data)


def test_docs_link_it():
    assert "transformers.md" in (ROOT / "README.md").read_text()
