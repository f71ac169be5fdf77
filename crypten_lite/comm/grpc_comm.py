"""gRPC transport: one server per party; every party subscribes to every peer's messages.

Protocol (see protos/crypten_lite.proto):

1. Every party starts a `Party` server (plus the standard gRPC health service) on its address.
2. Every party calls `Handshake` on every peer, retrying with backoff until the timeout (peers
   may start in any order). Both sides check protocol version, session, world size, claimed
   rank (against the TLS certificate's identity when TLS is on) and configuration digest,
   and exchange ephemeral X25519 keys: the pairwise seed is HKDF(X25519(sk_i, pk_j)).
3. Every party subscribes to every peer: one server-streaming `Subscribe` call, whose request
   carries an HMAC proving the subscriber holds the pair seed (so nobody else can read a
   party's messages to it, even without TLS), and whose answer opens with the server's own
   HMAC of the stream's identity (so frames from anybody else are refused). The server's
   handler thread sends the frames its party queues; the subscriber asks for the next frame
   when it waits for a message (the channel's thread receives and parses it, then wakes the
   waiting thread: one hand-off on the receiving side, where a client stream into the
   server had two more). Messages are split in chunks of CHUNK_BYTES and matched at the
   receiver by (src, seq), never by arrival order.
4. A stream that ends without the closing frame marks the peer dead: the wait on it raises
   CommunicationError at once. A wait has the CRYPTEN_LITE_TIMEOUT deadline: the
   communicator's watchdog thread cancels a read blocked past it (the subscription is then
   gone: the peer counts as failed). After the closing frame no message can follow, so a
   wait for one fails at once too.
5. A party whose script raises sends an abort frame to every peer before closing (seq
   ABORT_SEQ; data: the rank of the party that failed first and its exception's type name,
   never the message, which may hold values): every wait of theirs on it fails at once with
   a CommunicationError naming that party.

Hostile input (tests/integration/test_fuzz.py): a subscription's opening is its one request,
checked before the handler holds a thread; each peer may subscribe once per session (a
replayed opening is refused); the chunks of one message arrive together, so a stream holds
at most one partly assembled message; a peer's frames are read only as its messages are
awaited (gRPC's flow control holds the rest at the sender), so a flooding peer fills no
memory here. Anything refused before authentication touches no session state.
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.thread
import hashlib
import hmac
import logging
import queue
import re
import threading
import time
import weakref
from typing import Callable, Iterator

import grpc
import torch
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from .._proto import crypten_lite_pb2 as pb
from .._proto import crypten_lite_pb2_grpc as pb_grpc
from ..config import Config
from ..errors import CommunicationError, ConfigError
from ..random import KeyPair, pair_info, subkey
from . import serde, streamed
from .communicator import (MAX_TAG_BYTES, OFFLINE_ERROR_TAG, Communicator, offline_error, tag_of,
                           tag_received)
from .mailbox import Mailbox

log = logging.getLogger("crypten_lite.comm")

PROTOCOL_VERSION = 2  # 2: Subscribe (the receiver opens the stream) instead of Stream
CHUNK_BYTES = 1 << 22
MAX_FRAME_BYTES = CHUNK_BYTES + (1 << 16)
BYE_SEQ = (1 << 64) - 1
OPEN_SEQ = (1 << 64) - 2
ABORT_SEQ = (1 << 64) - 3
_ABORT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_. ]{0,100}")
_ABORT_DATA = re.compile(rb"(\d{1,6}) ([A-Za-z_][A-Za-z0-9_. ]{0,100})")
# Servers accept frames of at most one chunk; clients (whose only large replies are the
# dealer's corrections, bounded by the request they made) accept up to 2 GiB.
MAX_REPLY_BYTES = (1 << 31) - 1
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_FRAME_BYTES),
    ("grpc.max_send_message_length", MAX_REPLY_BYTES),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.so_reuseport", 0),
]
CHANNEL_OPTIONS = [(k, MAX_REPLY_BYTES if k == "grpc.max_receive_message_length" else v)
                   for k, v in GRPC_OPTIONS]
# Channels to peers carry handshakes and subscriptions: frames of at most one chunk, each asked
# for by the thread that waits for it and parsed by the channel's thread. A peer's frames are
# read only while one of its messages is awaited, so gRPC may take in up to LOOKAHEAD_BYTES of
# them before (a 16 MiB message then crosses while its receiver is still busy framing its own:
# with gRPC's default window, about one chunk crossed and the rest waited for the read).
# (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, where the waiting thread polls
# and parses itself, was faster for reveal_4 and slower for LeNet b1, CPU-bound: that work
# then no longer overlaps the party's own on the other core. benchmarks, ARCHITECTURE.)
LOOKAHEAD_BYTES = 16 * CHUNK_BYTES
PEER_CHANNEL_OPTIONS = GRPC_OPTIONS + [("grpc.http2.lookahead_bytes", LOOKAHEAD_BYTES)]
WATCH_TICK = 0.25  # seconds between the watchdog's looks at the reads in progress
GONE_READ_SECONDS = 10.0  # a send to a departed peer reads its stream this long for its abort frame


def make_hello(config: Config, rank: int, public_key: bytes) -> pb.Hello:
    """This endpoint's Hello for the session described by `config`."""
    return pb.Hello(protocol_version=PROTOCOL_VERSION, session=config.session,
                    world_size=config.world_size, rank=rank,
                    config_digest=config.digest(), public_key=public_key)


