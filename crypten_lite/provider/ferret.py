"""Silent correlated OT for the pairwise provider: Ferret-style LPN expansion of a few base COTs.

IKNP (provider/ot.py) sends 16 bytes per OT. Ferret (Yang, Weng, Lan, Zhang, Wang, CCS 2020)
turns k + t*h correlated OTs (COTs) into n >> k COTs with the same global Delta, moving only
the GGM trees' level messages (t*h*32 + t*16 bytes per iteration: about 2.9 bits per COT
here). Both sides of one direction d (party d, the *receiver*, holds the choice bits; the
other party, the *sender*, holds Delta), semi-honest:

* **LPN secret**: k base COTs: the receiver has bits u and M_u = K_u ^ u*Delta, the sender K_u.
* **Regular noise by a GGM-tree punctured PRF** (single-point COT, one per bin of 2^h
  outputs, t bins): the sender expands a fresh root seed (from its roots stream: AES-256-CTR
  under a seed drawn once from its PRG, read in step order) into 2^h leaves w (PRG: fixed-key
  AES in MMO form, G(s) = (pi_L(s) ^ s, pi_R(s) ^ s)), and for each level l sends the XOR of
  its left children and of its right children, each masked by one base COT's hash
  (H(K), H(K ^ Delta)); the receiver, whose base-COT choice bit b_l picks the off-path
  side (the noise position alpha has bits not b_l, uniform and its own), rebuilds every
  leaf but alpha. The sender also sends Delta ^ XOR(w), from which the receiver sets
  v_alpha = w_alpha ^ Delta. So v = w ^ e*Delta, e the unit vector at alpha.
* **Local linear code**: output i is the XOR of D = 10 entries of the k-vector, at indices
  from a public AES-CTR stream (the same public matrix A for every iteration, as Ferret's):
  receiver x = A*u ^ e and M_x = A*M_u ^ v, sender K_x = A*K_u ^ w, so M_x = K_x ^ x*Delta.
* **Bootstrapping**: the first k + t*h outputs of each iteration are kept as the next
  iteration's base COTs; the very first ones come from IKNP.
* **Steps made ahead**: after each hand-out, the pending step's local work (the receiver's
  puncturing, both parties' linear code; its trees already exchanged), and the sender's
  expansion of the step after it (sent by the next take), run on a thread, so
  it fills this party's waits for its peer and the gaps between inferences; the next take
  joins it (deadline AHEAD_DEADLINE) before the step's one exchange, at the same point of
  the protocol as without it: the same messages and the same COTs either way
  (CorrelatedOT.silent_ahead = False turns it off).
* **Choice bits in bit 0** (emp-ot's form): Delta's bit 0 is 1 (ot.CorrelatedOT.setup, mode
  ferret: 127 uniform bits), the sender's base COTs and leaves have bit 0 cleared and the
  receiver's base COTs carry u there, so bit 0 of the receiver's M_x is x: the code gathers
  the 128-bit values only, never the bits.

Parameters (about 128-bit security against the published attacks on regular-noise primal
LPN: Gaussian elimination, ISD variants, BJMM, the hybrid and the algebraic attacks, per the
LPN estimator, as chosen for emp-ot's current parameter table):
t = 850 trees of depth h = 10 (n = 870,400), k = 2^16, D = 10 (emp-ot's "b10" set; the smaller
k keeps the 1 MB table of the code's gathers in a core's L2 cache: measured 25% faster here
than k = 2^17).

Every secret (Delta, the choice bits u, x, the noise positions, root seeds, leaves) stays in
its owner's process: the wire carries only the level messages (one-time padded by the
correlation-robust hash of base COTs nobody else can compute) and Delta ^ XOR(w) (masked by
the leaf w_alpha the receiver cannot compute). Outputs are consumed once, in order.
"""

from __future__ import annotations

import hashlib
import struct
import threading

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from .. import _native
from ..errors import ProtocolError

