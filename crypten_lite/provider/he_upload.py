"""The Z_2^64 engine's ciphertexts sent to the peer (the owner's A of a product, a kept
weight mask B), made in NTT form (issue 29).

SEAL's BFV encryptor only makes coefficient-form ciphertexts: a seeded symmetric encryption
costs two NTTs a prime (its uniform c1 to NTT form to multiply by the key, c0 back), and the
evaluator, which multiplies in NTT form, NTTs both polynomials of what it loads (four more a
prime), after SEAL's save, zstd, load and seed expansion. Here the owner makes the same RLWE
encryption directly in NTT form, as SEAL's seeded encryptions are made for CKKS and BGV:

    c1 = a, uniform mod each q_i in the NTT domain, expanded from a fresh public 32-byte seed
         (AES-256-CTR keystream, rejection-sampled below each prime: exactly uniform);
    c0 = NTT(e + Delta'(row)) - a s   (s: the owner's SEAL secret key, NTT form)

with e SEAL's own noise distribution (centred binomial, 21 + 21 bits, |e| <= 21, the
he.FRESH_NOISE that every bound assumes) and Delta'(row) = round(q row / 2^64) as before
(he_pow2.Pow2Unit.delta), so the phase c0 + c1 s = e + Delta'(row) is exactly the phase of
the encryption it replaces (the NTT is a linear bijection of Z_q[X]/(X^N + 1): the same
ciphertext, written in another basis). Security is that of RLWE with a public uniform a from
a seed, as SEAL's seeded encryption: 128-bit parameters (he_pow2's context), the secret key
and e never leave the owner, the seed and e are fresh per ciphertext (os.urandom seeds a
private PRG per call: threads never share a stream).

Wire: the seed, then c0 at 50 bits a coefficient (he_pow2.pack50): 32 + 25 L N / 4 bytes.
The evaluator expands c1 from the seed and writes both polynomials into an NTT-form SEAL
ciphertext's memory (he_pow2._ct_data; through SEAL's load where the layout is unknown):
no NTT, no file, no zstd. A payload of the wrong size or a coefficient at or past its prime
is a ProtocolError.

One NTT a prime is left at the owner (e + Delta'(row), up to 16 rows a SEAL call) and none at
the evaluator, against 2 + 4 before.
"""

from __future__ import annotations

import struct

import numpy as np

from .. import random as crandom
from ..errors import ProtocolError
from . import he

VERSION = he.UPLOAD_WIRE         # named in the handshake (he.HEParams.describe's mmup=)
SEED_BYTES = 32
_CBD_BITS = 21                   # SEAL's centred binomial noise: 21 bits minus 21 bits


def expand(seed: bytes, moduli: tuple[int, ...], n: int) -> np.ndarray:
    """c1 [L, n]: uniform mod each q_i (< 2^51), from the seed's AES-256-CTR keystream (one
    draw for every prime, n + 64 words each; a prime short of n words below it draws more
    from a nonce of its own): each prime's words masked to its bit length, those below the
    prime kept in order (rejection sampling). Public and deterministic: the owner and the
    evaluator expand the same."""
    per = n + 64
    words = crandom.keystream_ring(seed, struct.pack("<HHQ", 0x7570, 0, 0), (len(moduli) * per,),
                                   len(moduli) * per).numpy().view(np.uint64)
    out = np.empty((len(moduli), n), dtype=np.uint64)
    for i, q in enumerate(moduli):
        mask = np.uint64((1 << q.bit_length()) - 1)
        w = words[i * per:(i + 1) * per] & mask
        got = [w[w < np.uint64(q)]]
        have, counter = got[0].size, 0
        while have < n:                  # never at the engine's primes (each rejects < 2^-29)
            more = crandom.keystream_ring(seed, struct.pack("<HHQ", 0x7570, 1 + i, counter), (per,), per)
            w = more.numpy().view(np.uint64) & mask
            got.append(w[w < np.uint64(q)])
            have += got[-1].size
            counter += 1
        out[i] = np.concatenate(got)[:n] if len(got) > 1 else got[0][:n]
    return out


