"""docker-compose.yml without docker: every service's own command in its own network namespace.

Each compose service (certs, dealer, party0, party1) becomes a host on a private LAN
(netns.Network: own namespace, own IP, names resolved by a per-namespace hosts file) and runs
the command and environment written in docker-compose.yml, in dependency order. Each named
volume and tmpfs of the compose file is a temporary folder, substituted for its mount point
in that service's command and environment. The certs service runs first (its script, as
root); each service's volume must then hold exactly the CA certificate and that service's
certificate and key; then the dealer, whose compose health check must pass, then the
parties, which run the
compose command (the private inference example) over mutual TLS between namespaces. Both
parties must succeed and print the same prediction (a checkout without the compose party
script runs tests/integration/scripts/arith.py instead). `crypten-lite health --target
IP:PORT` is also run inside the namespaces, against the dealer and a party.

Needs root and iproute2 (netns.available()); skipped with the reason otherwise.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import time
from typing import Any

import pytest

import compose_env
import netns

pytestmark = [
    pytest.mark.netns,
    pytest.mark.timeout(1800),  # deadlines below; party 0 trains a model first
    pytest.mark.skipif(not netns.available()[0], reason=netns.available()[1]),
]

REPO = pathlib.Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
PARTY_TIMEOUT = 900  # seconds for the example (it trains party 0's model first); the
# compose parties' own CRYPTEN_LITE_TIMEOUT (600 s) reports a stuck peer before this
# Stands in for the compose party script in a checkout that does not have it.
FALLBACK_SCRIPT = REPO / "tests" / "integration" / "scripts" / "arith.py"


def _replace_mounts(value: str, mounts: dict[str, pathlib.Path]) -> str:
    """`value` with each mount point (`/certs`, `/tls/party0` ...) replaced by its folder."""
    if not mounts:
        return value
    targets = "|".join(re.escape(t) for t in sorted(mounts, key=len, reverse=True))
    return re.sub(rf"(?<![\w/])({targets})(?![\w])", lambda m: str(mounts[m.group(1)]), value)


def _folders(root: pathlib.Path) -> dict[str, dict[str, pathlib.Path]]:
    """``{service: {mount point: folder}}``: one folder per named volume (shared by the
    services that mount it) and one per tmpfs."""
    result = {}
    for name, mounts in compose_env.mounts(COMPOSE_FILE).items():
        result[name] = {}
        for m in mounts:
            folder = root / (m.source or f"tmpfs-{name}-{m.target.strip('/').replace('/', '-')}")
            folder.mkdir(exist_ok=True)
            result[name][m.target] = folder
    return result


def _base_env() -> dict[str, str]:
    """Our environment without CRYPTEN_LITE_* (a service sets its own), plus the repo path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRYPTEN_LITE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _service_argv_env(service: compose_env.Service, mounts: dict[str, pathlib.Path],
                      net: netns.Network) -> tuple[list[str], dict[str, str]]:
    argv = [_replace_mounts(a, mounts) for a in service.argv]
    if "party" in argv and argv.index("party") + 1 < len(argv):
        script = argv.index("party") + 1
        if not (REPO / argv[script]).exists():
            argv[script] = str(FALLBACK_SCRIPT)
    env = {k: _replace_mounts(v, mounts) for k, v in service.environment.items()}
    return argv, {**_base_env(), **net.substitute(env)}


def _finish(proc: subprocess.Popen[Any], timeout: float) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        return -9, f"(timed out after {timeout} s)\n{out}"
    return proc.returncode, out


