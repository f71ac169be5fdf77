"""The generated protobuf code is up to date with protos/ (regenerate: python scripts/gen_proto.py)."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_generated_code_is_fresh():
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
