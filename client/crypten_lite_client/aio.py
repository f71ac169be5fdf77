"""The client for asyncio programs: the same shares, checks and retries as `Client`, over
grpc.aio, so that one thread can keep many predictions in flight (a web backend, a gateway,
or the load generator of benchmarks/serve_load.py: 64 clients in one event loop).

    async with AsyncClient(["host0:9100", "host1:9100"], token, tls="ca.pem") as client:
        logits = await client.predict(x)
"""

from __future__ import annotations

import asyncio
import time
from typing import Sequence

import grpc
import numpy as np

from ._proto import serve_pb2 as pb
from ._proto import serve_pb2_grpc as pb_grpc
from .client import ClientError, Retry, as_batch, build_requests, combine, one_service, open_channels


class AsyncClient:
    """Predictions from the parties at `endpoints` (rank order), from asyncio code; the
    arguments are those of `Client` (token, CA certificate of the parties, identities)."""

    def __init__(self, endpoints: Sequence[str], token: str | Sequence[str] | None,
                 tls: str | None = None, identities: Sequence[str] | None = None,
                 timeout: float = 30.0, max_message_bytes: int = 64 << 20,
                 cert: tuple[str, str] | None = None):
        self.timeout = timeout
        self.endpoints, self.tokens, self._channels = open_channels(
            grpc.aio, endpoints, token, tls, identities, max_message_bytes, cert)
        self._stubs = [pb_grpc.ServeStub(ch) for ch in self._channels]
        self._meta = None

    async def close(self) -> None:
        for ch in self._channels:
            await ch.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def _md(self, rank: int) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {self.tokens[rank]}")] if self.tokens[rank] else []

    async def info(self, timeout: float = 5.0) -> list:
        """Every party's InfoReply (public metadata, readiness, metrics)."""
        return list(await asyncio.gather(*(s.Info(pb.InfoRequest(), timeout=timeout)
                                           for s in self._stubs)))

    async def wait_ready(self, timeout: float = 120.0) -> list:
        """Every party's InfoReply once all are ready (ClientError after `timeout` seconds)."""
        end = time.monotonic() + timeout
        last = ""
        while time.monotonic() < end:
            try:
                infos = await self.info()
                if all(i.ready for i in infos):
                    return infos
                last = "not ready"
            except grpc.RpcError as e:
                last = e.code().name
            await asyncio.sleep(0.2)
        raise ClientError(f"the service did not become ready within {timeout} s ({last})",
                          "UNAVAILABLE")

    async def _metadata_of_service(self):
        if self._meta is None:
            self._meta = one_service(await self.wait_ready(self.timeout), len(self.endpoints))
        return self._meta

    async def predict(self, x, timeout: float | None = None) -> np.ndarray:
        """The model's output on `x` (a sample, or a batch first): as Client.predict."""
        retry = Retry(self.timeout if timeout is None else timeout)
        meta = await self._metadata_of_service()
        x, single = as_batch(x, meta)
        while True:
            left = retry.left()
            try:
                out = await self._once(meta, x, left)
                return out[0] if single else out
            except ClientError as e:
                await asyncio.sleep(retry.pause_after(e))

    async def _once(self, meta, x: np.ndarray, timeout: float) -> np.ndarray:
        reqs = build_requests(meta, x, len(self.endpoints), timeout)
        calls = [s.Predict(q, metadata=self._md(r), timeout=timeout + 10)
                 for r, (s, q) in enumerate(zip(self._stubs, reqs))]
        tasks = [asyncio.ensure_future(c) for c in calls]
        try:
            # The first failure at any party cancels the other halves at once.
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for r, t in enumerate(tasks):
                if t in done and t.exception() is not None:
                    e = t.exception()
                    if isinstance(e, grpc.aio.AioRpcError):
                        raise ClientError(f"party {r}: {e.details()}", e.code().name) from None
                    raise e
            replies = [t.result() for t in tasks]
        finally:  # cancel the halves still running; retrieve every half's error (none is lost)
            for t in tasks:
                if t.done():
                    _ = t.cancelled() or t.exception()
                else:
                    t.cancel()
                    t.add_done_callback(lambda f: f.cancelled() or f.exception())
        return combine(reqs, replies)
