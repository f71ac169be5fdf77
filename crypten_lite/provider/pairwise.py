"""Provider ``pairwise``: two parties make every correlation themselves, with no dealer.

Each party draws its own components of a correlation from its private PRG (a fresh seed
that never leaves the process), exactly as the dealer's parties do (correlations.derive).
What the dealer would compute from everybody's seeds, the products of the two parties'
values, is computed between the two parties with lattice homomorphic encryption
(provider/he.py): rank 0 encrypts its operands under its own key, rank 1 evaluates the cross
products with its own operands, adds a statistical mask and flooding noise, and rank 0
decrypts its share. Every cross product where one factor is a bit (AND triples, the bits of
truncation pairs, bit injection / B2A) is a correlated oblivious transfer instead
(provider/ot.py: IKNP extension over Ed25519 base OTs, and from ot.SILENT_MIN OTs on silent
COTs by LPN expansion, provider/ferret.py): the bit's owner chooses, the other party's value
is transferred under a one-time pad; 16 bytes per bit with IKNP, about half a byte silent,
plus the correction.

    kind              cross terms (rank 0's value x rank 1's value)      by
    triple, weight_triple   op(a0, b1) + op(a1, b0): batched (mul) or    HE
                            coefficient (matmul; conv2d direct, he_conv.py,
                            or by unfolding; conv_transpose by folding the
                            shares) encoding; a weight_triple's B (the fixed
                            weight mask) encrypted once and kept by the peer,
                            only the fresh A per inference (he_kept.py)
    square            a0 * 2 a1                                          HE
    bit               r0 * r1 (then ra = r - 2 r0 r1)                    OT, mod 2^64
    binary_triple     a0 & b1 ^ a1 & b0, bit by bit                      OT, mod 2
    trunc(_exact)     r = w0 XOR w1 bit by bit: w0_j * w1_j, 64 bits     OT, mod 2^64
    bit_mul           r0 * r1, and r0 (1 - 2 r1) a1 + (1 - 2 r0) a0 r1   OT both ways
    binary_monomials  AND of XOR-shared masks, one AND layer per exchange OT, mod 2: one
                      random OT per bit of each (top mask, chooser), reused

Messages between the two parties ride on the session's transport outside the online
statistics (the online protocols keep their rounds and bytes); every message is framed with
a sequence number, the request it belongs to and an HMAC under a key derived from the pair
seed both parties agreed in the transport's handshake, so a tampered, replayed or
misplaced message is a ProtocolError on both parties (the detecting party tells the other).
Every exchange ends with an acknowledgement, so no offline message is ever left for the
online protocol to read (and where rank 0's message ended the exchange, one back, so that
a tampered last message stops both parties in that exchange).

Working set: a correlation larger than the chunk budget (CRYPTEN_LITE_PAIRWISE_CHUNK_MB,
announced in the handshake) is made in slices streamed over its request's messages
(_chunked, elementwise / _matmul); prefetch makes small OT correlations of one kind and
parameters as one (_ot_groups), as it does small HE products (_elementwise_groups).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import os
import struct
import contextlib
import time
from typing import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F

from ..comm.communicator import OFFLINE_ERROR_TAG, with_tag
from ..config import Config
from ..errors import CommunicationError, ConfigError, ProtocolError
from ..random import PRG, canonical, derive_key, fresh_seed
from . import correlations, he, he_conv, he_kept, he_pow2, ot, pairwise_slices, store
from .pairwise_progress import PROGRESS_ENV, _Progress, progress_wanted  # noqa: F401 (re-exported)
from . import Correlation, Provider, _absolute, _relative, _spec
from .correlations import TRIPLE_OPS, _conv_params
from .pairwise_ot_kinds import (ELEMENT_BYTES as _ELEMENT_BYTES, OT_BYTES as _OT_BYTES,  # noqa: F401
                                _binary_monomials, _binary_triple, _bit, _bit_mul,
                                _drive_monomials, STEPS as _STEPS, _trunc,
                                _trunc_exact)

log = logging.getLogger("crypten_lite.provider")

MAGIC = b"CLPW"
VERSION = 1
HELLO, DATA, ACK, ERROR = 1, 2, 3, 4
_HEADER = struct.Struct("<4sBBQ32s")
_MAC = 32
BATCH_ELEMENTS = 1 << 16   # prefetch: small mul triples / squares share ciphertexts up to this
CHUNK_ENV = "CRYPTEN_LITE_PAIRWISE_CHUNK_MB"
CHUNK_MB = 128             # default working set of one offline exchange (CHUNK_ENV overrides)
_CT_UP, _CT_BACK = he.CT_BYTES, he.CT_BYTES   # bytes of a sent / a returned ciphertext
OT_DESCRIPTION = f"iknp;base=co15-ed25519;kappa={ot.KAPPA};hash=tmmo-aes128;prg=aes256ctr"
# the OT exchanges' message pattern (v2: small extensions from a bootstrapped silent pool, a
# monomial layer's transfers and bit_mul's products one message per party, an acknowledgement
# back where rank 0 ends an exchange; v3: bit and bit_mul on free-choice random OTs, their
# corrections one message per party, no flips; v4: a one-sided monomial request made half
# with its masks reversed, the other party choosing): a peer on a former pattern is refused
# at the handshake
OT_EXCHANGES = "exchanges=v4"
OT_ENV = "CRYPTEN_LITE_PAIRWISE_OT"   # ferret (default: silent OT for large extensions) or iknp


def ot_mode() -> str:
    """The OT extension this party proposes (CRYPTEN_LITE_PAIRWISE_OT; the handshake refuses
    a mismatch): 'ferret' (silent COTs from SILENT_MIN OTs up, provider/ferret.py) or 'iknp'."""
    mode = os.environ.get(OT_ENV, "") or "ferret"
    if mode not in ot.MODES:
        raise ConfigError(f"{OT_ENV}={mode!r}: use one of {', '.join(ot.MODES)} (default ferret)")
    return mode


def ot_description(mode: str) -> str:
    """The OT parameters both parties must share (compared in the handshake)."""
    if mode == "iknp":
        return f"{OT_DESCRIPTION};{OT_EXCHANGES}"
    from . import ferret
    return f"{OT_DESCRIPTION};{ferret.DESCRIPTION};silent_min={ot.SILENT_MIN};{OT_EXCHANGES}"


def _u(t: torch.Tensor) -> np.ndarray:
    """A ring tensor's elements as uint64 (a copy, contiguous)."""
    return t.detach().contiguous().clone().numpy().view(np.uint64)


