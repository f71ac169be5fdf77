"""End to end: `crypten-lite launch`, killed parties, bad configuration, errors before init."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import socket
import subprocess
import sys

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


def _launch(*args: str, timeout: float = 250) -> subprocess.CompletedProcess:
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


def test_launch_passes_session_settings_from_the_environment():
    """CRYPTEN_LITE_TRUNCATION / _PRECISION set where `launch` runs reach every party (they
    used to be dropped silently): the product then costs its exact truncation's round."""
    base = [sys.executable, "-m", "crypten_lite.cli", "launch", "-n", "2", str(SCRIPTS / "settings.py")]
    plain = subprocess.run(base, capture_output=True, text=True, timeout=250, env=_env({}))
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.count("truncation local precision 16 product rounds 1 result [3.0, -8.0]") == 2
    assert "gets from this environment" not in plain.stderr
    r = subprocess.run(base, capture_output=True, text=True, timeout=250, env=_env(
        {"CRYPTEN_LITE_TRUNCATION": "exact", "CRYPTEN_LITE_PRECISION": "20"}))
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("truncation exact precision 20 product rounds 2 result [3.0, -8.0]") == 2, r.stdout
    assert ("every party gets from this environment: CRYPTEN_LITE_PRECISION=20, "
            "CRYPTEN_LITE_TRUNCATION=exact") in r.stderr


def test_party_pool_passes_session_settings(monkeypatch):
    from crypten_lite.mpc import PartyPool
    monkeypatch.setenv("CRYPTEN_LITE_TRUNCATION", "exact")
    with PartyPool(2, timeout=60) as pool:
        got = pool.run(_truncation_setting)
    assert got == ["exact", "exact"]
    # an explicit env= still wins over this process's environment
    with PartyPool(2, timeout=60, env={"CRYPTEN_LITE_TRUNCATION": "local"}) as pool:
        assert pool.run(_truncation_setting) == ["local", "local"]


@pytest.mark.parametrize("mode", ["int64", "limbs"])
def test_party_pool_passes_the_ring_gemm_choice(monkeypatch, mode):
    """CRYPTEN_LITE_RING_GEMM reaches every party (and the products agree either way: the
    parties' matmul of shared values is revealed equal to torch's)."""
    from crypten_lite.mpc import PartyPool
    monkeypatch.setenv("CRYPTEN_LITE_RING_GEMM", mode)
    with PartyPool(2, timeout=60) as pool:
        got = pool.run(_ring_gemm_product)
    assert [choice for choice, _ in got] == [mode, mode]
    assert all(ok for _, ok in got)


def _ring_gemm_product() -> tuple[str, bool]:
    import torch
    import crypten_lite
    from crypten_lite.provider.correlations import ring_gemm_choice
    g = torch.Generator().manual_seed(0)  # test data, not shares
    a, b = torch.randn(128, 256, generator=g), torch.randn(256, 256, generator=g)
    got = (crypten_lite.cryptensor(a, src=0) @ crypten_lite.cryptensor(b, src=1)).get_plain_text()
    return ring_gemm_choice(), bool((got - a @ b).abs().max() < 1e-2)


def _truncation_setting() -> str:
    from crypten_lite.session import current
    return current().config.truncation


def _rank_1_dies() -> str:
    import os
    import signal
    from crypten_lite.session import current
    if current().rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's out-of-memory killer does
    return "answered"


@pytest.mark.parametrize("protocol", ["additive", "rss"])
def test_party_pool_names_a_party_process_that_dies(protocol):
    """A party process killed while the others have answered (the bench's large workloads
    once met the out-of-memory killer): the pool names it and its signal at once instead of
    waiting for its deadline (an hour here, as for the bench's large workloads), and stops
    every process it started."""
    from crypten_lite.mpc import PartyPool
    from crypten_lite.mpc.launcher import PartyFailure
    pool = PartyPool(3, timeout=3600, protocol=protocol)
    procs = list(pool._procs)
    with pytest.raises(PartyFailure, match=r"failed on party 1 \(its process was killed by SIGKILL") as e:
        pool.run(_rank_1_dies)
    assert "out-of-memory" in str(e.value)
    assert not any(p.is_alive() for p in procs)


