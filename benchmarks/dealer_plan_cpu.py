"""CPU time of one offline phase's dealer work for LeNet batch 1, stage by stage, in one process.

Records LeNet b1's correlation plan between two real party processes (PartyPool, as
`crypten-lite bench --only lenet_b1` does: a first forward masks the fixed weights, the
second is recorded), then replays that plan's offline exchange in this process, on the
thread's CPU clock (time.thread_time: another process's load does not count), --n times:

- rank 0: the plan's authenticated batch (protobuf and MAC);
- dealer: parsing, the checks, every party's seeded components and rank 0's corrections
  (DealerServer.answer's work: the handler, joining a request's small corrections, protobuf),
  serializing the reply; and chunk 0's corrections alone, what the dealer computes before it
  answers Prepare (the rest is computed when pulled, during the run);
- rank 0: parsing and decoding the reply, and cutting each request's corrections
  (provider._unjoin) as the run does;
- each party's own derivation of the plan's seeded components (rank 1 draws every
  component, rank 0 those the dealer does not replace).

    python benchmarks/dealer_plan_cpu.py [--n 20] [--json out.json]

Medians in ms. The same script on an older tree (PYTHONPATH) gives the before figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


# LeNet b1's private model and plan (shared with profile_lenet.py and profile_lenet_calls.py)
LENET_MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "profile_lenet_model.py")


def _record_plan() -> list:
    import runpy
    lenet_b1 = runpy.run_path(LENET_MODEL)  # by path: a party process cannot import benchmarks/
    plan = lenet_b1["recorded_plan"](lenet_b1["private_lenet_b1"]())
    return [[k, o, [list(s) for s in sh], list(p)] for k, o, sh, p in plan]


def measure(plan: list, n: int) -> dict:
    """Median thread-CPU ms of each stage of the plan's offline exchange (see the module)."""
    import torch

    from crypten_lite._proto import crypten_lite_pb2 as pb
    from crypten_lite.comm import dealer_rpc
    from crypten_lite.comm import dealer_prefetch
    from crypten_lite.comm.dealer_prefetch import CHUNK_BYTES
    from crypten_lite.comm.dealer_rpc import Request, batch_mac_proto, tensor_from_proto
    from crypten_lite.config import Config
    from crypten_lite.provider import DealerHandler, correlations
    from crypten_lite.random import fresh_seed, subkey
    import crypten_lite.provider as provider_mod

    torch.set_num_threads(1)
    keys = {r: subkey(fresh_seed(), "correlations") for r in range(2)}
    mac_key = subkey(fresh_seed(), "dealer-request-mac")
    base = 1000   # masks drawn before the recording keep their counters; the plan starts after
    requests = [Request(k, base + i, o, tuple(tuple(s) for s in sh), tuple(p)) for i, (k, o, sh, p) in enumerate(plan)]
    handler = DealerHandler()

    class _Server:  # DealerServer.answer's work without a server around it
        config = Config(world_size=2)
        answer = dealer_rpc.DealerServer.answer

        def __init__(self):
            self.handler = handler
    server = _Server()
    sizes = [handler.check(r, 2, server.config.max_message_bytes) for r in requests]
    chunk_counts = dealer_prefetch.chunk_counts
    if getattr(dealer_prefetch, "FIRST_CHUNK_REQUESTS", None) is None:  # before issue 32's chunks
        chunk_counts = lambda sizes, limit, first: dealer_prefetch.chunk_counts(sizes, limit)  # noqa: E731
    unjoin = getattr(provider_mod, "_unjoin", lambda request, answer: answer)
    stages: dict[str, list[float]] = {}

    def timed(name, fn):
        start = time.thread_time()
        out = fn()
        stages.setdefault(name, []).append((time.thread_time() - start) * 1e3)
        return out
    for _ in range(n + 2):  # two warm-ups (the weight masks' cache, lazy imports)
        def batch():
            protos = [r.to_proto("s") for r in requests]
            return pb.CorrelationBatch(requests=protos, mac=batch_mac_proto(mac_key, "s", protos)).SerializeToString()
        wire = timed("rank 0: batch (protobuf, MAC)", batch)

        def accept():
            got = [Request.from_proto(m) for m in pb.CorrelationBatch.FromString(wire).requests]
            for r in got:
                handler.check(r, 2, server.config.max_message_bytes)
            return got
        got = timed("dealer: parse and check", accept)
        reply = timed("dealer: corrections (derive, compute, protobuf)", lambda: server.answer(keys, got))
        # what the dealer computes before it answers Prepare: chunk 0 (the whole plan before
        # issue 32's streamed chunks, on a tree without FIRST_CHUNK_REQUESTS)
        first = chunk_counts(sizes, CHUNK_BYTES, getattr(dealer_prefetch, "FIRST_CHUNK_REQUESTS", None))
        timed("dealer: chunk 0, before it answers Prepare", lambda: server.answer(keys, got[:first[0]]))
        data = timed("dealer: reply serialized", lambda: pb.PrepareReply(chunks=[len(got)], first=reply).SerializeToString())

        def decode():
            msg = pb.PrepareReply.FromString(data).first
            tensors = [tensor_from_proto(t, server.config.max_message_bytes) for t in msg.tensors]
            out, i = [], 0
            for req, count in zip(requests, msg.counts):
                out.append(unjoin(req, tensors[i:i + count]))
                i += count
            return out
        timed("rank 0: reply decoded and cut", decode)
        for rank in (0, 1):
            def derive(rank=rank):
                for r in requests:
                    total = len(correlations.component_shapes(r.kind, r.op, r.shapes, r.params))
                    upto = total - correlations.correction_count(r.kind, r.params) if rank == 0 else None
                    correlations.derive(keys[rank], r.counter, r.kind, r.op, r.shapes, r.params, upto)
            timed(f"party {rank}: its seeded components", derive)
    out = {name: round(statistics.median(v[2:]), 3) for name, v in stages.items()}
    out["tensors in the reply"] = len(pb.PrepareReply.FromString(data).first.tensors)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20, help="repetitions measured (after two warm-ups)")
    parser.add_argument("--json", default="", help="write the figures to this file")
    args = parser.parse_args()
    if args.n < 1:
        parser.error("--n must be at least 1")
    from crypten_lite.mpc.launcher import PartyPool
    with PartyPool(2, timeout=300) as pool:
        plan = pool.run(_record_plan)[0]
    figures = measure(plan, args.n)
    figures.update(requests=len(plan), n=args.n, load_average_1min=round(os.getloadavg()[0], 2))
    for name, value in figures.items():
        print(f"{name:50} {value}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