def mulmod_vec(x: np.ndarray, y: np.ndarray, q: int) -> np.ndarray:
    """x * y mod q elementwise for uint64 x, y < q < 2^51: the quotient estimated in float64
    (x y / q < 2^51 with relative error below 2^-50: off by at most one), the remainder
    computed mod 2^64 and corrected into [0, q) (tests check it against Python's integers)."""
    qe = (x.astype(np.float64) * y.astype(np.float64) * (1.0 / q)).astype(np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        r = (x * y - qe * np.uint64(q)).view(np.int64)
    r = np.where(r < 0, r + q, r)
    return np.where(r >= q, r - q, r).view(np.uint64)


def _noise(prg: "crandom.PRG", shape: tuple) -> np.ndarray:
    """SEAL's centred binomial noise (popcount of 21 bits minus popcount of 21), int64."""
    w = prg.draw((2,) + shape).numpy().view(np.uint64) & np.uint64((1 << _CBD_BITS) - 1)
    return np.bitwise_count(w[0]).astype(np.int64) - np.bitwise_count(w[1]).astype(np.int64)


class Uploads:
    """A Pow2Unit's NTT-form encryptions under its own key and its reader of the peer's."""

    def __init__(self, unit):
        self.unit = unit
        self.moduli = unit.data_moduli
        self.n = unit.n
        self._mods = np.array(self.moduli, dtype=np.uint64)[:, None]
        self._s = None                 # the secret key at the data primes, NTT form
        self._template = None          # an NTT-form ciphertext to copy the form of

    def _secret(self) -> np.ndarray:
        if self._s is None:
            key = self.unit.secret_key.data()          # NTT form, key level: data primes first
            count = len(self.moduli) * self.n
            if not key.is_ntt_form() or key.coeff_count() < count:
                raise ProtocolError("pairwise: the secret key is not laid out as SEAL 4's")
            s = np.fromiter(map(key.data, range(count)), dtype=np.uint64, count=count)
            self._s = s.reshape(len(self.moduli), self.n)
        return self._s

    def encrypt(self, files: "he._Files", rows: np.ndarray) -> list[bytes]:
        """The rows (uint64 [r, N], any 64-bit values) encrypted under this party's key in NTT
        form, each as seed + pack50(c0)."""
        from .he_pow2 import pack50
        unit, nl, r = self.unit, len(self.moduli), len(rows)
        if r == 0:
            return []
        s = self._secret()
        prg = crandom.PRG(crandom.fresh_seed(), domain=0x6f776e)
        e = _noise(prg, (r, self.n))
        shifts = unit.delta(rows)                      # [L, r, N]
        polys = np.empty((r, nl, self.n), dtype=np.uint64)
        for i, q in enumerate(self.moduli):            # e + Delta'(row) mod q_i
            v = shifts[i].view(np.int64) + e
            v = np.where(v < 0, v + q, v)
            polys[:, i] = np.where(v >= q, v - q, v).view(np.uint64)
        ntt = unit.ntt_rows(files, polys)              # [r, L, N]
        seeds = [prg.draw((SEED_BYTES // 8,)).numpy().tobytes() for _ in range(r)]
        a = np.stack([expand(seed, self.moduli, self.n) for seed in seeds])
        for i, q in enumerate(self.moduli):            # c0 = NTT(e + Delta'(row)) - a s
            v = ntt[:, i].view(np.int64) - mulmod_vec(a[:, i], s[i], q).view(np.int64)
            ntt[:, i] = np.where(v < 0, v + q, v).view(np.uint64)
        packed = pack50(ntt)
        size = len(packed) // r                        # L N a multiple of 4: rows apart
        return [seeds[j] + packed[j * size:(j + 1) * size] for j in range(r)]

    def load(self, files: "he._Files", data: bytes):
        """The peer's encrypt() output as a SEAL Ciphertext in NTT form (for multiply_plain);
        a payload of the wrong size or a coefficient not below its prime is a ProtocolError."""
        from .he_pow2 import _ct_data, unpack50
        nl, n = len(self.moduli), self.n
        if len(data) < SEED_BYTES:
            raise ProtocolError("pairwise: a ciphertext from the peer is too short")
        c0 = unpack50(data[SEED_BYTES:], nl * n, "a ciphertext").reshape(nl, n)
        if (c0 >= self._mods).any():
            raise ProtocolError("pairwise: malformed ciphertext from the peer (a coefficient past its prime)")
        c1 = expand(bytes(data[:SEED_BYTES]), self.moduli, n)
        s = he._sealapi()
        unit = self.unit
        if self._template is None:
            ct, view = unit._new_ct(2)
            if ct is not None:
                view[1] = 1                            # SEAL refuses to NTT a zero c1
                unit.evaluator.transform_to_ntt_inplace(ct)
            self._template = ct
        if self._template is not None:
            ct = s.Ciphertext()
            unit.evaluator.negate(self._template, ct)  # a fresh NTT-form ciphertext
            view = _ct_data(ct, 2, nl, n, writable=True)
            if view is not None and ct.is_ntt_form():
                view = view.reshape(2, nl, n)
                view[0] = c0
                view[1] = c1
                return ct
        raw = unit._ct_bytes(np.stack([c0, c1]).reshape(2, -1), ntt=True)
        return files.load(s.Ciphertext, unit.ctx, raw, "ciphertext")

