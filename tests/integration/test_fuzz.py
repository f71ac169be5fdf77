"""Hostile and malformed input against live servers (issue 7).

1. Live session. A dealer and two parties run as real processes, in one plaintext session
   (the weakest setting: with TLS, a client without a certificate cannot even connect).
   While the parties idle, at least 10,000 random and mutated frames go to party 1's server,
   and some to party 0's and to the dealer: Handshakes with mutated Hellos (wrong version,
   session, world size, rank, digest, key), random bytes as protobuf, subscriptions whose
   opening frame is wrong (session, sequence number, unknown or own sender, garbage or
   replayed-looking tokens) or is a data frame, empty and oversize requests (none may receive
   a single frame), and for the dealer malformed correlation requests. Then the parties
   compute x * y several times while the fuzzing goes on. Every result must be exact, every
   process alive and healthy, its memory bounded.
2. Authenticated peer. Frames from a fake party 0 that really holds the pair seed (its
   answer to party 1's subscription opens with the right HMAC) reach the frame checks:
   oversize or inconsistent dtype / shape / length, chunk index out of range, duplicated
   sequence numbers, interleaved partial messages, a second opening frame, no goodbye. Each
   case runs against a fresh party 1 (a refused peer is dead for the rest of its session, by
   design): what came before the bad frame is delivered intact, then every wait on that peer
   raises CommunicationError naming it at once; the server survives. The fake's own
   subscription to party 1 cannot be opened twice, nor with the stream's token instead of
   the subscription's.

Figures (frames, rate, memory) are printed as `FUZZ {json}` lines (pytest -s).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import pathlib
import queue
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Callable

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from crypten_lite._proto import crypten_lite_pb2 as pb
from crypten_lite._proto import crypten_lite_pb2_grpc as pb_grpc
from crypten_lite.comm import grpc_comm, serde
from crypten_lite.comm.grpc_comm import (BYE_SEQ, CHUNK_BYTES, GRPC_OPTIONS, OPEN_SEQ,
                                         PROTOCOL_VERSION, GrpcCommunicator, stream_token,
                                         subscribe_token)
from crypten_lite.config import Config
from crypten_lite.errors import CommunicationError
from crypten_lite.mpc.launcher import free_ports, local_env
from crypten_lite.random import KeyPair, pair_info

SEED = int(os.environ.get("FUZZ_SEED", "7"))
TARGET_FRAMES = int(os.environ.get("FUZZ_FRAMES", "10000"))
MAX_MESSAGE_BYTES = 4 << 20  # the session's CRYPTEN_LITE_MAX_MESSAGE_BYTES
RSS_GROWTH_LIMIT = 256 << 20  # per process, over the whole fuzzing
U32, U64, I64 = (1 << 32) - 1, (1 << 64) - 1, (1 << 63) - 1

PARTY_SCRIPT = """
import json, os, sys, time
import torch
import crypten_lite
crypten_lite.init()
rank = crypten_lite.get_rank()
print("ready", flush=True)
go, rounds = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 300
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.05)
results = []
for i in range(rounds):
    x = torch.arange(6, dtype=torch.float64) - 2.5 + i
    y = torch.tensor([1.5, -2.0, 0.25, 3.0, -0.5, 4.0], dtype=torch.float64) * (i + 1)
    ex = crypten_lite.cryptensor(x if rank == 0 else None, src=0)
    ey = crypten_lite.cryptensor(y if rank == 1 else None, src=1)
    z = (ex * ey).get_plain_text()
    results.append(z.tolist())
