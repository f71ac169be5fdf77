"""Where mul 1M's online time goes, stage by stage, on both parties: timestamps, not a profiler.

Two real party processes (gRPC, the dealer process, PartyPool) run x * y on --n elements,
each product's triple and correction prefetched first (offline.prefetch, as `crypten-lite
bench` does), then --products timed products. Timestamps are taken with time.perf_counter
(CLOCK_MONOTONIC on Linux: one clock for every process of the machine) by wrapping the
library's own functions from outside (the library is not changed), on the main thread and on
the thread that reads the peer's chunks (the main thread, from its subscription):

  triple        provider.get: the prefetched triple handed over (no AES online)
  encode        x - a and y - b written into the one outgoing message (open_differences)
  send          framing and queuing the message's chunks (_Outbox.send: the copy-on-send copy)
  wait          the main thread waits for the peer's message and reads it (GrpcCommunicator._recv)
  sum           check and sum of the opening in place (the rest of _open_flat)
  recombine     Beaver: c + e b + a d (+ e d on rank 0), addcmul in place (beaver.beaver after
                the opening), the dealer's correction included
  truncate      local truncation in place (truncation.truncate)

and as the main thread takes the peer's chunks (its subscription, each chunk parsed by the channel's thread): when the
peer's first chunk was parsed (after gRPC's own copies), when its last one was in the buffer,
and the time spent on them (_Inbox._accept: checks and the copy of each chunk into the
preallocated tensor).
Prints one JSON line per party with the median of each over the products (milliseconds from
that party's start of the product, or durations), and writes the run with --json (docs/
mul_profile.json feeds docs/ARCHITECTURE.md through scripts/gen_doc_figures.py).

    python benchmarks/profile_mul_stages.py [--n 1000000] [--products 10] [--json PATH]

Seconds depend on the load of the machine; the run records the 1-minute load average.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import time
from pathlib import Path

import crypten_lite
from crypten_lite import comm
from crypten_lite.mpc.launcher import PartyPool

MAIN_STAGES = ("triple", "encode", "send", "wait", "sum", "recombine", "truncate")


def _party(n: int, products: int) -> dict:
    import torch

    from crypten_lite.comm import grpc_comm
    from crypten_lite.mpc import beaver, offline, primitives, truncation
    from crypten_lite.session import current
    c = comm.get()
    clock = time.perf_counter
    # (name, start, end, minor page faults of the calling thread) of the product being timed
    events: list[tuple[str, float, float, int]] = []
    recording, receiving = [False], [False]

    def faults() -> int:  # pages this thread touched for the first time (deterministic, unlike time)
        return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt

    def timed(name: str, fn):
        def wrapper(*args, **kwargs):
            if not recording[0]:
                return fn(*args, **kwargs)
            start, before = clock(), faults()
            try:
                return fn(*args, **kwargs)
            finally:
                events.append((name, start, clock(), faults() - before))
        return wrapper

    provider = current().provider
    provider.get = timed("triple", provider.get)
    beaver.open_differences = timed("opening", beaver.open_differences)
    primitives._open_flat = timed("open_flat", primitives._open_flat)
    beaver.beaver = timed("beaver", beaver.beaver)
    truncation.truncate = timed("truncate", truncation.truncate)
    for outbox in c.outboxes.values():
        outbox.send = timed("send", outbox.send)
    c._recv = timed("wait", c._recv)
    accept = grpc_comm._Inbox._accept

    def timed_accept(self, src, frame, partial):  # the reading thread: one call per chunk
        if not receiving[0] or frame.seq >= (1 << 63) or len(frame.data) <= (1 << 16):
            return accept(self, src, frame, partial)
        start, before = clock(), faults()
        try:
            return accept(self, src, frame, partial)
        finally:
            events.append(("chunk", start, clock(), faults() - before))
    grpc_comm._Inbox._accept = timed_accept

    g = torch.Generator().manual_seed(1)  # insecure-ok: benchmark inputs, not shares
    a, b = torch.randn(n, generator=g), torch.randn(n, generator=g)  # insecure-ok: inputs
    x, y = crypten_lite.cryptensor(a, src=0), crypten_lite.cryptensor(b, src=1)
    with offline.record() as plan:
        x * y
    runs = []
    for i in range(products + 2):  # two warm-up products
        offline.prefetch(plan)
        events.clear()
        # the reading records from before the barrier: a faster peer's first chunk may
        # arrive between this party's barrier and its own start of the product
        receiving[0] = i >= 2
        c.barrier()
        recording[0] = i >= 2
        start, before = clock(), faults()
        x * y
        end, main_faults = clock(), faults() - before
        recording[0] = receiving[0] = False
        if i >= 2:
            runs.append({"start": start, "end": end, "events": list(events), "main_faults": main_faults})
    return {"rank": c.rank, "runs": runs, "torch_threads": torch.get_num_threads()}


def _stages(run: dict, peer: dict) -> dict[str, float]:
    """One product on one party: each stage in milliseconds (see the module docstring)."""
    first, faults = {}, {}
    for name, s, e, f in run["events"]:
        first.setdefault(name, (s, e))
        faults[name] = faults.get(name, 0) + f
    chunks = [(s, e) for name, s, e, _ in run["events"] if name == "chunk"]
    t0 = run["start"]
    ms = lambda v: (v) * 1e3  # noqa: E731
    opening, flat, wait = first["opening"], first["open_flat"], first["wait"]
    beaver_end = first["beaver"][1]
    out = {
        "triple": ms(first["triple"][1] - first["triple"][0]),
        "encode": ms(flat[0] - opening[0]),
        "send": sum(ms(e - s) for name, s, e, _ in run["events"] if name == "send"),
        "wait": ms(wait[1] - wait[0]),
        "sum": ms(flat[1] - wait[1]),
        "recombine": ms(beaver_end - opening[1]),
        "truncate": ms(first["truncate"][1] - first["truncate"][0]),
        "total": ms(run["end"] - t0),
        # the receiving thread, from this party's start of the product
        "first_chunk_in": ms(chunks[0][0] - t0) if chunks else 0.0,
        "last_chunk_done": ms(chunks[-1][1] - t0) if chunks else 0.0,
        "handler": sum(ms(e - s) for s, e in chunks),
        "chunks": len(chunks),
        # the peer's message: from its first chunk queued to its first and last chunk here
        "send_started": ms(first["send"][0] - t0),
        "wait_started": ms(wait[0] - t0),
    }
    # minor page faults: the main thread's whole product, and its parts; the receiving thread's
    out["faults_main"] = run["main_faults"]
    for name in ("opening", "send", "wait", "beaver", "truncate", "chunk"):
        out["faults_" + name] = faults.get(name, 0)
    peer_first = {}
    for name, s, e, _ in peer["events"]:
        peer_first.setdefault(name, (s, e))
    out["peer_send_to_first_chunk"] = ms(chunks[0][0] - peer_first["send"][0]) if chunks else 0.0
    out["peer_send_done_to_last_chunk"] = ms(chunks[-1][1] - peer_first["send"][1]) if chunks else 0.0
    return out


def summarize(rows: list[dict]) -> list[dict]:
    """Per party: the median of each stage over the products."""
    out = []
    for rank, row in enumerate(rows):
        peer = rows[1 - rank]
        per = [_stages(run, prun) for run, prun in zip(row["runs"], peer["runs"])]
        med = {k: round(statistics.median(p[k] for p in per), 2) for k in per[0]}
        med.update(rank=rank, torch_threads=row["torch_threads"], products=len(per))
        out.append(med)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--products", type=int, default=10)
    parser.add_argument("--json", metavar="PATH",
                        help="also write the run as JSON (docs/mul_profile.json feeds docs/ARCHITECTURE.md)")
    args = parser.parse_args()
    load = [os.getloadavg()[0]]
    with PartyPool(2, timeout=300) as pool:
        rows = pool.run(_party, args.n, args.products)
    load.append(os.getloadavg()[0])
    parties = summarize(rows)
    for p in parties:
        print(json.dumps(p))
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parent).stdout.strip()
        record = {"command": "python benchmarks/profile_mul_stages.py" + (" --n %d" % args.n if args.n != 1_000_000 else "")
                  + (" --products %d" % args.products if args.products != 10 else "") + f" --json {args.json}",
                  "date": time.strftime("%Y-%m-%d"), "commit": commit, "n": args.n,
                  "load_average_1min": [round(v, 2) for v in load], "cpus": os.cpu_count(),
                  "parties": parties}
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