# Refusals by which a party knows its peer's configuration differs (not an impostor's rank or
# key): a party that gives one stops waiting for that peer (see handshake()).
_CONFIG_REFUSALS = ("protocol version", "session", "world size", "configuration digest")


def check_hello(mine: pb.Hello, theirs: pb.Hello, identity: str | None, dealer: bool = False) -> str:
    """Why `theirs` is refused by an endpoint whose own Hello is `mine` ('' if accepted).

    The peer's identity is checked first: with TLS, a Hello whose claimed rank is not the
    certificate's is refused for that alone, so every other refusal (session, digest...)
    concerns the authenticated party and may be recorded against it (see hello_origin)."""
    limit = mine.world_size if dealer else theirs.world_size
    if identity is not None:
        if identity != f"party{theirs.rank}":
            return (f"certificate identity {identity!r} does not match claimed rank {theirs.rank} "
                    "(each party must use its own party{rank} certificate)")
        if not 0 <= theirs.rank < mine.world_size or (not dealer and theirs.rank == mine.rank):
            return f"certificate identity {identity!r} is not another party of this session"
    if theirs.protocol_version != mine.protocol_version:
        return (f"protocol version {theirs.protocol_version} != {mine.protocol_version}: "
                "run the same crypten_lite version everywhere")
    if theirs.session != mine.session:
        return f"session {theirs.session!r} != {mine.session!r}: set the same CRYPTEN_LITE_SESSION"
    if theirs.world_size != mine.world_size:
        return (f"world size {theirs.world_size} != {mine.world_size}: "
                "set the same CRYPTEN_LITE_WORLD_SIZE everywhere")
    if theirs.config_digest != mine.config_digest:
        return ("configuration digest differs (precision, provider, truncation, protocol or TLS): "
                "use the same CRYPTEN_LITE_* settings on every party")
    if not 0 <= theirs.rank < limit or (not dealer and theirs.rank == mine.rank):
        return f"claimed rank {theirs.rank} is invalid here"
    if len(theirs.public_key) != 32:
        return "malformed public key"
    return ""


def hello_origin(theirs: pb.Hello, identity: str | None) -> str:
    """Who a refused Hello is recorded against: the authenticated party with TLS, else the rank
    it claims, said to be unauthenticated (for log lines and error messages)."""
    if identity is not None:
        return f"{identity} (authenticated by its certificate)"
    return f"the peer claiming rank {theirs.rank} (unauthenticated: TLS is off)"


def stream_token(seed: bytes, session: str, src: int, dst: int) -> bytes:
    """HMAC proving a stream from `src` to `dst` comes from the holder of their pair seed
    (under the seed's own stream-token key, never the zero-sharing key): the first frame of
    `src`'s answer to `dst`'s subscription."""
    return hmac.new(subkey(seed, "stream-token"), f"stream/{session}/{src}->{dst}".encode(),
                    hashlib.sha256).digest()


def subscribe_token(seed: bytes, session: str, subscriber: int, server: int) -> bytes:
    """HMAC proving a subscription to `server`'s messages comes from `subscriber`, the holder
    of their pair seed (another label than stream_token's: neither can stand for the other)."""
    return hmac.new(subkey(seed, "stream-token"), f"subscribe/{session}/{subscriber}<-{server}".encode(),
                    hashlib.sha256).digest()


class TlsContext:
    """TLS material of one endpoint, or plaintext when `tls_dir` is empty."""

    def __init__(self, tls_dir: str, identity: str):
        self.enabled = bool(tls_dir)
        if self.enabled:
            from . import tls
            self._tls = tls
            self.material = tls.load(tls_dir, identity)

    def add_port(self, server: grpc.Server, address: str) -> int:
        if self.enabled:
            return server.add_secure_port(address, self._tls.server_credentials(self.material))
        return server.add_insecure_port(address)

    def channel(self, address: str, identity: str, options: list | None = None) -> grpc.Channel:
        """A channel to `address` (dialed as the role `identity`); `options` default to
        CHANNEL_OPTIONS."""
        options = CHANNEL_OPTIONS if options is None else options
        if self.enabled:
            options = options + list(self._tls.channel_options(identity))
            return grpc.secure_channel(address, self._tls.channel_credentials(self.material), options)
        return grpc.insecure_channel(address, options)

    def reply(self, request: pb.Hello, hello: pb.Hello, error: str = "") -> pb.HelloReply:
        """The answer to `request`: this endpoint's `hello`, and with TLS (when accepted) its
        certificate and signature of the handshake transcript (tls.sign_reply)."""
        if not self.enabled or error:
            return pb.HelloReply(hello=hello, error=error)
        return pb.HelloReply(hello=hello, certificate=self.material.cert,
                             signature=self._tls.sign_reply(self.material, request, hello))

    def verify(self, request: pb.Hello, reply: pb.HelloReply, identity: str) -> None:
        """Client side: with TLS, refuse a reply not signed by the holder of `identity`'s
        certificate (tls.verify_reply), whatever the SANs the TLS stack matched."""
        if self.enabled:
            self._tls.verify_reply(self.material, identity, request, reply)

    def peer_identity(self, context: grpc.ServicerContext) -> str | None:
        """The peer's certificate identity (party{r} / dealer); None only when TLS is off.

        With TLS on, a peer without a client certificate, or whose certificate does not name
        exactly one valid identity, is refused here (PERMISSION_DENIED; context.abort raises),
        so the `identity is not None and ...` checks of the servicers are skipped only
        without TLS."""
        if not self.enabled:
            return None
        identity = self._tls.peer_identity(context)
        if identity is None:
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          "refusing the connection: TLS is on and the peer presented no client "
                          "certificate")
        return identity