print("result", json.dumps(results), flush=True)
crypten_lite.uninit()
"""


def expected_results(rounds: int) -> list[list[float]]:
    out = []
    for i in range(rounds):
        x = torch.arange(6, dtype=torch.float64) - 2.5 + i
        y = torch.tensor([1.5, -2.0, 0.25, 3.0, -0.5, 4.0], dtype=torch.float64) * (i + 1)
        out.append((x * y).tolist())
    return out


# --- random and mutated messages --------------------------------------------------------


class Mutator:
    """Random and mutated Hellos, Frames, correlation requests and raw bytes."""

    def __init__(self, rng: random.Random, session: str, digest: str, world_size: int = 2):
        self.rng = rng
        self.session = session
        self.hello = pb.Hello(protocol_version=PROTOCOL_VERSION, session=session,
                              world_size=world_size, rank=0, config_digest=digest,
                              public_key=bytes(32))

    def blob(self, big: bool = False) -> bytes:
        r = self.rng
        n = r.choice([0, 1, 7, 32, 33, r.randint(2, 200), r.randint(200, 5000)])
        if big:
            n = r.choice([n, r.randint(1 << 16, 1 << 20)])
        return r.randbytes(n)

    def text(self) -> str:
        r = self.rng
        return r.choice(["", self.session, self.session + "x", self.session.upper(), "\x00",
                         "é€😀" * r.randint(1, 50), "s" * r.randint(1000, 20000),
                         "".join(chr(r.randint(32, 0x2FFF)) for _ in range(r.randint(1, 40)))])

    def uint(self, top: int) -> int:
        r = self.rng
        return r.choice([0, 1, 2, 3, top, top - 1, top - 2, r.randint(0, 1000), r.randint(0, top)])

    def int64(self) -> int:
        r = self.rng
        return r.choice([0, 1, -1, 2, 3, 16, I64, -I64 - 1, 1 << 20, 1 << 32, 1 << 40,
                         r.randint(-1000, 1000), r.randint(-I64 - 1, I64)])

    def mutated_hello(self) -> pb.Hello:
        h = pb.Hello()
        h.CopyFrom(self.hello)
        h.public_key = self.rng.randbytes(32)
        fields = ["protocol_version", "session", "world_size", "rank", "config_digest",
                  "public_key", "none"]
        for name in self.rng.sample(fields, self.rng.randint(1, 3)):
            if name in ("protocol_version", "world_size", "rank"):
                setattr(h, name, self.uint(U32))
            elif name == "public_key":
                h.public_key = self.rng.choice([b"", bytes(32), b"\x01" + bytes(31), self.blob()])
            elif name != "none":
                setattr(h, name, self.text())
        return h

    def frame(self) -> pb.Frame:
        """A data frame with random, often inconsistent header fields."""
        r = self.rng
        dims = r.choice([0, 1, 2, 3, 17, r.randint(0, 40)])
        return pb.Frame(session=r.choice([self.session, self.text()]), src=self.uint(U32),
                        seq=self.uint(U64), dtype=r.choice(["int64", "float64", "bool", "uint8",
                                                            "int128", "", "float16", self.text()]),
                        shape=[self.int64() for _ in range(dims)], chunk=self.uint(U32),
                        num_chunks=self.uint(U32), data=self.blob(big=r.random() < 0.02))

    def opening(self, src_choices: list[int]) -> pb.Frame:
        """A first frame that must be refused: wrong session, sequence, sender or token."""
        r = self.rng
        f = pb.Frame(session=self.session, src=r.choice(src_choices), seq=OPEN_SEQ,
                     data=r.randbytes(32))
        for what in r.sample(["session", "seq", "src", "token", "header", "none"], r.randint(1, 3)):
            if what == "session":
                f.session = self.text()
            elif what == "seq":
                f.seq = r.choice([0, 1, BYE_SEQ, OPEN_SEQ - 1, self.uint(U64)])
            elif what == "src":
                f.src = self.uint(U32)
            elif what == "token":
                f.data = r.choice([b"", bytes(32), self.blob(), r.randbytes(31), r.randbytes(64)])
            elif what == "header":
                f.dtype, f.shape[:], f.chunk, f.num_chunks = "int64", [3], 0, 1
        return f

    def correlation_batch(self) -> pb.CorrelationBatch:
        """Malformed (or, now and then, well-formed) correlation requests."""
        r = self.rng
        kinds = ["triple", "square", "bit", "binary_triple", "trunc", "trunc_exact", "bit_mul",
                 "binary_monomials", "", "nope", self.text()]
        ops = ["mul", "matmul", "conv1d", "conv2d", "conv_transpose2d", "", "add", self.text()]
        batch = pb.CorrelationBatch()
        for _ in range(r.choice([0, 1, 1, 1, 2, 5, 50])):
            shapes: list[int] = []
            for _ in range(r.choice([0, 1, 2, 2, 3])):
                dims = [self.small_or_impossible_dim() for _ in range(r.choice([0, 1, 2, 3, 4]))]
                prefix = r.choice([len(dims)] * 6 + [self.int64()])
                shapes += [prefix, *dims]
            params = [r.choice([0, 1, 2, 16, 63, 64, 65, -1, self.int64()])
                      for _ in range(r.choice([0, 1, 2, 9, 13, 300]))]
            batch.requests.add(session=r.choice([self.session] * 4 + [self.text()]),
                               kind=r.choice(kinds), counter=self.uint(U64), op=r.choice(ops),
                               shapes=shapes, params=params)
        return batch

    def small_or_impossible_dim(self) -> int:
        # Dimensions are small, negative or impossibly large: sizes in between (a few GiB
        # from broadcasting two in-limit operands) are not refused by the dealer's transport
        # layer yet; see docs/deployment.md, "Hostile input".
        r = self.rng
        return r.choice([0, 1, 2, 3, 5, 8, -1, -(1 << 40), 1 << 18, 1 << 21, 1 << 40, 1 << 62, I64])


# --- sending ----------------------------------------------------------------------------


class Tally:
    """Frames sent and gRPC outcomes, per target and kind (thread-safe)."""

    def __init__(self) -> None:
        self.frames: Counter[str] = Counter()
        self.rpcs: Counter[str] = Counter()
        self.codes: Counter[str] = Counter()
        self.lock = threading.Lock()

    def add(self, kind: str, frames: int, code: str) -> None:
        """Count an RPC; frames only when the server was there to get them."""
        with self.lock:
            if code != "UNAVAILABLE":
                self.frames[kind] += frames
            self.rpcs[kind] += 1
            self.codes[f"{kind}:{code}"] += 1

    @property
    def total(self) -> int:
        return sum(self.frames.values())


def send_subscribe(method: Callable, request, tally: Tally, kind: str, timeout: float = 3.0) -> str:
    """Open a subscription with `request` as its opening; it must be refused without a frame."""
    received = []
    try:
        for frame in method(request, timeout=timeout):
            received.append(frame)
            break
        code = "OK"
    except grpc.RpcError as e:
        code = e.code().name
    assert not received, f"{kind}: an unauthenticated subscription received a frame"
    tally.add(kind, 1, code)
    return code


def send_unary(method: Callable, request, tally: Tally, kind: str, timeout: float = 3.0):
    """The reply, or None on an RPC error."""
    try:
        reply = method(request, timeout=timeout)
        code = "OK"
    except grpc.RpcError as e:
        reply, code = None, e.code().name
    tally.add(kind, 1, code)
    return reply


class Target:
    """Raw stubs (typed and bytes-only) on one server."""

    def __init__(self, address: str):
        self.address = address
        self.channel = grpc.insecure_channel(address, GRPC_OPTIONS)
        self.party = pb_grpc.PartyStub(self.channel)
        self.dealer = pb_grpc.DealerStub(self.channel)
        raw = dict(request_serializer=None, response_deserializer=None)
        self.raw_handshake = self.channel.unary_unary("/crypten_lite.Party/Handshake", **raw)
        self.raw_subscribe = self.channel.unary_stream("/crypten_lite.Party/Subscribe", **raw)
        self.raw_dealer_handshake = self.channel.unary_unary("/crypten_lite.Dealer/Handshake", **raw)
        self.raw_correlations = self.channel.unary_unary("/crypten_lite.Dealer/Correlations", **raw)

    def healthy(self, timeout: float = 3.0) -> bool:
        try:
            reply = health_pb2_grpc.HealthStub(self.channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    def close(self) -> None:
        self.channel.close()


def fuzz_party(target: Target, m: Mutator, tally: Tally, frames: int, self_rank: int,
               stop: threading.Event | None = None) -> None:
    """Mixed hostile traffic at a party server until `frames` frames (or `stop`)."""
    r = m.rng
    start = tally.total
    while tally.total - start < frames and not (stop and stop.is_set()):
        action = r.random()
        if action < 0.15:
            reply = send_unary(target.party.Handshake, m.mutated_hello(), tally, "party.handshake")
            assert reply is None or reply.error or reply.hello.rank == self_rank
        elif action < 0.22:
            send_unary(target.raw_handshake, m.blob(), tally, "party.handshake.bytes")
        elif action < 0.72:
            send_subscribe(target.party.Subscribe, m.opening([0, 1, 2, self_rank]), tally,
                           "party.subscribe.opening")
        elif action < 0.86:
            send_subscribe(target.party.Subscribe, m.frame(), tally, "party.subscribe.frame")
        elif action < 0.97:
            send_subscribe(target.raw_subscribe, m.blob(), tally, "party.subscribe.bytes")
        elif action < 0.985:
            send_subscribe(target.raw_subscribe, b"", tally, "party.subscribe.empty")
        else:  # larger than a frame may be: refused by gRPC before our code sees it
            send_subscribe(target.raw_subscribe, r.randbytes(grpc_comm.MAX_FRAME_BYTES + 1), tally,
                           "party.subscribe.oversize")


def fuzz_dealer(target: Target, m: Mutator, tally: Tally, frames: int) -> None:
    r = m.rng
    for _ in range(frames):
        action = r.random()
        if action < 0.3:
            reply = send_unary(target.dealer.Handshake, m.mutated_hello(), tally, "dealer.handshake")
            # A well-formed Hello for a rank that already joined must not replace its seed.
            assert reply is None or reply.error, "dealer accepted a second handshake for a rank"
        elif action < 0.4:
            send_unary(target.raw_dealer_handshake, m.blob(), tally, "dealer.handshake.bytes")
        elif action < 0.9:
            send_unary(target.dealer.Correlations, m.correlation_batch(), tally, "dealer.correlations")
        else:
            send_unary(target.raw_correlations, m.blob(), tally, "dealer.correlations.bytes")


def rss(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of `pid` in bytes."""
    values = {}
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) * 1024
    return values["VmRSS"], values["VmHWM"]


