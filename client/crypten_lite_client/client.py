"""The client: fixed-point encoding, sharing with the OS's CSPRNG, gRPC calls, reconstruction.

The encoding is crypten_lite's (crypten_lite/encoding.py): a real v becomes round(v * 2^16)
in Z_2^64. Additive sharing: n-1 uniform words from os.urandom and the last one completing
the sum mod 2^64; party i gets share i. Replicated sharing (rss, 3 parties): components
x_0, x_1 uniform, x_2 = x - x_0 - x_1; party i gets the pair (x_i, x_{i+1 mod 3}). Each party
answers with its share of the output plus a fresh zero sharing; only this client sums them.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Sequence

import grpc
import numpy as np

from ._proto import serve_pb2 as pb
from ._proto import serve_pb2_grpc as pb_grpc

MAX_ENCODED = 2 ** 62
DTYPE = "ring64"
# Retried with fresh shares and a fresh request id (never a wrong answer: each try is a new
# prediction): a party down or restarting, or its server stopping under a call.
RETRY = ("UNAVAILABLE", "CANCELLED", "mismatch")


def open_channels(api, endpoints: Sequence[str], token: str | Sequence[str] | None,
                  tls: str | None, identities: Sequence[str] | None, max_message_bytes: int,
                  cert: tuple[str, str] | None) -> tuple[list[str], list[str], list]:
    """The endpoints, one token per party and one channel per party, for `Client` (api: grpc)
    and `AsyncClient` (api: grpc.aio): TLS with the parties' CA (`tls`), the names their
    certificates must carry (`identities`, default party0, party1, ...) and, with `cert`
    (certificate PEM path, key PEM path), this client's certificate."""
    endpoints = list(endpoints)
    n = len(endpoints)
    tokens = [token or ""] * n if token is None or isinstance(token, str) else list(token)
    if cert is not None and not tls:
        raise ClientError("a client certificate needs tls (the CA file of the parties)", "input")
    if len(tokens) != n:
        raise ClientError(f"{len(tokens)} tokens for {n} endpoints", "input")
    chain = key = root = None
    if cert is not None:  # TLS client authentication
        with open(cert[0], "rb") as f:
            chain = f.read()
        with open(cert[1], "rb") as f:
            key = f.read()
    if tls:
        with open(tls, "rb") as f:
            root = f.read()
    names = list(identities or [f"party{r}" for r in range(n)])
    opts = [("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes)]
    channels = []
    for r, ep in enumerate(endpoints):
        if root is not None:
            creds = grpc.ssl_channel_credentials(root_certificates=root, private_key=key,
                                                 certificate_chain=chain)
            channels.append(api.secure_channel(
                ep, creds, opts + [("grpc.ssl_target_name_override", names[r])]))
        else:
            channels.append(api.insecure_channel(ep, opts))
    return endpoints, tokens, channels


class ClientError(Exception):
    """A prediction that failed; `code` is the gRPC status name (or "mismatch" / "input")."""

    def __init__(self, message: str, code: str = ""):
        super().__init__(message)
        self.code = code


def encode(x, precision: int = 16) -> np.ndarray:
    """Fixed-point ring elements (uint64) of the real array `x` (refuses NaN, inf, overflow)."""
    a = np.asarray(x, dtype=np.float64)
    if not np.isfinite(a).all():
        raise ClientError("input contains NaN or infinity; only finite values can be encoded", "input")
    scaled = np.round(a * float(1 << precision))
    if scaled.size and np.abs(scaled).max() >= MAX_ENCODED:
        raise ClientError(f"input out of the fixed-point range: |x| must be < 2^{62 - precision}",
                          "input")
    return scaled.astype(np.int64).view(np.uint64)


def decode(words: np.ndarray, precision: int) -> np.ndarray:
    """Real values of ring elements (uint64 or int64 words)."""
    return np.asarray(words).view(np.int64).astype(np.float64) / float(1 << precision)


def _uniform(shape: tuple[int, ...]) -> np.ndarray:
    n = int(np.prod(shape)) if shape else 1
    return np.frombuffer(os.urandom(8 * n), dtype="<u8").reshape(shape).astype(np.uint64)


def split(encoded: np.ndarray, n: int) -> list[np.ndarray]:
    """`n` additive shares mod 2^64 of `encoded` (n-1 uniform from os.urandom)."""
    shares = [_uniform(encoded.shape) for _ in range(n - 1)]
    last = encoded.astype(np.uint64).copy()
    for s in shares:
        last -= s  # uint64 arithmetic wraps mod 2^64
    return shares + [last]


def reconstruct(shares: Sequence[np.ndarray]) -> np.ndarray:
    """The sum mod 2^64 of the shares (uint64)."""
    out = np.zeros(np.shape(shares[0]), dtype=np.uint64)
    for s in shares:
        out += np.asarray(s).view(np.uint64)
    return out


def _words(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).astype("<u8", copy=False).tobytes()


class Client:
    """Predictions from the parties at `endpoints` (rank order).

    `token`: the bearer token the operator issued (one string, or one per party; None where
    the service authenticates clients by certificate). `cert`: (certificate, key) PEM paths
    of this client's TLS certificate, for a service started with --client-ca.
    `tls`: path of the CA certificate (PEM) that signed the parties' certificates, or None for
    plaintext (local tests only). `identities`: names the parties' certificates carry
    (default party0, party1, ...), checked whatever address is dialed.
    """

    def __init__(self, endpoints: Sequence[str], token: str | Sequence[str] | None,
                 tls: str | None = None, identities: Sequence[str] | None = None,
                 timeout: float = 30.0, max_message_bytes: int = 64 << 20,
                 cert: tuple[str, str] | None = None):
        self.timeout = timeout
        self.endpoints, self.tokens, self._channels = open_channels(
            grpc, endpoints, token, tls, identities, max_message_bytes, cert)
        self._stubs = [pb_grpc.ServeStub(ch) for ch in self._channels]
        self._meta: list | None = None

    def close(self) -> None:
        for ch in self._channels:
            ch.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def metadata(self, rank: int) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {self.tokens[rank]}")] if self.tokens[rank] else []

    def info(self, timeout: float = 5.0) -> list:
        """Every party's InfoReply (public metadata, readiness, metrics)."""
        return [s.Info(pb.InfoRequest(), timeout=timeout) for s in self._stubs]

    def wait_ready(self, timeout: float = 120.0) -> list:
        """Every party's InfoReply once all are ready (ClientError after `timeout` seconds)."""
        end = time.monotonic() + timeout
        last = ""
        while time.monotonic() < end:
            try:
                infos = self.info()
                if all(i.ready for i in infos):
                    return infos
                last = "not ready"
            except grpc.RpcError as e:
                last = e.code().name
            time.sleep(0.2)
        raise ClientError(f"the service did not become ready within {timeout} s ({last})", "UNAVAILABLE")

    def _metadata_of_service(self):
        if self._meta is None:
            self._meta = one_service(self.wait_ready(self.timeout), len(self.endpoints))
        return self._meta

    def requests_for(self, x: np.ndarray, timeout: float) -> list:
        """One PredictRequest per party for the (batched) input `x` (fresh id and shares)."""
        return build_requests(self._metadata_of_service(), x, len(self.endpoints), timeout)

    def predict(self, x, timeout: float | None = None) -> np.ndarray:
        """The model's output on `x` (a sample, or a batch with the batch dimension first).

        Retries transparently (fresh shares and request id) while a party is unavailable,
        within `timeout` seconds; any other failure raises ClientError with the party's
        message. Answers whose shapes or computation tags differ are refused, never summed."""
        retry = Retry(self.timeout if timeout is None else timeout)
        x, single = as_batch(x, self._metadata_of_service())
        while True:
            left = retry.left()
            try:
                out = self._once(x, left)
                return out[0] if single else out
            except ClientError as e:
                time.sleep(retry.pause_after(e))

    def _once(self, x: np.ndarray, timeout: float) -> np.ndarray:
        reqs = self.requests_for(x, timeout)
        futures = [s.Predict.future(q, metadata=self.metadata(r), timeout=timeout + 10)
                   for r, (s, q) in enumerate(zip(self._stubs, reqs))]
        # The first failure at any party cancels the other halves at once (a party holding a
        # half waits for the others' shares until the request's deadline otherwise).
        changed = threading.Event()
        for f in futures:
            f.add_done_callback(lambda _f: changed.set())
        replies: list = [None] * len(futures)
        waiting = set(range(len(futures)))
        while waiting:
            changed.wait(0.5)
            changed.clear()
            for r in sorted(waiting):
                if not futures[r].done():
                    continue
                waiting.discard(r)
                try:
                    replies[r] = futures[r].result()
                except grpc.RpcError as e:
                    for g in futures:
                        g.cancel()
                    raise ClientError(f"party {r}: {e.details()}", e.code().name) from None
        return combine(reqs, replies)


def one_service(infos: list, n: int):
    """The ServiceInfo every one of the `n` parties describes alike (ClientError 'mismatch' if
    they describe different services or another number of parties)."""
    keys = {(i.world_size, i.protocol, tuple(i.sample_shape), i.precision, i.model) for i in infos}
    if len(keys) != 1 or infos[0].world_size != n:
        raise ClientError(f"the parties describe different services or another number "
                          f"of parties: {sorted(keys)}", "mismatch")
    return infos[0]


def as_batch(x, meta) -> tuple[np.ndarray, bool]:
    """`x` as a float64 batch, and whether it was one sample of the service's sample shape."""
    x = np.asarray(x, dtype=np.float64)
    single = x.shape == tuple(meta.sample_shape)
    return (x[None] if single else x), single


class Retry:
    """The retry schedule of one predict call within `timeout` seconds: attempts while a party is
    unavailable (codes in RETRY), with pauses from 50 ms doubling up to 1 s."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.end = time.monotonic() + timeout
        self.delay = 0.05

    def left(self) -> float:
        """Seconds left for the next attempt (ClientError DEADLINE_EXCEEDED when none are)."""
        left = self.end - time.monotonic()
        if left <= 0:
            raise ClientError(f"no answer within {self.timeout} s", "DEADLINE_EXCEEDED")
        return left

    def pause_after(self, e: "ClientError") -> float:
        """The pause before the next attempt after `e`, or `e` raised again when it is not worth
        retrying (another code, or the pause would pass the deadline)."""
        if e.code not in RETRY or time.monotonic() + self.delay >= self.end:
            raise e
        delay, self.delay = self.delay, min(1.0, self.delay * 2)
        return delay


def build_requests(meta, x: np.ndarray, n: int, timeout: float) -> list:
    """One PredictRequest per party (of `n`) for the batched input `x`: a fresh random request
    id and fresh shares (additive, or the replicated pairs under rss), given the service's
    public metadata `meta` (an InfoReply)."""
    enc = encode(x, meta.precision)
    rid = os.urandom(16)
    if meta.protocol == "rss":
        comps = split(enc, 3)
        parts = [[comps[r], comps[(r + 1) % 3]] for r in range(3)]
    else:
        parts = [[s] for s in split(enc, n)]
    return [pb.PredictRequest(request_id=rid, shape=list(x.shape), precision=meta.precision,
                              dtype=DTYPE, components=[_words(c) for c in parts[r]],
                              timeout_ms=int(timeout * 1000)) for r in range(n)]


def combine(reqs: list, replies: list) -> np.ndarray:
    """The output from every party's reply to `reqs`: refused (ClientError "mismatch") unless
    every reply answers the same request and computation with the same shape and precision."""
    first = replies[0]
    for r, rep in enumerate(replies):
        if (rep.request_id != reqs[0].request_id or rep.computation != first.computation
                or list(rep.shape) != list(first.shape) or rep.precision != first.precision
                or len(rep.share) != 8 * int(np.prod(rep.shape))):
            raise ClientError(f"party {r}'s answer does not match party 0's (another "
                              "computation, shape or precision): refused", "mismatch")
    shape = tuple(int(d) for d in first.shape)
    shares = [np.frombuffer(rep.share, dtype="<u8").reshape(shape) for rep in replies]
    return decode(reconstruct(shares), first.precision)
