"""gRPC glue of the dealer service: the server side and the party-side client.

The dealer logic itself (which values to derive, which correction to send) lives in
`crypten_lite.provider.dealer`; this module only moves requests and tensors.

1. Every party calls `Dealer.Handshake` (same checks as between parties); both sides derive
   the party-dealer seed from X25519 + HKDF, and from it (`random.subkey`) the party's
   correlation key and, for rank 0, the request MAC key.
2. Rank 0 sends batches of `CorrelationRequest`s, each batch with an HMAC-SHA256 under its
   request MAC key over the session and the requests' deterministic protobuf encodings (a few
   dozen bytes per request, never the tensors). Before any work the dealer:
   a. refuses a batch whose MAC is not rank 0's (any other party, an outsider, a modified
      batch): with or without TLS, only rank 0 gets corrections. The MAC is over the batch's
      messages as serialized, verified before any request is decoded (and before waiting for
      the other parties), on a batch bounded by the receive limit and MAX_BATCH_REQUESTS;
      then it waits (up to the timeout) until every rank of the session has shaken hands, and
   b. refuses a request the protocols never make (`Handler.check`: kind, op, operand count,
      parameter ranges) or whose answer is too large: every component, broadcast and matmul
      results included, is sized by arithmetic against max_message_bytes, and the batch's
      answer against one gRPC message;
   c. refuses a batch naming a counter it has already answered in this session (a replay,
      or a different request for a used counter): each counter is answered at most once;
      and a ``weight_triple`` (fixed model weights, provider/correlations.py) whose mask
      counter it did not answer as a ``weight_mask`` of that weight's shape.
   Then it derives every party's components and answers with rank 0's corrections only.
3. An offline phase's whole plan goes through `Prepare` and `Pull` instead (same checks as
   in 2, then the answers are cut into chunks, chunk 0 answered with Prepare and each later
   one computed when rank 0 pulls it during the run, each delivered once:
   comm/dealer_prefetch.py), so that no plan is limited by one message, rank 0 never holds
   more than a few chunks, and the offline phase waits only for the plan's first requests.

Hostile input (tests/integration/test_fuzz.py, test_dealer_attacks.py): without TLS nobody's
identity is proven, so a rank's first handshake wins and a second one with another key is
refused (it would otherwise replace that party's seed and silently corrupt every later
correlation); a malformed request gets a refusal, never an exception.
"""

from __future__ import annotations

import bisect
import hashlib
import hmac
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import grpc
import torch

from .._proto import crypten_lite_pb2 as pb
from .._proto import crypten_lite_pb2_grpc as pb_grpc
from ..config import Config
from ..errors import CommunicationError, ConfigError, CryptenLiteError, ProtocolError
from ..random import KeyPair, canonical, pair_info, request_encoding, subkey
from . import serde
from .dealer_prefetch import (CHUNK_BYTES, FIRST_CHUNK_REQUESTS, ChunkPuller, PreparedBatch,
                              chunk_counts, pull_mac)
from .grpc_comm import (MAX_REPLY_BYTES, TlsContext, check_hello, handshake, hello_origin, make_hello,
                        start_server, warn_plaintext)

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

    def encoding(self) -> bytes:
        """The canonical encoding its randomness and its MAC are bound to."""
        return request_encoding(self.counter, self.kind, self.op, self.shapes, self.params)


# A request's corrections of at most this many bytes in all are sent as one flat tensor (one
# protobuf message to build and decode instead of one per correction: a masked polynomial has
# dozens); larger ones one tensor each (each within the message limit).
JOINT_ANSWER_BYTES = 1 << 20

# Only this rank receives corrections (provider.correlations.CORRECTING_RANK).
REQUESTER_RANK = 0
MAC_BYTES = 32


# At most this many requests in one batch (a whole offline plan travels in one message of at
# most grpc_comm.MAX_FRAME_BYTES, the dealer server's receive limit): refused before any work.
MAX_BATCH_REQUESTS = 1 << 17


def batch_mac(key: bytes, session: str, requests: Sequence[Request]) -> bytes:
    """HMAC-SHA256 of a batch under rank 0's request MAC key (bound to the session and to
    every request's every field, see batch_mac_proto)."""
    return batch_mac_proto(key, session, [r.to_proto(session) for r in requests])


