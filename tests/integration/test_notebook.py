"""Interactive use: run_multiprocess on functions defined in a Jupyter notebook (executed by
nbclient), in `python -c`, in a script read from stdin, and in a script that calls init() at
top level (CrypTen's tutorial pattern). Each run starts real gRPC parties and a dealer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "data"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CRYPTEN_LITE_")}


def test_notebook_runs_cryptens_tutorial_cells():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(DATA / "compat_tutorial.ipynb", as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(DATA)}})
    client.execute()  # a failing assert in a cell raises CellExecutionError
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                      for o in c.get("outputs", []))
    assert "tensor([ 4., 10., 18.])" in outputs


CORE_SCRIPT = """
import torch
import crypten_lite
crypten_lite.init()   # launcher: no session configured here

@crypten_lite.mpc.run_multiprocess(world_size=2)
def square(k):
    x = crypten_lite.cryptensor(torch.arange(3.0) * k)
    return (x * x).get_plain_text().tolist()

print("RESULT", square(2.0))
"""

COMPAT_SCRIPT = """
import torch
import crypten_lite.compat as crypten
import crypten_lite.compat.mpc as mpc
crypten.init()

def helper(t):          # a helper defined in the same script travels with the function
    return t * 2

@mpc.run_multiprocess(world_size=2)
def double(values):
    x = crypten.cryptensor(torch.tensor(values))
    return helper(x).get_plain_text().tolist()

print("RESULT", double([1.0, -1.5]))
"""


CORE_RESULT = "RESULT [[0.0, 4.0, 16.0], [0.0, 4.0, 16.0]]"
COMPAT_RESULT = "RESULT [[2.0, -3.0], [2.0, -3.0]]"


# Each run starts 2 parties and a dealer: one run per way of starting Python, the two APIs
# spread over them (crypten_lite in -c, compat from stdin and from a top-level script file).
@pytest.mark.parametrize("script,expected,how", [
    (CORE_SCRIPT, CORE_RESULT, "python_c"),
    (COMPAT_SCRIPT, COMPAT_RESULT, "stdin"),
    (COMPAT_SCRIPT, COMPAT_RESULT, "file"),
    (CORE_SCRIPT, CORE_RESULT, "file"),
], ids=["crypten_lite-python_c", "compat-stdin", "compat-file", "crypten_lite-file"])
def test_run_multiprocess_from_c_stdin_and_top_level_script(script, expected, how, tmp_path):
    if how == "python_c":
        cmd, stdin = [sys.executable, "-c", script], None
    elif how == "stdin":
        cmd, stdin = [sys.executable, "-"], script
    else:
        path = tmp_path / "tutorial.py"  # init() and the call at top level, no __main__ guard
        path.write_text(script)
        cmd, stdin = [sys.executable, str(path)], None
    r = subprocess.run(cmd, input=stdin, capture_output=True, text=True, env=_env(), timeout=300,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert expected in r.stdout
