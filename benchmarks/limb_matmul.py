"""Ring matmul (int64, mod 2^64): torch's own int64 matmul against float64 BLAS on limbs.

The issue asked whether float64 GEMMs on 16-bit limbs (torch has no BLAS for int64) would make
the ring matmuls of the BERT-base shapes faster. Each operand is cut into four 16-bit limbs;
the ten limb products that reach below 2^64 are float64 GEMMs, exact while
(limbs summed) * K * 2^32 < 2^53 (K up to 2^19), then shifted and added in int64.

    python benchmarks/limb_matmul.py            # one line per shape: seconds of each, equal?

Measured on the project's 2-core machine (docs/ARCHITECTURE.md, "Ring matmuls"): torch's
int64 matmul is an order of magnitude faster at these shapes, so the ring keeps it.
"""

from __future__ import annotations

import statistics
import time

import torch

SHAPES = [(128, 768, 768), (128, 768, 3072), (128, 3072, 768)]   # BERT-base's linear layers


def limb_matmul(a: torch.Tensor, b: torch.Tensor, k: int = 16) -> torch.Tensor:
    """a @ b mod 2^64 for int64 a (m, K) and b (K, n), by float64 GEMMs on k-bit limbs."""
    mask = (1 << k) - 1
    count = 64 // k
    al = [((a >> (k * i)) & mask).double() for i in range(count)]
    bl = [((b >> (k * j)) & mask).double() for j in range(count)]
    out = torch.zeros(a.shape[0], b.shape[1], dtype=torch.int64)
    for s in range(count):
        acc = sum(al[i] @ bl[s - i] for i in range(s + 1))
        out += acc.to(torch.int64) << (k * s)
    return out


def _seconds(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    g = torch.Generator().manual_seed(0)  # benchmark operands, not shares
    for m, k, n in SHAPES:
        a = torch.randint(-2**63, 2**63 - 1, (m, k), dtype=torch.int64, generator=g)
        b = torch.randint(-2**63, 2**63 - 1, (k, n), dtype=torch.int64, generator=g)
        equal = torch.equal(a @ b, limb_matmul(a, b))
        ring = _seconds(lambda: a @ b)
        limbs = _seconds(lambda: limb_matmul(a, b))
        print(f"[{m}, {k}] @ [{k}, {n}]: int64 matmul {ring:.3f} s, float64 limbs {limbs:.3f} s "
              f"({limbs / ring:.0f}x), equal {equal}, torch threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
