"""Cryptographic randomness: AES-256-CTR PRG, X25519 seed agreement, zero-sharing.

Every share and mask in crypten_lite comes from :class:`PRG` (AES-CTR from `cryptography`),
never from torch's generators, the Python random module or numpy's generators.

Stream separation: a PRG is keyed by a 32-byte seed; each draw names a 12-byte nonce made
of a 4-byte domain tag and an 8-byte counter, and AES-CTR runs the remaining 4 bytes as the
block counter (up to 64 GiB per draw). Parties that share a seed and draw in the same order
obtain the same values, which is how pairwise zero-sharings and dealer-derived shares work.

Key separation: a seed agreed between two endpoints serves several purposes (zero-sharing,
stream opening tokens, correlated randomness, dealer request MACs); each gets its own key
`subkey(seed, purpose)` (HKDF-SHA256 with the purpose in `info`), so no two purposes ever
use the same key. Correlated value number k is drawn under its own AES key
`correlation_key(key, k, kind, op, shapes, params)` (HMAC-SHA256 over an unambiguous
encoding of the request): two different requests never share a stream, and a smaller draw
is not a prefix of a larger one.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import struct
import threading
from typing import Callable, Sequence

import torch
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

SEED_BYTES = 32


def fresh_seed() -> bytes:
    """A new uniformly random 32-byte seed from the operating system's CSPRNG."""
    return os.urandom(SEED_BYTES)


def random_bytes(seed: bytes, nonce: bytes, n: int) -> bytes:
    """`n` pseudo-random bytes: AES-256-CTR keystream under `seed` starting at block `nonce`."""
    if len(nonce) != 12:
        raise ValueError("nonce must be 12 bytes")
    encryptor = Cipher(algorithms.AES(seed), modes.CTR(nonce + b"\x00" * 4)).encryptor()
    return encryptor.update(bytes(n)) + encryptor.finalize()


def ring_from_bytes(data: bytes | bytearray, shape: tuple[int, ...]) -> torch.Tensor:
    """Interpret little-endian bytes as an int64 tensor of `shape` (one copy)."""
    numel = 1
    for s in shape:
        numel *= s
    if numel == 0:
        return torch.zeros(shape, dtype=torch.int64)
    return torch.frombuffer(bytearray(data), dtype=torch.int64, count=numel).view(shape)


# Plaintext of the keystream (zeros), shared by every draw of up to this many bytes.
_ZEROS_MAX = 1 << 26
_zeros = bytes(0)


_AES, _CTR = algorithms.AES, modes.CTR  # looked up once (the modules' attribute hooks are slow)


def _zero_plain(n: int):
    """n zero bytes to encrypt (the keystream's plaintext): a view of one shared buffer up to
    _ZEROS_MAX bytes, grown by doubling; a fresh bytes object beyond."""
    global _zeros
    if n > _ZEROS_MAX:
        return bytes(n)
    if len(_zeros) < n:
        _zeros = bytes(max(n, min(2 * len(_zeros), _ZEROS_MAX)))
    return memoryview(_zeros)[:n]


def _stream_tensor(update_into: Callable, numel: int) -> torch.Tensor:
    """A 1-D int64 tensor of numel words of keystream, written by `update_into(plain, out)`
    (an AES-CTR context's) straight into the tensor's memory: no bytes object, no copy."""
    n = 8 * numel
    out = torch.empty(numel + 2, dtype=torch.int64)  # update_into needs 15 spare bytes
    written = update_into(_zero_plain(n), memoryview(out.numpy()).cast("B"))
    if written != n:
        raise RuntimeError(f"AES-CTR wrote {written} bytes, expected {n}")
    return out.resize_(numel)


def keystream_ring(seed: "bytes | algorithms.AES | _CtrContext", nonce: bytes, shape: tuple[int, ...], numel: int) -> torch.Tensor:
    """int64 tensor of `shape` holding the AES-256-CTR keystream under `seed` from block
    `nonce` (the bytes random_bytes returns), written by the cipher straight into the
    tensor's memory: no intermediate bytes object, no copy."""
    if numel == 0:
        return torch.zeros(shape, dtype=torch.int64)
    if isinstance(seed, _CtrContext):
        return _stream_tensor(lambda plain, buf: seed.keystream_into(nonce, plain, buf), numel).view(shape)
    algorithm = seed if isinstance(seed, _AES) else _AES(seed)
    encryptor = Cipher(algorithm, _CTR(nonce + b"\x00" * 4)).encryptor()
    out = _stream_tensor(encryptor.update_into, numel)
    encryptor.finalize()
    return out.view(shape)


class _CtrContext:
    """One AES-256-CTR context of a key, moved to each draw's starting block by
    `reset_nonce` (cryptography's API for a key used at non-sequential nonces): the same
    keystream as a fresh context per draw, without building one (Cipher + encryptor cost
    ~10 us, more than the keystream of a small draw). A lock makes reset + update atomic."""

    __slots__ = ("_ctx", "_lock")

    def __init__(self, key: bytes):
        self._ctx = Cipher(_AES(key), _CTR(bytes(16))).encryptor()
        self._lock = threading.Lock()

    def keystream_into(self, nonce: bytes, plain, buf) -> int:
        with self._lock:
            self._ctx.reset_nonce(nonce + b"\x00" * 4)
            return self._ctx.update_into(plain, buf)


