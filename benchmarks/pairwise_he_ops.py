"""CPU milliseconds of SEAL's single operations (one thread, TenSEAL's sealapi) under provider
pairwise's parameters and the former ones: a coefficient plaintext's load, lift and NTT, a
symmetric encryption and its serialization, a ciphertext's load and NTT, a plaintext product
in NTT form, a public-key encryption of zero, and the sizes of a ciphertext as sent (seeded)
and as returned (switched down). docs/protocols.md, "Parameters (128-bit security)":

    timeout 300 python benchmarks/pairwise_he_ops.py
"""

from __future__ import annotations

import json
import os
import struct
import time

import numpy as np

from crypten_lite.provider import he

SETS = {"3x60+38, t 45 (provider)": ([60, 60, 60, 38], 45, 1),
        "4x50+18, t 60 (former)": ([50, 50, 50, 50, 18], 60, 2)}


def _ms(fn, n: int = 30) -> float:
    fn()
    start = time.process_time()
    for _ in range(n):
        fn()
    return round((time.process_time() - start) / n * 1e3, 3)


def measure(qbits: list[int], tbits: int, ret: int) -> dict:
    s = he._sealapi()
    parms = s.EncryptionParameters(s.SCHEME_TYPE.BFV)
    parms.set_poly_modulus_degree(he.N)
    parms.set_coeff_modulus(s.CoeffModulus.Create(he.N, qbits))
    t = s.PlainModulus.Batching(he.N, [tbits])[0]
    parms.set_plain_modulus(t)
    ctx = s.SEALContext(parms, True, s.SEC_LEVEL_TYPE.TC128)
    ev, gen = s.Evaluator(ctx), s.KeyGenerator(ctx)
    pk = s.PublicKey()
    gen.create_public_key(pk)
    sym, asym = s.Encryptor(ctx, gen.secret_key()), s.Encryptor(ctx, pk)
    files = he._Files()
    rng = np.random.default_rng(1)  # insecure-ok: benchmark inputs
    coeffs = rng.integers(0, t.value(), he.N, dtype=np.uint64)
    body = he._seal_object(struct.pack("<4QQd", 0, 0, 0, 0, he.N, 1.0) + he._seal_array(coeffs))

    def plain():
        return files.load(s.Plaintext, ctx, body, "plaintext")

    def lift():
        pt = plain()
        ev.transform_to_ntt_inplace(pt, ctx.first_parms_id())
        return pt

    def encrypt():
        return files.dump(sym.encrypt_symmetric(plain()))
    sent = encrypt()

    def load_ntt():
        ct = files.load(s.Ciphertext, ctx, sent, "ciphertext")
        ev.transform_to_ntt_inplace(ct)
        return ct
    ct, pt = load_ntt(), lift()

    def product():
        out = s.Ciphertext()
        ev.multiply_plain(ct, pt, out)

    def zero():
        out = s.Ciphertext()
        asym.encrypt_zero(out)
        return out
    back = zero()
    while back.coeff_modulus_size() > ret:
        ev.mod_switch_to_next_inplace(back)
    out = {"plaintext_load_lift_ntt_ms": _ms(lift), "encrypt_serialize_ms": _ms(encrypt),
           "ciphertext_load_ntt_ms": _ms(load_ntt), "product_ntt_ms": _ms(product, 100),
           "public_key_zero_ms": _ms(zero), "sent_bytes": len(sent),
           "returned_bytes": len(files.dump(back))}
    files.close()
    return out


def main() -> None:
    for name, (qbits, tbits, ret) in SETS.items():
        print(json.dumps({"params": name, **measure(qbits, tbits, ret),
                          "load": round(os.getloadavg()[0], 1)}), flush=True)


if __name__ == "__main__":
    main()