def _healthy(net: netns.Network, host: str, argv: list[str], env: dict[str, str],
             timeout: float) -> tuple[bool, str]:
    deadline = time.monotonic() + timeout
    out = ""
    while time.monotonic() < deadline:
        proc = net.run(host, argv, env=env, cwd=REPO, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
        code, out = _finish(proc, 30)
        if code == 0:
            return True, out
        time.sleep(1)
    return False, out


def test_compose_services_in_network_namespaces(tmp_path):
    services = compose_env.services(COMPOSE_FILE)
    checks = compose_env.healthchecks(COMPOSE_FILE)
    order = compose_env.start_order(COMPOSE_FILE)
    parties = sorted((name for name in services if re.fullmatch(r"party\d+", name)),
                     key=lambda n: int(n[5:]))
    assert order[0] == "certs" and "dealer" in order and len(parties) >= 2, order
    folders = _folders(tmp_path)
    with netns.Network(order) as net:
        # 1. certs: a one-shot job that must succeed before anything else starts. Afterwards
        #    each service's volume holds the CA certificate and its own certificate and key
        #    only (the CA key stays in the certs job's tmpfs).
        argv, env = _service_argv_env(services["certs"], folders["certs"], net)
        code, out = _finish(net.run("certs", argv, env=env, cwd=REPO, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True), 120)
        assert code == 0, out
        for name in ["dealer", *parties]:
            (folder,) = folders[name].values()
            assert sorted(f.name for f in folder.iterdir()) == sorted(
                ["ca.pem", f"{name}.pem", f"{name}.key"]), (name, sorted(folder.iterdir()))
            assert (folder / f"{name}.key").stat().st_mode & 0o777 == 0o600

        # 2. the dealer, healthy by its own compose health check (names resolve in the LAN).
        argv, dealer_env = _service_argv_env(services["dealer"], folders["dealer"], net)
        dealer = net.run("dealer", argv, env=dealer_env, cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
        ok, out = _healthy(net, "dealer", checks["dealer"], dealer_env, timeout=120)
        assert ok, f"dealer health check failed: {out}"

        # 3. the parties, each with its own command and environment.
        procs = {}
        party_envs = {}
        for name in parties:
            argv, party_envs[name] = _service_argv_env(services[name], folders[name], net)
            procs[name] = net.run(name, argv, env=party_envs[name], cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

        # 4. health by IP inside the namespaces, while the parties run (each container checks
        #    itself, as compose does: the TLS identity it expects is its own).
        dealer_port = dealer_env["CRYPTEN_LITE_DEALER"].rpartition(":")[2]
        ok, out = _healthy(net, "dealer", ["crypten-lite", "health", "--target",
                                           f"{net.ip('dealer')}:{dealer_port}"], dealer_env, 60)
        assert ok and "SERVING" in out, out
        party0 = parties[0]
        party0_port = party_envs[party0]["CRYPTEN_LITE_PARTIES"].split(",")[0].rpartition(":")[2]
        ok, out = _healthy(net, party0, ["crypten-lite", "health", "--target",
                                         f"{net.ip(party0)}:{party0_port}"],
                           party_envs[party0], 120)
        assert ok and "SERVING" in out, out
        # The compose health check of each party (by name), too.
        for name in parties:
            ok, out = _healthy(net, name, checks[name], party_envs[name], 60)
            assert ok, f"{name}: {out}"

        finished = {name: _finish(proc, PARTY_TIMEOUT) for name, proc in procs.items()}
        for name, (code, out) in finished.items():
            assert code == 0, f"{name} failed:\n" + "\n".join(
                f"--- {n} (exit {c})\n{o}" for n, (c, o) in finished.items())
        results = {name: out for name, (_, out) in finished.items()}
        assert dealer.poll() is None, "the dealer must keep serving"

    predictions = {name: re.findall(r"^(?:private prediction|result):? (.*)$", out, re.M)
                   for name, out in results.items()}
    assert all(predictions.values()), results
    assert len({tuple(p) for p in predictions.values()}) == 1, predictions
    # Mutual TLS between namespaces: no plaintext warning anywhere.
    assert not any("TLS is off" in out for out in results.values())
    for name, out in results.items():
        print(f"--- {name}\n{out.strip()}", flush=True)