TREES = 850                   # t: GGM trees (noise bins) per iteration
DEPTH = 10                    # h: tree depth (bin of 2^h outputs)
LEAVES = 1 << DEPTH
LOG_K = 16
K = 1 << LOG_K                # LPN secret length
D = 10                        # nonzeros per row of the local linear code
N = TREES * LEAVES            # outputs per iteration (870,400)
BASE = K + TREES * DEPTH      # base COTs an iteration consumes (74,036)
BLOCK = 1 << 13               # outputs encoded at once (their scratch: 0.4 MB, beside the 1 MB table)
GROUP = 512                   # trees expanded per step (524,288 outputs: bounds the working set)
AHEAD_DEADLINE = 300.0        # seconds a take waits for a step made ahead (tens of ms of work)
DESCRIPTION = f"ferret;t={TREES};h={DEPTH};k=2^{LOG_K};d={D};ggm=mmo-aes128"
_LPN_SEED = hashlib.sha256(b"crypten_lite/v1/ferret-lpn-matrix").digest()      # public
_KEYS = [hashlib.sha256(f"crypten_lite/v1/ferret-ggm-{s}".encode()).digest()[:16] for s in "LR"]
_U64 = np.uint64
_CLEAR = ~np.uint64(1)     # bit 0 of a COT value is the receiver's choice bit (Delta's: 1)

if not (GROUP * LEAVES >= BASE and TREES > GROUP and DEPTH >= 2):  # pragma: no cover - a constants edit
    raise ImportError("ferret: an iteration's first step must hold the next base COTs")


class _Expander:
    """GGM PRG on 128-bit nodes: G(s) = (pi_L(s) ^ s, pi_R(s) ^ s), fixed-key AES (public keys).

    Nodes are laid out [w, g, 2] uint64 (position in the level, tree, 128 bits): the children
    of position p are at p (left) and w + p (right), so each AES call writes its side's
    children straight into one contiguous half of the next level, and the XOR of a level's
    left (right) children is a fold over its first (second) half."""

    def __init__(self):
        self._enc = [Cipher(algorithms.AES(k), modes.ECB()).encryptor() for k in _KEYS]

    def __call__(self, nodes: np.ndarray) -> np.ndarray:
        """nodes [w, g, 2] uint64 -> children [2w, g, 2] (left children first)."""
        w, g, _ = nodes.shape
        src = np.ascontiguousarray(nodes).reshape(-1).view(np.uint8)
        size = src.size
        raw = np.empty(2 * size + 16, dtype=np.uint8)    # update_into wants a block of room
        for side, enc in enumerate(self._enc):
            enc.update_into(src, raw[side * size:(side + 1) * size + 16])
        out = raw[:2 * size].view(_U64).reshape(2, w, g, 2)
        out ^= nodes[None]
        return out.reshape(2 * w, g, 2)


_ROWS: dict[tuple[int, int], np.ndarray] = {}     # the public code, made once per process


def _indices(step: int, count: int) -> np.ndarray:
    """The public code's rows for one step's outputs: [D, count] indices into the k-vector,
    from AES-256-CTR under a public key (nonce: the step), k a power of two (a mask, no bias).
    The same matrix serves every iteration and both directions, so it is made once (an
    iteration's two steps: 35 MB of int32) and read only."""
    rows = _ROWS.get((step, count))
    if rows is None:
        rows = _ROWS[(step, count)] = _make_indices(step, count)
        rows.flags.writeable = False
    return rows


def _make_indices(step: int, count: int) -> np.ndarray:
    enc = Cipher(algorithms.AES(_LPN_SEED), modes.CTR(struct.pack(">QQ", step, 0))).encryptor()
    raw = np.empty(4 * D * count + 16, dtype=np.uint8)
    enc.update_into(np.zeros(4 * D * count, dtype=np.uint8), raw)
    words = raw[:4 * D * count].view(np.int32)
    words &= np.int32(K - 1)
    return words.reshape(D, count)


