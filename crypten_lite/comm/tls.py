"""Mutual TLS for the gRPC transport and the dealer: loading certificates, credentials, identity.

Identities. Every certificate made by ``crypten-lite certs`` names exactly one principal in its
Subject common name (CN): ``party0``, ``party1``, ... for the computing parties and ``dealer``
for the dealer. The same names are DNS entries of the certificate's SubjectAltName.

A TLS folder (``CRYPTEN_LITE_TLS_DIR``) holds::

    ca.pem                  the CA certificate every party trusts (the only root)
    ca.key                  the CA key (only needed to issue certificates; keep it offline)
    party{r}.pem / .key     certificate and key of party r
    dealer.pem / .key       certificate and key of the dealer

How a connection is authenticated, both ways:

1. The server requires a client certificate signed by the CA (:func:`server_credentials`).
2. The client trusts only the CA and checks that the server's certificate is issued *for the
   identity it means to reach*, not for the address it dials (:func:`channel_options` sets
   ``grpc.ssl_target_name_override``), so ``10.0.0.7:50051`` must present ``party1``.
3. The TLS stack matches the dialed identity against the certificate's SubjectAltName the
   way DNS names compare (case and a trailing dot ignored), so a SAN mistake (``dealer.`` in
   party0's certificate) would let one role pass for another. The client therefore also
   checks the role itself, end to end: the server answers the handshake with its own
   certificate and an ECDSA signature, under that certificate's key, of the handshake
   transcript (both Hellos, the client's fresh X25519 key included: :func:`transcript`,
   :func:`sign_reply`); the client accepts only a CA-issued certificate whose one Subject CN
   is exactly the role it dialed, and a valid signature (:func:`verify_reply`). Whatever the
   SANs say, a key that is not the dialed role's cannot answer, and the pairwise seed is agreed
   with the holder of the role's key only.
4. The CA only proves that the peer is *some* member; the servicer then checks *which*:
   a peer that claims rank r in its messages must present ``party{r}``
   (:func:`peer_identity`, :func:`check_peer`). A certificate whose subject has no CN,
   several CNs, or a CN that is not ``party{r}`` / ``dealer`` is refused (PERMISSION_DENIED)
   before any check of what it claims.

Without TLS (no ``CRYPTEN_LITE_TLS_DIR``), :func:`peer_identity` returns ``None``; with TLS it
never does, so ``identity is not None and ...`` checks are skipped only without TLS.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import logging
import pathlib
import re

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ..errors import CommunicationError, ConfigError

DEALER_IDENTITY = "dealer"
CA_CERT = "ca.pem"
CA_KEY = "ca.key"
log = logging.getLogger("crypten_lite.comm")
# The only identities a certificate may name (its one Subject CN): party0, party1, ... or dealer.
_IDENTITY = re.compile(rf"party(0|[1-9][0-9]{{0,5}})|{DEALER_IDENTITY}")
CERTS_HINT = "run `crypten-lite certs --parties N --out DIR` and point CRYPTEN_LITE_TLS_DIR at DIR"

# Substrings of gRPC's error details that mean the TLS handshake, not the network, failed.
_HANDSHAKE_MARKERS = ("ssl", "tls", "handshake", "certificate", "verification", "tsi_")


def party_identity(rank: int) -> str:
    """The certificate identity (Subject CN) of party `rank`: ``party{rank}``."""
    if rank < 0:
        raise ConfigError(f"a party rank is >= 0, got {rank}")
    return f"party{rank}"


def cert_file(tls_dir: str | pathlib.Path, identity: str) -> pathlib.Path:
    """Path of the certificate of `identity` (``party0``, ``dealer``...) in `tls_dir`."""
    return pathlib.Path(tls_dir) / f"{identity}.pem"


def key_file(tls_dir: str | pathlib.Path, identity: str) -> pathlib.Path:
    """Path of the private key of `identity` in `tls_dir`."""
    return pathlib.Path(tls_dir) / f"{identity}.key"


@dataclasses.dataclass(frozen=True)
class TlsMaterial:
    """PEM bytes one principal needs for mutual TLS: the CA, its own certificate and key."""

    identity: str
    ca: bytes
    cert: bytes
    key: bytes = dataclasses.field(repr=False)  # never print a private key


def load(tls_dir: str | pathlib.Path, identity: str) -> TlsMaterial:
    """Read ``ca.pem``, ``{identity}.pem`` and ``{identity}.key`` from `tls_dir`.

    Raises :class:`ConfigError` naming the first missing or unreadable file.
    """
    paths = {
        "ca": pathlib.Path(tls_dir) / CA_CERT,
        "cert": cert_file(tls_dir, identity),
        "key": key_file(tls_dir, identity),
    }
    contents: dict[str, bytes] = {}
    for part, path in paths.items():
        try:
            contents[part] = path.read_bytes()
        except FileNotFoundError as e:
            raise ConfigError(
                f"TLS file {str(path)!r} for {identity} is missing; {CERTS_HINT}") from e
        except OSError as e:
            raise ConfigError(f"cannot read TLS file {str(path)!r} for {identity}: {e}") from e
        if b"-----BEGIN " not in contents[part]:
            raise ConfigError(
                f"TLS file {str(path)!r} for {identity} is not PEM; {CERTS_HINT}")
    return TlsMaterial(identity=identity, **contents)


def server_credentials(material: TlsMaterial) -> grpc.ServerCredentials:
    """Server side: present `material`'s certificate; accept only clients certified by the CA."""
    return grpc.ssl_server_credentials(
        [(material.key, material.cert)],
        root_certificates=material.ca,
        require_client_auth=True,
    )