def batch_mac_proto(key: bytes, session: str, requests) -> bytes:
    """HMAC-SHA256 of a batch's CorrelationRequest messages as serialized (deterministic
    protobuf encoding: fields in number order, unknown fields kept), under rank 0's request
    MAC key. The dealer verifies it on the message as received, before it decodes a single
    request (a C-speed serialization and one HMAC): an unauthenticated batch costs no parsing."""
    body = pb.CorrelationBatch(requests=requests).SerializeToString(deterministic=True)
    return _batch_mac(key, session, len(requests), body)


def batch_mac_message(key: bytes, session: str, batch: pb.CorrelationBatch) -> bytes:
    """batch_mac_proto of a received batch's requests (and of anything else it carries besides
    its MAC, unknown fields included: those make it differ), without a Python loop."""
    body = pb.CorrelationBatch()
    body.CopyFrom(batch)
    body.ClearField("mac")
    return _batch_mac(key, session, len(batch.requests), body.SerializeToString(deterministic=True))


def _batch_mac(key: bytes, session: str, n: int, body: bytes) -> bytes:
    mac = hmac.new(key, canonical("dealer-batch/v2", session, REQUESTER_RANK, n), hashlib.sha256)
    mac.update(body)
    return mac.digest()


class CounterLedger:
    """The counters answered in a session, as sorted disjoint [start, end) intervals (the
    counters of a run are nearly contiguous, so this stays a handful of intervals)."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self.answered = 0

    def __contains__(self, counter: int) -> bool:
        i = bisect.bisect_right(self._starts, counter) - 1
        return i >= 0 and counter < self._ends[i]

    def claim(self, counters: Sequence[int]) -> None:
        """Mark every counter answered; ProtocolError naming the first one already answered
        (or repeated within `counters`), in which case nothing is marked."""
        ordered = sorted(counters)
        for prev, cur in zip(ordered, ordered[1:]):
            if prev == cur:
                raise ProtocolError(f"counter {cur} appears twice in one batch; the dealer "
                                    "answers each counter once")
        for c in ordered:
            if c in self:
                raise ProtocolError(f"counter {c} was already answered in this session; the "
                                    "dealer answers each counter once (a replay, or a run "
                                    "that re-requests a used counter)")
        for c in ordered:
            self._add(c)
        self.answered += len(ordered)

    def _add(self, c: int) -> None:
        i = bisect.bisect_right(self._starts, c) - 1
        if i >= 0 and self._ends[i] == c:  # extends interval i
            self._ends[i] = c + 1
            if i + 1 < len(self._starts) and self._starts[i + 1] == c + 1:  # joins i + 1
                self._ends[i] = self._ends.pop(i + 1)
                self._starts.pop(i + 1)
        elif i + 1 < len(self._starts) and self._starts[i + 1] == c + 1:  # extends i + 1 down
            self._starts[i + 1] = c
        else:
            self._starts.insert(i + 1, c)
            self._ends.insert(i + 1, c + 1)

    @property
    def intervals(self) -> int:
        return len(self._starts)


def tensor_to_proto(tensor: torch.Tensor) -> pb.TensorProto:
    dtype, shape, data = serde.to_bytes(tensor)
    return pb.TensorProto(dtype=dtype, shape=shape, data=bytes(data))


def tensor_from_proto(msg: pb.TensorProto, max_bytes: int) -> torch.Tensor:
    serde.check_header(msg.dtype, tuple(msg.shape), max_bytes)
    return serde.from_bytes(msg.dtype, tuple(msg.shape), msg.data)


# Sanity bounds on one request, checked before anything else (the operations the dealer
# serves have at most 2 operands and a few dozen integer parameters).
MAX_OPERANDS = 8
MAX_PARAMS = 256
# Room left in the reply for everything but the tensors' bytes.
ANSWER_MARGIN = 1 << 20


class Handler(Protocol):
    """The dealer's logic (provider.dealer_handler): what it accepts and what it answers."""

    def check(self, request: Request, world_size: int, max_component_bytes: int) -> int:
        """Refuse (CryptenLiteError) a request no protocol makes; else its answer's bytes.
        Must not allocate anything in proportion to the request's shapes."""

    def __call__(self, keys: dict[int, bytes], request: Request) -> list[torch.Tensor]:
        """Rank 0's corrections for `request`, from every rank's correlation key."""


