"""Binary (XOR) sharing of bit-packed int64 words: xor, and, or, not, shifts, openings.

x = x_0 ^ x_1 ^ ... ^ x_{N-1}. XOR, NOT, shifts and masks are local (NOT: rank 0 flips).

AND of shared words, a la [Bea91] over GF(2) with binary triples (kind ``binary_triple``):
  1. Get ([a], [b], [c = a & b]) from the provider, one request for all pairs of the call.
  2. Open e = x ^ a and d = y ^ b for EVERY pair of the call in ONE message (one round):
     each party sends 2 words per AND-word to every peer.
  3. [x & y] = [c] ^ (e & [b]) ^ ([a] & d) ^ (e & d), the public term on rank 0.

Masked polynomial evaluation (``eval_polys``; kind ``binary_monomials``): to get an XOR of
ANDs of several inputs in ONE round, open o_k = x_k ^ m_k for each input and combine the
dealer's shares of the needed mask products (see circuits.expand_terms). An input held by
one party (its "owner", e.g. a 2-party arithmetic share seen as a binary sharing with the
other party holding 0) is opened by its owner alone, so only the owner sends it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from ..comm.communicator import shape_tag, with_tag
from ..errors import ProtocolError
from ..provider.correlations import broadcast_shape, monomial_params
from ..session import current
from . import circuits
from .primitives import check_agree

ALL_ONES = -1
# The dealer answers one request in one gRPC message (at most 4 MiB): requests for more
# elements are split into chunks whose corrections stay below this many bytes.
MAX_CORRECTION_BYTES = 3 << 20


class _Concat:
    """Several correlations of consecutive element chunks seen as one (components concatenated
    along the first axis)."""

    def __init__(self, parts):
        self._parts = parts

    def __getitem__(self, j: int) -> torch.Tensor:
        return torch.cat([p[j] for p in self._parts])

    def corrected(self) -> list[torch.Tensor]:
        got = [p.corrected() for p in self._parts]
        return [torch.cat([g[j] for g in got]) for j in range(len(got[0]))]


def provider_get(kind: str, n: int, shapes_fn, words_per_element: int, params=(), op: str = ""):
    """An elementwise correlation for n elements (first axis), chunked for the dealer."""
    provider = current().provider
    chunk = max(1, MAX_CORRECTION_BYTES // (8 * max(1, words_per_element)))
    if n <= chunk:
        return provider.get(kind, shapes_fn(n), op, params)
    sizes = [min(chunk, n - i) for i in range(0, n, chunk)]
    return _Concat([provider.get(kind, shapes_fn(m), op, params) for m in sizes])


def lead_of(like: torch.Tensor) -> torch.Tensor:
    """All-ones words on rank 0, zeros elsewhere (xor public constants through it). A
    replicated share (protocol rss) gets the sharing of all-ones on its share index 0."""
    if getattr(like, "is_replicated_share", False):
        return torch.full_like(like, ALL_ONES)
    return torch.full_like(like, ALL_ONES) if current().rank == 0 else torch.zeros_like(like)


def xor_public(x: torch.Tensor, c) -> torch.Tensor:
    """x ^ c for a public c (rank 0 applies it; a replicated share applies it on its share
    index 0 by itself)."""
    if getattr(x, "is_replicated_share", False):
        return x ^ c
    return x ^ c if current().rank == 0 else x.clone()


def xor(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Shares of x ^ y (local)."""
    return x ^ y


def lshift(x: torch.Tensor, k: int) -> torch.Tensor:
    """Shares of x << k (local)."""
    return x << k


def rshift(x: torch.Tensor, k: int) -> torch.Tensor:
    """Shares of the LOGICAL right shift x >>> k (local: each share shifts alone)."""
    if k == 0:
        return x.clone()
    return (x >> k) & ((1 << (64 - k)) - 1)


def open_xor(x: torch.Tensor) -> torch.Tensor:
    """Reveal a binary-shared tensor to every party (one round; every party checks that the
    others' shares have its shape and dtype, primitives.check_agree)."""
    flat = with_tag(x.reshape(-1), shape_tag([x.shape]))  # the full shape in the header
    parts = current().comm.all_gather(flat)
    check_agree(flat, parts, "binary opening")
    out = parts[0].clone()
    for p in parts[1:]:
        out ^= p
    return out.view(x.shape)


