"""CPU time of the transport per operation, per party process (every thread), beside wall time.

    python benchmarks/transport_cpu.py [--reveals 200] [--exchanges 30] [--json out.jsonl]

Two real party processes (PartyPool: gRPC, the dealer process) run --reveals reveals of 4
elements (after 20 untimed ones), then --exchanges exchanges of 16 MiB each way (both send,
then both receive, as transport_16MB). For each party it prints the process's CPU time per
operation (time.process_time: the main thread and every gRPC thread) and the wall time per
operation: reveal_4 in microseconds, transport_16MB in milliseconds. CPU time depends much
less on the machine's load than wall time, so alternating runs of two trees (PYTHONPATH)
compare transports on a busy machine; the line ends with the 1-minute load average.

Each party also splits its CPU time per operation by thread (`reveal_4_threads_us`,
`transport_16MB_threads_ms`), from the scheduler's own count of each thread's time on a CPU
(/proc/self/task/TID/schedstat, nanoseconds; Linux only, else the split is left out): the
party's main thread (framing, checks, the copy-on-send and assembly copies, the op itself),
gRPC's server handler threads (this party's subscription answers: gRPC's copy of each frame
into its slice, the socket writes it makes inline), the channel thread (receives and parses
the peer's frames: gRPC Python's copies of each message into a bytes object), gRPC's event
engine threads (socket reads and writes), the server's completion-queue thread (which wakes a
handler when its frame is sent) and the rest (the watchdog, the launcher's queue). Its
values add up to the process's CPU time only roughly: process_time and schedstat count at
different moments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from crypten_lite.mpc.launcher import PartyPool


def _thread_times() -> dict[int, int]:
    """Nanoseconds on a CPU so far of each thread of this process ({} where the kernel does not
    say: not Linux)."""
    times = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return {}
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                times[int(tid)] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
    return times


def _role(tid: int, main: int, names: dict[int, str]) -> str:
    """The part a thread of a party process plays in the transport (see the module's text)."""
    if tid == main:
        return "main"
    name = names.get(tid)
    if name is not None:
        if name.startswith("crypten-lite-grpc"):
            return "grpc_handler"
        if name.endswith("(_run)"):  # grpc's channel spin threads (_run_with_context)
            return "grpc_channel"
        if name.endswith("(_serve)"):  # the server's completion queue
            return "grpc_server_queue"
        return "other"
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            comm = f.read().strip()
    except OSError:
        return "other"
    return "grpc_event_engine" if comm.startswith("event_engine") else "other"


def _split(before: dict[int, int], after: dict[int, int], operations: int, unit: float) -> dict[str, float]:
    """CPU per operation of each thread role between two _thread_times(), in `unit` seconds."""
    import threading
    names = {t.native_id: t.name for t in threading.enumerate()}
    main = threading.get_native_id()
    split: dict[str, float] = {}
    for tid, ns in after.items():
        role = _role(tid, main, names)
        split[role] = split.get(role, 0.0) + (ns - before.get(tid, 0)) / 1e9
    return {role: round(seconds / operations / unit, 2 if unit == 1e-3 else 1)
            for role, seconds in sorted(split.items())}


def _party(reveals: int, exchanges: int) -> dict:
    import torch

    import crypten_lite
    from crypten_lite import comm
    c = comm.get()
    out: dict = {"rank": c.rank}
    x = crypten_lite.cryptensor(torch.arange(4.0), src=0)
    for _ in range(20):
        x.get_plain_text()
    c.barrier()
    threads = _thread_times()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(reveals):
        x.get_plain_text()
    out["reveal_4_cpu_us"] = round((time.process_time() - cpu) / reveals * 1e6, 1)
    out["reveal_4_wall_us"] = round((time.perf_counter() - wall) / reveals * 1e6, 1)
    if threads:
        out["reveal_4_threads_us"] = _split(threads, _thread_times(), reveals, 1e-6)
    big = torch.zeros(2_097_152, dtype=torch.int64)  # 16 MiB
    c.exchange({1 - c.rank: big}, [1 - c.rank])
    c.barrier()
    threads = _thread_times()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(exchanges):
        got = c.exchange({1 - c.rank: big}, [1 - c.rank])
    out["transport_16MB_cpu_ms"] = round((time.process_time() - cpu) / exchanges * 1e3, 2)
    out["transport_16MB_wall_ms"] = round((time.perf_counter() - wall) / exchanges * 1e3, 2)
    if threads:
        out["transport_16MB_threads_ms"] = _split(threads, _thread_times(), exchanges, 1e-3)
    out["exact"] = bool(torch.equal(got[1 - c.rank], big))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reveals", type=int, default=200)
    parser.add_argument("--exchanges", type=int, default=30)
    parser.add_argument("--json", default="", help="append one JSON line per party to this file")
    args = parser.parse_args()
    if args.reveals < 1 or args.exchanges < 1:
        parser.error("--reveals and --exchanges must be at least 1")
    with PartyPool(2, timeout=300) as pool:
        rows = pool.run(_party, args.reveals, args.exchanges)
    load = round(os.getloadavg()[0], 2)
    for row in rows:
        row.update(load_average_1min=load, cpus=os.cpu_count())
        print(json.dumps(row))
    if args.json:
        with open(args.json, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
