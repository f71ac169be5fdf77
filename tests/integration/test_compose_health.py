"""The compose health check (`crypten-lite health`) imports grpc, not torch.

The containers run it every 2 s with a 10 s timeout; importing torch alone takes seconds on a
loaded machine. Checked by the interpreter's own import log (PYTHONPROFILEIMPORTTIME), so the
assertion does not depend on timing. That the check answers SERVING over mutual TLS against
live services: test_compose_netns.py and test_compose_docker.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

CLI = shutil.which("crypten-lite")


def _imported(argv: list[str], env: dict[str, str] | None = None) -> tuple[int, str, set[str]]:
    """Exit code, stdout and the top-level modules imported by `argv`."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                          env={**(env or os.environ), "PYTHONPROFILEIMPORTTIME": "1"})
    modules = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)", proc.stderr, re.M))
    return proc.returncode, proc.stdout, {m.split(".")[0] for m in modules}


@pytest.mark.skipif(CLI is None, reason="the crypten-lite command is not installed")
def test_health_imports_grpc_but_not_torch() -> None:
    code, out, modules = _imported([CLI, "health", "--target", "127.0.0.1:9", "--timeout", "1"])
    assert code == 1 and "127.0.0.1:9" in out, out  # nothing listens on the discard port
    assert {"grpc", "crypten_lite"} <= modules, sorted(modules)
    assert "torch" not in modules and "numpy" not in modules, sorted(modules)
    # The import log does see torch where a command needs the API.
    _, _, others = _imported([CLI, "bench", "--help"])
    assert "torch" in others


def test_importing_the_package_still_loads_the_api() -> None:
    code = ("import sys, crypten_lite; assert 'torch' not in sys.modules; "
            "assert crypten_lite.nn.from_pytorch and crypten_lite.CrypTensor; "
            "assert 'torch' in sys.modules and callable(crypten_lite.cryptensor); "
            "assert hasattr(crypten_lite.CrypTensor, 'relu'); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr
