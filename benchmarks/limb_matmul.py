"""Ring products (int64, mod 2^64): torch's own int64 ops against float64 BLAS on limbs.

torch has no BLAS for int64; `crypten_lite.provider.correlations.ring_by_limbs` cuts each
operand into four 16-bit limbs and runs the ten limb products that reach below 2^64 as float64
ops (exact while one output sums at most 2^19 products), then shifts and adds in int64. Which
is faster depends on the CPU by two orders of magnitude; `CRYPTEN_LITE_RING_GEMM=auto` (the
default) measures it once per process and takes the faster one. This script prints both, at
BERT-base's linear layers, a 1024 matmul and three of ResNet-18's convolutions:

    python benchmarks/limb_matmul.py            # one line per shape: seconds of each, equal?
    python benchmarks/limb_matmul.py --json docs/ring_gemm.jsonl   # and append them as JSON lines

docs/ARCHITECTURE.md's "Ring products" table is rendered from docs/ring_gemm.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time

import torch

from crypten_lite.bench import cpu_model
from crypten_lite.provider import correlations as corr

SHAPES = [  # (name, op, a's shape, b's shape, params in TRIPLE_OPS' layout)
    ("[128, 768] @ [768, 768]", "matmul", (128, 768), (768, 768), ()),
    ("[128, 768] @ [768, 3072]", "matmul", (128, 768), (768, 3072), ()),
    ("[128, 3072] @ [3072, 768]", "matmul", (128, 3072), (3072, 768), ()),
    ("[1024, 1024] @ [1024, 1024]", "matmul", (1024, 1024), (1024, 1024), ()),
    ("conv 3->64 7x7 /2 on 224x224", "conv2d", (1, 3, 224, 224), (64, 3, 7, 7), (2, 2, 3, 3, 1, 1, 1)),
    ("conv 64->64 3x3 on 56x56", "conv2d", (1, 64, 56, 56), (64, 64, 3, 3), (1, 1, 1, 1, 1, 1, 1)),
    ("conv 256->256 3x3 on 14x14", "conv2d", (1, 256, 14, 14), (256, 256, 3, 3), (1, 1, 1, 1, 1, 1, 1)),
]


def _seconds(fn, repeat: int = 3) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", metavar="FILE", help="append one JSON line per shape to FILE")
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)  # benchmark operands, not shares
    machine, kernels = cpu_model(), torch.backends.cpu.get_cpu_capability()
    auto = "limbs" if corr._limbs_faster() else "int64"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or "unknown"
    print(f"{machine}, torch kernels {kernels}, {torch.get_num_threads()} threads; auto picks {auto}")
    for name, op, a_shape, b_shape, params in SHAPES:
        a = torch.randint(-2**63, 2**63 - 1, a_shape, dtype=torch.int64, generator=g)
        b = torch.randint(-2**63, 2**63 - 1, b_shape, dtype=torch.int64, generator=g)
        float_op = {"matmul": corr._float_matmul}.get(op, _int64[op])
        ring = _seconds(lambda: _int64[op](a, b, params))
        limbs = _seconds(lambda: corr.ring_by_limbs(float_op, a, b, params))
        equal = torch.equal(_int64[op](a, b, params), corr.ring_by_limbs(float_op, a, b, params))
        print(f"{name}: int64 {ring:.3f} s, float64 limbs {limbs:.3f} s ({ring / limbs:.1f}x), equal {equal}")
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps({"shape": name, "op": op, "int64_seconds": round(ring, 4),
                                    "limbs_seconds": round(limbs, 4), "equal": equal, "auto": auto,
                                    "cpu_model": machine, "torch_kernels": kernels,
                                    "threads": torch.get_num_threads(), "commit": commit,
                                    "load_average_1min": round(os.getloadavg()[0], 1),
                                    "date": time.strftime("%Y-%m-%d")}) + "\n")


_int64 = {
    "matmul": lambda a, b, p: corr._matmul(a, b),
    "conv2d": lambda a, b, p: torch.nn.functional.conv2d(a, b, **corr._conv_params(p, 2)),
}


if __name__ == "__main__":
    main()
