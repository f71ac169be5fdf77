"""The HTTP endpoint of one party, for browsers (which cannot speak plain gRPC).

    POST /predict      JSON {request_id: hex, shape, precision, dtype, components: [base64],
                       timeout_ms}, header `Authorization: Bearer <token>` -> JSON reply
                       {request_id, shape, precision, share: base64, computation, party}
    GET  /healthz      {"ready": bool}        GET /metrics   the party's metrics (JSON)
    GET  /info         public metadata (protocol, sample shape, precision, model)
    GET  /  /config.json   the static page and its endpoints (with --web-page only)

With --tls the endpoint is HTTPS with the party's own certificate (browsers must trust the
service's CA). The same validation and batching as the gRPC service (Party.predict). CORS allows only the
page's origin (--web-origin); a request from any other origin gets no CORS grant. Bodies are
bounded before they are read.
"""

from __future__ import annotations

import base64
import binascii
import http.server
import json
import pathlib
import select
import socket
import ssl
import tempfile
import threading
from types import SimpleNamespace

from .errors import ServeError

STATIC = pathlib.Path(__file__).parent / "static"
HTTP_STATUS = {"invalid": 400, "unauthenticated": 401, "too_large": 413, "busy": 429,
               "duplicate": 409, "deadline": 504, "unavailable": 503, "cancelled": 499,
               "internal": 500}


def _peer_gone(conn) -> bool:
    """Whether the caller of a pending /predict went away. A browser sends nothing more on the
    connection while it awaits the answer, so the connection turning readable means its FIN,
    a reset or (HTTPS) its TLS close_notify; on plain HTTP a peek tells a closed connection
    (no bytes) from a pipelined request (bytes: still there)."""
    try:
        readable, _, _ = select.select([conn], [], [], 0)
        if not readable:
            return False
        if isinstance(conn, ssl.SSLSocket):
            return True
        return socket.socket.recv(conn, 1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):  # reset, or closed under us
        return True


def _request_from_json(body: bytes):
    try:
        obj = json.loads(body)
        return SimpleNamespace(
            request_id=binascii.unhexlify(str(obj["request_id"])),
            shape=[int(d) for d in obj["shape"]], precision=int(obj["precision"]),
            dtype=str(obj["dtype"]), timeout_ms=int(obj.get("timeout_ms", 0)),
            components=[base64.b64decode(str(c), validate=True) for c in obj["components"]])
    except (ValueError, KeyError, TypeError, binascii.Error) as e:
        raise ServeError("invalid", f"malformed JSON request ({type(e).__name__}): send "
                                    "request_id, shape, precision, dtype, components") from None


class WebServer:
    """ThreadingHTTPServer on `address` (host:port) in a daemon thread."""

    def __init__(self, address: str, party, args, tls=None):
        host, _, port = address.rpartition(":")
        self.party, self.args = party, args
        max_body = 64 << 20
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # no request logs (they would name clients)
                pass

            def _cors(self) -> None:
                origin = self.headers.get("Origin", "")
                if origin and origin == outer.args.web_origin:
                    self.send_header("Access-Control-Allow-Origin", origin)
                    self.send_header("Access-Control-Allow-Headers", "Authorization, Content-Type")
                    self.send_header("Access-Control-Allow-Methods", "POST, GET")
                    self.send_header("Vary", "Origin")

            def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(code)
                self._cors()
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def do_OPTIONS(self):  # noqa: N802
                self._send(204, b"")

            def do_GET(self):  # noqa: N802
                if self.path == "/healthz":
                    return self._send(200 if outer.party.ready else 503,
                                      json.dumps({"ready": outer.party.ready}).encode())
                if self.path == "/info":
                    i = outer.party.info()
                    return self._send(200, json.dumps({
                        "party": i.party, "world_size": i.world_size, "protocol": i.protocol,
                        "sample_shape": list(i.sample_shape), "precision": i.precision,
                        "model": i.model, "ready": i.ready, "max_batch": i.max_batch}).encode())
                if self.path == "/metrics":
                    return self._send(200, outer.party.metrics.json().encode())
                if outer.args.web_page and self.path in ("/", "/index.html"):
                    return self._send(200, (STATIC / "index.html").read_bytes(), "text/html; charset=utf-8")
                if outer.args.web_page and self.path == "/config.json" and outer.args.web_config:
                    return self._send(200, pathlib.Path(outer.args.web_config).read_bytes())
                self._send(404, b'{"error": "not found"}')

            def do_POST(self):  # noqa: N802
                if self.path != "/predict":
                    return self._send(404, b'{"error": "not found"}')
                try:
                    length = int(self.headers.get("Content-Length", "-1"))
                    if not 0 <= length <= max_body:
                        raise ServeError("too_large", f"body of {length} bytes: at most {max_body}")
                    body = self.rfile.read(length)
                    auth = self.headers.get("Authorization", "")
                    token = auth[len("Bearer "):] if auth.startswith("Bearer ") else ""
                    client = outer.party.authenticate(token)
                    if client is None:
                        raise ServeError("unauthenticated", "no valid client token (header "
                                                            "'Authorization: Bearer <token>')")
                    conn = self.connection  # a browser that leaves cancels its request
                    reply = outer.party.predict(client, _request_from_json(body),
                                                lambda: _peer_gone(conn))
                except ServeError as e:
                    return self._send(HTTP_STATUS[e.kind], json.dumps(
                        {"error": str(e), "kind": e.kind}).encode())
                except Exception as e:  # noqa: BLE001
                    return self._send(500, json.dumps({"error": type(e).__name__}).encode())
                self._send(200, json.dumps({
                    "request_id": reply.request_id.hex(), "shape": list(reply.shape),
                    "precision": reply.precision, "share": base64.b64encode(reply.share).decode(),
                    "computation": reply.computation, "party": reply.party}).encode())

        self.httpd = http.server.ThreadingHTTPServer((host or "0.0.0.0", int(port)), Handler)
        self.httpd.daemon_threads = True
        if tls is not None:  # --tls: HTTPS with the party's own certificate (never plain HTTP)
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            with tempfile.TemporaryDirectory() as d:  # ssl loads PEM from files only
                cert, key = pathlib.Path(d, "cert.pem"), pathlib.Path(d, "key.pem")
                cert.write_bytes(tls.cert)
                key.touch(mode=0o600)
                key.write_bytes(tls.key)
                ctx.load_cert_chain(cert, key)
            # the handshake runs in the request's own thread (a stalled client blocks no one)
            self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True,
                                                do_handshake_on_connect=False)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
