"""CPU seconds of each party in one HE cross product (provider/he.py's CrossEngine), the two
parties in two processes joined by a pipe (no gRPC): where the work falls, which is what
bounds the wall clock on a quiet machine (TenSEAL holds the GIL inside SEAL calls, so each
party's process uses about one core). Checks the shares against the exact product.

    timeout 600 python benchmarks/pairwise_he_cpu.py --mul 131072 --matmul 128

Prints one JSON line per product: wall and CPU seconds per party, bytes each party sent,
the load average. `--plain-bits 60` measures the former parameters (4 x 50-bit data primes
+ an 18-bit special prime, three 60-bit plaintext primes, results returned at two primes:
SEAL lifts each plaintext by its slow path, t being above the data primes) against the
provider's (`--plain-bits 0`: 3 x 60 + 38, four 45-bit plaintext primes, returned at one
prime); docs/protocols.md, "Parameters (128-bit security)":

    timeout 900 python benchmarks/pairwise_he_cpu.py --matmul 256 --mul 131072 --plain-bits 0 --plain-bits 60

`--profile` runs each party on one thread (CRYPTEN_LITE_HE_THREADS=1) under cProfile and adds
party 0's largest shares of CPU by function (SEAL's calls are native: each is one entry):

    timeout 900 python benchmarks/pairwise_he_cpu.py --matmul 256 --mul 0 --profile

`--lenet B` times LeNet's HE weight triples at batch B (both convolutions, the three linear
layers), CPU seconds and MB sent per party:

    timeout 900 python benchmarks/pairwise_he_cpu.py --mul 0 --matmul 0 --lenet 1 --lenet 64
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import threading
import time

import numpy as np

from crypten_lite.provider import he
from crypten_lite.random import PRG


def _params(plain_bits: int) -> he.HEParams:
    """The provider's parameters (plain_bits 0), or t of plain_bits bits: 45 over 3 x 60 + 38
    (returned at one prime), 60 (the former) over 4 x 50 + 18 (returned at two)."""
    if not plain_bits:
        return he.default_params()
    s = he._sealapi()
    data, ret = ([50, 50, 50, 50, 18], 2) if plain_bits > 46 else ([60, 60, 60, 38], 1)
    coeff = tuple(m.value() for m in s.CoeffModulus.Create(he.N, data))
    plain = tuple(m.value() for m in s.PlainModulus.Batching(he.N, [plain_bits] * he.MAX_PRIMES))
    mm = he.default_params()                      # matmul: the Z_2^64 engine either way
    return he.HEParams(he.N, coeff, plain, return_primes=ret, mm_moduli=mm.mm_moduli,
                       mm_t_bits=mm.mm_t_bits, mm_return=mm.mm_return)


def _shares(prof, top: int = 14) -> dict:
    """The `top` functions' shares of the profiled time (own time, SEAL's native calls by name)."""
    import pstats
    stats = pstats.Stats(prof).stats
    total = sum(v[2] for v in stats.values()) or 1.0
    rows = sorted(((v[2], f"{k[2]}" if k[0] == "~" else f"{os.path.basename(k[0])}:{k[2]}")
                   for k, v in stats.items()), reverse=True)[:top]
    return {name.strip("<>").replace("built-in method ", ""): round(t / total, 3) for t, name in rows}


class PipeLink:
    """One party's end of a two-process HE benchmark: a he.CrossEngine whose messages cross a
    multiprocessing Pipe (no gRPC). Sends never wait for the peer (a pump thread, as the gRPC
    outboxes); a receive waits at most 600 s. `sent` counts the bytes sent; close() stops the
    pump and the engine. benchmarks/pairwise_conv.py uses it too."""

    def __init__(self, rank: int, conn, params) -> None:
        prg = PRG(os.urandom(32))
        self.rank, self.conn, self.sent = rank, conn, 0
        self.box: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.engine = he.CrossEngine(rank, params, self.send, self.recv,
                                     lambda shape: prg.draw(tuple(shape)).numpy().view(np.uint64))

    def _pump(self) -> None:
        while (d := self.box.get()) is not None:
            self.conn.send_bytes(d)

    def send(self, d: bytes) -> None:
        self.sent += len(d)
        self.box.put(d)

    def recv(self) -> bytes:
        if not self.conn.poll(600):
            raise TimeoutError(f"party {self.rank}: no message from the peer in 600 s")
        return self.conn.recv_bytes()

    def close(self) -> None:
        self.box.put(None)
        self.engine.close()


def run_pair(party, args_of, tail: tuple = ()) -> dict:
    """Run `party(rank, conn, *args_of(rank), out, *tail)` in two spawned processes joined by a
    Pipe; each puts (rank, ...) on `out`. Returns {rank: (...)}; no process is left behind."""
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    out = ctx.Queue()
    procs = [ctx.Process(target=party, args=(r, (a, b)[r], *args_of(r), out, *tail)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        return dict((v[0], v[1:]) for v in (out.get(timeout=900), out.get(timeout=900)))
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()


def _party(rank: int, conn, what: str, x, out, plain_bits: int = 0, profile: bool = False) -> None:
    params = _params(plain_bits)
    link = PipeLink(rank, conn, params)
    eng, send, recv = link.engine, link.send, link.recv
    try:
        eng._ready(params.primes_for(137))            # keys first: not timed
        if what == "matmul" and hasattr(eng, "_mm_units"):
            eng._mm_units()                           # the Z_2^64 unit's keys (he_pow2.py)
        send(b"go")
        recv()
        t, c = time.perf_counter(), time.process_time()
        if profile:
            import cProfile
            prof = cProfile.Profile(time.process_time)     # CPU time: load does not count
            prof.enable()
        got = eng.matmul(x[0], x[1], 137) if what == "matmul" else eng.elementwise([x], 129)
        shares = None
        if profile:
            prof.disable()
            shares = _shares(prof)
        out.put((rank, got, time.perf_counter() - t, time.process_time() - c, link.sent, shares))
    finally:
        link.close()


def measure(what: str, n: int, plain_bits: int = 0, profile: bool = False) -> dict:
    rng = np.random.default_rng(5)  # insecure-ok: benchmark inputs
    if what == "matmul":
        xs = [[rng.integers(0, 2 ** 63, (1, n, n), dtype=np.uint64) for _ in range(2)] for _ in range(2)]
    else:
        xs = [rng.integers(0, 2 ** 63, n, dtype=np.uint64) for _ in range(2)]
    res = run_pair(_party, lambda r: (what, xs[r]), (plain_bits, profile))
    with np.errstate(over="ignore"):
        if what == "matmul":
            o = [x.astype(object) for x in (xs[0][0], xs[0][1], xs[1][0], xs[1][1])]
            ref = ((np.matmul(o[0], o[3]) + np.matmul(o[2], o[1])) % (1 << 64)).astype(np.uint64)
        else:
            ref = xs[0] * xs[1]
        exact = bool(np.array_equal(res[0][0] + res[1][0], ref))
    if not exact:
        raise RuntimeError(f"{what} {n}: the shares do not combine to the product")
    return {"product": what, "size": n, "wall_s": [round(res[r][1], 2) for r in range(2)],
            "cpu_s": [round(res[r][2], 2) for r in range(2)],
            "sent_mb": [round(res[r][3] / 1e6, 1) for r in range(2)],
            "load": round(os.getloadavg()[0], 1),
            **({"party0_cpu_shares": res[0][4]} if profile else {})}


def _lenet_party(rank: int, conn, batch: int, out) -> None:
    """LeNet's HE weight triples' cross products as provider pairwise makes them (conv1 and
    conv2 direct or unfolded by he_conv.preferred, the three linear layers as matmuls):
    CPU seconds and bytes sent per step, keys made first (not timed)."""
    from crypten_lite.provider import he_conv
    params = he.default_params()
    link = PipeLink(rank, conn, params)
    eng = link.engine
    try:
        eng._ready(params.primes_for(137))
        if hasattr(eng, "_mm_units"):
            eng._mm_units()
        link.send(b"go")
        link.recv()
        rng = np.random.default_rng(3 + rank)  # insecure-ok: benchmark inputs

        def ring(*shape):
            return rng.integers(0, 2 ** 63, shape, dtype=np.uint64)

        def conv(xs, ws, bits):
            x, w = ring(*xs), ring(*ws)
            if he_conv.preferred(xs, ws, (1, 1), (0, 0), (1, 1), 1, he.N):
                return he_conv.cross_conv(eng, 1 << 27, x, w, (1, 1), (0, 0), (1, 1), bits)
            lay = he_conv.layout(xs, ws, (1, 1), he.N)     # unfolded: [M, C kh kw] x [C kh kw, B L]
            k = ws[1] * ws[2] * ws[3]
            return eng.matmul(w.reshape(1, ws[0], k), ring(1, k, xs[0] * lay.hout * lay.wout), bits)
        steps = [("conv1", lambda: conv((batch, 1, 28, 28), (6, 1, 5, 5), 134)),
                 ("conv2", lambda: conv((batch, 6, 12, 12), (16, 6, 5, 5), 137)),
                 ("fc", lambda: [eng.matmul(ring(1, batch, k), ring(1, k, n), 137)
                                 for k, n in ((256, 120), (120, 84), (84, 10))])]
        res = {}
        for name, fn in steps:
            c, before = time.process_time(), link.sent
            fn()
            res[name] = [round(time.process_time() - c, 3), round((link.sent - before) / 1e6, 2)]
        out.put((rank, res))
    finally:
        link.close()


def measure_lenet(batch: int) -> dict:
    res = run_pair(_lenet_party, lambda r: (batch,))
    return {"lenet_weight_triples": batch,
            "cpu_s": [round(sum(v[0] for v in res[r][0].values()), 2) for r in range(2)],
            "sent_mb": [round(sum(v[1] for v in res[r][0].values()), 1) for r in range(2)],
            "rank0_steps": res[0][0], "load": round(os.getloadavg()[0], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mul", type=int, default=131072, help="elements (0: skip)")
    parser.add_argument("--matmul", type=int, default=128, help="n of an [n,n]x[n,n] product (0: skip)")
    parser.add_argument("--plain-bits", type=int, action="append",
                        help="0: the provider's parameters (default); 45: the fast-lift "
                             "alternative; repeat to run both in one go")
    parser.add_argument("--profile", action="store_true",
                        help="one thread per party, cProfile: party 0's CPU shares by function")
    parser.add_argument("--lenet", type=int, action="append", default=[],
                        help="batch of LeNet's HE weight triples (conv1, conv2, fc) to time; repeat")
    args = parser.parse_args()
    for batch in args.lenet:
        print(json.dumps(measure_lenet(batch)), flush=True)
    if args.lenet and not (args.mul or args.matmul):
        return
    if args.profile:
        os.environ[he.THREADS_ENV] = "1"        # the spawned parties inherit it
    for bits in args.plain_bits or [0]:
        for what, n in (("mul", args.mul), ("matmul", args.matmul)):
            if n:
                params = "provider" if not bits else (
                    "4x50+18, t 60, returned at 2" if bits > 46 else f"3x60+38, t {bits}, returned at 1")
                print(json.dumps({"params": params, **measure(what, n, bits, args.profile)}), flush=True)


if __name__ == "__main__":
    main()
