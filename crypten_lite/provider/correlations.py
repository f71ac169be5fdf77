"""Correlated randomness derived from seeds: the math shared by the dealer and the parties.

Every party i holds a seed s_i with the dealer and its correlation key
K_i = subkey(s_i, "correlations"). For request number k, party i derives each component of
its share from a key bound to the whole request: the components are consecutive parts, in
order, of one AES-CTR keystream under HMAC(K_i, encode(k, kind, op, shapes, params))
(random.keystream_parts: one cipher context per request and party). The dealer, knowing every K_i, reconstructs the
random values, computes the correlated value and sends rank 0 the single correcting share
that makes the shares sum (or xor) to it. So dealer traffic is one share per correlated
value, sent to one party (docs/design.md section 5). Because the key covers the request,
two different requests (even at the same counter) never share a stream, and a smaller draw
is never a prefix of a larger one.

`check_request` is what the dealer accepts: the kinds, ops, operand counts and parameter
ranges the protocols use, every component's size bounded before anything is allocated.

Kinds (x = sum of arithmetic shares, ^ = xor of binary shares):

* ``triple``        a, b uniform; c = op(a, b)                         correction: c_0
* ``square``        a uniform; c = a * a                                correction: c_0
* ``bit``           r in {0,1}: binary shares rb (xor), arithmetic ra   correction: ra_0
* ``binary_triple`` a, b uniform words; c = a & b (xor shares)          correction: c_0
* ``trunc``         r uniform; rt = r >> bits (logical); m = msb(r)     corrections: rt_0, m_0

* ``weight_mask``   B uniform (the fixed mask of one model weight)     corrections: none
* ``weight_triple`` A uniform; C = op(A, B), B the weight_mask of counter params[0]
                    (shapes: activation, weight; params: mask counter, op params)
                                                                       correction: C_0

Fixed weights (weight_mask / weight_triple, crypten_lite.mpc.fixed): a product op(x, W) with
a model weight W that stays the same across calls opens D = W - B ONCE per loaded model
(B = sum of the parties' seeded components of one ``weight_mask`` request, bound to that
request's counter, the weight's id), and per call only E = x - A_k, with a fresh
``weight_triple`` (A_k, C_k = op(A_k, B)) under its own counter. Security: B is uniform and
masks nothing but W, so D is uniform and independent of W; it is opened once (opening the
same D again reveals nothing new, and a changed W gets a fresh B, never W' - B). Every A_k
is fresh and uniform, so each E_k is a one-time pad of x_k; C_k's shares come from the
request's own streams, and rank 0's correction C_k - sum_{i>0} C_k,i is uniform to it as
for any triple. The view of the parties (D, E_1, E_2, ...) is uniform and independent of
(W, x_1, x_2, ...): the same as with fresh triples, where D would be a fresh uniform value
at each call. The dealer answers each weight_triple counter once (the ledger) and only for a
mask counter it answered as a weight_mask of that same weight shape (comm/dealer_rpc.py).

More kinds (binary_monomials, bit_mul, trunc_exact) are defined at the end of this file.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import ProtocolError, UnsupportedError
from ..random import correlation_key, keystream_parts, keystream_ring

CORRECTING_RANK = 0


def _conv_params(p: Sequence[int], dims: int) -> dict:
    return {"stride": tuple(p[0:dims]), "padding": tuple(p[dims:2 * dims]),
            "dilation": tuple(p[2 * dims:3 * dims]), "groups": p[3 * dims]}


def _conv_transpose2d(a, b, p):
    return F.conv_transpose2d(a, b, stride=tuple(p[0:2]), padding=tuple(p[2:4]),
                              output_padding=tuple(p[4:6]), dilation=tuple(p[6:8]), groups=p[8])


MV_ROWS = 4  # _matmul: at most this many rows of a against a transposed b take torch.mv


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.matmul(a, b), exact in int64. A few rows against a 2-D b that is the transpose
    of a contiguous matrix (a Linear's weight.t(), a tied LM head: x @ W.t()) take torch.mv
    on that matrix, row by row: torch's int64 matmul walks such a b column by column, 20x
    slower for one row against GPT-2's [50257, 768] head (0.6 s against 0.03)."""
    if (type(a) is torch.Tensor and type(b) is torch.Tensor   # plain ring elements, not shares
            and b.dim() == 2 and a.dim() >= 1 and b.dtype == torch.int64 and a.dtype == torch.int64
            and b.shape[0] > 1 and b.stride() == (1, b.shape[0]) and a.shape[-1] == b.shape[0]):
        rows = a.reshape(-1, a.shape[-1])
        if rows.shape[0] <= MV_ROWS:
            w = b.t()   # contiguous
            out = torch.stack([torch.mv(w, row) for row in rows])
            return out.view(*a.shape[:-1], b.shape[1])
    return torch.matmul(a, b)


