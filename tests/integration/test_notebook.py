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


def test_notebook_first_hour_single_process_parties_models_training():
    """tests/data/compat_first_hour.ipynb: a CrypTen user's flows in one kernel (init() as a
    session of one party, crypten.print, shares per rank, a notebook class saved and loaded
    by its owner for private inference, a crypten.save'd layer, training, ptt); each cell
    asserts against torch. Here: what the parties printed reaches the cell, in CrypTen's order."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(DATA / "compat_first_hour.ipynb", as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(DATA)}})
    client.execute()
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                      for o in c.get("outputs", []))
    # in_order: party 0, then party 1, then the next crypten.print (rank 0 only)
    first, second, once = (outputs.index(t) for t in ("party 0 holds", "party 1 holds", "decrypted once"))
    assert first < second < once
    assert outputs.count("decrypted once") == 1 and "plain_text=HIDDEN" in outputs
    assert "labels: tensor(" in outputs and "all flows passed" in outputs
    # Tutorial 5's step-through by CrypTen's ONNX names: each party's share, in rank order
    assert outputs.index("Rank: 0 first layer's share") < outputs.index("Rank: 1 first layer's share")


def test_script_without_launch_is_one_party_and_says_so(tmp_path):
    """`python script.py` with init() and no launch: a session of one party, loudly."""
    code = ("import torch, crypten_lite\ncrypten_lite.init()\n"
            "x = crypten_lite.cryptensor(torch.tensor([1.0, -2.0]))\n"
            "print('RESULT', (x * x).relu().get_plain_text().tolist(), crypten_lite.get_world_size())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(),
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "RESULT [1.0, 4.0] 1" in r.stdout
    assert r.stderr.count("NO privacy") == 1


CORE_SCRIPT = """
import torch
import crypten_lite
crypten_lite.init()   # no launch: a session of one party here; the parties have their own

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


STREAM_SCRIPT = """
import os, sys, time
import crypten_lite.compat as crypten
import crypten_lite.compat.mpc as mpc
crypten.init()
GO = sys.argv[1]

@mpc.run_multiprocess(world_size=2)
def wait_for_the_reader():
    crypten.print("first, while the parties run")
    deadline = time.monotonic() + 150
    while not os.path.exists(GO):       # the test creates GO once it has read the line above
        if time.monotonic() > deadline:
            raise TimeoutError("the caller did not show what the parties printed while they ran")
        time.sleep(0.05)
    crypten.print("second")
    return 1

print("RESULT", wait_for_the_reader(), flush=True)
"""


def test_run_multiprocess_shows_what_the_parties_print_while_they_run(tmp_path):
    """The parties block until the caller's stdout has shown their first crypten.print: if the
    output came only at return, they would give up (a deadline, never a hang) and this fails."""
    script, go = tmp_path / "stream.py", tmp_path / "go"
    script.write_text(STREAM_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(go)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(), cwd=tmp_path)
    try:
        lines = []
        for line in proc.stdout:  # EOF when the script ends (it ends: every wait has a deadline)
            lines.append(line)
            if line.startswith("first, while the parties run"):
                go.touch()
        proc.wait(timeout=300)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    assert [ln.strip() for ln in lines] == ["first, while the parties run", "second", "RESULT [1, 1]"], lines