def report(**figures) -> None:
    print("FUZZ " + json.dumps(figures), flush=True)


# --- 1. live session ---------------------------------------------------------------------


def _wait_for(path: pathlib.Path, text: str, procs: list[subprocess.Popen], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in path.read_text():
        dead = [p.args for p in procs if p.poll() is not None]
        assert not dead, f"{dead} exited: {path.read_text()}"
        assert time.monotonic() < deadline, f"no {text!r} in {path} within {timeout} s"
        time.sleep(0.1)


def test_live_session_survives_hostile_frames(tmp_path):
    rounds = 4
    party_envs, dealer_env = local_env(2, "dealer", timeout=300, extra={
        "CRYPTEN_LITE_MAX_MESSAGE_BYTES": str(MAX_MESSAGE_BYTES)})
    base = {k: v for k, v in os.environ.items() if not k.startswith("CRYPTEN_LITE_")}
    base["PYTHONUNBUFFERED"] = "1"
    script, go = tmp_path / "party.py", tmp_path / "go"
    script.write_text(PARTY_SCRIPT)
    logs = {name: tmp_path / f"{name}.log" for name in ("dealer", "rank0", "rank1")}
    procs: list[subprocess.Popen] = []
    targets: list[Target] = []
    try:
        with open(logs["dealer"], "w") as out:
            procs.append(subprocess.Popen([sys.executable, "-m", "crypten_lite.cli", "dealer"],
                                          env={**base, **dealer_env}, stdout=out, stderr=out))
        for rank in range(2):
            with open(logs[f"rank{rank}"], "w") as out:
                procs.append(subprocess.Popen([sys.executable, str(script), str(go), str(rounds)],
                                              env={**base, **party_envs[rank]}, stdout=out,
                                              stderr=subprocess.STDOUT))
        for rank in range(2):
            _wait_for(logs[f"rank{rank}"], "ready", procs, timeout=300)  # hang guard
        config = Config.from_env(party_envs[0])
        party0, party1 = (Target(a) for a in config.parties)
        dealer = Target(config.dealer)
        targets += [party0, party1, dealer]
        before = {p.pid: rss(p.pid) for p in procs}
        rng = random.Random(SEED)
        m = Mutator(rng, config.session, config.digest())
        tally = Tally()

        start = time.monotonic()
        fuzz_party(party1, m, tally, TARGET_FRAMES, self_rank=1)
        fuzz_party(party0, m, tally, 300, self_rank=0)
        fuzz_dealer(dealer, m, tally, 1000)
        elapsed, first_pass = time.monotonic() - start, tally.total
        unavailable = [k for k in tally.codes if k.endswith(":UNAVAILABLE")]
        assert not unavailable, f"a server went away during the fuzzing: {unavailable}"
        refused = {k: n for k, n in tally.codes.items()
                   if k.startswith("party.subscribe") and not k.endswith(":PERMISSION_DENIED")}
        # Only what gRPC refuses before our code sees it (a request that does not parse, one
        # over the size limit) ends otherwise; nothing is ever accepted.
        assert all(k.endswith((":INTERNAL", ":RESOURCE_EXHAUSTED", ":UNKNOWN")) for k in refused), refused
        for t in targets:
            assert t.healthy(), f"{t.address} is not serving after the fuzzing"
        during = {p.pid: rss(p.pid) for p in procs}  # every process is still up here

        # The session computes correctly while the fuzzing goes on.
        stop = threading.Event()
        background = threading.Thread(target=fuzz_party, args=(party1, Mutator(
            random.Random(SEED + 1), config.session, config.digest()), tally, 10 ** 9, 1, stop))
        background.start()
        go.write_text("go")
        computing = time.monotonic()
        try:
            deadline = computing + 180
            while (not any("result" in logs[f"rank{r}"].read_text() for r in range(2))
                   and all(p.poll() is None for p in procs[1:]) and time.monotonic() < deadline):
                time.sleep(0.02)
        finally:
            stop.set()  # a party has its result: its server is about to go away
            background.join(timeout=30)
        computing = time.monotonic() - computing
        for p in procs[1:]:
            p.wait(timeout=60)
        for rank in range(2):
            text = logs[f"rank{rank}"].read_text()
            assert procs[1 + rank].returncode == 0, text
            line = next(ln for ln in text.splitlines() if ln.startswith("result "))
            got = torch.tensor(json.loads(line[len("result "):]))
            torch.testing.assert_close(got, torch.tensor(expected_results(rounds)),
                                       atol=1e-3, rtol=0)
        assert procs[0].poll() is None and dealer.healthy(), logs["dealer"].read_text()
        after = {**during, **{p.pid: rss(p.pid) for p in procs if p.poll() is None}}
        growth = {pid: after[pid][0] - before[pid][0] for pid in after}
        assert all(g < RSS_GROWTH_LIMIT for g in growth.values()), growth
        names = {procs[0].pid: "dealer", procs[1].pid: "party0", procs[2].pid: "party1"}
        total = tally.total
        assert total >= TARGET_FRAMES + 1300
        report(phase="live", frames=total, rpcs=sum(tally.rpcs.values()),
               first_pass_frames=first_pass, first_pass_s=round(elapsed, 1),
               frames_per_s=round(first_pass / elapsed, 1),
               frames_while_computing=total - first_pass, computing_s=round(computing, 1),
               by_kind=dict(tally.frames), codes=dict(tally.codes),
               rss_growth_mib={names[pid]: round(g / 2 ** 20, 1) for pid, g in growth.items()},
               peak_rss_mib={names[pid]: round(v[1] / 2 ** 20, 1) for pid, v in after.items()},
               survived=total, crashed=0)
    finally:
        for t in targets:
            t.close()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


# --- 2. authenticated peer ---------------------------------------------------------------


class FakeParty0(pb_grpc.PartyServicer):
    """Party 0 of one-off sessions: answers handshakes (keeping party 1's public key, so that
    it holds the real pair seed) and answers party 1's subscription with the right opening
    frame, then whatever frames the test feeds it (until None)."""

    def __init__(self) -> None:
        self.keypair = KeyPair()
        self.victim_keys: dict[str, bytes] = {}
        self.feeds: dict[str, queue.SimpleQueue] = {}
        self.lock = threading.Lock()

    def Handshake(self, request, context):
        self.victim_keys[request.session] = request.public_key
        return pb.HelloReply(hello=pb.Hello(
            protocol_version=request.protocol_version, session=request.session, world_size=2,
            rank=0, config_digest=request.config_digest, public_key=self.keypair.public_bytes))

    def feed(self, session: str) -> queue.SimpleQueue:
        with self.lock:
            return self.feeds.setdefault(session, queue.SimpleQueue())

    def Subscribe(self, request, context):
        session = request.session
        if bytes(request.data) != subscribe_token(self.seed(session), session, 1, 0):
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "not party 1")
        yield pb.Frame(session=session, src=0, seq=OPEN_SEQ, data=self.token(session))
        yield from iter(self.feed(session).get, None)

    def seed(self, session: str) -> bytes:
        return self.keypair.shared_seed(self.victim_keys[session], pair_info(session, 0, 1))

    def token(self, session: str) -> bytes:
        return stream_token(self.seed(session), session, 0, 1)


