"""CPU milliseconds of SEAL's single operations (one thread, TenSEAL's sealapi) under provider
pairwise's parameters and the former ones: a coefficient plaintext's load, lift and NTT, a
symmetric encryption and its serialization, a ciphertext's load and NTT, a plaintext product
in NTT form, a public-key encryption of zero (SEAL's, at the key level then switched down, and
the CRT engine's own at the data primes, he._Prime.zero_ntt, with its inverse NTT), and the
sizes of a ciphertext as sent (seeded)
and as returned (switched down); then the Z_2^64 matmul / conv engine's operations
(measure_pow2). docs/protocols.md, "Parameters (128-bit security)" and "Z_2^64 matmul and
conv engine":

    timeout 300 python benchmarks/pairwise_he_ops.py
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import time

import numpy as np

from crypten_lite.provider import he

SETS = {"3x60+38, t 45 (provider)": ([60, 60, 60, 38], 45, 1),
        "4x50+18, t 60 (former)": ([50, 50, 50, 50, 18], 60, 2)}



def _native_plains(p, files, rows: np.ndarray) -> list:
    """SEAL-native coefficient plaintexts (each coefficient < t) lifted and NTT'd by SEAL: the
    alternative the Z_2^64 engine measured against (two 32-bit halves of each row)."""
    s = he._sealapi()
    out = []
    for row in rows:
        pt = files.load(s.Plaintext, p.ctx, p.plain_bytes(row), "plaintext")
        p.evaluator.transform_to_ntt_inplace(pt, p.pid)
        out.append(pt)
    return out

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
    # the engine's own encryption of zero (he._Prime.zero_ntt: at the data primes, numpy
    # samplers), with its inverse NTT and errors added, as SEAL's above gives it
    params = dataclasses.replace(he.default_params(), coeff_moduli=tuple(m.value() for m in
                                 s.CoeffModulus.Create(he.N, qbits)), plain_primes=(t.value(),))
    prime = he._Prime(params, t.value())
    prime_pk = s.PublicKey()
    s.KeyGenerator(prime.ctx).create_public_key(prime_pk)
    prime.set_peer_key(files, prime_pk)

    def zero_data_primes():
        z, errors = prime.zero_ntt(files, lambda shape: rng.integers(0, 1 << 64, shape, dtype=np.uint64))
        prime.evaluator.transform_from_ntt_inplace(z)
        prime.evaluator.add_inplace(z, prime.noise_ct(errors[0].astype(np.uint64), errors[1].astype(np.uint64)))
        return z
    out = {"plaintext_load_lift_ntt_ms": _ms(lift), "encrypt_serialize_ms": _ms(encrypt),
           "ciphertext_load_ntt_ms": _ms(load_ntt), "product_ntt_ms": _ms(product, 100),
           "public_key_zero_ms": _ms(zero),
           "zero_at_data_primes_ms": _ms(zero_data_primes) if prime.pk_ntt is not None else None,
           "sent_bytes": len(sent), "returned_bytes": len(files.dump(back))}
    files.close()
    return out


def measure_pow2(rows: int = 16) -> dict:
    """The Z_2^64 matmul / conv engine (provider/he_pow2.py), per operation: an encryption of
    64-bit values (seeded zero, c0 shifted), a 64-bit NTT-form plaintext (batched NTT through
    a ciphertext), against one 32-bit half as a SEAL-native coefficient plaintext (the split
    alternative takes two, and twice the products), a plaintext product in NTT form, a
    returned ciphertext (finish: public-key zero, flood, Delta'(R), switch, serialize) and its
    read-out (two decryptions); ms of one thread's CPU, and the sizes as sent and returned."""
    from crypten_lite.provider import he_pow2
    from crypten_lite.random import PRG
    params = he.default_params()
    unit = he_pow2.Pow2Unit(params)
    files = he._Files()
    prg = PRG(os.urandom(32))

    def rand(shape):
        return prg.draw(tuple(shape)).numpy().view(np.uint64)
    s = he._sealapi()
    try:
        unit.peer_key(files, unit.keygen(files))
        vals = rand((rows, unit.n))
        cts = unit.encrypt_rows(files, vals[:1])
        ct = files.load(s.Ciphertext, unit.ctx, cts[0], "ciphertext")
        unit.evaluator.transform_to_ntt_inplace(ct)
        pt = unit.ntt_plains(files, vals[:1])[0]
        half = vals & np.uint64(0xFFFFFFFF)
        native = type("P", (), {"ctx": unit.ctx, "pid": unit.pid, "evaluator": unit.evaluator,
                                "plain_bytes": lambda self, c: he._Prime.plain_bytes(self, c)})()
        out = s.Ciphertext()
        bound = unit.noise_bound(22, 156)
        back = unit.finish(files, he._dot(unit, [(ct, pt)]), vals[0], bound, rand)
        where = list(range(0, unit.n, 12))
        return {"encrypt_64bit": round(_ms(lambda: unit.encrypt_rows(files, vals), 3) / rows, 3),
                "plaintext_64bit_ntt": round(_ms(lambda: unit.ntt_plains(files, vals), 3) / rows, 3),
                "plaintext_32bit_half_native": round(_ms(lambda: _native_plains(native, files, half), 3) / rows, 3),
                "product_ntt": _ms(lambda: unit.evaluator.multiply_plain(ct, pt, out), 100),
                "finish_returned": _ms(lambda: unit.finish(files, he._dot(unit, [(ct, pt)]), vals[0], bound, rand), 10),
                "read_out": _ms(lambda: unit.open(files, back, where), 10),
                "kb_sent": round(len(cts[0]) / 1024, 1), "kb_returned": round(len(back) / 1024, 1)}
    finally:
        files.close()


def main() -> None:
    for name, (qbits, tbits, ret) in SETS.items():
        print(json.dumps({"params": name, **measure(qbits, tbits, ret),
                          "load": round(os.getloadavg()[0], 1)}), flush=True)
    print(json.dumps({"params": "Z_2^64 matmul/conv engine (4x50+18, t 2^40 for SEAL, returned at 2)",
                      **measure_pow2(), "load": round(os.getloadavg()[0], 1)}), flush=True)


if __name__ == "__main__":
    main()
