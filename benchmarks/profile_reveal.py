"""Where a small opening's time goes: stage timestamps of reveal_4 (and mul_4) across 2 parties.

Two real party processes (gRPC, dealer process, PartyPool) run --n reveals of 4 elements
(and --n products of 4 elements, their corrections prefetched as the bench does). Timestamps
are taken with time.perf_counter (CLOCK_MONOTONIC on Linux: one clock for every process of
the machine) at each stage of a message from one party to the other, by wrapping the
transport's own functions from outside (the library is not changed):

  call      the reveal (or product) starts on the sender
  send      Communicator.exchange entered (Python above comm: op dispatch, shares, packing)
  queued    the frame is serialized and queued for the subscription's handler (_Outbox.send)
  dequeued  the sender's handler thread of the peer's subscription took it from the queue
            (the one hand-off between threads)
  accepted  the receiver's main thread holds the parsed frame (wire + gRPC core; the
            channel's thread parses the frame its subscription asked for, then wakes it)
  put       the frame is checked and in the mailbox (serde, checks: _Inbox._accept)
  woken     the receiver's main thread has the message (GrpcCommunicator._recv returns)
  done      the reveal (or product) returned on the receiver

Prints the median of every stage's duration (microseconds) over both directions, and the
median of the whole op; first, the CPU time of crypten_lite's own transport code per message
(framing and queuing; parsing, checking, mailbox), measured alone in one thread. With the library running inline sends (no queue), `dequeued` is
the same instant as `queued`.

    python benchmarks/profile_reveal.py [--n 300]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import crypten_lite
from crypten_lite import comm
from crypten_lite.mpc.launcher import PartyPool

STAGES = ("call", "send", "queued", "dequeued", "accepted", "put", "woken", "done")


def _party(n: int, op: str, switch_interval: float = 0.0) -> dict:
    import sys

    import torch
    from crypten_lite.comm import grpc_comm
    from crypten_lite.comm.communicator import Communicator
    from crypten_lite.mpc import offline
    c = comm.get()
    if switch_interval:
        sys.setswitchinterval(switch_interval)
    clock = time.perf_counter
    # stage -> {message seq: time}; a message is known by its sequence number on both sides
    log: dict[str, dict[int, float]] = {s: {} for s in STAGES}
    recording = [False]
    outbox = next(iter(c.outboxes.values()))
    peer = outbox.peer

    def mark(stage: str, seq: int) -> None:
        if recording[0]:
            log[stage][seq] = clock()

    exchange = Communicator.exchange

    def timed_exchange(self, outgoing, sources, rounds=1):
        mark("send", outbox.seq)
        return exchange(self, outgoing, sources, rounds)
    Communicator.exchange = timed_exchange

    send = outbox.send

    inline = getattr(outbox, "queue", None) is None
    if inline:
        def timed_send(*args, **kwargs):
            seq = outbox.seq
            send(*args, **kwargs)
            mark("queued", seq)
        outbox.send = timed_send
    else:
        real, pending = outbox.queue, {}

        class _Queue:
            def put(self, item):
                if recording[0] and item:
                    pending[id(item)] = outbox.seq
                    mark("queued", outbox.seq)
                real.put(item)

            def get(self):
                item = real.get()
                seq = pending.pop(id(item), None)
                if seq is not None:
                    log["dequeued"][seq] = clock()
                return item
        outbox.queue = _Queue()
        real.put([])  # wake the stream's thread so that its next get goes through _Queue

    accept = grpc_comm._Inbox._accept

    def timed_accept(self, src, frame, partial):
        # every message is marked, recording or not: a faster peer's message can arrive
        # between this party's barrier and its recording[0] = True; _breakdown keeps only
        # the sequence numbers the sender marked while recording
        log["accepted"][frame.seq] = clock()
        accept(self, src, frame, partial)
        log["put"][frame.seq] = clock()
    grpc_comm._Inbox._accept = timed_accept

    take = c._recv

    def timed_take(src):
        seq = c.mailbox._next_seq[src]
        out = take(src)
        mark("woken", seq)
        return out
    c._recv = timed_take

    g = torch.Generator().manual_seed(1)  # insecure-ok: benchmark inputs
    a, b = torch.randn(4, generator=g), torch.randn(4, generator=g)  # insecure-ok: inputs
    x, y = crypten_lite.cryptensor(a, src=0), crypten_lite.cryptensor(b, src=1)
    if op == "mul":
        with offline.record() as plan:
            x * y
    totals = []
    for i in range(n + 20):
        if op == "mul":
            offline.prefetch(plan)
        c.barrier()
        recording[0] = i >= 20
        start = clock()
        mark("call", outbox.seq)
        seq = c.mailbox._next_seq[peer]
        x.get_plain_text() if op == "reveal" else x * y
        mark("done", seq)
        recording[0] = False
        if i >= 20:
            totals.append(clock() - start)
    if inline:
        log["dequeued"] = dict(log["queued"])
    return {"rank": c.rank, "log": log, "total": totals}


def _breakdown(rows: list[dict]) -> dict:
    """Median duration of each stage, a message from party s to party r (both directions)."""
    out: dict[str, list[float]] = {}
    for s, r in ((0, 1), (1, 0)):
        ls, lr = rows[s]["log"], rows[r]["log"]
        sender = ("call", "send", "queued", "dequeued")
        receiver = ("accepted", "put", "woken", "done")
        seqs = set(ls["call"])
        for st in sender:
            seqs &= set(ls[st])
        for st in receiver:
            seqs &= set(lr[st])
        for i in sorted(seqs):
            points = [ls[st][i] for st in sender] + [lr[st][i] for st in receiver]
            for name, a, b in zip(STAGES[1:], points, points[1:]):
                out.setdefault(name, []).append((b - a) * 1e6)
    return {name: round(statistics.median(v), 1) for name, v in out.items()}


def cpu_per_message(n: int = 20000) -> dict:
    """CPU microseconds (process time) of crypten_lite's own Python per message of 4 int64 elements, one thread,
    no gRPC: framing and queuing it (_Outbox.send), then parsing the frame (_parse_frame),
    checking it into the mailbox (_Inbox._accept) and taking it out (Mailbox.take)."""
    import timeit
    import types

    import torch
    from crypten_lite.comm import grpc_comm
    from crypten_lite.comm.communicator import with_tag
    from crypten_lite.comm.mailbox import Mailbox
    session = "0123456789abcdef"
    tensor = with_tag(torch.arange(4), bytes(16))
    outbox = grpc_comm._Outbox.__new__(grpc_comm._Outbox)  # no stream: its queue is a list
    outbox.seq, outbox.failed, outbox.peer = 0, "", 1
    sent: list = []
    outbox.queue = types.SimpleNamespace(put=sent.append)
    send = timeit.Timer(lambda: outbox.send(session, 0, tensor), timer=time.process_time).timeit(n) / n
    raw = sent[0][0]
    comm = types.SimpleNamespace(config=types.SimpleNamespace(session=session, max_message_bytes=1 << 30),
                                 mailbox=Mailbox(1, 2, 10.0))
    inbox = grpc_comm._Inbox.__new__(grpc_comm._Inbox)  # no subscription: frames handed in
    inbox.comm, inbox.peer = comm, 0
    seq = iter(range(n))

    def receive():
        frame = grpc_comm._parse_frame(raw)
        frame.seq = next(seq)
        inbox._accept(0, frame, {})
        comm.mailbox.take(0)
    received = timeit.Timer(receive, timer=time.process_time).timeit(n) / n
    return {"send_us": round(send * 1e6, 1), "receive_us": round(received * 1e6, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--ops", default="reveal,mul")
    parser.add_argument("--switch-interval", type=float, default=0.0,
                        help="sys.setswitchinterval in the party processes (0: Python's 0.005 s)")
    parser.add_argument("--json", metavar="PATH",
                        help="also write the run as JSON (docs/reveal_profile.json feeds docs/ARCHITECTURE.md)")
    args = parser.parse_args()
    head = {"cpu_per_message": cpu_per_message(), "load_average_1min": round(os.getloadavg()[0], 2)}
    print(json.dumps(head))
    record = {"command": "python benchmarks/profile_reveal.py " + " ".join(sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), **head, "ops": []}
    for op in args.ops.split(","):
        with PartyPool(2, timeout=120) as pool:  # a fresh pool per op: the wrappers stay single
            rows = pool.run(_party, args.n, op, args.switch_interval)
            stages = _breakdown(rows)
            total = statistics.median(rows[0]["total"] + rows[1]["total"]) * 1e6
            row = {"op": f"{op}_4", "median_us": round(total, 1),
                   "stage_us_median": stages, "n": args.n,
                   "switch_interval": args.switch_interval or sys.getswitchinterval(),
                   "load_average_1min": round(os.getloadavg()[0], 2)}
            print(json.dumps(row))
            record["ops"].append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
