"""The latency floor of gRPC Python on this machine: a 64-byte ping-pong between two processes.

    python benchmarks/grpc_floor.py                 # every pattern, 300 round trips each
    python benchmarks/grpc_floor.py --samples 1000 --only tcp,push_pair
    python benchmarks/grpc_floor.py --throughput [--repeat 10 --chunk-mb 1,4,16 --streams 1,2]
                                                    # 16 MiB each way (benchmarks/grpc_throughput.py)

Each pattern runs between this process and a child process it launches (loopback, plaintext:
the bench's latency rows run without TLS too). It prints one line per pattern: the median
round trip in microseconds, its ratio to raw TCP's (measured in the same run), and
the min / 90th percentile. Patterns:

- ``tcp``: one plain TCP socket (TCP_NODELAY), sendall / recv_into: the wire's limit.
- ``bidi_sync``: one bidirectional stream, sync API; the client feeds its requests from a queue
  (gRPC's own thread consumes the request iterator), the server's handler echoes.
- ``unary_sync``: one unary call per round trip, sync API (the calling thread polls itself).
- ``unary_stream_single``: the child's replies come on one server-streaming call read with
  ``grpc.experimental.ChannelOptions.SingleThreadedUnaryStream`` (no channel thread: the reading
  thread polls), the pings go as unary calls.
- ``push_pair``: crypten_lite's pattern until issue 32: each process serves, and opens one
  client stream (stream_unary, queue-fed) to the other; a message is received on the server's
  handler thread and handed to the main thread through a queue.
- ``tcp_exchange`` / ``push_pair_exchange``: an opening's shape (a reveal): both sides send
  at once, then each waits for the other's message (one round; the next round starts when
  the last message arrived). The floor of reveal_4 over plain TCP / over crypten_lite's
  former gRPC pattern, without crypten_lite's own code.
- ``subscribe_pair_exchange``: the other direction of the calls: each process subscribes to
  the other's messages with one server-streaming call read by its main thread with
  ``SingleThreadedUnaryStream`` (no channel thread: the reader polls), and the server's
  handler yields the messages its main thread queues. An exchange, as above: crypten_lite's
  pattern since issue 32 (comm/grpc_comm.py).
- ``unary_future_exchange``: each message is one unary call started without waiting
  (``.future``: the calling thread starts it, no request-iterator thread), received by the
  peer's unary handler (a pool thread) and handed to its main thread through a queue.
- ``push_pair_direct_exchange``: as push_pair_exchange, but the measuring process's main
  thread reads its server's request iterator itself (the handler thread hands the iterator
  over and parks): one thread hand-off less on the receiving side.
- ``aio_bidi``: one bidirectional stream with grpc.aio (call.write / call.read, one event loop
  per process).

Figures depend on load: note ``uptime`` beside them (the script prints the 1-minute load).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import json
import os
import queue
import socket
import statistics
import subprocess
import sys
import threading
import time

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # before grpc loads: no teardown notes (GOAWAY)
import grpc  # noqa: E402
import grpc.experimental  # noqa: E402

PAYLOAD = bytes(64)
OPTIONS = [("grpc.so_reuseport", 0)]
# --option KEY=VALUE (both processes, every channel and server): e.g. grpc.http2.bdp_probe=0,
# grpc.optimization_target=latency. Passed to the child through the environment.
for _item in filter(None, os.environ.get("GRPC_FLOOR_OPTIONS", "").split(";")):
    _key, _, _value = _item.partition("=")
    OPTIONS.append((_key, int(_value) if _value.lstrip("-").isdigit() else _value))
PATTERNS = ("tcp", "bidi_sync", "unary_sync", "unary_stream_single", "push_pair", "aio_bidi",
            "tcp_exchange", "push_pair_exchange", "push_pair_direct_exchange",
            "subscribe_pair_exchange", "unary_future_exchange")
_ident = lambda b: b  # noqa: E731  (bytes travel as they are: no protobuf)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(port: int, handlers: dict) -> grpc.Server:
    """A started gRPC server on 127.0.0.1:port with the service floor.Echo's `handlers`."""
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=8), options=OPTIONS)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("floor.Echo", handlers),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server


def _timed(round_trip, samples: int) -> list[float]:
    for _ in range(20):  # warm-up
        round_trip()
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        round_trip()
        times.append(time.perf_counter() - start)
    return times


