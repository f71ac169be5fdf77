"""``crypten-lite certs``: a CA and one certificate per party and for the dealer.

What :func:`generate` writes into `out_dir` (file names: :mod:`crypten_lite.comm.tls`)::

    ca.pem, ca.key              self-signed CA (EC P-256, pathlen 0)
    party0.pem, party0.key ...  one per computing party, Subject CN ``party{r}``
    dealer.pem, dealer.key      the dealer, Subject CN ``dealer``

Every leaf certificate is valid as TLS server *and* client (ExtendedKeyUsage serverAuth +
clientAuth), because each party both serves and dials. Its SubjectAltName lists the identity
itself (the docker compose service name), ``localhost``, ``127.0.0.1`` and every extra host
given with ``--hosts``. Clients verify the identity, not the address (see
:func:`crypten_lite.comm.tls.channel_options`), so the extra hosts are only a convenience for
other tools (curl, grpcurl) that check the dialed name.

Keys are unencrypted PKCS#8 PEM written with mode 0600. All keys land in one folder for
local runs and docker compose; on real multi-host deployments give each host only
``ca.pem`` and its own ``.pem``/``.key``, and keep ``ca.key`` offline.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import pathlib
import re
import secrets
import sys
import unicodedata
from typing import NamedTuple, Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .comm.tls import CA_CERT, CA_KEY, DEALER_IDENTITY, cert_file, key_file, party_identity
from .errors import ConfigError

CA_COMMON_NAME = "crypten-lite CA"
# Certificates start a little in the past so that hosts with slightly slow clocks accept them.
_CLOCK_SKEW = datetime.timedelta(minutes=5)
_IDENTITY_NAME = re.compile(rf"party\d+|{DEALER_IDENTITY}")


class Issued(NamedTuple):
    """Paths of one principal's certificate and private key."""

    cert: pathlib.Path
    key: pathlib.Path


def generate(out_dir: str | os.PathLike[str], parties: int, hosts: Sequence[str] | None = None,
             days: int = 365) -> dict[str, Issued]:
    """Create a fresh CA and certificates for ``party0..party{parties-1}`` and ``dealer``.

    Existing files of the same names are replaced (a new CA invalidates the old certificates,
    so every principal must get the new folder). Returns ``{"ca": ..., "party0": ...,
    "dealer": ...}`` mapping each identity to its :class:`Issued` paths.
    """
    if parties < 1:
        raise ConfigError(f"--parties must be >= 1, got {parties}")
    if days < 1:
        raise ConfigError(f"--days must be >= 1, got {days}")
    extra_names = [_general_name(h) for h in (hosts or ())]
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    now = datetime.datetime.now(datetime.timezone.utc)
    validity = (now - _CLOCK_SKEW, now + datetime.timedelta(days=days))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _ca_certificate(ca_key, validity)
    issued = {"ca": Issued(out / CA_CERT, out / CA_KEY)}
    _write_key(issued["ca"].key, ca_key)
    _write_cert(issued["ca"].cert, ca_cert)

    identities = [party_identity(r) for r in range(parties)] + [DEALER_IDENTITY]
    for identity in identities:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _leaf_certificate(identity, key, ca_key, ca_cert, validity, extra_names)
        issued[identity] = Issued(cert_file(out, identity), key_file(out, identity))
        _write_key(issued[identity].key, key)
        _write_cert(issued[identity].cert, cert)
    return issued


