"""Why provider pairwise keeps 30-bit plaintext primes: SEAL's invariant noise budgets (bits)
of BFV at N = 8192, q = 218 bits (the HE standard's 128-bit bound) for several plaintext prime
sizes, measured on worst-case operands (64 summed products of full-size plaintexts, as in a
matmul's inner blocks), the flooding term (a public-key encryption of zero times `flood`
uniform plaintexts), and the budget left after switching to two primes.

Circuit privacy needs the flood's noise 2^(40 + 13) above the product's (margin >= 53 bits:
40 statistical bits, union over N = 2^13 coefficients) AND a positive budget left after the
switch (decryption stays correct). One JSON line per (prime bits, flood multiplications):

    python benchmarks/pairwise_noise.py > docs/pairwise_noise.jsonl
"""

from __future__ import annotations

import json
import os

import numpy as np

from crypten_lite.provider import he
from crypten_lite.random import PRG


def measure(bits: int, flood: int, products: int = 64) -> dict:
    import tenseal.sealapi as s
    n = he.N
    coeff = tuple(m.value() for m in s.CoeffModulus.BFVDefault(n, s.SEC_LEVEL_TYPE.TC128))
    t = s.PlainModulus.Batching(n, [bits])[0].value()
    params = he.HEParams(n, coeff, (t,), flood_muls=flood, return_primes=2)
    prg = PRG(os.urandom(32))
    evaluator = he.CrossEngine(1, params, lambda d: None, lambda: b"",
                               lambda shape: prg.draw(tuple(shape)).numpy().view(np.uint64))
    p = he._Prime(params, t)
    gen = s.KeyGenerator(p.ctx)
    sk = gen.secret_key()
    pk = s.PublicKey()
    gen.create_public_key(pk)
    p.encryptor = s.Encryptor(p.ctx, pk)
    enc, dec = s.Encryptor(p.ctx, sk), s.Decryptor(p.ctx, sk)
    fresh = s.Ciphertext()
    enc.encrypt_symmetric(p.plain(evaluator._uniform(t, (n,))), fresh)
    acc = None
    for _ in range(products):
        ct = s.Ciphertext()
        enc.encrypt_symmetric(p.plain(evaluator._uniform(t, (n,))), ct)
        prod = s.Ciphertext()
        p.evaluator.multiply_plain(ct, p.plain(evaluator._uniform(t, (n,))), prod)
        if acc is None:
            acc = prod
        else:
            p.evaluator.add_inplace(acc, prod)
    product = dec.invariant_noise_budget(acc)
    flooded = evaluator._flooded(p)
    flood_budget = dec.invariant_noise_budget(flooded)
    p.evaluator.add_inplace(acc, flooded)
    while acc.coeff_modulus_size() > 2:
        p.evaluator.mod_switch_to_next_inplace(acc)
    left = dec.invariant_noise_budget(acc)
    margin = product - flood_budget
    return {"plain_bits": bits, "flood_muls": flood, "products": products,
            "fresh_budget": dec.invariant_noise_budget(fresh), "product_budget": product,
            "flood_budget": flood_budget, "margin": margin, "budget_after_switch": left,
            "usable": margin >= 53 and left > 0}


def main() -> None:
    for bits, flood in ((30, 3), (36, 2), (36, 3), (40, 2), (40, 3), (45, 2), (45, 3), (50, 1), (59, 1)):
        print(json.dumps(measure(bits, flood)), flush=True)


if __name__ == "__main__":
    main()