def _t(a: np.ndarray, shape=None) -> torch.Tensor:
    out = torch.from_numpy(np.ascontiguousarray(a).view(np.int64).copy())
    return out.view(shape) if shape is not None else out


class PairwiseProvider(Provider):
    """Correlations made by the two parties alone (no dealer, no third process)."""

    name = "pairwise"

    def __init__(self, config: Config, comm):
        if config.world_size != 2:
            raise ConfigError(f"provider 'pairwise' runs exactly 2 parties, got world_size "
                              f"{config.world_size}; use the dealer provider for more")
        if comm is None or not getattr(comm, "pair_seeds", None) or (1 - config.rank) not in comm.pair_seeds:
            raise ConfigError("provider 'pairwise' needs the session's transport with a pair seed "
                              "agreed in its handshake (crypten_lite.init over gRPC)")
        self._seed = fresh_seed()  # private: never sent, never logged
        super().__init__(config, self._seed)
        self._comm = comm
        self._peer = 1 - config.rank
        self._session = config.session
        self._mac_key = derive_key(comm.pair_seeds[self._peer],
                                   f"crypten_lite/v1/pairwise-mac/{config.session}")
        self._masks = PRG(derive_key(self._seed, "crypten_lite/v1/pairwise-masks"))
        self._seq_out = 0
        self._seq_in = 0
        self._tag = b"\0" * 32
        self._last_sent = False   # this party's last offline message of an exchange: sent
        self._ready: dict[int, list[torch.Tensor]] = {}
        # the peer's kept weight ciphertexts, per (mask counter, op, shapes, params) (he_kept.py)
        self._kept: dict = {}
        # per kind (and op): [correlations, bytes both ways, seconds] (where the offline time goes)
        self.by_kind: dict[str, list] = {}
        self._broken: str | None = None
        self.stats.update({"pairwise_bytes_sent": 0, "pairwise_bytes_received": 0,
                           "pairwise_seconds": 0.0, "pairwise_made": 0})
        self.params = self._parameters()
        self._chunk = self._chunk_budget()
        self._ot_mode = self._ot_choice()
        self._progress: _Progress | None = None
        self._handshake(config)
        self._engine = he.CrossEngine(config.rank, self.params, self._send_data,
                                      self._recv_data, self._rand)
        self._ot_prg = PRG(derive_key(self._seed, "crypten_lite/v1/pairwise-ot"))
        self._ot = ot.CorrelatedOT(config.rank, self._send_data, self._recv_data, self._rand_bytes,
                                   chunk=max(8, self._chunk // _OT_BYTES // 8 * 8), mode=self._ot_mode)

    # ------------------------------------------------------------------ channel
    def _frame(self, kind: int, payload: bytes) -> bytes:
        head = _HEADER.pack(MAGIC, VERSION, kind, self._seq_out, self._tag)
        self._seq_out += 1
        body = head + payload
        return body + hmac.new(self._mac_key, body, hashlib.sha256).digest()

    def _send(self, kind: int, payload: bytes) -> None:
        frame = self._frame(kind, payload)
        self.stats["pairwise_bytes_sent"] += len(frame)
        tensor = torch.frombuffer(bytearray(frame), dtype=torch.uint8)
        if kind == ERROR:  # the peer may have left the exchange: marked for its online reads
            tensor = with_tag(tensor, OFFLINE_ERROR_TAG)
        self._comm._send(tensor, self._peer)

    def _recv(self, expected: int) -> bytes:
        tensor = self._comm._recv(self._peer)
        raw = tensor.numpy().tobytes() if tensor.dtype == torch.uint8 else b""
        self.stats["pairwise_bytes_received"] += len(raw)
        where = f"party {self.rank}: pairwise offline message {self._seq_in} from party {self._peer}"
        if len(raw) < _HEADER.size + _MAC:
            raise ProtocolError(f"{where} is malformed ({tensor.dtype}, {len(raw)} bytes): the "
                                "parties are out of step or the peer runs another provider")
        body, mac = raw[:-_MAC], raw[-_MAC:]
        if not hmac.compare_digest(mac, hmac.new(self._mac_key, body, hashlib.sha256).digest()):
            raise ProtocolError(f"{where} fails its integrity check (tampered in transit, or "
                                "not from this session)")
        magic, version, kind, seq, tag = _HEADER.unpack_from(body)
        if magic != MAGIC or version != VERSION:
            raise ProtocolError(f"{where}: unknown format {magic!r} v{version}")
        if seq != self._seq_in:
            raise ProtocolError(f"{where} carries sequence number {seq}: a replayed or "
                                "reordered message")
        self._seq_in += 1
        if kind == ERROR:
            self._broken = "the peer reported an error"
            raise ProtocolError(f"party {self.rank}: party {self._peer} stopped the pairwise offline "
                                f"exchange: {body[_HEADER.size:].decode(errors='replace')}")
        if tag != self._tag:
            raise ProtocolError(f"{where} belongs to another request (replayed or out of step)")
        if kind != expected:
            raise ProtocolError(f"{where} has type {kind}, expected {expected}")
        return body[_HEADER.size:]

    def _send_data(self, payload: bytes) -> None:
        self._last_sent = True            # before the send: a receive it causes comes later
        self._send(DATA, payload)

    def _recv_data(self) -> bytes:
        data = self._recv(DATA)
        self._last_sent = False
        return data

    def _rand(self, shape: tuple) -> np.ndarray:
        return self._masks.draw(tuple(shape)).numpy().view(np.uint64)

    def _rand_bytes(self, n: int) -> bytes:
        return self._ot_prg.draw((-(-n // 8),)).numpy().tobytes()[:n]

    def _exchange(self, tag_fields: tuple, fn: Callable[[], list[torch.Tensor]]) -> list[torch.Tensor]:
        """Run one request's exchange: framed messages, an acknowledgement at the end, and on
        any error an ERROR frame to the peer, so that both parties raise ProtocolError."""
        if self._broken:
            raise ProtocolError(f"party {self.rank}: the pairwise offline channel is unusable "
                                f"after an earlier error ({self._broken}); start a new session")
        self._tag = hashlib.sha256(canonical("pairwise/v1", *tag_fields)).digest()
        start = time.perf_counter()
        try:
            self._last_sent = False
            out = fn()
            # rank 0 acknowledges; where its own last message ended the exchange (the peer
            # checks it last), it says so and waits for the peer's acknowledgement too, so
            # that a tampered last message is a ProtocolError on both parties here
            if self.rank == 0:
                last = self._last_sent
                self._send(ACK, b"\x01" if last else b"")
                if last:
                    self._recv(ACK)
            else:
                flag = self._recv(ACK)
                if flag not in (b"", b"\x01"):
                    raise ProtocolError(f"party {self.rank}: malformed acknowledgement from "
                                        f"party {self._peer} ({len(flag)} bytes)")
                if flag:
                    self._send(ACK, b"")
            return out
        except CommunicationError:
            self._broken = "transport failure"
            raise
        except Exception as e:
            if self._broken is None:
                self._broken = type(e).__name__
                try:
                    self._send(ERROR, f"{type(e).__name__} at party {self.rank}".encode())
                except Exception:  # noqa: BLE001 (the peer may be gone: its own wait fails)
                    pass
            if isinstance(e, ProtocolError):
                raise
            raise ProtocolError(f"party {self.rank}: pairwise offline exchange failed: "
                                f"{type(e).__name__}: {e}") from e
        finally:
            self.stats["pairwise_seconds"] += time.perf_counter() - start

    def _parameters(self) -> he.HEParams:
        """The HE parameters this party proposes (the handshake refuses a mismatch)."""
        return he.default_params()

    def _ot_choice(self) -> str:
        """The OT extension this party proposes (the handshake refuses a mismatch)."""
        return ot_mode()

    def _chunk_budget(self) -> int:
        """The working-set budget this party proposes (the handshake refuses a mismatch)."""
        return chunk_bytes()

    def _encodings(self) -> str:
        """The product encodings this party uses (the handshake refuses a mismatch): the
        direct convolution layout (he_conv.py) and the kept weight ciphertexts (he_kept.py)."""
        return f"convlayout={he_conv.LAYOUT};weights={he_kept.VERSION}"

    def _handshake(self, config: Config) -> None:
        """Both parties send their parameters and refuse a mismatch (ProtocolError on both)."""
        hello = (f"{self.params.describe()};security={he.SECURITY};ot={ot_description(self._ot_mode)};"
                 f"chunk={self._chunk};{self._encodings()}")
        self._tag = hashlib.sha256(b"pairwise-hello/v1").digest()
        self._send(HELLO, hello.encode())
        got = self._recv(HELLO).decode(errors="replace")
        if got != hello:
            self._broken = "parameter mismatch"
            raise ProtocolError(
                f"party {self.rank}: provider 'pairwise' parameters differ between the parties "
                f"(this party: {hello}; party {self._peer}: {got[:300]}); "
                f"install the same crypten_lite and TenSEAL versions on both, with the same "
                f"{CHUNK_ENV} and {OT_ENV} (or neither set)")

    # ------------------------------------------------------------------ requests
    def get(self, kind: str, shapes, op: str = "", params=()) -> Correlation:
        spec = _spec(kind, op, shapes, params)
        _, _, shapes, params = spec
        counter = self._next_counter(spec)
        self.stats["requests"] += 1
        if self._recording is not None:
            self._record_index[counter] = len(self._recording)
            self._recording.append(_relative(spec, self._record_index))
        parts = self._ready.pop(counter, None)
        if parts is not None:
            self.stats["prefetched"] += 1
        else:
            parts = self._make(counter, kind, op, shapes, params)
        return Correlation(parts, None)

    def _drop_prefetched(self) -> None:
        self._ready = {}

    def prefetch(self, plan: list[tuple]) -> None:
        """Offline phase: both parties make every planned correlation now (with a progress
        line on stderr for long phases, CRYPTEN_LITE_PROGRESS=1 to force it)."""
        start = max(self.counter, self._plan_start + len(self._plan))
        self.counter = start
        self._plan = [_absolute(_spec(*entry), start) for entry in plan]
        self._plan_start = start
        self._drop_prefetched()
        work = [_work(kind, op, shapes, params) for kind, op, shapes, params in self._plan]
        weights = [w for _, w in work]
        progress = _Progress(weights, self.stats, self.rank, classes=[c for c, _ in work])
        self._progress = progress
        done = units = 0
        try:
            batches = [(self._make_elementwise, g) for g in self._elementwise_groups()]
            batches += [(self._make_weight_batch, g) for g in self._weight_groups()]
            batches += self._ot_batches(self._ot_groups())
            for make, group in batches:
                make(start, group)
                done += len(group)
                units += sum(weights[i] for i in group)
                progress.step(done, units, group)
            for i, (kind, op, shapes, params) in enumerate(self._plan):
                if start + i in self._ready:
                    continue
                progress.current, progress.current_class = weights[i], work[i][0]
                self._ready[start + i] = self._make(start + i, kind, op, shapes, params)
                done += 1
                units += weights[i]
                progress.step(done, units, [i])
        finally:
            self._progress = None
            progress.done()

    # ------------------------------------------------------------------ offline store
    def _store_header(self, plan: list) -> dict:
        """The public binding of a store: this party and its peer, the plan's digest."""
        digest = hashlib.sha256(canonical("pairwise-store-plan/v1", len(plan),
                                          [[k, o, list(sh), list(p)] for k, o, sh, p in
                                           (_spec(*e) for e in plan)])).hexdigest()
        return {"rank": self.rank, "peer": self._peer, "plan": digest,
                "parties": [f"party{r}" for r in range(2)]}

    def save_store(self, plan: list, directory: str, key_file: str | None = None) -> dict:
        """After prefetch(plan): write this party's components of the plan to its own store
        (provider/store.py) and drop them here, so this session never uses them. The store id
        is derived from this session's pair seed (both parties get the same id, nobody else
        can). Returns the store's header."""
        header = self._store_header(plan)
        token = derive_key(self._comm.pair_seeds[self._peer],
                           f"crypten_lite/v1/pairwise-store/{self._session}/{self._plan_start}")
        header["store_id"] = hashlib.sha256(b"store-id" + token).hexdigest()[:32]
        entries = [self._ready.pop(self._plan_start + i, None) for i in range(len(self._plan))]
        self._drop_prefetched()
        if len(self._plan) != len(plan) or any(e is None for e in entries):
            raise ProtocolError(f"party {self.rank}: save_store right after prefetch of the same "
                                "plan: some of its correlations were already used")
        key = store.load_key(key_file, self.rank, create=True)
        store.save(store.resolve_dir(directory, self.rank), key, header, entries, token)
        return header

    def load_store(self, plan: list, directory: str, key_file: str | None = None) -> str:
        """Instead of prefetch(plan): claim, read, delete and verify this party's store of the
        plan; its correlations take the plan's next counters. Returns the proof that this
        party holds the store (a hash of the pair's secret store token and this session's id:
        equal on both parties only if the peer holds the other half of the same store; the
        caller compares them before any correlation is used)."""
        start = max(self.counter, self._plan_start + len(self._plan))
        self.counter = start
        self._plan = [_absolute(_spec(*entry), start) for entry in plan]
        self._plan_start = start
        self._drop_prefetched()
        expect = self._store_header(plan)
        key = store.load_key(key_file, self.rank, create=False)
        header, entries, token = store.load(store.resolve_dir(directory, self.rank), key,
                                            self.rank, expect)
        if len(entries) != len(plan):
            raise ProtocolError(f"party {self.rank}: offline store holds {len(entries)} entries "
                                f"for a plan of {len(plan)}")
        for i, parts in enumerate(entries):
            self._ready[start + i] = parts
        self.stats["stored"] = self.stats.get("stored", 0) + len(entries)
        return hashlib.sha256(canonical("pairwise-store-proof/v1", token.hex(),
                                        self._session)).hexdigest()

    def drop_store(self) -> None:
        """Forget the loaded store's correlations (the peer refused its own)."""
        self._drop_prefetched()

    def _elementwise_groups(self) -> list[list[int]]:
        """Plan positions of the small elementwise HE correlations (mul triples, squares),
        in groups of at most BATCH_ELEMENTS elements: each group shares its ciphertexts (one
        exchange), where one request alone would fill a fraction of a ciphertext's slots."""
        groups, current, size = [], [], 0
        for i, (kind, op, shapes, params) in enumerate(self._plan):
            if not ((kind == "triple" and op == "mul") or kind == "square"):
                continue
            n = math.prod(torch.broadcast_shapes(*[tuple(s) for s in shapes]))
            if n >= BATCH_ELEMENTS // 2:
                continue                          # fills its own ciphertexts
            if size + n > BATCH_ELEMENTS and current:
                groups.append(current)
                current, size = [], 0
            current.append(i)
            size += n
        if current:
            groups.append(current)
        return [g for g in groups if len(g) > 1]

    def _make_elementwise(self, start: int, group: list[int]) -> None:
        """The cross products of a group of mul triples / squares in one exchange."""
        entries, firsts, seconds = [], [], []
        for i in group:
            kind, op, shapes, params = self._plan[i]
            correlations.check_request(kind, op, shapes, params, self.world_size,
                                       self._comm_max_bytes())
            parts = correlations.derive(self._key, start + i, kind, op, shapes, params)
            if kind == "triple":
                a, b = torch.broadcast_tensors(parts[0], parts[1])
                x, y = (a, b) if self.rank == 0 else (b, a)       # a0 b1 + b0 a1
            else:
                a = parts[0]
                x, y = (a if self.rank == 0 else a * 2), torch.zeros_like(a)   # a0 (2 a1)
            entries.append((i, kind, params, parts, x.shape))
            firsts.append(_u(x).reshape(-1))
            seconds.append(_u(y).reshape(-1))
        tag = (start + group[0], "elementwise-batch", [start + i for i in group])
        with self._counted("elementwise batch", len(group)):
            (cross,) = self._exchange(tag, lambda: [_t(self._engine.elementwise(
                [np.concatenate(firsts), np.concatenate(seconds)], 129))])
            offset = 0
            for i, kind, params, parts, shape in entries:
                n = math.prod(shape)
                c = cross[offset:offset + n].view(shape)
                offset += n
                if kind == "triple":
                    self._ready[start + i] = [parts[0], parts[1], TRIPLE_OPS["mul"](parts[0], parts[1], params) + c]
                else:
                    self._ready[start + i] = [parts[0], parts[0] * parts[0] + c]

    def _weight_groups(self) -> list[list[int]]:
        """Plan positions of the weight triples with a kept layout (he_kept.py), in groups
        whose ciphertexts fit the chunk budget: each group is one exchange (the B shares not
        kept yet up in one message each way, every product back in one, one
        acknowledgement), where each triple alone pays its own (a fresh model's first
        inference: LeNet's five layers, three messages from each party instead of fifteen,
        and products of several layers side by side in one returned ciphertext). Public
        shapes and the kept entries only: the same on both parties."""
        cache = self._kept
        groups, current = [], []
        for i, (kind, op, shapes, params) in enumerate(self._plan):
            if kind != "weight_triple":
                continue
            item = (params[0], op, tuple(shapes[0]), tuple(shapes[1]), tuple(params[1:]))
            if not he_kept.keeps(self._engine, cache, self._chunk, [item]):
                continue   # no kept layout, or past the budget alone: made as any triple
            if current and not he_kept.keeps(self._engine, cache, self._chunk,
                                             [it for _, it in current] + [item]):
                groups.append([j for j, _ in current])
                current = []
            current.append((i, item))
        if current:
            groups.append([j for j, _ in current])
        return [g for g in groups if len(g) > 1]

    def _weight_mask(self, shapes, params) -> torch.Tensor:
        """This party's share of a weight triple's B: the weight mask of its mask counter
        (params[0]) for the weight's shape (shapes[1])."""
        return correlations.derive(self._key, params[0], "weight_mask", "", [tuple(shapes[1])], ())[0]

    def _make_weight_batch(self, start: int, group: list[int]) -> None:
        """A group of weight triples with kept B in one exchange (he_kept.cross_many); were
        the kept total reached meanwhile, each is made as any triple, in the same exchange."""
        entries, items = [], []
        for i in group:
            kind, op, shapes, params = self._plan[i]
            correlations.check_request(kind, op, shapes, params, self.world_size,
                                       self._comm_max_bytes())
            a = correlations.derive(self._key, start + i, kind, op, shapes, params)[0]
            b = self._weight_mask(shapes, params)
            entries.append((i, op, a, b, tuple(params[1:])))
            items.append((params[0], op, _u(a).reshape(a.shape), _u(b).reshape(b.shape), tuple(params[1:])))
        tag = (start + group[0], "weight-batch", [start + i for i in group])

        def make() -> list[torch.Tensor]:
            kept = he_kept.cross_many(self._engine, self._kept, self._chunk, items)
            out = []
            for j, (i, op, a, b, p) in enumerate(entries):
                local = TRIPLE_OPS[op](a, b, p)
                cross = self.bilinear(op, a, b, p) if kept is None else _t(kept[j]).view(local.shape)
                out.append(local + cross)
            return out
        with self._counted("weight_triple batch", len(group)):
            cs = self._exchange(tag, make)
            for (i, op, a, b, p), c in zip(entries, cs):
                self._ready[start + i] = [a, c]

    def _ot_groups(self) -> list[list[int]]:
        """Plan positions of small elementwise OT correlations (_ELEMENT_BYTES' kinds) with
        the same kind and parameters, in groups of at most half the chunk budget: each group
        is made as one correlation over the concatenated elements (one exchange), where each
        alone would pay a request's fixed round trips (LeNet's small comparisons)."""
        open_: dict[tuple, list] = {}
        groups = []
        for i, (kind, op, shapes, params) in enumerate(self._plan):
            per = _ELEMENT_BYTES.get(kind)
            if per is None:
                continue
            n = math.prod(tuple(shapes[0]))
            if any(math.prod(tuple(s)) != n for s in shapes):
                continue
            size = n * per(params)
            if size > self._chunk // 4:
                continue                          # large enough to be made alone
            key = (kind, tuple(params), len(shapes))
            current = open_.setdefault(key, [[], 0])
            if current[1] + size > self._chunk // 2 and current[0]:
                groups.append(current[0])
                current = open_[key] = [[], 0]
            current[0].append(i)
            current[1] += size
        groups += [g for g, _ in open_.values()]
        return sorted((g for g in groups if len(g) > 1), key=lambda g: g[0])

    def _make_ot_batch(self, start: int, group: list[int]) -> None:
        """A group of small OT correlations of one kind and parameters as one correlation
        over their concatenated elements (each request keeps its own derived components)."""
        kind, op, shapes, params = self._plan[group[0]]
        entries, joined = self._joined(start, group)
        total = joined[0].numel()
        tag = (start + group[0], "ot-batch", kind, list(params), [start + i for i in group])
        with self._counted(f"{kind} batch", len(group)):
            out = self._exchange(tag, lambda: self._chunked(_MAKERS[kind], kind, joined, op,
                                                            [(total,)] * len(shapes), params))
            self._unjoin(start, entries, out)

    def _joined(self, start: int, group: list[int]) -> tuple[list, list[torch.Tensor]]:
        """A group of requests of one kind and parameters, each checked and derived: their
        entries (plan position, shape of the first component, derived components) and each
        component's elements of all of them concatenated (made as one correlation)."""
        kind, op, _, params = self._plan[group[0]]
        entries = []
        for i in group:
            shapes_i = self._plan[i][2]
            correlations.check_request(kind, op, shapes_i, params, self.world_size,
                                       self._comm_max_bytes())
            entries.append((i, tuple(shapes_i[0]),
                            correlations.derive(self._key, start + i, kind, op, shapes_i, params)))
        joined = [torch.cat([parts[j].reshape(-1) for _, _, parts in entries])
                  for j in range(len(entries[0][2]))]
        return entries, joined

    def _unjoin(self, start: int, entries: list, out: list[torch.Tensor]) -> None:
        """Each request of a joined group gets its own range of the made components: views
        (no copy; the ranges are disjoint, so each request's memory is its own), cut by one
        split per component, reshaped only where the request is not 1-D."""
        sizes = [math.prod(shape) for _, shape, _ in entries]
        cut = [o.reshape(-1).split(sizes) for o in out]
        for k, (i, shape, _) in enumerate(entries):
            self._ready[start + i] = [c[k] if len(shape) == 1 else c[k].view(shape) for c in cut]

    @contextlib.contextmanager
    def _counted(self, name: str, count: int) -> Iterator[None]:
        """Counts `count` correlations made by the block in stats and by_kind[name] (with
        the bytes both ways and the seconds the block's exchanges took); nothing if it raises."""
        moved = self.stats["pairwise_bytes_sent"] + self.stats["pairwise_bytes_received"]
        seconds = self.stats["pairwise_seconds"]
        yield
        self.stats["pairwise_made"] += count
        row = self.by_kind.setdefault(name, [0, 0, 0.0])
        row[0] += count
        row[1] += self.stats["pairwise_bytes_sent"] + self.stats["pairwise_bytes_received"] - moved
        row[2] += self.stats["pairwise_seconds"] - seconds

    def _ot_batches(self, groups: list[list[int]]) -> list[tuple]:
        """prefetch's (maker, plan positions) for the OT groups: groups of the kinds made as
        generators (_STEPS: binary_monomials, bit, bit_mul), of any parameters, are made
        together, in bins of at most half the chunk budget (_make_ot_bins: one exchange, one
        message per party per round for all of them); the other groups one exchange each
        (_make_ot_batch)."""
        out, bins, size = [], [[]], 0
        for g in groups:
            kind, _, shapes, params = self._plan[g[0]]
            if kind not in _STEPS:
                out.append((self._make_ot_batch, g))
                continue
            n = sum(math.prod(tuple(self._plan[i][2][0])) for i in g) * _ELEMENT_BYTES[kind](params)
            if bins[-1] and size + n > self._chunk // 2:
                bins.append([])
                size = 0
            bins[-1].append(g)
            size += n
        for b in bins:
            if len(b) == 1:
                out.append((self._make_ot_batch, b[0]))
            elif b:
                out.append((lambda start, flat, b=b: self._make_ot_bins(start, b),
                            [i for g in b for i in g]))
        return sorted(out, key=lambda e: e[1][0])

    def _make_ot_bins(self, start: int, groups: list[list[int]]) -> None:
        """Groups of small OT requests (_STEPS' kinds), each group of one kind and parameter
        set made as one correlation over its concatenated elements (as _make_ot_batch), all
        groups in one exchange driven in lockstep (_drive_monomials)."""
        work = [self._joined(start, group) + self._plan[group[0]][::3] for group in groups]
        flat = [start + i for g in groups for i in g]
        tag = (flat[0], "ot-bins", [[start + i for i in g] for g in groups])
        with self._counted("ot bins", len(flat)):
            outs = self._exchange(tag, lambda: _drive_monomials(
                self, [_STEPS[kind](self, joined, params) for _, joined, kind, params in work]))
            for (entries, _, _, _), out in zip(work, outs):
                self._unjoin(start, entries, out)

    def wait_prefetched(self) -> None:
        """Nothing to wait for: prefetch() returns once every correlation is made."""

    def _make(self, counter: int, kind: str, op: str, shapes, params) -> list[torch.Tensor]:
        correlations.check_request(kind, op, shapes, params, self.world_size,
                                   self._comm_max_bytes())
        parts = correlations.derive(self._key, counter, kind, op, shapes, params)
        if kind == "weight_mask":  # each party's own component: nothing to exchange
            return parts
        maker = _MAKERS.get(kind)
        if maker is None:
            raise ProtocolError(f"party {self.rank}: provider 'pairwise' has no protocol for "
                                f"correlation kind {kind!r}")
        with self._counted(f"{kind}/{op}" if op else kind, 1):
            out = self._exchange((counter, kind, op, [list(s) for s in shapes], list(params)),
                                 lambda: self._chunked(maker, kind, parts, op, shapes, params))
        return out

    # ------------------------------------------------------------------ bounded working set
    def set_chunk_bytes(self, nbytes: int) -> None:
        """Change the working-set budget of the offline exchanges (default: chunk_bytes()).
        Both parties must call it with the same value at the same point of the program (as
        with every collective); the slices follow from it, so a mismatch is a ProtocolError."""
        if nbytes < 1:
            raise ConfigError(f"party {self.rank}: pairwise chunk budget {nbytes} bytes: use at least 1")
        self._chunk = int(nbytes)
        self._ot.chunk = max(8, self._chunk // _OT_BYTES // 8 * 8)

    def _within(self, fraction: float) -> None:
        """Progress inside one large correlation (the progress line keeps counting)."""
        if self._progress is not None:
            self._progress.within(fraction)

    def _chunked(self, maker: Callable, kind: str, parts, op: str, shapes, params) -> list[torch.Tensor]:
        """Make an elementwise OT correlation in slices of at most `self._chunk` bytes of
        working set (_ELEMENT_BYTES): each slice is the same correlation on fewer elements,
        its messages streamed in this request's exchange. Both parties slice alike (from the
        public shapes and the chunk size both announced in the handshake)."""
        per = _ELEMENT_BYTES.get(kind)
        n = parts[0].numel() if parts else 0
        if per is None or any(p.numel() != n for p in parts):
            return maker(self, parts, op, shapes, params)
        step = max(1, self._chunk // per(params))
        if n <= step:
            return maker(self, parts, op, shapes, params)
        flat = [p.reshape(-1) for p in parts]
        pieces = []
        for s in range(0, n, step):
            sub = [p[s:s + step] for p in flat]
            size = sub[0].numel()
            pieces.append(maker(self, sub, op, [(size,)] * len(shapes), params))
            self._within((s + size) / n)
        shape = tuple(shapes[0])
        return [torch.cat([piece[i] for piece in pieces]).view(shape) for i in range(len(pieces[0]))]

    def _he_elements(self, terms: int, bound_bits: int) -> int:
        """Elements per elementwise HE exchange within the chunk budget (whole ciphertexts)."""
        nd = self.params.n
        per_block = self.params.primes_for(bound_bits) * (terms * _CT_UP + _CT_BACK)
        return nd * max(1, self._chunk // per_block)

    def _he_matmul_bytes(self, bsz: int, m: int, k: int, n: int, bound_bits: int) -> int:
        """Ciphertext bytes (both ways) of one engine.matmul call (he.py's block choice)."""
        nd = self.params.n  # one Z_2^64 set of ciphertexts (he_pow2.py): bound_bits sets no prime count

        def one(m_: int, n_: int, joint: bool) -> int:
            _, mw, kw, nw = he._blocks_cost(m_, k, n_, nd, joint=joint)
            mb, kb, nb = -(-m_ // mw), -(-k // kw), -(-n_ // nw)
            return (mb * kb + (kb * nb if joint else 0) + mb * nb) * he_pow2.CT_BYTES
        if he.split_products(m, k, n, nd):
            per = 2 * (one(n, m, False) if he.split_transposed(m, k, n, nd) else one(m, n, False))
        else:
            per = one(m, n, True)
        return bsz * per

    def _matmul(self, lhs: np.ndarray, rhs: np.ndarray, bound_bits: int) -> np.ndarray:
        """engine.matmul in pieces of at most `self._chunk` ciphertext bytes, halved along
        the batch, m, k (the pieces' products summed) or n as pairwise_slices.best_split
        finds fewest bytes (the same on both parties). bound_bits: 129 + log2(k) bits, a
        k-piece's own bound from its k."""
        base = bound_bits - _log2(lhs.shape[2])
        memos = self.__dict__.setdefault("_slice_memos", {})
        memo = memos.setdefault((self._chunk, base), {})
        return self._matmul_pieces(lhs, rhs, base, memo)

    def _matmul_pieces(self, lhs: np.ndarray, rhs: np.ndarray, base: int, memo: dict) -> np.ndarray:
        bsz, m, k = lhs.shape
        n = rhs.shape[2]
        _, d = pairwise_slices.best_split(
            (bsz, m, k, n), lambda b_, m_, k_, n_: self._he_matmul_bytes(b_, m_, k_, n_, base + _log2(k_)),
            self._chunk, memo)
        if d is None:
            return self._engine.matmul(np.ascontiguousarray(lhs), np.ascontiguousarray(rhs),
                                       base + _log2(k))
        h = (bsz, m, k, n)[d] // 2
        if d == 0:
            parts = [(lhs[:h], rhs[:h]), (lhs[h:], rhs[h:])]
        elif d == 1:
            parts = [(lhs[:, :h], rhs), (lhs[:, h:], rhs)]
        elif d == 2:
            parts = [(lhs[:, :, :h], rhs[:, :h]), (lhs[:, :, h:], rhs[:, h:])]
        else:
            parts = [(lhs, rhs[:, :, :h]), (lhs, rhs[:, :, h:])]
        out = [self._matmul_pieces(a, b, base, memo) for a, b in parts]
        if d == 2:                  # shares of the two partial products: their sum
            with np.errstate(over="ignore"):
                return out[0] + out[1]
        return np.concatenate(out, axis=(0, 1, 1, 2)[d])

    def _comm_max_bytes(self) -> int:
        config = getattr(self._comm, "config", None)
        return int(getattr(config, "max_message_bytes", 1 << 31))

    # ------------------------------------------------------------------ cross products
    def elementwise(self, terms: list[torch.Tensor], bound_bits: int) -> torch.Tensor:
        """Share of Sum_j x0_j * x1_j (flattened, int64 mod 2^64), in exchanges of at most
        the chunk budget's ciphertexts."""
        flat = [_u(t).reshape(-1) for t in terms]
        n = flat[0].size
        step = self._he_elements(len(flat), bound_bits)
        if n <= step:
            return _t(self._engine.elementwise(flat, bound_bits))
        out = np.empty(n, dtype=np.uint64)
        for s in range(0, n, step):
            out[s:s + step] = self._engine.elementwise([f[s:s + step] for f in flat], bound_bits)
            self._within(min(n, s + step) / n)
        return _t(out)

    def cross_and(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """XOR shares of x0 & y1 ^ x1 & y0 for bits (uint64 0/1 arrays of one shape): rank 0
        passes (x0, y0), rank 1 (y1, x1) ordered so that the terms pair up. Two correlated
        OTs per bit, rank 1 choosing (provider/ot.py)."""
        share = self.ot_product(np.concatenate([x.reshape(-1), y.reshape(-1)]), 1, 1)
        half = x.size
        return (share[:half] ^ share[half:]).reshape(x.shape)

    def ot_product(self, mine: np.ndarray, chooser: int, width: int) -> np.ndarray:
        """Shares of c * x elementwise by correlated OT: party `chooser` passes its bits c,
        the other its values x; width 64: additive mod 2^64, width 1: XOR shares of c & x."""
        return self._ot.product(mine, chooser, width)

    def bilinear(self, op: str, a: torch.Tensor, b: torch.Tensor, p) -> torch.Tensor:
        """Share of op(a0, b1) + op(a1, b0) (a, b: this party's operands). An empty operand
        (shapes are public: both parties take this branch) makes the zero product, with
        nothing to exchange: the HE packing of an empty operand failed and left the channel
        refusing every later request."""
        if a.numel() == 0 or b.numel() == 0:
            return torch.zeros(correlations.triple_shape(op, a.shape, b.shape, tuple(p)), dtype=torch.int64)
        return _CROSS[op](self, a, b, tuple(p))

    def close(self) -> None:
        self._ready = {}
        self._kept = {}      # the peer's kept weight ciphertexts (he_kept.py)
        try:
            self._engine.close()
        finally:
            self._ot.close()     # joins a silent OT step made ahead on a thread (ferret.py)


# ---------------------------------------------------------------------- bilinear ops
def _log2(k: int) -> int:
    return max(0, math.ceil(math.log2(max(1, k))))


def _cross_mul(pv: PairwiseProvider, a, b, p):
    a, b = torch.broadcast_tensors(a, b)
    terms = [a, b] if pv.rank == 0 else [b, a]
    return pv.elementwise(terms, 129).view(a.shape)


def _cross_matmul(pv: PairwiseProvider, a, b, p):
    squeeze_a, squeeze_b = a.dim() == 1, b.dim() == 1
    if squeeze_a:
        a = a.unsqueeze(0)
    if squeeze_b:
        b = b.unsqueeze(-1)
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    lhs = _u(a.expand(*batch, m, k)).reshape(-1, m, k)
    rhs = _u(b.expand(*batch, k, n)).reshape(-1, k, n)
    out = _t(pv._matmul(lhs, rhs, 129 + _log2(k))).view(*batch, m, n)
    if squeeze_a:
        out = out.squeeze(-2)
    if squeeze_b:
        out = out.squeeze(-1)
    return out


def _unfold_index(channels: int, size: tuple, kernel, dilation, padding, stride) -> torch.Tensor:
    """Positions (1-based, 0 = padding) of F.unfold's columns in a [channels, *size] input."""
    probe = torch.arange(1, channels * size[0] * size[1] + 1, dtype=torch.float64)
    cols = F.unfold(probe.view(1, channels, *size), kernel, dilation=dilation, padding=padding,
                    stride=stride)
    return cols[0].round().to(torch.int64)  # [channels*kh*kw, L]


def _as_conv2d(op: str, a, b, p):
    """conv1d as conv2d on a height-1 input; returns (a, b, stride, padding, dilation, groups)."""
    if op == "conv1d":
        cp = _conv_params(p, 1)
        return (a.unsqueeze(2), b.unsqueeze(2), (1, cp["stride"][0]), (0, cp["padding"][0]),
                (1, cp["dilation"][0]), cp["groups"])
    cp = _conv_params(p, 2)
    return a, b, cp["stride"], cp["padding"], cp["dilation"], cp["groups"]


def _cross_conv(pv: PairwiseProvider, a, b, p, op: str):
    x, w, stride, padding, dilation, groups = _as_conv2d(op, a, b, p)
    bsz, cin, h, wd = x.shape
    cout, cg, kh, kw = w.shape
    if he_conv.preferred(x.shape, w.shape, stride, padding, dilation, groups, pv.params.n):
        out = he_conv.cross_conv(pv._engine, pv._chunk, _u(x), _u(w), tuple(stride), tuple(padding),
                                 tuple(dilation), 129 + _log2(cg * kh * kw))   # Cheetah-style
        return _t(out).reshape(correlations.triple_shape(op, tuple(a.shape), tuple(b.shape), p))
    idx = _unfold_index(cin, (h, wd), (kh, kw), dilation, padding, stride)  # [cin*kh*kw, L]
    flat = torch.cat([torch.zeros(bsz, 1, dtype=torch.int64), x.reshape(bsz, -1)], dim=1)
    cols = flat[:, idx]                                                   # [B, cin*kh*kw, L]
    L = cols.shape[-1]
    kdim = cg * kh * kw
    cols = cols.view(bsz, groups, kdim, L).permute(1, 2, 0, 3).reshape(groups, kdim, bsz * L)
    wm = w.reshape(groups, cout // groups, kdim)
    out = _t(pv._matmul(_u(wm), _u(cols), 129 + _log2(kdim)))  # [g, cout/g, B*L]
    out = out.view(groups, cout // groups, bsz, L).permute(2, 0, 1, 3).reshape(bsz, cout, L)
    shape = correlations.triple_shape(op, tuple(a.shape), tuple(b.shape), p)
    return out.reshape(shape)


def _cross_conv_transpose(pv: PairwiseProvider, a, b, p):
    stride, padding, out_pad, dilation, groups = p[0:2], p[2:4], p[4:6], p[6:8], p[8]
    bsz, cin, h, wd = a.shape
    _, cog, kh, kw = b.shape
    shape = correlations.triple_shape("conv_transpose2d", tuple(a.shape), tuple(b.shape), p)
    cout, hout, wout = shape[1], shape[2], shape[3]
    cig = cin // groups
    lhs = b.reshape(groups, cig, cog * kh * kw).transpose(1, 2)        # [g, cog*kh*kw, cig]
    rhs = a.reshape(bsz, groups, cig, h * wd).permute(1, 2, 0, 3).reshape(groups, cig, bsz * h * wd)
    cols = _t(pv._matmul(_u(lhs), _u(rhs), 129 + _log2(cig)))   # [g, cog*kh*kw, B*L]
    cols = cols.view(groups, cog * kh * kw, bsz, h * wd).permute(2, 0, 1, 3)
    cols = cols.reshape(bsz, cout * kh * kw, h * wd)
    idx = _unfold_index(cout, (hout, wout), (kh, kw), tuple(dilation), tuple(padding), tuple(stride))
    if idx.shape[-1] != h * wd:
        raise ProtocolError(f"conv_transpose2d of shapes {tuple(a.shape)}, {tuple(b.shape)}: "
                            "unexpected fold geometry")
    out = torch.zeros(bsz, cout * hout * wout + 1, dtype=torch.int64)
    out.index_add_(1, idx.reshape(-1), cols.reshape(bsz, -1))
    return out[:, 1:].reshape(shape)


_CROSS = {
    "mul": _cross_mul,
    "matmul": _cross_matmul,
    # a @ b^T (a weight used in both layouts, as GPT-2's tied embedding): matmul on b's transpose
    "linear": lambda pv, a, b, p: _cross_matmul(pv, a, b.transpose(-1, -2), p),
    "conv1d": lambda pv, a, b, p: _cross_conv(pv, a, b, p, "conv1d"),
    "conv2d": lambda pv, a, b, p: _cross_conv(pv, a, b, p, "conv2d"),
    "conv_transpose2d": _cross_conv_transpose,
}


# ---------------------------------------------------------------------- kinds
def _triple(pv: PairwiseProvider, parts, op, shapes, params):
    a, b = parts[0], parts[1]
    c = TRIPLE_OPS[op](a, b, params) + pv.bilinear(op, a, b, params)
    return [a, b, c]


def _weight_triple(pv: PairwiseProvider, parts, op, shapes, params):
    b = pv._weight_mask(shapes, params)
    a = parts[0]
    # the peer's B (the weight mask) encrypted once and kept (he_kept.py), else as any triple
    kept = he_kept.cross(pv._engine, pv._kept, pv._chunk, params[0],
                         op, _u(a).reshape(a.shape), _u(b).reshape(b.shape), tuple(params[1:]))
    local = TRIPLE_OPS[op](a, b, params[1:])
    cross = pv.bilinear(op, a, b, params[1:]) if kept is None else _t(kept).view(local.shape)
    return [a, local + cross]


def _square(pv: PairwiseProvider, parts, op, shapes, params):
    a = parts[0]
    other = a if pv.rank == 0 else a * 2
    return [a, a * a + pv.elementwise([other], 128).view(a.shape)]


_MAKERS = {
    "triple": _triple, "weight_triple": _weight_triple,
    "square": _square, "bit": _bit, "binary_triple": _binary_triple, "trunc": _trunc,
    "trunc_exact": _trunc_exact, "bit_mul": _bit_mul, "binary_monomials": _binary_monomials,
}


def chunk_bytes() -> int:
    """The working-set budget of one offline exchange (CRYPTEN_LITE_PAIRWISE_CHUNK_MB, in MB,
    default CHUNK_MB): large correlations are made in slices that fit it. Both parties must
    use the same value (the handshake refuses a mismatch)."""
    raw = os.environ.get(CHUNK_ENV, "")
    if raw == "":
        return CHUNK_MB << 20
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{CHUNK_ENV}={raw!r} is not a number of MB (e.g. 128)") from None
    if not value > 0 or value > 1 << 20:
        raise ConfigError(f"{CHUNK_ENV}={raw!r}: use a positive number of MB (e.g. 128)")
    return max(1, int(value * (1 << 20)))


def _work(kind: str, op: str, shapes, params) -> tuple[str, int]:
    """A correlation's class and weight for the progress line's time left
    (pairwise_progress.PRIOR_US): an OT kind by its working set (_ELEMENT_BYTES, about its
    OTs: a binary_monomials word is 64 bits of work per (mask, chooser) set, a bit_mul element
    one OT), an HE correlation by its operands' elements."""
    per = _ELEMENT_BYTES.get(kind)
    if per is not None:
        return f"ot/{kind}", max(1, math.prod(tuple(shapes[0])) * per(params))
    elements = max(1, sum(math.prod(tuple(s)) for s in shapes))
    if (kind == "triple" and op == "mul") or kind == "square":
        return "he-elementwise", elements
    return "he-product", elements