def identity_of(cert_pem: bytes) -> str:
    """The identity a certificate names: its Subject common name (``party1``, ``dealer``)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as e:
        raise ConfigError(f"not a PEM certificate: {e}") from e
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(names) != 1:
        raise ConfigError(
            f"certificate subject {cert.subject.rfc4514_string()!r} must have exactly one "
            "common name; make certificates with `crypten-lite certs`")
    value = names[0].value
    return value.decode() if isinstance(value, bytes) else value


def matching_form(host: str) -> str:
    """`host` as TLS name matching compares it: Unicode and punycode (``xn--``) labels
    decoded and folded (NFKC, case), a trailing dot dropped. gRPC, OpenSSL and browsers treat
    names equal in this form as the same name."""
    name = unicodedata.normalize("NFKC", host.strip()).casefold().rstrip(".")
    labels = []
    for label in name.split("."):
        if label.startswith("xn--"):
            try:
                label = label[4:].encode("ascii").decode("punycode")
            except (UnicodeError, ValueError):
                pass  # not valid punycode: compared as written
            label = unicodedata.normalize("NFKC", label).casefold()
        labels.append(label)
    return ".".join(labels)


def names_identity(host: str) -> bool:
    """Whether a SubjectAltName entry `host` would be matched by the TLS stack against an
    identity name (``party{r}``, ``dealer``): in any case, with trailing dots, as Unicode or
    punycode, or through a wildcard (``*``, ``*.``, ``d*``...)."""
    name = matching_form(host)
    if _IDENTITY_NAME.fullmatch(name):
        return True
    # Identity names are one label: a wildcard entry of one label may match them (whatever
    # a given TLS stack's wildcard rules, refuse every pattern that could).
    if "*" in name and "." not in name:
        pattern = re.compile(".*".join(re.escape(part) for part in name.split("*")))
        return any(pattern.fullmatch(n) for n in ("party0", "party1", "party12", DEALER_IDENTITY))
    return False


def _general_name(host: str) -> x509.GeneralName:
    host = host.strip()
    if names_identity(host):
        # party1's certificate must never be valid for the name party0 (nor the dealer's):
        # the TLS stack matches the dialed identity through these names (tls.channel_options),
        # and it ignores case and a trailing dot, decodes punycode and expands wildcards.
        # Clients check the role itself as well (tls.verify_reply).
        raise ConfigError(
            f"--hosts entry {host!r} is an identity name (as TLS compares names: {matching_form(host)!r}); "
            "identities are added to their own certificate automatically, and must not be "
            "added to the others")
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    if not host or not all(c.isascii() and (c.isalnum() or c in "-.*") for c in host):
        raise ConfigError(
            f"--hosts entry {host!r} is neither an IP address nor an ASCII DNS name")
    return x509.DNSName(host)


def _ca_certificate(key: ec.EllipticCurvePrivateKey,
                    validity: tuple[datetime.datetime, datetime.datetime]) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_COMMON_NAME)])
    public = key.public_key()
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(_serial())
        .not_valid_before(validity[0])
        .not_valid_after(validity[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )


def _leaf_certificate(identity: str, key: ec.EllipticCurvePrivateKey,
                      ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate,
                      validity: tuple[datetime.datetime, datetime.datetime],
                      extra_names: list[x509.GeneralName]) -> x509.Certificate:
    names: list[x509.GeneralName] = [
        x509.DNSName(identity),
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    ]
    names += [n for n in extra_names if n not in names]
    public = key.public_key()
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identity)]))
        .issuer_name(ca_cert.subject)
        .public_key(public)
        .serial_number(_serial())
        .not_valid_before(validity[0])
        .not_valid_after(validity[1])
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                   ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def _key_usage(cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=cert_sign,
        crl_sign=cert_sign, encipher_only=False, decipher_only=False)


def _serial() -> int:
    # RFC 5280: positive, at most 20 octets; 159 random bits keep the top bit clear.
    return secrets.randbits(159) | 1


def _write_key(path: pathlib.Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    # Create with 0600 from the start (no window where the key is world-readable), and fix
    # the mode of a file that already existed with looser permissions.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(pem)


def _write_cert(path: pathlib.Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    path.chmod(0o644)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="crypten-lite certs",
        description=(
            "Create a certificate authority and one TLS certificate per party\n"
            "(party0 .. party{N-1}) and for the dealer, for mutual TLS between all of them.\n"
            "Point CRYPTEN_LITE_TLS_DIR at the output folder on every host."),
        epilog=(
            "examples:\n"
            "  crypten-lite certs --parties 2 --out certs\n"
            "  crypten-lite certs --parties 3 --out /certs --hosts 10.0.0.5,mpc.example.org\n\n"
            "A peer is identified by its certificate's common name, not its address, so\n"
            "--hosts is only needed by other tools that check the dialed host name.\n"
            "Rerunning replaces the CA: copy the new folder to every host."),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--parties", "-n", type=int, required=True, metavar="N",
                        help="number of computing parties (certificates party0..party{N-1})")
    parser.add_argument("--out", "-o", required=True, metavar="DIR",
                        help="output folder (created if needed; existing files are replaced)")
    parser.add_argument("--hosts", default="", metavar="H1,H2",
                        help="extra host names or IP addresses for every certificate's "
                             "SubjectAltName, comma-separated")
    parser.add_argument("--days", type=int, default=365, metavar="D",
                        help="validity in days (default: %(default)s)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``crypten-lite certs``; `argv` are the arguments after ``certs``."""
    args = _parser().parse_args(argv)
    hosts = [h.strip() for h in args.hosts.split(",") if h.strip()]
    try:
        issued = generate(args.out, args.parties, hosts=hosts, days=args.days)
    except (ConfigError, OSError) as e:
        print(f"crypten-lite certs: error: {e}", file=sys.stderr)
        return 2
    identities = ", ".join(name for name in issued if name != "ca")
    print(f"wrote a CA and certificates for {identities} to {args.out} "
          f"(valid {args.days} days); set CRYPTEN_LITE_TLS_DIR={args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
