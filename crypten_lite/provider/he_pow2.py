"""The matmul / conv engine of the pairwise provider: BFV in Z_2^64 directly (plaintext
modulus 2^64, the Cheetah paper's way), one set of ciphertexts per product instead of one
per CRT plaintext prime, and a mask R uniform mod 2^64 (perfect, no statistical mask).

SEAL caps its plaintext modulus t at 60 bits; t only matters to SEAL's encoder, its
plaintext lift and its decryptor, and this engine bypasses all three:

- the context: ring degree N = 8192, q = four 50-bit data primes + an 18-bit special prime
  (218 bits: the HE standard's 128-bit bound at N = 8192, ternary secret), t = 2^T_BITS for
  SEAL only (below every data prime);
- the owner's operand A (any 64-bit values): a seeded symmetric encryption whose phase is
  e + Delta'(A), Delta'(A) = round(q A / 2^64) mod each q_i (exact in numpy: q = Qh 2^64 +
  Ql, so Delta'(A) = Qh A + round(Ql A / 2^64)), i.e. q/2^64 A + e + rho, |rho| <= 1/2;
  made and sent in NTT form (he_upload.py: the evaluator multiplies it without an NTT);
- the evaluator's operand B: NTT-form plaintexts of B's centred residues mod each q_i (|B|
  <= 2^63), made by SEAL's NTT on a ciphertext whose polynomials are those residues; the
  product's phase is q/2^64 (A B mod 2^64) + (e + rho) B mod q (q A B / 2^64 differs from
  q/2^64 (A B mod 2^64) by a multiple of q);
- the result: flooded (c0 + e_flood, e_flood uniform in [-2^F, 2^F), F from the worst-case
  noise bound), re-randomised by a fresh public-key encryption of zero (made at the data
  primes in NTT form before the one inverse NTT, he.zero_at_data_primes; SEAL's
  encrypt_zero where the peer's key is not laid out as SEAL 4 saves one), masked by
  Delta'(R) with R uniform mod 2^64 in every coefficient (R at the outputs), switched down
  to RETURN_PRIMES primes. The owner's share is X + R mod 2^64, the evaluator's -R;
- decryption with t = 2^k: SEAL returns round(2^k phase / Q) mod 2^k. Decrypting ct times
  2^(64-k) gives the low k bits of v = round(2^64 phase / Q) exactly; decrypting ct itself
  gives v's top k bits up to +-1; the 2k - 64 overlapping bits fix the carry.

SEAL serializes with zstd; the seeded encryption's c0 is read with the zstd that SEAL's own
library exports (ctypes), nothing else. An NTT's output is read, and the NTT's input and
the flood term written, in the SEAL object's own memory where its layout checks against
sealapi's accessors (_ct_data), else through SEAL's save and load as before.
"""

from __future__ import annotations

import ctypes
import math
import struct
import sys
from typing import Callable

import numpy as np

from ..errors import ConfigError, ProtocolError
from . import he

N = 8192
DATA_BITS = (50, 50, 50, 50)    # 200 bits of ciphertext modulus
SPECIAL_BITS = 18               # key level only: 218 bits in all
T_BITS = 40                     # SEAL's t = 2^40: < every data prime, > 32 (the overlap)
RETURN_PRIMES = 2               # results come back at two 50-bit primes
MAX_TERMS = 12288               # products x nonzero plaintext coefficients in one output
CT_BYTES = 264 << 10            # a ciphertext sent (seeded, 4 primes) or back (2 primes)
ENGINE = "pow2-64"
_HEAD = 97                      # body offset of c0: 73 bytes of fields + a DynArray's 24
_MAX_SIZE = 16                  # SEAL's largest ciphertext size (polys NTT'd in one call)
_M64 = 1 << 64


def moduli() -> tuple[int, ...]:
    s = he._sealapi()
    return tuple(m.value() for m in s.CoeffModulus.Create(N, list(DATA_BITS) + [SPECIAL_BITS]))


# ---------------------------------------------------------------------- zstd (SEAL's own)
_LIB = None


