"""The true noise of provider pairwise's Z_2^64 matmul / conv engine (provider/he_pow2.py),
measured with the owner's secret key (SEAL's noise budget cannot see a plaintext modulus of
2^64): for each case, `products` products of fresh encryptions of all -1 (the largest |A|)
with plaintexts of `nonzero` coefficients all 2^63 (the largest centred |B|) are summed,
finished as the engine does (public-key zero, flood, Delta'(R), switch down), decrypted (it
must be exact) and the noise e of phase = Q/2^64 v + e read per coefficient.

Columns: the engine's worst-case bound on the evaluation's noise (bits), the flood F (bits:
bound + 40 + 13), the largest |e| measured at the return modulus Q (bits), the flood as it
arrives there (F - log2(q / Q)), and the decryption limit log2(Q / 2^65): correctness
needs max |e| below it, circuit privacy the flood 53 bits above the bound.

    timeout 600 python benchmarks/pairwise_noise_pow2.py > docs/pairwise_noise_pow2.jsonl
"""

from __future__ import annotations

import json
import math
import os
import sys

import numpy as np

from crypten_lite.provider import he, he_pow2
from crypten_lite.random import PRG

# (name, products summed, nonzero plaintext coefficients each)
CASES = [
    ("one product, full plaintext", 1, 8192),
    ("matmul 256 blocks (52,12,13): 22 x 156", 22, 156),
    ("LeNet conv2 b64 direct: 6 x 25", 6, 25),
    ("block limit: 3 x 4096 (MAX_NOISE_TERMS)", 3, 4096),
]


def measure(name: str, products: int, nonzero: int) -> dict:
    params = he.default_params()
    unit = he_pow2.Pow2Unit(params)
    files = he._Files()
    prg = PRG(os.urandom(32))

    def rand(shape):
        return prg.draw(tuple(shape)).numpy().view(np.uint64)
    try:
        unit.peer_key(files, unit.keygen(files))
        nd = unit.n
        a = np.full((products, nd), (1 << 64) - 1, dtype=np.uint64)
        b = np.zeros((products, nd), dtype=np.uint64)
        b[:, :nonzero] = 1 << 63
        cts = unit.encrypt_rows(files, a)
        pts = unit.ntt_plains(files, b)
        loaded = []
        for data in cts:
            ct = files.load(he._sealapi().Ciphertext, unit.ctx, data, "ciphertext")
            unit.evaluator.transform_to_ntt_inplace(ct)
            loaded.append(ct)
        acc = he._dot(unit, list(zip(loaded, pts)))
        bound = unit.noise_bound(products, nonzero)
        flood = params.flood_bits(bound)
        mask = rand((nd,))
        back = unit.finish(files, acc, mask, bound, rand)
        # (-Sum X^i)(2^63 Sum_{j<nz} X^j) mod X^N + 1, summed over the products, mod 2^64
        i = np.arange(nd)
        below = np.minimum(i + 1, nonzero)              # j <= i: + terms; j > i: wrapped, -
        coeff = [(-(1 << 63) * products * (2 * int(x) - nonzero)) % (1 << 64) for x in below]
        with np.errstate(over="ignore"):
            v = np.array(coeff, dtype=np.uint64) + mask
        exact = bool(np.array_equal(unit.open(files, back, list(range(nd))), v))
        e = np.abs(unit.true_noise(files, back, v))
        q = math.prod(unit.data_moduli)
        qret = math.prod(unit.data_moduli[:params.mm_return])
        return {"case": name, "products": products, "nonzero": nonzero,
                "bound_bits": bound.bit_length(), "flood_bits": flood,
                "noise_max_bits": round(math.log2(float(e.max())), 2),
                "flood_at_return_bits": round(flood - math.log2(q / qret), 2),
                "limit_bits": round(math.log2(qret) - 65, 2),
                "margin": flood - bound.bit_length(), "decrypts_exactly": exact}
    finally:
        files.close()


def noise_table(path: str | None = None) -> str:
    """The table docs/protocols.md shows, from docs/pairwise_noise_pow2.jsonl (a test checks it)."""
    path = path or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs",
                                "pairwise_noise_pow2.jsonl")
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    out = ["| case | bound (bits) | flood F | max noise at return | flood at return | limit | exact |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['case']} | {r['bound_bits']} | {r['flood_bits']} | {r['noise_max_bits']} | "
                   f"{r['flood_at_return_bits']} | {r['limit_bits']} | "
                   f"{'yes' if r['decrypts_exactly'] else 'NO'} |")
    return "\n".join(out)


def main() -> None:
    if "--table" in sys.argv:
        print(noise_table())
        return
    for case in CASES:
        print(json.dumps(measure(*case)), flush=True)


if __name__ == "__main__":
    main()