class _DaemonThreadPool(concurrent.futures.ThreadPoolExecutor):
    """Server worker threads that never hold the interpreter at exit.

    A handler may still be reading a peer's stream when the party exits (the peer is slow to
    close, or gone without a reset); the standard pool's threads are joined at exit without a
    deadline, which would hang the process. Here they are daemons: exit closes them.
    """

    def _adjust_thread_count(self) -> None:
        if self._idle_semaphore.acquire(timeout=0):
            return

        def wake(_, q=self._work_queue):
            q.put(None)
        if len(self._threads) < self._max_workers:
            thread = threading.Thread(
                name=f"crypten-lite-grpc_{len(self._threads)}", daemon=True,
                target=concurrent.futures.thread._worker,
                args=(weakref.ref(self, wake), self._work_queue, self._initializer, self._initargs))
            thread.start()
            self._threads.add(thread)


def start_server(address: str, tls: TlsContext, register, what: str) -> grpc.Server:
    """A gRPC server with health checking bound to `address`; clear error if the port is taken."""
    server = grpc.server(_DaemonThreadPool(max_workers=32), options=GRPC_OPTIONS)
    register(server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    try:
        port = tls.add_port(server, address)
    except RuntimeError as e:
        port = 0
        cause: Exception | None = e
    else:
        cause = None
    if port == 0:
        raise ConfigError(f"{what} cannot listen on {address}: the port is in use or the address "
                          "is not local; pick a free port or stop the other process") from cause
    server.start()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    return server


# An unreachable peer is named on stderr within seconds, then again until the deadline.
WAIT_FIRST_NOTICE = 5.0
WAIT_NOTICE_EVERY = 10.0


def handshake(stub, hello: pb.Hello, timeout: float, target: str, who: str,
              refused: Callable[[], str] | None = None, tls: TlsContext | None = None,
              identity: str = "") -> pb.Hello:
    """Call Handshake on `target`, retrying with backoff until `timeout`; returns its Hello.

    `refused()` (if given) says why this party already refused that peer's own handshake
    (a configuration that differs): then the peer cannot join, so waiting for it stops at once.
    With `tls` on, the reply must be signed by the holder of `identity`'s certificate (the
    role dialed: ``party1``, ``dealer``), see TlsContext.verify.
    """
    deadline = time.monotonic() + timeout
    delay = 0.05
    last = ""
    last_error: grpc.RpcError | None = None
    say_at = time.monotonic() + WAIT_FIRST_NOTICE  # then every WAIT_NOTICE_EVERY seconds
    while True:
        why = refused() if refused is not None else ""
        if why:
            raise ConfigError(f"this party refused {who}'s handshake: {why}")
        remaining = deadline - time.monotonic()
        if last and remaining > 0 and time.monotonic() >= say_at:
            say_at = time.monotonic() + WAIT_NOTICE_EVERY
            log.warning("party %d: waiting for %s at %s ... (%s); giving up in %.0f s",
                        hello.rank, who, target, last.split(":")[0], remaining)
        if remaining <= 0:
            if last_error is not None:
                from . import tls
                if tls._classify(last_error) in ("handshake", "closed"):
                    raise tls.explain(last_error, who, target) from last_error
            raise CommunicationError(
                f"{who} is unreachable at {target} after {timeout:g} s ({last}); check the address "
                "in CRYPTEN_LITE_PARTIES / CRYPTEN_LITE_DEALER and that the process is running",
                peer=target)
        try:
            reply = stub.Handshake(hello, timeout=min(remaining, 5.0))
        except grpc.RpcError as e:
            code = e.code()
            last, last_error = f"{code.name}: {e.details()}", e
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
                delay = min(delay * 2, 1.0)
                continue
            raise CommunicationError(f"{who} at {target} refused the connection: {last}", peer=target) from e
        if reply.error:
            raise ConfigError(f"{who} at {target} refused this party: {reply.error}")
        if tls is not None:
            tls.verify(hello, reply, identity)
        return reply.hello


class _PartyServicer(pb_grpc.PartyServicer):
    """Thin glue: validates frames and delivers whole messages to the mailbox."""

    def __init__(self, comm: "GrpcCommunicator"):
        self.comm = comm

    def Handshake(self, request, context):
        identity = self.comm.tls.peer_identity(context)
        error = check_hello(self.comm.hello, request, identity)
        if error:
            log.warning("party %d refused a handshake from %s: %s", self.comm.rank,
                        hello_origin(request, identity), error)
            if error.startswith(_CONFIG_REFUSALS) and 0 <= request.rank < self.comm.world_size:
                # The peer runs another configuration: the session cannot start, so this
                # party's own wait for it ends at once as well. check_hello checked the
                # identity first, so with TLS this is the authenticated party's rank; without
                # TLS the rank is only claimed, and the message says so.
                if identity is None:
                    error += f" (from {hello_origin(request, identity)})"
                self.comm.refused.setdefault(int(request.rank), error)
        if (not error or error.startswith(_CONFIG_REFUSALS)) and 0 <= request.rank < self.comm.world_size:
            self.comm.greeted_by.add(int(request.rank))
        return self.comm.tls.reply(request, self.comm.hello, error)

    def Subscribe(self, request, context):
        """Stream this party's messages to the authenticated subscriber (a generator: gRPC's
        handler thread sends what it yields; see _Outbox.frames)."""
        try:
            peer = self._open(request, context)
        except CommunicationError as e:  # refused before authentication: no session state touched
            context.abort(grpc.StatusCode.PERMISSION_DENIED, str(e))
        yield from self.comm.outboxes[peer].frames(context)

    def _open(self, frame: pb.Frame, context) -> int:
        """The rank of the subscriber that `frame` (the subscription's request) authenticates."""
        comm = self.comm
        src = frame.src
        if frame.session != comm.config.session or frame.seq != OPEN_SEQ:
            raise CommunicationError("subscription does not start with a valid opening frame")
        # A peer may subscribe before this party has finished its own handshakes.
        comm.seeds_ready.wait(comm.config.timeout)
        if not 0 <= src < comm.world_size or src == comm.rank or src not in comm.pair_seeds:
            raise CommunicationError(f"subscription from unknown party {src}")
        identity = comm.tls.peer_identity(context)
        if identity is not None and identity != f"party{src}":
            raise CommunicationError(f"certificate {identity!r} cannot subscribe as party {src}")
        expected = subscribe_token(comm.pair_seeds[src], comm.config.session, src, comm.rank)
        if not hmac.compare_digest(bytes(frame.data), expected):
            raise CommunicationError(f"subscription claiming party {src} failed authentication")
        with comm._lock:
            # One subscription per peer and session: an opening replayed by an observer of a
            # plaintext network must not open a second one (nor a new one after a failure).
            if src in comm.streams_opened:
                raise CommunicationError(f"party {src} already subscribed in this session")
            comm.streams_opened.add(src)
        return src


class _Inbox:
    """This party's subscription to one peer's messages, read by the thread that waits for
    one (the channel's thread only receives and parses the frame it asked for)."""

    # takes the chunks of a streamed opening; a class default too, for inboxes made without
    # __init__ (benchmarks/profile_reveal.py parses frames through one)
    sink: "streamed.SumSink | None" = None

    def __init__(self, comm: "GrpcCommunicator", peer: int, method):
        self.comm = comm
        self.peer = peer
        self.lock = threading.Lock()
        self.partial: dict = {}
        self.opened = False  # the server's stream token was checked
        self.live = True  # frames may still come (no goodbye, no failure)
        self.deadline = 0.0  # of the read in progress (0: none); the watchdog's to check
        self.timed_out = False
        self.sink = None
        token = subscribe_token(comm.pair_seeds[peer], comm.config.session, comm.rank, peer)
        self.call = method(pb.Frame(session=comm.config.session, src=comm.rank, seq=OPEN_SEQ,
                                    data=token))

    def read(self) -> None:
        """Read and handle the peer's next frame (blocking until it comes, the stream ends or
        the watchdog cancels the read at its deadline); a message it completes goes to the
        mailbox, an end or a failure is recorded there (and self.live becomes False)."""
        comm, src = self.comm, self.peer
        try:
            frame = next(self.call)
        except StopIteration:
            self._end("connection lost")
            return
        except grpc.RpcError as e:
            if self.timed_out:
                self._end(f"no message within {comm.config.timeout:g} s (CRYPTEN_LITE_TIMEOUT)")
            elif e.code() == grpc.StatusCode.INTERNAL and "deserializ" in (e.details() or ""):
                self._end("sent an invalid message: a frame that does not parse")
            else:
                self._end(f"stream from it failed: {e.code().name}")
            return
        try:
            if not self.opened:
                self._check_open(frame)
            elif frame.seq == BYE_SEQ:
                self.live = False
                comm.mailbox.closed(src)
            elif frame.seq == ABORT_SEQ:
                self._abort(frame)
            else:
                self._accept(src, frame, self.partial)
        except CommunicationError as e:
            self._end(f"sent an invalid message: {e}")

    def _end(self, why: str) -> None:
        self.live = False
        self.comm.mailbox.fail(self.peer, why)
        self.call.cancel()

    def _check_open(self, frame) -> None:
        comm, src = self.comm, self.peer
        if frame.session != comm.config.session or frame.seq != OPEN_SEQ or frame.src != src:
            raise CommunicationError("stream does not start with a valid opening frame")
        expected = stream_token(comm.pair_seeds[src], comm.config.session, src, comm.rank)
        if not hmac.compare_digest(bytes(frame.data), expected):
            raise CommunicationError(f"stream claiming party {src} failed authentication")
        self.opened = True

    def _abort(self, frame) -> None:
        src = self.peer
        if frame.src != src or frame.session != self.comm.config.session:
            raise CommunicationError("frame changes sender or session within a stream")
        match = _ABORT_DATA.fullmatch(bytes(frame.data))
        if match is None:
            raise CommunicationError("malformed abort frame")
        origin, error = int(match.group(1)), match.group(2).decode()
        log.info("party %d: party %d stops because party %d failed: %s",
                 self.comm.rank, src, origin, error)
        self.comm.mailbox.abort(src, origin, error)

    def _accept(self, src: int, frame: pb.Frame, partial: dict) -> None:
        if frame.src != src or frame.session != self.comm.config.session:
            raise CommunicationError("frame changes sender or session within a stream")
        shape = tuple(frame.shape)
        tag = bytes(frame.tag)
        if len(tag) > MAX_TAG_BYTES:
            raise CommunicationError(f"message {frame.seq} has a tag of {len(tag)} bytes")
        nbytes = serde.check_header(frame.dtype, shape, self.comm.config.max_message_bytes)
        expected_chunks = max(1, -(-nbytes // CHUNK_BYTES))
        if frame.num_chunks != expected_chunks or frame.chunk >= expected_chunks:
            raise CommunicationError(f"inconsistent chunking in message {frame.seq}")
        sink = self.sink if self.sink is not None and self.sink.seq == frame.seq else None
        if frame.chunk == 0:
            if frame.seq in partial:
                raise CommunicationError(f"duplicate message {frame.seq}")
            if partial:  # senders queue a message's chunks together: at most one is partial
                raise CommunicationError(f"message {frame.seq} starts before message "
                                         f"{next(iter(partial))} is complete")
            if sink is not None:  # a streamed opening sums the chunks as they come
                sink.first(frame.dtype, shape, tag)
                partial[frame.seq] = (frame.dtype, (shape, tag), sink, 0, 0)
            elif expected_chunks == 1:  # the common case: one copy, straight to a tensor
                if len(frame.data) != nbytes:
                    raise CommunicationError(f"message {frame.seq} does not match its shape")
                self.comm.mailbox.put(src, frame.seq,
                                      _tagged(serde.from_bytes(frame.dtype, shape, frame.data), tag))
                return
            else:
                # Chunks are copied once, into one buffer of the announced size (not zero-filled
                # first: every byte of it is written by a chunk before it is read).
                partial[frame.seq] = (frame.dtype, (shape, tag), serde.payload_buffer(nbytes), 0, 0)
        if frame.seq not in partial:
            raise CommunicationError(f"chunk of unknown message {frame.seq}")
        dtype, first_shape, buffer, received, size = partial[frame.seq]
        if frame.chunk != received or frame.dtype != dtype or first_shape != (shape, tag):
            raise CommunicationError(f"inconsistent chunk in message {frame.seq}")
        n = len(frame.data)
        if size + n > nbytes or (frame.chunk < expected_chunks - 1 and n != CHUNK_BYTES):
            raise CommunicationError(f"message {frame.seq} does not match its shape")
        if isinstance(buffer, streamed.SumSink):
            buffer.take(frame.chunk, frame.data)
        else:
            buffer.data[size:size + n] = frame.data
        partial[frame.seq] = (dtype, first_shape, buffer, received + 1, size + n)
        if received + 1 == expected_chunks:
            del partial[frame.seq]
            if size + n != nbytes:
                raise CommunicationError(f"message {frame.seq} is shorter than its shape")
            if isinstance(buffer, streamed.SumSink):
                self.comm.mailbox.skip(src, frame.seq)
                buffer.done = True
            else:
                self.comm.mailbox.put(src, frame.seq, _tagged(buffer.tensor(dtype, shape), tag))


def _tagged(tensor: torch.Tensor, tag: bytes) -> torch.Tensor:
    """A received tensor carrying its header's tag (communicator.tag_of). The tensor was just
    made from the frame and nothing else holds it, so it carries the tag itself (with_tag's
    new tensor object is for a caller's tensor); `tag` is bytes, its length checked."""
    return tag_received(tensor, tag) if tag else tensor


class _RawFrame:
    """A received Frame whose payload is a view into gRPC's buffer (no protobuf copy)."""

    __slots__ = ("session", "src", "seq", "dtype", "shape", "chunk", "num_chunks", "data", "tag")


def _read_varint(raw: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(raw) or shift > 63:
            raise ValueError("truncated varint")
        byte = raw[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


# Frames up to this size are parsed and built by protobuf whole (its copy of a small payload
# costs less than finding the payload's field in Python: about 1 us instead of 30 per frame).
SMALL_FRAME_BYTES = 1 << 16


def _parse_frame(raw: bytes) -> _RawFrame:
    """Frame from the wire: header fields by protobuf, field 8 (data) as a memoryview."""
    if len(raw) <= SMALL_FRAME_BYTES:
        return _frame_view(pb.Frame.FromString(raw), None)
    i, start, end = 0, -1, -1
    while i < len(raw):
        key, i = _read_varint(raw, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, i = _read_varint(raw, i)
        elif wire == 2:
            length, j = _read_varint(raw, i)
            if field == 8:
                start, end = j, j + length
            i = j + length
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError("unsupported wire type")
        if i > len(raw):
            raise ValueError("truncated field")
    header = pb.Frame.FromString(raw if start < 0 else raw[:start - 1 - _varint_len(end - start)] + raw[end:])
    return _frame_view(header, memoryview(raw)[start:end] if start >= 0 else memoryview(b""))


def _frame_view(header: pb.Frame, data: memoryview | None) -> _RawFrame:
    """A _RawFrame of `header`'s fields; its payload `data` (default: header.data's)."""
    frame = _RawFrame()
    frame.session, frame.src, frame.seq, frame.dtype = header.session, header.src, header.seq, header.dtype
    frame.shape, frame.chunk, frame.num_chunks = tuple(header.shape), header.chunk, header.num_chunks
    frame.tag = header.tag
    frame.data = memoryview(header.data) if data is None else data
    return frame


def _varint_len(n: int) -> int:
    return len(_varint(n))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


_DATA_TAG = bytes([(8 << 3) | 2])  # Frame.data: field 8, length-delimited


def _frame_bytes(header: pb.Frame, payload: memoryview) -> bytes:
    """A Frame on the wire with one copy of the payload: header fields, then field 8 (data).

    The payload (a view of the tensor's memory) is copied once, here, instead of once into a
    bytes slice and once more by protobuf. A small one is copied by protobuf (faster there).
    """
    if len(payload) <= SMALL_FRAME_BYTES // 2:
        header.data = bytes(payload)
        return header.SerializeToString()
    return b"".join((header.SerializeToString(), _DATA_TAG, _varint(len(payload)), payload))


def _serialize_frame(item: bytes) -> bytes:
    """Response serializer of the Subscribe call: frames are queued already serialized."""
    return item


def _add_party_servicer(servicer: "_PartyServicer", server: grpc.Server) -> None:
    """Register the Party service (its subscription's frames are queued serialized)."""
    handlers = {
        "Handshake": grpc.unary_unary_rpc_method_handler(
            servicer.Handshake, request_deserializer=pb.Hello.FromString,
            response_serializer=pb.HelloReply.SerializeToString),
        "Subscribe": grpc.unary_stream_rpc_method_handler(
            servicer.Subscribe, request_deserializer=pb.Frame.FromString,
            response_serializer=_serialize_frame),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("crypten_lite.Party", handlers),))


class _Outbox:
    """This party's messages to one peer, queued for the handler of that peer's subscription
    (sending never waits for the peer; messages queued before it subscribes wait for it)."""

    def __init__(self, comm: "GrpcCommunicator", peer: int):
        self.peer = peer
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.seq = 0
        self.failed = ""
        self.finished = False  # the goodbye went out: the subscription may end
        self.subscribed = False  # the peer's subscription reached the handler
        self.done = threading.Event()  # the subscription's handler is over (or never will run)
        token = stream_token(comm.pair_seeds[peer], comm.config.session, comm.rank, peer)
        self.queue.put([pb.Frame(session=comm.config.session, src=comm.rank, seq=OPEN_SEQ,
                                 data=token).SerializeToString()])

    def frames(self, context) -> Iterator[bytes]:
        """The serialized frames of the subscription, as they are queued (the handler thread
        of the peer's Subscribe call runs this)."""
        self.subscribed = True
        context.add_callback(self._ended)
        try:
            while True:
                batch = self.queue.get()
                if batch is None:
                    self.finished = True
                    return
                yield from batch
        finally:
            self.done.set()

    def _ended(self) -> None:
        """The subscription is over (gRPC's callback): a peer that went away before this
        party's goodbye can receive nothing more."""
        if not self.finished:
            self.failed = "its subscription to this party ended"
        self.done.set()

    def send(self, session: str, src: int, tensor: torch.Tensor) -> None:
        if self.failed:
            raise CommunicationError(f"party {src}: cannot send to party {self.peer} ({self.failed})",
                                     peer=self.peer)
        dtype, shape, data = serde.to_bytes(tensor)
        tag = tag_of(tensor)  # the shapes it carries, checked by the receiving protocol
        n = max(1, -(-len(data) // CHUNK_BYTES))
        # Copy-on-send: the frames are serialized now, on the caller's thread, so what the
        # peer receives is the tensor as it was at this call even if the caller changes it in
        # place next (the handler thread sends later). It is the one copy serialization
        # makes anyway (tests/integration/test_copy_on_send.py). Each chunk is queued as soon
        # as it is copied, so the stream sends chunk i while chunk i + 1 is being copied.
        for i in range(n):
            header = pb.Frame(session=session, src=src, seq=self.seq, dtype=dtype, shape=shape,
                              chunk=i, num_chunks=n, tag=tag)
            self.queue.put([_frame_bytes(header, data[i * CHUNK_BYTES:(i + 1) * CHUNK_BYTES])])
        self.seq += 1

    def abort(self, session: str, src: int, origin: int, error: str) -> None:
        data = f"{origin} {error}".encode()
        self.queue.put([pb.Frame(session=session, src=src, seq=ABORT_SEQ, data=data).SerializeToString()])

    def close(self, session: str, src: int, timeout: float, unsubscribed_timeout: float) -> None:
        """Queue the goodbye and wait until the handler has sent everything: up to `timeout`
        while the peer is subscribed (it takes this party's last messages as it reads them;
        a peer that goes away ends the wait at once), `unsubscribed_timeout` if it never
        subscribed (it may be gone before it could)."""
        self.queue.put([pb.Frame(session=session, src=src, seq=BYE_SEQ).SerializeToString()])
        self.queue.put(None)
        self.done.wait(unsubscribed_timeout)
        if self.subscribed:
            self.done.wait(timeout)


def _is_loopback(address: str) -> bool:
    host = address.rpartition(":")[0].strip("[]") if ":" in address else address
    return host in ("localhost", "::1") or host.startswith("127.")


def warn_plaintext(who: str, addresses: list[str]) -> bool:
    """Warn (and return True) when TLS is off and any of `addresses` (the address this
    endpoint binds to, and the ones it dials) is not loopback: a bind to 0.0.0.0 or to a LAN
    address exposes the endpoint in plaintext even when every peer is local."""
    exposed = [a for a in addresses if a and not _is_loopback(a)]
    if exposed:
        log.warning("%s: TLS is off (CRYPTEN_LITE_TLS_DIR unset) on a non-loopback network (%s): "
                    "traffic is unauthenticated and readable; run `crypten-lite certs`, or bind "
                    "to 127.0.0.1 (CRYPTEN_LITE_BIND)", who, ", ".join(exposed))
    return bool(exposed)


class GrpcCommunicator(Communicator):
    """Communicator over gRPC between the parties listed in `config.parties`."""

    def __init__(self, config: Config, keypair: KeyPair | None = None):
        super().__init__(config.rank, config.world_size)
        if len(config.parties) != config.world_size:
            raise ConfigError("CRYPTEN_LITE_PARTIES must list one host:port per party, in rank order")
        self.config = config
        self.keypair = keypair or KeyPair()
        self.tls = TlsContext(config.tls_dir, f"party{config.rank}")
        self.hello = make_hello(config, config.rank, self.keypair.public_bytes)
        self.mailbox = Mailbox(config.rank, config.world_size, config.timeout)
        self.pair_seeds: dict[int, bytes] = {}
        self.seeds_ready = threading.Event()
        self.streams_opened: set[int] = set()
        self._closed = False
        self._aborted = False
        self._stop_watch = threading.Event()
        self._lock = threading.Lock()
        self.refused: dict[int, str] = {}  # peer rank -> why its handshake was refused
        self.greeted_by: set[int] = set()  # peers whose Hello this server answered (either way)
        own = config.parties[config.rank]
        bind = config.bind or own
        if ":" not in bind:
            bind = f"{bind}:{own.rpartition(':')[2]}"
        if not self.tls.enabled:
            warn_plaintext(f"party {config.rank}", [bind, *config.parties])
        self.server = start_server(bind, self.tls,
                                   lambda s: _add_party_servicer(_PartyServicer(self), s),
                                   f"party {config.rank}")
        try:
            self._connect()
        except BaseException:
            self.server.stop(grace=None)
            raise

    def _connect(self) -> None:
        self.channels = {p: self.tls.channel(self.config.parties[p], f"party{p}", PEER_CHANNEL_OPTIONS)
                         for p in self.peers()}
        stubs = {p: pb_grpc.PartyStub(ch) for p, ch in self.channels.items()}
        subscribe = {p: ch.unary_stream("/crypten_lite.Party/Subscribe",
                                        request_serializer=pb.Frame.SerializeToString,
                                        response_deserializer=_parse_frame)
                     for p, ch in self.channels.items()}

        # Once one handshake failed the session cannot start, but this party stays until every
        # peer has heard from it (a reply to this party's Hello, or the peer's Hello answered
        # here; each within the deadline): a peer that joins late then learns the refusal
        # itself instead of waiting for a party that already left until its timeout.
        given_up = threading.Event()

        def why_stop(peer: int) -> str:
            if self.refused.get(peer):
                return self.refused[peer]
            if given_up.is_set() and peer in self.greeted_by:
                return "another handshake of this party failed"
            return ""

        def greet(peer: int) -> tuple[int, bytes]:
            theirs = handshake(stubs[peer], self.hello, self.config.timeout,
                               self.config.parties[peer], f"party {peer}",
                               refused=lambda: why_stop(peer), tls=self.tls,
                               identity=f"party{peer}")
            error = check_hello(self.hello, theirs, None)
            if error or theirs.rank != peer:
                raise ConfigError(f"party at {self.config.parties[peer]} is not a valid party {peer}: "
                                  f"{error or f'it claims rank {theirs.rank}'}; check CRYPTEN_LITE_PARTIES")
            info = pair_info(self.config.session, self.rank, peer)
            return peer, self.keypair.shared_seed(theirs.public_key, info)

        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(stubs))) as pool:
            futures = [pool.submit(greet, peer) for peer in self.peers()]
            try:  # the first failure, whichever peer it concerns, is raised (after the others)
                for future in concurrent.futures.as_completed(futures):
                    peer, seed = future.result()
                    self.pair_seeds[peer] = seed
            except BaseException:
                given_up.set()
                raise
        self.outboxes = {p: _Outbox(self, p) for p in self.peers()}
        self.seeds_ready.set()
        self.inboxes = {p: _Inbox(self, p, subscribe[p]) for p in self.peers()}
        self._watchdog = threading.Thread(target=self._watch, name="crypten-lite-deadlines", daemon=True)
        self._watchdog.start()

    def _watch(self) -> None:
        """Cancel a read blocked past its deadline (a blocked read has no timeout of its own)."""
        tick = min(WATCH_TICK, self.config.timeout / 20)
        while not self._stop_watch.wait(tick):
            now = time.monotonic()
            for inbox in self.inboxes.values():
                deadline = inbox.deadline
                if deadline and now > deadline and not inbox.timed_out:
                    inbox.timed_out = True
                    inbox.call.cancel()

    def _send(self, tensor: torch.Tensor, dst: int) -> None:
        self._outbox(dst).send(self.config.session, self.rank, tensor)

    def _outbox(self, dst: int) -> "_Outbox":
        """The outbox to `dst`; where `dst` went away first, the failure its own stream names
        is raised (_why_gone) before the outbox's own "cannot send"."""
        outbox = self.outboxes[dst]
        if outbox.failed:
            self._why_gone(dst)
        return outbox

    def _why_gone(self, dst: int) -> None:
        """`dst`'s subscription to this party ended: read what `dst`'s own stream still holds
        before this send fails, since a party that failed (or stopped because another did) sent
        an abort frame naming the party that failed first. Without this, a party whose next
        operation was a send blamed the peer's departure, and `launch` then named the wrong
        party first. Raises that account when there is one; otherwise returns (the send fails
        as before)."""
        inbox, mailbox = self.inboxes[dst], self.mailbox
        if not inbox.lock.acquire(timeout=self.config.timeout):
            return
        try:
            inbox.deadline = time.monotonic() + min(self.config.timeout, GONE_READ_SECONDS)
            try:
                while inbox.live and mailbox.failure(dst) is None:
                    inbox.read()
            finally:
                inbox.deadline = 0.0
        finally:
            inbox.lock.release()
        reason = mailbox.failure(dst)
        if reason is not None and reason.startswith(("failed: ", "stopped because")):
            origin = mailbox.origin(dst)[0]
            raise CommunicationError(f"party {self.rank}: cannot send to party {dst}: party {dst} "
                                     f"{reason}; see party {origin}'s output for the cause", peer=dst)

    def _recv(self, src: int) -> torch.Tensor:
        inbox, mailbox = self.inboxes[src], self.mailbox
        sink = inbox.sink
        if sink is not None and sink.thread == threading.get_ident():
            # on_range of a streamed opening (whose read holds inbox.lock) may not wait for
            # this peer: the message would come after the opening's own chunks
            raise CommunicationError(f"party {self.rank}: a receive from party {src} inside a "
                                     "streamed opening's on_range (it would wait forever); "
                                     "receive before or after the opening", peer=src)
        with inbox.lock:
            if inbox.live and not mailbox.ready(src):
                inbox.deadline = time.monotonic() + self.config.timeout
                try:
                    while inbox.live and not mailbox.ready(src):
                        inbox.read()
                finally:
                    inbox.deadline = 0.0
        return mailbox.take(src)

    def sum_streamed(self, shape, tag: bytes, fill, on_range=None, mismatch=None) -> torch.Tensor | None:
        """Communicator.sum_streamed, streamed chunk by chunk between two parties (frames
        filled in place, the peer's chunks summed as they come: comm/streamed.py); None for
        more parties, a rider, or a message below streamed.STREAM_MIN_BYTES."""
        shape = tuple(int(d) for d in shape)
        numel = 1
        for d in shape:
            numel *= d
        if (self.world_size != 2 or self.rider is not None or self.rss_rider is not None
                or len(shape) > serde.MAX_DIMS or not streamed.STREAM_MIN_BYTES <= numel * 8
                or numel * 8 > self.config.max_message_bytes):
            return None
        peer = 1 - self.rank
        outbox = self._outbox(peer)
        self._stats["rounds"] += 1
        self._stats["bytes_sent"] += numel * 8
        self._stats["messages"] += 1
        mine = streamed.send_filled(outbox, self.config.session, self.rank, shape, tag,
                                    fill, CHUNK_BYTES)
        total = torch.empty(shape, dtype=torch.int64)
        sink = streamed.SumSink(-1, shape, tag, mine, total.view(-1), on_range, CHUNK_BYTES)
        start = time.perf_counter()
        try:
            self._recv_into(peer, sink)
        finally:
            self._stats["seconds"] += time.perf_counter() - start
        self._stats["bytes_received"] += numel * 8
        if sink.mismatch is not None:
            if sink.mismatch[2] == OFFLINE_ERROR_TAG:  # the peer's offline exchange failed
                raise offline_error(self.rank, peer)
            if mismatch is not None:
                raise mismatch(peer, *sink.mismatch)
            raise CommunicationError(f"party {self.rank}: party {peer} sent a message of shape "
                                     f"{sink.mismatch[0]} ({sink.mismatch[1]}) where this party sent "
                                     f"{shape} (int64); the parties' programs diverged", peer=peer)
        if sink.error is not None:
            raise sink.error
        return total

    def _recv_into(self, src: int, sink: "streamed.SumSink") -> None:
        """_recv for a streamed opening: the peer's next message goes to `sink` chunk by chunk
        (or whole, if it is already in the mailbox); a failure raises as _recv's does."""
        inbox, mailbox = self.inboxes[src], self.mailbox
        with inbox.lock:
            if inbox.live and not mailbox.ready(src):
                sink.seq = mailbox.expected(src)
                inbox.sink = sink
                inbox.deadline = time.monotonic() + self.config.timeout
                try:
                    while inbox.live and not sink.done and not mailbox.ready(src):
                        inbox.read()
                finally:
                    inbox.deadline = 0.0
                    inbox.sink = None
        if not sink.done:
            sink.whole(mailbox.take(src))  # already here, or raises (the peer failed or left)

    def abort(self, origin: int, error: str) -> None:
        """Tell every peer that party `origin` failed with `error` (an exception type name).

        Sent once; each peer's waits on this party then fail at once. Call close() after."""
        if not _ABORT_NAME.fullmatch(error):
            error = "an error"
        with self._lock:
            if self._closed or self._aborted:
                return
            self._aborted = True
        for outbox in getattr(self, "outboxes", {}).values():
            outbox.abort(self.config.session, self.rank, origin, error)

    def peer_failure(self, peer: int) -> tuple[int, str] | None:
        return self.mailbox.origin(peer)

    def close(self) -> None:
        # A session that ends after a peer failed (even where the error was caught) ends with an
        # abort naming that first failure, not a plain goodbye: a party still waiting on this
        # one then learns the real cause, whichever of its peers it happens to be waiting on.
        first = self.mailbox.first_failure()
        if first is not None:
            self.abort(*first)
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for outbox in getattr(self, "outboxes", {}).values():
            outbox.close(self.config.session, self.rank, timeout=self.config.timeout,
                         unsubscribed_timeout=min(5.0, self.config.timeout))
        self._stop_watch.set()
        for inbox in getattr(self, "inboxes", {}).values():
            inbox.call.cancel()
        for channel in getattr(self, "channels", {}).values():
            channel.close()
        self.server.stop(grace=1.0).wait(2.0)
