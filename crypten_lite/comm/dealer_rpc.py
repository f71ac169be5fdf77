"""gRPC glue of the dealer service: the server side and the party-side client.

The dealer logic itself (which values to derive, which correction to send) lives in
`crypten_lite.provider.dealer`; this module only moves requests and tensors.

1. Every party calls `Dealer.Handshake` (same checks as between parties); both sides derive
   the party-dealer seed from X25519 + HKDF.
2. Rank 0 sends batches of `CorrelationRequest`s; the dealer waits (up to the timeout) until
   every rank of the session has shaken hands, derives every party's shares from their seeds
   and answers with rank 0's correcting shares only.

Hostile input (tests/integration/test_fuzz.py): without TLS nobody's identity is proven, so
a rank's first handshake wins and a second one with another key is refused (it would
otherwise replace that party's seed and silently corrupt every later correlation); a
malformed request gets a refusal, never an exception; a request is refused before any work
when its operands exceed max_message_bytes or its answer one gRPC message.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import grpc
import torch

from .._proto import crypten_lite_pb2 as pb
from .._proto import crypten_lite_pb2_grpc as pb_grpc
from ..config import Config
from ..errors import CommunicationError, ConfigError, CryptenLiteError
from ..random import KeyPair, pair_info
from . import serde
from .grpc_comm import MAX_REPLY_BYTES, TlsContext, check_hello, handshake, make_hello, start_server

log = logging.getLogger("crypten_lite.dealer")


@dataclass(frozen=True)
class Request:
    """One correlated-randomness request (public: kinds, shapes and parameters only)."""

    kind: str
    counter: int
    op: str = ""
    shapes: tuple[tuple[int, ...], ...] = ()
    params: tuple[int, ...] = ()

    def to_proto(self, session: str) -> pb.CorrelationRequest:
        flat: list[int] = []
        for shape in self.shapes:
            flat.append(len(shape))
            flat.extend(shape)
        return pb.CorrelationRequest(session=session, kind=self.kind, counter=self.counter,
                                     op=self.op, shapes=flat, params=list(self.params))

    @classmethod
    def from_proto(cls, msg: pb.CorrelationRequest) -> "Request":
        shapes, flat, i = [], list(msg.shapes), 0
        while i < len(flat):
            n = flat[i]
            if n < 0 or n > serde.MAX_DIMS or i + 1 + n > len(flat):
                raise CommunicationError("malformed shapes in correlation request")
            shapes.append(tuple(flat[i + 1:i + 1 + n]))
            i += 1 + n
        return cls(msg.kind, msg.counter, msg.op, tuple(shapes), tuple(msg.params))


def tensor_to_proto(tensor: torch.Tensor) -> pb.TensorProto:
    dtype, shape, data = serde.to_bytes(tensor)
    return pb.TensorProto(dtype=dtype, shape=shape, data=bytes(data))


def tensor_from_proto(msg: pb.TensorProto, max_bytes: int) -> torch.Tensor:
    serde.check_header(msg.dtype, tuple(msg.shape), max_bytes)
    return serde.from_bytes(msg.dtype, tuple(msg.shape), msg.data)


# Sanity bounds on one request (the operations the dealer serves have at most 2 operands
# and a dozen integer parameters).
MAX_OPERANDS = 8
MAX_PARAMS = 256

Handler = Callable[[dict[int, bytes], Request], list[torch.Tensor]]


class _DealerServicer(pb_grpc.DealerServicer):
    def __init__(self, dealer: "DealerServer"):
        self.dealer = dealer

    def Handshake(self, request, context):
        d = self.dealer
        identity = d.tls.peer_identity(context)
        error = check_hello(d.hello, request, identity, dealer=True)
        if error:
            log.warning("dealer refused a handshake: %s", error)
            return pb.HelloReply(hello=d.hello, error=error)
        try:
            seed = d.keypair.shared_seed(request.public_key,
                                         pair_info(request.session, "dealer", request.rank))
        except ValueError:  # a low-order point: no shared secret
            return pb.HelloReply(hello=d.hello, error="malformed public key")
        with d.cond:
            if identity is None and d.seeds.get(request.rank, seed) != seed:
                error = (f"party {request.rank} already joined session {request.session!r} with "
                         "another key; start a new session (CRYPTEN_LITE_SESSION) or restart "
                         "the dealer")
                log.warning("dealer refused a handshake: %s", error)
                return pb.HelloReply(hello=d.hello, error=error)
            d.seeds[request.rank] = seed
            d.cond.notify_all()
        log.info("dealer: party %d joined session %r", request.rank, request.session)
        return pb.HelloReply(hello=d.hello)

    def Correlations(self, request, context):
        d = self.dealer
        identity = d.tls.peer_identity(context)
        if identity is not None and identity != "party0":
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "only party0 may request corrections")
        try:
            seeds = d.wait_for_parties()
            tensors: list[pb.TensorProto] = []
            counts: list[int] = []
            size = 0
            for msg in request.requests:
                if msg.session != d.config.session:
                    raise CommunicationError(f"request for session {msg.session!r}")
                req = Request.from_proto(msg)
                d.check_size(req)
                answer = d.handler(seeds, req)
                counts.append(len(answer))
                for t in answer:
                    tensors.append(tensor_to_proto(t))
                    size += len(tensors[-1].data)
                    if size > MAX_REPLY_BYTES - (1 << 20):
                        raise CommunicationError(f"the answer exceeds {MAX_REPLY_BYTES - (1 << 20)} bytes; "
                                                 "request fewer or smaller correlations at a time")
            return pb.CorrelationReply(tensors=tensors, counts=counts)
        except CryptenLiteError as e:
            log.warning("dealer refused a request: %s", e)
            return pb.CorrelationReply(error=str(e))
        except (ArithmeticError, IndexError, KeyError, TypeError, ValueError, RuntimeError) as e:
            # A malformed request (missing shapes or params, impossible sizes...): refuse it.
            log.warning("dealer refused a malformed request: %s: %s", type(e).__name__, e)
            return pb.CorrelationReply(error=f"malformed request: {type(e).__name__}")


class DealerServer:
    """The dealer's gRPC server; `handler` computes the correcting shares of one request."""

    def __init__(self, config: Config, handler: Handler, address: str | None = None):
        self.config = config
        self.handler = handler
        self.keypair = KeyPair()
        self.tls = TlsContext(config.tls_dir, "dealer")
        self.hello = make_hello(config, config.world_size, self.keypair.public_bytes)
        self.seeds: dict[int, bytes] = {}
        self.cond = threading.Condition()
        address = address or config.bind or config.dealer
        if not address:
            raise ConfigError("the dealer needs an address: set CRYPTEN_LITE_DEALER=host:port")
        self.server = start_server(address, self.tls,
                                   lambda s: pb_grpc.add_DealerServicer_to_server(_DealerServicer(self), s),
                                   "dealer")

    def check_size(self, request: Request) -> None:
        """Refuse, before any work, a request whose operands exceed max_message_bytes."""
        if len(request.shapes) > MAX_OPERANDS or len(request.params) > MAX_PARAMS:
            raise CommunicationError(f"correlation request with {len(request.shapes)} shapes and "
                                     f"{len(request.params)} parameters")
        if any(s < 0 for shape in request.shapes for s in shape):
            raise CommunicationError("negative dimension in correlation request")
        nbytes = 8 * sum(math.prod(shape) for shape in request.shapes)
        if nbytes > self.config.max_message_bytes:
            raise CommunicationError(f"correlation request {request.kind}/{request.op} of "
                                     f"{nbytes} bytes exceeds max_message_bytes")

    def wait_for_parties(self) -> dict[int, bytes]:
        deadline = time.monotonic() + self.config.timeout
        with self.cond:
            while len(self.seeds) < self.config.world_size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    missing = sorted(set(range(self.config.world_size)) - set(self.seeds))
                    raise CommunicationError(f"dealer: parties {missing} never connected")
                self.cond.wait(remaining)
            return dict(self.seeds)

    def wait(self) -> None:
        self.server.wait_for_termination()

    def stop(self) -> None:
        self.server.stop(grace=1.0).wait(2.0)


