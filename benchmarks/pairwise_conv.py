"""A conv2d triple's cross terms under provider pairwise, direct (Cheetah-style polynomial
encoding of the input and the kernel, provider/he_conv.py) against unfolded (im2col, then
the coefficient-encoded matmul): wall and CPU seconds per party and bytes, the two parties
in two processes joined by a pipe (no gRPC), the shares checked against torch's conv2d in
Z_2^64. Default: LeNet's two convolutions at batch 64.

    timeout 900 python benchmarks/pairwise_conv.py
    timeout 900 python benchmarks/pairwise_conv.py --batch 1

One JSON line per (convolution, method).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

from crypten_lite.provider import he, he_conv
from pairwise_he_cpu import PipeLink, run_pair  # benchmarks/ is on sys.path when run as a script

CONVS = {"conv1": ((1, 28, 28), (6, 1, 5, 5)), "conv2": ((6, 12, 12), (16, 6, 5, 5))}


def _unfolded(eng: he.CrossEngine, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """provider/pairwise.py's unfolded path (stride 1, no padding, groups 1)."""
    from crypten_lite.provider.pairwise import _unfold_index
    bsz, cin, h, wd = x.shape
    cout, _, kh, kw = w.shape
    idx = _unfold_index(cin, (h, wd), (kh, kw), (1, 1), (0, 0), (1, 1)).numpy()
    flat = np.concatenate([np.zeros((bsz, 1), np.uint64), x.reshape(bsz, -1)], axis=1)
    cols = flat[:, idx]                                            # [B, k, L]
    L = cols.shape[-1]
    rhs = cols.transpose(1, 0, 2).reshape(1, -1, bsz * L)
    out = eng.matmul(np.ascontiguousarray(w.reshape(1, cout, -1)), np.ascontiguousarray(rhs),
                     129 + int(np.ceil(np.log2(cin * kh * kw))))
    return out.reshape(cout, bsz, L).transpose(1, 0, 2).reshape(bsz, cout, h - kh + 1, wd - kw + 1)


def _party(rank: int, conn, method: str, x, w, out) -> None:
    link = PipeLink(rank, conn, he.default_params())
    eng, send, recv = link.engine, link.send, link.recv
    try:
        eng._ready(eng.params.primes_for(136))            # keys first: not timed
        eng._mm_units()                                   # (the Z_2^64 unit's too)
        send(b"go")
        recv()
        before = link.sent
        t, c = time.perf_counter(), time.process_time()
        if method == "direct":
            bits = 129 + int(np.ceil(np.log2(w.shape[1] * w.shape[2] * w.shape[3])))
            got = he_conv.cross_conv(eng, 1 << 40, x, w, (1, 1), (0, 0), (1, 1), bits)
        else:
            got = _unfolded(eng, x, w)
        out.put((rank, got, time.perf_counter() - t, time.process_time() - c, link.sent - before))
    finally:
        link.close()


def measure(name: str, batch: int, method: str) -> dict:
    xs_shape, ws_shape = CONVS[name]
    rng = np.random.default_rng(5)  # insecure-ok: benchmark inputs
    xs = [rng.integers(0, 2 ** 63, (batch,) + xs_shape, dtype=np.uint64) for _ in range(2)]
    ws = [rng.integers(0, 2 ** 63, ws_shape, dtype=np.uint64) for _ in range(2)]
    res = run_pair(_party, lambda r: (method, xs[r], ws[r]))
    t = [torch.from_numpy(v.view(np.int64)) for v in xs + ws]
    want = F.conv2d(t[0], t[3]) + F.conv2d(t[1], t[2])
    got = torch.from_numpy((res[0][0] + res[1][0]).view(np.int64))
    if not torch.equal(got, want):
        raise RuntimeError(f"{name} b{batch} {method}: the shares do not combine to the convolution")
    lay = he_conv.layout((batch,) + xs_shape, ws_shape, (1, 1), he.N)
    return {"conv": name, "batch": batch, "method": method, "wall_s": [round(res[r][1], 2) for r in range(2)],
            "cpu_s": [round(res[r][2], 2) for r in range(2)],
            "sent_mb": [round(res[r][3] / 1e6, 1) for r in range(2)],
            "direct_ciphertexts_per_prime": lay.ciphertexts() if lay else None,
            "load": round(os.getloadavg()[0], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--conv", action="append", choices=sorted(CONVS), help="default: both")
    parser.add_argument("--method", action="append", choices=["direct", "unfolded"], help="default: both")
    args = parser.parse_args()
    for name in args.conv or sorted(CONVS):
        for method in args.method or ["direct", "unfolded"]:
            print(json.dumps(measure(name, args.batch, method)), flush=True)


if __name__ == "__main__":
    main()