def test_launch_stops_everything_and_fails_when_a_party_dies():
    import uuid
    marker = f"marker-{uuid.uuid4().hex}"  # identifies this run's processes only
    r = _launch("-n", "3", "--timeout", "600", str(SCRIPTS / "victim.py"), "1", marker)
    assert r.returncode != 0
    assert "rank 1 failed first: exited with code -9 (SIGKILL)" in r.stderr
    # The survivors' own errors come after, each naming the dead party as the cause: seen on a
    # receive or a send to it, or through the other survivor's abort (whichever comes first).
    named = (r"party 1 is unreachable|cannot send to party 1|party 1 failed: "
             r"|party \d stopped because party 1 failed")
    for rank in (0, 2):
        assert re.search(f"rank {rank} failed too: exited with code 3: CommunicationError after "
                         rf".*party {rank}: ({named})", r.stderr), r.stderr
    assert "within 600 s" not in r.stdout + r.stderr  # the death was seen, not the timeout
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


def _finish(procs, timeout=250):  # hang guard (generous: a loaded machine is slow)
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
    # The death is seen at once (the stream ends); the timeout only bounds a survivor that
    # missed it, so it is large: no correct wait may reach it on a loaded machine.
    procs = _start_parties(n, SCRIPTS / "victim.py", [str(victim)], timeout=600)
    outs = _finish(procs)
    for rank, (code, out) in enumerate(outs):
        if rank == victim:
            assert code == -signal.SIGKILL
            continue
        assert code == 3, out
        assert f"party {victim}" in out and "CommunicationError" in out
        assert "within 600 s" not in out


def _read_until(proc: subprocess.Popen, text: str, timeout: float = 200) -> str:
    """What `proc` printed up to and including the first line holding `text`."""
    import select
    seen = ""
    while text not in seen:
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        assert ready, f"no {text!r} from {proc.args}: {seen}"  # hang guard
        line = proc.stdout.readline()
        assert line, f"{proc.args} ended before {text!r}: {seen}"
        seen += line
    return seen


def test_dead_dealer_becomes_error():
    """The dealer dies while the parties multiply endlessly (victim.py loop): they report it."""
    procs = _start_parties(2, SCRIPTS / "victim.py", ["loop"], timeout=600)
    try:
        before = [_read_until(p, "warm") for p in procs[1:]]  # both used the dealer already
    finally:
        procs[0].kill()  # the dealer
    try:  # read on through the same buffered file (pytest-timeout guards a hang)
        outs = [(early + p.stdout.read(), p.wait()) for p, early in zip(procs[1:], before)]
        outs = [(code, out) for out, code in outs]
    finally:
        _finish(procs)
    assert all(code == 3 for code, _ in outs), outs
    assert "dealer" in outs[0][1].lower(), outs  # rank 0 asks the dealer
    assert all("within 600 s" not in out for _, out in outs), outs


def test_config_mismatch_is_a_clear_error_on_both_sides():
    procs = _start_parties(2, SCRIPTS / "arith.py", [], timeout=600,
                           overrides={1: {"CRYPTEN_LITE_PRECISION": "12"}})
    outs = _finish(procs)
    for code, out in outs:  # both learn it from the handshake, not from a 600 s timeout
        assert code != 0
        assert "configuration digest differs" in out, out
        assert "unreachable" not in out, out


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
    r = subprocess.run([sys.executable, str(SCRIPTS / "arith.py")], env=_env(party_envs[0]),
                       capture_output=True, text=True, timeout=200)  # hang guard only
    assert r.returncode != 0 and re.search(r"party 1 is unreachable at \S+ after 3 s", r.stderr), r.stderr


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


# -- failure reports (issue 15): the party that failed first, complete, every time -----------