class _DealerServicer(pb_grpc.DealerServicer):
    def __init__(self, dealer: "DealerServer"):
        self.dealer = dealer

    def Handshake(self, request, context):
        d = self.dealer
        identity = d.tls.peer_identity(context)
        error = check_hello(d.hello, request, identity, dealer=True)
        if error:
            log.warning("dealer refused a handshake from %s: %s", hello_origin(request, identity),
                        error)
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
            d.keys[request.rank] = subkey(seed, "correlations")
            if request.rank == REQUESTER_RANK:
                d.mac_key = subkey(seed, "dealer-request-mac")
            d.cond.notify_all()
        log.info("dealer: party %d joined session %r", request.rank, request.session)
        return d.tls.reply(request, d.hello)

    def _requester_only(self, context) -> None:
        identity = self.dealer.tls.peer_identity(context)
        if identity is not None and identity != f"party{REQUESTER_RANK}":
            self.dealer.audit(refused=1)
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "only party0 may request corrections")

    def _accept(self, request) -> tuple[dict[int, bytes], list[Request], list[int]]:
        """Steps 2a-2c for a batch: the keys, the requests and their answers' bytes. The MAC
        is verified first, on the batch as received (its size bounded by the server's receive
        limit and MAX_BATCH_REQUESTS), before any request is decoded or checked."""
        d = self.dealer
        if len(request.mac) != MAC_BYTES:
            raise ProtocolError("request not authenticated (no MAC): only party 0 may "
                                "request corrections")
        if len(request.requests) > MAX_BATCH_REQUESTS:
            raise ProtocolError(f"a batch of {len(request.requests)} requests exceeds "
                                f"{MAX_BATCH_REQUESTS}; send the plan in several batches")
        d.authenticate_message(request)
        keys = d.wait_for_parties()
        requests = []
        for msg in request.requests:
            if msg.session != d.config.session:
                raise CommunicationError(f"request for session {msg.session!r}")
            requests.append(Request.from_proto(msg))
        sizes = [d.check(r) for r in requests]
        return keys, requests, sizes

    def _refuse(self, e: Exception, reply):
        d = self.dealer
        d.audit(refused=1)
        if isinstance(e, CryptenLiteError):
            log.warning("dealer refused a request: %s", e)
            return reply(error=str(e))
        # A malformed request (missing shapes or params, impossible sizes...): refuse it.
        log.warning("dealer refused a malformed request: %s: %s", type(e).__name__, e)
        return reply(error=f"malformed request: {type(e).__name__}")

    def Correlations(self, request, context):
        d = self.dealer
        self._requester_only(context)
        try:
            keys, requests, sizes = self._accept(request)
            answer_bytes = sum(sizes)
            if answer_bytes > MAX_REPLY_BYTES - ANSWER_MARGIN:
                raise CommunicationError(f"the answer ({answer_bytes} bytes) exceeds "
                                         f"{MAX_REPLY_BYTES - ANSWER_MARGIN} bytes; request "
                                         "fewer or smaller correlations at a time, or prefetch "
                                         "them (Prepare and Pull stream any number)")
            d.claim(requests)
            reply = d.answer(keys, requests)
            d.audit(answered=len(requests))
            return reply
        except _REFUSED as e:
            return self._refuse(e, pb.CorrelationReply)

    def Prepare(self, request, context):
        d = self.dealer
        self._requester_only(context)
        try:
            keys, requests, sizes = self._accept(request)
            if not requests:
                raise ProtocolError("an empty batch has nothing to prepare")
            d.claim(requests)
            batch = d.prepare(keys, requests, sizes)
            d.audit(answered=len(requests))
            # chunk 0 travels with the reply (handed out once, as a pull would): one exchange
            return pb.PrepareReply(chunks=batch.counts, first=batch.take(0))
        except _REFUSED as e:
            return self._refuse(e, pb.PrepareReply)

    def Pull(self, request, context):
        self._requester_only(context)
        try:
            return self.dealer.pull(request)
        except _REFUSED as e:
            return self._refuse(e, pb.CorrelationReply)