def and_many(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], triple=None) -> list[torch.Tensor]:
    """Shares of x & y for every pair, in ONE round (all openings in one message).

    `triple`: a binary triple of the total size, requested earlier.
    """
    s = current()
    xs = [torch.broadcast_tensors(x, y)[0].reshape(-1) for x, y in pairs]
    ys = [torch.broadcast_tensors(x, y)[1].reshape(-1) for x, y in pairs]
    x = torch.cat(xs) if len(xs) > 1 else xs[0]
    y = torch.cat(ys) if len(ys) > 1 else ys[0]
    if triple is None:
        triple = provider_get("binary_triple", x.numel(), lambda m: [(m,)], 1)
    a, b = triple[0], triple[1]
    n = x.numel()
    opened = open_xor(torch.cat([x ^ a, y ^ b]))
    e, d = opened[:n], opened[n:]
    c = triple.corrected()[2]
    z = c ^ (e & b) ^ (a & d)
    if s.rank == 0:
        z ^= e & d
    out, offset = [], 0
    for (px, py), flat in zip(pairs, xs):
        shape = broadcast_shape(px.shape, py.shape)
        out.append(z[offset:offset + flat.numel()].view(shape))
        offset += flat.numel()
    return out


def and_(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Shares of x & y (one round)."""
    return and_many([(x, y)])[0]


@dataclass
class PolyJob:
    """XORs of ANDs of `inputs` (this party's shares) evaluated from masked openings.

    owners[k] = -1: input k is xor-shared by all parties; owners[k] = r: party r holds the
    whole value (every other party passes zeros). outputs: one list of terms per output,
    a term being a tuple of input indices.
    """

    inputs: list[torch.Tensor]
    owners: list[int]
    outputs: list[list[tuple[int, ...]]]
    _corr: object = field(default=None, repr=False)


def _sends(job: PolyJob, rank: int) -> list[int]:
    return [k for k, o in enumerate(job.owners) if o == -1 or o == rank]


@dataclass
class _Plan:
    job: PolyJob
    monos: list[tuple[int, ...]]      # every mask product the expansion needs
    dealt: list[tuple[int, ...]]      # those the dealer provides (the rest: one owner knows)
    corr: object
    rows: object = None               # a small job's masks as one numpy array (_mask_rows)


def _structure_of(owners: Sequence[int], outputs) -> tuple[list, list, tuple[int, ...]]:
    """_structure of a job's owners and outputs (as hashable tuples): (every mask product the
    expansion needs, those the dealer provides, their request params)."""
    return _structure(tuple(owners), tuple(tuple(tuple(t) for t in out) for out in outputs))


@functools.lru_cache(maxsize=256)
def _structure(owners: tuple[int, ...], outputs: tuple) -> tuple[list, list, tuple[int, ...]]:
    """A job's monomials, dealt monomials and request params: they depend on the circuit's
    shape alone (a few distinct ones per model), so each is worked out once per process
    instead of at every round (the callers never modify the lists)."""
    monos = circuits.monomials([t for out in outputs for t in out])
    dealt = [m for m in monos if len({owners[k] for k in m}) > 1 or owners[m[0]] == -1]
    subsets = [sum(1 << k for k in m) for m in dealt]
    return monos, dealt, monomial_params(list(owners), subsets)


def _request(numel: int, owners: Sequence[int], dealt: Sequence[tuple[int, ...]],
             params: tuple[int, ...] | None = None):
    """The dealer's masks and the `dealt` mask products for a job of `numel` words (kind
    binary_monomials); `params`: monomial_params of owners and dealt, when known already."""
    if params is None:
        params = monomial_params(list(owners), [sum(1 << k for k in m) for m in dealt])
    return provider_get("binary_monomials", numel, lambda n: [(n,)], len(dealt), params=params)


def _plan(job: PolyJob) -> _Plan:
    monos, dealt, params = _structure_of(job.owners, job.outputs)
    corr = job._corr
    if corr is None:
        corr = _request(job.inputs[0].numel(), job.owners, dealt, params)
    return _Plan(job, monos, dealt, corr)


class PolyRounds:
    """The poly_fn of :mod:`crypten_lite.mpc.circuits` (radix-4 carry trees, AND trees): each
    call evaluates its jobs, on inputs XOR-shared by every party, in ONE eval_polys round.

    `plan`: the calls to come, each a list of (words, inputs, outputs) per job (e.g.
    ``[[level] for level in circuits.carry_plan(...)]``): their correlations are all requested
    up front, so that the dealer computes them while earlier rounds run.
    """

    def __init__(self, plan: Sequence[Sequence[tuple[int, int, list]]] = ()):
        self._corrs = [[_request(words, [-1] * k, *_structure_of([-1] * k, outputs)[1:])
                        for words, k, outputs in call] for call in plan]

    def __call__(self, jobs) -> list[list[torch.Tensor]]:
        poly_jobs = [PolyJob(list(inputs), [-1] * len(inputs), [list(o) for o in outputs])
                     for inputs, outputs in jobs]
        if self._corrs:
            for job, corr in zip(poly_jobs, self._corrs.pop(0), strict=True):
                job._corr = corr  # sizes from circuits.carry_plan (tests/unit/test_circuits.py)
        return eval_polys(poly_jobs)


def xor_polys(jobs) -> list[list[torch.Tensor]]:
    """poly_fn without prefetching (see PolyRounds)."""
    return PolyRounds()(jobs)


def _open_masked(plans: Sequence[_Plan]) -> list[list[torch.Tensor]]:
    """o_k = x_k ^ m_k for every input of every job, in ONE all-gather."""
    s = current()
    mine, masked, offset = [], [], 0
    for p in plans:
        sends = _sends(p.job, s.rank)
        rows = p.rows = _mask_rows(p)
        if rows is None or not sends or sends != list(range(sends[0], sends[0] + len(sends))):
            mine += [p.job.inputs[k].reshape(-1) ^ p.corr[k] for k in sends]
        else:  # a small job's masks are one array: XORed into the message at once, below
            mine += [x if x.dim() == 1 else x.reshape(-1) for x in p.job.inputs[sends[0]:sends[-1] + 1]]
            masked.append((offset, rows[sends[0]:sends[-1] + 1]))
        offset += p.job.inputs[0].numel() * len(sends)
    message = torch.cat(mine) if mine else torch.zeros(0, dtype=torch.int64)  # a fresh tensor
    if masked:
        words = message.numpy()
        for offset, rows in masked:
            words[offset:offset + rows.size] ^= rows.reshape(-1)
    parts = s.comm.all_gather(message)
    expected = [sum(p.job.inputs[0].numel() * len(_sends(p.job, r)) for p in plans)
                for r in range(s.world_size)]
    wrong = [r for r, part in enumerate(parts) if part.numel() != expected[r]]
    if wrong:
        raise ProtocolError(f"party {s.rank}: masked openings of {[int(p.numel()) for p in parts]} "
                            f"words (by rank) where this party's program expects {expected}; "
                            "every party must run the same program")
    if all(o == -1 for p in plans for o in p.job.owners):
        # every party sent every input, in the same layout: one XOR of the whole messages,
        # then a view per input
        total = parts[0]
        for part in parts[1:]:
            total = total ^ part
        opened_all, offset = [], 0
        # a small job's opened values as numpy views (expand_terms works on numpy there):
        # slicing an array costs a fraction of a tensor's view
        whole = total.numpy() if any(p.job.inputs[0].numel() <= circuits.SMALL_EXPAND_WORDS
                                     for p in plans) else None
        for p in plans:
            numel, k = p.job.inputs[0].numel(), len(p.job.inputs)
            if p.rows is not None:  # one [inputs, words] array (eval_polys: _expand_rows)
                opened_all.append(whole[offset:offset + k * numel].reshape(k, numel))
            else:
                opened_all.append([total[offset + j * numel:offset + (j + 1) * numel].reshape(tuple(x.shape))
                                   for j, x in enumerate(p.job.inputs)])
            offset += numel * k
        return opened_all
    offsets = [0] * s.world_size
    opened_all = []
    for p in plans:
        opened: list = [None] * len(p.job.inputs)
        numel = p.job.inputs[0].numel()
        for r in range(s.world_size):
            for k in _sends(p.job, r):
                piece = parts[r][offsets[r]:offsets[r] + numel].view(p.job.inputs[k].shape)
                offsets[r] += numel
                opened[k] = piece if opened[k] is None else opened[k] ^ piece
        opened_all.append(opened)
    return opened_all


def _mask_shares(p: _Plan, rank: int):
    """This party's shares of the masks and of every needed monomial."""
    comps = p.corr.corrected()
    shape = p.job.inputs[0].shape
    # components already of the inputs' shape (the usual 1-D words) are taken as they are:
    # a view each costs more than the comparison
    comps = [c if c.shape == shape else c.view(shape) for c in comps]
    masks = [comps[k] if o in (-1, rank) else torch.zeros(shape, dtype=torch.int64)
             for k, o in enumerate(p.job.owners)]
    mono = {m: comps[len(masks) + i] for i, m in enumerate(p.dealt)}
    for m in p.monos:
        if m not in mono:  # every mask in it belongs to one owner, who computes it
            v = torch.zeros(shape, dtype=torch.int64)
            if p.job.owners[m[0]] == rank:
                v = masks[m[0]]
                for k in m[1:]:
                    v = v & masks[k]
            mono[m] = v
    return masks, mono