class AuthenticatedFuzz:
    """Fresh party 1 servers facing a fake party 0 that answers their subscriptions with
    authenticated streams (and subscribes to theirs, as a party does)."""

    def __init__(self, max_message_bytes: int = 8 << 20):
        self.fake = FakeParty0()
        self.server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=8),
                                  options=GRPC_OPTIONS)
        pb_grpc.add_PartyServicer_to_server(self.fake, self.server)
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()
        self.max_message_bytes = max_message_bytes
        self.cases = 0
        self.tally = Tally()
        self.channels: list[grpc.Channel] = []

    def victim(self, timeout: float = 60.0, subscribe: bool = True) -> GrpcCommunicator:
        """A fresh party 1; with `subscribe`, the fake party 0 subscribes to it and reads what
        it sends (its goodbye, at close) on a thread of its own."""
        # Large: nothing here waits for it (a wait that would is a hang, and fails the test).
        self.cases += 1
        config = Config(rank=1, world_size=2, session=f"fuzz-auth-{self.cases}", timeout=timeout,
                        parties=(self.address, f"127.0.0.1:{free_ports(1)[0]}"),
                        max_message_bytes=self.max_message_bytes)
        victim = GrpcCommunicator(config)
        if subscribe:
            threading.Thread(target=_drain, args=(self.subscribe(victim),), daemon=True).start()
        return victim

    def subscribe(self, victim: GrpcCommunicator, token: bytes | None = None):
        """The fake party 0's subscription to the victim's messages (its own token unless
        `token`)."""
        s = victim.config.session
        if token is None:
            token = subscribe_token(self.fake.seed(s), s, 0, 1)
        channel = grpc.insecure_channel(victim.config.parties[1], GRPC_OPTIONS)
        self.channels.append(channel)
        return pb_grpc.PartyStub(channel).Subscribe(
            pb.Frame(session=s, src=0, seq=OPEN_SEQ, data=token), timeout=30)

    def send(self, victim: GrpcCommunicator, frames: list[pb.Frame], kind: str) -> None:
        """Queue `frames` on the fake's answer to the victim's subscription, then end it."""
        feed = self.fake.feed(victim.config.session)
        for f in frames:
            feed.put(f)
        feed.put(None)
        self.tally.add(kind, len(frames), "OK")

    def close(self) -> None:
        for channel in self.channels:
            channel.close()
        self.server.stop(grace=None)