# -- children (the echoing side) ---------------------------------------------------------------
def _child(pattern: str, port: int, peer_port: int) -> None:
    if os.environ.get("GRPC_FLOOR_SWITCH_INTERVAL"):
        sys.setswitchinterval(float(os.environ["GRPC_FLOOR_SWITCH_INTERVAL"]))
    if pattern in ("tcp", "tcp_exchange"):
        listener = socket.create_server(("127.0.0.1", port))
        print("ready", flush=True)
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray(64)
        while True:
            try:
                if pattern == "tcp_exchange":
                    conn.sendall(PAYLOAD)
            except OSError:
                return
            n = 0
            while n < 64:
                try:
                    k = conn.recv_into(memoryview(buf)[n:])
                except OSError:
                    return
                if not k:
                    return
                n += k
            if pattern == "tcp":
                conn.sendall(buf)
    if pattern == "aio_bidi":
        asyncio.run(_aio_child(port))
        return
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=8), options=OPTIONS)
    replies: queue.SimpleQueue = queue.SimpleQueue()
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    done = threading.Event()

    def bidi(it, context):
        for req in it:
            yield req

    def unary(req, context):
        if pattern == "unary_stream_single":
            replies.put(req)
        if pattern == "unary_future_exchange":
            inbox.put(req)
            return b""
        return req

    def subscribe(req, context):
        while True:
            item = replies.get()
            if item is None:
                return
            yield item

    def push(it, context):
        for req in it:
            inbox.put(req)
        done.set()
        return b""

    handlers = {
        "Bidi": grpc.stream_stream_rpc_method_handler(bidi, _ident, _ident),
        "Unary": grpc.unary_unary_rpc_method_handler(unary, _ident, _ident),
        "Subscribe": grpc.unary_stream_rpc_method_handler(subscribe, _ident, _ident),
        "Push": grpc.stream_unary_rpc_method_handler(push, _ident, _ident),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("floor.Echo", handlers),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("ready", flush=True)
    if pattern.startswith("push_pair"):
        channel = grpc.insecure_channel(f"127.0.0.1:{peer_port}", OPTIONS)
        grpc.channel_ready_future(channel).result(timeout=30)
        out: queue.SimpleQueue = queue.SimpleQueue()
        call = channel.stream_unary("/floor.Echo/Push", _ident, _ident).future(iter(out.get, None))
        owe = True
        while True:
            if pattern != "push_pair" and owe:  # both send, then both wait: one round
                out.put(PAYLOAD)
                owe = False
            try:
                item = inbox.get(timeout=0.5)
            except queue.Empty:
                if done.is_set():
                    break
                continue
            owe = True
            if pattern == "push_pair":
                out.put(item)
        out.put(None)
        call.result(timeout=10)
        return
    if pattern == "unary_future_exchange":
        channel = grpc.insecure_channel(f"127.0.0.1:{peer_port}", OPTIONS)
        grpc.channel_ready_future(channel).result(timeout=30)
        send = channel.unary_unary("/floor.Echo/Unary", _ident, _ident)
        calls: collections.deque = collections.deque(maxlen=64)  # a dropped future is cancelled
        while True:
            calls.append(send.future(PAYLOAD, timeout=30))
            item = inbox.get(timeout=60)
            if not item:  # the parent's last call: empty
                break
        server.stop(1).wait(5)
        return
    if pattern == "subscribe_pair_exchange":
        channel = grpc.insecure_channel(f"127.0.0.1:{peer_port}", OPTIONS + [
            (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)])
        grpc.channel_ready_future(channel).result(timeout=30)
        incoming = channel.unary_stream("/floor.Echo/Subscribe", _ident, _ident)(b"", timeout=600)
        try:
            while True:
                replies.put(PAYLOAD)
                next(incoming)
        except (StopIteration, grpc.RpcError):
            pass
        replies.put(None)
        server.stop(None)
        return
    sys.stdin.read()  # until the parent closes our stdin
    replies.put(None)
    server.stop(None)


async def _aio_child(port: int) -> None:
    async def bidi(it, context):
        async for req in it:
            yield req
    server = grpc.aio.server(options=OPTIONS)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("floor.Echo", {
        "Bidi": grpc.stream_stream_rpc_method_handler(bidi, _ident, _ident)}),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop(None)


# -- parent (the measuring side) ---------------------------------------------------------------
def _measure(pattern: str, samples: int, port: int, own_port: int) -> list[float]:
    target = f"127.0.0.1:{port}"
    if pattern in ("tcp", "tcp_exchange"):
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray(64)

        def rt():
            sock.sendall(PAYLOAD)
            n = 0
            while n < 64:
                n += sock.recv_into(memoryview(buf)[n:])
        try:
            return _timed(rt, samples)
        finally:
            sock.close()
    if pattern == "aio_bidi":
        return asyncio.run(_aio_measure(target, samples))
    if pattern == "unary_stream_single":
        options = OPTIONS + [(grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)]
    else:
        options = OPTIONS
    channel = grpc.insecure_channel(target, options)
    grpc.channel_ready_future(channel).result(timeout=30)
    try:
        if pattern == "bidi_sync":
            out: queue.SimpleQueue = queue.SimpleQueue()
            responses = channel.stream_stream("/floor.Echo/Bidi", _ident, _ident)(iter(out.get, None))

            def rt():
                out.put(PAYLOAD)
                next(responses)
            try:
                return _timed(rt, samples)
            finally:
                out.put(None)
        if pattern == "unary_sync":
            call = channel.unary_unary("/floor.Echo/Unary", _ident, _ident)
            return _timed(lambda: call(PAYLOAD, timeout=30), samples)
        if pattern == "unary_stream_single":
            replies = channel.unary_stream("/floor.Echo/Subscribe", _ident, _ident)(PAYLOAD)
            ping = channel.unary_unary("/floor.Echo/Unary", _ident, _ident)

            def rt():
                ping(PAYLOAD, timeout=30)
                next(replies)
            return _timed(rt, samples)
        if pattern == "unary_future_exchange":
            inbox: queue.SimpleQueue = queue.SimpleQueue()

            def unary(req, context):
                inbox.put(req)
                return b""
            server = _serve(own_port, {"Unary": grpc.unary_unary_rpc_method_handler(unary, _ident, _ident)})
            send = channel.unary_unary("/floor.Echo/Unary", _ident, _ident)
            calls: collections.deque = collections.deque(maxlen=64)  # a dropped future is cancelled

            def rt():
                calls.append(send.future(PAYLOAD, timeout=30))
                inbox.get(timeout=30)
            try:
                return _timed(rt, samples)
            finally:
                send(b"", timeout=30)
                server.stop(1).wait(5)
        if pattern == "subscribe_pair_exchange":
            out = queue.SimpleQueue()

            def subscribe(req, context):
                yield from iter(out.get, None)
            server = _serve(own_port, {"Subscribe": grpc.unary_stream_rpc_method_handler(subscribe, _ident, _ident)})
            single = grpc.insecure_channel(target, OPTIONS + [
                (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)])
            incoming = single.unary_stream("/floor.Echo/Subscribe", _ident, _ident)(b"", timeout=600)

            def rt():
                out.put(PAYLOAD)
                next(incoming)
            try:
                return _timed(rt, samples)
            finally:
                out.put(None)
                incoming.cancel()
                single.close()
                server.stop(1).wait(5)
        if pattern.startswith("push_pair"):
            server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=8), options=OPTIONS)
            inbox: queue.SimpleQueue = queue.SimpleQueue()
            ended = threading.Event()
            direct = pattern == "push_pair_direct_exchange"

            def push(it, context):
                if direct:  # the main thread reads the stream itself: hand it over, wait
                    inbox.put(it)
                    ended.wait(60)
                    return b""
                for req in it:
                    inbox.put(req)
                ended.set()
                return b""
            server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("floor.Echo", {
                "Push": grpc.stream_unary_rpc_method_handler(push, _ident, _ident)}),))
            server.add_insecure_port(f"127.0.0.1:{own_port}")
            server.start()
            out = queue.SimpleQueue()
            call = channel.stream_unary("/floor.Echo/Push", _ident, _ident).future(iter(out.get, None))

            if direct:
                out.put(PAYLOAD)  # the child's stream opens with its first message
                requests = inbox.get(timeout=30)

                def rt():
                    out.put(PAYLOAD)
                    next(requests)
            else:
                def rt():
                    out.put(PAYLOAD)
                    inbox.get(timeout=30)
            try:
                return _timed(rt, samples)
            finally:
                out.put(None)
                call.result(timeout=10)
                if direct:
                    for _ in requests:
                        pass
                    ended.set()
                ended.wait(10)  # the child's stream ends once it saw ours end
                server.stop(1).wait(5)  # its call's answer goes out before the server stops
        raise ValueError(pattern)
    finally:
        channel.close()