# What a servicer turns into a refusal: the protocol's own errors, and the errors of a
# malformed request (missing shapes or params, impossible sizes...).
_REFUSED = (CryptenLiteError, ArithmeticError, IndexError, KeyError, TypeError, ValueError, RuntimeError)


class DealerServer:
    """The dealer's gRPC server; `handler` computes the correcting shares of one request."""

    def __init__(self, config: Config, handler: Handler, address: str | None = None):
        self.config = config
        self.handler = handler
        self.keypair = KeyPair()
        self.tls = TlsContext(config.tls_dir, "dealer")
        self.hello = make_hello(config, config.world_size, self.keypair.public_bytes)
        self.seeds: dict[int, bytes] = {}
        self.keys: dict[int, bytes] = {}     # correlation key of every rank
        self.mac_key: bytes | None = None    # rank 0's request MAC key
        self.ledger = CounterLedger()        # counters answered in this session
        self.weight_masks: dict[int, tuple[int, ...]] = {}  # weight_mask counter -> weight shape
        self.prepared: PreparedBatch | None = None  # the session's latest prepared batch
        self.refused = 0
        self.cond = threading.Condition()
        address = address or config.bind or config.dealer
        if not address:
            raise ConfigError("the dealer needs an address: set CRYPTEN_LITE_DEALER=host:port")
        if ":" not in address and config.dealer:  # a bind host alone: the dealer's own port
            address = f"{address}:{config.dealer.rpartition(':')[2]}"
        if not self.tls.enabled:
            warn_plaintext("dealer", [address, *config.parties])
        self.server = start_server(address, self.tls,
                                   lambda s: pb_grpc.add_DealerServicer_to_server(_DealerServicer(self), s),
                                   "dealer")

    def authenticate(self, mac: bytes, requests: Sequence[Request]) -> None:
        """Refuse a batch whose MAC is not rank 0's (another party, an outsider, a change)."""
        self.authenticate_proto(mac, [r.to_proto(self.config.session) for r in requests])

    def authenticate_proto(self, mac: bytes, requests) -> None:
        """authenticate() on CorrelationRequest messages."""
        self.authenticate_message(pb.CorrelationBatch(requests=requests, mac=mac))

    def authenticate_message(self, batch: pb.CorrelationBatch) -> None:
        """authenticate() on a CorrelationBatch as received (nothing decoded)."""
        with self.cond:
            key = self.mac_key
        if key is None or not hmac.compare_digest(
                batch.mac, batch_mac_message(key, self.config.session, batch)):
            raise ProtocolError("request not authenticated (bad MAC): only party 0 may request "
                                "corrections, each batch with its own MAC")

    def check(self, request: Request) -> int:
        """Refuse, before any work, a request no protocol makes or whose answer is too large
        (every component, broadcast results included, within max_message_bytes); else the
        bytes of its answer."""
        if len(request.shapes) > MAX_OPERANDS or len(request.params) > MAX_PARAMS:
            raise CommunicationError(f"correlation request with {len(request.shapes)} shapes and "
                                     f"{len(request.params)} parameters")
        return self.handler.check(request, self.config.world_size, self.config.max_message_bytes)

    def claim(self, requests: Sequence[Request]) -> None:
        """Mark the batch's counters answered (all or none); refuse a counter already answered,
        and a ``weight_triple`` whose mask counter was not answered (in this session, or
        earlier in this batch) as a ``weight_mask`` of the same weight shape."""
        with self.cond:
            pending = {r.counter: tuple(r.shapes[0]) for r in requests if r.kind == "weight_mask"}
            for r in requests:
                if r.kind == "weight_triple":
                    mask = r.params[0]
                    shape = self.weight_masks.get(mask, pending.get(mask))
                    if shape is None or shape != tuple(r.shapes[1]):
                        raise ProtocolError(f"weight_triple {r.counter} names mask counter {mask}, "
                                            "which this session did not answer as a weight_mask "
                                            f"of shape {tuple(r.shapes[1])}")
            self.ledger.claim([r.counter for r in requests])
            self.weight_masks.update(pending)

    def answer(self, keys: dict[int, bytes], requests: Sequence[Request]) -> pb.CorrelationReply:
        """The reply with rank 0's corrections of `requests` (claimed already)."""
        tensors: list[pb.TensorProto] = []
        counts: list[int] = []
        joint = min(JOINT_ANSWER_BYTES, self.config.max_message_bytes)  # one tensor's limit
        for req in requests:
            answer = self.handler(keys, req)
            if len(answer) > 1 and 8 * sum(t.numel() for t in answer) <= joint:
                # several small corrections (a masked polynomial's monomials) travel as one
                # flat tensor, in order: rank 0's provider cuts it by their shapes
                answer = [torch.cat([t.reshape(-1) for t in answer])]
            counts.append(len(answer))
            tensors.extend(tensor_to_proto(t) for t in answer)
            del answer
        return pb.CorrelationReply(tensors=tensors, counts=counts)

    def prepare(self, keys: dict[int, bytes], requests: Sequence[Request],
                sizes: Sequence[int]) -> PreparedBatch:
        """Cut a claimed batch into chunks (the first ones small: FIRST_CHUNK_REQUESTS) and
        compute chunk 0; every later chunk is computed when rank 0 pulls it, during the run.
        It supersedes the session's earlier prepared batch (its undelivered chunks dropped:
        rank 0 moved past them)."""
        chunk_bytes = min(CHUNK_BYTES, self.config.max_message_bytes)
        counts = chunk_counts(sizes, chunk_bytes, FIRST_CHUNK_REQUESTS)
        batch = PreparedBatch(requests[0].counter, requests, counts, sizes,
                              lambda chunk: self.answer(keys, chunk))
        with self.cond:
            self.prepared = None
        batch.compute_ahead(0)  # chunk 0 only
        with self.cond:
            self.prepared = batch
        return batch

    def pull(self, request: pb.PullRequest) -> pb.CorrelationReply:
        """One chunk of the prepared batch, for rank 0 only (its MAC), each chunk once."""
        if request.session != self.config.session:
            raise CommunicationError(f"pull for session {request.session!r}")
        with self.cond:
            key, batch = self.mac_key, self.prepared
        if key is None or not hmac.compare_digest(
                request.mac, pull_mac(key, self.config.session, request.start, request.chunk)):
            raise ProtocolError("pull not authenticated (bad MAC): only party 0 may pull corrections")
        if batch is None or batch.start != request.start:
            raise ProtocolError(f"no prepared batch starts at counter {request.start} (never "
                                "prepared, or a newer prefetch replaced it)")
        return batch.take(request.chunk)

    def audit(self, answered: int = 0, refused: int = 0) -> None:
        """Log the session's totals (INFO): what the dealer answered and refused so far."""
        with self.cond:
            self.refused += refused
            total, intervals, refusals = self.ledger.answered, self.ledger.intervals, self.refused
        log.info("dealer audit: session=%s batch_answered=%d counters_answered=%d "
                 "counter_ranges=%d batches_refused=%d", self.config.session, answered, total,
                 intervals, refusals)

    def wait_for_parties(self) -> dict[int, bytes]:
        """Every rank's correlation key, once all have shaken hands (up to the timeout)."""
        deadline = time.monotonic() + self.config.timeout
        with self.cond:
            while len(self.keys) < self.config.world_size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    missing = sorted(set(range(self.config.world_size)) - set(self.keys))
                    raise CommunicationError(f"dealer: parties {missing} never connected")
                self.cond.wait(remaining)
            return dict(self.keys)

    def wait(self) -> None:
        self.server.wait_for_termination()

    def stop(self) -> None:
        self.server.stop(grace=1.0).wait(2.0)