# --- ring products by float64 BLAS on 16-bit limbs ------------------------------------------
# torch has no BLAS for int64: its int64 matmul and conv are a generic kernel whose speed
# depends on the CPU by two orders of magnitude (fast with AVX-512, 25x-180x slower on a
# 2-core AVX2 EPYC). A bilinear op is linear in each operand, so with a = sum_i a_i 2^(16 i)
# and b = sum_j b_j 2^(16 j) (16-bit limbs, 0..65535), op(a, b) mod 2^64 is
# sum_{i+j<4} op(a_i, b_j) 2^(16 (i+j)): ten float64 ops (BLAS) on limbs. Each output of the
# four sums op(a_0, b_s) + ... + op(a_s, b_0) adds at most 4 K products below 2^32 (K: the
# terms one output sums), exact in float64 while 4 K 2^32 <= 2^53, so K <= 2^19; every
# partial sum is an integer below 2^53, so any summation order (BLAS blocking, FMA) is exact.
LIMB_BITS = 16
LIMB_MAX_TERMS = 1 << 19
# Below this many multiply-adds, or this many terms per output (LeNet's 5x5 convolution of one
# channel: 25), torch's int64 op is as fast as splitting into limbs, whose cost is ten passes
# over the operands and outputs besides the products.
LIMB_MIN_WORK = 1 << 22
LIMB_MIN_TERMS = 64
RING_GEMM_MODES = ("auto", "int64", "limbs")
# auto's probe: large enough that torch's int64 kernel runs out of cache as real products do
# (at [64, 256] @ [256, 128] the two are even on a CPU where the limbs win 20x at BERT's shapes)
PROBE_SHAPES = ((128, 256), (256, 256))
PROBE_TRIALS = 4
_ring_gemm_choice: dict[str, bool] = {}


# Bound on one limb product's float64 working set (the limbs of one block of each operand, and
# one block of the output's accumulator): a matmul against a 2-D b (every Linear, every LM
# head) runs block by block over a's rows and b's columns, so a product of any size holds
# at most about this much besides its operands and its int64 output.
LIMB_CHUNK_BYTES = 1 << 26


