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


def _run_pair(env0: dict, env1: dict, timeout: float = 250) -> list[tuple[int, str]]:
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


def _envs(tls0: str, tls1: str, log: str = "WARNING", timeout: float = 4):
    # A refused peer is reported when the handshake's retries end (`timeout`): short where
    # a refusal is expected; sessions that must connect get a long one (a loaded machine
    # may start one party many seconds after the other).
    envs, _ = local_env(2, "tfp", timeout=timeout)
    envs[0].update(CRYPTEN_LITE_TLS_DIR=tls0, CRYPTEN_LITE_LOG=log)
    envs[1].update(CRYPTEN_LITE_TLS_DIR=tls1, CRYPTEN_LITE_LOG=log)
    return envs


def test_tls_session_works(cert_dirs):
    outs = _run_pair(*_envs(str(cert_dirs["good"]), str(cert_dirs["good"]), timeout=120))
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
    outs = _run_pair(*_envs(str(cert_dirs["good"]), str(cert_dirs["good"]), log="DEBUG",
                            timeout=120))
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


# --- identities: exactly one CN, party{r} or dealer (issue 11, finding 6) --------------------

def _issue_party1(good: pathlib.Path, out: pathlib.Path, common_names: list[str]) -> None:
    """`out`: the good folder, but party1's certificate replaced by one signed by the real CA
    with the given Subject common names, valid for the name party1 (so that party 0's check
    of the server it dials passes, and only the identity rule can refuse it)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    for f in good.iterdir():
        shutil.copy(f, out / f.name)
    ca_key = serialization.load_pem_private_key((good / "ca.key").read_bytes(), None)
    ca = x509.load_pem_x509_certificate((good / "ca.pem").read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    subject = [x509.NameAttribute(NameOID.COMMON_NAME, cn) for cn in common_names]
    subject = subject or [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "crypten-lite test")]
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(x509.Name(subject)).issuer_name(ca.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                              ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("party1"), x509.DNSName("localhost"),
             x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(ca_key, hashes.SHA256()))
    (out / "party1.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (out / "party1.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))


@pytest.mark.parametrize("case, common_names, why", [
    ("no_cn", [], "has 0 common names"),
    ("two_cns", ["party1", "party0"], "has 2 common names"),
    # party 0 refuses party7 as a server (party 1's hello) or as a client (party 1's signed
    # reply names another role than the one dialed), whichever handshake comes first
    ("party7", ["party7"], ("certificate identity 'party7' does not match claimed rank 1",
                            "presented a certificate for 'party7'")),
])
def test_certificate_identity_must_be_one_party_of_the_session(
        cert_dirs, tmp_path, case, common_names, why):
    """party 1 holds a certificate of the real CA naming no CN, two CNs, or party7 in a
    2-party session: party 0 refuses its handshake, and both parties fail without a result."""
    bad = tmp_path / case
    bad.mkdir()
    _issue_party1(cert_dirs["good"], bad, common_names)
    outs = _run_pair(*_envs(str(cert_dirs["good"]), str(bad)))
    for code, out in outs:
        assert code != 0, out
        assert "result [" not in out
    party0, party1 = outs[0][1], outs[1][1]
    # party 0 logs why it refused (the server's or the client's check: the same reason either
    # way); party 1 is told by party 0 (PERMISSION_DENIED or the reason), or finds party 0 gone
    # when party 0's own dial refused first
    whys = (why,) if isinstance(why, str) else why
    assert any(w in party0 for w in whys), party0
    assert "refused" in party1 or "party 0" in party1, party1
