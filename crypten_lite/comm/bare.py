"""A bare gRPC echo (no crypten_lite framing) to measure the transport's ceiling."""

from __future__ import annotations

import concurrent.futures
import time

import grpc

from .grpc_comm import CHUNK_BYTES, GRPC_OPTIONS

_METHOD = "/bench.Echo/Stream"


def _echo(request_iterator, context):
    for chunk in request_iterator:
        yield chunk


def echo_seconds(nbytes: int) -> float:
    """Seconds to stream `nbytes` (in the transport's chunk size) to a local server and back."""
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4), options=GRPC_OPTIONS)
    handler = grpc.method_handlers_generic_handler("bench.Echo", {
        "Stream": grpc.stream_stream_rpc_method_handler(_echo)})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}", GRPC_OPTIONS) as channel:
            call = channel.stream_stream(_METHOD)
            payload = bytes(CHUNK_BYTES)
            chunks = max(1, nbytes // CHUNK_BYTES)
            list(call(iter([b"warm"]), timeout=30))
            start = time.perf_counter()
            received = sum(len(c) for c in call(iter([payload] * chunks), timeout=60))
            seconds = time.perf_counter() - start
            assert received == chunks * CHUNK_BYTES
            return seconds
    finally:
        server.stop(None)