def channel_credentials(material: TlsMaterial) -> grpc.ChannelCredentials:
    """Client side: trust only the CA; present `material`'s certificate to the server."""
    return grpc.ssl_channel_credentials(
        root_certificates=material.ca,
        private_key=material.key,
        certificate_chain=material.cert,
    )


def channel_options(target_identity: str) -> list[tuple[str, str]]:
    """gRPC channel options that make the client verify the server as `target_identity`.

    The server's certificate must then name `target_identity` (``party1``, ``dealer``)
    whatever address is dialed, so IPs, NAT and DNS aliases cannot redirect a party.
    Pass them with :func:`channel_credentials` to ``grpc.secure_channel``.
    """
    return [("grpc.ssl_target_name_override", target_identity)]


def peer_identity(context: grpc.ServicerContext) -> str | None:
    """The identity of the peer's verified client certificate, or ``None`` without mutual TLS.

    The identity is the certificate's Subject common name, which must be exactly one CN of the
    form ``party{r}`` or ``dealer``. A certificate with no CN, several CNs (gRPC itself would
    report only one of them) or another name aborts the RPC with PERMISSION_DENIED
    (``context.abort`` raises), so a caller never holds an identity it cannot check: under TLS
    the result is never ``None``.
    """
    auth = context.auth_context()
    pems = auth.get("x509_pem_cert") or []
    if not pems:
        if auth.get("x509_subject") or auth.get("x509_common_name"):
            _refuse(context, "its certificate could not be read")
        return None
    identity, error = certificate_identity(bytes(pems[0]))
    if error:
        _refuse(context, error)
    return identity


def certificate_identity(cert_pem: bytes) -> tuple[str, str]:
    """``(identity, "")`` for a certificate naming exactly one valid identity, else
    ``("", why not)``."""
    return _certificate_identity(bytes(cert_pem))


@functools.lru_cache(maxsize=64)
def _certificate_identity(cert_pem: bytes) -> tuple[str, str]:
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return "", "is not a readable X.509 certificate"
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(names) != 1:
        return "", (f"has {len(names)} common names (subject {cert.subject.rfc4514_string()!r}); "
                    "exactly one is required")
    value = names[0].value
    name = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    if not _IDENTITY.fullmatch(name):
        return "", f"names {name[:64]!r}, which is neither party{{rank}} nor {DEALER_IDENTITY!r}"
    return name, ""


def _refuse(context: grpc.ServicerContext, why: str) -> None:
    log.warning("refusing a connection from %s: its TLS certificate %s", context.peer(), why)
    context.abort(
        grpc.StatusCode.PERMISSION_DENIED,
        f"refusing the connection: the peer's TLS certificate {why}; every principal needs a "
        f"certificate whose subject has exactly one common name, party{{rank}} or "
        f"{DEALER_IDENTITY!r} ({CERTS_HINT})")


def transcript(client_hello, server_hello) -> bytes:
    """The bytes a server signs in its handshake reply: both Hellos (pb.Hello), every field,
    the client's fresh X25519 key included (so a reply cannot be replayed to another client
    or handshake)."""
    # Length-prefixed fields (unambiguous); no import of crypten_lite.random, which loads
    # torch: `crypten-lite health` imports this module and must stay light.
    out = bytearray()
    for value in ("crypten-lite/hello-reply/v1",
                  *(field for h in (client_hello, server_hello) for field in (
                      str(int(h.protocol_version)), str(h.session), str(int(h.world_size)),
                      str(int(h.rank)), str(h.config_digest), bytes(h.public_key).hex()))):
        data = value.encode()
        out += len(data).to_bytes(4, "little") + data
    return bytes(out)


@functools.lru_cache(maxsize=8)
def _private_key(pem: bytes) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ConfigError(f"the TLS key is not an EC key; {CERTS_HINT}")
    return key


def sign_reply(material: TlsMaterial, client_hello, server_hello) -> bytes:
    """ECDSA-SHA256 signature of :func:`transcript` under this endpoint's certificate key."""
    return _private_key(material.key).sign(transcript(client_hello, server_hello),
                                           ec.ECDSA(hashes.SHA256()))


