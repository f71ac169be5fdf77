"""The parties' HTTP share endpoints (what the page uses) under `--tls --web`: HTTPS with the
parties' certificates, a prediction through them equals torch, a client stalled in the TLS
handshake blocks no one, and CORS grants only the page's origin."""

from __future__ import annotations

import base64
import concurrent.futures
import json
import socket
import ssl
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import torch

from serve_service import Service
from crypten_lite_client import decode, reconstruct
from crypten_lite.serve.server import build_model

TOL = 2e-2


@pytest.fixture(scope="module")
def web_service(tmp_path_factory):
    s = Service(tmp_path_factory.mktemp("serve-https") / "state", "--model", "lenet", "--tls", "--web")
    yield s
    s.stop()


def _call(url: str, ctx, body: bytes | None = None, headers: dict | None = None, method=None):
    req = urllib.request.Request(url, data=body, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=300) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_https_share_endpoints(web_service):
    conn = web_service.conn
    urls = conn["web_endpoints"]
    assert all(u.startswith("https://") for u in urls)
    ctx = ssl.create_default_context(cafile=conn["ca"])
    host, port = urls[0].split("//")[1].rsplit(":", 1)
    stalled = socket.create_connection((host, int(port)))
    try:  # a connection that never starts its TLS handshake
        status, _, body = _call(urls[0] + "/info", ctx)
        assert status == 200 and json.loads(body)["ready"]
        x = np.random.default_rng(9).standard_normal((2, 1, 28, 28))
        with web_service.client() as c:
            reqs = c.requests_for(x, 120.0)
        bodies = [json.dumps({"request_id": q.request_id.hex(), "shape": list(q.shape),
                              "precision": q.precision, "dtype": q.dtype, "timeout_ms": q.timeout_ms,
                              "components": [base64.b64encode(b).decode() for b in q.components]}).encode()
                  for q in reqs]
        headers = {"Authorization": f"Bearer {conn['token']}", "Content-Type": "application/json"}
        with concurrent.futures.ThreadPoolExecutor(2) as ex:  # both halves at once
            replies = list(ex.map(lambda ub: _call(ub[0] + "/predict", ctx, ub[1], headers),
                                  zip(urls, bodies)))
    finally:
        stalled.close()
    assert [r[0] for r in replies] == [200, 200], replies
    got = [json.loads(r[2]) for r in replies]
    assert got[0]["computation"] == got[1]["computation"]
    shares = [np.frombuffer(base64.b64decode(g["share"]), dtype="<u8").reshape(g["shape"]) for g in got]
    model, _ = build_model("lenet")
    with torch.no_grad():
        want = model(torch.tensor(x, dtype=torch.float32)).numpy()
    np.testing.assert_allclose(decode(reconstruct(shares), got[0]["precision"]), want, atol=TOL)
    # CORS: only the page's origin is granted
    page = conn["web"]
    _, ok_headers, _ = _call(urls[1] + "/predict", ctx, None, {"Origin": page}, method="OPTIONS")
    _, bad_headers, _ = _call(urls[1] + "/predict", ctx, None, {"Origin": "https://evil.example"},
                              method="OPTIONS")
    assert ok_headers.get("Access-Control-Allow-Origin") == page
    assert "Access-Control-Allow-Origin" not in bad_headers
    # plain HTTP gets nothing from a TLS endpoint
    with pytest.raises(Exception):
        _call(urls[0].replace("https://", "http://") + "/healthz", None)


def test_browser_that_leaves_cancels_its_request(web_service):
    """A caller of POST /predict that closes its connection while its request waits (here: its
    other half never sent, so it would wait for its whole 120 s deadline) is cancelled at once:
    party 0 counts it under `cancelled`, not `deadline`."""
    conn = web_service.conn
    url = conn["web_endpoints"][0]
    ctx = ssl.create_default_context(cafile=conn["ca"])
    metrics = lambda: json.loads(_call(url + "/metrics", ctx)[2])  # noqa: E731
    m = metrics()
    before, requests, deadlines = m["errors"].get("cancelled", 0), m["requests"], m["errors"].get("deadline", 0)
    with web_service.client() as c:
        q = c.requests_for(np.zeros((1, 1, 28, 28)), 120.0)[0]
    body = json.dumps({"request_id": q.request_id.hex(), "shape": list(q.shape),
                       "precision": q.precision, "dtype": q.dtype, "timeout_ms": q.timeout_ms,
                       "components": [base64.b64encode(b).decode() for b in q.components]}).encode()
    host, port = url.split("//")[1].rsplit(":", 1)
    raw = socket.create_connection((host, int(port)), timeout=60)
    tls = ctx.wrap_socket(raw, server_hostname="party0")
    tls.sendall(b"POST /predict HTTP/1.1\r\nHost: party0\r\nContent-Type: application/json\r\n"
                + f"Authorization: Bearer {conn['token']}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                + body)
    parked = time.monotonic() + 100  # hang guards, not timing assumptions
    while metrics()["requests"] == requests:  # until party 0 holds the request
        assert time.monotonic() < parked, metrics()
        time.sleep(0.2)
    tls.close()
    end = time.monotonic() + 100  # well before the request's own 120 s deadline
    while metrics()["errors"].get("cancelled", 0) == before:
        assert time.monotonic() < end, metrics()
        time.sleep(0.2)
    assert metrics()["errors"].get("deadline", 0) == deadlines
