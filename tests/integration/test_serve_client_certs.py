"""`crypten-lite serve --tls --client-ca CA`: clients authenticate by TLS certificate instead of a
token. A client with a certificate the client CA signed predicts with no token (its id is the
certificate's common name); one without a certificate, or with a certificate of another CA
under the same name, is refused in the handshake; a token sent beside a certificate must name
the same client."""

from __future__ import annotations

import datetime
import pathlib

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from serve_service import Service
from crypten_lite_client import ClientError
from crypten_lite.certs import _ca_certificate, _leaf_certificate
from crypten_lite.serve.server import build_model

TOL = 2e-2


def _issue(folder: pathlib.Path, names: list[str]) -> dict[str, tuple[str, str]]:
    """A fresh CA in `folder` (ca.pem) and a client certificate per name: {name: (pem, key)}."""
    folder.mkdir(parents=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    validity = (now - datetime.timedelta(hours=1), now + datetime.timedelta(days=1))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _ca_certificate(ca_key, validity)
    (folder / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    out = {}
    for name in names:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _leaf_certificate(name, key, ca_key, ca, validity, [])
        (folder / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (folder / f"{name}.key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
        out[name] = (str(folder / f"{name}.pem"), str(folder / f"{name}.key"))
    return out


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("client-certs")
    return {"ours": _issue(d / "ours", ["alice"]), "rogue": _issue(d / "rogue", ["alice"]),
            "ca": str(d / "ours" / "ca.pem")}


@pytest.fixture(scope="module")
def service(tmp_path_factory, certs):
    s = Service(tmp_path_factory.mktemp("serve-certs") / "state", "--model", "lenet", "--tls",
                "--client-ca", certs["ca"], "--max-batch", "4",
                client_kw={"cert": certs["ours"]["alice"]})
    yield s
    s.stop()


def test_certificate_instead_of_token(service, certs):
    x = np.random.default_rng(4).standard_normal((2, 1, 28, 28))
    model, _ = build_model("lenet")
    with torch.no_grad():
        want = model(torch.tensor(x, dtype=torch.float32)).numpy()
    with service.client(token="") as alice:          # no token: the certificate says who
        np.testing.assert_allclose(alice.predict(x, timeout=300), want, atol=TOL)
    # a token of another client beside alice's certificate is refused
    with service.client() as mixed:                  # the service's token, client id "local"
        with pytest.raises(ClientError) as e:
            mixed.predict(x[0], timeout=300)
        assert e.value.code == "UNAUTHENTICATED"
    # no certificate, or alice's name from another CA: no handshake, no service
    for kw in ({"cert": None}, {"cert": certs["rogue"]["alice"]}):
        with service.client(token="", timeout=5, **kw) as other:
            with pytest.raises(ClientError) as e:
                other.predict(x[0], timeout=5)
            assert e.value.code == "UNAVAILABLE"