def _zstd():
    global _LIB
    if _LIB is None:
        mod = sys.modules.get("_sealapi_cpp")
        if mod is None:
            he._sealapi()
            mod = sys.modules.get("_sealapi_cpp")
        try:
            lib = ctypes.CDLL(mod.__file__)
            lib.ZSTD_decompress.restype = ctypes.c_size_t
            lib.ZSTD_decompress.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t]
            lib.ZSTD_compress.restype = ctypes.c_size_t
            lib.ZSTD_compress.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                          ctypes.c_size_t, ctypes.c_int]
            lib.ZSTD_compressBound.restype = ctypes.c_size_t
            lib.ZSTD_compressBound.argtypes = [ctypes.c_size_t]
            lib.ZSTD_isError.restype = ctypes.c_uint
            lib.ZSTD_isError.argtypes = [ctypes.c_size_t]
        except (AttributeError, OSError) as e:
            raise ConfigError("pairwise: this TenSEAL build does not export SEAL's zstd "
                              f"({e}); install TenSEAL 0.3.x from PyPI") from None
        _LIB = lib
    return _LIB


def _body(data: bytes, capacity: int) -> bytearray:
    """The uncompressed body of a SEAL object as SEAL saved it (zstd or none)."""
    if len(data) < 16 or struct.unpack_from("<H", data, 0)[0] != 0xA15E:
        raise ProtocolError("pairwise: not a SEAL object")
    mode = data[5]
    if mode == 0:
        return bytearray(data[16:])
    if mode != 2:
        raise ProtocolError(f"pairwise: SEAL object with compression mode {mode}")
    lib = _zstd()
    out = bytearray(capacity)                      # decompressed in place, no copies
    dst = (ctypes.c_char * capacity).from_buffer(out)
    data = data if isinstance(data, bytes) else bytes(data)
    src = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value + 16
    n = lib.ZSTD_decompress(dst, capacity, src, len(data) - 16)
    del dst
    if lib.ZSTD_isError(n):
        raise ProtocolError("pairwise: a SEAL object does not decompress")
    del out[n:]
    return out


def _compressed(body: bytes | bytearray) -> bytes:
    """A SEAL object of this body, zstd-compressed as SEAL's own saves are."""
    lib = _zstd()
    cap = lib.ZSTD_compressBound(len(body))
    out = bytearray(16 + cap)                      # compressed behind its header, no copies
    dst = ctypes.addressof((ctypes.c_char * len(out)).from_buffer(out)) + 16
    src = (ctypes.c_char * len(body)).from_buffer(body) if isinstance(body, bytearray) else body
    n = lib.ZSTD_compress(dst, cap, src, len(body), 1)
    del src
    if lib.ZSTD_isError(n):
        raise ProtocolError("pairwise: zstd compression failed")
    out[:16] = he._seal_header(16 + n)
    out[5] = 2
    del out[16 + n:]
    return bytes(out)


def pack50(values: np.ndarray) -> bytes:
    """Residues below 2^50 (every data prime is), 50 bits each: 4 values in 25 bytes, the
    count padded to a multiple of 4 with zeros (SEAL's zstd leaves about 58 of 64 bits)."""
    v = np.ascontiguousarray(values, dtype=np.uint64).reshape(-1)
    if v.size % 4:
        v = np.concatenate([v, np.zeros(4 - v.size % 4, dtype=np.uint64)])
    if v.size and int(v.max()) >> 50:
        raise ValueError("pack50: a value past 50 bits")
    v = v.reshape(-1, 4)
    out = np.empty((v.shape[0], 25), dtype=np.uint8)
    for at, w in ((0, v[:, 0] | (v[:, 1] << np.uint64(50))),
                  (8, (v[:, 1] >> np.uint64(14)) | (v[:, 2] << np.uint64(36))),
                  (16, (v[:, 2] >> np.uint64(28)) | (v[:, 3] << np.uint64(22)))):
        out[:, at:at + 8] = w.astype("<u8").view(np.uint8).reshape(-1, 8)
    out[:, 24] = (v[:, 3] >> np.uint64(42)).astype(np.uint8)
    return out.tobytes()


