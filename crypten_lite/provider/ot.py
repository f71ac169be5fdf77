"""Oblivious transfer for the pairwise provider: base OTs on Ed25519 and IKNP extension.

Every binary correlation of provider ``pairwise`` (AND triples, the bits of truncation pairs,
bit injection / B2A) is a product of one party's *bit* c with the other party's value x. A
correlated OT computes it: the party holding c (the OT *receiver*) gets s + c*x, the other
(the OT *sender*) keeps -s, for s uniform (mod 2^64, or mod 2 for XOR shares).

Construction (semi-honest, either party corrupt):

* **Base OTs**: 128 per direction, Chou-Orlandi "simplest OT" in the prime-order subgroup of
  Ed25519 through libsodium (PyNaCl's ``crypto_core_ed25519_*`` / ``crypto_scalarmult_ed25519_*``
  bindings). `cryptography`'s X25519 exposes only Diffie-Hellman, not the point addition and
  subtraction the base OT needs (B = bG + cA; k1 = H(a(B - A))), so the group operations come
  from libsodium, a maintained native library. Every received point is checked to be a valid
  prime-order point; keys are SHA-256 of the transcript (direction, index, A, B, shared point).
* **Extension**: IKNP. The base-OT seeds are expanded with AES-256-CTR (crypten_lite.random's
  keystream), the 128 x m bit matrix is transposed 8x8 bit block by block on uint64 words, and the
  correlation-robust hash is fixed-key AES in the tweakable MMO form of Guo et al.
  (H(j, x) = pi(pi(x) xor j) xor pi(x), pi = AES-128 under a public key, one ECB call over all
  blocks). All of it is vectorized over the m OTs: no per-element Python loop.

The extension sender's secret Delta (its base-OT choice bits), the receiver's choice bits and
every base-OT seed stay in their owner's process; the wire carries only the points A, B, the
matrix U = G(k0) xor G(k1) xor c (one-time padded by the PRG) and the corrections
y = H(q) + x - H(q xor Delta), uniform by the hash's correlation robustness.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Callable

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from .. import _native
from ..errors import ConfigError, ProtocolError

KAPPA = 128                      # base OTs per direction (computational security parameter)
CHUNK = 1 << 19                  # default OTs per extension (bounds memory: 128 x CHUNK bits)
MODES = ("ferret", "iknp")       # ferret: silent COTs (provider/ferret.py) for large extensions
SILENT_MIN = 1 << 15             # mode ferret: extensions of at least this many OTs are silent
_FIXED_KEY = hashlib.sha256(b"crypten_lite/v1/ot-tccr-fixed-key").digest()[:16]  # public
_POINT = 32


def _sodium():
    try:
        from nacl import bindings
    except ImportError as e:  # pragma: no cover - depends on the installation
        raise ConfigError("provider 'pairwise' needs PyNaCl (libsodium's Ed25519 group "
                          "operations for the base OTs): pip install 'crypten_lite[pairwise]'") from e
    if not bindings.has_crypto_core_ed25519:  # pragma: no cover - a minimal libsodium build
        raise ConfigError("provider 'pairwise': this PyNaCl's libsodium lacks crypto_core_ed25519; "
                          "install PyNaCl's wheel (pip install --force-reinstall pynacl)")
    return bindings


def _kdf(label: bytes, i: int, a: bytes, b: bytes, shared: bytes) -> bytes:
    return hashlib.sha256(label + struct.pack("<Q", i) + a + b + shared).digest()


def _scalar(rand: Callable[[int], bytes]) -> bytes:
    return _sodium().crypto_core_ed25519_scalar_reduce(rand(64))


def _points(data: bytes, count: int, what: str) -> list[bytes]:
    s = _sodium()
    if len(data) != count * _POINT:
        raise ProtocolError(f"pairwise OT: expected {count} points for {what}, got {len(data)} bytes")
    pts = [data[i * _POINT:(i + 1) * _POINT] for i in range(count)]
    for p in pts:
        if not s.crypto_core_ed25519_is_valid_point(p):
            raise ProtocolError(f"pairwise OT: {what} holds a point outside Ed25519's prime-order group")
    return pts


def base_send(count: int, label: bytes, send: Callable[[bytes], None], recv: Callable[[], bytes],
              rand: Callable[[int], bytes]) -> list[tuple[bytes, bytes]]:
    """Base-OT sender: `count` pairs of random 32-byte keys; the receiver learns one of each."""
    s = _sodium()
    a = _scalar(rand)
    big_a = s.crypto_scalarmult_ed25519_base_noclamp(a)
    send(big_a)
    bs = _points(recv(), count, "the base-OT receiver's message")
    a_a = s.crypto_scalarmult_ed25519_noclamp(a, big_a)
    out = []
    for i, b in enumerate(bs):
        a_b = s.crypto_scalarmult_ed25519_noclamp(a, b)
        out.append((_kdf(label, i, big_a, b, a_b),
                    _kdf(label, i, big_a, b, s.crypto_core_ed25519_sub(a_b, a_a))))
    return out


def base_receive(choices: list[int], label: bytes, send: Callable[[bytes], None],
                 recv: Callable[[], bytes], rand: Callable[[int], bytes]) -> list[bytes]:
    """Base-OT receiver: the key chosen by each bit of `choices` (which never leave)."""
    s = _sodium()
    (big_a,) = _points(recv(), 1, "the base-OT sender's message")
    out_b, keys = [], []
    for i, c in enumerate(choices):
        b = _scalar(rand)
        bg = s.crypto_scalarmult_ed25519_base_noclamp(b)
        both = (bg, s.crypto_core_ed25519_add(bg, big_a))
        point = both[c & 1]
        out_b.append(point)
        keys.append(_kdf(label, i, big_a, point, s.crypto_scalarmult_ed25519_noclamp(b, big_a)))
    send(b"".join(out_b))
    return keys


_M1, _M2, _M3 = (np.uint64(0x00AA00AA00AA00AA), np.uint64(0x0000CCCC0000CCCC),
                 np.uint64(0x00000000F0F0F0F0))


_TILE = 4096   # transpose: byte columns per tile


def transpose(rows: np.ndarray, cols: int | None = None) -> np.ndarray:
    """[128, m/8] bytes (row i = bit i of every OT) -> [m, 16] bytes (row j = OT j's 128 bits);
    in general [k, nb] -> [8 nb, k/8]. With `cols`, only the first `cols` bytes of each row
    (rows then C-contiguous): natively (crypten_lite/_native) without a copy of the columns."""
    kern = _native.kernels()
    if kern is not None:
        rows = np.ascontiguousarray(rows, dtype=np.uint8)
        k, stride = rows.shape
        nb = stride if cols is None else cols
        out = np.empty((8 * nb, k // 8), dtype=np.uint8)
        kern.transpose(rows, k, nb, stride, out)
        return out
    if cols is not None:
        rows = np.ascontiguousarray(rows[:, :cols])
    return _transpose(rows)


def _transpose(rows: np.ndarray) -> np.ndarray:
    """[128, m/8] bytes (row i = bit i of every OT) -> [m, 16] bytes (row j = OT j's 128 bits).

    Each 8x8 bit block is one uint64 (byte a = row 8I + a, bit b = column 8J + b), transposed
    in place by three masked delta swaps (Hacker's Delight 7-3), all blocks at once; the
    blocks themselves move by two byte-level numpy transposes, TILE columns at a time (the
    tiles stay in cache: about twice as fast as one pass over a long matrix)."""
    k, nb = rows.shape
    if nb > _TILE:
        out = np.empty((nb * 8, k // 8), dtype=np.uint8)
        for s in range(0, nb, _TILE):
            out[s * 8:min(nb, s + _TILE) * 8] = _transpose(rows[:, s:s + _TILE])
        return out
    x = np.ascontiguousarray(rows.reshape(k // 8, 8, nb).transpose(0, 2, 1))
    x = x.view(np.uint64).reshape(k // 8, nb)
    for shift, mask in ((7, _M1), (14, _M2), (28, _M3)):
        t = (x ^ (x >> np.uint64(shift))) & mask
        x = x ^ t ^ (t << np.uint64(shift))
    out = x.view(np.uint8).reshape(k // 8, nb, 8).transpose(1, 2, 0)
    return np.ascontiguousarray(out).reshape(nb * 8, k // 8)


class _Hash:
    """Tweakable correlation-robust hash from fixed-key AES: pi(pi(x) ^ j) ^ pi(x)."""

    BLOCK = 1 << 15     # rows hashed at once: scratch reused (no fresh pages) and in cache

    def __init__(self):
        self._pi = Cipher(algorithms.AES(_FIXED_KEY), modes.ECB()).encryptor()
        self._scratch: np.ndarray | None = None
        self._iota = np.arange(self.BLOCK, dtype=np.uint64)
        self._native = _native.aes()      # AES-NI kernel (crypten_lite/_native), or None

    def __call__(self, blocks: np.ndarray, first: int, domain: int,
                 out: np.ndarray | None = None, xor: np.ndarray | None = None) -> np.ndarray:
        """blocks [m, 16] uint8 -> [m, 2] uint64 (written into `out` if given), tweak
        j = (first + row, domain); with `xor` ([16] uint8) the hash of blocks ^ xor, XORed in
        block by block in cache (no pass over the input, which is left as it is)."""
        m = blocks.shape[0]
        if out is None:
            out = np.empty((m, 2), dtype=np.uint64)
        if m == 0:
            return out
        if self._native is not None:            # the same bytes, natively, without the GIL
            target = out if out.flags.c_contiguous else np.empty((m, 2), dtype=np.uint64)
            self._native.tccr(_FIXED_KEY, np.ascontiguousarray(blocks), target, int(first),
                              int(domain), None if xor is None else
                              np.ascontiguousarray(xor, dtype=np.uint8))
            if target is not out:
                out[...] = target
            return out
        if self._scratch is None:
            self._scratch = np.empty(3 * 16 * self.BLOCK + 16, dtype=np.uint8)
        src = np.ascontiguousarray(blocks).view(np.uint8).reshape(-1)
        n = 16 * self.BLOCK
        buf = self._scratch
        y_all, tw_all, z_all = (buf[i * n:(i + 1) * n].view(np.uint64).reshape(-1, 2) for i in range(3))
        tweak = np.empty((min(m, self.BLOCK), 2), dtype=np.uint64)   # j: (first + row, domain)
        tweak[:, 1] = np.uint64(domain)
        mask = None     # xor tiled to whole rows: an XOR of equal shapes runs numpy's long
        if xor is not None:   # vector loop, a broadcast [2] one 2-long loop per row (1.5x CPU)
            mask = np.tile(np.ascontiguousarray(xor, dtype=np.uint8).view(np.uint64),
                           (min(m, self.BLOCK), 1))
        for s in range(0, m, self.BLOCK):
            c = min(self.BLOCK, m - s)
            x = src[16 * s:16 * (s + c)]
            if mask is not None:                  # blocks ^ xor, in the z scratch (free here)
                np.bitwise_xor(x.view(np.uint64).reshape(c, 2), mask[:c], out=z_all[:c])
                x = buf[2 * n:2 * n + 16 * c]
            # AES straight between numpy buffers (update_into: no bytes copies; ECB keeps no
            # state between calls, and its output buffer needs one block of room)
            self._pi.update_into(x, buf[:16 * c + 16])
            y, tw, z = y_all[:c], tw_all[:c], z_all[:c]
            np.add(self._iota[:c], np.uint64(first + s), out=tweak[:c, 0])
            np.bitwise_xor(y, tweak[:c], out=tw)      # one XOR of equal shapes, not 2 strided
            self._pi.update_into(buf[n:n + 16 * c], buf[2 * n:2 * n + 16 * c + 16])
            np.bitwise_xor(z, y, out=out[s:s + c])
        return out


class OTKeys:
    """Random-OT keys of m OTs made once and used for many transfers: the chooser holds
    K_c (c its bits, never sent), the other party K_0 and K_1 (128 bits each per OT).
    Each transfer derives fresh pads from the keys under a new tweak, so one OT per bit
    serves every product of that bit with any number of the other party's values."""

    def __init__(self, chooser: int, m: int, keys: tuple, choice: np.ndarray | None):
        self.chooser, self.m, self.keys, self.choice = chooser, m, keys, choice
        self.uses = 0
        # after CorrelatedOT.prepare: packed pad rows [bits, m/8] (chooser: (pad, choice
        # bits packed); other: (pad0, pad0 ^ pad1)), the rows used so far and the rows made
        self.rows: tuple | None = None
        self.offset = self.bits = 0


class _Pads:
    """Pads from OT keys: fixed-key AES in the same tweakable MMO form, under a tweak
    (use, OT index) that no other pad or IKNP hash shares (domain bit 63 set)."""

    def __init__(self):
        self._hash = _Hash()

    def __call__(self, keys: np.ndarray, use: int, bits: int) -> np.ndarray:
        """[m, 2] uint64 keys -> [bits, m] uint8 pad bits (bits <= 128 per block)."""
        out = []
        for block in range(-(-bits // 128)):
            take = min(128, bits - 128 * block)
            h = self._hash(keys.view(np.uint8).reshape(-1, 16), 0,
                           (1 << 63) | (use << 16) | block)
            b = h.view(np.uint8).reshape(-1, 16)[:, :-(-take // 8)]
            b = np.unpackbits(b, axis=1, bitorder="little")[:, :take]
            out.append(np.ascontiguousarray(b.T))
        return out[0] if len(out) == 1 else np.concatenate(out, axis=0)



def _flip_delta(q: np.ndarray, flip: np.ndarray, delta: np.ndarray) -> None:
    """q [m, 16] uint8 ^= Delta where flip [m] is 1, in place: a word mask per OT applied to
    each 64-bit column in turn (m-long loops: a third of the CPU of broadcasting [m, 1] & [2],
    which runs one 2-long loop per OT)."""
    q64 = q.view(np.uint64).reshape(-1, 2)
    sel = np.uint64(0) - flip.astype(np.uint64)           # all ones where the flip is 1
    for j, word in enumerate(delta.view(np.uint64)):
        q64[:, j] ^= sel & word


def _next_rows(keys: "OTKeys", g: int) -> int:
    """The first of the next g prepared pad rows of `keys` (not yet claimed): a ProtocolError
    without prepared pads or with fewer than g left (pads are never reused)."""
    if keys.rows is None:
        raise ProtocolError("pairwise OT: transfer_packed needs prepared pads (prepare)")
    if keys.offset + g > keys.bits:
        raise ProtocolError(f"pairwise OT: {g} more pad rows asked for, {keys.bits - keys.offset} "
                            "left (pads are never reused)")
    return keys.offset


class CorrelatedOT:
    """Correlated OT in both directions between two parties (IKNP over 128 base OTs each way).

    `send(data)` / `recv()` move one message to / from the peer (framed and authenticated by
    the caller); `rand(n)` returns n bytes from this party's private PRG. Direction d is the
    one where rank d chooses (is the OT receiver). `chunk`: OTs per IKNP extension (a
    multiple of 8; both parties must pass the same), which bounds its working set.
    """

    def __init__(self, rank: int, send: Callable[[bytes], None], recv: Callable[[], bytes],
                 rand: Callable[[int], bytes], chunk: int = CHUNK, mode: str = "ferret"):
        if chunk < 8 or chunk % 8:
            raise ConfigError(f"pairwise OT: chunk {chunk} is not a positive multiple of 8")
        if mode not in MODES:
            raise ConfigError(f"pairwise OT: mode {mode!r} is not one of {', '.join(MODES)}")
        self.mode = mode
        self._silent: list = [None, None]             # per direction: ferret.SilentCOT
        # silent pools make their next step's local work on a thread after each hand-out
        # (ferret.SilentCOT.ahead; set before the pools are made; the messages are the same)
        self.silent_ahead = True
        self.rank = rank
        self.chunk = chunk
        self._send, self._recv, self._rand = send, recv, rand
        self._ready = False
        self._pairs: list[tuple[bytes, bytes]] = []   # as receiver (direction == rank)
        self._keys: list[bytes] = []                  # as sender: k_i^{Delta_i}
        self._delta_bits = np.zeros(KAPPA, dtype=np.uint8)
        self._delta = np.zeros(16, dtype=np.uint8)
        self._calls = [0, 0]                          # extensions per direction
        self._streams: dict[tuple, object] = {}       # (direction, base-OT key) -> AES-CTR
        self._index = [0, 0]                          # hash tweaks per direction
        self._hash = _Hash()
        self._pads = _Pads()
        self.made = 0

    def close(self) -> None:
        """Close the silent pools: a step being made ahead on a thread is joined (deadline
        ferret.AHEAD_DEADLINE), so no thread outlives the provider; a take after it is a
        ProtocolError (the pools stay, closed, so none is made anew out of step with the peer)."""
        errors = []
        for pool in self._silent:
            if pool is not None:
                try:
                    pool.close()
                except ProtocolError as e:
                    errors.append(e)
        if errors:
            raise errors[0]

    def setup(self) -> None:
        """The 2 x 128 base OTs (once per session, on first use)."""
        if self._ready:
            return
        for d in (0, 1):
            label = f"crypten_lite/v1/base-ot/{d}".encode()
            if self.rank == d:
                self._pairs = base_send(KAPPA, label, self._send, self._recv, self._rand)
            else:
                raw = np.frombuffer(self._rand(KAPPA // 8), dtype=np.uint8)
                self._delta_bits = np.unpackbits(raw, bitorder="little")
                if self.mode == "ferret":   # bit 0 of a silent COT carries the choice bit
                    self._delta_bits[0] = 1  # (provider/ferret.py): Delta has 127 free bits
                self._delta = np.packbits(self._delta_bits, bitorder="little")
                self._keys = base_receive([int(c) for c in self._delta_bits], label,
                                          self._send, self._recv, self._rand)
        self._ready = True

    # -- IKNP -------------------------------------------------------------------------------
    def _prg(self, key: bytes, d: int, call: int, nbytes: int) -> np.ndarray:
        """The next `nbytes` of the AES-256-CTR keystream of base-OT key `key` in direction d:
        one stream per key, read on in every extension (`call` keeps the two parties' reads
        in step: each call reads every stream of its direction once), so no cipher context is
        made per extension and no keystream block is read twice."""
        stream = self._streams.get((d, key))
        if stream is None:
            stream = self._streams[(d, key)] = Cipher(
                algorithms.AES(key), modes.CTR(struct.pack("<I", d) + bytes(12))).encryptor()
        return np.frombuffer(stream.update(bytes(nbytes)), dtype=np.uint8)

    def _extend_receiver(self, choices: np.ndarray) -> np.ndarray:
        """Receiver's side of m OTs: returns T [m, 16] with T_j = Q_j xor c_j Delta. From
        SILENT_MIN OTs on (mode 'ferret') a silent COT (provider/ferret.py) derandomized by
        one bit per OT (c xor its random bit, uniform), else an IKNP extension."""
        m = choices.size
        if not self._silent_for(m, self.rank):
            return self._iknp_receiver(choices)
        bits, t = self._silent_pool(self.rank).take(m)
        flip = (choices.astype(np.uint8) & 1) ^ bits
        self._send(np.packbits(flip, bitorder="little").tobytes())
        return t

    def _extend_sender(self, m: int) -> np.ndarray:
        """Sender's side of m OTs: returns Q [m, 16] (the other side of _extend_receiver)."""
        if not self._silent_for(m, 1 - self.rank):
            return self._iknp_sender(m)
        q = self._silent_pool(1 - self.rank).take(m)
        data = self._recv()
        if len(data) != -(-m // 8):
            raise ProtocolError(f"pairwise OT: expected {-(-m // 8)} bytes of choice-bit flips "
                                f"for {m} silent OTs, got {len(data)}")
        flip = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")[:m]
        _flip_delta(q, flip, self._delta)
        return q

    def _silent_for(self, m: int, d: int) -> bool:
        """Whether m OTs of direction d come from the silent pool: in mode 'ferret' from
        SILENT_MIN OTs on, and at any size once the direction's pool is bootstrapped (its
        current step's outputs are already made and kept: a small request takes the next ones
        with no IKNP matrix, 16 bytes per OT, and no extra message). Both parties decide alike
        (the same requests in the same order make the same pools)."""
        return self.mode == "ferret" and (m >= SILENT_MIN or self._silent[d] is not None)

    def _silent_pool(self, d: int):
        if self._silent[d] is None:
            from .ferret import SilentCOT
            self._silent[d] = SilentCOT(self, d, ahead=self.silent_ahead)
        return self._silent[d]

    def _iknp_receiver(self, choices: np.ndarray) -> np.ndarray:
        """IKNP receiver's side of m OTs: sends U, returns T [m, 16] (T_j = Q_j xor c_j Delta)."""
        d, call = self.rank, self._calls[self.rank]
        self._calls[d] += 1
        m = choices.size
        nb = -(-m // 8)
        r = np.packbits(choices.astype(np.uint8) & 1, bitorder="little")
        t = np.empty((KAPPA, nb), dtype=np.uint8)
        u = np.empty((KAPPA, nb), dtype=np.uint8)
        for i, (k0, k1) in enumerate(self._pairs):
            t[i] = self._prg(k0, d, call, nb)
            u[i] = t[i] ^ self._prg(k1, d, call, nb) ^ r
        self._send(u.tobytes())
        return transpose(t)[:m]

    def _iknp_sender(self, m: int) -> np.ndarray:
        """IKNP sender's side of m OTs: receives U, returns Q [m, 16]."""
        d = 1 - self.rank
        call = self._calls[d]
        self._calls[d] += 1
        nb = -(-m // 8)
        data = self._recv()
        if len(data) != KAPPA * nb:
            raise ProtocolError(f"pairwise OT: expected {KAPPA * nb} bytes of extension matrix "
                                f"for {m} OTs, got {len(data)}")
        u = np.frombuffer(data, dtype=np.uint8).reshape(KAPPA, nb)
        q = np.empty((KAPPA, nb), dtype=np.uint8)
        for i, k in enumerate(self._keys):
            q[i] = self._prg(k, d, call, nb)
            if self._delta_bits[i]:
                q[i] ^= u[i]
        return transpose(q)[:m]

    # -- correlated OT ---------------------------------------------------------------------
    def product(self, mine: np.ndarray, chooser: int, width: int) -> np.ndarray:
        """Shares of c * x elementwise, where the `chooser` party passes its bits c and the
        other its values x (uint64 arrays of one length). width 64: additive shares mod 2^64;
        width 1: XOR shares of c & x (only bit 0 of x is used). Returns uint64."""
        if width not in (1, 64):
            raise ProtocolError(f"pairwise OT: width {width} is not 1 or 64")
        self.setup()
        flat = np.ascontiguousarray(mine, dtype=np.uint64).reshape(-1)
        out = np.empty(flat.size, dtype=np.uint64)
        for start in range(0, flat.size, self.chunk):
            part = flat[start:start + self.chunk]
            if self.rank == chooser:
                out[start:start + part.size] = self._receive(part, width)
            else:
                out[start:start + part.size] = self._give(part, width)
            self.made += part.size
        return out

    def _give(self, x: np.ndarray, width: int, q: np.ndarray | None = None) -> np.ndarray:
        d = 1 - self.rank
        m = x.size
        q = self._extend_sender(m) if q is None else q
        first = self._index[d]
        self._index[d] += m
        h0 = self._hash(q, first, d)[:, 0]
        h1 = self._hash(q, first, d, xor=self._delta)[:, 0]     # H(q ^ Delta), no copy of q
        if width == 64:
            with np.errstate(over="ignore"):
                self._send((h0 + x - h1).tobytes())
                return np.uint64(0) - h0
        y = (h0 ^ h1 ^ x) & np.uint64(1)
        self._send(np.packbits(y.astype(np.uint8), bitorder="little").tobytes())
        return h0 & np.uint64(1)

    def _receive(self, c: np.ndarray, width: int, t: np.ndarray | None = None) -> np.ndarray:
        d = self.rank
        m = c.size
        bits = (c & np.uint64(1)).astype(np.uint8)
        t = self._extend_receiver(bits) if t is None else t
        first = self._index[d]
        self._index[d] += m
        h = self._hash(t, first, d)[:, 0]
        data = self._recv()
        if width == 64:
            if len(data) != 8 * m:
                raise ProtocolError(f"pairwise OT: expected {8 * m} bytes of corrections, got {len(data)}")
            y = np.frombuffer(data, dtype=np.uint64)
            with np.errstate(over="ignore"):
                return h + bits.astype(np.uint64) * y
        if len(data) != -(-m // 8):
            raise ProtocolError(f"pairwise OT: expected {-(-m // 8)} bytes of corrections, got {len(data)}")
        y = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")[:m].astype(np.uint64)
        return (h ^ (bits.astype(np.uint64) & y)) & np.uint64(1)

    def products_both(self, mines: tuple[np.ndarray, np.ndarray], width: int) -> tuple:
        """product() for both choosers at once: mines[c] is this party's input to the products
        where party c chooses (its bits if it is c, else its values); returns the two shares.
        With silent COTs (both directions' pools bootstrapped, or large enough to start them)
        each chunk is one message each way for the choice-bit flips and one for the
        corrections, both parties sending at the same time, instead of two half round trips
        per chooser; the COTs of the two directions are taken in the same order on both
        parties (direction 0 first), so a pool step that moves GGM level messages never waits
        on the other direction. Otherwise the two products one after the other."""
        if width not in (1, 64):
            raise ProtocolError(f"pairwise OT: width {width} is not 1 or 64")
        self.setup()
        flats = [np.ascontiguousarray(m, dtype=np.uint64).reshape(-1) for m in mines]
        if not all(f.size == 0 or self._silent_for(min(f.size, self.chunk), d)
                   for d, f in enumerate(flats)):
            return tuple(self.product(flats[c], c, width) for c in (0, 1))
        outs = [np.empty(f.size, dtype=np.uint64) for f in flats]
        me, other = self.rank, 1 - self.rank
        for start in range(0, max(f.size for f in flats), self.chunk):
            parts = [f[start:start + self.chunk] for f in flats]
            cots: list = [None, None]
            for d in (0, 1):                   # the same order on both parties
                if parts[d].size:
                    cots[d] = self._silent_pool(d).take(parts[d].size)
            if parts[me].size:                 # derandomize my choices: c xor the COT's bit
                bits, t = cots[me]
                c = (parts[me] & np.uint64(1)).astype(np.uint8)
                self._send(np.packbits(c ^ bits, bitorder="little").tobytes())
            m = parts[other].size
            if m:
                q = cots[other]
                data = self._recv()
                if len(data) != -(-m // 8):
                    raise ProtocolError(f"pairwise OT: expected {-(-m // 8)} bytes of choice-bit "
                                        f"flips for {m} silent OTs, got {len(data)}")
                flip = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")[:m]
                _flip_delta(q, flip, self._delta)
                outs[other][start:start + m] = self._give(parts[other], width, q=q)
            if parts[me].size:
                outs[me][start:start + parts[me].size] = self._receive(parts[me], width, t=cots[me][1])
            self.made += sum(p.size for p in parts)
        return tuple(outs)

    # -- random OT keys, many transfers per OT -----------------------------------------------
    def random_ot(self, mine: np.ndarray | None, m: int, chooser: int,
                  free: bool = False) -> OTKeys:
        """m random OTs (chooser's bits `mine`): the keys, one extension per CHUNK. With
        `free` (both parties alike) the chooser passes None and its bits are chosen for it,
        uniform and its own (OTKeys.choice): a silent COT's own random bits, which then need
        no derandomizing message (1 bit per OT less on the wire, no flip to apply), under
        IKNP fresh bits from its PRG."""
        steps = self._random_ot_chunks(mine, m, chooser, free)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def random_ots_both(self, sizes: tuple[list[int], list[int]],
                        pads: tuple[list, list] | None = None) -> tuple[list, list]:
        """Free-choice random OTs (random_ot's `free`) for both choosers at once: sizes[c] are
        chooser c's sets; returns one OTKeys per set, per chooser. pads[c] (optional): per
        set the pad bits to prepare (None or 0: the keys as they are); those sets come back
        as prepare(keys, bits) leaves them (the same bytes; with the native kernel hashed
        straight into their pad rows, _fused_sets). The two directions'
        extensions alternate chunk by chunk (the same order on both parties), so each party is
        in turn the COT sender of one and the receiver of the other: neither waits through a
        whole direction for the other's heavier side (the sender's two hashes per OT)."""
        self.setup()
        fused = [self._fused_sets(sizes[c], pads[c] if pads else None, c) for c in (0, 1)]
        runs = [self._random_ot_chunks(None, sum(sizes[c]), c, True, fused[c]) if sizes[c]
                else None for c in (0, 1)]
        whole: list = [None, None]
        while any(r is not None for r in runs):
            for c in (0, 1):
                if runs[c] is None:
                    continue
                try:
                    next(runs[c])
                except StopIteration as done:
                    whole[c], runs[c] = done.value, None
        out = tuple(self._split(whole[c], sizes[c]) if sizes[c] else [] for c in (0, 1))
        for c in (0, 1):
            done = {j: rows for _, _, j, _, rows in fused[c]}
            for j, keys in enumerate(out[c]):
                g = pads[c][j] if pads else None
                if j in done:                           # hashed straight into its pad rows
                    self._prepared(keys, g, done[j])
                elif g:
                    self.prepare(keys, g)
        return out

    def _fused_sets(self, sizes: list[int], pads: list | None, chooser: int) -> list[tuple]:
        """The sets of one chooser whose pad rows (prepare's, <= 128 bits) the native hash
        writes directly as their OTs are made (tccr_rows: no [m, 16] keys stored and read
        back): (first OT, end, set, bits, (rows0, rows1 or None)) in order; [] without the
        native kernel (the keys hashed, then prepare: the same bytes)."""
        if not pads or self._hash._native is None:
            return []
        out, at = [], 0
        for j, (m, g) in enumerate(zip(sizes, pads)):
            if g and 1 <= g <= 128 and m and m % 8 == 0:
                rows = tuple(np.zeros((g, m // 8), dtype=np.uint8)
                             for _ in range(1 if self.rank == chooser else 2))
                out.append((at, at + m, j, g, rows))
            at += m
        return out

    def _prepared(self, keys: OTKeys, g: int, rows: tuple) -> None:
        """prepare's end state for a set whose pad rows were hashed in directly."""
        if self.rank == keys.chooser:
            keys.rows = (rows[0], np.packbits(keys.choice, bitorder="little"))
        else:
            rows[1][...] ^= rows[0]
            keys.rows = (rows[0], rows[1])
        keys.keys, keys.choice, keys.offset, keys.bits = None, None, 0, g

    def _hash_piece(self, src: np.ndarray, first: int, d: int, at: int, outs: tuple,
                    fused: list, pos: list) -> None:
        """Hash the OTs at .. at + c (src [c, 16]; tweak first + i of OT i) into `outs` (the
        keys: outs[1] under Delta, the sender's), except where a fused set covers them: there
        straight into its pad rows. pos[0]: the first fused set not yet passed."""
        c = src.shape[0]
        end, u = at + c, at
        while u < end:
            while pos[0] < len(fused) and fused[pos[0]][1] <= u:
                pos[0] += 1
            seg = fused[pos[0]] if pos[0] < len(fused) else None
            if seg is None or seg[0] >= end:
                v, rows = end, None
            elif seg[0] > u:
                v, rows = seg[0], None
            else:
                v, rows = min(seg[1], end), seg[4]
            part = src[u - at:v - at]
            for k, out in enumerate(outs):
                mask = None if k == 0 else self._delta
                if rows is None:
                    self._hash(part, first + u, d, out=out[u:v], xor=mask)
                else:
                    self._hash._native.tccr_rows(
                        _FIXED_KEY, np.ascontiguousarray(part), rows[k], first + u, d,
                        None if mask is None else np.ascontiguousarray(mask, dtype=np.uint8),
                        u - seg[0], seg[3])
            u = v

    def _random_ot_chunks(self, mine: np.ndarray | None, m: int, chooser: int, free: bool,
                          fused: list | None = None):
        """random_ot's work, one extension (chunk) per step of the generator; returns OTKeys.
        `fused`: _fused_sets' sets, hashed straight into their pad rows (random_ots_both)."""
        fused, pos = fused or [], [0]
        self.setup()
        d = chooser
        choosing = self.rank == chooser
        keys0 = np.empty((m, 2), dtype=np.uint64)
        keys1 = None if choosing else np.empty((m, 2), dtype=np.uint64)
        choice = np.empty(m, dtype=np.uint8) if choosing else None
        for start in range(0, m, self.chunk):
            size = min(self.chunk, m - start)
            first = self._index[d] - start          # tweak of OT i: first + i
            self._index[d] += size
            if choosing:
                if free:
                    pieces = self._free_receiver_parts(size)
                else:
                    bits = mine[start:start + size].astype(np.uint8) & 1
                    pieces = [(bits, self._extend_receiver(bits))]
                at = start
                for bits, t in pieces:
                    c = bits.shape[0]
                    choice[at:at + c] = bits
                    self._hash_piece(t, first, d, at, (keys0,), fused, pos)
                    at += c
            else:
                pieces = self._free_sender_parts(size) if free else [self._extend_sender(size)]
                at = start
                for q in pieces:
                    self._hash_piece(q, first, d, at, (keys0, keys1), fused, pos)
                    at += q.shape[0]
            yield
        self.made += m
        if choosing:
            return OTKeys(chooser, m, (keys0,), choice)
        return OTKeys(chooser, m, (keys0, keys1), None)

    def _free_receiver_parts(self, m: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """m COTs with choice bits of the extension's own choosing: [(bits, T)] pieces (a
        silent pool's steps as made, no copy; IKNP: one)."""
        if self._silent_for(m, self.rank):
            return self._silent_pool(self.rank).take_parts(m)
        raw = np.frombuffer(self._rand(-(-m // 8)), dtype=np.uint8)
        bits = np.unpackbits(raw, bitorder="little")[:m].copy()
        return [(bits, self._iknp_receiver(bits))]

    def _free_sender_parts(self, m: int) -> list[np.ndarray]:
        """The other side of _free_receiver_parts: [Q [c, 16]] pieces."""
        if self._silent_for(m, 1 - self.rank):
            return [q for _, q in self._silent_pool(1 - self.rank).take_parts(m)]
        return [self._iknp_sender(m)]

    def random_ots(self, mines: list | None, sizes: list[int], chooser: int,
                   free: bool = False) -> list[OTKeys]:
        """Several sets of random OTs with one chooser in one extension (per chunk): the
        chooser passes its bits of each set (`mines`; None with `free`, random_ot), the other
        None; one OTKeys per set."""
        if not sizes:
            return []
        mine = np.concatenate(mines) if self.rank == chooser and not free else None
        return self._split(self.random_ot(mine, sum(sizes), chooser, free), sizes)

    @staticmethod
    def _split(whole: OTKeys, sizes: list[int]) -> list[OTKeys]:
        """One OTKeys per set of `sizes` (views of `whole`'s keys and bits)."""
        out, start = [], 0
        for size in sizes:
            keys = tuple(k[start:start + size] for k in whole.keys)
            choice = None if whole.choice is None else whole.choice[start:start + size]
            out.append(OTKeys(whole.chooser, size, keys, choice))
            start += size
        return out

    def prepare(self, keys: OTKeys, bits: int) -> None:
        """Turn m random-OT keys into `bits` one-time pad bits per OT, packed as rows
        [bits, m/8] (row i: bit i of every OT's pads, OT j at byte j/8, bit j%8): the first
        128 are the random-OT keys' own bits (the random OT's outputs), further blocks come
        from the keys under the tweakable hash (domain bits 63 and 62: no other hash shares
        them). The keys are dropped; transfer_packed then hands out each row once."""
        if keys.keys is None or keys.uses:
            raise ProtocolError("pairwise OT: these random-OT keys were already used")
        if keys.m % 8 or bits < 1:
            raise ProtocolError(f"pairwise OT: packed pads need a multiple of 8 OTs and at least "
                                f"one bit (got {keys.m} OTs, {bits} bits)")
        rows = []
        for k in keys.keys:
            blocks = []
            for b in range(-(-bits // 128)):
                src = k if b == 0 else self._hash(k.view(np.uint8).reshape(-1, 16), 0,
                                                  (1 << 63) | (1 << 62) | b)
                take = -(-min(128, bits - 128 * b) // 8)    # only the key bytes that are used
                blocks.append(transpose(np.ascontiguousarray(src).view(np.uint8).reshape(keys.m, 16),
                                        take))
            rows.append(np.concatenate(blocks)[:bits].copy())
        if self.rank == keys.chooser:
            keys.rows = (rows[0], np.packbits(keys.choice, bitorder="little"))
        else:
            keys.rows = (rows[0], rows[0] ^ rows[1])
        keys.keys, keys.choice, keys.offset, keys.bits = None, None, 0, bits

    def transfer_packed(self, keys: OTKeys, values: np.ndarray | None, g: int) -> np.ndarray:
        """XOR shares of c_j & x_ij for i < g on packed bits, from prepared pads (each pad row
        used once): the non-chooser passes values [g, m/8] (bit j of row i at byte j/8, bit
        j%8), the chooser None. One message (g bits per OT) from the non-chooser: pad0 ^ pad1
        ^ x; returns [g, m/8] uint8 (the non-chooser pad0, the chooser pad_c ^ c & y)."""
        start = _next_rows(keys, g)
        keys.offset += g
        nb = keys.m // 8
        first, second = keys.rows
        if self.rank == keys.chooser:
            data = self._recv()
            if len(data) != g * nb:
                raise ProtocolError(f"pairwise OT: expected {g * nb} bytes of transfer, got {len(data)}")
            y = np.frombuffer(data, dtype=np.uint8).reshape(g, nb)
            return first[start:start + g] ^ (y & second)
        if values.shape != (g, nb):
            raise ProtocolError(f"pairwise OT: transfer of {values.shape} values, expected {(g, nb)}")
        self._send((second[start:start + g] ^ values).tobytes())
        return first[start:start + g].copy()

    def transfer_packed_many(self, items: list[tuple]) -> list[np.ndarray]:
        """Several transfer_packed at once, in one message each way: items are (keys, values,
        g) in the same order on both parties (values: as transfer_packed's, None where this
        party chooses). This party sends the masked values of every item where it is the
        non-chooser in one message, then reads the peer's one message for the items where it
        chooses, so a layer of transfers with both choosers costs one message per party sent
        at the same time, not one half round trip per item. Each pad row is used once."""
        plan, out_parts = [], []
        for keys, values, g in items:
            start = _next_rows(keys, g)
            nb = keys.m // 8
            choosing = self.rank == keys.chooser
            if not choosing and (values is None or values.shape != (g, nb)):
                got = None if values is None else values.shape
                raise ProtocolError(f"pairwise OT: transfer of {got} values, expected {(g, nb)}")
            plan.append((keys, start, g, nb, choosing))
        for keys, start, g, nb, choosing in plan:
            keys.offset = start + g                  # claimed before any message: never reused
        results: list = [None] * len(items)
        masked = np.empty(sum(g * nb for _, _, g, nb, choosing in plan if not choosing),
                          dtype=np.uint8)            # the one message, XORed straight into it
        at = 0
        for i, ((keys, start, g, nb, choosing), (_, values, _)) in enumerate(zip(plan, items)):
            if not choosing:
                first, second = keys.rows
                np.bitwise_xor(second[start:start + g], values,
                               out=masked[at:at + g * nb].reshape(g, nb))
                at += g * nb
                out_parts.append(i)
                results[i] = first[start:start + g].copy()
        if out_parts:
            self._send(masked.tobytes())
        need = sum(g * nb for _, _, g, nb, choosing in plan if choosing)
        if need:
            data = self._recv()
            if len(data) != need:
                raise ProtocolError(f"pairwise OT: expected {need} bytes of packed transfers, "
                                    f"got {len(data)}; the parties are out of step")
            y_all = np.frombuffer(data, dtype=np.uint8)
            at = 0
            for i, (keys, start, g, nb, choosing) in enumerate(plan):
                if choosing:
                    first, second = keys.rows
                    y = y_all[at:at + g * nb].reshape(g, nb)
                    at += g * nb
                    share = np.bitwise_and(y, second)
                    share ^= first[start:start + g]
                    results[i] = share
        return results

    def transfer(self, keys: OTKeys, values: np.ndarray | None, g: int) -> np.ndarray:
        """XOR shares of c_j & x_ij for i < g: the non-chooser passes values [g, m] (bits), the
        chooser None. One message (g bits per OT) from the non-chooser; returns [g, m] uint8."""
        if keys.keys is None:
            raise ProtocolError("pairwise OT: these random-OT keys were turned into packed pads")
        use = keys.uses
        keys.uses += 1
        if self.rank == keys.chooser:
            pad = self._pads(keys.keys[0], use, g)
            data = self._recv()
            need = -(-g * keys.m // 8)
            if len(data) != need:
                raise ProtocolError(f"pairwise OT: expected {need} bytes of transfer, got {len(data)}")
            y = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")[:g * keys.m]
            return pad ^ (y.reshape(g, keys.m) & keys.choice)
        p0 = self._pads(keys.keys[0], use, g)
        p1 = self._pads(keys.keys[1], use, g)
        y = p0 ^ p1 ^ (values.astype(np.uint8) & 1)
        self._send(np.packbits(y.reshape(-1), bitorder="little").tobytes())
        return p0
