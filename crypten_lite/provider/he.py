"""Lattice homomorphic encryption for the pairwise provider: BFV (Microsoft SEAL, through
TenSEAL's ``sealapi`` bindings) over a CRT of plaintext primes, exact in Z_2^64, for the
elementwise (batched) products; matrix products and convolutions (the coefficient encoding
below, he_conv.py) run on the Z_2^64 engine of he_pow2.py instead (plaintext modulus 2^64,
one set of ciphertexts, R uniform mod 2^64), through the same exchange (_two_way).

Each party holds its own key pair. For each product one party is the *owner*: it encrypts
its operands under its own key; the other (the *evaluator*) multiplies them by its own
operands in plaintext, adds a mask and a flooding term, re-randomises under the owner's
public key, and returns ciphertexts that the owner decrypts. Where a correlation has two
or more ciphertext blocks (elementwise) or two one-sided products (split matmul), each
party owns half and evaluates the other half at the same time, so both parties' CPUs
work (TenSEAL holds the GIL inside SEAL calls: one process uses about one core). What the owner learns is
X + R, where X is the exact integer sum of cross products and R is uniform in
[0, 2^max(bound + STAT_BITS, 64)): statistically within 2^-STAT_BITS of R whatever X is.
Its share is (X + R) mod 2^64 (uniform); the evaluator's is -R mod 2^64.

Parameters (docs/protocols.md, "Pairwise provider"): ring degree N = 8192 and a coefficient
modulus of 218 bits in all (the HE standard's bound for 128-bit classical security at
N = 8192 with a ternary secret): three 60-bit data primes and a 38-bit special prime (which
only key generation and the public-key encryptions' first level use: nothing is ever
key-switched); plaintext moduli t_i: 45-bit primes = 1 mod 2N, below every data prime so
that SEAL lifts plaintexts by its fast path, as many as the exact integer needs
(Sum log2 t_i >= bound + STAT_BITS + 1: four for a mul or a matmul with K <= 2^10).

Encodings: *batched* (SIMD slots, elementwise products, SEAL's BatchEncoder) and
*coefficient* (Cheetah-style polynomial encoding of matrix blocks: one plaintext-ciphertext
product gives a block of inner products). Coefficient plaintexts are written straight into
SEAL's (uncompressed) serialization format and loaded: no NTT in Python, no per-coefficient
call.

Circuit privacy: every returned ciphertext is the evaluation plus a fresh public-key
encryption of zero (re-randomises c1 and c0; for elementwise products made at the data
primes with the peer's key reduced to them, _Prime.zero_ntt, and added in NTT form to the
products before their one inverse NTT) plus a ciphertext (e, 0) whose e is uniform in
[-2^F, 2^F) per coefficient, F = log2(a bound on the evaluation's noise) + STAT_BITS +
log2 N (noise flooding: each coefficient's noise is within 2^-(STAT_BITS + log2 N) of e's
distribution whatever the evaluator's operand; tests/unit/test_pairwise_security.py measures
it with SEAL's noise budget). Every coefficient of the result that is not an output is
masked uniformly mod t_i, and the ciphertext is switched down to RETURN_PRIMES primes.
"""

from __future__ import annotations

import math
import os
import struct
import tempfile
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import ConfigError, ProtocolError
from ..random import PRG

N = 8192
PLAIN_BITS = 45               # < every data prime: SEAL's fast plaintext lift
MAX_PRIMES = 5
DATA_BITS = (60, 60, 60)       # the ciphertexts' modulus (180 bits)
SPECIAL_BITS = 38              # key level only: 218 bits in all
STAT_BITS = 40
UPLOAD_WIRE = "ntt-seeded-v1"  # the Z_2^64 engine's ciphertexts to the peer (he_upload.py)
FRESH_NOISE = 21               # |e| of a fresh encryption: SEAL's 6 sigma (19.2) + the rounding of q m / t
RETURN_PRIMES = 1              # results come back at one 60-bit prime (_room checks the noise)
THREADS_ENV = "CRYPTEN_LITE_HE_THREADS"   # threads (one prime each); default 4
CT_BYTES = 236 << 10           # a bound on a ciphertext as sent (seeded, 3 primes: 197 KB) or back (1 prime: 131 KB)
MAX_NOISE_TERMS = 12288        # products x nonzero plaintext coefficients in one matmul / conv output
                               # (he_pow2.py: |B| <= 2^63, 200-bit q; see Pow2Unit.room)
K_CHUNK = MAX_NOISE_TERMS // 4   # a longer inner dimension is summed from chunks of this size
SECURITY = "128-bit classical (HE standard, N=8192, log2 q=218 = 3x60 + 38, ternary secret)"


def _sealapi():
    try:
        import tenseal.sealapi as sealapi
    except ImportError as e:  # pragma: no cover - depends on the installation
        raise ConfigError("provider 'pairwise' needs TenSEAL (Microsoft SEAL): "
                          "pip install 'crypten_lite[pairwise]'") from e
    return sealapi


@dataclass(frozen=True)
class HEParams:
    """Public parameters both parties must share (compared in the handshake)."""

    n: int
    coeff_moduli: tuple[int, ...]
    plain_primes: tuple[int, ...]
    stat_bits: int = STAT_BITS
    return_primes: int = RETURN_PRIMES
    mm_moduli: tuple[int, ...] = ()     # matmul / conv engine (he_pow2.py): q, t = 2^mm_t_bits
    mm_t_bits: int = 40
    mm_return: int = 2

    def describe(self) -> str:
        return (f"bfv;n={self.n};q={','.join(map(str, self.coeff_moduli))};"
                f"t={','.join(map(str, self.plain_primes))};stat={self.stat_bits};"
                f"flood=c0-uniform;ret={self.return_primes};roles=both-own;conv=direct-cheetah;"
                f"mm=pow2-64;mmq={','.join(map(str, self.mm_moduli))};mmt={self.mm_t_bits};"
                f"mmret={self.mm_return};mmwire=packed50-extract;mmup={UPLOAD_WIRE}")

    def flood_bits(self, noise_bound: int) -> int:
        """F: the flood e is uniform in [-2^F, 2^F) per coefficient, for an evaluation whose
        noise is below noise_bound in every coefficient: a shift by d < 2^(F - stat - log2 N)
        moves e's distribution by d / 2^(F + 1) per coefficient, 2^-(stat + 1) over all N."""
        return noise_bound.bit_length() + self.stat_bits + (self.n - 1).bit_length()

    def mask_bits(self, bound_bits: int, parity: bool = False) -> int:
        """R is uniform in [0, 2^mask_bits): at least stat_bits above X's bound (X + R is
        within 2^-stat_bits of R), and at least 64 (so R, X + R mod 2^64 are uniform) unless
        only the parity of the shares is used (XOR shares: R's low bit is uniform)."""
        return bound_bits + self.stat_bits if parity else max(bound_bits + self.stat_bits, 64)

    def primes_for(self, bound_bits: int, parity: bool = False) -> int:
        """How many plaintext primes hold X + R (< 2^(mask_bits + 1)) exactly."""
        need = self.mask_bits(bound_bits, parity) + 1
        total = 0.0
        for i, t in enumerate(self.plain_primes):
            total += math.log2(t)
            if total >= need:
                return i + 1
        raise ProtocolError(f"pairwise: a product bound of 2^{bound_bits} needs more than "
                            f"{len(self.plain_primes)} plaintext primes")