def _mask_rows(p: _Plan):
    """A small job's mask components (one per input, whoever holds the mask) as one numpy
    [inputs, words] array (Correlation.rows), when they lie in one piece of memory; else
    None. Up to circuits.ROW_EXPAND_WORDS words (expand_rows' range)."""
    if p.job.inputs[0].numel() > circuits.ROW_EXPAND_WORDS or not hasattr(p.corr, "rows"):
        return None
    if getattr(p.job.inputs[0], "is_replicated_share", False):
        return None
    return p.corr.rows(0, len(p.job.inputs))


def _expand_rows(p: _Plan, opened, rank: int) -> list[torch.Tensor] | None:
    """circuits.expand_rows of a small job whose inputs every party sends (its opened values
    one array, _open_masked) and whose masks and dealt monomials are one array each; else
    None (_mask_shares and expand_outputs then)."""
    masks = p.rows  # made by _open_masked
    if masks is None:
        return None
    p.corr.corrected()
    k, n = len(p.job.inputs), len(p.dealt)
    monos = p.corr.rows(k, n) if n else np.zeros((0, masks.shape[1]), dtype=np.int64)
    if monos is None:
        return None
    out = circuits.expand_rows(p.job.outputs, opened, masks, monos, p.dealt, rank == 0)
    shape = p.job.inputs[0].shape
    return [torch.from_numpy(row) if len(shape) == 1 else torch.from_numpy(row).view(shape) for row in out]


