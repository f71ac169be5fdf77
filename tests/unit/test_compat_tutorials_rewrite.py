"""benchmarks/crypten_tutorials.py changes CrypTen's tutorials only mechanically: the import
lines (to crypten_lite.compat) and MNIST (random data of its shapes). Checked here on text of
our own; the tutorials themselves run in the benchmark (docs/crypten_tutorials.json)."""

from __future__ import annotations

import importlib.util
import pathlib

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("crypten_tutorials", ROOT / "benchmarks" / "crypten_tutorials.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_only_import_lines_are_rewritten():
    tut = _script()
    source = "\n".join([
        "import crypten",
        "import torch",
        "    import crypten.mpc as mpc",
        "import crypten.communicator as comm",
        "from crypten import mpc",
        "from crypten.mpc import MPCTensor",
        "crypten.init()",
        "x = crypten.cryptensor([1.0])  # import crypten",
        "import cryptenx",
        "from examples.mpc_linear_svm.mpc_linear_svm import train_linear_svm",
    ])
    out, changed = tut.rewrite_imports(source)
    assert out.split("\n") == [
        "import crypten_lite.compat as crypten",
        "import torch",
        "    import crypten_lite.compat.mpc as mpc",
        "import crypten_lite.compat.communicator as comm",
        "from crypten_lite.compat import mpc",
        "from crypten_lite.compat.mpc import MPCTensor",
        "crypten.init()",
        "x = crypten.cryptensor([1.0])  # import crypten",
        "import cryptenx",
        "from examples.mpc_linear_svm.mpc_linear_svm import train_linear_svm",
    ]
    assert changed == 5


def test_the_mnist_stand_in_has_mnists_shapes_and_normalize():
    tut = _script()
    scope: dict = {"torch": torch}
    exec(tut.DATA_STAND_IN, scope)  # what replaces `from torchvision import datasets, transforms`
    test = scope["datasets"].MNIST("/unused", download=True, train=False)
    assert test.data.shape == (10000, 28, 28) and test.data.dtype == torch.uint8
    assert test.targets.shape == (10000,) and 0 <= int(test.targets.min()) <= int(test.targets.max()) <= 9
    t = torch.tensor([[2.0, 4.0]])
    assert torch.equal(scope["transforms"].functional.normalize(t, torch.tensor([1.0]), torch.tensor([2.0])),
                       torch.tensor([[0.5, 1.5]]))


def test_the_migration_guide_quotes_the_recorded_tutorial_run():
    """docs/crypten_migration.md's sentence on CrypTen's tutorials is the JSON's figures, and
    the recorded run is clean (every code cell run, none failed, every check held)."""
    import json
    import re
    data = json.loads((ROOT / "docs" / "crypten_tutorials.json").read_text())
    tutorials = data["tutorials"]
    cells = sum(t["code_cells"] for t in tutorials)
    ran = sum(t["cells_run"] for t in tutorials)
    failed = sum(len(t["cells_failed"]) for t in tutorials)
    checks = [c for t in tutorials for c in t["checks"]]
    held = sum(c["ok"] for c in checks)
    assert [t["tutorial"] for t in tutorials] == [1, 2, 3, 4, 5, 7]
    sentence = (f"{len(tutorials)} tutorials, {cells} code cells, {ran} run, {failed} failed; "
                f"{held} of {len(checks)} checks of what they print hold")
    doc = " ".join((ROOT / "docs" / "crypten_migration.md").read_text().split())
    assert sentence in doc, sentence
    assert ran == cells and failed == 0 and held == len(checks)
    assert all(not re.search(r"runner_error", json.dumps(t)) for t in tutorials)
