"""Why provider pairwise uses 45-bit plaintext primes over a 3 x 60-bit data modulus: SEAL's
invariant noise budgets (bits) of BFV at N = 8192, total coefficient modulus 218 bits (the HE
standard's 128-bit bound), measured for several plaintext prime sizes and three ways of
spending the 218 bits, on the elementwise triple's worst case (two products of fresh
encryptions and full-size plaintexts, every slot uniform mod t). With 3 x 60 + 38 every
plaintext prime is below every data prime, so SEAL lifts plaintexts by its fast path, and the
results return at one prime; the other two moduli return at two.

The flood is the engine's own (provider/he.py): a public-key encryption of zero (made at the
data primes, _Prime.zero_ntt, as the engine makes it) plus (e, 0),
e uniform in [-2^F, 2^F) per coefficient, F = log2(the engine's noise bound) + 40 + 13.
Circuit privacy needs the flood's noise 2^(40 + 13) above the products' (margin >= 53 bits:
40 statistical bits, union over N = 2^13 coefficients); correctness needs a positive budget
after the switch down (column `returned at`), and the decryption equal to the product
plus the mask.
`primes_mul` / `primes_matmul256`: plaintext primes a mul triple (X < 2^129) / a matmul 256
one-sided product (X < 2^137) needs with this prime size (fewer primes: fewer ciphertexts).
One JSON line per (coefficient modulus, prime bits):

    python benchmarks/pairwise_noise.py > docs/pairwise_noise.jsonl
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from crypten_lite.errors import ProtocolError
from crypten_lite.provider import he
from crypten_lite.random import PRG

MODULI = {"3x60+38": [60, 60, 60, 38], "4x50+18": [50, 50, 50, 50, 18],
          "seal-default-43,43,44,44+44": None}
RETURN = {"3x60+38": 1, "4x50+18": 2, "seal-default-43,43,44,44+44": 2}
BITS = {"3x60+38": (30, 40, 45, 50), "4x50+18": (30, 40, 50, 60), "seal-default-43,43,44,44+44": (30, 40, 50, 60)}


def measure(modulus: str, bits: int) -> dict:
    import tenseal.sealapi as s
    n = he.N
    if MODULI[modulus] is None:
        coeff = tuple(m.value() for m in s.CoeffModulus.BFVDefault(n, s.SEC_LEVEL_TYPE.TC128))
    else:
        coeff = tuple(m.value() for m in s.CoeffModulus.Create(n, MODULI[modulus]))
    plain = tuple(m.value() for m in s.PlainModulus.Batching(n, [bits] * 8))
    params = dataclasses.replace(he.default_params(), coeff_moduli=coeff, plain_primes=plain,
                                 return_primes=RETURN[modulus])
    t = plain[0]
    prg = PRG(os.urandom(32))
    evaluator = he.CrossEngine(1, params, lambda d: None, lambda: b"",
                               lambda shape: prg.draw(tuple(shape)).numpy().view(np.uint64))
    p = he._Prime(params, t)
    gen = s.KeyGenerator(p.ctx)
    sk = gen.secret_key()
    pk = s.PublicKey()
    gen.create_public_key(pk)
    p.set_peer_key(evaluator._files, pk)     # as the engine re-randomises (zero_ntt)
    enc, dec = s.Encryptor(p.ctx, sk), s.Decryptor(p.ctx, sk)
    acc, want = None, np.zeros(n, dtype=object)
    for _ in range(2):
        x, y = evaluator._uniform(t, (n,)), evaluator._uniform(t, (n,))
        want = (want + x.astype(object) * y.astype(object)) % t
        ct = s.Ciphertext()
        enc.encrypt_symmetric(p.plain(x), ct)
        prod = s.Ciphertext()
        p.evaluator.multiply_plain(ct, p.plain(y), prod)
        if acc is None:
            acc = prod
        else:
            p.evaluator.add_inplace(acc, prod)
    row = {"modulus": modulus, "data_bits": round(sum(np.log2(float(q)) for q in coeff[:-1]), 1),
           "plain_bits": bits, "returned_at": RETURN[modulus], "primes_mul": params.primes_for(129),
           "primes_matmul256": params.primes_for(137),
           "product_budget": dec.invariant_noise_budget(acc)}
    bound = evaluator.noise_bound(t, 2, n)
    row["flood_bits"] = params.flood_bits(bound)
    try:
        flood = evaluator._flooded(p, bound)
    except ProtocolError as e:
        row.update(usable=False, why=str(e))
        return row
    row["flood_budget"] = dec.invariant_noise_budget(flood)
    row["margin"] = row["product_budget"] - row["flood_budget"]
    mask = evaluator._uniform(t, (n,))
    back = he._Files().load(s.Ciphertext, p.ctx,
                            evaluator._finish(p, acc, p.plain(mask), bound, in_ntt=False), "ct")
    row["budget_after_switch"] = dec.invariant_noise_budget(back)
    pt = s.Plaintext()
    dec.decrypt(back, pt)
    row["decrypts_exactly"] = bool(np.array_equal(p.slots_of(pt).astype(object),
                                                  (want + mask.astype(object)) % t))
    row["usable"] = (row["margin"] >= 53 and row["budget_after_switch"] > 0
                     and row["decrypts_exactly"])
    return row


def noise_table(path: str | None = None) -> str:
    """The table docs/protocols.md shows, from docs/pairwise_noise.jsonl (a test checks it)."""
    path = path or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs",
                                "pairwise_noise.jsonl")
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    out = ["| data modulus | data bits | plain bits | returned at | primes (mul, matmul 256) | flood F "
           "| margin | budget after switch | usable |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        usable = "yes" if r["usable"] else ("no: " + ("the flood does not fit" if "why" in r else "too little"))
        out.append(f"| {r['modulus']} | {r['data_bits']} | {r['plain_bits']} | "
                   f"{r.get('returned_at', 2)} prime(s) | {r['primes_mul']}, "
                   f"{r['primes_matmul256']} | {r['flood_bits']} | {r.get('margin', '-')} | "
                   f"{r.get('budget_after_switch', '-')} | {usable} |")
    return "\n".join(out)


def main() -> None:
    for modulus in MODULI:
        for bits in BITS[modulus]:
            print(json.dumps(measure(modulus, bits)), flush=True)


if __name__ == "__main__":
    main()
