"""Protocol rss end to end: `crypten-lite launch -n 3 --protocol rss`, PartyPool, party, dealer,
a killed party, a party with the other protocol, and the compose variant's structure.

Every session here is 3 real processes over gRPC and no dealer. No test depends on timing: the
parties' own timeout is 600 s (a dead peer is seen at once, when its stream ends), and the
subprocess timeouts are hang guards only.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import uuid

import pytest
import torch

import compose_env
from crypten_lite.errors import ConfigError
from crypten_lite.mpc.launcher import PartyPool, local_env, resolve_protocol

HERE = pathlib.Path(__file__).parent
SCRIPTS = HERE / "scripts"
ROOT = HERE.parents[1]
RSS_COMPOSE = ROOT / "docker-compose.rss.yml"
HANG = 300  # hang guard of each subprocess (the parties' own waits are 600 s)


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CRYPTEN_LITE_")}
    return {**base, **(extra or {}), "PYTHONUNBUFFERED": "1"}


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = HANG) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "crypten_lite.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=_env(env))


def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(14)  # insecure-ok: test inputs, not shares
    return {"a": torch.randn(4, 3, generator=g) * 4, "b": torch.randn(3, 5, generator=g) * 4,  # insecure-ok: test inputs
            "c": torch.randn(4, 3, generator=g) * 4}  # insecure-ok: test inputs


def _results(stdout: str, rank: int, tag: str = "result") -> dict | list:
    found = re.findall(rf"^\[rank {rank}\] {tag} (.*)$", stdout, re.M)
    assert len(found) == 1, stdout
    return json.loads(found[0])


# -- launch ------------------------------------------------------------------------------------

def test_launch_rss_computes_like_torch_without_a_dealer():
    inputs = _inputs()
    argument = json.dumps({k: v.tolist() for k, v in inputs.items()})
    r = _cli("launch", "-n", "3", "--protocol", "rss", "--timeout", "600",
             str(SCRIPTS / "rss_arith.py"), argument)
    assert r.returncode == 0, r.stdout + r.stderr
    a, b, c = inputs["a"], inputs["b"], inputs["c"]
    want = {"add": a + c, "mul": a * c, "matmul": a @ b, "sum": (a * c).sum()}
    for rank in range(3):
        got = _results(r.stdout, rank)
        for name, ref in want.items():
            # 16 fractional bits: inputs off by 2^-17, products by |x| 2^-16 plus the truncation's
            # last unit, sums of 3 or 12 such terms.
            assert torch.allclose(torch.tensor(got[name]), ref.float(), atol=2e-3, rtol=0), (
                rank, name, got[name], ref)
    # No dealer: the launcher started three parties and nothing else, told none of them of a
    # dealer, and every party ran protocol rss.
    children = _results(r.stdout, 0, "launcher-children")
    assert len(children) == 3 and all("rss_arith.py" in c for c in children), children
    assert _results(r.stdout, 0, "session") == {"protocol": "rss", "dealer": "", "env_dealer": None}
    assert "[dealer]" not in r.stdout + r.stderr


@pytest.mark.parametrize("argv,why", [
    (["-n", "2", "--protocol", "rss"], "--protocol rss (replicated secret sharing) runs exactly 3 "
                                       "parties, got -n 2"),
    (["-n", "4", "--protocol", "rss"], "runs exactly 3 parties, got -n 4"),
    (["-n", "3", "--protocol", "rss", "--provider", "tfp"], "--protocol rss needs none"),
    (["-n", "3", "--protocol", "rss", "--provider", "dealer"], "--protocol rss needs none"),
])
def test_launch_refuses_a_wrong_rss_session_before_starting_anything(argv, why):
    r = _cli("launch", *argv, str(SCRIPTS / "rss_arith.py"), "{}")
    assert r.returncode == 2, r.stdout + r.stderr
    assert why in r.stderr, r.stderr
    assert r.stdout == "" and "[rank" not in r.stderr and "[dealer]" not in r.stderr


def test_launch_takes_the_protocol_from_the_environment():
    r = _cli("launch", "-n", "2", str(SCRIPTS / "rss_arith.py"), "{}",
             env={"CRYPTEN_LITE_PROTOCOL": "rss"})
    assert r.returncode == 2 and "runs exactly 3 parties, got -n 2" in r.stderr, r.stderr
    r = _cli("launch", "-n", "3", str(SCRIPTS / "rss_arith.py"), "{}",
             env={"CRYPTEN_LITE_PROTOCOL": "aby3"})
    assert r.returncode == 2 and "CRYPTEN_LITE_PROTOCOL='aby3' is not one of additive, rss" in r.stderr


def test_help_explains_the_protocol():
    launch = _cli("launch", "--help").stdout
    assert "--protocol {additive,rss}" in launch and "no dealer" in launch
    assert "CRYPTEN_LITE_PROTOCOL" in launch and "docs/protocols.md" in launch
    party = re.sub(r"\s+", " ", _cli("party", "--help").stdout)
    assert "--protocol {additive,rss}" in party and "overriding CRYPTEN_LITE_PROTOCOL" in party
    bench = _cli("bench", "--help").stdout
    assert "--protocol {additive,rss}" in bench


def test_dealer_refuses_to_serve_an_rss_session():
    envs, dealer_env = local_env(3, protocol="rss")
    assert dealer_env is None and all("CRYPTEN_LITE_DEALER" not in e for e in envs)
    r = _cli("dealer", "--listen", "127.0.0.1:0", env=envs[0])
    assert r.returncode == 2 and "CRYPTEN_LITE_PROTOCOL=rss needs no dealer" in r.stderr, r.stderr


def test_party_flag_overrides_the_environment():
    """`crypten-lite party --protocol rss` with CRYPTEN_LITE_PROTOCOL=additive and 2 parties:
    the flag wins, and the 2-party rss session is refused before anything starts."""
    envs, _ = local_env(2, "tfp", protocol="additive")
    r = _cli("party", "--protocol", "rss", str(SCRIPTS / "rss_arith.py"), "{}", env=envs[0], timeout=120)
    assert r.returncode != 0 and "protocol 'rss' (replicated secret sharing) needs exactly 3 parties" \
        in r.stderr, r.stderr


# -- PartyPool / run_multiprocess -------------------------------------------------------------

def _whoami() -> dict:
    import crypten_lite
    config = crypten_lite.session.current().config
    x = crypten_lite.cryptensor(torch.tensor([1.5, -2.0]) if config.rank == 2 else None, src=2)
    return {"protocol": config.protocol, "dealer": config.dealer,
            "provider": type(crypten_lite.session.current().provider).__name__,
            "x": (x + x).get_plain_text().tolist()}


def test_party_pool_rss_starts_no_dealer():
    with PartyPool(3, protocol="rss", timeout=600) as pool:
        assert pool.protocol == "rss" and len(pool._procs) == 3  # three parties, nothing else
        results = pool.run(_whoami)
    assert results == [{"protocol": "rss", "dealer": "", "provider": "NoProvider",
                        "x": [3.0, -4.0]}] * 3


def test_protocol_from_keyword_env_and_process_environment(monkeypatch):
    assert resolve_protocol(3) == "additive"
    assert resolve_protocol(3, env={"CRYPTEN_LITE_PROTOCOL": "rss"}) == "rss"
    monkeypatch.setenv("CRYPTEN_LITE_PROTOCOL", "rss")
    assert resolve_protocol(3) == "rss"
    assert resolve_protocol(2, "additive") == "additive"  # the keyword wins
    with pytest.raises(ConfigError, match="needs exactly 3 parties, got 2"):
        PartyPool(2)  # refused before any process starts
    monkeypatch.delenv("CRYPTEN_LITE_PROTOCOL")
    with pytest.raises(ConfigError, match="needs exactly 3 parties, got 4"):
        PartyPool(4, protocol="rss")
    with pytest.raises(ConfigError, match="protocol must be one of"):
        PartyPool(3, protocol="spdz")
    from crypten_lite.mpc import run_multiprocess
    with pytest.raises(ConfigError, match="needs exactly 3 parties"):
        run_multiprocess(2, protocol="rss")


# -- faults -------------------------------------------------------------------------------------

def _start_parties(script: pathlib.Path, args: list[str],
                   overrides: dict[int, dict[str, str]] | None = None,
                   envs: list[dict[str, str]] | None = None, ranks=range(3),
                   entry: tuple[str, ...] = ()) -> list[subprocess.Popen]:
    """The 3 parties of an rss session on loopback, each `python [ENTRY] SCRIPT ARGS`."""
    if envs is None:
        envs, dealer_env = local_env(3, timeout=600, protocol="rss")
        assert dealer_env is None
    return [subprocess.Popen([sys.executable, *entry, str(script), *args],
                             env=_env({**envs[rank], **(overrides or {}).get(rank, {})}),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for rank in ranks]


def _finish(procs: list[subprocess.Popen]) -> list[tuple[int, str]]:
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=HANG)  # hang guard only
            outs.append((p.returncode, out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


PARTY_FLAG = ("-m", "crypten_lite.cli", "party", "--protocol", "rss")


@pytest.mark.parametrize("victim,entry", [(0, ()), (2, PARTY_FLAG)], ids=["script", "party-flag"])
def test_killed_party_is_a_clear_error_on_both_others(victim, entry):
    """Party `victim` kills itself (SIGKILL) after a first product, while the others are inside
    the next one waiting for its message (victim.py): both report a CommunicationError naming
    it, not their 600 s timeout. The second case starts each party as the container does,
    `crypten-lite party --protocol rss`, with CRYPTEN_LITE_PROTOCOL=additive in its
    environment: the flag wins (an additive session of 3 would need a dealer, and fail)."""
    overrides = {r: {"CRYPTEN_LITE_PROTOCOL": "additive"} for r in range(3)} if entry else None
    outs = _finish(_start_parties(SCRIPTS / "victim.py", [str(victim)], overrides, entry=entry))
    for rank, (code, out) in enumerate(outs):
        if rank == victim:
            assert code == -signal.SIGKILL, out
            continue
        assert code == 3, out
        assert re.search(rf"CommunicationError after .*party {rank}: .*party {victim}", out), out
        assert "within 600 s" not in out, out


def test_launch_rss_kill_stops_everything():
    marker = f"marker-{uuid.uuid4().hex}"  # identifies this run's processes only
    r = _cli("launch", "-n", "3", "--protocol", "rss", "--timeout", "600",
             str(SCRIPTS / "victim.py"), "1", marker)
    assert r.returncode != 0
    assert "rank 1 failed first: exited with code -9 (SIGKILL)" in r.stderr, r.stderr
    for rank in (0, 2):
        assert re.search(rf"rank {rank} failed too: exited with code 3: CommunicationError after "
                         rf".*party {rank}: .*party 1", r.stderr), r.stderr
    assert "within 600 s" not in r.stdout + r.stderr
    assert "[dealer]" not in r.stdout + r.stderr
    leftovers = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    assert leftovers.stdout.strip() == ""


def _read_until(procs: list[subprocess.Popen], text: str) -> list[str]:
    """What each of `procs` printed until one of them printed a line holding `text`."""
    import select
    seen = {p.stdout.fileno(): b"" for p in procs}  # raw reads: nothing left in a buffer
    while not any(text.encode() in out for out in seen.values()):
        ready, _, _ = select.select(list(seen), [], [], HANG)
        assert ready, f"no {text!r} from any party: {seen}"  # hang guard
        for fd in ready:
            chunk = os.read(fd, 1 << 16)
            assert chunk, f"a party ended before {text!r}: {seen}"
            seen[fd] += chunk
    return [seen[p.stdout.fileno()].decode(errors="replace") for p in procs]


def test_a_party_with_the_other_protocol_is_refused_by_name_on_every_party():
    """Rank 1 runs protocol additive, ranks 0 and 2 rss (same session, same parties): every
    party fails at the handshake with the configuration refusal naming the protocol, and
    none waits for its 600 s timeout. Rank 0 starts only once ranks 1 and 2 have refused each
    other: they must stay until rank 0 has heard from them (else it would wait 600 s for
    parties that already left)."""
    envs, _ = local_env(3, timeout=600, protocol="rss")
    overrides = {1: {"CRYPTEN_LITE_PROTOCOL": "additive"}}
    procs = _start_parties(SCRIPTS / "arith.py", [], overrides, envs, ranks=[1, 2])
    try:  # one of them refused the other's Hello (its log line); both now know
        early = ["", *_read_until(procs, "refused a handshake")]
    except BaseException:
        _finish(procs)
        raise
    procs = _start_parties(SCRIPTS / "arith.py", [], overrides, envs, ranks=[0]) + procs
    outs = [(code, before + out) for before, (code, out) in zip(early, _finish(procs))]
    for rank, (code, out) in enumerate(outs):
        assert code != 0, (rank, out)
        assert "configuration digest differs" in out and "protocol" in out, (rank, out)
        assert "unreachable" not in out and "within 600 s" not in out, (rank, out)
        if rank != 1:  # the rss parties name the party that differs
            assert "party 1" in out, (rank, out)


# -- the compose variant (static; tests/integration/test_compose_docker.py runs it) ------------

def test_rss_compose_file_has_three_parties_no_dealer_and_own_keys():
    services = compose_env.services(RSS_COMPOSE)
    assert set(services) == {"certs", "party0", "party1", "party2"}
    parties = ",".join(f"party{r}:50051" for r in range(3))
    for rank in range(3):
        env = services[f"party{rank}"].environment
        assert env["CRYPTEN_LITE_RANK"] == str(rank) and env["CRYPTEN_LITE_PARTIES"] == parties
        assert env["CRYPTEN_LITE_PROTOCOL"] == "rss" and "CRYPTEN_LITE_DEALER" not in env
        assert env["CRYPTEN_LITE_TLS_DIR"] == "/certs"
        from crypten_lite.config import Config
        assert Config.from_env(env).protocol == "rss"  # the project's own validation
    mounts = compose_env.mounts(RSS_COMPOSE)
    for rank in range(3):
        assert mounts[f"party{rank}"] == [compose_env.Mount(f"tls-party{rank}", "/certs", True)]
    script = services["certs"].command[0]
    assert "crypten-lite certs --parties 3 --out /ca" in script
    installed = re.findall(r"install .* (/tls/\S+)/$", script, re.M)
    assert sorted(set(installed)) == [f"/tls/party{r}" for r in range(3)], script
    assert not [line for line in script.splitlines() if "install" in line and "dealer" in line], (
        "no service may receive the dealer's certificate or key", script)
    for rank in range(3):
        assert compose_env.healthchecks(RSS_COMPOSE)[f"party{rank}"] == [
            "crypten-lite", "health", "--target", f"party{rank}:50051"]


def test_rss_compose_command_is_the_documented_one():
    header = RSS_COMPOSE.read_text()
    for doc in (ROOT / "README.md", ROOT / "docs" / "deployment.md", ROOT / "docs" / "protocols.md"):
        lines = [line.split("#")[0].strip() for line in doc.read_text().splitlines()
                 if "docker-compose.rss.yml" in line and line.startswith("docker compose")]
        assert lines, f"{doc.name} gives no command for docker-compose.rss.yml"
        for line in lines:
            assert f"#   {line}\n" in header, (doc.name, line)


# -- bench ---------------------------------------------------------------------------------------

def _needs_a_triple():
    """A workload whose protocol asks for a Beaver triple, which no rss protocol does (the rss
    session's provider refuses it by name on every party, at the same point)."""
    import crypten_lite
    crypten_lite.session.current().provider.get("triple", [(4,), (4,)], "mul")


def test_bench_rss_rows_carry_the_protocol_and_name_a_missing_operation(monkeypatch):
    import cloudpickle

    from crypten_lite import bench
    monkeypatch.setitem(bench.WORKLOADS, "needs_a_triple", _needs_a_triple)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the parties cannot import it
    try:
        # (the failing workload last: a failure closes the pool, the next would start another)
        rows = bench.run(["matmul_256", "needs_a_triple"], 3, "dealer", 1, protocol="rss")
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    matmul, missing = rows
    assert missing["workload"] == "needs_a_triple" and missing["protocol"] == "rss"
    assert "has no dealer" in missing["missing"] and "triple/mul" in missing["missing"], missing
    assert missing["error"].startswith("not run: protocol rss lacks an operation: "), missing
    assert matmul["protocol"] == "rss" and matmul["provider"] is None and matmul["parties"] == 3
    assert matmul["online_dealer_bytes"] == 0 and matmul["offline_dealer_bytes"] == 0
    assert matmul["rounds"] == 1 and matmul["bytes_sent_per_party"] == [8 * 256 * 256 * 2] * 3, matmul
    assert matmul["max_error"] < 1e-2
    # each party's peak memory over the run: at least its two 256 x 256 operands' components
    # (4 int64 tensors of 512 KiB), and well below the machine's memory
    peaks = matmul["peak_memory_mb_per_party"]
    assert len(peaks) == 3 and all(2.0 <= p < 4096 for p in peaks), peaks


def test_bench_no_offline_times_the_helper_truncation_end_to_end():
    """`crypten-lite bench --no-offline`: every repetition runs without an offline phase, so
    under rss a fixed-point matmul truncates by the helper truncation (2 rounds; the helper,
    party 256 * 256 mod 3 = 1, sends 32 B per output element, the others 16 B), and the line
    says so and names the machine that measured it."""
    from crypten_lite import bench
    assert bench.build_parser().parse_args(["--no-offline"]).offline is False
    (row,) = bench.run(["matmul_256"], 3, "dealer", 1, protocol="rss", offline=False)
    n = 256 * 256
    assert row["offline_phase"] is False and row["offline_seconds"] == 0.0
    assert row["offline_bytes_sent_per_party"] == [0, 0, 0]
    assert row["rounds"] == 2 and row["bytes_sent_per_party"] == [16 * n, 32 * n, 16 * n], row
    assert row["max_error"] < 1e-2 and row["cpu_model"] and row["ring_gemm"] in ("int64", "limbs")
