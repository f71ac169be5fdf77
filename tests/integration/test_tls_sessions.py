"""Mutual TLS between real party processes: wrong identities and CAs are refused on both sides."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from crypten_lite import certs
from crypten_lite.mpc.launcher import local_env

SCRIPTS = pathlib.Path(__file__).parent / "scripts"


def _run_pair(env0: dict, env1: dict, timeout: float = 60) -> list[tuple[int, str]]:
    import os
    base = {k: v for k, v in os.environ.items() if not k.startswith("CRYPTEN_LITE_")}
    procs = [subprocess.Popen([sys.executable, str(SCRIPTS / "arith.py")], env={**base, **e},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for e in (env0, env1)]
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        outs.append((p.returncode, out))
    return outs


@pytest.fixture(scope="module")
def cert_dirs(tmp_path_factory):
    good = tmp_path_factory.mktemp("good")
    certs.generate(good, parties=2)
    other_ca = tmp_path_factory.mktemp("otherca")
    certs.generate(other_ca, parties=2)
    # party1 presenting party0's certificate
    impostor = tmp_path_factory.mktemp("impostor")
    for f in good.iterdir():
        shutil.copy(f, impostor / f.name)
    shutil.copy(good / "party0.pem", impostor / "party1.pem")
    shutil.copy(good / "party0.key", impostor / "party1.key")
    return {"good": good, "other_ca": other_ca, "impostor": impostor}


def _envs(tls0: str, tls1: str, log: str = "WARNING"):
    envs, _ = local_env(2, "tfp", timeout=4)
    envs[0].update(CRYPTEN_LITE_TLS_DIR=tls0, CRYPTEN_LITE_LOG=log)
    envs[1].update(CRYPTEN_LITE_TLS_DIR=tls1, CRYPTEN_LITE_LOG=log)
    return envs


def test_tls_session_works(cert_dirs):
    outs = _run_pair(*_envs(str(cert_dirs["good"]), str(cert_dirs["good"])))
    for code, out in outs:
        assert code == 0 and "result [4.5, -10.0, 0.0]" in out, out


@pytest.mark.parametrize("case", ["impostor", "other_ca", "plaintext"])
def test_bad_peer_is_refused_on_both_sides(cert_dirs, case):
    bad = "" if case == "plaintext" else str(cert_dirs[case])
    outs = _run_pair(*_envs(str(cert_dirs["good"]), bad))
    for code, out in outs:
        assert code != 0, out
        assert "result [" not in out
        assert re.search(r"refused|TLS|certificate|closed the connection|unreachable", out), out


def test_no_secret_in_debug_logs(cert_dirs):
    outs = _run_pair(*_envs(str(cert_dirs["good"]), str(cert_dirs["good"]), log="DEBUG"))
    text = "\n".join(out for _, out in outs)
    assert "result [4.5" in text
    key_material = [(cert_dirs["good"] / f"party{r}.key").read_text() for r in range(2)]
    for key in key_material:
        body = "".join(key.splitlines()[1:-1])
        assert body[:40] not in text
    # No long hex strings (seeds, keys) and no encoded input values in any log line.
    assert not re.search(r"[0-9a-f]{48,}", text)
    for secret in ("98304", "-131072", "196608"):  # 1.5, -2.0, 3.0 at 16 fractional bits
        assert secret not in text
