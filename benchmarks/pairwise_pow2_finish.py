"""CPU milliseconds of one returned ciphertext of provider pairwise's Z_2^64 engine
(he_pow2.Pow2Unit.finish: encryption of zero, flood, Delta'(R), inverse NTT, switch down,
save) on its two paths, alternating in one process: the engine's own encryption of zero at
the data primes (he.zero_at_data_primes, the peer's key kept there in NTT form) and SEAL's
encrypt_zero (the fallback). Also the two encryptions of zero alone. Every returned
ciphertext is opened and checked against the exact product plus mask.

    timeout 300 python benchmarks/pairwise_pow2_finish.py --repeat 30

Prints one JSON line: median and minimum process CPU ms per path, and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from crypten_lite.provider import he, he_pow2
from crypten_lite.random import PRG


def _cpu_ms(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t = time.process_time()
        fn()
        out.append(1000 * (time.process_time() - t))
    return out


def measure(repeat: int) -> dict:
    unit = he_pow2.Pow2Unit(he.default_params())
    files = he._Files()
    prg = PRG(os.urandom(32))

    def rand(shape):
        return prg.draw(tuple(shape)).numpy().view(np.uint64)
    try:
        unit.peer_key(files, unit.keygen(files))
        pk = unit.pk_ntt
        if pk is None:
            raise SystemExit("this SEAL build saves its public key in another layout: "
                             "only SEAL's encrypt_zero is available")
        s = he._sealapi()
        nd = unit.n
        a = rand((1, nd))
        b = np.zeros((1, nd), dtype=np.uint64)
        b[0, 0] = rand((1,))[0]                     # a constant: the product is a b0 mod 2^64
        ct = files.load(s.Ciphertext, unit.ctx, unit.encrypt_rows(files, a)[0], "ciphertext")
        unit.evaluator.transform_to_ntt_inplace(ct)
        pt = unit.ntt_plains(files, b)[0]
        bound = unit.noise_bound(1, nd)
        mask = rand((nd,))
        with np.errstate(over="ignore"):
            want = a[0] * b[0, 0] + mask
        times: dict[str, list[float]] = {"own_zero": [], "seal_encrypt_zero": []}
        for _ in range(repeat):
            for path in times:
                unit.pk_ntt = pk if path == "own_zero" else None
                acc = he._dot(unit, [(ct, pt)])
                back: list[bytes] = []
                times[path] += _cpu_ms(lambda: back.append(unit.finish(files, acc, mask, bound, rand)), 1)
                if not np.array_equal(unit.open(files, back[0], list(range(nd))), want):
                    raise SystemExit(f"{path}: the returned ciphertext does not decrypt to the product")
        unit.pk_ntt = pk

        def seal_zero():
            unit.encryptor.encrypt_zero(s.Ciphertext())

        def own_zero():
            he.zero_at_data_primes(files, unit.ctx, unit.pid, unit.evaluator, pk, unit.data_moduli,
                                   1 << unit.k, rand)
        zeros = {"seal_encrypt_zero": _cpu_ms(seal_zero, repeat), "own_zero": _cpu_ms(own_zero, repeat)}
        return {"finish_ms_median": {k: round(float(np.median(v)), 2) for k, v in times.items()},
                "finish_ms_min": {k: round(min(v), 2) for k, v in times.items()},
                "zero_alone_ms_median": {k: round(float(np.median(v)), 2) for k, v in zeros.items()},
                "repeat": repeat, "decrypts_exactly": True, "load": round(os.getloadavg()[0], 1)}
    finally:
        files.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=30, help="returned ciphertexts per path")
    print(json.dumps(measure(ap.parse_args().repeat)))


if __name__ == "__main__":
    main()