def _encode(acc: np.ndarray, table: np.ndarray, rows: np.ndarray, count: int) -> None:
    """The linear code in numpy: acc[i] ^= XOR_j table[rows[j, i]] (the native lpn_encode's
    reference), BLOCK outputs at a time (they stay in cache for their D gathers: 25% faster
    than whole rows)."""
    index = np.empty(BLOCK, dtype=np.intp)      # scratch: no fresh pages per gather
    got = np.empty(BLOCK, dtype=np.complex128)
    got64 = got.view(_U64).reshape(BLOCK, 2)
    for s in range(0, count, BLOCK):
        e = min(count, s + BLOCK)
        part = acc[s:e]
        for j in range(D):
            index[:e - s] = rows[j, s:e]
            table.take(index[:e - s], out=got[:e - s], mode="clip")   # clip: no buffered copy
            part ^= got64[:e - s]


def _fold(a: np.ndarray) -> np.ndarray:
    """XOR over axis 0: numpy's reduce XORs row after row into one [g, 2] accumulator that
    stays in L1 (about half the CPU of halving, which writes a half-size temporary first)."""
    return np.bitwise_xor.reduce(a, axis=0)


class SilentCOT:
    """COTs of one direction d (rank d holds the choice bits), made by the LPN expansion.

    `ot` is the session's ot.CorrelatedOT: its IKNP makes the first base COTs, its channel
    (send / recv / rand) carries the level messages, its hash masks them. take() hands out
    the next m COTs: the receiver gets (bits [m] uint8, M [m, 16] uint8), the sender K
    [m, 16] uint8, with M = K ^ bits*Delta. Both parties must call take with the same m's."""

    def __init__(self, ot, direction: int, ahead: bool = True):
        from .ot import _Hash  # the same tweakable correlation-robust hash as IKNP's
        self._ot = ot
        self.direction = direction
        self.receiver = ot.rank == direction
        if not self.receiver and not ot._delta[0] & 1:   # pragma: no cover - ot.setup's job
            raise ProtocolError("pairwise silent OT: Delta's bit 0 must be 1 (CorrelatedOT.setup "
                                "in mode 'ferret' sets it)")
        # the native kernels (crypten_lite/_native: the same bytes), else the numpy path
        self._aes = _native.aes()         # GGM levels with AES-NI
        self._kern = _native.kernels()    # the LPN code
        self._expand = _Expander() if self._aes is None else None
        self._hash = _Hash()
        # the sender's tree roots: AES-256-CTR under a seed drawn once from this party's PRG,
        # a stream of its own, so the next step's trees can be expanded ahead on the thread
        # (_start_ahead) in the order a step made on demand draws them (the same roots)
        self._roots = None if self.receiver else Cipher(
            algorithms.AES(bytes(ot._rand(32))), modes.CTR(bytes(16))).encryptor()
        self._tweak = 0                   # level-OT hash tweaks used so far
        self._reserve: tuple | None = None
        self._base: tuple | None = None   # this iteration's (u bits, M_u or K_u, tree bits, tree keys)
        self._tree = TREES                # next tree of the iteration (TREES: start a new one)
        self._iteration = 0
        self._pending: tuple | None = None   # the next step's trees, already exchanged
        self.ahead = ahead                # make the pending step's local work on a thread
        self._ahead: tuple | None = None  # (thread, its result box) of that step
        self.made_ahead = 0               # steps whose local work a thread made ahead
        self.grown_ahead = 0              # the sender's steps whose trees a thread expanded
        self._closed: str | None = None   # why no take may follow (close, a failed step)
        self._out: list[tuple] = []       # produced, not yet handed out: (bits | None, vals [m, 2])
        self._have = 0
        self.produced = 0
        self.bytes_sent = 0

    # -- iterations ---------------------------------------------------------------------------
    def _bootstrap(self) -> tuple:
        """BASE base COTs by IKNP (the first iteration only), put in this module's form: the
        sender's K with bit 0 cleared, the receiver's M with bit 0 its choice bit (Delta's
        bit 0 is 1, so M = K ^ u*Delta still holds, and the linear code keeps the form)."""
        if self.receiver:
            raw = np.frombuffer(self._ot._rand(-(-BASE // 8)), dtype=np.uint8)
            bits = np.unpackbits(raw, bitorder="little")[:BASE].copy()
            vals = np.ascontiguousarray(self._ot._iknp_receiver(bits)).view(_U64).reshape(BASE, 2)
            vals[:, 0] &= _CLEAR
            vals[:, 0] |= bits
            return bits, vals
        vals = np.ascontiguousarray(self._ot._iknp_sender(BASE)).view(_U64).reshape(BASE, 2)
        vals[:, 0] &= _CLEAR
        return None, vals

    def _position(self) -> tuple:
        """The next step's trees: (iteration's base, first tree, trees, hash tweak), starting
        a new iteration (base COTs: the previous one's reserve, or IKNP) when this one is done."""
        if self._tree >= TREES:
            bits, vals = self._reserve if self._reserve is not None else self._bootstrap()
            self._reserve = None
            u = None if bits is None else np.ascontiguousarray(bits[:K])
            self._base = (u, np.ascontiguousarray(vals[:K]).view(np.complex128).reshape(K),
                          None if bits is None else bits[K:BASE].reshape(TREES, DEPTH),
                          vals[K:BASE].reshape(TREES, DEPTH, 2))
            self._tree = 0
            self._iteration += 1
        first = self._tree
        g = min(GROUP, TREES - first)
        self._tree += g
        tweak = self._tweak
        self._tweak += g * DEPTH
        return self._base, first, g, tweak

    def _trees_of(self, where: tuple, expanded: tuple | None = None):
        """Sender: expand (or take `expanded`, _grow's made ahead) and send a step's trees
        (leaves kept); receiver: receive them."""
        base, first, g, tweak = where
        keys = base[3][first:first + g].reshape(-1, 2)
        if self.receiver:
            return self._receive(g)
        return self._trees(g, keys, tweak, (1 << 61) | self.direction, expanded)

    def _next_g(self) -> int:
        """The tree count of the step _position will give next (no state changed)."""
        return min(GROUP, TREES - (0 if self._tree >= TREES else self._tree))

    def _step(self) -> None:
        """The next GROUP trees' outputs. Pipelined: the sender expands and sends the trees of
        the step after this one before encoding this one, and the receiver takes them in after
        encoding, so neither waits for the other's tree expansion. With a step made ahead
        (_start_ahead), its outputs are joined here and the next step's trees exchanged: the
        same one exchange per step, at the same point of the protocol, on both parties."""
        if self._ahead is not None:
            made, expanded = self._join_ahead()
            self._keep(made)
            nxt = self._position()
            self._pending = (nxt, self._trees_of(nxt, expanded))
            return
        if self._pending is None:
            where = self._position()
            trees = self._trees_of(where)
        else:
            where, trees = self._pending
            self._pending = None
        if not self.receiver:
            nxt = self._position()
            self._pending = (nxt, self._trees_of(nxt))
        self._keep(self._local(where, trees))
        if self.receiver:
            nxt = self._position()
            self._pending = (nxt, self._trees_of(nxt))

    def _keep(self, made: tuple) -> None:
        bits, acc, reserve = made
        if reserve is not None:
            self._reserve = reserve
        self._out.append((bits, acc))
        self._have += acc.shape[0]
        self.produced += acc.shape[0]

    def _local(self, where: tuple, trees) -> tuple:
        """A step's work on this party alone (no message, no PRG draw: its trees are already
        exchanged): the receiver's puncturing and both parties' linear code. Returns (bits |
        None, values, the next iteration's base COTs | None)."""
        (u, table, tree_bits, tree_vals), first, g, tweak = where
        if self.receiver:
            keys = tree_vals[first:first + g].reshape(-1, 2)
            leaves = self._puncture(trees, g, tree_bits[first:first + g], keys, tweak,
                                    (1 << 61) | self.direction)
        else:
            leaves = trees
        count = g * LEAVES
        rows = _indices(first // GROUP, count)      # the same public matrix every iteration
        acc = leaves.reshape(count, 2)              # the step's own fresh array
        # the receiver's bits x = A*u ^ e ride in bit 0 of its values (u's and e's do)
        if self._kern is not None:
            bits = np.empty(count, dtype=np.uint8) if self.receiver else None
            self._kern.lpn_encode(acc, table, rows, D, bits)
        else:
            _encode(acc, table, rows, count)
            bits = (acc[:, 0] & _U64(1)).astype(np.uint8) if self.receiver else None
        reserve = None
        if first == 0:                          # an iteration's first step: the next base COTs
            reserve = (None if bits is None else bits[:BASE].copy(), acc[:BASE].copy())
            bits = None if bits is None else bits[BASE:]
            acc = acc[BASE:]
        return bits, acc, reserve

    # -- a step made ahead, on a thread of its own --------------------------------------------
    def _start_ahead(self) -> None:
        """After a hand-out: make the pending step's local work (_local) on a thread, so that
        it runs while this party waits for its peer or between inferences, and the next
        take finds it done. The thread touches only that step's own arrays and this pool's
        expander and hash, which nothing else uses until _join_ahead has joined it; it sends,
        receives and draws nothing, so the protocol's messages are the same with it or
        without it (and so are the outputs)."""
        if not self.ahead or self._ahead is not None or self._pending is None:
            return
        where, trees = self._pending
        self._pending = None
        box: dict = {"trees": trees}
        g_next = None if self.receiver else self._next_g()

        def run():
            try:
                box["made"] = self._local(where, trees)
                # the sender: the next step's trees (roots from its own stream, drawn in step
                # order: the thread is the stream's only user until joined); sent on the
                # main thread by the take that needs them, at the same point as ever
                box["expanded"] = None if g_next is None else self._grow(g_next)
            except BaseException as e:  # noqa: BLE001 - handed to the joining thread
                box["error"] = e
        thread = threading.Thread(target=run, name=f"ferret-ahead-{self.direction}", daemon=True)
        self._ahead = (thread, box)
        thread.start()

    def close(self) -> None:
        """Wait (deadline AHEAD_DEADLINE) for a step being made ahead and drop it with every
        COT not handed out, so no thread of this pool outlives the provider's close and
        nothing made here is used after it. A failed step's error is dropped with it (no take
        needs it now); a thread past the deadline is a ProtocolError, never a silent leak."""
        ahead, self._ahead = self._ahead, None
        self._closed = "the pool is closed (its provider was closed); make a new provider"
        self._out, self._have, self._pending = [], 0, None
        if ahead is None:
            return
        ahead[0].join(AHEAD_DEADLINE)
        if ahead[0].is_alive():
            raise ProtocolError(f"pairwise silent OT (direction {self.direction}): a step made "
                                f"ahead did not finish within {AHEAD_DEADLINE:.0f} s of close")

    def _join_ahead(self) -> tuple:
        """The step made ahead's outputs. A step that failed or did not finish leaves this
        pool out of step with its peer's (which kept that step's COTs), so every later take
        is refused too, never served COTs that do not match the peer's."""
        thread, box = self._ahead
        self._ahead = None
        thread.join(AHEAD_DEADLINE)
        if thread.is_alive() or "error" in box:
            self._closed = ("a step made ahead failed earlier, so this pool is out of step with "
                            "its peer's; make a new provider")
        if thread.is_alive():
            raise ProtocolError(f"pairwise silent OT (direction {self.direction}): a step made "
                                f"ahead did not finish within {AHEAD_DEADLINE:.0f} s; the "
                                "machine is overloaded or stuck")
        if "error" in box:
            raise box["error"]
        self.made_ahead += 1
        self.grown_ahead += box["expanded"] is not None
        return box["made"], box["expanded"]

    def _trees(self, g: int, keys: np.ndarray, tweak: int, domain: int,
               expanded: tuple | None = None) -> np.ndarray:
        """Sender: g fresh trees (or `expanded`, _grow's made ahead); sends their masked
        level sums and Delta ^ XOR(leaves). Leaves [LEAVES, g, 2] (_Expander's layout), bit 0
        cleared."""
        if expanded is None:
            expanded = self._grow(g)
        nodes, sums, total = expanded
        if nodes.shape[1] != g:         # pragma: no cover - _next_g and _position disagree
            raise ProtocolError(f"pairwise silent OT (direction {self.direction}): trees "
                                f"expanded ahead for {nodes.shape[1]} trees, the step has {g}")
        kb = keys.view(np.uint8).reshape(-1, 16)
        delta = self._ot._delta
        sums[:, :, 0] ^= self._hash(kb, tweak, domain).reshape(g, DEPTH, 2)
        sums[:, :, 1] ^= self._hash(kb, tweak, domain, xor=delta).reshape(g, DEPTH, 2)
        last = total ^ delta.view(_U64)
        payload = sums.tobytes() + last.tobytes()
        self.bytes_sent += len(payload)
        self._ot._send(payload)
        return nodes

    def _grow(self, g: int) -> tuple:
        """Sender: g trees from fresh roots (the roots stream): (leaves [LEAVES, g, 2], bit 0
        cleared; level sums [g, DEPTH, 2, 2]; the leaves' XOR [g, 2]). Sends and hashes nothing."""
        nodes = np.frombuffer(self._roots.update(bytes(16 * g)), dtype=_U64).reshape(1, g, 2)
        sums = np.empty((g, DEPTH, 2, 2), dtype=_U64)
        if self._aes is not None:       # in place, level sums fused, bit 0 cleared at the end
            roots, nodes = nodes, np.empty((LEAVES, g, 2), dtype=_U64)
            nodes[0] = roots[0]
            folds = np.empty((g, 2, 2), dtype=_U64)
            for level in range(DEPTH):
                self._aes.ggm_level(_KEYS[0], _KEYS[1], nodes, 1 << level, g, folds, None,
                                    level == DEPTH - 1)
                sums[:, level] = folds
            total = folds[:, 0] ^ folds[:, 1]       # the leaves' XOR, bit 0 cleared as theirs
            total[:, 0] &= _CLEAR
        else:
            for level in range(DEPTH):
                nodes = self._expand(nodes)
                half = nodes.shape[0] // 2
                sums[:, level, 0] = _fold(nodes[:half])
                sums[:, level, 1] = _fold(nodes[half:])
            nodes[:, :, 0] &= _CLEAR
            total = _fold(nodes)
        return nodes, sums, total

    def _receive(self, g: int) -> bytes:
        """Receiver: one step's level messages, checked for length."""
        data = self._ot._recv()
        need = g * (DEPTH * 32 + 16)
        if len(data) != need:
            raise ProtocolError(f"pairwise silent OT (direction {self.direction}): expected "
                                f"{need} bytes of GGM level messages for {g} trees, got "
                                f"{len(data)}; the parties are out of step")
        return data

    def _puncture(self, data: bytes, g: int, b: np.ndarray, keys: np.ndarray, tweak: int,
                  domain: int) -> np.ndarray:
        """Receiver: every leaf but alpha (bits: not b) from the level messages, then
        v_alpha = w_alpha ^ Delta; leaves [LEAVES, g, 2] as the sender's, bit 0 cleared but
        at alpha (Delta's bit 0: 1), so bit 0 of the leaves is the noise e."""
        sums = np.frombuffer(data, dtype=_U64, count=g * DEPTH * 4).reshape(g, DEPTH, 2, 2)
        last = np.frombuffer(data, dtype=_U64, offset=g * DEPTH * 32).reshape(g, 2)
        rows = np.arange(g)
        h = self._hash(keys.view(np.uint8).reshape(-1, 16), tweak, domain).reshape(g, DEPTH, 2)
        side = b.astype(np.intp)                                  # [g, DEPTH]: off-path sides
        known = sums[rows[:, None], np.arange(DEPTH)[None, :], side] ^ h  # [g, DEPTH, 2]
        alpha = 1 - side
        if self._aes is not None:
            return self._puncture_native(known, side, alpha, last, g)
        nodes = np.zeros((2, g, 2), dtype=_U64)
        nodes[side[:, 0], rows] = known[:, 0]
        path = alpha[:, 0].copy()                   # position of the punctured node
        for level in range(1, DEPTH):
            nodes = self._expand(nodes)
            w = nodes.shape[0] // 2
            nodes[path, rows] = 0                   # the unknown node's children: garbage
            nodes[w + path, rows] = 0
            parity = np.stack([_fold(nodes[:w]), _fold(nodes[w:])])   # [2, g, 2]
            s = side[:, level]
            nodes[s * w + path, rows] = known[:, level] ^ parity[s, rows]
            path = alpha[:, level] * w + path
        nodes[:, :, 0] &= _CLEAR
        nodes[path, rows] = last ^ _fold(nodes)     # the alpha leaf is still 0 here
        return nodes

    def _puncture_native(self, known, side, alpha, last, g: int) -> np.ndarray:
        """_puncture's tree walk with the native GGM level (in place; the unknown node's
        children zeroed and left out of the level sums in C; bit 0 cleared at the last level)."""
        rows = np.arange(g)
        nodes = np.empty((LEAVES, g, 2), dtype=_U64)
        nodes[:2] = 0
        nodes[side[:, 0], rows] = known[:, 0]
        path = alpha[:, 0].astype(np.int64)          # position of the punctured node
        folds = np.empty((g, 2, 2), dtype=_U64)
        for level in range(1, DEPTH):
            w = 1 << level
            final = level == DEPTH - 1
            self._aes.ggm_level(_KEYS[0], _KEYS[1], nodes, w, g, folds, path, final)
            s = side[:, level]
            sibling = known[:, level] ^ folds[rows, s]
            if final:
                sibling[:, 0] &= _CLEAR
            nodes[s * w + path, rows] = sibling
            path = alpha[:, level] * w + path
        total = folds[:, 0] ^ folds[:, 1] ^ sibling     # every leaf but alpha (still 0)
        total[:, 0] &= _CLEAR
        nodes[path, rows] = last ^ total
        return nodes

    # -- hand-out -----------------------------------------------------------------------------
    def take_parts(self, m: int) -> list[tuple]:
        """The next m COTs as the steps made them, without a copy: [(bits [c] uint8 | None,
        vals [c, 16] uint8)] (bits: the receiver's), c summing to m. The caller owns them."""
        if self._closed is not None:
            raise ProtocolError(f"pairwise silent OT (direction {self.direction}): {self._closed}")
        while self._have < m:
            self._step()
        pieces, got = [], 0
        while got < m:
            b, v = self._out[0]
            need = m - got
            if v.shape[0] <= need:
                self._out.pop(0)
            else:
                self._out[0] = (None if b is None else b[need:], v[need:])
                b, v = (None if b is None else b[:need]), v[:need]
            pieces.append((b, v.view(np.uint8).reshape(-1, 16)))
            got += v.shape[0]
        self._have -= m
        self._start_ahead()
        return pieces

    def take(self, m: int):
        """The next m COTs: receiver (bits [m] uint8, M [m, 16] uint8), sender K [m, 16] uint8."""
        pieces = self.take_parts(m)
        vals = [v for _, v in pieces]
        out = np.concatenate(vals) if len(vals) > 1 else np.ascontiguousarray(vals[0])
        if not self.receiver:
            return out
        bits = [b for b, _ in pieces]
        return (np.concatenate(bits) if len(bits) > 1 else np.ascontiguousarray(bits[0])), out