# keystream_parts: parts totalling at most this many bytes share one tensor (views of it);
# larger ones get a tensor each (a part kept longer than the others keeps only its own memory).
JOINT_PARTS_BYTES = 1 << 20


def keystream_parts(key: bytes, shapes: Sequence[tuple[int, ...]]) -> list[torch.Tensor]:
    """int64 tensors of `shapes` holding, in order, consecutive parts of ONE AES-256-CTR
    keystream under `key` (from the all-zero counter block, where PRG(key)'s draw at domain 0,
    counter 0 starts: the first part equals that draw). One cipher context and, for parts of
    at most JOINT_PARTS_BYTES in all, one tensor: a request's components (a masked polynomial's
    dozens of small ones) cost one keystream call, not a context and an allocation each."""
    numels = []
    for shape in shapes:
        numel = 1
        for d in shape:
            numel *= int(d)
        numels.append(numel)
    total = sum(numels)
    if total == 0:
        return [torch.zeros(tuple(shape), dtype=torch.int64) for shape in shapes]
    fill = Cipher(_AES(key), _CTR(bytes(16))).encryptor().update_into
    if 8 * total <= JOINT_PARTS_BYTES:
        buf = _stream_tensor(fill, total)
        # a 1-D part is already of its shape: no view (a view costs about a microsecond, and a
        # masked polynomial's request has dozens of parts)
        return [part if len(shape) == 1 else part.view(tuple(shape))
                for part, shape in zip(buf.split_with_sizes(numels), shapes)]
    # one tensor per part, in order: the stream goes on from one part to the next
    return [_stream_tensor(fill, numel).view(tuple(shape)) if numel else
            torch.zeros(tuple(shape), dtype=torch.int64) for shape, numel in zip(shapes, numels)]


class PRG:
    """A seeded stream of uniform ring elements; draws are separated by (domain, counter).

    The counter advances on every draw, so two parties holding the same seed and drawing the
    same shapes in the same order obtain identical tensors.
    """

    def __init__(self, seed: bytes, domain: int = 0):
        if len(seed) != SEED_BYTES:
            raise ValueError(f"seed must be {SEED_BYTES} bytes")
        self._seed = seed
        self._domain = domain
        self.counter = 0
        self._algorithm = None  # the AES-CTR context of the seed, made at the first draw

    def __repr__(self) -> str:  # never show the seed
        return f"PRG(domain={self._domain}, counter={self.counter})"

    def draw(self, shape: tuple[int, ...] | torch.Size, counter: int | None = None,
             domain: int | None = None) -> torch.Tensor:
        """Uniform int64 tensor of `shape`.

        Without `counter`, uses and advances the internal counter; with it, draws the stream
        (domain, counter) without touching the internal state (dealer-derived values).
        """
        if counter is None:
            counter = self.counter
            self.counter += 1
        shape = tuple(shape)
        numel = 1
        for s in shape:
            numel *= s
        nonce = struct.pack("<IQ", self._domain if domain is None else domain, counter)
        if self._algorithm is None:
            self._algorithm = _CtrContext(self._seed)
        return keystream_ring(self._algorithm, nonce, shape, numel)


class BufferedPRG(PRG):
    """A PRG whose small draws are cut from a keystream block drawn ahead.

    Each draw of PRG makes an AES context and a nonce: for the many small draws of a
    protocol's rounds (pairwise masks of a few words) that costs more than the keystream.
    Here a draw of at most SMALL elements takes the next elements of a block of BLOCK
    elements, itself an ordinary draw (its own counter: a fresh stream, never reused); larger
    draws and draws at an explicit counter are ordinary draws. Two parties that share a seed
    and draw the same shapes in the same order still obtain identical tensors, since both
    apply the same rule; every keystream element is handed out once.
    """

    SMALL = 4096
    BLOCK = 1 << 15

    def __init__(self, seed: bytes, domain: int = 0):
        super().__init__(seed, domain)
        self._block: torch.Tensor | None = None
        self._used = 0

    def draw(self, shape: tuple[int, ...] | torch.Size, counter: int | None = None,
             domain: int | None = None) -> torch.Tensor:
        shape = tuple(shape)
        numel = 1
        for d in shape:
            numel *= d
        if counter is not None or domain is not None or numel > self.SMALL:
            return super().draw(shape, counter, domain)
        if self._block is None or self._used + numel > self._block.numel():
            self._block = super().draw((self.BLOCK,))
            self._used = 0
        out = self._block[self._used:self._used + numel].clone().view(shape)
        self._used += numel
        return out


def derive_key(secret: bytes, info: str) -> bytes:
    """HKDF-SHA256 of a shared secret into a 32-byte seed bound to `info`."""
    return HKDF(algorithm=hashes.SHA256(), length=SEED_BYTES, salt=None,
                info=info.encode()).derive(secret)


