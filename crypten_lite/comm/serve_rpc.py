"""gRPC transport of the client-facing prediction service (`crypten-lite serve`).

Only the transport lives here (only comm/ imports grpc): a :class:`ServeHandler` given by
crypten_lite.serve decides everything. Each call's bearer token (metadata ``authorization``)
is handed to the handler, which names the client or refuses; a handler error becomes the
gRPC status it names, with its message, for that call alone.
"""

from __future__ import annotations

import concurrent.futures
from typing import Protocol

import grpc

from .._proto import serve_pb2 as pb
from .._proto import serve_pb2_grpc as pb_grpc
from .tls import TlsMaterial

# Error kinds of crypten_lite.serve.errors -> gRPC status codes.
STATUS = {
    "invalid": grpc.StatusCode.INVALID_ARGUMENT,
    "unauthenticated": grpc.StatusCode.UNAUTHENTICATED,
    "too_large": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "busy": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "duplicate": grpc.StatusCode.ALREADY_EXISTS,
    "deadline": grpc.StatusCode.DEADLINE_EXCEEDED,
    "unavailable": grpc.StatusCode.UNAVAILABLE,
    "cancelled": grpc.StatusCode.CANCELLED,
    "internal": grpc.StatusCode.INTERNAL,
}


class ServeHandler(Protocol):
    """What the transport asks of the service (crypten_lite.serve.server.Party)."""

    def authenticate(self, token: str, certificate_name: str | None = None) -> str | None: ...

    def predict(self, client: str, request: pb.PredictRequest, cancelled) -> pb.PredictReply: ...

    def info(self) -> pb.InfoReply: ...


class _Servicer(pb_grpc.ServeServicer):
    def __init__(self, handler: ServeHandler, client_certs: bool = False):
        self.handler = handler
        self._client_certs = client_certs

    def Predict(self, request, context):  # noqa: N802 (gRPC name)
        token = ""
        for key, value in context.invocation_metadata():
            if key == "authorization" and value.startswith("Bearer "):
                token = value[len("Bearer "):]
        name = None
        if self._client_certs:  # the handshake verified the certificate against the client CA
            names = context.auth_context().get("x509_common_name") or [b""]
            name = names[0].decode(errors="replace")
        client = self.handler.authenticate(token, name)
        if client is None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED,
                          "no valid client token: pass the token your service operator issued "
                          "(metadata 'authorization: Bearer <token>')" if name is None else
                          "the client certificate's name is not a valid client id, or a token "
                          "sent with it names another client")
        try:
            return self.handler.predict(client, request, lambda: not context.is_active())
        except Exception as e:  # noqa: BLE001 (each error goes to its own caller)
            kind = getattr(e, "kind", "internal")
            message = str(e) if kind != "internal" else f"internal error ({type(e).__name__})"
            context.abort(STATUS.get(kind, grpc.StatusCode.INTERNAL), message)

    def Info(self, request, context):  # noqa: N802
        return self.handler.info()


class ServeServer:
    """The Serve gRPC service of one party on `address` (TLS with `tls`: the party's own
    certificate). Clients authenticate with tokens; with `client_ca` (PEM, TLS only) every
    client must also present a certificate that CA signed, whose common name is its id."""

    def __init__(self, address: str, handler: ServeHandler, tls: TlsMaterial | None = None,
                 max_message_bytes: int = 64 << 20, workers: int = 96,
                 client_ca: bytes | None = None):
        if client_ca is not None and tls is None:
            raise ValueError("client certificates need TLS (--tls)")
        self._server = grpc.server(
            concurrent.futures.ThreadPoolExecutor(max_workers=workers),
            options=[("grpc.max_receive_message_length", max_message_bytes),
                     ("grpc.max_send_message_length", max_message_bytes),
                     ("grpc.so_reuseport", 0)],
            maximum_concurrent_rpcs=workers)
        pb_grpc.add_ServeServicer_to_server(_Servicer(handler, client_ca is not None), self._server)
        if tls is None:
            port = self._server.add_insecure_port(address)
        else:
            creds = grpc.ssl_server_credentials([(tls.key, tls.cert)], root_certificates=client_ca,
                                                require_client_auth=client_ca is not None)
            port = self._server.add_secure_port(address, creds)
        if port == 0:
            raise OSError(f"cannot bind the client endpoint {address}")
        self.port = port
        self._server.start()

    def stop(self, grace: float = 2.0) -> None:
        self._server.stop(grace).wait(grace + 1.0)


def request_from_bytes(data: bytes) -> pb.PredictRequest:
    """Parse a serialized PredictRequest (the HTTP endpoint's binary form)."""
    msg = pb.PredictRequest()
    msg.ParseFromString(data)
    return msg


def messages():
    """The generated message classes (PredictRequest, PredictReply, InfoReply)."""
    return pb
