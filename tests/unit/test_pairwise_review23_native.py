"""Review of session 23's native OT kernels (issue 29): lpn_encode's size check overflowed
(4 d n wrapped for a huge d: an empty rows buffer passed and the loop read far past it, a
segfault), and an empty table let a bad index read the table's 'entry 0' past its end. Each
call runs in a child process, so the attack without the fix fails the test, not the run."""

from __future__ import annotations

import subprocess
import sys

import pytest

from crypten_lite import _native

_PRELUDE = """
import numpy as np
from crypten_lite import _native
k = _native.kernels()
"""


def _run(body: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _PRELUDE + body], capture_output=True, text=True,
                          timeout=120)


@pytest.fixture(autouse=True)
def _built():
    if _native.kernels() is None:
        pytest.skip(f"native kernels: {_native.describe()}")


def test_lpn_encode_huge_d_refused_not_read():
    out = _run("""
acc = np.zeros((1, 2), np.uint64); tab = np.zeros((4, 2), np.uint64); rows = np.zeros(0, np.int32)
try:
    k.lpn_encode(acc, tab, rows, 2 ** 62)
    print("ACCEPTED")
except ValueError as e:
    print("REFUSED", e)
""")
    assert out.returncode == 0, f"lpn_encode crashed (rc {out.returncode}): {out.stderr[-500:]}"
    assert "REFUSED" in out.stdout and "past any buffer" in out.stdout, out.stdout


def test_lpn_encode_empty_table_refused():
    out = _run("""
acc = np.zeros((4, 2), np.uint64); tab = np.zeros((0, 2), np.uint64); rows = np.zeros((1, 4), np.int32)
try:
    k.lpn_encode(acc, tab, rows, 1)
    print("ACCEPTED")
except ValueError as e:
    print("REFUSED", e)
""")
    assert out.returncode == 0, out.stderr[-500:]
    assert "REFUSED" in out.stdout and "table is empty" in out.stdout, out.stdout


def test_lpn_encode_zero_lengths_still_fine():
    out = _run("""
acc = np.zeros((0, 2), np.uint64); tab = np.zeros((0, 2), np.uint64)
k.lpn_encode(acc, tab, np.zeros(0, np.int32), 5)          # no outputs: nothing read
acc = np.arange(8, dtype=np.uint64).reshape(4, 2)
k.lpn_encode(acc, np.zeros((0, 2), np.uint64), np.zeros(0, np.int32), 0)   # d = 0: acc kept
assert acc.reshape(-1).tolist() == list(range(8))
print("OK")
""")
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-500:]
