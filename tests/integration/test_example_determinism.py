"""examples/private_inference.py prints the same predictions on every run (seeded before the
model is built), run twice under `crypten-lite launch`."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).parents[2]
LINES = re.compile(r"^\[rank \d\] (private prediction|plaintext torch prediction|accuracy on party 1's labels): .*$",
                   re.MULTILINE)


def _run() -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRYPTEN_LITE_")}
    r = subprocess.run([sys.executable, "-m", "crypten_lite.cli", "launch", "-n", "2",
                        str(ROOT / "examples" / "private_inference.py"), "--images", "6", "--epochs", "1"],
                       capture_output=True, text=True, timeout=300, env={**env, "PYTHONUNBUFFERED": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[rank 1] model description from party 0:" in r.stdout
    return sorted(m.group(0) for m in LINES.finditer(r.stdout))


def test_private_inference_demo_is_deterministic():
    first, second = _run(), _run()
    assert len(first) == 4, first  # both ranks' predictions, party 0's torch check, party 1's accuracy
    assert first == second