@functools.lru_cache(maxsize=8)
def _ca_certificate(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def verify_reply(material: TlsMaterial, expected: str, client_hello, reply) -> None:
    """Refuse (CommunicationError) a handshake reply not made by the holder of `expected`'s key.

    `reply` (pb.HelloReply) must carry a certificate issued by this endpoint's CA, valid now,
    whose one Subject CN is exactly `expected` (``party1``, ``dealer``: compared as the
    identity, never through the SubjectAltName), and a valid signature under that
    certificate's key of :func:`transcript` (`client_hello`, ``reply.hello``). Called by every
    client after its TLS handshake, so a certificate that the TLS stack accepted for the
    dialed name through a SAN mistake still cannot pass for another role.
    """
    def refuse(why: str) -> CommunicationError:
        return CommunicationError(
            f"the server dialed as {expected!r} {why}; refusing it (it is not {expected!r}, or "
            f"runs an older crypten_lite; {CERTS_HINT})", peer=expected)

    pem = bytes(reply.certificate)
    if not pem:
        raise refuse("sent no certificate with its handshake reply")
    if len(pem) > 16384:
        raise refuse(f"sent a certificate of {len(pem)} bytes")
    identity, error = _certificate_identity(pem)
    if error:
        raise refuse(f"presented a certificate that {error}")
    if identity != expected:
        raise refuse(f"presented a certificate for {identity!r}")
    cert = x509.load_pem_x509_certificate(pem)
    try:
        cert.verify_directly_issued_by(_ca_certificate(material.ca))
    except (ValueError, TypeError, InvalidSignature):
        raise refuse("presented a certificate not issued by this CA") from None
    now = datetime.datetime.now(datetime.timezone.utc)
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise refuse("presented a certificate that is not valid now")
    public = cert.public_key()
    if not isinstance(public, ec.EllipticCurvePublicKey):
        raise refuse("presented a certificate without an EC key")
    try:
        public.verify(bytes(reply.signature), transcript(client_hello, reply.hello),
                      ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise refuse("did not sign this handshake with its certificate's key") from None


def check_peer(context: grpc.ServicerContext, expected: str) -> None:
    """Abort the RPC with PERMISSION_DENIED unless the peer's certificate names `expected`.

    Call it in a servicer when TLS is on, e.g. ``check_peer(context, party_identity(src))``
    for a peer that claims rank ``src``. ``context.abort`` raises, so nothing after it runs.
    """
    actual = peer_identity(context)
    if actual != expected:
        presented = "no client certificate" if actual is None else f"a certificate for {actual!r}"
        context.abort(
            grpc.StatusCode.PERMISSION_DENIED,
            f"peer claims to be {expected!r} but presented {presented}; "
            "refusing the connection (each party must use its own party{rank} certificate)")


def is_handshake_failure(error: grpc.RpcError) -> bool:
    """Whether a call failed because this client refused the server in the TLS handshake
    (unknown CA, wrong identity, plaintext server)."""
    return _classify(error) == "handshake"


def explain(error: grpc.RpcError, peer: str, address: str) -> CommunicationError:
    """A :class:`CommunicationError` that says what to do about a failed call to `peer`.

    gRPC reports most TLS problems as ``failed to connect to all addresses``; this names the
    likely cause. Raise the result ``from error``.
    """
    details = _details(error)
    kind = _classify(error)
    if kind == "handshake":
        message = (
            f"TLS handshake with {peer} at {address} failed: {details}. Both sides must use "
            f"certificates from the same CA, and the server at {address} must present the "
            f"{peer!r} certificate; {CERTS_HINT} (once, then copy the folder to every host)")
    elif kind == "closed":
        # With TLS 1.3 the client finishes its side of the handshake before the server checks
        # the client certificate, so a refusal by the server arrives as a closed socket.
        message = (
            f"{peer} at {address} closed the connection: {details}. It probably refused "
            "this party's certificate (certificates from another CA?) or this party spoke "
            "plaintext to a TLS server; set CRYPTEN_LITE_TLS_DIR to the same certificate "
            f"folder on every host ({CERTS_HINT})")
    else:
        code = error.code() if isinstance(error, grpc.Call) else None
        name = code.name if code is not None else "error"
        message = f"call to {peer} at {address} failed ({name}): {details}"
    return CommunicationError(message, peer=peer)


def _details(error: grpc.RpcError) -> str:
    return (error.details() if isinstance(error, grpc.Call) else None) or str(error)


def _classify(error: grpc.RpcError) -> str:
    if not isinstance(error, grpc.Call) or error.code() != grpc.StatusCode.UNAVAILABLE:
        return "other"
    details = _details(error).lower()
    if any(marker in details for marker in _HANDSHAKE_MARKERS):
        return "handshake"
    if "socket closed" in details or "connection reset" in details:
        return "closed"
    return "other"
