"""End to end: `crypten-lite launch`, killed parties, bad configuration, errors before init."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from crypten_lite.mpc.launcher import free_ports, local_env

HERE = pathlib.Path(__file__).parent
SCRIPTS = HERE / "scripts"
ROOT = HERE.parents[1]


def _env(extra: dict[str, str]) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CRYPTEN_LITE_")}
    return {**base, **extra, "PYTHONUNBUFFERED": "1"}


def _children_of(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _launch(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "crypten_lite.cli", "launch", *args],
                          capture_output=True, text=True, timeout=timeout, env=_env({}))


@pytest.mark.parametrize("n,provider", [(2, "dealer"), (3, "dealer"), (2, "tfp")])
def test_launch_runs_script_on_all_parties(n, provider):
    r = _launch("-n", str(n), "--provider", provider, str(SCRIPTS / "arith.py"), "--flag", "v")
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in range(n):
        assert f"[rank {rank}] result [4.5, -10.0, 0.0] args ['--flag', 'v']" in r.stdout
    if provider == "tfp":
        assert "insecure" in r.stderr.lower()


def test_launch_stops_everything_and_fails_when_a_party_dies():
    import uuid
    marker = f"marker-{uuid.uuid4().hex}"  # identifies this run's processes only
    start = time.monotonic()
    r = _launch("-n", "3", "--timeout", "20", str(SCRIPTS / "victim.py"), "1", marker)
    assert r.returncode != 0
    assert "rank 1 failed first: exited with code -9 (SIGKILL)" in r.stderr
    for rank in (0, 2):  # the survivors' own errors come after, naming the dead party
        assert re.search(f"rank {rank} failed too: exited with code 3: CommunicationError after "
                         rf".*party {rank}: party 1 is unreachable", r.stderr), r.stderr
    assert time.monotonic() - start < 60
    leftovers = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    assert leftovers.stdout.strip() == ""


def _start_parties(n: int, script: pathlib.Path, args: list[str], timeout: float = 10.0,
                   provider: str = "dealer", overrides: dict[int, dict[str, str]] | None = None):
    party_envs, dealer_env = local_env(n, provider, timeout=timeout)
    procs = []
    if provider == "dealer":
        procs.append(subprocess.Popen([sys.executable, "-m", "crypten_lite.cli", "dealer"],
                                      env=_env(dealer_env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    for rank, env in enumerate(party_envs):
        env = {**env, **(overrides or {}).get(rank, {})}
        procs.append(subprocess.Popen([sys.executable, str(script), *args], env=_env(env),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


def _finish(procs, timeout=90):
    outs = []
    try:
        for p in procs[1:] if len(procs) > 1 else procs:
            out, _ = p.communicate(timeout=timeout)
            outs.append((p.returncode, out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


@pytest.mark.parametrize("victim,n", [(1, 2), (2, 3), (0, 3)])
def test_killed_party_becomes_error_on_every_survivor(victim, n):
    procs = _start_parties(n, SCRIPTS / "victim.py", [str(victim)], timeout=10)
    outs = _finish(procs)
    for rank, (code, out) in enumerate(outs):
        if rank == victim:
            assert code == -signal.SIGKILL
            continue
        assert code == 3, out
        assert f"party {victim}" in out and "CommunicationError" in out


def test_dead_dealer_becomes_error():
    procs = _start_parties(2, SCRIPTS / "victim.py", ["99"], timeout=8)
    time.sleep(0.5)
    procs[0].kill()  # the dealer
    outs = _finish(procs)
    assert any("dealer" in out.lower() for _, out in outs), outs


def test_config_mismatch_is_a_clear_error_on_both_sides():
    procs = _start_parties(2, SCRIPTS / "arith.py", [], timeout=10,
                           overrides={1: {"CRYPTEN_LITE_PRECISION": "12"}})
    outs = _finish(procs)
    for code, out in outs:
        assert code != 0
        assert "configuration digest differs" in out or "refused" in out, out


def test_port_in_use_is_a_clear_error():
    party_envs, _ = local_env(2, "tfp", timeout=5)
    port = int(party_envs[0]["CRYPTEN_LITE_PARTIES"].split(",")[0].rsplit(":", 1)[1])
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", port))
    blocker.listen()
    try:
        r = subprocess.run([sys.executable, str(SCRIPTS / "arith.py")], env=_env(party_envs[0]),
                           capture_output=True, text=True, timeout=60)
    finally:
        blocker.close()
    assert r.returncode != 0 and "port is in use" in r.stderr


def test_unreachable_peer_is_a_clear_error_within_timeout():
    party_envs, _ = local_env(2, "tfp", timeout=3)
    start = time.monotonic()
    r = subprocess.run([sys.executable, str(SCRIPTS / "arith.py")], env=_env(party_envs[0]),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "party 1 is unreachable" in r.stderr
    assert time.monotonic() - start < 30


def test_ops_before_init_explain_what_to_do():
    code = "import torch, crypten_lite\ncrypten_lite.cryptensor(torch.ones(2))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env({}))
    assert r.returncode != 0 and "crypten_lite.init()" in r.stderr


def test_launch_help_helps():
    r = subprocess.run([sys.executable, "-m", "crypten_lite.cli", "launch", "--help"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "--provider" in r.stdout and "tfp" in r.stdout


def test_main_example_private_inference_matches_torch():
    import re
    r = _launch("-n", "2", str(ROOT / "examples" / "private_inference.py"), "--images", "8", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    private = re.search(r"\[rank 0\] private prediction: (\[.*\])", r.stdout).group(1)
    plain = re.search(r"\[rank 0\] plaintext torch prediction: (\[.*\])", r.stdout).group(1)
    assert private == plain
    diff = float(re.search(r"logit difference: ([0-9.e+-]+)", r.stdout).group(1))
    assert diff <= 1e-2


def test_quantized_example_matches_torch():
    r = _launch("-n", "2", str(ROOT / "examples" / "quantized_inference.py"), "--images", "8", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[rank 0] predictions equal to torch's quantized model: 100.0%" in r.stdout