RAISER = SCRIPTS / "raiser.py"
RAISER_FRAMES = ["<module>", "level_a", "level_b", "level_c"]


def _summary(stderr: str, rank: int) -> list[str]:
    """The traceback launch's summary gives for the party that failed first."""
    lines = stderr.splitlines()
    head = lines.index(f"crypten-lite launch: rank {rank} failed first: exited with code 1")
    block = []
    for line in lines[head + 1:]:
        if not line.startswith(f"[rank {rank}] "):
            break
        block.append(line[len(f"[rank {rank}] "):])
    return block


def _assert_raiser_traceback(block: list[str]) -> None:
    """Every frame of raiser.py's failure, in order, then the exception line, nothing cut."""
    assert block[0] == "Traceback (most recent call last):", block
    frames = [line for line in block if line.startswith("  File ")]
    assert [f.rsplit(" in ", 1)[1] for f in frames] == RAISER_FRAMES, block
    assert all(str(RAISER) in f for f in frames), block
    sources = [block[block.index(f) + 1].strip() for f in frames]
    assert sources == ["level_a()", "level_b()", "level_c()", 'raise ValueError("refused at level c")']
    assert block[-1] == "ValueError: refused at level c", block


@pytest.mark.timeout(240)  # hang guard, far below the parties' 600 s timeout
@pytest.mark.parametrize("mode", ["recv", "barrier"])
def test_a_party_that_raises_stops_the_others_at_once(mode):
    """Rank 1 raises mid-protocol; ranks 0 and 2 wait on it with a 600 s timeout. They get a
    CommunicationError naming party 1 (not the timeout), and launch names rank 1 first."""
    r = _launch("-n", "3", "--timeout", "600", str(RAISER), "1", mode, timeout=200)
    assert r.returncode == 1, r.stdout + r.stderr
    _assert_raiser_traceback(_summary(r.stderr, 1))
    for rank in (0, 2):
        assert f"[rank {rank}] rank {rank} got CommunicationError: party {rank}: party 1 failed: " \
               "ValueError" in r.stdout, r.stdout
        assert re.search(rf"crypten-lite launch: rank {rank} failed too, because party 1 failed: "
                         rf"exited with code 1: crypten_lite.errors.CommunicationError: party {rank}: "
                         "party 1 failed: ValueError", r.stderr), r.stderr
    assert "within 600 s" not in r.stdout + r.stderr  # not the timeout error
    assert "refused at level c" not in r.stdout  # the abort carries the type, not the message
    assert "stopped rank" not in r.stderr  # every party ended by itself


@pytest.mark.timeout(240)
def test_a_send_to_a_party_that_failed_names_its_failure():
    """Rank 1 raises; rank 0 only sends to it afterwards. The send that fails reports rank 1's
    own failure (read from rank 1's abort frame), and launch names rank 1 first: a send
    used to fail with "its subscription to this party ended" without reading why, and launch
    then blamed rank 0 (seen beside a CPU hog, where rank 0's next op was a barrier's send)."""
    r = _launch("-n", "2", "--timeout", "600", str(SCRIPTS / "send_after_failure.py"), timeout=200)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "rank 0 got CommunicationError: party 0: cannot send to party 1: party 1 failed: " \
           "ValueError" in r.stdout, r.stdout + r.stderr
    assert "crypten-lite launch: rank 1 failed first: exited with code 1" in r.stderr, r.stderr
    assert "subscription to this party ended" not in r.stdout + r.stderr