def message(seq: int, tensor: torch.Tensor, session: str, /, **override) -> list[pb.Frame]:
    """The frames of one well-formed message (fields in `override` replaced in every frame)."""
    dtype, shape, data = serde.to_bytes(tensor)
    n = max(1, -(-len(data) // CHUNK_BYTES))
    frames = [pb.Frame(session=session, src=0, seq=seq, dtype=dtype, shape=shape, chunk=i,
                       num_chunks=n, data=bytes(data[i * CHUNK_BYTES:(i + 1) * CHUNK_BYTES]))
              for i in range(n)]
    for f in frames:
        for key, value in override.items():
            if key == "shape":
                f.shape[:] = value
            else:
                setattr(f, key, value)
    return frames


BIG = torch.arange(600_000)  # 4.8 MB: two chunks


def _cases(s: str) -> dict[str, tuple[list[pb.Frame], int]]:
    """name -> (frames after the opening, number of valid messages before the bad frame)."""
    t = torch.tensor([1, -2, 3])
    good = message(0, t, s)
    big0, big1 = message(1, BIG, s)
    bye = [pb.Frame(session=s, src=0, seq=BYE_SEQ)]
    return {
        "oversize shape": (good + message(1, t, s, shape=[1 << 30]), 1),
        "unknown dtype": (good + message(1, t, s, dtype="complex64"), 1),
        "negative dimension": (good + message(1, t, s, shape=[-3]), 1),
        "17 dimensions": (good + message(1, t, s, shape=[1] * 16 + [3]), 1),
        "num_chunks mismatch": (good + message(1, t, s, num_chunks=2), 1),
        "chunk out of range": (good + message(1, t, s, chunk=1), 1),
        "chunk without its start": (good + [big1], 1),
        "payload longer than shape": (good + message(1, t, s, data=bytes(32)), 1),
        "payload shorter than shape": (good + message(1, t, s, data=bytes(16)), 1),
        "dtype changes between chunks": (good + [big0] + message(1, BIG, s, dtype="float64")[1:], 1),
        "shape changes between chunks": (good + [big0] + message(1, BIG, s, shape=[300_000, 2])[1:], 1),
        "duplicate sequence number": (good + message(0, t, s), 1),
        "duplicate chunk": (good + [big0, big0], 1),
        "interleaved partial messages": (good + [big0] + message(2, BIG, s)[:1], 1),
        "sender changes": (good + message(1, t, s, src=1), 1),
        "session changes": (good + message(1, t, s, session=s + "x"), 1),
        "second opening frame": (good + [pb.Frame(session=s, src=0, seq=OPEN_SEQ, data=b"x")], 1),
        "ends without goodbye": (good + [big0, big1], 2),
        "valid": (good + [big0, big1] + message(2, torch.zeros(0), s) + bye, 3),
    }


def mutate(frames: list[pb.Frame], m: Mutator, rounds: int) -> None:
    """Change a field of a frame, or swap, drop or duplicate frames, `rounds` times."""
    r = m.rng
    tops = {"seq": U64, "chunk": U32, "num_chunks": U32, "src": U32}
    for _ in range(rounds):
        target = r.choice(frames)
        what = r.choice([*tops, "dtype", "shape", "data", "swap", "drop", "dup"])
        if what == "swap":
            i, j = r.randrange(len(frames)), r.randrange(len(frames))
            frames[i], frames[j] = frames[j], frames[i]
        elif what == "drop":
            if len(frames) > 1:
                frames.remove(target)
        elif what == "dup":
            frames.insert(r.randrange(len(frames) + 1), target)
        elif what in tops:
            setattr(target, what, r.choice([m.uint(tops[what]),
                                            (getattr(target, what) + 1) % (tops[what] + 1)]))
        elif what == "shape":
            target.shape[:] = m.frame().shape
        else:
            setattr(target, what, getattr(m.frame(), what))


def healthy(address: str) -> bool:
    target = Target(address)
    try:
        return target.healthy()
    finally:
        target.close()


def _expected(n: int) -> list[torch.Tensor]:
    return [torch.tensor([1, -2, 3]), BIG, torch.zeros(0)][:n]


def _receive_all(victim: GrpcCommunicator, most: int) -> tuple[list[torch.Tensor], CommunicationError]:
    """Messages from party 0 until a wait fails (at most `most` + 1 waits)."""
    got = []
    for _ in range(most + 1):
        try:
            got.append(victim.recv(0))
        except CommunicationError as e:
            return got, e
    raise AssertionError(f"more than {most} messages delivered")


def _drain(subscription) -> None:
    try:
        for _ in subscription:
            pass
    except grpc.RpcError:
        pass


def test_authenticated_peer_sending_malformed_frames():
    fuzz = AuthenticatedFuzz()
    rng = random.Random(SEED)
    try:
        # Named cases: what precedes the bad frame arrives intact, then the peer is dead.
        for name in _cases("probe"):
            victim = fuzz.victim()
            try:
                s = victim.config.session
                # The stream's token (what an observer of a plaintext network sees first on
                # the wire from party 0) does not open a subscription as party 0.
                reflected = fuzz.subscribe(victim, token=fuzz.fake.token(s))
                with pytest.raises(grpc.RpcError) as refused:
                    next(reflected)
                assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, name
                frames, valid = _cases(s)[name]
                fuzz.send(victim, frames, "auth.case")
                got, err = _receive_all(victim, valid)
                assert len(got) == valid, (name, len(got), err)
                for have, want in zip(got, _expected(valid)):
                    torch.testing.assert_close(have, want)
                assert err.peer == 0, name
                assert "party 0" in str(err) and "CRYPTEN_LITE_TIMEOUT" not in str(err), (name, err)
                if name == "valid":
                    assert victim.mailbox.failure(0) is None and "closed its session" in str(err)
                else:
                    # At once: the recorded failure, not the timeout (no wall clock here).
                    assert victim.mailbox.failure(0), name
                    with pytest.raises(CommunicationError):  # every later wait too
                        victim.recv(0)
                assert healthy(victim.config.parties[1]), name
            finally:
                victim.close()

        # The fake party 0 subscribes to the victim: a second subscription (a replayed
        # opening) is refused; the first keeps working.
        victim = fuzz.victim(subscribe=False)
        try:
            s = victim.config.session
            first = fuzz.subscribe(victim)
            opening = next(first)
            assert (opening.seq, opening.src, bytes(opening.data)) == (
                OPEN_SEQ, 1, stream_token(fuzz.fake.seed(s), s, 1, 0))
            victim.send(torch.tensor([7]), 0)
            frame = next(first)
            assert frame.seq == 0 and serde.from_bytes(frame.dtype, tuple(frame.shape), frame.data).tolist() == [7]
            second = fuzz.subscribe(victim)
            with pytest.raises(grpc.RpcError) as refused:
                next(second)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            victim.send(torch.tensor([8]), 0)
            frame = next(first)
            assert frame.seq == 1 and serde.from_bytes(frame.dtype, tuple(frame.shape), frame.data).tolist() == [8]
            fuzz.send(victim, [pb.Frame(session=s, src=0, seq=BYE_SEQ)], "auth.bye")
            closer = threading.Thread(target=_drain, args=(first,), daemon=True)
            closer.start()
        finally:
            victim.close()
        closer.join(timeout=30)
        assert not closer.is_alive()

        # Random mutations of well-formed messages: refused or delivered, never a hang or crash.
        for _ in range(int(os.environ.get("FUZZ_AUTH_CASES", "60"))):
            victim = fuzz.victim()
            try:
                s = victim.config.session
                frames = [f for seq in range(3) for f in message(
                    seq, rng.choice([torch.arange(rng.randint(0, 50)), BIG,
                                     torch.rand(rng.randint(1, 9), dtype=torch.float64)]), s)]
                frames = [pb.Frame.FromString(f.SerializeToString()) for f in frames]
                mutate(frames, Mutator(rng, s, ""), rounds=rng.randint(1, 3))
                fuzz.send(victim, frames + [pb.Frame(session=s, src=0, seq=BYE_SEQ)], "auth.random")
                got, err = _receive_all(victim, len(frames))
                assert err.peer == 0 and "CRYPTEN_LITE_TIMEOUT" not in str(err), err
                failed = victim.mailbox.failure(0)
                assert ("closed its session" in str(err)) == (failed is None), (err, failed)
                assert healthy(victim.config.parties[1])
            finally:
                victim.close()
        report(phase="authenticated", cases=fuzz.cases, frames=fuzz.tally.total,
               codes=dict(fuzz.tally.codes))
    finally:
        fuzz.close()
