"""docs/costs.json, the source of every rounds / bytes figure in README.md and docs/, is exact.

Each workload runs between real parties (the session pool: separate processes, gRPC, the
dealer) and its online rounds, bytes sent per party and dealer bytes must equal the entry.
The LeNet, ResNet-18 and logistic-regression entries at 2 parties are asserted by
tests/protocol/test_model_costs.py with the same table. After a protocol change, rerun
`python scripts/gen_doc_figures.py --measure-costs KEY...` and then the generator.
"""

from __future__ import annotations

import importlib.util
import pathlib
import warnings

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_doc_figures", ROOT / "scripts" / "gen_doc_figures.py")
    module = importlib.util.module_from_spec(spec)
    # not in sys.modules: cloudpickle then sends its functions to the parties by value
    spec.loader.exec_module(module)
    return module


gen = _generator()
COSTS = gen.load_costs()
IN_MODEL_COSTS = {"lenet_b1/2p", "lenet_b64/2p", "resnet18_b1/2p", "logreg_sgd_step/2p"}
DIGITS = [k for k in gen.all_cost_keys() if k.startswith("digits_cnn/")]
QOPS = [k for k in gen.all_cost_keys() if k.startswith("quantized_ops/")]
HERE = [(w, p) for w, p in gen.BENCH_KEYS + gen.EXTRA_KEYS if gen.key(w, p) not in IN_MODEL_COSTS]


def _check(got: dict, k: str) -> None:
    want = gen.cost_entry(k)
    if want is None:  # a CPU-dependent figure (gen.CPU_DEPENDENT_PREFIX) never measured on this CPU class
        warnings.warn(f"{k}: docs/costs.json has no entry for this CPU class ({gen.cpu_class()}); to add one: "
                      f"python scripts/gen_doc_figures.py --measure-costs {k}")
        return
    diffs = [f"{field}: docs/costs.json has {want[field]}, the code does {got[field]}"
             for field in ("rounds", "bytes_sent", "dealer_bytes") if got[field] != want[field]]
    assert not diffs, f"{k}: " + "; ".join(diffs) + (
        f" (if the change is intended: python scripts/gen_doc_figures.py --measure-costs {k}, "
        "then python scripts/gen_doc_figures.py)")


def test_every_cost_entry_is_asserted_somewhere():
    asserted = {gen.key(w, p) for w, p in HERE} | IN_MODEL_COSTS | set(DIGITS) | set(QOPS)
    assert set(COSTS) == asserted == set(gen.all_cost_keys())


@pytest.mark.parametrize("workload,parties", HERE, ids=[gen.key(w, p) for w, p in HERE])
def test_bench_workload_costs(request, workload, parties):
    pool = request.getfixturevalue(f"pool{parties}")
    _check(gen.bench_cost(pool, workload), gen.key(workload, parties))


@pytest.mark.parametrize("parties", [2, 3])
def test_quantized_step_costs(request, parties):
    """docs/quantized.md's table of int8 protocol steps (crypten_lite.quantized.mpc_ops)."""
    got = gen.qops_costs(request.getfixturevalue(f"pool{parties}"))
    assert set(got) == {k for k in QOPS if k.endswith(f"/{parties}p")}
    for k, cost in got.items():
        _check(cost, k)


@pytest.mark.slow
@pytest.mark.parametrize("parties", [2, 3])
def test_digits_cnn_costs(request, parties):
    """examples/quantized_inference.py's CNN, 200 images, float and int8 eager / FX / PT2E
    (docs/quantized.md). The agreement with torch is a measured figure (truncation and the
    carry approximation depend on the random shares), so only its floor is checked here."""
    modes = [m for m in gen.DIGITS_MODES if gen.key(f"digits_cnn/{m}", parties) in DIGITS]
    for mode, cost in gen.digits_costs(request.getfixturevalue(f"pool{parties}"), modes).items():
        k = gen.key(f"digits_cnn/{mode}", parties)
        _check(cost, k)
        if not mode.endswith("probabilistic"):
            assert cost["agreement"]["argmax_agree"] >= 0.99, (k, cost["agreement"])