def _limbs(t: torch.Tensor) -> list[torch.Tensor]:
    """The four 16-bit limbs of `t` as float64 (one int64 temporary, reused for each limb)."""
    mask = (1 << LIMB_BITS) - 1
    work = torch.empty_like(t, memory_format=torch.contiguous_format)
    out = []
    for i in range(64 // LIMB_BITS):
        torch.bitwise_right_shift(t, LIMB_BITS * i, out=work)
        out.append(work.bitwise_and_(mask).to(torch.float64))
    return out


def _limb_sum(fn: Callable, al: list, bl: list, params: Sequence[int], out: torch.Tensor | None = None) -> torch.Tensor:
    """sum_{i+j<4} fn(al[i], bl[j]) 2^(16 (i+j)) mod 2^64, added into `out` when given."""
    for s in range(len(al)):
        acc = fn(al[0], bl[s], params)
        for i in range(1, s + 1):
            acc += fn(al[i], bl[s - i], params)
        term = acc.to(torch.int64)
        del acc
        if s:
            term.mul_(1 << (LIMB_BITS * s))  # int64 products wrap mod 2^64, as the ring needs
        if out is None:
            out = term
        else:
            out.add_(term)
        del term
    return out


def ring_by_limbs(fn: Callable, a: torch.Tensor, b: torch.Tensor, params: Sequence[int],
                  op: str = "") -> torch.Tensor:
    """``fn(a, b, params)`` mod 2^64 for int64 ``a``, ``b``, by float64 ``fn`` on 16-bit limbs
    (exact while one output sums at most LIMB_MAX_TERMS products; the caller checks).

    A matmul (``op`` "matmul") of a by a 2-D b too large for LIMB_CHUNK_BYTES runs by blocks
    of a's rows and b's columns, each block's limbs made, used and dropped in turn."""
    if op == "matmul" and b.dim() == 2 and a.dim() >= 2:
        k, n = b.shape
        rows = a.reshape(-1, k)
        m = rows.shape[0]
        limb_bytes = 4 * 8  # four float64 limbs per element
        cols = max(1, min(n, LIMB_CHUNK_BYTES // (limb_bytes * k)))
        step = max(1, min(m, LIMB_CHUNK_BYTES // (limb_bytes * k), LIMB_CHUNK_BYTES // (16 * cols)))
        if cols < n or step < m:
            out = torch.empty(m, n, dtype=torch.int64)
            whole_a = _limbs(rows) if step >= m else None
            for j in range(0, n, cols):
                bl = _limbs(b[:, j:j + cols])
                for i in range(0, m, step):
                    al = whole_a if whole_a is not None else _limbs(rows[i:i + step])
                    out[i:i + step, j:j + cols] = _limb_sum(fn, al, bl, params)
                    del al
                del bl
            return out.view(*a.shape[:-1], n)
    return _limb_sum(fn, _limbs(a), _limbs(b), params)


def _terms_per_output(op: str, a: torch.Tensor, b: torch.Tensor, params: Sequence[int]) -> int:
    """How many products one output element of op(a, b) sums (an upper bound)."""
    if op == "matmul":
        return a.shape[-1]
    if op in ("conv1d", "conv2d"):
        return b.shape[1] * math.prod(b.shape[2:])
    if op == "conv_transpose2d":
        return (a.shape[1] // params[8]) * math.prod(b.shape[2:])
    return 1


def _limbs_faster() -> bool:
    """Whether float64 BLAS on limbs beats torch's int64 matmul on this machine: measured
    once per process on PROBE_SHAPES, best of PROBE_TRIALS interleaved trials after a warm-up,
    limbs taken when at least 1.5x faster (the two give identical results; only speed differs)."""
    import time

    if "auto" not in _ring_gemm_choice:
        # full-range probe operands without any randomness: consecutive integers times an odd
        # 64-bit constant (wrapping), which spreads them over the whole ring
        spread = 0x9E3779B97F4A7C15 - (1 << 64)
        a = (torch.arange(math.prod(PROBE_SHAPES[0]), dtype=torch.int64) * spread).view(PROBE_SHAPES[0])
        b = (torch.arange(math.prod(PROBE_SHAPES[1]), dtype=torch.int64) * spread + 1).view(PROBE_SHAPES[1])
        runs = {"int64": lambda: torch.matmul(a, b), "limbs": lambda: ring_by_limbs(_float_matmul, a, b, ())}
        times = dict.fromkeys(runs, float("inf"))
        for run in runs.values():
            run()  # warm up
        # interleaved, best of PROBE_TRIALS each: parties and the dealer start together and
        # share the cores, and one trial slowed by another process must not decide
        for _ in range(PROBE_TRIALS):
            for name, run in runs.items():
                start = time.perf_counter()
                run()
                times[name] = min(times[name], time.perf_counter() - start)
        _ring_gemm_choice["auto"] = times["limbs"] * 1.5 < times["int64"]
    return _ring_gemm_choice["auto"]


def ring_gemm_mode() -> str:
    """CRYPTEN_LITE_RING_GEMM: ``auto`` (default: limbs where they are faster on this CPU),
    ``int64`` (torch's int64 ops always) or ``limbs`` (float64 limbs for every large product)."""
    import os

    mode = os.environ.get("CRYPTEN_LITE_RING_GEMM", "auto")
    if mode not in RING_GEMM_MODES:
        raise ValueError(f"CRYPTEN_LITE_RING_GEMM={mode!r}: expected one of {', '.join(RING_GEMM_MODES)}")
    return mode


def ring_gemm_choice() -> str:
    """How this process runs large ring products: "int64" or "limbs" (auto resolved)."""
    mode = ring_gemm_mode()
    return mode if mode != "auto" else ("limbs" if _limbs_faster() else "int64")


def _ring_op(op: str, int64_fn: Callable, float_fn: Callable | None = None) -> Callable:
    """The ring op ``op``: torch's int64 op, or float64 limbs (``float_fn``, default the same
    function) for large products of plain CPU int64 tensors where those are faster (identical
    results either way)."""
    float_fn = float_fn or int64_fn

    def run(a: torch.Tensor, b: torch.Tensor, p: Sequence[int]) -> torch.Tensor:
        if (type(a) is torch.Tensor and type(b) is torch.Tensor and a.dtype == torch.int64
                and b.dtype == torch.int64 and a.device.type == "cpu" and b.device.type == "cpu"
                and a.dim() >= 1 and b.dim() >= 1):
            mode = ring_gemm_mode()
            if (mode != "int64" and LIMB_MIN_TERMS <= _terms_per_output(op, a, b, p) <= LIMB_MAX_TERMS
                    and _work(op, a, b, p) >= LIMB_MIN_WORK and (mode == "limbs" or _limbs_faster())):
                return ring_by_limbs(float_fn, a, b, p, op)
        return int64_fn(a, b, p)
    return run


def _work(op: str, a: torch.Tensor, b: torch.Tensor, p: Sequence[int]) -> int:
    """Multiply-adds of op(a, b) (0 where the int64 op should run anyway: unknown shapes, and
    a few rows against a matrix, which torch.mv serves without copying the matrix into limbs)."""
    if op == "conv_transpose2d":
        return a.numel() * b.shape[1] * math.prod(b.shape[2:])
    shape = _fast_shape(op, tuple(a.shape), tuple(b.shape), tuple(p))
    if shape is None or (op == "matmul" and shape[-2] <= MV_ROWS):
        return 0
    return math.prod(shape) * _terms_per_output(op, a, b, p)


def _float_matmul(a: torch.Tensor, b: torch.Tensor, p: Sequence[int]) -> torch.Tensor:
    return torch.matmul(a, b)


# The bilinear operations a Beaver triple can serve; params are integers only.
TRIPLE_OPS: dict[str, Callable[[torch.Tensor, torch.Tensor, Sequence[int]], torch.Tensor]] = {
    "mul": lambda a, b, p: a * b,
    "matmul": _ring_op("matmul", lambda a, b, p: _matmul(a, b), _float_matmul),
    "conv1d": _ring_op("conv1d", lambda a, b, p: F.conv1d(a, b, **_conv_params(p, 1))),
    "conv2d": _ring_op("conv2d", lambda a, b, p: F.conv2d(a, b, **_conv_params(p, 2))),
    "conv_transpose2d": _ring_op("conv_transpose2d", _conv_transpose2d),
}
# a @ b^T (F.linear's product): a weight used in both layouts, as GPT-2's tied token embedding
# and LM head, keeps one fixed mask for both (mpc/fixed.py). By matmul on b's transposed view.
TRIPLE_OPS["linear"] = lambda a, b, p: TRIPLE_OPS["matmul"](a, b.transpose(-1, -2), p)

# Number of seeded components per kind (domain 0..n-1) and of corrections sent to rank 0.
COMPONENTS = {"triple": 3, "square": 2, "bit": 2, "binary_triple": 3, "trunc": 3}
CORRECTIONS = {"triple": 1, "square": 1, "bit": 1, "binary_triple": 1, "trunc": 2}


def _conv_out(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


@functools.lru_cache(maxsize=1024)
def _broadcast_cached(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(torch.broadcast_shapes(a, b))


def broadcast_shape(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    """torch.broadcast_shapes of two shapes, memoised: torch's goes through its reference
    implementation's symbolic checks, tens of microseconds a call (about 1.4 ms of LeNet b1's
    run per party, 14 calls); incompatible shapes raise torch's error, as before."""
    return _broadcast_cached(tuple(a), tuple(b))


def _fast_shape(op: str, a: tuple, b: tuple, p) -> tuple[int, ...] | None:
    """op(a, b)'s shape by arithmetic for the common cases (None: ask torch's meta kernels)."""
    if op == "mul":
        return broadcast_shape(a, b)
    if op == "matmul" and len(a) >= 2 and len(b) >= 2 and a[-1] == b[-2]:
        return broadcast_shape(a[:-2], b[:-2]) + (a[-2], b[-1])
    if op in ("conv1d", "conv2d"):
        dims = 1 if op == "conv1d" else 2
        groups = p[3 * dims]
        if len(a) == dims + 2 and len(b) == dims + 2 and a[1] == b[1] * groups and b[0] % groups == 0:
            spatial = tuple(_conv_out(a[2 + i], b[2 + i], p[i], p[dims + i], p[2 * dims + i])
                            for i in range(dims))
            if all(s > 0 for s in spatial):
                return (a[0], b[0]) + spatial
    return None


def triple_shape(op: str, a_shape, b_shape, params) -> tuple[int, ...]:
    """Shape of op(a, b) without computing it (arithmetic, else meta tensors)."""
    if op not in TRIPLE_OPS:
        raise UnsupportedError(f"no Beaver triple for op {op!r}; supported: {sorted(TRIPLE_OPS)}")
    fast = _fast_shape(op, tuple(a_shape), tuple(b_shape), tuple(params))
    if fast is not None:
        return fast
    a = torch.empty(a_shape, dtype=torch.float32, device="meta")
    b = torch.empty(b_shape, dtype=torch.float32, device="meta")
    try:
        return tuple(TRIPLE_OPS[op](a, b, params).shape)
    except RuntimeError as e:
        raise ProtocolError(f"{op} of shapes {tuple(a_shape)} and {tuple(b_shape)}: {e}") from e


def component_shapes(kind: str, op: str, shapes, params) -> list[tuple[int, ...]]:
    """Shapes of the seeded components of a request."""
    if kind in EXTRA_KINDS:
        return EXTRA_KINDS[kind].shapes(shapes, params)
    if kind == "triple":
        return [tuple(shapes[0]), tuple(shapes[1]), triple_shape(op, shapes[0], shapes[1], params)]
    if kind in ("square", "bit", "trunc", "binary_triple"):
        return [tuple(shapes[0])] * COMPONENTS[kind]
    if kind == "weight_mask":
        return [tuple(shapes[0])]
    if kind == "weight_triple":
        return [tuple(shapes[0]), triple_shape(op, shapes[0], shapes[1], params[1:])]
    raise UnsupportedError(f"unknown correlation kind {kind!r}")


@functools.lru_cache(maxsize=4096)
def _cached_shapes(kind: str, op: str, shapes: tuple, params: tuple) -> tuple:
    return tuple(component_shapes(kind, op, shapes, params))


def request_shapes(kind: str, op: str, shapes, params) -> tuple:
    """component_shapes as a tuple, cached for a request given by tuples (a plan's requests
    repeat a few shapes, and each is asked for several times per request: by the party's
    offline phase, its derivation and the dealer's)."""
    try:
        return _cached_shapes(kind, op, shapes, params)
    except TypeError:  # lists: not hashable (component_shapes raises its own errors again)
        return tuple(component_shapes(kind, op, shapes, params))


def derive(key: bytes, counter: int, kind: str, op: str, shapes, params,
           upto: int | None = None) -> list[torch.Tensor]:
    """Every seeded component of request `counter` for the holder of correlation key `key`
    (`subkey(seed, "correlations")`): consecutive parts, in component order, of one AES-CTR
    keystream under a key bound to the whole request (random.keystream_parts). With `upto`,
    only the first `upto` components (the stream's prefix: the dealer skips the ones it
    corrects)."""
    out = keystream_parts(correlation_key(key, counter, kind, op, shapes, params),
                          request_shapes(kind, op, shapes, params)[:upto])
    if kind == "bit":
        out[0] &= 1
    if kind in EXTRA_KINDS:
        EXTRA_KINDS[kind].post_derive(out, params)
    return out


def corrections(keys: dict[int, bytes], counter: int, kind: str, op: str, shapes, params,
                weight_mask: Callable[[dict[int, bytes], int, tuple], torch.Tensor] | None = None,
                ) -> list[torch.Tensor]:
    """The dealer's side: rank 0's correcting shares (rank 0's own seeded values replaced);
    `keys` maps every rank to its correlation key. `weight_mask(keys, counter, shape)` gives
    the B of a ``weight_triple`` (default: weight_mask_of; the dealer caches it)."""
    world = sorted(keys)
    if kind == "weight_mask":  # no correction: nothing to derive (B is drawn for its triples)
        return []
    # Rank 0's last components are what the dealer replaces: never drawn here.
    ncomp = len(request_shapes(kind, op, shapes, params))
    upto = {r: ncomp - correction_count(kind, params) if r == CORRECTING_RANK else None for r in world}
    if kind == "binary_monomials":  # on each party's keystream as one array
        return _monomial_corrections(keys, counter, shapes, params, world)
    parts = {r: derive(keys[r], counter, kind, op, shapes, params, upto[r]) for r in world}
    if kind in EXTRA_KINDS:
        return EXTRA_KINDS[kind].corrections(parts, world, params)
    others = [r for r in world if r != CORRECTING_RANK]

    def arith_sum(j: int, ranks) -> torch.Tensor:
        return _sum_of(parts, ranks, j)

    def xor_sum(j: int, ranks) -> torch.Tensor:
        return _xor_of(parts, ranks, j)

    if kind == "triple":
        c = TRIPLE_OPS[op](arith_sum(0, world), arith_sum(1, world), params)
        return [c - arith_sum(2, others)]
    if kind == "weight_triple":
        b = (weight_mask or weight_mask_of)(keys, params[0], tuple(shapes[1]))
        c = TRIPLE_OPS[op](arith_sum(0, world), b, params[1:])
        return [c - arith_sum(1, others)]
    if kind == "square":
        a = arith_sum(0, world)
        return [a * a - arith_sum(1, others)]
    if kind == "bit":
        r = xor_sum(0, world)
        return [r - arith_sum(1, others)]
    if kind == "binary_triple":
        c = xor_sum(0, world) & xor_sum(1, world)
        return [c ^ xor_sum(2, others)]
    if kind == "trunc":
        bits = params[0]
        r = arith_sum(0, world)
        rt = logical_shift(r, bits)
        msb = logical_shift(r, 63)
        return [rt - arith_sum(1, others), msb - arith_sum(2, others)]
    raise UnsupportedError(f"unknown correlation kind {kind!r}")


def weight_mask_of(keys: dict[int, bytes], mask_counter: int, shape) -> torch.Tensor:
    """The dealer's side: B = sum of every party's component of the ``weight_mask`` request
    at `mask_counter` (the fixed mask of one model weight, see ``weight_triple``)."""
    out = None
    for r in sorted(keys):
        (part,) = derive(keys[r], mask_counter, "weight_mask", "", [tuple(shape)], ())
        out = part if out is None else out + part
    return out


def logical_shift(x: torch.Tensor, bits: int) -> torch.Tensor:
    """x >> bits treating int64 as unsigned 64-bit."""
    if bits == 0:
        return x.clone()
    return (x >> bits) & ((1 << (64 - bits)) - 1)


# ----------------------------------------------------------------------------------------
# Kinds added for binary circuits, comparisons and nonlinear functions (issue 3). Each is a
# small record of three pure functions, so the dealer and the parties share one definition.
#
# * ``binary_monomials``  masks m_0..m_{k-1} (words), each xor-shared by all parties or held
#     by one owner; XOR shares of chosen AND-products ("monomials") of the masks.
#     params = (k, owner_0..owner_{k-1}, subset_0, ..., subset_{n-1}); owner -1 = shared,
#     subset = bitmask over the k masks.                     corrections: the n monomials
# * ``bit_mul``  a random bit r (binary share in bit 0, arithmetic share), a uniform
#     arithmetic value a (shapes[1]) and [a * r] (r broadcast): folds B2A into bit * value.
#                                                             corrections: ra_0, (a*r)_0
# * ``trunc_exact``  r uniform; its low `bits` bits xor-shared; rt = r >> bits (logical);
#     m = msb(r): exact floor division by 2^bits.            corrections: rlow_0, rt_0, m_0
# ----------------------------------------------------------------------------------------


class _Kind:
    """shapes(shapes, params) -> component shapes; post_derive(parts, params) fixes a party's
    seeded components in place; corrections(parts_by_rank, ranks, params) -> rank 0's fixes."""

    def __init__(self, shapes, corrections, post_derive=None):
        self.shapes = shapes
        self.corrections = corrections
        self.post_derive = post_derive or (lambda parts, params: None)


def _xor_of(parts, ranks, j: int) -> torch.Tensor:
    """XOR of component j over `ranks` (may be a party's own tensor: callers never write it);
    0 for no ranks (a session of one party: rank 0's correction is the whole value)."""
    if not ranks:
        return 0
    out = parts[ranks[0]][j]
    for r in ranks[1:]:
        out = out ^ parts[r][j]
    return out


def _sum_of(parts, ranks, j: int) -> torch.Tensor:
    """Sum of component j over `ranks` (may be a party's own tensor: callers never write it);
    0 for no ranks (a session of one party: rank 0's correction is the whole value)."""
    if not ranks:
        return 0
    out = parts[ranks[0]][j]
    for r in ranks[1:]:
        out = out + parts[r][j]
    return out


def monomial_params(owners: Sequence[int], subsets: Sequence[int]) -> tuple[int, ...]:
    """params of a ``binary_monomials`` request: mask owners (-1 shared) and monomial subsets."""
    return (len(owners), *owners, *subsets)


def _split_monomial_params(params):
    k = params[0]
    return k, params[1:1 + k], params[1 + k:]


def _monomial_shapes(shapes, params):
    k, _, subsets = _split_monomial_params(params)
    return [tuple(shapes[0])] * (k + len(subsets))


@functools.lru_cache(maxsize=256)
def _monomial_steps(k: int, subsets: tuple) -> tuple:
    """How to AND every monomial's factors at once: for factor position p = 0, 1, ..., (the
    monomials with more than p factors, or None for all of them; their p-th factor) as numpy
    index arrays."""
    factors = [[j for j in range(k) if subset >> j & 1] for subset in subsets]  # never empty
    steps = []
    for p in range(max(map(len, factors))):
        rows = [i for i, f in enumerate(factors) if len(f) > p]
        steps.append((None if len(rows) == len(factors) else np.asarray(rows, dtype=np.intp),
                      np.asarray([factors[i][p] for i in rows], dtype=np.intp)))
    return tuple(steps)


def _monomial_corrections(keys: dict[int, bytes], counter: int, shapes, params, world) -> list[torch.Tensor]:
    """Rank 0's shares of the monomials. Every component of a party has the request's shape,
    so its keystream (derive's) is one [components, words] array: the masks are its first k
    rows, a party's monomial shares the next n. All monomials are ANDed together, factor
    position by factor position, and the other parties' shares XORed in as one array each
    (numpy on the tensors' memory: a few operations per request, whatever k and n)."""
    k, owners, subsets = _split_monomial_params(params)
    n = len(subsets)
    shape = tuple(shapes[0])
    size = math.prod(shape)
    if size == 0 or n == 0:
        return [torch.zeros(shape, dtype=torch.int64) for _ in range(n)]
    kind = "binary_monomials"

    def stream(r: int, count: int) -> np.ndarray:
        key = correlation_key(keys[r], counter, kind, "", shapes, params)
        return keystream_ring(key, bytes(12), (count * size,), count * size).numpy().reshape(count, size)

    streams = {r: stream(r, k if r == CORRECTING_RANK else k + n) for r in world}
    masks = streams[world[0]][:k].copy()
    for r in world[1:]:
        masks ^= streams[r][:k]
    for j, o in enumerate(owners):
        if o >= 0:  # a mask held by one party (its own input's): that party's component
            masks[j] = streams[o][j]
    steps = _monomial_steps(k, tuple(subsets))
    monos = masks[steps[0][1]]  # a gathered copy
    for chosen, factor in steps[1:]:
        if chosen is None:
            monos &= masks[factor]
        else:
            monos[chosen] &= masks[factor]
    for r in world:
        if r != CORRECTING_RANK:
            monos ^= streams[r][k:]
    return list(torch.from_numpy(monos).view(n, *shape).unbind(0))


def _bit_mul_shapes(shapes, params):
    bit, value = tuple(shapes[0]), tuple(shapes[1])
    return [bit, value, bit, value]


def _bit_mul_post(parts, params):
    parts[0] &= 1


def _bit_mul_corrections(parts, world, params):
    others = [r for r in world if r != CORRECTING_RANK]
    r = _xor_of(parts, world, 0)
    a = _sum_of(parts, world, 1)
    return [r - _sum_of(parts, others, 2), a * r - _sum_of(parts, others, 3)]


def _trunc_exact_shapes(shapes, params):
    return [tuple(shapes[0])] * 4


def _trunc_exact_corrections(parts, world, params):
    bits = params[0]
    others = [r for r in world if r != CORRECTING_RANK]
    r = _sum_of(parts, world, 0)
    low = r & ((1 << bits) - 1)
    return [low ^ _xor_of(parts, others, 1), logical_shift(r, bits) - _sum_of(parts, others, 2),
            logical_shift(r, 63) - _sum_of(parts, others, 3)]


EXTRA_KINDS: dict[str, _Kind] = {
    "binary_monomials": _Kind(_monomial_shapes, None),  # corrections: _monomial_corrections
    "bit_mul": _Kind(_bit_mul_shapes, _bit_mul_corrections, _bit_mul_post),
    "trunc_exact": _Kind(_trunc_exact_shapes, _trunc_exact_corrections),
}


# ----------------------------------------------------------------------------------------
# What the dealer accepts: exactly the requests the protocols make. Anything else (another
# kind, an op with no Beaver triple, parameters out of range, an answer too large) is refused
# before any randomness is derived or any tensor allocated.
# ----------------------------------------------------------------------------------------

# Number of integer parameters of each triple op: conv1d (stride, padding, dilation, groups),
# conv2d the same per spatial axis, conv_transpose2d with output_padding too.
TRIPLE_PARAMS = {"mul": 0, "matmul": 0, "linear": 0, "conv1d": 4, "conv2d": 7, "conv_transpose2d": 9}
# Lower bound of each conv parameter, in the order of TRIPLE_PARAMS (stride and dilation >= 1,
# padding and output_padding >= 0, groups >= 1).
_CONV_LOWER = {"conv1d": (1, 0, 1, 1), "conv2d": (1, 1, 0, 0, 1, 1, 1),
               "conv_transpose2d": (1, 1, 0, 0, 0, 0, 1, 1, 1)}
MAX_CONV_PARAM = 1 << 31
MAX_SHIFT = 63          # trunc / trunc_exact: 0 <= bits <= 63
MAX_MONOMIAL_MASKS = 64  # binary_monomials: masks per request
OPERANDS = {"triple": 2, "bit_mul": 2, "weight_triple": 2}  # the others: one operand shape
FIXED_KINDS = ("weight_mask", "weight_triple")


def correction_count(kind: str, params: Sequence[int]) -> int:
    """How many components (the last ones) the dealer sends rank 0 for a request."""
    if kind == "binary_monomials":
        return len(_split_monomial_params(params)[2])
    if kind == "bit_mul":
        return 2
    if kind == "trunc_exact":
        return 3
    if kind == "weight_mask":
        return 0
    if kind == "weight_triple":
        return 1
    return CORRECTIONS[kind]


def _refuse(kind: str, op: str, why: str) -> ProtocolError:
    return ProtocolError(f"correlation request {kind}/{op or '-'} refused: {why}")


def _check_params(kind: str, op: str, shapes, params: Sequence[int], world_size: int) -> None:
    if kind == "weight_triple":
        if not params or params[0] < 0:
            raise _refuse(kind, op, "expected the weight mask's counter as the first parameter")
        try:
            _check_params("triple", op, shapes, params[1:], world_size)
        except ProtocolError as e:
            raise _refuse(kind, op, str(e).split(": ", 1)[-1]) from None
        return
    if kind == "triple":
        if op not in TRIPLE_OPS:
            raise _refuse(kind, op, f"no Beaver triple for this op; supported: {sorted(TRIPLE_OPS)}")
        if len(params) != TRIPLE_PARAMS[op]:
            raise _refuse(kind, op, f"{len(params)} parameters, expected {TRIPLE_PARAMS[op]}")
        for p, low in zip(params, _CONV_LOWER.get(op, ())):
            if not low <= p <= MAX_CONV_PARAM:
                raise _refuse(kind, op, f"parameter {p} outside [{low}, {MAX_CONV_PARAM}]")
        if op in _CONV_LOWER:  # torch's meta kernels do not check channels against groups
            x, w, groups = shapes[0], shapes[1], params[-1]
            dims = 1 if op == "conv1d" else 2
            channels_ok = (x[1] == w[0] if op == "conv_transpose2d" else x[1] == w[1] * groups)
            if (len(x) != dims + 2 or len(w) != dims + 2 or not channels_ok
                    or w[0] % groups != 0):
                raise _refuse(kind, op, f"operand shapes {tuple(x)} and {tuple(w)} do not fit "
                                        f"groups={groups}")
        return
    if op:
        raise _refuse(kind, op, "only triples take an op")
    if kind in ("trunc", "trunc_exact"):
        if len(params) != 1 or not 0 <= params[0] <= MAX_SHIFT:
            raise _refuse(kind, op, f"expected one shift in [0, {MAX_SHIFT}], got {list(params)[:4]}")
    elif kind == "binary_monomials":
        k = params[0] if params else 0
        if not 1 <= k <= MAX_MONOMIAL_MASKS or len(params) < 1 + k:
            raise _refuse(kind, op, f"expected 1..{MAX_MONOMIAL_MASKS} masks and their owners")
        _, owners, subsets = _split_monomial_params(params)
        if any(not -1 <= o < world_size for o in owners):
            raise _refuse(kind, op, f"mask owner outside [-1, {world_size})")
        if any(not 1 <= m < (1 << k) for m in subsets):
            raise _refuse(kind, op, f"monomial outside [1, 2^{k})")
    elif params:
        raise _refuse(kind, op, "this kind takes no parameters")
    if kind == "bit_mul":
        bit, value = shapes
        if len(bit) != 2 or bit[1] != 1 or len(value) != 2 or value[0] != bit[0]:
            raise _refuse(kind, op, f"expected shapes (m, 1) and (m, w), got {bit} and {value}")


def check_request(kind: str, op: str, shapes, params: Sequence[int], world_size: int,
                  max_component_bytes: int) -> int:
    """Refuse (ProtocolError) a request the protocols never make; else its answer's bytes.

    Nothing is allocated: the kind, op, operand count and parameter ranges are checked, then
    the size of every component (a broadcast or matmul result included) is computed by
    arithmetic (or meta tensors) and compared with `max_component_bytes`.
    """
    if kind not in COMPONENTS and kind not in EXTRA_KINDS and kind not in FIXED_KINDS:
        raise _refuse(kind, op, f"unknown kind; known: "
                                f"{sorted(COMPONENTS) + sorted(EXTRA_KINDS) + list(FIXED_KINDS)}")
    if len(shapes) != OPERANDS.get(kind, 1):
        raise _refuse(kind, op, f"{len(shapes)} operand shapes, expected {OPERANDS.get(kind, 1)}")
    limit = max_component_bytes // 8
    for shape in shapes:
        if any(s < 0 for s in shape):
            raise _refuse(kind, op, f"negative dimension in operand shape {tuple(shape)}")
        if any(s > limit for s in shape) or math.prod(shape) > limit:
            raise _refuse(kind, op, f"operand shape {tuple(shape)} exceeds {max_component_bytes} bytes")
    _check_params(kind, op, shapes, params, world_size)
    try:
        comps = component_shapes(kind, op, shapes, params)
    except (RuntimeError, ValueError) as e:  # shapes that do not broadcast or compose
        raise _refuse(kind, op, f"operand shapes {[tuple(s) for s in shapes]}: {e}") from e
    for shape in comps:
        if math.prod(shape) > limit:
            raise _refuse(kind, op, f"component of shape {tuple(shape)} ({8 * math.prod(shape)} "
                                    f"bytes) exceeds {max_component_bytes} bytes")
    return 8 * sum(math.prod(shape) for shape in comps[len(comps) - correction_count(kind, params):])
