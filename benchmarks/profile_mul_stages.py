"""Where mul 1M's online time goes, stage by stage, on both parties: timestamps, not a profiler.

Two real party processes (gRPC, the dealer process, PartyPool) run x * y on --n elements,
each product's triple and correction prefetched first (offline.prefetch, as `crypten-lite
bench` does), then --products timed products. Timestamps are taken with time.perf_counter
(CLOCK_MONOTONIC on Linux: one clock for every process of the machine) by wrapping the
library's own functions from outside (the library is not changed). A product's opening
streams (comm/streamed.py): the differences are written straight into the frames, and the
main thread sums each of the peer's chunks and recombines that range as it arrives:

  triple        provider.get: the prefetched triple handed over (no AES online)
  fill          x - a and y - b written straight into the frames, each queued as written
                (streamed.send_filled: no copy-on-send copy)
  idle          from the last frame queued to the peer's first chunk in hand (the wire)
  read          the rest of the wait (GrpcCommunicator._recv_into): gRPC handing the peer's
                chunks over, checks
  sum           the peer's chunks summed with this party's values (SumSink, per chunk)
  recombine     Beaver c + e b + a d (+ e d on rank 0) and the local truncation, range by
                range as each chunk is summed (the opening's on_range)
  total         the whole product

and the wire: from the peer's first frame queued to its first chunk here, and from its last
frame queued to its last chunk summed here.
Prints one JSON line per party with the median of each over the products (milliseconds, or
counts), and writes the run with --json (docs/mul_profile.json feeds docs/ARCHITECTURE.md
through scripts/gen_doc_figures.py).

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

MAIN_STAGES = ("triple", "fill", "idle", "read", "sum", "recombine")


def _party(n: int, products: int) -> dict:
    import torch

    from crypten_lite.comm import streamed
    from crypten_lite.mpc import beaver, offline
    from crypten_lite.session import current
    c = comm.get()
    clock = time.perf_counter
    # (name, start, end, minor page faults of the calling thread) of the product being timed
    events: list[tuple[str, float, float, int]] = []
    recording = [False]

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
    opening = beaver.open_differences

    def timed_opening(pairs, dst=None, on_range=None):
        return opening(pairs, dst, on_range=None if on_range is None else timed("recombine", on_range))
    beaver.open_differences = timed("opening", timed_opening)
    streamed.send_filled = timed("fill", streamed.send_filled)
    streamed.SumSink.take_tensor = timed("chunk", streamed.SumSink.take_tensor)
    c._recv_into = timed("wait", c._recv_into)

    g = torch.Generator().manual_seed(1)  # insecure-ok: benchmark inputs, not shares
    a, b = torch.randn(n, generator=g), torch.randn(n, generator=g)  # insecure-ok: inputs
    x, y = crypten_lite.cryptensor(a, src=0), crypten_lite.cryptensor(b, src=1)
    with offline.record() as plan:
        x * y
    runs = []
    for i in range(products + 2):  # two warm-up products
        offline.prefetch(plan)
        events.clear()
        c.barrier()
        recording[0] = i >= 2
        start, before = clock(), faults()
        x * y
        end, main_faults = clock(), faults() - before
        recording[0] = False
        if i >= 2:
            runs.append({"start": start, "end": end, "events": list(events), "main_faults": main_faults})
    return {"rank": c.rank, "runs": runs, "torch_threads": torch.get_num_threads()}


def _stages(run: dict, peer: dict) -> dict[str, float]:
    """One product on one party: each stage in milliseconds (see the module docstring)."""
    first: dict[str, tuple[float, float]] = {}
    total: dict[str, float] = {}
    for name, s, e, _ in run["events"]:
        first.setdefault(name, (s, e))
        total[name] = total.get(name, 0.0) + e - s
    chunks = [(s, e) for name, s, e, _ in run["events"] if name == "chunk"]
    if "fill" not in first or not chunks:
        raise SystemExit("the product did not stream (comm/streamed.py): nothing to profile here")
    t0 = run["start"]
    ms = lambda v: (v) * 1e3  # noqa: E731
    fill, wait = first["fill"], first["wait"]
    peer_fill = next((s, e) for name, s, e, _ in peer["events"] if name == "fill")
    out = {
        "triple": ms(total["triple"]),
        "fill": ms(total["fill"]),
        "idle": ms(max(0.0, chunks[0][0] - fill[1])),
        "read": ms(total["wait"] - total["chunk"] - max(0.0, chunks[0][0] - wait[0])),
        "sum": ms(total["chunk"] - total.get("recombine", 0.0)),
        "recombine": ms(total.get("recombine", 0.0)),
        "total": ms(run["end"] - t0),
        "chunks": len(chunks),
        "first_chunk_in": ms(chunks[0][0] - t0),
        "last_chunk_done": ms(chunks[-1][1] - t0),
        "peer_fill_to_first_chunk": ms(chunks[0][0] - peer_fill[0]),
        "peer_fill_done_to_last_chunk": ms(chunks[-1][1] - peer_fill[1]),
        "faults_main": run["main_faults"],
    }
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
