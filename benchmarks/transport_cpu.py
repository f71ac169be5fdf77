"""CPU time of the transport per operation, per party process (every thread), beside wall time.

    python benchmarks/transport_cpu.py [--reveals 200] [--exchanges 30] [--json out.jsonl]

Two real party processes (PartyPool: gRPC, the dealer process) run --reveals reveals of 4
elements (after 20 untimed ones), then --exchanges exchanges of 16 MiB each way (both send,
then both receive, as transport_16MB). For each party it prints the process's CPU time per
operation (time.process_time: the main thread and every gRPC thread) and the wall time per
operation: reveal_4 in microseconds, transport_16MB in milliseconds. CPU time depends much
less on the machine's load than wall time, so alternating runs of two trees (PYTHONPATH)
compare transports on a busy machine; the line ends with the 1-minute load average.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from crypten_lite.mpc.launcher import PartyPool


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
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(reveals):
        x.get_plain_text()
    out["reveal_4_cpu_us"] = round((time.process_time() - cpu) / reveals * 1e6, 1)
    out["reveal_4_wall_us"] = round((time.perf_counter() - wall) / reveals * 1e6, 1)
    big = torch.zeros(2_097_152, dtype=torch.int64)  # 16 MiB
    c.exchange({1 - c.rank: big}, [1 - c.rank])
    c.barrier()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(exchanges):
        got = c.exchange({1 - c.rank: big}, [1 - c.rank])
    out["transport_16MB_cpu_ms"] = round((time.process_time() - cpu) / exchanges * 1e3, 2)
    out["transport_16MB_wall_ms"] = round((time.perf_counter() - wall) / exchanges * 1e3, 2)
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