def eval_polys(jobs: Sequence[PolyJob]) -> list[list[torch.Tensor]]:
    """Evaluate every job in ONE round; returns each job's output shares."""
    rank = current().rank
    plans = [_plan(job) for job in jobs]
    opened_all = _open_masked(plans)
    results = []
    for p, opened in zip(plans, opened_all):
        if isinstance(opened, np.ndarray):
            out = _expand_rows(p, opened, rank)
            if out is not None:
                results.append(out)
                continue
            opened = [row.reshape(tuple(x.shape)) for row, x in zip(opened, p.job.inputs)]
        masks, mono = _mask_shares(p, rank)
        lead = lead_of(p.job.inputs[0])
        results.append(circuits.expand_outputs(p.job.outputs, opened, masks, mono, lead))
    return results


class BinaryShared:
    """A bit-packed XOR-shared int64 tensor with operators, under the session's protocol
    (crypten_lite.mpc.protocol: additive with binary triples, or rss)."""

    def __init__(self, share: torch.Tensor):
        self.share = share

    def __xor__(self, other):
        """x ^ y (local; a public y is applied once, protocol.xor_public)."""
        from . import protocol
        if isinstance(other, BinaryShared):
            return BinaryShared(self.share ^ other.share)
        return BinaryShared(protocol.xor_public(self.share, other))

    def __and__(self, other):
        """x & y (one round; a public mask is local)."""
        from . import protocol
        if isinstance(other, BinaryShared):
            return BinaryShared(protocol.and_many([(self.share, other.share)])[0])
        return BinaryShared(self.share & other)  # public mask: local

    def __or__(self, other):
        """x | y = x ^ y ^ (x & y) (one round; a public y is local: (x & ~c) ^ c)."""
        from . import protocol
        if isinstance(other, BinaryShared):
            return BinaryShared(self.share ^ other.share ^
                                protocol.and_many([(self.share, other.share)])[0])
        return BinaryShared(protocol.xor_public(self.share & ~other, other))

    def __invert__(self):
        from . import protocol
        return BinaryShared(protocol.xor_public(self.share, ALL_ONES))

    def __lshift__(self, k: int):
        return BinaryShared(lshift(self.share, k))

    def __rshift__(self, k: int):
        return BinaryShared(rshift(self.share, k))

    def get_plain_text(self) -> torch.Tensor:
        """Reveal to every party (one round)."""
        from . import protocol
        return protocol.open_xor(self.share)
