"""A newcomer's first hour: what the set-up scripts, the CLI and a failing party print.

- `crypten-lite --version` names crypten_lite's, torch's and Python's versions;
- a party whose peer is unreachable names it while it waits ("party 0: waiting for party 1 at
  host:port ..."), then fails with two lines (where the script stopped, the error) and no
  traceback, unless CRYPTEN_LITE_TRACEBACK=1;
- the README's two commands install into a virtual environment, call python3, and name the
  opt-in variable of the system tests, which .ci/run sets before calling the README's command.
"""

from __future__ import annotations

import logging
import os
import pathlib
import re
import subprocess
import sys

import grpc
import pytest

from crypten_lite.comm import grpc_comm
from crypten_lite.errors import CommunicationError

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_version():
    import torch

    out = subprocess.run([sys.executable, "-m", "crypten_lite.cli", "--version"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert re.fullmatch(r"crypten-lite \S+ \(torch (\S+), Python 3\.\d+\.\d+\)\n", out.stdout), out.stdout
    assert f"torch {torch.__version__}," in out.stdout


class _Unavailable(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "failed to connect to all addresses"


class _DeadStub:
    def Handshake(self, hello, timeout):  # noqa: N802 (gRPC's method name)
        raise _Unavailable()


def test_waiting_for_an_unreachable_peer_is_named(monkeypatch, caplog):
    """From the first failed attempt on (notice delay 0 here), then at the deadline the error."""
    monkeypatch.setattr(grpc_comm, "WAIT_FIRST_NOTICE", 0.0)
    hello = grpc_comm.pb.Hello(rank=0)
    with caplog.at_level(logging.WARNING, logger="crypten_lite.comm"), \
            pytest.raises(CommunicationError, match=r"party 1 is unreachable at 10\.0\.0\.9:5000 after 0\.5 s"):
        grpc_comm.handshake(_DeadStub(), hello, 0.5, "10.0.0.9:5000", "party 1")
    notices = [r.getMessage() for r in caplog.records if "waiting for" in r.getMessage()]
    assert notices and re.fullmatch(r"party 0: waiting for party 1 at 10\.0\.0\.9:5000 \.\.\. "
                                    r"\(UNAVAILABLE\); giving up in \d+ s", notices[0]), notices


SCRIPT = "import crypten_lite\ncrypten_lite.init()\nprint('joined')\n"


@pytest.mark.parametrize("traceback", [False, True], ids=["short", "traceback"])
def test_an_unreachable_peer_is_a_short_error(tmp_path, traceback):
    script = tmp_path / "party.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRYPTEN_LITE_")}
    peer = f"127.0.0.1:{_free_port()}"
    env.update(CRYPTEN_LITE_RANK="0", CRYPTEN_LITE_WORLD_SIZE="2", CRYPTEN_LITE_PROVIDER="tfp",
               CRYPTEN_LITE_PARTIES=f"127.0.0.1:{_free_port()},{peer}", CRYPTEN_LITE_TIMEOUT="2")
    if traceback:
        env["CRYPTEN_LITE_TRACEBACK"] = "1"
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 1 and "joined" not in out.stdout, (out.stdout, out.stderr)
    lines = [line for line in out.stderr.splitlines() if "waiting for party 1" not in line]
    error = f"crypten_lite.errors.CommunicationError: party 1 is unreachable at {peer} after 2 s"
    assert lines[-1].startswith(error), out.stderr
    if traceback:
        assert "Traceback (most recent call last):" in out.stderr
    else:
        assert lines == [f"crypten_lite: stopped at {script}:2 (CRYPTEN_LITE_TRACEBACK=1 prints "
                         "the traceback):", lines[-1]], out.stderr


def test_an_error_in_a_script_without_launch_is_short_too(tmp_path):
    """`python script.py` with no launch (a session of one party): a crypten_lite error is the
    same two lines as under a launch, naming the wrong input's type."""
    script = tmp_path / "one.py"
    script.write_text('import crypten_lite\ncrypten_lite.init()\ncrypten_lite.cryptensor("hello", src=0)\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRYPTEN_LITE_")}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.splitlines()
    assert lines[-2] == (f"crypten_lite: stopped at {script}:3 (CRYPTEN_LITE_TRACEBACK=1 prints "
                         "the traceback):"), out.stderr
    assert lines[-1].startswith("crypten_lite.errors.ProtocolError: party 0: cryptensor() takes a "
                                "torch.Tensor") and "got a str" in lines[-1], out.stderr
    assert "hello" not in out.stderr  # the type is named, never the value


def test_the_readme_commands_are_honest():
    readme = (ROOT / "README.md").read_text()
    top = readme[:readme.index("## What it looks like")]
    for script in ("example.sh", "test.sh"):
        text = (ROOT / "scripts" / script).read_text()
        assert f"bash scripts/{script}" in top
        assert "source scripts/python_env.sh" in text and "install_torch.py 2.13.0" in text
    env = (ROOT / "scripts" / "python_env.sh").read_text()
    assert "python3 -m venv" in env and re.search(r"^\s*python -m", env, re.M) is None
    assert "CRYPTEN_LITE_SYSTEM_TESTS=1" in top and ".venv" in top
    for extra in ("examples", "transformers", "quantization", "vision", "dev", "test"):
        assert f"`{extra}`" in top, extra
    ci = (ROOT / ".ci" / "run").read_text()
    assert "export CRYPTEN_LITE_SYSTEM_TESTS=1\nbash scripts/test.sh\n" in ci


def test_system_tests_skip_naming_the_variable(pytestconfig):
    """Without CRYPTEN_LITE_SYSTEM_TESTS=1 the Docker test is skipped, saying what it installs."""
    if os.environ.get("CRYPTEN_LITE_SYSTEM_TESTS") == "1":
        pytest.skip("system tests are on in this run")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                          "tests/integration/test_compose_docker.py"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600,
                         env={k: v for k, v in os.environ.items() if k != "CRYPTEN_LITE_SKIP_DOCKER"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 skipped" in out.stdout and "set CRYPTEN_LITE_SYSTEM_TESTS=1 to run it" in out.stdout
    assert "apt-installs docker.io" in out.stdout
    assert "== phase container (system tests): 2 tests ==" in out.stdout