class DealerClient:
    """A party's connection to the dealer: seed agreement, and (rank 0) correction requests."""

    def __init__(self, config: Config):
        if not config.dealer:
            raise ConfigError("CRYPTEN_LITE_DEALER is not set: give the dealer's host:port, "
                              "or use CRYPTEN_LITE_PROVIDER=tfp for insecure local tests")
        self.config = config
        keypair = KeyPair()
        self.tls = TlsContext(config.tls_dir, f"party{config.rank}")
        self.channel = self.tls.channel(config.dealer, "dealer")
        self.stub = pb_grpc.DealerStub(self.channel)
        hello = make_hello(config, config.rank, keypair.public_bytes)
        theirs = handshake(self.stub, hello, config.timeout, config.dealer, "the dealer")
        if theirs.rank != config.world_size or theirs.session != config.session:
            raise ConfigError(f"the service at {config.dealer} is not this session's dealer")
        self.seed = keypair.shared_seed(theirs.public_key, pair_info(config.session, "dealer", config.rank))

    def request_batch(self, requests: Sequence[Request]) -> Callable[[], list[list[torch.Tensor]]]:
        """Send a batch; returns a function that waits for the corrections of each request."""
        reply = self._call(requests)

        def split() -> list[list[torch.Tensor]]:
            tensors, counts = reply()
            if sum(counts) != len(tensors) or len(counts) != len(requests):
                raise CommunicationError("the dealer's answer does not match the batch", peer="dealer")
            out, i = [], 0
            for n in counts:
                out.append(tensors[i:i + n])
                i += n
            return out
        return split

    def request(self, requests: Sequence[Request]) -> Callable[[], list[torch.Tensor]]:
        """Send a batch; returns a function that waits for (and returns) the corrections."""
        reply = self._call(requests)
        return lambda: reply()[0]

    def _call(self, requests: Sequence[Request]) -> Callable[[], tuple[list[torch.Tensor], list[int]]]:
        batch = pb.CorrelationBatch(requests=[r.to_proto(self.config.session) for r in requests])
        future = self.stub.Correlations.future(batch, timeout=self.config.timeout)

        def result() -> tuple[list[torch.Tensor], list[int]]:
            try:
                reply = future.result()
            except grpc.RpcError as e:
                raise CommunicationError(f"the dealer at {self.config.dealer} failed: "
                                         f"{e.code().name}: {e.details()}", peer="dealer") from e
            if reply.error:
                raise CommunicationError(f"the dealer refused: {reply.error}", peer="dealer")
            tensors = [tensor_from_proto(t, self.config.max_message_bytes) for t in reply.tensors]
            return tensors, list(reply.counts)
        return result

    def close(self) -> None:
        self.channel.close()