def _per_request(tensors: list, counts: Sequence[int]) -> list[list]:
    """A reply's tensors cut into each request's corrections (`counts` tensors each)."""
    out, i = [], 0
    for n in counts:
        out.append(tensors[i:i + n])
        i += n
    return out


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
        theirs = handshake(self.stub, hello, config.timeout, config.dealer, "the dealer",
                           tls=self.tls, identity="dealer")
        if theirs.rank != config.world_size or theirs.session != config.session:
            raise ConfigError(f"the service at {config.dealer} is not this session's dealer")
        self.seed = keypair.shared_seed(theirs.public_key, pair_info(config.session, "dealer", config.rank))
        # Only rank 0's key is accepted by the dealer; any other party's requests are refused.
        self._mac_key = subkey(self.seed, "dealer-request-mac")

    def request_batch(self, requests: Sequence[Request]) -> Callable[[], list[list[torch.Tensor]]]:
        """Send a batch; returns a function that waits for the corrections of each request."""
        reply = self._call(requests)

        def split() -> list[list[torch.Tensor]]:
            tensors, counts = reply()
            if sum(counts) != len(tensors) or len(counts) != len(requests):
                raise CommunicationError("the dealer's answer does not match the batch", peer="dealer")
            return _per_request(tensors, counts)
        return split

    def request(self, requests: Sequence[Request]) -> Callable[[], list[torch.Tensor]]:
        """Send a batch; returns a function that waits for (and returns) the corrections."""
        reply = self._call(requests)
        return lambda: reply()[0]

    def batch_proto(self, requests: Sequence[Request]) -> pb.CorrelationBatch:
        """The authenticated batch message for `requests`."""
        session = self.config.session
        protos = [r.to_proto(session) for r in requests]
        return pb.CorrelationBatch(requests=protos,
                                   mac=batch_mac_proto(self._mac_key, session, protos))

    def _call(self, requests: Sequence[Request]) -> Callable[[], tuple[list[torch.Tensor], list[int]]]:
        batch = self.batch_proto(requests)
        call = [self.stub.Correlations.future(batch, timeout=self.config.timeout)]
        decoded: list = []

        def result() -> tuple[list[torch.Tensor], list[int]]:
            if not decoded:  # decode once, then drop the message (with its future)
                decoded.append(self._decode(self._result(call.pop())))
            return decoded[0]
        return result

    def _result(self, future):
        try:
            reply = future.result()
        except grpc.RpcError as e:
            raise CommunicationError(f"the dealer at {self.config.dealer} failed: "
                                     f"{e.code().name}: {e.details()}", peer="dealer") from e
        if reply.error:
            raise CommunicationError(f"the dealer refused: {reply.error}", peer="dealer")
        return reply

    def _decode(self, reply: pb.CorrelationReply) -> tuple[list[torch.Tensor], list[int]]:
        """The reply's tensors (each copied once out of the message, which is then dropped)."""
        tensors = [tensor_from_proto(t, self.config.max_message_bytes) for t in reply.tensors]
        return tensors, list(reply.counts)

    def prepare(self, requests: Sequence[Request]) -> Callable[[], ChunkPuller]:
        """Offline phase: send a whole plan's batch to be prepared (comm/dealer_prefetch.py);
        returns a function that waits for the dealer and returns the batch's ChunkPuller."""
        future = self.stub.Prepare.future(self.batch_proto(requests), timeout=self.config.timeout)
        start = requests[0].counter

        def ready() -> ChunkPuller:
            reply = self._result(future)
            counts = list(reply.chunks)
            if sum(counts) != len(requests) or any(n == 0 for n in counts):
                raise CommunicationError("the dealer's chunks do not match the batch", peer="dealer")
            tensors, first = self._decode(reply.first)  # chunk 0, sent with the reply
            if len(first) != counts[0] or sum(first) != len(tensors):
                raise CommunicationError("the dealer's chunk 0 does not match the batch", peer="dealer")
            return ChunkPuller(counts, lambda chunk: self.pull(start, chunk, counts[chunk]),
                               first=_per_request(tensors, first))
        return ready

    def pull(self, start: int, chunk: int, n: int) -> Callable[[], list[list[torch.Tensor]]]:
        """Pull chunk `chunk` (of `n` requests) of the batch prepared at counter `start`;
        returns a function that waits for it and returns each request's corrections."""
        session = self.config.session
        msg = pb.PullRequest(session=session, start=start, chunk=chunk,
                             mac=pull_mac(self._mac_key, session, start, chunk))
        future = self.stub.Pull.future(msg, timeout=self.config.timeout)

        def answers() -> list[list[torch.Tensor]]:
            tensors, counts = self._decode(self._result(future))
            if len(counts) != n or sum(counts) != len(tensors):
                raise CommunicationError(f"the dealer's chunk {chunk} does not match the batch",
                                         peer="dealer")
            return _per_request(tensors, counts)
        return answers

    def close(self) -> None:
        self.channel.close()