def unpack50(data: bytes, count: int, what: str) -> np.ndarray:
    """pack50's `count` values; a payload of any other size is a ProtocolError."""
    rows = -(-count // 4)
    if len(data) != 25 * rows:
        raise ProtocolError(f"pairwise: {what} from the peer has the wrong size")
    b = np.frombuffer(data, dtype=np.uint8).reshape(rows, 25)
    w = [np.ascontiguousarray(b[:, at:at + 8]).view("<u8").reshape(-1).astype(np.uint64) for at in (0, 8, 16)]
    m = np.uint64((1 << 50) - 1)
    v = np.empty((rows, 4), dtype=np.uint64)
    v[:, 0] = w[0] & m
    v[:, 1] = (w[0] >> np.uint64(50)) | ((w[1] & np.uint64((1 << 36) - 1)) << np.uint64(14))
    v[:, 2] = (w[1] >> np.uint64(36)) | ((w[2] & np.uint64((1 << 22) - 1)) << np.uint64(28))
    v[:, 3] = (w[2] >> np.uint64(22)) | (b[:, 24].astype(np.uint64) << np.uint64(42))
    return v.reshape(-1)[:count]


def mulmod(x: np.ndarray, c: int, q: int) -> np.ndarray:
    """x * c mod q for uint64 x < q, a constant c < q < 2^51: the quotient estimated in
    float64 (relative error below 2^-52, so it is off by at most one), the remainder computed
    mod 2^64 and corrected into [0, q). About twice as fast as he.mulmod_const's 32-bit
    partial products; exact (tests/unit/test_pairwise_pow2.py checks it against Python)."""
    qe = (x.astype(np.float64) * (c / q)).astype(np.uint64)
    with np.errstate(over="ignore"):
        r = (x * np.uint64(c) - qe * np.uint64(q)).view(np.int64)
    r = np.where(r < 0, r + q, r)
    return np.where(r >= q, r - q, r).view(np.uint64)


def words_mod(words: list[np.ndarray], q: int) -> np.ndarray:
    """Sum_i words[i] 2^(64 i) mod q (q < 2^51), elementwise (he.words_mod by mulmod)."""
    mq = np.uint64(q)
    out = words[0] % mq
    radix = 1
    for w in words[1:]:
        radix = (radix << 64) % q
        out = out + mulmod(w % mq, radix, q)
        out = np.where(out >= mq, out - mq, out)
    return out


# TenSEAL builds whose object layout _ct_data was checked on: another build could lay its
# objects out otherwise, and reading a pointer from the wrong place may crash before any check
# can refuse it, so an unlisted version takes SEAL's save and load instead (slower, same values).
LAYOUT_CHECKED_TENSEAL = ("0.3.18",)
_LAYOUT_OK: bool | None = None


def _layout_known() -> bool:
    global _LAYOUT_OK
    if _LAYOUT_OK is None:
        try:
            import tenseal
            _LAYOUT_OK = getattr(tenseal, "__version__", "") in LAYOUT_CHECKED_TENSEAL
        except ImportError:
            _LAYOUT_OK = False
    return _LAYOUT_OK


def _ct_data(ct, size: int, levels: int, n: int, writable: bool = False) -> np.ndarray | None:
    """A read-only view of a SEAL Ciphertext's coefficients in memory ([size * levels * n],
    SEAL's order), instead of a zstd save (~9 ms) and decompression (~3 ms) of a 16-poly
    ciphertext. pybind11 keeps the C++ object's address after the Python object's header;
    SEAL 4.x's Ciphertext starts with parms_id (4 words), is_ntt_form, size, N, L, scale,
    correction factor, then its DynArray (pool handle, capacity, size, pointer). Every field
    is checked against sealapi's own accessors (and each polynomial's first coefficient
    against ct.data(j)); anything else returns None and the caller saves as before. The view
    is valid while `ct` lives and is not resized."""
    if not _layout_known():
        return None
    try:
        if type(ct).__basicsize__ < 24:
            return None
        obj = ctypes.c_void_p.from_address(id(ct) + 16).value
        if not obj:
            return None
        head = (ctypes.c_uint64 * 15).from_address(obj)
        count = size * levels * n
        if (list(head[0:4]) != list(ct.parms_id()) or head[5] != size or ct.size() != size
                or head[6] != n or head[7] != levels or ct.coeff_modulus_size() != levels
                or head[13] != count or head[12] < count or not head[14]):
            return None
        arr = np.ctypeslib.as_array((ctypes.c_uint64 * count).from_address(head[14]))
        if any(int(arr[j * levels * n]) != ct.data(j) for j in range(size)):
            return None
        arr.flags.writeable = writable
        return arr
    except (AttributeError, TypeError, ValueError, OverflowError, IndexError):
        return None


# ---------------------------------------------------------------------- the unit
class Pow2Unit:
    """The Z_2^64 context of one party: its key pair, the peer's public key, and the
    encodings above. `t = 2^64` for the engine's generic code (he.residues is then the
    identity)."""

    t = _M64

    def __init__(self, params: "he.HEParams"):
        s = he._sealapi()
        if len(params.mm_moduli) < 2:
            raise ConfigError("pairwise: these HE parameters name no Z_2^64 matmul engine moduli "
                              "(he.default_params() has them)")
        self.n = params.n
        self.params = params
        parms = s.EncryptionParameters(s.SCHEME_TYPE.BFV)
        parms.set_poly_modulus_degree(params.n)
        parms.set_coeff_modulus([s.Modulus(q) for q in params.mm_moduli])
        parms.set_plain_modulus(s.Modulus(1 << params.mm_t_bits))
        self.ctx = s.SEALContext(parms, True, s.SEC_LEVEL_TYPE.TC128)
        if not self.ctx.parameters_set():
            raise ConfigError(f"pairwise: SEAL refuses the Z_2^64 parameters: "
                              f"{self.ctx.parameters_error_message()}")
        self.data_moduli = tuple(params.mm_moduli[:-1])
        if max(self.data_moduli) >= 1 << 50:     # the wire packs residues at 50 bits (pack50)
            raise ConfigError("pairwise: the Z_2^64 engine's data primes must be below 2^50 "
                              f"(got {max(self.data_moduli).bit_length()} bits)")
        self.pid = self.ctx.first_parms_id()
        self.k = params.mm_t_bits
        self.evaluator = s.Evaluator(self.ctx)
        q = math.prod(self.data_moduli)
        self._qh = [(q >> 64) % m for m in self.data_moduli]
        self._ql = np.uint64(q & (_M64 - 1))
        self._inv64 = [pow(_M64 % m, -1, m) for m in self.data_moduli]   # 2^-64 mod q_i
        self._scale = s.Plaintext(format(1 << (64 - self.k), "x"))   # 2^(64-k) < t / 2
        self._noise_template: bytes | None = None
        self._up = None                 # he_upload.Uploads, made at first use
        self.encryptor = self.sym = self.decryptor = self.secret_key = self.pk_ntt = None

    # -- keys
    def keygen(self, files: "he._Files") -> bytes:
        s = he._sealapi()
        gen = s.KeyGenerator(self.ctx)
        self.secret_key = gen.secret_key()
        public = s.PublicKey()
        gen.create_public_key(public)
        self.sym = s.Encryptor(self.ctx, self.secret_key)
        self.decryptor = s.Decryptor(self.ctx, self.secret_key)
        return files.dump(public)

    def peer_key(self, files: "he._Files", data: bytes) -> None:
        s = he._sealapi()
        public = files.load(s.PublicKey, self.ctx, data, "public key")
        self.encryptor = s.Encryptor(self.ctx, public)
        # the same key at the data primes, NTT form, for finish's own encryption of zero
        # (he.zero_at_data_primes); None keeps SEAL's encrypt_zero
        self.pk_ntt = he.key_at_data_primes(files, self.ctx, self.pid, self.n, len(self.data_moduli), public)

    # -- arithmetic
    def delta(self, a: np.ndarray) -> np.ndarray:
        """round(q a / 2^64) mod each data prime, [L, *a.shape], for uint64 a (0 at a's zeros:
        computed at its nonzeros only where they are fewer than half, _at_nonzero)."""
        return _at_nonzero(self._delta, a, len(self.data_moduli))

    def _delta(self, a: np.ndarray) -> np.ndarray:
        """delta of every element. Exactly, from
        one 64-bit product: with X = q a + 2^63 and r = X mod 2^64 = (Ql a + 2^63) mod 2^64,
        round(q a / 2^64) = (X - r) / 2^64, and X = 2^63 mod q_i, so it is (2^63 - r) 2^-64
        mod q_i (2^63 - r is u = (2^63 - r) mod 2^64, less 2^64 where r > 2^63)."""
        a = np.ascontiguousarray(a, dtype=np.uint64)
        with np.errstate(over="ignore"):
            r = a * self._ql + np.uint64(1 << 63)
            u = np.uint64(1 << 63) - r
        wrap = r > np.uint64(1 << 63)
        out = np.empty((len(self.data_moduli),) + a.shape, dtype=np.uint64)
        for i, m in enumerate(self.data_moduli):
            mm = np.uint64(m)
            v = (u % mm).view(np.int64) - np.where(wrap, np.int64(_M64 % m), np.int64(0))
            v = np.where(v < 0, v + np.int64(m), v).view(np.uint64)
            out[i] = mulmod(v, self._inv64[i], m)
        return out

    def centred(self, b: np.ndarray) -> np.ndarray:
        """b's centred representative (|b| <= 2^63) mod each data prime, [L, *b.shape] (0 at
        b's zeros: computed at its nonzeros only where they are fewer than half)."""
        return _at_nonzero(self._centred, b, len(self.data_moduli))

    def _centred(self, b: np.ndarray) -> np.ndarray:
        b = np.ascontiguousarray(b, dtype=np.uint64)
        neg = b >= np.uint64(1 << 63)
        with np.errstate(over="ignore"):
            mag = np.where(neg, np.uint64(0) - b, b)
        out = np.empty((len(self.data_moduli),) + b.shape, dtype=np.uint64)
        for i, m in enumerate(self.data_moduli):
            mm = np.uint64(m)
            r = mag % mm
            out[i] = np.where(neg & (r != 0), mm - r, r)
        return out

    def noise_bound(self, products: int, nonzero: int) -> int:
        """A bound on every coefficient of the evaluation's noise: `products` products summed,
        each of a fresh encryption (|e + rho| <= FRESH_NOISE) and a plaintext of `nonzero`
        coefficients |B| <= 2^63, plus Delta'(R)'s rounding."""
        return he.FRESH_NOISE * products * nonzero * (1 << 63) + 1

    def room(self, flood_bits: int, noise_bound: int) -> None:
        """Refuse a flood that would make the result decrypt wrongly: the noise (flood +
        evaluation + the public-key encryption's, below 2^20) must stay under q / 2^65 at
        the data level and after each switch (he.check_room with t = 2^64)."""
        he.check_room(self.data_moduli, 1 << 64, self.n, self.params.mm_return, flood_bits, noise_bound)

    # -- owner: encrypt, open
    def encrypt_rows(self, files: "he._Files", rows: np.ndarray) -> list[bytes]:
        """Seeded symmetric encryptions of the rows (uint64 [r, N], any 64-bit values) under
        this party's key, as SEAL saves them (zstd): an encryption of zero with Delta'(row)
        added to c0 (tests, benchmarks; what goes to the peer is encrypt_ntt's)."""
        size = len(self.data_moduli) * self.n
        shifts = self.delta(rows).transpose(1, 0, 2).reshape(len(rows), size)
        cap = _HEAD + 8 * size + 4096
        mods = np.array(self.data_moduli, dtype=np.uint64)[:, None]
        out = []
        for i in range(len(rows)):
            body = _body(files.dump(self.sym.encrypt_zero_symmetric()), cap)
            if struct.unpack_from("<Q", body, _HEAD - 8)[0] != size or len(body) < _HEAD + 8 * size:
                raise ConfigError("pairwise: SEAL's seeded ciphertext layout is not the expected one "
                                  "(TenSEAL 0.3.x with SEAL 4.x)")
            c0 = np.frombuffer(body, dtype="<u8", count=size, offset=_HEAD).reshape(-1, self.n)
            v = c0 + shifts[i].reshape(-1, self.n)
            c0[:] = np.where(v >= mods, v - mods, v)
            out.append(_compressed(body))
        return out

    def encrypt_ntt(self, files: "he._Files", rows: np.ndarray) -> list[bytes]:
        """The rows encrypted under this party's key in NTT form, as sent to the peer
        (he_upload.py: a seed and c0 at 50 bits; the peer reads them with load_ntt)."""
        return self._uploads().encrypt(files, rows)

    def load_ntt(self, files: "he._Files", data: bytes):
        """The peer's encrypt_ntt output as an NTT-form Ciphertext (he_upload.py)."""
        return self._uploads().load(files, data)

    def _uploads(self):
        if self._up is None:
            from .he_upload import Uploads
            self._up = Uploads(self)
        return self._up

    def open(self, files: "he._Files", data: bytes, where: list[int]) -> np.ndarray:
        """v = round(2^64 phase / Q) mod 2^64 at the coefficients `where` (ascending) of a
        returned ciphertext: its low k bits from ct * 2^(64-k), its top k bits (+-1) from ct,
        the overlap fixing the carry."""
        s = he._sealapi()
        ct = files.load(s.Ciphertext, self.ctx, data, "ciphertext")
        if ct.size() != 2 or ct.is_ntt_form() or ct.coeff_modulus_size() != self.params.mm_return:
            raise ProtocolError("pairwise: a returned ciphertext has the wrong form")
        return self._open_ct(ct, where)

    def open_extracted(self, files: "he._Files", data: bytes, where: list[int]) -> np.ndarray:
        """open() of a returned ciphertext sent by finish(..., keep=where): only c0's
        coefficients at `where` came (c1 whole); the others are zero here, so their phase is
        garbage and only `where` is read."""
        s = he._sealapi()
        level, n, m = self.params.mm_return, self.n, len(where)
        vals = unpack50(data, level * (m + n), "a returned (extracted) ciphertext")
        polys = np.zeros((2, level, n), dtype=np.uint64)
        polys[0][:, where] = vals[:level * m].reshape(level, m)
        polys[1] = vals[level * m:].reshape(level, n)
        raw = he._seal_object(struct.pack("<4Q", *self._return_pid()) + b"\x00"
                              + struct.pack("<QQQdQ", 2, n, level, 1.0, 1) + he._seal_array(polys.reshape(-1)))
        return self._open_ct(files.load(s.Ciphertext, self.ctx, raw, "ciphertext"), where)

    def _return_pid(self) -> list[int]:
        """The parms_id of the return level (mm_return primes)."""
        if getattr(self, "_ret_pid", None) is None:
            cd = self.ctx.get_context_data(self.pid)
            while len(cd.parms().coeff_modulus()) > self.params.mm_return:
                cd = cd.next_context_data()
            self._ret_pid = list(cd.parms_id())
        return self._ret_pid

    def _open_ct(self, ct, where: list[int]) -> np.ndarray:
        s = he._sealapi()
        top = s.Plaintext()
        self.decryptor.decrypt(ct, top)
        self.evaluator.multiply_plain_inplace(ct, self._scale)
        low = s.Plaintext()
        self.decryptor.decrypt(ct, low)
        return combine(he._Prime.coeffs_of(top, where), he._Prime.coeffs_of(low, where), self.k)

    def true_noise(self, files: "he._Files", data: bytes, v: np.ndarray) -> np.ndarray:
        """Diagnostics (tests, benchmarks/pairwise_noise.py): the true noise e of a returned
        ciphertext of known v (phase = Q/2^64 v + e), with this party's secret key: c0 minus
        round(Q v / 2^64) leaves the phase e (+ a rounding below 1), and SEAL's decryption
        of that times c = 2^(k-2) is round(2^k c e / Q) mod 2^k: e to within Q / 2^(2k-1).
        Returns e per coefficient (float64, signed)."""
        s = he._sealapi()
        level = self.params.mm_return
        moduli = self.data_moduli[:level]
        body = _body(data, _HEAD + 16 * level * self.n + 4096)
        c0 = np.frombuffer(body, dtype="<u8", count=level * self.n, offset=_HEAD).reshape(level, self.n)
        q = math.prod(moduli)
        shift = [(q * int(x) + (1 << 63)) >> 64 for x in v]
        for i, m in enumerate(moduli):
            c0[i] = (c0[i] + np.array([m - t % m for t in shift], dtype=np.uint64)) % np.uint64(m)
        ct = files.load(s.Ciphertext, self.ctx, he._seal_object(bytes(body)), "ciphertext")
        c = 1 << (self.k - 2)
        self.evaluator.multiply_plain_inplace(ct, s.Plaintext(format(c, "x")))
        pt = s.Plaintext()
        self.decryptor.decrypt(ct, pt)
        raw = he._Prime.coeffs_of(pt, list(range(self.n))).astype(np.float64)
        raw = np.where(raw >= 2.0 ** (self.k - 1), raw - 2.0 ** self.k, raw)
        return raw * (float(q) / 2.0 ** self.k / c)

    # -- evaluator: plaintexts, finish
    def ntt_plains(self, files: "he._Files", rows: np.ndarray) -> list:
        """NTT-form plaintexts (for multiply_plain) of the rows (uint64 [r, N], read as
        centred 64-bit integers); None for an all-zero row."""
        s = he._sealapi()
        nl = len(self.data_moduli) * self.n
        out: list = [None] * len(rows)
        live = [i for i in range(len(rows)) if rows[i].any()]
        if not live:
            return out
        for start, data in self._ntt_batches(files, self.centred(rows[live]).transpose(1, 0, 2)):
            for j in range(len(data)):
                raw = he._seal_object(struct.pack("<4QQd", *self.pid, nl, 1.0) + he._seal_array(data[j].reshape(-1)))
                out[live[start + j]] = files.load(s.Plaintext, self.ctx, raw, "plaintext")
        return out

    def ntt_rows(self, files: "he._Files", polys: np.ndarray) -> np.ndarray:
        """The NTT form of polynomials given by their residues at the data primes ([r, L, N],
        each below its prime), [r, L, N]."""
        out = np.empty(polys.shape, dtype=np.uint64)
        for start, data in self._ntt_batches(files, polys):
            out[start:start + len(data)] = data
        return out

    def _ntt_batches(self, files: "he._Files", polys: np.ndarray):
        """(first row, their NTT form [k, L, N]) for up to 16 rows of `polys` at a time, NTT'd
        in one SEAL call as the polynomials of one ciphertext, written and read in its memory
        (_ct_data), else through a file. Each view is valid until the next batch."""
        s = he._sealapi()
        nl = len(self.data_moduli) * self.n
        for start in range(0, len(polys), _MAX_SIZE):
            part = polys[start:start + _MAX_SIZE]
            shape = (max(2, len(part)), nl)
            ct, view = self._new_ct(shape[0])
            if view is None:           # not the layout _ct_data knows: through a file
                view = np.zeros(shape, dtype=np.uint64)
            view = view.reshape((shape[0],) + part.shape[1:])
            view[:len(part)] = part
            if len(part) == 1:
                view[1] = 1            # SEAL refuses to NTT a ciphertext whose c1 is zero
            if ct is None:
                ct = files.load(s.Ciphertext, self.ctx, self._ct_bytes(view.reshape(shape)), "plaintext rows")
            self.evaluator.transform_to_ntt_inplace(ct)
            data = _ct_data(ct, shape[0], len(self.data_moduli), self.n)
            if data is None:           # not the layout _ct_data knows: SEAL's zstd save
                body = _body(files.dump(ct), _HEAD + 8 * view.size + 4096)
                data = np.frombuffer(body, dtype="<u8", count=view.size, offset=_HEAD)
            yield start, data.reshape((shape[0],) + part.shape[1:])[:len(part)]
            del ct

    def _new_ct(self, size: int) -> tuple:
        """(a zero data-level Ciphertext of `size` polynomials, not NTT form, and a writable
        view [size, L, N] of its coefficients), or (None, None) where _ct_data does not
        recognise the layout (the caller then loads its polynomials from a file)."""
        s = he._sealapi()
        ct = s.Ciphertext(self.ctx, self.pid, size)     # size is its capacity here
        ct.resize(self.ctx, self.pid, size)
        view = _ct_data(ct, size, len(self.data_moduli), self.n, writable=True)
        if view is None or ct.is_ntt_form():
            return None, None
        return ct, view.reshape(size, len(self.data_moduli), self.n)

    def _ct_bytes(self, polys: np.ndarray, ntt: bool = False) -> bytes:
        """A data-level ciphertext of these polynomials ([size, L*N] residues), uncompressed."""
        body = (struct.pack("<4Q", *self.pid) + (b"\x01" if ntt else b"\x00")
                + struct.pack("<QQQdQ", polys.shape[0], self.n, len(self.data_moduli), 1.0, 1)
                + he._seal_array(polys.reshape(-1)))
        return he._seal_object(body)

    def finish(self, files: "he._Files", acc_ntt, mask: np.ndarray, noise_bound: int,
               rand: Callable, keep: list[int] | None = None) -> bytes:
        """The returned ciphertext: acc (NTT form) + a fresh public-key encryption of zero +
        (e_flood + Delta'(mask), 0), switched down to mm_return primes, serialized. With the
        peer's key at the data primes (pk_ntt) the zero encryption is made there
        (he.zero_at_data_primes): its (pk0 u, pk1 u) joins acc in NTT form, one inverse NTT
        serves both, its e1 joins the flood term's c0 and its e2 is that term's c1; else
        SEAL's encrypt_zero (key level, switched down), and acc leaves NTT form on its own.
        With `keep` (the output coefficients, ascending) only c0's coefficients there are sent,
        c1 whole, 50 bits a coefficient (output extraction: about half the bytes where the
        outputs are few; the owner opens it with open_extracted): every coefficient sent is
        flooded, re-randomised and masked as before; the others are neither flooded nor masked
        (`mask` may then be R at `keep` alone), nor sent. That is safe because mod switching
        and decryption's c0 + c1 s act coefficient by coefficient in c0: what is sent is a
        projection of the ciphertext flooded everywhere."""
        s = he._sealapi()
        bits = self.params.flood_bits(noise_bound)
        self.room(bits, noise_bound)
        errors = None
        if self.pk_ntt is not None:
            out, errors = he.zero_at_data_primes(files, self.ctx, self.pid, self.evaluator, self.pk_ntt,
                                                 self.data_moduli, 1 << self.k, rand)
            if acc_ntt is not None:
                self.evaluator.add_inplace(out, acc_ntt)
            self.evaluator.transform_from_ntt_inplace(out)
            acc_ntt = None
        else:
            out = s.Ciphertext()
            self.encryptor.encrypt_zero(out)
        noise, polys = self._flood_term(bits, mask, errors, rand, keep)
        if noise is None:
            noise = files.load(s.Ciphertext, self.ctx, self._ct_bytes(polys.reshape(2, -1)), "flooding term")
        self.evaluator.add_inplace(out, noise)
        if acc_ntt is not None:
            self.evaluator.transform_from_ntt_inplace(acc_ntt)
            self.evaluator.add_inplace(out, acc_ntt)
        while out.coeff_modulus_size() > self.params.mm_return:
            self.evaluator.mod_switch_to_next_inplace(out)
        return files.dump(out) if keep is None else self._extracted(files, out, keep)

    def _flood_term(self, bits: int, mask: np.ndarray, errors: np.ndarray | None, rand: Callable,
                    keep: list[int] | None) -> tuple:
        """(e_flood + Delta'(mask) [+ e1], [e2]) at the data primes: (its Ciphertext or None,
        its polynomials [2, L, N]); e uniform in [-2^bits, 2^bits). With `keep`, c0 is drawn
        and written at those coefficients only (the others are never sent)."""
        nd = self.n
        at = slice(None) if keep is None else keep      # c0's coefficients that are sent
        width = nd if keep is None else len(keep)
        if keep is not None and mask.size != width:
            mask = mask[keep]
        words = -(-(bits + 1) // 64)
        w = rand((words, width))
        top = bits + 1 - 64 * (words - 1)
        if top < 64:
            w[-1] &= np.uint64((1 << top) - 1)
        shift = self.delta(mask)
        noise, polys = self._new_ct(2)        # (e_flood + Delta'(mask), 0), written in place
        if polys is None:
            polys = np.zeros((2, len(self.data_moduli), nd), dtype=np.uint64)
        elif keep is not None:
            polys[0] = 0                      # c0 is written at `keep` only
        for j, q in enumerate(self.data_moduli):
            mq = np.uint64(q)
            r = words_mod([w[i] for i in range(words)], q)
            sh = np.uint64((1 << bits) % q)                  # e = w - 2^F
            e = np.where(r >= sh, r - sh, r + mq - sh)
            v = e + shift[j]
            v = np.where(v >= mq, v - mq, v)
            if errors is not None:
                v = v + errors[0, j, at].astype(np.uint64)
                v = np.where(v >= mq, v - mq, v)
                polys[1, j] = errors[1, j]
            polys[0, j, at] = v
        return noise, polys

    def _extracted(self, files: "he._Files", out, keep: list[int]) -> bytes:
        """A returned ciphertext (mm_return primes) as sent with `keep`: c0 at `keep`, c1
        whole, packed at 50 bits (open_extracted reads it)."""
        level, nd = self.params.mm_return, self.n
        data = _ct_data(out, 2, level, nd)
        if data is None:               # not the layout _ct_data knows: SEAL's zstd save
            body = _body(files.dump(out), _HEAD + 16 * level * nd + 4096)
            data = np.frombuffer(body, dtype="<u8", count=2 * level * nd, offset=_HEAD)
        polys = data.reshape(2, level, nd)
        return pack50(np.concatenate([polys[0][:, keep].reshape(-1), polys[1].reshape(-1)]))


def _at_nonzero(fn: Callable, a: np.ndarray, levels: int) -> np.ndarray:
    """fn(a) ([levels, *a.shape], fn(0) = 0) for uint64 a: where fewer than half of a's
    elements are nonzero (a kept conv kernel's rows, a batch-1 linear layer's plaintexts),
    fn of those alone, scattered into zeros; else fn(a)."""
    a = np.ascontiguousarray(a, dtype=np.uint64)
    flat = a.reshape(-1)
    if 2 * np.count_nonzero(flat) >= flat.size:
        return fn(a)
    nz = np.flatnonzero(flat)
    out = np.zeros((levels, flat.size), dtype=np.uint64)
    if nz.size:
        out[:, nz] = fn(flat[nz])
    return out.reshape((levels,) + a.shape)


def combine(top: np.ndarray, low: np.ndarray, k: int) -> np.ndarray:
    """v mod 2^64 from its low k bits (exact) and its top k bits up to +-1 (k > 32): the
    2k - 64 bits both hold decide the carry; anything else is a ProtocolError."""
    lowbits = 64 - k
    overlap = 2 * k - 64
    om = np.uint64((1 << overlap) - 1)
    km = np.uint64((1 << k) - 1)
    top = top.astype(np.uint64) & km
    low = low.astype(np.uint64) & km
    with np.errstate(over="ignore"):
        d = ((low >> np.uint64(lowbits)) - top) & om           # top's error, mod 2^overlap
        bad = (d != 0) & (d != np.uint64(1)) & (d != om)
        if bad.any():
            raise ProtocolError("pairwise: a returned Z_2^64 ciphertext decrypts inconsistently "
                                "(noise past the bound, or tampered)")
        fixed = (top + np.where(d == om, km, d)) & km          # top - 1 is top + (2^k - 1)
        return (fixed << np.uint64(lowbits)) | (low & np.uint64((1 << lowbits) - 1))
