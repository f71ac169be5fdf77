"""Certificates (crypten_lite.certs) and mutual TLS helpers (crypten_lite.comm.tls).

A tiny echo server (generic handler, bytes in and out, no protobuf) runs on 127.0.0.1 with
party1's certificate; clients connect with various credentials.
"""

from __future__ import annotations

import ipaddress
import pathlib
import stat
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import grpc
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from crypten_lite import certs
from crypten_lite.comm import tls
from crypten_lite.errors import CommunicationError, ConfigError

METHOD = "/crypten_lite.test.Echo/Echo"
TIMEOUT = 60  # a deadline for calls that succeed or fail at once; long, so load cannot reach it


@pytest.fixture(scope="module")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("certs")
    certs.generate(out, parties=2, hosts=["10.1.2.3", "mpc.example.org"])
    return out


@pytest.fixture(scope="module")
def rogue_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Same identities, but issued by another CA."""
    out = tmp_path_factory.mktemp("rogue")
    certs.generate(out, parties=2)
    return out


def _echo(request: bytes, context: grpc.ServicerContext) -> bytes:
    identity = tls.peer_identity(context)
    return request + b"|" + (identity or "<none>").encode()


def _checked_echo(request: bytes, context: grpc.ServicerContext) -> bytes:
    # A servicer that expects party1 (as if the message said src=1).
    tls.check_peer(context, tls.party_identity(1))
    return request


@pytest.fixture
def server(tls_dir: pathlib.Path) -> Iterator[str]:
    """A mutual-TLS echo server presenting party1; yields its address."""
    handler = grpc.method_handlers_generic_handler("crypten_lite.test.Echo", {
        "Echo": grpc.unary_unary_rpc_method_handler(_echo),
        "Checked": grpc.unary_unary_rpc_method_handler(_checked_echo),
    })
    srv = grpc.server(_thread_pool())
    srv.add_generic_rpc_handlers((handler,))
    port = srv.add_secure_port("127.0.0.1:0", tls.server_credentials(tls.load(tls_dir, "party1")))
    srv.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        srv.stop(grace=None)


def _thread_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=2)


def _call(address: str, material: tls.TlsMaterial, target: str = "party1",
          method: str = METHOD) -> bytes:
    with grpc.secure_channel(address, tls.channel_credentials(material),
                             options=tls.channel_options(target)) as channel:
        return channel.unary_unary(method)(b"hi", timeout=TIMEOUT)


# --- certificates ---------------------------------------------------------------------------

def test_generate_writes_every_file_with_safe_modes(tls_dir: pathlib.Path) -> None:
    names = {p.name for p in tls_dir.iterdir()}
    assert names == {"ca.pem", "ca.key", "party0.pem", "party0.key", "party1.pem",
                     "party1.key", "dealer.pem", "dealer.key"}
    for key in tls_dir.glob("*.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key


def test_certificate_identity_names_and_usages(tls_dir: pathlib.Path) -> None:
    for identity in ("party0", "party1", "dealer"):
        pem = (tls_dir / f"{identity}.pem").read_bytes()
        assert certs.identity_of(pem) == identity
        cert = x509.load_pem_x509_certificate(pem)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert set(san.get_values_for_type(x509.DNSName)) == {
            identity, "localhost", "mpc.example.org"}
        assert set(san.get_values_for_type(x509.IPAddress)) == {
            ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("10.1.2.3")}
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert certs.identity_of((tls_dir / "ca.pem").read_bytes()) == certs.CA_COMMON_NAME


def test_identity_names_are_refused_as_extra_hosts(tmp_path: pathlib.Path) -> None:
    # Otherwise party1's certificate would also be valid for the name party0.
    with pytest.raises(ConfigError, match="identity name"):
        certs.generate(tmp_path, parties=2, hosts=["party0"])


def test_cli(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert certs.main(["--parties", "3", "--out", str(tmp_path), "--hosts", "a.b,10.0.0.1",
                       "--days", "2"]) == 0
    assert (tmp_path / "party2.key").exists()
    assert certs.main(["--parties", "0", "--out", str(tmp_path)]) == 2
    assert "--parties must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        certs.main(["--help"])
    assert exit_info.value.code == 0
    assert "--parties N" in capsys.readouterr().out


def test_load_names_the_missing_file(tmp_path: pathlib.Path, tls_dir: pathlib.Path) -> None:
    with pytest.raises(ConfigError, match=r"ca\.pem.*crypten-lite certs --parties N --out DIR"):
        tls.load(tmp_path, "party0")
    with pytest.raises(ConfigError, match=r"party7\.pem.*missing"):
        tls.load(tls_dir, "party7")
    assert "PRIVATE KEY" not in repr(tls.load(tls_dir, "party0"))  # the key is never printed


# --- mutual TLS -----------------------------------------------------------------------------

def test_correct_client_certificate_is_accepted(server: str, tls_dir: pathlib.Path) -> None:
    assert _call(server, tls.load(tls_dir, "party0")) == b"hi|party0"
    assert _call(server, tls.load(tls_dir, "dealer")) == b"hi|dealer"


def test_client_certificate_from_unknown_ca_is_refused(
        server: str, tls_dir: pathlib.Path, rogue_dir: pathlib.Path) -> None:
    rogue = tls.load(rogue_dir, "party0")
    # Trusts the right CA, so only the server's check of the client certificate can fail.
    impostor = tls.TlsMaterial("party0", ca=tls.load(tls_dir, "party0").ca,
                               cert=rogue.cert, key=rogue.key)
    with pytest.raises(grpc.RpcError) as error:
        _call(server, impostor)
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    clear = tls.explain(error.value, "party1", server)
    assert isinstance(clear, CommunicationError) and clear.peer == "party1"
    assert "refused this party's certificate" in str(clear)


def test_server_from_unknown_ca_is_refused(server: str, rogue_dir: pathlib.Path) -> None:
    with pytest.raises(grpc.RpcError) as error:
        _call(server, tls.load(rogue_dir, "party0"))
    assert tls.is_handshake_failure(error.value)
    message = str(tls.explain(error.value, "party1", server))
    assert "TLS handshake with party1" in message and "same CA" in message


def test_server_must_present_the_dialed_identity(server: str, tls_dir: pathlib.Path) -> None:
    # The server at this address presents party1; a client that means to reach party0 (or
    # the dealer) refuses it, whatever the address.
    for target in ("party0", "dealer"):
        with pytest.raises(grpc.RpcError) as error:
            _call(server, tls.load(tls_dir, "party1"), target=target)
        assert tls.is_handshake_failure(error.value)


def test_plaintext_client_is_refused(server: str) -> None:
    with grpc.insecure_channel(server) as channel:
        with pytest.raises(grpc.RpcError) as error:
            channel.unary_unary(METHOD)(b"hi", timeout=TIMEOUT)
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "plaintext to a TLS server" in str(tls.explain(error.value, "party1", server))


def test_tls_client_to_plaintext_server_fails_clearly(tls_dir: pathlib.Path) -> None:
    srv = grpc.server(_thread_pool())
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    try:
        with pytest.raises(grpc.RpcError) as error:
            _call(f"127.0.0.1:{port}", tls.load(tls_dir, "party0"))
    finally:
        srv.stop(grace=None)
    assert tls.is_handshake_failure(error.value)


def test_unreachable_peer_is_not_called_a_tls_problem() -> None:
    error = _FakeError(grpc.StatusCode.UNAVAILABLE, "Failed to connect: Connection refused")
    assert not tls.is_handshake_failure(error)
    assert str(tls.explain(error, "dealer", "dealer:50050")).startswith(
        "call to dealer at dealer:50050 failed (UNAVAILABLE)")


def test_wrong_party_is_detected_by_peer_identity(server: str, tls_dir: pathlib.Path) -> None:
    checked = "/crypten_lite.test.Echo/Checked"
    assert _call(server, tls.load(tls_dir, "party1"), method=checked) == b"hi"
    with pytest.raises(grpc.RpcError) as error:
        _call(server, tls.load(tls_dir, "party0"), method=checked)
    assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "claims to be 'party1'" in error.value.details()
    assert "'party0'" in error.value.details()


class _FakeError(grpc.RpcError, grpc.Call):  # type: ignore[misc]
    """A failed call as gRPC reports it, without a network."""

    def __init__(self, code: grpc.StatusCode, details: str):
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    # The rest of grpc.Call is abstract but never used here.
    initial_metadata = trailing_metadata = time_remaining = lambda self: None
    is_active = cancel = lambda self: False
    add_callback = lambda self, callback: False  # noqa: E731


# --- identities: exactly one CN, party{r} or dealer (issue 11, finding 6) --------------------

def issue_leaf(ca_dir: pathlib.Path, common_names: list[str], dns_names: list[str]) -> tls.TlsMaterial:
    """A client/server certificate signed by the real CA of `ca_dir`, with the given Subject
    common names (none, one or several) and SubjectAltName DNS names."""
    import datetime

    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    ca_key = serialization.load_pem_private_key((ca_dir / "ca.key").read_bytes(), None)
    ca_pem = (ca_dir / "ca.pem").read_bytes()
    ca = x509.load_pem_x509_certificate(ca_pem)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = [x509.NameAttribute(NameOID.COMMON_NAME, cn) for cn in common_names]
    subject = subject or [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "crypten-lite test")]
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(subject))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                              ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(
            [x509.DNSName(n) for n in dns_names]
            + [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return tls.TlsMaterial(
        common_names[0] if common_names else "none", ca=ca_pem,
        cert=cert.public_bytes(serialization.Encoding.PEM),
        key=key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


@pytest.mark.parametrize("common_names, why", [
    ([], "has 0 common names"),
    (["party0", "party1"], "has 2 common names"),
    (["party1", "party0"], "has 2 common names"),
    (["party0", "party0"], "has 2 common names"),
    (["Party0"], "neither party{rank} nor 'dealer'"),
    (["party00"], "neither party{rank} nor 'dealer'"),
    (["party0 "], "neither party{rank} nor 'dealer'"),
    (["party-1"], "neither party{rank} nor 'dealer'"),
])
def test_certificate_without_exactly_one_identity_is_refused(
        server: str, tls_dir: pathlib.Path, common_names: list[str], why: str) -> None:
    # Signed by the real CA and valid as a TLS client: only the identity rule can refuse it.
    # (gRPC reports a single x509_common_name even for a subject with two, which is why the
    # identity is read from the certificate itself.)
    material = issue_leaf(tls_dir, common_names, ["party0", "localhost"])
    with pytest.raises(grpc.RpcError) as error:
        _call(server, material)
    assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "refusing the connection" in error.value.details() and why in error.value.details()


def test_certificate_identity_rules() -> None:
    assert tls.certificate_identity(b"not a certificate") == ("", "is not a readable X.509 certificate")


def test_well_formed_identities_pass(server: str, tls_dir: pathlib.Path) -> None:
    # party7 is a well-formed identity: whether it belongs to the session is checked by the
    # servicer against the rank it claims (tests/integration/test_tls_sessions.py).
    for names in (["party7"], ["dealer"], ["party12"]):
        assert _call(server, issue_leaf(tls_dir, names, ["x"])) == f"hi|{names[0]}".encode()