@pytest.mark.slow
def test_failure_report_is_complete_every_time():
    """10 launches: rank 1 writes 2000 lines to each pipe, then raises; every line and the whole
    traceback arrive, and the summary names rank 1 with its traceback, rank 0's error after
    (each launch about 6 s: ten keep the suite's time in check and still catch a lost line)."""
    for run in range(10):
        r = _launch("-n", "2", "--provider", "tfp", "--timeout", "600", str(RAISER), "1", "noisy",
                    timeout=200)
        assert r.returncode == 1, (run, r.stdout[-3000:], r.stderr[-3000:])
        out = [line for line in r.stdout.splitlines() if line.startswith("[rank 1] stdout line")]
        err = [line for line in r.stderr.splitlines() if line.startswith("[rank 1] stderr line")]
        assert out == [f"[rank 1] stdout line {i}" for i in range(2000)], run
        assert err == [f"[rank 1] stderr line {i}" for i in range(2000)], run
        streamed = [line[len("[rank 1] "):] for line in r.stderr.splitlines()
                    if line.startswith("[rank 1] ") and "line" not in line.split()[2:3]]
        _assert_raiser_traceback(_summary(r.stderr, 1))
        assert streamed[-len(_summary(r.stderr, 1)):] == _summary(r.stderr, 1), run
        summary_at = r.stderr.index("crypten-lite launch: rank 1 failed first")
        assert r.stderr.index("crypten-lite launch: rank 0 failed too, because party 1 failed") \
            > summary_at, run


def test_module_not_found_always_appears():
    """A rank that fails before joining the session: its error is reported, the rest stopped."""
    for run in range(5):
        r = _launch("-n", "2", "--provider", "tfp", "--timeout", "600",
                    str(SCRIPTS / "missing_module.py"), timeout=200)
        assert r.returncode == 1, (run, r.stdout, r.stderr)
        assert "crypten-lite launch: rank 1 failed first: exited with code 1" in r.stderr, r.stderr
        tail = r.stderr[r.stderr.index("crypten-lite launch: rank 1 failed first"):]
        assert "[rank 1] ModuleNotFoundError: No module named 'crypten_lite_no_such_module'" in tail
        assert "[rank 1]     import crypten_lite_no_such_module" in tail
        assert "crypten-lite launch: stopped rank 0" in tail


def test_a_party_that_leaves_fails_waits_on_it_at_once():
    """Rank 1 exits 0 after the first product; rank 0's recv from it fails at once (it closed
    its session: no message can follow), and rank 0 is the one that failed."""
    r = _launch("-n", "2", "--provider", "tfp", "--timeout", "600", str(RAISER), "1", "exit",
                timeout=200)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "party 0: party 1 closed its session (it finished or exited)" in r.stdout, r.stdout
    assert "crypten-lite launch: rank 0 failed first: exited with code 1" in r.stderr, r.stderr


def test_sigint_stops_everything_and_says_what_it_stopped():
    import select
    import uuid
    marker = f"marker-{uuid.uuid4().hex}"
    proc = subprocess.Popen([sys.executable, "-m", "crypten_lite.cli", "launch", "-n", "3",
                             "--timeout", "600", str(RAISER), "-1", "wait", marker],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env({}))
    try:
        inside, seen = set(), b""
        while len(inside) < 3:  # every party is waiting inside the protocol
            ready, _, _ = select.select([proc.stdout], [], [], 200)
            assert ready, "the parties never reached the protocol"
            chunk = os.read(proc.stdout.fileno(), 65536)
            assert chunk, proc.stderr.read().decode()
            seen += chunk
            inside = {line for line in seen.decode().splitlines() if "inside the protocol" in line}
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)  # hang guard only (a loaded machine took > 60 s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "crypten-lite launch: interrupted (SIGINT); stopped rank 0, rank 1, rank 2, dealer" \
        in err.decode(), err.decode()
    leftovers = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    assert leftovers.stdout.strip() == ""


def test_progress_bars_become_lines():
    r = _launch("-n", "2", "--provider", "tfp", str(SCRIPTS / "progress.py"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "\r" not in r.stdout + r.stderr
    for rank in range(2):
        bars = [line for line in r.stderr.splitlines() if line.startswith(f"[rank {rank}] steps:")]
        assert bars and "100%" in bars[-1] and "50/50" in bars[-1], r.stderr
        assert f"[rank {rank}] done" in r.stdout
    for line in r.stdout.splitlines() + r.stderr.splitlines():
        assert line.startswith(("[rank ", "crypten-lite launch:")), line
