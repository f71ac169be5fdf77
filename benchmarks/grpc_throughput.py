"""The throughput floor of gRPC Python on this machine: two processes exchange 16 MB each way.

    python benchmarks/grpc_throughput.py                      # every pattern, 10 exchanges each
    python benchmarks/grpc_throughput.py --repeat 20 --chunk-mb 1,4,16 --streams 1,2
    python benchmarks/grpc_floor.py --throughput ...          # the same (grpc_floor's throughput mode)

The shape of `crypten-lite bench --only transport_16MB` (both parties send 16 MB at once, each
waits for the other's), without crypten_lite's code: what gRPC Python itself costs above the
wire. This process and a child it launches (loopback, plaintext, as the bench rows run) are
told to start by one byte on a control socket; an exchange ends when this process holds the
child's whole message and the child has said (on the control socket) that it holds this one's.
Patterns, each run alternately with raw TCP (round robin, `--repeat` rounds), so both see the
same load:

- ``tcp``: one plain TCP socket, ``sendall`` from the payload's memory on a thread,
  ``recv_into`` a preallocated buffer: the wire's limit (as bench's raw_tcp_16MB).
- ``grpc``: crypten_lite's pattern with bare bytes: each process serves a stream_unary method
  and opens one queue-fed client stream to the other; the message goes in chunks of
  ``--chunk-mb`` (each chunk one gRPC message: gRPC copies it into its slice at the sender and
  into a new bytes object at the receiver), and the receiving handler copies each chunk into one
  preallocated buffer (as crypten_lite's PayloadBuffer).
- ``grpc_nocopy``: as ``grpc`` but the receiver keeps the chunks' bytes objects (no copy into
  a buffer): what the last copy costs.
- ``--streams k``: the chunks go round robin over k client streams (each on its own channel).

Prints one line per pattern: the median exchange in milliseconds, GB/s per direction, and its
ratio to raw TCP's median in the same run. Figures depend on load: the line records it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import os
import queue
import socket
import statistics
import subprocess
import sys
import threading
import time

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
import grpc  # noqa: E402

NBYTES = 16 * 1024 * 1024
OPTIONS = [("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", 64 << 20),
           ("grpc.max_send_message_length", 64 << 20)]
# --option KEY=VALUE (both processes, every channel and server), e.g. grpc.http2.max_frame_size=
# 16777215: passed to the child through the environment.
for _item in filter(None, os.environ.get("GRPC_THROUGHPUT_OPTIONS", "").split(";")):
    _key, _, _value = _item.partition("=")
    OPTIONS.append((_key, int(_value) if _value.lstrip("-").isdigit() else _value))
_ident = lambda b: b  # noqa: E731  (bytes travel as they are: no protobuf)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _recv_exact(sock: socket.socket, into: memoryview) -> None:
    n = 0
    while n < len(into):
        k = sock.recv_into(into[n:])
        if not k:
            raise ConnectionError("the peer closed its socket")
        n += k


class _Peer:
    """One side: a data path (TCP socket, or gRPC server + client streams) and its payload."""

    def __init__(self, pattern: str, chunk: int, streams: int, port: int, peer_port: int):
        self.pattern, self.chunk = pattern, chunk
        self.payload = memoryview(bytearray(os.urandom(1024)) * (NBYTES // 1024))
        self.into = memoryview(bytearray(NBYTES))
        self.received = threading.Semaphore(0)
        if pattern == "tcp":
            return
        self.got = 0
        self.keep: list[bytes] = []

        def push(it, context):
            for data in it:
                if pattern == "grpc":
                    self.into[self.got:self.got + len(data)] = data
                else:
                    self.keep.append(data)
                self.got += len(data)
                if self.got == NBYTES:
                    self.got = 0
                    self.keep = []
                    self.received.release()
            return b""
        self.server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=8), options=OPTIONS)
        handler = grpc.stream_unary_rpc_method_handler(push, request_deserializer=_ident,
                                                       response_serializer=_ident)
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("floor.Push", {"Push": handler}),))
        self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.server.start()
        self.peer_port = peer_port
        self.queues: list[queue.SimpleQueue] = []
        self.calls = []
        self.streams = streams

    def connect(self) -> None:
        for _ in range(self.streams):
            channel = grpc.insecure_channel(f"127.0.0.1:{self.peer_port}", OPTIONS)
            grpc.channel_ready_future(channel).result(timeout=30)
            q: queue.SimpleQueue = queue.SimpleQueue()
            call = channel.stream_unary("/floor.Push/Push", request_serializer=_ident,
                                        response_deserializer=_ident)
            self.queues.append(q)
            self.calls.append((channel, call.future(iter(q.get, None))))

    def send(self) -> None:
        """Queue the whole payload, one copy per chunk (the copy-on-send of crypten_lite)."""
        targets = itertools.cycle(self.queues)
        for i in range(0, NBYTES, self.chunk):
            next(targets).put(bytes(self.payload[i:i + self.chunk]))

    def close(self) -> None:
        for q in self.queues:
            q.put(None)
        for channel, future in self.calls:
            try:
                future.result(timeout=10)
            except Exception:  # the peer may be gone first
                pass
            channel.close()
        self.server.stop(grace=None)


def _child(pattern: str, chunk: int, streams: int, port: int, peer_port: int, control_port: int) -> None:
    peer = _Peer(pattern, chunk, streams, port, peer_port)
    control = socket.create_connection(("127.0.0.1", control_port), timeout=60)
    control.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    data = None
    if pattern == "tcp":
        data = socket.create_connection(("127.0.0.1", port), timeout=60)
    else:
        control.recv(1)  # the parent serves: connect after it said so
        peer.connect()
    control.sendall(b"r")
    go = bytearray(1)
    while control.recv_into(go):
        if data is not None:
            sender = threading.Thread(target=data.sendall, args=(peer.payload,))
            sender.start()
            _recv_exact(data, peer.into)
            sender.join()
        else:
            peer.send()
            if not peer.received.acquire(timeout=60):
                raise TimeoutError("no message from the parent within 60 s")
        control.sendall(b"d")
    if pattern != "tcp":
        peer.close()


class _Run:
    """The parent's side of one pattern against its child process."""

    def __init__(self, pattern: str, chunk: int, streams: int):
        self.pattern = pattern
        port, peer_port = _free_port(), _free_port()
        listener = socket.create_server(("127.0.0.1", 0))
        listener.settimeout(60)
        data_listener = socket.create_server(("127.0.0.1", port)) if pattern == "tcp" else None
        self.peer = _Peer(pattern, chunk, streams, peer_port, port)
        self.child = subprocess.Popen([sys.executable, __file__, "--child", pattern, "--chunk", str(chunk),
                                       "--stream-count", str(streams), "--port", str(port),
                                       "--peer-port", str(peer_port), "--control-port",
                                       str(listener.getsockname()[1])])
        self.control, _ = listener.accept()
        self.control.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.control.settimeout(60)
        listener.close()
        self.data = None
        if data_listener is not None:
            data_listener.settimeout(60)
            self.data, _ = data_listener.accept()
            data_listener.close()
        else:
            self.control.sendall(b"s")
            self.peer.connect()
        if self.control.recv(1) != b"r":
            raise RuntimeError(f"{pattern}: the child did not start")

    def exchange(self) -> tuple[float, float]:
        """Seconds of one exchange, and this process's CPU seconds (every thread) in it."""
        start, cpu = time.perf_counter(), time.process_time()
        self.control.sendall(b"g")
        if self.data is not None:
            sender = threading.Thread(target=self.data.sendall, args=(self.peer.payload,))
            sender.start()
            _recv_exact(self.data, self.peer.into)
            sender.join()
        else:
            self.peer.send()
            if not self.peer.received.acquire(timeout=60):
                raise TimeoutError("no message from the child within 60 s")
        if self.control.recv(1) != b"d":
            raise RuntimeError("the child failed")
        return time.perf_counter() - start, time.process_time() - cpu

    def close(self) -> None:
        self.control.close()
        if self.data is not None:
            self.data.close()
        else:
            self.peer.close()
        try:
            self.child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=10, help="exchanges per pattern (round robin)")
    parser.add_argument("--chunk-mb", default="4", help="comma-separated chunk sizes in MiB")
    parser.add_argument("--streams", default="1", help="comma-separated numbers of client streams")
    parser.add_argument("--patterns", default="grpc,grpc_nocopy", help="gRPC patterns (tcp always runs)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a gRPC channel/server argument for every gRPC pattern (repeatable)")
    parser.add_argument("--json", metavar="PATH", help="also write the run as JSON")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--chunk", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--stream-count", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--peer-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--control-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.option:
        os.environ["GRPC_THROUGHPUT_OPTIONS"] = ";".join(args.option)
        for item in args.option:
            key, _, value = item.partition("=")
            OPTIONS.append((key, int(value) if value.lstrip("-").isdigit() else value))
    if args.child:
        _child(args.child, args.chunk, args.stream_count, args.port, args.peer_port, args.control_port)
        return 0
    configs = [("tcp", NBYTES, 1)]
    for pattern in args.patterns.split(","):
        if pattern not in ("grpc", "grpc_nocopy"):
            parser.error(f"unknown pattern {pattern!r}: grpc or grpc_nocopy")
        for mb in args.chunk_mb.split(","):
            for k in args.streams.split(","):
                configs.append((pattern, int(float(mb) * (1 << 20)), int(k)))
    runs = [_Run(*c) for c in configs]
    times: dict[int, list[float]] = {i: [] for i in range(len(runs))}
    cpus: dict[int, list[float]] = {i: [] for i in range(len(runs))}
    loads = [os.getloadavg()[0]]
    try:
        for _ in range(2):  # warm-up
            for run in runs:
                run.exchange()
        for _ in range(args.repeat):
            for i, run in enumerate(runs):
                seconds, cpu = run.exchange()
                times[i].append(seconds)
                cpus[i].append(cpu)
        loads.append(os.getloadavg()[0])
    finally:
        for run in runs:
            run.close()
    print(f"# 16 MiB each way at once, {args.repeat} exchanges per pattern, round robin; load "
          f"{loads[0]:.2f} -> {loads[-1]:.2f}, {os.cpu_count()} cpus, grpc {grpc.__version__}")
    base = statistics.median(times[0])
    rows = []
    for i, (pattern, chunk, streams) in enumerate(configs):
        median = statistics.median(times[i])
        row = {"pattern": pattern, "chunk_mib": chunk / (1 << 20), "streams": streams,
               "median_ms": round(median * 1e3, 2), "min_ms": round(min(times[i]) * 1e3, 2),
               "gb_per_s": round(NBYTES / median / 1e9, 2), "ratio_to_tcp": round(median / base, 2),
               # this process's CPU time per exchange, every thread (less sensitive to load)
               "cpu_ms": round(statistics.median(cpus[i]) * 1e3, 2)}
        rows.append(row)
        print(f"{pattern:12s} chunk {row['chunk_mib']:5.2f} MiB  streams {streams}  median "
              f"{row['median_ms']:7.2f} ms  min {row['min_ms']:7.2f}  {row['gb_per_s']:5.2f} GB/s  "
              f"{row['ratio_to_tcp']:4.2f}x tcp  cpu {row['cpu_ms']:6.2f} ms", flush=True)
    if args.json:
        record = {"command": "python benchmarks/grpc_throughput.py " + " ".join(argv or sys.argv[1:]),
                  "date": time.strftime("%Y-%m-%d"), "repeat": args.repeat, "grpc": grpc.__version__,
                  "load_average_1min": [round(v, 2) for v in loads], "cpus": os.cpu_count(),
                  "options": OPTIONS, "patterns": rows}
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