def default_params() -> HEParams:
    s = _sealapi()
    coeff = tuple(m.value() for m in s.CoeffModulus.Create(N, list(DATA_BITS) + [SPECIAL_BITS]))
    plain = tuple(m.value() for m in s.PlainModulus.Batching(N, [PLAIN_BITS] * MAX_PRIMES))
    from . import he_pow2
    return HEParams(N, coeff, plain, mm_moduli=he_pow2.moduli(), mm_t_bits=he_pow2.T_BITS,
                    mm_return=he_pow2.RETURN_PRIMES)


# ---------------------------------------------------------------------- number theory
def _inv(a: int, m: int) -> int:
    return pow(a, -1, m)


_M32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)


def _mulhi(a: np.ndarray, b: np.ndarray | np.uint64) -> np.ndarray:
    """floor(a * b / 2^64) for uint64 a, b (four 32-bit partial products)."""
    a0, a1 = a & _M32, a >> _S32
    b0, b1 = b & _M32, b >> _S32
    mid1, mid2 = a1 * b0, a0 * b1
    carry = (((a0 * b0) >> _S32) + (mid1 & _M32) + (mid2 & _M32)) >> _S32
    return a1 * b1 + (mid1 >> _S32) + (mid2 >> _S32) + carry


def mulmod_const(a: np.ndarray, c: int, m: int) -> np.ndarray:
    """a * c mod m for uint64 a < m and a constant c < m < 2^62, by Shoup's method:
    q = floor(a floor(c 2^64 / m) / 2^64) is floor(a c / m) or one less, so a c - q m is in
    [0, 2m) (computed mod 2^64, no division)."""
    mm = np.uint64(m)
    with np.errstate(over="ignore"):
        r = a * np.uint64(c) - _mulhi(a, np.uint64((c << 64) // m)) * mm
    return np.where(r >= mm, r - mm, r)


def words_mod(words: list[np.ndarray], m: int) -> np.ndarray:
    """Sum_i words[i] 2^(64 i) mod m (m < 2^62), elementwise."""
    mm = np.uint64(m)
    out = np.zeros(words[0].shape, dtype=np.uint64)
    radix = 1
    for w in words:
        term = mulmod_const(w % mm, radix % m, m) if radix % m != 1 else w % mm
        out = out + term
        out = np.where(out >= mm, out - mm, out)
        radix = (radix << 64) % m
    return out


def residues(values: np.ndarray, t: int) -> np.ndarray:
    """uint64 values (ring elements read as unsigned) mod t (t = 2^64: the values)."""
    if t == 1 << 64:
        return values.astype(np.uint64, copy=False)
    return values % np.uint64(t)


def crt_mod64(res: list[np.ndarray], primes: tuple[int, ...]) -> np.ndarray:
    """The integer with residues `res` mod `primes` (each < 2^62), reduced mod 2^64
    (Garner's mixed radix; exact as long as the integer is below the product of primes)."""
    if max(primes) < _SMALL and all(2 * t > max(primes) for t in primes):
        return _crt_small(res, primes)
    digits: list[np.ndarray] = []
    for i, (r, t) in enumerate(zip(res, primes)):
        tt = np.uint64(t)
        v = r.astype(np.uint64) % tt
        for j in range(i):
            d = digits[j] % tt
            v = np.where(v >= d, v - d, v + tt - d)
            v = mulmod_const(v, _inv(primes[j] % t, t), t)
        digits.append(v)
    out = np.zeros(res[0].shape, dtype=np.uint64)
    radix = 1
    with np.errstate(over="ignore"):
        for i, d in enumerate(digits):
            out = out + d * np.uint64(radix % (1 << 64))
            radix *= primes[i]
    return out


_SMALL = 1 << 51        # moduli below this: products mod m by a float64 quotient estimate


def _crt_small(res: list[np.ndarray], primes: tuple[int, ...]) -> np.ndarray:
    """crt_mod64 for primes below 2^51 within a factor of two of each other (the engine's
    45-bit plaintext primes): residues already below their prime (decrypted slots) are taken
    as they are, a digit is brought below another prime by one conditional subtraction
    instead of a division, and each product mod t_i by a float64 quotient estimate
    (he_pow2.mulmod) instead of 32-bit partial products. Same result, a third of the passes."""
    from .he_pow2 import mulmod
    digits: list[np.ndarray] = []
    for i, (r, t) in enumerate(zip(res, primes)):
        tt = np.uint64(t)
        v = np.asarray(r, dtype=np.uint64)
        if (v >= tt).any():            # decrypted slots never are: no division for them
            v = v % tt
        for j in range(i):
            d = digits[j]
            d = np.where(d >= tt, d - tt, d)          # d < t_j < 2 t_i
            v = np.where(v >= d, v - d, v + tt - d)
            v = mulmod(v, _inv(primes[j] % t, t), t)
        digits.append(v)
    out = digits[0].copy()
    radix = primes[0]
    with np.errstate(over="ignore"):
        for i in range(1, len(digits)):
            out += digits[i] * np.uint64(radix % (1 << 64))
            radix *= primes[i]
    return out


# ---------------------------------------------------------------------- SEAL objects
_IO_LOCK = threading.Lock()


class _Files:
    """SEAL serializes to files only: a private folder (0700) on a RAM disk where one exists."""

    def __init__(self):
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        self.dir = tempfile.mkdtemp(prefix="crypten_lite_he_", dir=base)
        # an engine never closed (a dropped provider, a test) still leaves no folder behind:
        # removed when this object is collected or at the interpreter's exit
        self._finalizer = weakref.finalize(self, _rmdir, self.dir)
        self._n = 0
        self._local = threading.local()
        self._inputs: list[tuple[int, str]] = []    # (fd, path): one input file per thread

    def path(self) -> str:
        with _IO_LOCK:
            self._n += 1
            return os.path.join(self.dir, f"{self._n}.bin")

    def dump(self, obj) -> bytes:
        path = self.path()
        try:
            obj.save(path)
            with open(path, "rb") as f:
                return f.read()
        finally:
            _unlink(path)

    def _input(self) -> tuple[int, str]:
        """This thread's input file, kept open and overwritten in place: a tmpfs file
        truncated or unlinked per object frees and refills its pages (about 3x the write).
        On Linux it is unlinked at once and SEAL opens it as /proc/self/fd/N, so nothing is
        left on the RAM disk even when the process dies without close(); elsewhere close()
        removes it."""
        got = getattr(self._local, "input", None)
        if got is None:
            path = self.path()
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            alias = f"/proc/self/fd/{fd}"
            if os.path.exists(alias):
                _unlink(path)
                path = alias
            got = self._local.input = (fd, path)
            with _IO_LOCK:
                self._inputs.append(got)
        return got

    def load(self, make: Callable, ctx, data: bytes, what: str):
        """A SEAL object from its bytes. SEAL reads the size its header states, so the
        previous object's longer tail past it is never read; a header that claims more than
        was written is refused here (SEAL would read that stale tail)."""
        if len(data) < 16 or struct.unpack_from("<Q", data, 8)[0] != len(data):
            raise ProtocolError(f"pairwise: malformed {what} from the peer "
                                f"(its SEAL header does not state its {len(data)} bytes)")
        fd, path = self._input()
        view, done = memoryview(data), 0
        while done < len(data):
            done += os.pwrite(fd, view[done:], done)
        obj = make()
        try:
            obj.load(ctx, path)
        except Exception as e:  # SEAL validates size, metadata and coefficient ranges
            raise ProtocolError(f"pairwise: malformed {what} from the peer "
                                f"({type(e).__name__}: {e})") from None
        return obj

    def close(self) -> None:
        with _IO_LOCK:
            inputs, self._inputs = self._inputs, []
        for fd, path in inputs:
            os.close(fd)
            if not path.startswith("/proc/"):
                _unlink(path)
        self._finalizer()


def _rmdir(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


_VERSION: bytes | None = None


def _seal_header(total: int) -> bytes:
    """SEAL's 16-byte serialization header (magic, header size, SEAL's version as a saved
    object carries it, no compression, total size)."""
    global _VERSION
    if _VERSION is None:
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "v.bin")
            _sealapi().Plaintext("1").save(path)
            with open(path, "rb") as f:
                _VERSION = f.read(5)[3:5]
    return struct.pack("<HB", 0xA15E, 16) + _VERSION + struct.pack("<BHQ", 0, 0, total)


def _seal_object(body: bytes) -> bytes:
    return _seal_header(16 + len(body)) + body


def _seal_array(values: np.ndarray) -> bytes:
    """A DynArray<uint64> as SEAL serializes it (uncompressed)."""
    return _seal_object(struct.pack("<Q", values.size) + values.astype("<u8", copy=False).tobytes())


def check_room(data_moduli: tuple[int, ...], t: int, n: int, keep: int, flood_bits: int,
               noise_bound: int) -> None:
    """Refuse a flood that would make a returned ciphertext decrypt wrongly: the noise (flood
    + evaluation + the public-key encryption's, below 2^20) must stay under q / 2t at the data
    level and after each switch down to `keep` primes (a switch adds at most (1 + N) / 2).
    Both engines' check (t = 2^64 for he_pow2's)."""
    q = math.prod(data_moduli)
    noise = (1 << flood_bits) + noise_bound + (1 << 20)
    level = list(data_moduli)
    while True:
        if 2 * t * noise >= q:
            raise ProtocolError(f"pairwise: a product of {noise_bound.bit_length()}-bit "
                                f"noise leaves no room for {flood_bits}-bit flooding at "
                                f"{len(level)} primes; split the operation into smaller ones")
        if len(level) <= keep:
            return
        last = level.pop()
        q //= last
        noise = noise // last + 1 + (1 + n) // 2


def key_at_data_primes(files: "_Files", ctx, pid, n: int, levels: int, public):
    """A SEAL PublicKey's two polynomials at the first `levels` (data) primes only, NTT form
    (as SEAL keeps a key), as a data-level Ciphertext for zero_at_data_primes; None where
    the saved key is not laid out as SEAL 4 saves one (the caller keeps SEAL's encrypt_zero).
    Shared by the CRT engine (_Prime) and the Z_2^64 engine (he_pow2.Pow2Unit)."""
    s = _sealapi()
    from .he_pow2 import _HEAD, _body
    total = levels + 1
    body = _body(files.dump(public), _HEAD + 16 * total * n + 4096)
    if (len(body) < _HEAD + 16 * total * n or body[32] != 1
            or struct.unpack_from("<QQQ", body, 33) != (2, n, total)
            or struct.unpack_from("<Q", body, _HEAD - 8)[0] != 2 * total * n):
        return None
    polys = np.frombuffer(body, dtype="<u8", count=2 * total * n, offset=_HEAD)
    polys = np.ascontiguousarray(polys.reshape(2, total, n)[:, :levels])
    raw = _seal_object(struct.pack("<4Q", *pid) + b"\x01"
                       + struct.pack("<QQQdQ", 2, n, levels, 1.0, 1) + _seal_array(polys.reshape(-1)))
    return files.load(s.Ciphertext, ctx, raw, "public key")


def zero_at_data_primes(files: "_Files", ctx, pid, evaluator, pk_ntt, data_moduli: tuple,
                        t: int, rand: Callable) -> tuple:
    """A public-key encryption of zero under the peer's key (pk_ntt, key_at_data_primes),
    made at the data primes: (pk0 u, pk1 u) in NTT form (u uniform ternary) and the errors
    (e1, e2) (SEAL's centred binomial, 21 + 21 bits) as residues [2, L, N], for the caller to
    add after its one inverse NTT. `t` is the context's SEAL plaintext modulus (u's -1 is
    written t - 1, which SEAL's plaintext NTT lifts to -1). SEAL's own encrypt_zero makes the
    same at the key level and switches down (12 NTTs instead of 9, and per-coefficient
    samplers); the noise here, |-e_pk u + e1 + e2 s| < 2^19, is within what check_room
    allows for it (2^20)."""
    s = _sealapi()
    nd = pk_ntt.poly_modulus_degree()
    got = np.zeros(0, dtype=np.uint8)
    while got.size < nd:          # u_i = b mod 3 - 1 for bytes b < 255: uniform ternary
        b = rand((nd // 4,)).view(np.uint8)
        got = np.concatenate([got, b[b < 255]])
    u = got[:nd] % np.uint8(3)
    coeffs = np.where(u == 0, np.uint64(t - 1), (u - np.uint8(1)).astype(np.uint64))
    raw = _seal_object(struct.pack("<4QQd", 0, 0, 0, 0, coeffs.size, 1.0) + _seal_array(coeffs))
    pt = files.load(s.Plaintext, ctx, raw, "ternary plaintext")
    evaluator.transform_to_ntt_inplace(pt, pid)   # lifted centred: t - 1 -> -1
    z = s.Ciphertext()
    evaluator.multiply_plain(pk_ntt, pt, z)
    w = rand((4, nd)) & np.uint64((1 << 21) - 1)
    e = np.bitwise_count(w[:2]).astype(np.int64) - np.bitwise_count(w[2:]).astype(np.int64)
    mods = np.array(data_moduli, dtype=np.int64)[None, :, None]
    e = e[:, None, :]
    return z, np.where(e < 0, e + mods, e)       # |e| <= 21: residues in [0, q_i)


def encrypt_at(p, files: "_Files", rows: np.ndarray) -> list[bytes]:
    """p.encrypt_rows; on the Z_2^64 engine in NTT form (he_upload.py, read by
    CrossEngine._load_ntt)."""
    if hasattr(p, "encrypt_ntt"):
        return p.encrypt_ntt(files, rows)
    return p.encrypt_rows(files, rows)


def finish_at(p, files: "_Files", acc, mask: np.ndarray, bound: int, rand: Callable, where: list[int]) -> bytes:
    """p.finish of a returned ciphertext whose outputs lie at `where`: on the Z_2^64 engine
    only c0's coefficients there are sent (he_pow2.Pow2Unit.finish keep=, packed at 50
    bits); a CRT prime's returns whole."""
    if hasattr(p, "open_extracted"):
        return p.finish(files, acc, mask, bound, rand, where)
    return p.finish(files, acc, mask, bound, rand)


def open_at(p, files: "_Files", data: bytes, where: list[int]) -> np.ndarray:
    """p.open of what finish_at returned."""
    if hasattr(p, "open_extracted"):
        return p.open_extracted(files, data, where)
    return p.open(files, data, where)


class _Prime:
    """One plaintext prime's SEAL context, encoder and evaluator."""

    def __init__(self, params: HEParams, t: int):
        s = _sealapi()
        self.t = t
        self.n = params.n
        parms = s.EncryptionParameters(s.SCHEME_TYPE.BFV)
        parms.set_poly_modulus_degree(params.n)
        parms.set_coeff_modulus([s.Modulus(q) for q in params.coeff_moduli])
        parms.set_plain_modulus(s.Modulus(t))
        self.ctx = s.SEALContext(parms, True, s.SEC_LEVEL_TYPE.TC128)
        if not self.ctx.parameters_set():
            raise ConfigError(f"pairwise: SEAL refuses the parameters: "
                              f"{self.ctx.parameters_error_message()}")
        self.data_moduli = params.coeff_moduli[:-1]       # the last one is the special prime
        self.pid = self.ctx.first_parms_id()
        self._noise_template: bytes | None = None
        self.encoder = s.BatchEncoder(self.ctx)
        self.evaluator = s.Evaluator(self.ctx)
        self.encryptor = None      # the peer's public key: re-randomises returned results
        self.pk_ntt = None         # the same key at the data primes, NTT form (zero_ntt)
        self.sym = None            # this party's secret key: encrypts its own operands
        self.decryptor = None
        self.secret_key = None

    def plain(self, slots: np.ndarray):
        pt = _sealapi().Plaintext()
        self.encoder.encode(slots.tolist(), pt)
        return pt

    def plain_bytes(self, coeffs: np.ndarray) -> bytes:
        """A coefficient-form plaintext (coefficients < t) in SEAL's serialization format."""
        return _seal_object(struct.pack("<4QQd", 0, 0, 0, 0, coeffs.size, 1.0) + _seal_array(coeffs))

    def noise_bytes(self, residues_: np.ndarray) -> bytearray:
        """The ciphertext (e, 0) at the data level, coefficient form; residues_ [L, N] are e
        mod each data prime (written into a copy of a serialized all-zero ciphertext)."""
        if self._noise_template is None:
            zeros = np.zeros(2 * residues_.size, dtype=np.uint64)
            body = (struct.pack("<4Q", *self.pid) + b"\x00"
                    + struct.pack("<QQQdQ", 2, self.n, residues_.shape[0], 1.0, 1)
                    + _seal_array(zeros))
            self._noise_template = _seal_object(body)
        buf = bytearray(self._noise_template)
        start = len(buf) - 16 * residues_.size          # c0 then c1, 8 bytes a coefficient
        np.frombuffer(buf, dtype="<u8", count=residues_.size, offset=start)[:] = residues_.reshape(-1)
        return buf

    def noise_ct(self, residues_: np.ndarray, c1: np.ndarray | None = None):
        """The ciphertext (e, 0) of noise_bytes (or (e, c1)) written in place into a fresh
        SEAL Ciphertext (he_pow2._ct_data's checked view), or None where that view is not
        available."""
        from .he_pow2 import _ct_data
        s = _sealapi()
        levels = residues_.shape[0]
        ct = s.Ciphertext(self.ctx, self.pid, 2)
        ct.resize(self.ctx, self.pid, 2)
        view = _ct_data(ct, 2, levels, self.n, writable=True)
        if view is None or ct.is_ntt_form():
            return None
        view[:residues_.size] = residues_.reshape(-1)     # c0; c1 stays zero unless given
        if c1 is not None:
            view[residues_.size:] = c1.reshape(-1)
        return ct

    def set_peer_key(self, files: "_Files", public) -> None:
        """The peer's public key: SEAL's Encryptor of it, and pk_ntt, the key's two
        polynomials at the data primes only (NTT form, as SEAL keeps a key), for zero_ntt.
        pk_ntt stays None (SEAL's encrypt_zero is used) where the saved key is not laid out
        as SEAL 4 saves one."""
        self.encryptor = _sealapi().Encryptor(self.ctx, public)
        self.pk_ntt = key_at_data_primes(files, self.ctx, self.pid, self.n, len(self.data_moduli), public)

    def zero_ntt(self, files: "_Files", rand: Callable) -> tuple:
        """A public-key encryption of zero under the peer's key, made at the data primes
        (zero_at_data_primes, which says how and why its noise fits check_room)."""
        return zero_at_data_primes(files, self.ctx, self.pid, self.evaluator, self.pk_ntt,
                                   self.data_moduli, self.t, rand)

    def slots_of(self, pt) -> np.ndarray:
        return np.array(self.encoder.decode_uint64(pt), dtype=np.uint64)

    @staticmethod
    def coeffs_of(pt, positions: list[int]) -> np.ndarray:
        """The plaintext's coefficients at `positions` (ascending; 0 past its coeff_count)."""
        count = pt.coeff_count()
        if not positions or positions[-1] < count:     # the usual case: one native call each
            return np.fromiter(map(pt.data, positions), dtype=np.uint64, count=len(positions))
        return np.fromiter((pt.data(i) if i < count else 0 for i in positions),
                           dtype=np.uint64, count=len(positions))


def pack(chunks: list[bytes]) -> bytes:
    """Length-prefixed chunks in one message (one copy of each chunk: a single join)."""
    parts = [struct.pack("<I", len(chunks))]
    for c in chunks:
        parts += (struct.pack("<Q", len(c)), c)
    return b"".join(parts)


def unpack(data: bytes, expected: int, what: str) -> list[bytes]:
    """Length-prefixed chunks; a wrong count or a length past the end is a ProtocolError."""
    try:
        (count,) = struct.unpack_from("<I", data, 0)
        if count != expected:
            raise ProtocolError(f"pairwise: expected {expected} {what}, got {count}")
        out, i = [], 4
        view = memoryview(data)
        for _ in range(count):
            (n,) = struct.unpack_from("<Q", data, i)
            i += 8
            if n > len(data) - i:
                raise ProtocolError(f"pairwise: truncated {what}")
            out.append(view[i:i + n])        # views of the message: no copy per chunk
            i += n
        if i != len(data):
            raise ProtocolError(f"pairwise: trailing bytes after {what}")
        return out
    except struct.error:
        raise ProtocolError(f"pairwise: truncated {what}") from None


# ---------------------------------------------------------------------- the engine
def _threads() -> int:
    raw = os.environ.get(THREADS_ENV, "")
    if raw:
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(f"{THREADS_ENV}={raw!r} is not a number of threads (e.g. 2)") from None
        if value < 1:
            raise ConfigError(f"{THREADS_ENV}={raw!r}: at least 1 thread")
        return value
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(4, max(cpus, 4))      # a product's 4 primes at once (no prime waits for a thread)


def _sizes(x: int) -> set[int]:
    """Candidate block sizes along a dimension of size x: powers of two and x / j."""
    return {min(x, 1 << e) for e in range(0, 14)} | {-(-x // j) for j in range(1, 65)}


def _blocks_cost(m: int, k: int, n: int, degree: int, joint: bool = True) -> tuple[int, int, int, int]:
    """(cost, mw, kw, nw): block sizes of the coefficient encoding, mw*kw*nw + kw - 1 <= degree
    (no negacyclic wrap), chosen to minimise the work of one matmul: `joint`, both operands
    encrypted by party 0 (A0 B1 + A1 B0 in one set of ciphertexts), else one product with
    only the left operand encrypted. An inner dimension past K_CHUNK is made in chunks
    (CrossEngine.matmul): the blocks of one chunk, the cost of all."""
    if k > K_CHUNK:
        chunks = -(-k // K_CHUNK)
        cost, mw, kw, nw = _blocks_cost(m, -(-k // chunks), n, degree, joint)
        return cost * chunks, mw, kw, nw
    best = None
    for kw in sorted(_sizes(k)):
        for nw in sorted(_sizes(n)):
            mw = min(m, (degree - kw + 1) // (kw * nw))
            if mw < 1:
                continue
            mb, kb, nb = -(-m // mw), -(-k // kw), -(-n // nw)
            if (2 * kb * max(mw * kw, kw * nw) if joint else kb * kw * nw) > MAX_NOISE_TERMS:
                continue              # the flooding would not fit the noise budget
            # the Z_2^64 engine (he_pow2.py), in units of an eighth of a ms of CPU (load 17,
            # /tmp-free RAM disk): a plaintext product in NTT form 0.25 ms (2); a plaintext
            # (centred residues, NTT, read back, load) 1.8 ms (14); a ciphertext sent up
            # (encrypt, shift c0, load, NTT: 6 ms) or returned (re-randomise, flood, mask,
            # switch, serialize, decrypt twice: 6 ms) weighted 1.5x its CPU (72): each is
            # also he_pow2.CT_BYTES on the wire and in the exchange's working set
            up = mb * kb + (kb * nb if joint else 0)
            plains = kb * nb + (mb * kb if joint else 0)
            cost = 72 * up + 72 * mb * nb + 14 * plains + 2 * (2 if joint else 1) * mb * nb * kb
            if best is None or cost < best[0]:
                best = (cost, mw, kw, nw)
    if best is None:
        raise ProtocolError(f"pairwise: no coefficient encoding for a [{m},{k}]x[{k},{n}] product")
    return best


def _blocks(m: int, k: int, n: int, degree: int) -> tuple[int, int, int]:
    """Block sizes (mw, kw, nw) of the joint encoding (see _blocks_cost)."""
    return _blocks_cost(m, k, n, degree)[1:]


def split_products(m: int, k: int, n: int, degree: int) -> bool:
    """Whether two one-sided products (A0 B1 owned by party 0, A1 B0 by party 1, made at
    the same time, each party's CPU on one) cost less than the joint encoding of
    A0 B1 + A1 B0 (party 1's CPU evaluates all of it): the cost of one against the joint's."""
    one = min(_blocks_cost(m, k, n, degree, joint=False)[0], _blocks_cost(n, k, m, degree, joint=False)[0])
    return one < _blocks_cost(m, k, n, degree)[0]


def split_transposed(m: int, k: int, n: int, degree: int) -> bool:
    """Whether the split products cost less transposed, (B1^T A0^T)^T owned by party 1 and
    (B0^T A1^T)^T by party 0 (each encrypts its own right operand), [n,k]x[k,m] blocks."""
    return _blocks_cost(n, k, m, degree, joint=False)[0] < _blocks_cost(m, k, n, degree, joint=False)[0]


class CrossEngine:
    """The two-party cross products: rank 0 owns the keys, rank 1 evaluates.

    `send(data)` / `recv()` move one message to / from the peer; `rand(shape)` draws
    uniform uint64 words from this party's private PRG (the evaluator's masks and floods).
    """

    def __init__(self, rank: int, params: HEParams, send: Callable[[bytes], None],
                 recv: Callable[[], bytes], rand: Callable[[tuple], np.ndarray]):
        self.rank = rank
        self.params = params
        self._send, self._recv, self._rand = send, recv, rand
        self._primes: list[_Prime] = []
        self._pow2 = None          # the Z_2^64 matmul / conv unit (he_pow2.py), keyed on first use
        self._files = _Files()
        threads = _threads()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="he") if threads > 1 else None

    # -- keys ------------------------------------------------------------------------
    def _ready(self, count: int) -> list[_Prime]:
        """The first `count` prime contexts; new ones get keys. Both parties own a key pair per
        prime (each encrypts its own operands of the products it owns, and re-randomises the
        results it returns under the peer's public key): each sends its public keys, then
        reads the peer's."""
        s = _sealapi()
        have = len(self._primes)
        if count <= have:
            return self._primes[:count]
        fresh = [_Prime(self.params, t) for t in self.params.plain_primes[have:count]]
        keys = []
        for p in fresh:
            gen = s.KeyGenerator(p.ctx)
            p.secret_key = gen.secret_key()
            public = s.PublicKey()
            gen.create_public_key(public)
            p.sym = s.Encryptor(p.ctx, p.secret_key)
            p.decryptor = s.Decryptor(p.ctx, p.secret_key)
            keys.append(self._files.dump(public))
        self._send(pack(keys))
        theirs = unpack(self._recv(), len(fresh), "public keys")
        for p, data in zip(fresh, theirs):
            p.set_peer_key(self._files, self._files.load(s.PublicKey, p.ctx, data, "public key"))
        self._primes.extend(fresh)
        return self._primes[:count]

    def _mm_units(self) -> list:
        """[the Z_2^64 unit] of matmul and conv products (he_pow2.py); on first use each
        party sends its public key for it, then reads the peer's (as _ready does)."""
        if self._pow2 is None:
            from . import he_pow2
            unit = he_pow2.Pow2Unit(self.params)
            self._send(pack([unit.keygen(self._files)]))
            unit.peer_key(self._files, unpack(self._recv(), 1, "public keys")[0])
            self._pow2 = unit
        return [self._pow2]

    def _encrypt(self, p: _Prime, pt) -> bytes:
        """Symmetric encryption of a plaintext under this party's own key, serialized with its
        random half replaced by a seed (SEAL's seeded ciphertexts: half the bytes)."""
        return self._files.dump(p.sym.encrypt_symmetric(pt))

    # -- evaluator helpers -----------------------------------------------------------------
    def _uniform(self, t: int, shape: tuple, rand: Callable | None = None) -> np.ndarray:
        """Uniform values mod t from 128 random bits each (bias below 2^-67)."""
        if t == 1 << 64:
            return (rand or self._rand)(tuple(shape))
        w = (rand or self._rand)((2,) + tuple(shape))
        return words_mod([w[0], w[1]], t)

    def noise_bound(self, t: int, products: int, nonzero: int) -> int:
        """A bound on every coefficient of the evaluation's noise: `products` plaintext
        products summed, each of a fresh encryption (|e| <= FRESH_NOISE) and a plaintext of
        at most `nonzero` coefficients, each |c| <= t (SEAL lifts them to (-t/2, t/2]), plus
        the mask's rounding."""
        return FRESH_NOISE * products * nonzero * t + 1

    def _room(self, p: _Prime, flood_bits: int, noise_bound: int) -> None:
        check_room(p.data_moduli, p.t, self.params.n, self.params.return_primes, flood_bits, noise_bound)

    def _flooded(self, p: _Prime, noise_bound: int, rand: Callable | None = None, acc_ntt=None):
        """A fresh public-key encryption of zero (re-randomises the returned ciphertext)
        plus (e, 0), e uniform in [-2^F, 2^F) per coefficient, F = flood_bits(noise_bound),
        plus acc_ntt (an NTT-form evaluation, or None), in coefficient form. With the peer's
        key at the data primes (_Prime.zero_ntt) the zero encryption's (pk0 u, pk1 u) is
        added to acc_ntt in NTT form, so one inverse NTT serves both, and its errors join the
        flood term; else SEAL's encrypt_zero, and acc_ntt leaves NTT form on its own."""
        s = _sealapi()
        bits = self.params.flood_bits(noise_bound)
        self._room(p, bits, noise_bound)
        rand = rand or self._rand
        errors = None
        if p.pk_ntt is not None:
            z, errors = p.zero_ntt(self._files, rand)
            if acc_ntt is not None:
                p.evaluator.add_inplace(z, acc_ntt)
            p.evaluator.transform_from_ntt_inplace(z)
        else:
            z = s.Ciphertext()
            p.encryptor.encrypt_zero(z)
            if acc_ntt is not None:
                p.evaluator.transform_from_ntt_inplace(acc_ntt)
                p.evaluator.add_inplace(z, acc_ntt)
        nd = self.params.n
        words = -(-(bits + 1) // 64)
        w = rand((words, nd))
        top = bits + 1 - 64 * (words - 1)
        if top < 64:
            w[-1] &= np.uint64((1 << top) - 1)
        res = np.empty((len(p.data_moduli), nd), dtype=np.uint64)
        for j, q in enumerate(p.data_moduli):
            r = words_mod([w[i] for i in range(words)], q)
            shift = np.uint64((1 << bits) % q)               # e = w - 2^F
            res[j] = np.where(r >= shift, r - shift, r + np.uint64(q) - shift)
        c1 = None
        if errors is not None:     # e1 joins the flood, e2 is the term's c1
            mods = np.array(p.data_moduli, dtype=np.uint64)[:, None]
            res += errors[0].astype(np.uint64)
            res = np.where(res >= mods, res - mods, res)
            c1 = errors[1].astype(np.uint64)
        noise = p.noise_ct(res, c1)
        if noise is None:          # not the layout he_pow2._ct_data knows: through a file
            raw = p.noise_bytes(res)
            if c1 is not None:
                np.frombuffer(raw, dtype="<u8", count=c1.size, offset=len(raw) - 8 * c1.size)[:] = c1.reshape(-1)
            noise = self._files.load(s.Ciphertext, p.ctx, bytes(raw), "flooding term")
        p.evaluator.add_inplace(z, noise)
        return z

    def _finish(self, p: _Prime, acc_ntt, mask_pt, noise_bound: int, rand: Callable | None = None,
                in_ntt: bool = True) -> bytes:
        """Leave NTT form (unless `in_ntt` is False), flood, mask every slot/coefficient
        (mask_pt), switch down, serialize."""
        ev = p.evaluator
        if in_ntt:
            out = self._flooded(p, noise_bound, rand, acc_ntt)
        else:
            out = self._flooded(p, noise_bound, rand)
            if acc_ntt is not None:
                ev.add_inplace(out, acc_ntt)
        ev.add_plain_inplace(out, mask_pt)
        while out.coeff_modulus_size() > self.params.return_primes:
            ev.mod_switch_to_next_inplace(out)
        return self._files.dump(out)

    def _load_ct(self, p: _Prime, data: bytes):
        ct = self._files.load(_sealapi().Ciphertext, p.ctx, data, "ciphertext")
        if ct.size() != 2 or ct.is_ntt_form():
            raise ProtocolError("pairwise: a ciphertext from the peer has the wrong form")
        return ct

    def _decrypt(self, p: _Prime, data: bytes):
        s = _sealapi()
        ct = self._files.load(s.Ciphertext, p.ctx, data, "ciphertext")
        if ct.size() != 2 or ct.is_ntt_form() or ct.coeff_modulus_size() != self.params.return_primes:
            raise ProtocolError("pairwise: a returned ciphertext has the wrong form")
        pt = s.Plaintext()
        p.decryptor.decrypt(ct, pt)
        return pt

    def _decrypt_slots(self, p: _Prime, data: bytes) -> np.ndarray:
        return p.slots_of(self._decrypt(p, data))

    def _mask_words(self, shape: tuple, bits: int) -> list[np.ndarray]:
        """R uniform in [0, 2^bits) as 64-bit words (least significant first)."""
        words = -(-bits // 64)
        w = self._rand((words,) + tuple(shape))
        top = bits - 64 * (words - 1)
        if top < 64:
            w[-1] &= np.uint64((1 << top) - 1)
        return [w[i] for i in range(words)]

    @staticmethod
    def _mod_t(words: list[np.ndarray], t: int) -> np.ndarray:
        if t == 1 << 64:
            return words[0]
        if t < _SMALL:                 # the plaintext primes: float64 quotient estimates
            from .he_pow2 import words_mod as small_words_mod
            return small_words_mod(words, t)
        return words_mod(words, t)

    # -- elementwise ---------------------------------------------------------------------
    def elementwise(self, terms: list[np.ndarray], bound_bits: int, parity: bool = False) -> np.ndarray:
        """This party's share (uint64, mod 2^64) of Sum_j x0_j * x1_j (elementwise; x0 are rank
        0's `terms`, x1 rank 1's, all of one length n). `bound_bits`: public, with
        Sum_j x0_j * x1_j < 2^bound_bits for every element (read as unsigned integers).
        `parity`: only the shares' low bits will be used (XOR shares of X's parity).

        Rank 0 owns (encrypts, decrypts) the first half of the ciphertext blocks and rank 1
        the rest (with one block, rank 0 owns it): each party evaluates the other's half at
        the same time, so both parties' CPUs work (two_way)."""
        n = int(terms[0].size)
        nd = self.params.n
        chunks = -(-n // nd)
        count = self.params.primes_for(bound_bits, parity)
        primes = self._ready(count)
        if n == 0:
            return np.zeros(0, dtype=np.uint64)
        h = n if chunks < 2 else min(n, -(-chunks // 2) * nd)
        flat = [x.reshape(-1).astype(np.uint64, copy=False) for x in terms]
        mine = (0, h) if self.rank == 0 else (h, n)
        peer = (h, n) if self.rank == 0 else (0, h)
        own = (self._elementwise_own([x[mine[0]:mine[1]] for x in flat], primes)
               if mine[1] > mine[0] else None)
        ev, share = (self._elementwise_eval([x[peer[0]:peer[1]] for x in flat], bound_bits, parity)
                     if peer[1] > peer[0] else (None, None))
        res = self._two_way(primes, own, ev)
        out = np.empty(n, dtype=np.uint64)
        if own is not None:
            out[mine[0]:mine[1]] = crt_mod64(res, tuple(p.t for p in primes))
        if ev is not None:
            out[peer[0]:peer[1]] = share
        return out

    def _elementwise_own(self, terms: list[np.ndarray], primes: list) -> "_Own":
        """The owner's side of one elementwise exchange: batched encryptions of every term's
        blocks, then the returned slots (X + R mod t_i)."""
        n, nd = int(terms[0].size), self.params.n
        chunks = -(-n // nd)
        padded = [np.pad(x, (0, chunks * nd - n)).reshape(chunks, nd) for x in terms]
        return _Own(lambda i, p, rand: [self._encrypt(p, p.plain(row))
                                        for x in padded for row in residues(x, p.t)],
                    chunks, lambda i, p, back: np.concatenate(
                        [self._decrypt_slots(p, back[c]) for c in range(chunks)])[:n])

    def _elementwise_eval(self, terms: list[np.ndarray], bound_bits: int,
                          parity: bool) -> tuple["_Eval", np.ndarray]:
        """The evaluator's side: Sum_j ct_j * x_j + R per block, flooded; its share -R."""
        n, nd = int(terms[0].size), self.params.n
        chunks = -(-n // nd)
        padded = [np.pad(x, (0, chunks * nd - n)).reshape(chunks, nd) for x in terms]
        r = self._mask_words((chunks, nd), self.params.mask_bits(bound_bits, parity))

        def evaluate(i: int, p: _Prime, rand: Callable, got: list[bytes]) -> list[bytes]:
            ev = p.evaluator
            r_t = self._mod_t(r, p.t)
            bound = self.noise_bound(p.t, len(terms), nd)
            accs = [None] * chunks
            k = 0
            for x in padded:
                for c, row in enumerate(residues(x, p.t)):
                    ct = self._load_ct(p, got[k])
                    k += 1
                    if not row.any():
                        continue
                    pt = p.plain(row)          # products in NTT form: one inverse NTT per
                    ev.transform_to_ntt_inplace(pt, p.pid)      # block, with the zero
                    ev.transform_to_ntt_inplace(ct)             # encryption's (_flooded)
                    ev.multiply_plain_inplace(ct, pt)
                    if accs[c] is None:
                        accs[c] = ct
                    else:
                        ev.add_inplace(accs[c], ct)
            return [self._finish(p, accs[c], p.plain(r_t[c]), bound, rand, in_ntt=True)
                    for c in range(chunks)]
        with np.errstate(over="ignore"):
            share = (np.uint64(0) - r[0]).reshape(-1)[:n]
        return _Eval(len(terms) * chunks, evaluate), share

    # -- matrix products -----------------------------------------------------------------------
    def matmul(self, lhs: np.ndarray, rhs: np.ndarray, bound_bits: int) -> np.ndarray:
        """This party's share of lhs0 @ rhs1 + lhs1 @ rhs0 (uint64 [B, m, n]) for lhs
        [B, m, k], rhs [B, k, n] (rank 0's and rank 1's own), by coefficient encoding: both
        products in one set of ciphertexts (rank 0 owns them), or, where that costs less
        (split_products), as two one-sided products at once: each party owns the product of
        its own lhs with the peer's rhs and evaluates the peer's (both CPUs work)."""
        bsz, m, k = lhs.shape
        n = rhs.shape[2]
        if k > K_CHUNK:              # the noise limit: the sum of products of K_CHUNK-long pieces
            chunks = -(-k // K_CHUNK)
            step = -(-k // chunks)
            out = np.zeros((bsz, m, n), dtype=np.uint64)
            with np.errstate(over="ignore"):
                for k0 in range(0, k, step):
                    out += self.matmul(lhs[:, :, k0:k0 + step], rhs[:, k0:k0 + step], bound_bits)
            return out
        if split_products(m, k, n, self.params.n):
            if split_transposed(m, k, n, self.params.n):
                out = self._matmul_split(np.ascontiguousarray(rhs.transpose(0, 2, 1)),
                                        np.ascontiguousarray(lhs.transpose(0, 2, 1)), bound_bits)
                return out.transpose(0, 2, 1)
            return self._matmul_split(lhs, rhs, bound_bits)
        return self._joint(lhs, rhs, bound_bits)

    def _matmul_split(self, lhs: np.ndarray, rhs: np.ndarray, bound_bits: int) -> np.ndarray:
        """The split products as they are: this party owns (its lhs) @ (the peer's rhs) and
        evaluates the peer's lhs @ its rhs, both [B, m, k] x [B, k, n]."""
        bsz, m, k = lhs.shape
        n = rhs.shape[2]
        primes = self._mm_units()
        if bsz * m * n == 0:
            return np.zeros((bsz, m, n), dtype=np.uint64)
        dims = (bsz, m, k, n)
        own, finish = self._product_own(lhs, dims)
        ev, share = self._product_eval(rhs, dims, bound_bits - 1)
        mine = finish(self._two_way(primes, own, ev))
        with np.errstate(over="ignore"):
            return mine + share

    def _joint(self, lhs: np.ndarray, rhs: np.ndarray, bound_bits: int) -> np.ndarray:
        """lhs0 @ rhs1 + lhs1 @ rhs0 in one set of ciphertexts: rank 0 encrypts both of its
        operands, rank 1 multiplies each by its own other operand."""
        bsz, m, k = lhs.shape
        n = rhs.shape[2]
        nd = self.params.n
        mw, kw, nw = _blocks(m, k, n, nd)
        mb, kb, nb = -(-m // mw), -(-k // kw), -(-n // nw)
        primes = self._mm_units()
        if bsz * m * n == 0:
            return np.zeros((bsz, m, n), dtype=np.uint64)
        a = np.zeros((bsz, mb * mw, kb * kw), dtype=np.uint64)
        a[:, :m, :k] = lhs
        b = np.zeros((bsz, kb * kw, nb * nw), dtype=np.uint64)
        b[:, :k, :n] = rhs
        pos_a, pos_b, pos_out = _positions(mw, kw, nw)
        a_blk = a.reshape(bsz, mb, mw, kb, kw).transpose(0, 1, 3, 2, 4).reshape(bsz, mb, kb, mw * kw)
        b_blk = b.reshape(bsz, kb, kw, nb, nw).transpose(0, 1, 3, 2, 4).reshape(bsz, kb, nb, kw * nw)
        n_a, n_b, n_out = bsz * mb * kb, bsz * kb * nb, bsz * mb * nb
        if self.rank == 0:
            def encrypt(i: int, p: _Prime, rand: Callable) -> list[bytes]:
                out = []
                for arr, pos in ((a_blk, pos_a), (b_blk, pos_b)):
                    out.extend(encrypt_at(p, self._files, _polys(arr, pos, p.t, nd).reshape(-1, nd)))
                return out

            decrypt = self._block_decrypt((bsz, m, n), (mb, nb, mw, nw), pos_out)
            return self._two_way(primes, _Own(encrypt, n_out, decrypt), None)[0]
        r = self._mask_words((bsz, mb, nb, mw * nw), 64)
        where = pos_out.tolist()

        def evaluate(pi: int, p: _Prime, rand: Callable, got: list[bytes]) -> list[bytes]:
            cts_a = [self._load_ntt(p, got[j]) for j in range(n_a)]
            cts_b = [self._load_ntt(p, got[n_a + j]) for j in range(n_b)]
            pts_a = p.ntt_plains(self._files, _polys(a_blk, pos_a, p.t, nd).reshape(-1, nd))
            pts_b = p.ntt_plains(self._files, _polys(b_blk, pos_b, p.t, nd).reshape(-1, nd))
            bound = p.noise_bound(2 * kb, max(mw * kw, kw * nw))
            masks = self._block_masks(p, r, (bsz, mb, nb), pos_out, rand)
            out = []
            for bi in range(bsz):
                for mi in range(mb):
                    for nj in range(nb):
                        pairs = []
                        for kk in range(kb):
                            ia_ = (bi * mb + mi) * kb + kk
                            ib_ = (bi * kb + kk) * nb + nj
                            pairs += [(cts_a[ia_], pts_b[ib_]), (cts_b[ib_], pts_a[ia_])]
                        acc = _dot(p, pairs)
                        out.append(finish_at(p, self._files, acc, masks[(bi * mb + mi) * nb + nj], bound, rand,
                                             where))
            return out
        self._two_way(primes, None, _Eval(n_a + n_b, evaluate))
        return _unblock(r, (bsz, m, n), (mb, nb, mw, nw))

    def _product_own(self, mine: np.ndarray, dims: tuple) -> tuple["_Own", Callable]:
        """This party's side of E @ P as the owner of E [B, m, k] (sent encrypted): the job
        and the finishing step (its share, from the decrypted residues)."""
        bsz, m, k, n = dims
        nd = self.params.n
        _, mw, kw, nw = _blocks_cost(m, k, n, nd, joint=False)
        mb, kb, nb = -(-m // mw), -(-k // kw), -(-n // nw)
        pos_a, _, pos_out = _positions(mw, kw, nw)
        a = np.zeros((bsz, mb * mw, kb * kw), dtype=np.uint64)
        a[:, :m, :k] = mine
        a_blk = a.reshape(bsz, mb, mw, kb, kw).transpose(0, 1, 3, 2, 4).reshape(bsz, mb, kb, mw * kw)

        def encrypt(i: int, p, rand: Callable) -> list[bytes]:
            return encrypt_at(p, self._files, _polys(a_blk, pos_a, p.t, nd).reshape(-1, nd))
        decrypt = self._block_decrypt((bsz, m, n), (mb, nb, mw, nw), pos_out)
        return _Own(encrypt, bsz * mb * nb, decrypt), lambda res: res[0]

    def _product_eval(self, mine: np.ndarray, dims: tuple, bound_bits: int) -> tuple["_Eval", np.ndarray]:
        """This party's side of E @ P as the evaluator, P [B, k, n] its plaintext: the job
        and its share (-R)."""
        bsz, m, k, n = dims
        nd = self.params.n
        _, mw, kw, nw = _blocks_cost(m, k, n, nd, joint=False)
        mb, kb, nb = -(-m // mw), -(-k // kw), -(-n // nw)
        _, pos_b, pos_out = _positions(mw, kw, nw)
        b = np.zeros((bsz, kb * kw, nb * nw), dtype=np.uint64)
        b[:, :k, :n] = mine
        b_blk = b.reshape(bsz, kb, kw, nb, nw).transpose(0, 1, 3, 2, 4).reshape(bsz, kb, nb, kw * nw)
        r = self._mask_words((bsz, mb, nb, mw * nw), 64)
        n_a = bsz * mb * kb
        where = pos_out.tolist()

        def evaluate(pi: int, p, rand: Callable, got: list[bytes]) -> list[bytes]:
            cts = [self._load_ntt(p, got[j]) for j in range(n_a)]
            pts = p.ntt_plains(self._files, _polys(b_blk, pos_b, p.t, nd).reshape(-1, nd))
            bound = p.noise_bound(kb, kw * nw)
            masks = self._block_masks(p, r, (bsz, mb, nb), pos_out, rand)
            out = []
            for bi in range(bsz):
                for mi in range(mb):
                    for nj in range(nb):
                        acc = _dot(p, [(cts[(bi * mb + mi) * kb + kk], pts[(bi * kb + kk) * nb + nj])
                                       for kk in range(kb)])
                        out.append(finish_at(p, self._files, acc, masks[(bi * mb + mi) * nb + nj], bound, rand,
                                             where))
            return out
        return _Eval(n_a, evaluate), _unblock(r, (bsz, m, n), (mb, nb, mw, nw))

    def _load_ntt(self, p: _Prime, data: bytes):
        """A ciphertext from the peer (encrypt_at's: NTT form already on the Z_2^64 engine,
        he_upload.py), NTT form."""
        if hasattr(p, "load_ntt"):
            return p.load_ntt(self._files, data)
        ct = self._load_ct(p, data)
        p.evaluator.transform_to_ntt_inplace(ct)
        return ct

    def _block_masks(self, p: _Prime, r: list[np.ndarray], blocks: tuple, pos_out: np.ndarray,
                     rand: Callable) -> np.ndarray:
        """Per output block: uniform mod t everywhere, R mod t at the output coefficients."""
        masks = self._uniform(p.t, tuple(blocks) + (self.params.n,), rand)
        masks[..., pos_out] = self._mod_t(r, p.t)
        return masks.reshape(-1, self.params.n)

    def _block_decrypt(self, shape: tuple, blocks: tuple, pos_out: np.ndarray) -> Callable:
        """decrypt(i, p, back): the output coefficients of every returned block, as [B, m, n]."""
        bsz, m, n = shape
        mb, nb, mw, nw = blocks
        where = pos_out.tolist()

        def decrypt(i: int, p: _Prime, back: list[bytes]) -> np.ndarray:
            coeffs = np.stack([open_at(p, self._files, back[j], where) for j in range(bsz * mb * nb)])
            blk = coeffs.reshape(bsz, mb, nb, mw, nw).transpose(0, 1, 3, 2, 4)
            return blk.reshape(bsz, mb * mw, nb * nw)[:, :m, :n]
        return decrypt

    def _prime_rands(self, primes: list) -> list[Callable]:
        """One PRG per prime's job, keyed here from this party's private stream in prime
        order, so no draw is ever shared."""
        rands = []
        for _ in primes:
            prg = PRG(self._rand((4,)).tobytes())
            rands.append(lambda shape, prg=prg: prg.draw(tuple(shape)).numpy().view(np.uint64))
        return rands

    def _run(self, job: Callable, *args):
        """job(*args) on the pool (a future) or now (a finished future's stand-in)."""
        if self._pool is not None:
            return self._pool.submit(job, *args)
        return _Done(job(*args))

    def _two_way(self, primes: list, own: "_Own | None", ev: "_Eval | None") -> list | None:
        """One exchange, per prime one message each way per role, in an order both parties
        follow: (1) if this party owns a product, its ciphertexts, each prime's sent as soon
        as it is made (the peer starts on prime 0 while the others are encrypted); (2) if it
        evaluates the peer's, each prime's evaluated on the pool as it arrives, the results
        sent back in prime order; (3) if it owns, each prime's results decrypted as they
        come back. The peer's `ev` is present exactly when this party's `own` is. With both
        roles on both parties, each party's CPU works on its own product and the peer's at
        the same time (TenSEAL's bindings hold the GIL inside each SEAL call, so one process
        uses about one core: the two processes are what fill two)."""
        made = []
        if own is not None:
            rands = self._prime_rands(primes)
            made = [self._run(own.encrypt, i, p, rands[i]) for i, p in enumerate(primes)]
            for f in made:
                self._send(pack(f.result()))
        if ev is not None:
            rands = self._prime_rands(primes)
            jobs = [self._run(ev.evaluate, i, p, rands[i], unpack(self._recv(), ev.per_got, "ciphertexts"))
                    for i, p in enumerate(primes)]
            for f in jobs:
                self._send(pack(f.result()))
        if own is None:
            return None
        opened = [self._run(own.decrypt, i, p, unpack(self._recv(), own.per_back, "result ciphertexts"))
                  for i, p in enumerate(primes)]
        return [f.result() for f in opened]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        self._files.close()


@dataclass
class _Own:
    """A product this party owns: encrypt(i, p, rand) -> ciphertexts of prime i; per_back
    returned ciphertexts per prime; decrypt(i, p, back) -> residues mod t_i."""

    encrypt: Callable
    per_back: int
    decrypt: Callable


@dataclass
class _Eval:
    """A product the peer owns: per_got ciphertexts per prime; evaluate(i, p, rand, got) ->
    the returned ciphertexts of prime i."""

    per_got: int
    evaluate: Callable


def _positions(mw: int, kw: int, nw: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Coefficient positions of the encoding: A block (i, c) -> i*kw*nw + c; B block (c, j)
    -> j*kw + kw-1-c; output (i, j) at i*kw*nw + j*kw + kw-1."""
    ia, ca = np.meshgrid(np.arange(mw), np.arange(kw), indexing="ij")
    cb, jb = np.meshgrid(np.arange(kw), np.arange(nw), indexing="ij")
    io, jo = np.meshgrid(np.arange(mw), np.arange(nw), indexing="ij")
    return ((ia * kw * nw + ca).reshape(-1), (jb * kw + kw - 1 - cb).reshape(-1),
            (io * kw * nw + jo * kw + kw - 1).reshape(-1))


def _polys(blocks: np.ndarray, pos: np.ndarray, t: int, nd: int) -> np.ndarray:
    """Coefficient rows (mod t) with each block's values at `pos`."""
    out = np.zeros(blocks.shape[:-1] + (nd,), dtype=np.uint64)
    out[..., pos] = residues(blocks, t)
    return out


def _dot(p: "_Prime", pairs: list):
    """Sum of ciphertext x plaintext products (NTT form); None if every plaintext is zero."""
    acc = None
    for ct, pt in pairs:
        if pt is None:
            continue
        prod = _sealapi().Ciphertext()
        p.evaluator.multiply_plain(ct, pt, prod)
        if acc is None:
            acc = prod
        else:
            p.evaluator.add_inplace(acc, prod)
    return acc


def _unblock(r: list[np.ndarray], shape: tuple, blocks: tuple) -> np.ndarray:
    """The evaluator's share -R, from output blocks back to [B, m, n]."""
    bsz, m, n = shape
    mb, nb, mw, nw = blocks
    with np.errstate(over="ignore"):
        share = np.uint64(0) - r[0]
    blk = share.reshape(bsz, mb, nb, mw, nw).transpose(0, 1, 3, 2, 4)
    return blk.reshape(bsz, mb * mw, nb * nw)[:, :m, :n]


class _Done:
    """A finished job's result, shaped like a future (no pool: one thread)."""

    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value