# Every purpose a seed serves; subkey() refuses any other name (a typo must not silently
# collide with, or differ from, the other endpoint's key).
PURPOSES = frozenset({"przs", "stream-token", "correlations", "dealer-request-mac",
                      # replicated sharing (3 parties): zero-sharings of reshares, input
                      # sharing, and the randomness of dealer-free correlated values
                      "rss-zero", "rss-share", "rss-rand", "rss-trunc"})


def subkey(seed: bytes, purpose: str) -> bytes:
    """The 32-byte key of `seed` for one `purpose` (HKDF-SHA256; one key per purpose)."""
    if purpose not in PURPOSES:
        raise ValueError(f"unknown key purpose {purpose!r}; known: {sorted(PURPOSES)}")
    if len(seed) != SEED_BYTES:
        raise ValueError(f"seed must be {SEED_BYTES} bytes")
    return derive_key(seed, f"crypten_lite/v1/subkey/{purpose}")


def canonical(*fields: str | int | Sequence) -> bytes:
    """An unambiguous (prefix-free) byte encoding of strings, integers and nested sequences.

    Each value is tagged with its type and length, so two different field lists never encode
    to the same bytes (the input of the KDF and of the dealer's request MAC).
    """
    out = bytearray()

    def put(value) -> None:
        if isinstance(value, str):
            data = value.encode()
            out.extend(b"s" + struct.pack("<I", len(data)) + data)
        elif isinstance(value, int):
            out.extend(b"i" + int(value).to_bytes(9, "little", signed=True))
        else:
            items = list(value)
            out.extend(b"t" + struct.pack("<I", len(items)))
            for item in items:
                put(item)

    put(fields)
    return bytes(out)


def request_encoding(counter: int, kind: str, op: str, shapes, params) -> bytes:
    """The canonical encoding of one correlation request (what its randomness is bound to):
    canonical("correlation/v1", counter, kind, op, shapes, params), made as the encoding's
    fixed head, the counter's and the cached encoding of the rest (the same bytes: a plan
    repeats a few request shapes, and canonical() costs microseconds per integer)."""
    shapes = tuple(tuple(int(s) for s in shape) for shape in shapes)
    params = tuple(int(p) for p in params)
    return _REQUEST_HEAD + b"i" + int(counter).to_bytes(9, "little", signed=True) + \
        _request_tail(str(kind), str(op), shapes, params)


# canonical()'s bytes of a 6-field tuple and of its first field, "correlation/v1"
_REQUEST_HEAD = canonical("correlation/v1", 0, "", "", (), ())[:5 + 5 + len("correlation/v1")]


@functools.lru_cache(maxsize=4096)
def _request_tail(kind: str, op: str, shapes: tuple, params: tuple) -> bytes:
    """canonical()'s encoding of a request's last four fields, as they follow its counter."""
    whole = canonical("correlation/v1", 0, kind, op, shapes, params)
    return whole[len(_REQUEST_HEAD) + 10:]


def correlation_key(key: bytes, counter: int, kind: str, op: str, shapes, params) -> bytes:
    """The AES key of request `counter` for the holder of correlation key `key`.

    `key` is `subkey(seed, "correlations")`; HMAC-SHA256 is the PRF binding the key to the
    whole request (counter, kind, op, shapes, params).
    """
    return hmac.new(key, request_encoding(counter, kind, op, shapes, params), hashlib.sha256).digest()


class KeyPair:
    """Ephemeral X25519 key pair of one endpoint for one session."""

    def __init__(self) -> None:
        self._private = X25519PrivateKey.generate()
        self.public_bytes = self._private.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def __repr__(self) -> str:
        return "KeyPair(X25519)"

    def shared_seed(self, peer_public: bytes, info: str) -> bytes:
        """Seed agreed with the peer owning `peer_public` (X25519 + HKDF, bound to `info`)."""
        if len(peer_public) != 32:
            raise ValueError("peer public key must be 32 bytes")
        secret = self._private.exchange(X25519PublicKey.from_public_bytes(peer_public))
        return derive_key(secret, info)


def pair_info(session: str, a: int | str, b: int | str) -> str:
    """HKDF info string for the seed between endpoints `a` and `b` (order-independent)."""
    lo, hi = sorted((str(a), str(b)))
    return f"crypten_lite/v1/{session}/{lo}-{hi}"


def zero_share(pair_prgs: dict[int, PRG], rank: int, shape: tuple[int, ...]) -> torch.Tensor:
    """This party's share of a pseudo-random zero-sharing (PRZS).

    For every pair i < j, both draw r_ij from their common seed; i adds it and j subtracts it,
    so the shares of all parties sum to zero while each share alone is uniform.
    """
    share = torch.zeros(tuple(shape), dtype=torch.int64)
    for peer in sorted(pair_prgs):
        r = pair_prgs[peer].draw(shape)
        if rank < peer:
            share += r
        else:
            share -= r
    return share


def digest(data: bytes) -> str:
    """Short SHA-256 digest for logs (safe to print: reveals nothing useful about `data`)."""
    return hashlib.sha256(data).hexdigest()[:12]