async def _aio_measure(target: str, samples: int) -> list[float]:
    async with grpc.aio.insecure_channel(target, options=OPTIONS) as channel:
        call = channel.stream_stream("/floor.Echo/Bidi", _ident, _ident)()
        times = []
        for i in range(samples + 20):
            start = time.perf_counter()
            await call.write(PAYLOAD)
            await call.read()
            if i >= 20:
                times.append(time.perf_counter() - start)
        await call.done_writing()
        return times


def run(pattern: str, samples: int) -> list[float]:
    """Round-trip times (seconds) of `samples` ping-pongs in `pattern` against a child process."""
    port, own_port = _free_port(), _free_port()
    child = subprocess.Popen([sys.executable, __file__, "--child", pattern, "--port", str(port),
                              "--peer-port", str(own_port)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"{pattern}: the child process did not start")
        return _measure(pattern, samples, port, own_port)
    finally:
        child.stdin.close()
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def main() -> None:
    if "--throughput" in sys.argv[1:]:  # the throughput floor: 16 MiB each way (grpc_throughput.py)
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import grpc_throughput
        raise SystemExit(grpc_throughput.main([a for a in sys.argv[1:] if a != "--throughput"]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=300, help="round trips per pattern")
    parser.add_argument("--only", default=",".join(PATTERNS), help="comma-separated patterns")
    parser.add_argument("--switch-interval", type=float, default=0.0,
                        help="sys.setswitchinterval in both processes (seconds; 0: Python's 0.005)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a gRPC channel/server argument for every pattern (repeatable)")
    parser.add_argument("--json", metavar="PATH",
                        help="also write the run as JSON (docs/grpc_floor.json feeds docs/ARCHITECTURE.md)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--peer-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.option and not args.child:  # re-run with the options in the environment (module level)
        env = dict(os.environ, GRPC_FLOOR_OPTIONS=";".join(args.option))
        argv = [a for a in sys.argv[1:]]
        while "--option" in argv:
            i = argv.index("--option")
            del argv[i:i + 2]
        raise SystemExit(subprocess.call([sys.executable, __file__, *argv], env=env))
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
        os.environ["GRPC_FLOOR_SWITCH_INTERVAL"] = str(args.switch_interval)
    if args.child:
        _child(args.child, args.port, args.peer_port)
        return
    patterns = [p for p in args.only.split(",") if p]
    unknown = [p for p in patterns if p not in PATTERNS]
    if unknown:
        parser.error(f"unknown pattern(s) {unknown}; choose among {', '.join(PATTERNS)}")
    if "tcp" not in patterns:
        patterns.insert(0, "tcp")
    strategy = os.environ.get("GRPC_POLL_STRATEGY", "")
    print(f"# 64-byte round trips, {args.samples} each; load {os.getloadavg()[0]:.2f}, "
          f"grpc {grpc.__version__}, switch interval {sys.getswitchinterval()} s, "
          f"GRPC_POLL_STRATEGY={strategy!r}, options {OPTIONS}")
    base = None
    rows = []
    for pattern in patterns:
        times = sorted(run(pattern, args.samples))
        median = statistics.median(times)
        base = base or median
        p90 = times[int(0.9 * (len(times) - 1))]
        print(f"{pattern:26s} median {median * 1e6:8.1f} us  {median / base:5.1f}x tcp  "
              f"min {times[0] * 1e6:7.1f}  p90 {p90 * 1e6:8.1f}", flush=True)
        rows.append({"pattern": pattern, "median_us": round(median * 1e6, 1),
                     "ratio_to_tcp": round(median / base, 2), "min_us": round(times[0] * 1e6, 1),
                     "p90_us": round(p90 * 1e6, 1)})
    if args.json:
        record = {"command": "python benchmarks/grpc_floor.py " + " ".join(sys.argv[1:]),
                  "date": time.strftime("%Y-%m-%d"), "samples": args.samples, "grpc": grpc.__version__,
                  "load_average_1min": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
                  "options": OPTIONS, "poll_strategy": strategy, "patterns": rows}
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
