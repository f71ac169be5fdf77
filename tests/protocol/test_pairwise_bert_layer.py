"""benchmarks/pairwise_vs_cheetah.py's bert_layer workload (one BERT encoder layer: transformers'
BertLayer, weights private to party 0, input to party 1) at the smallest size that keeps every
part of the layer (hidden 32, 2 heads, FFN 64, seq 8): under pairwise, end to end (the plan the
dealer recorded prefetched, then online), against torch's forward of the layer, with the
dealer's online rounds and bytes exactly. SPU's side (benchmarks/spu_cheetah.py --bert-npz)
runs only where SPU's own venv already exists (benchmarks/peer_envs.sh); nothing of SPU is
imported here."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("tenseal")
pytest.importorskip("nacl")
pytest.importorskip("transformers")

import cloudpickle  # noqa: E402

from tests.conftest import get_pool  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = {"hidden": 32, "heads": 2, "ffn": 64, "seq": 8}
# Online cost of the tiny layer's forward (its first: every weight's D opened), the same under
# both providers: the online protocols do not depend on who made the correlations.
TINY_ROUNDS, TINY_ONLINE_BYTES = 57, 380816


_NAME = "_bench_pairwise_vs_cheetah"


def _bench():
    """benchmarks/pairwise_vs_cheetah.py as a module whose party jobs travel to the pools by
    value (the party processes cannot import it by name)."""
    if _NAME not in sys.modules:
        spec = importlib.util.spec_from_file_location(_NAME, ROOT / "benchmarks" / "pairwise_vs_cheetah.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[_NAME] = module
        cloudpickle.register_pickle_by_value(module)
    return sys.modules[_NAME]


def test_bert_layer_under_pairwise_matches_torch():
    bench = _bench()
    rows = bench.bert_layer_rows(TINY, dealer_pool=get_pool(2), pairwise_pool=get_pool(2, provider="pairwise"))
    pairwise, dealer = rows
    assert pairwise["system"] == "crypten_lite-pairwise" and dealer["system"] == "crypten_lite-dealer"
    for row in rows:
        assert row["max_error"] < 1e-2, row           # LayerNorm outputs of size ~1
        # the whole plan was made offline and the run kept to it
        assert row["prefetched"] == row["plan_requests"] > 0 and row["diverged"] == 0, row
        assert (row["rounds"], row["online_bytes_both_parties"]) == (TINY_ROUNDS, TINY_ONLINE_BYTES), row
        assert len(row["peak_memory_mb_per_party"]) == 2
    # pairwise made every correlation between the two parties (HE and OT messages), offline
    assert pairwise["offline_bytes_both_parties"] > 10 * dealer["offline_bytes_both_parties"] > 0
    assert pairwise["end_to_end_seconds"] == pairwise["offline_seconds"] + pairwise["online_seconds"]
    assert "| crypten_lite-pairwise |" in bench.bert_table(rows)


def _spu_python() -> str | None:
    root = pathlib.Path(os.environ.get("CRYPTEN_LITE_PEERS", pathlib.Path.home() / ".cache" / "crypten_lite" / "peers"))
    py = root / "spu" / "bin" / "python"
    return str(py) if py.exists() and (root / "spu" / ".ready").exists() else None


@pytest.mark.skipif(_spu_python() is None, reason="SPU's venv not made (bash benchmarks/peer_envs.sh spu)")
def test_spu_bert_layer_matches_torch(tmp_path):
    """The same layer in jax.numpy under SPU CHEETAH, on the weights and input the crypten_lite
    side uses: its JAX translation agrees with torch in plaintext, and SPU's result with torch."""
    bench = _bench()
    path = tmp_path / "layer.npz"
    bench.write_bert_npz(TINY, str(path))
    done = subprocess.run([_spu_python(), str(ROOT / "benchmarks" / "spu_cheetah.py"), "--bert-npz", str(path),
                           "--repeat", "1"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    assert row["workload"] == "bert_layer" and row["shape"] == [1, TINY["seq"], TINY["hidden"]]
    assert row["jax_plaintext_max_error"] < 1e-4, row
    assert row["max_error"] < 1e-2, row
