"""Transformer nonlinearities at the cost levels of PUMA / BumbleBee: piecewise polynomials
selected by comparisons batched in ONE MSB circuit, and softmax with coarse range reduction.

GELU and SiLU (no autograd; with requires_grad the sigmoid-based forms of nonlinear.py run,
they save what the backward rule needs). Both are x/2 + E(x) with E even and analytic:
  gelu(x) = x/2 + x erf(x / sqrt 2) / 2,   silu(x) = x/2 + (x/2) tanh(x/2),
E(x) -> |x|/2 for |x| -> inf. So E is a polynomial in y = x^2 on [0, T^2] (half the degree of a
fit in x) and |x|/2 beyond T:
  out = x/2 + P_0(y) + sum_j [y >= s_j] (P_j(y) - P_{j-1}(y))
            + [x >= T] (x/2 - P_m(y)) + [x <= -T] (-x/2 - P_m(y)).
Every bit comes out of one MSB circuit and multiplies its value in the B2A round (kind
bit_mul); the selection is exact in the ring, so a polynomial evaluated outside its segment
(even wrapped) cancels. Each segment has its own variable t in [-1, 1] (Chebyshev fit,
monomials in t); the powers of every segment are computed together, squares (t^2, t^4, t^6)
by square pairs (one opened value) in the same round as the other products.
  gelu (erf and tanh forms): T = 4, one segment of degree 7 in y on [0, 16.6] (the narrow
  tail comparisons may take x up to 1/16 past T for inside): |err| <= 4.0e-4 (fit).
  silu: T = 10, segments y in [0, 25) (degree 7) and [25, 100) (degree 5): |err| <= 5.5e-4.
Rounds (2 parties): 1 (y) + 3 (powers) + 3 (MSB) + 1 (fold) = 8. Domain: |x| < 2^14 at 16
fractional bits (y = x^2 must not wrap), GELU |x| < narrow_range() (narrow
comparisons); the tails are exact relu beyond.

Softmax's exp on z = x - max <= 0: y = z log2 e bucketed by FOUR thresholds at y = -4, -8,
-12, -16 (one MSB circuit; below -16: 0, which also clips masked entries) and
exp(z) = 2^(4k - 20) 2^f, f in [0, 4), 2^f by a degree-7 polynomial (relative error 1e-5):
8 rounds. The row max is an all-pairs maximum over groups of 8, then over the <= 16 group
winners: 12 rounds for 128 columns. One reciprocal per row (_octave_inverse: the
polynomial of every octave beside the comparison circuit, mpc.parallel); the final product
broadcasts it (a mul triple of shapes (R, k) and (R, 1): only e and the R sums are opened).
The attention path (softmax_last) compares narrowly (NARROW_BITS); a decode step's one query
row per head takes exp_pairs (exp of every ordered pair beside the max's comparisons).

Any number of additive parties: between 2 parties with local truncation every
truncation above is free; otherwise (3 or more parties, or CRYPTEN_LITE_TRUNCATION=exact) it
is the dealer-assisted round, and the truncations of one step share one round
(protocol.truncate_many; inside a protocol in rounds protocol.truncate_many_gen, whose
opening rides in the other protocol's round). A comparison on a value's top bits needs no
truncation at all: every party shifts its own share (_shifted), which is exact modulo the
circuit's width up to N units; with N > 2 the narrow comparisons shift one bit less per
doubling of N - 1 (narrow_range: 2^10 between 3 parties instead of 2^11), so that their
error stays below 1/16. Under rss (3 parties, replicated shares) the same paths run:
_shifted shifts each of the three components (as 3 additive parties would), truncate_many
opens every truncation of a step in one round, and the protocols in rounds yield rss
requests that ride in the rounds of rss's comparison circuits (mpc.parallel); a product and
its truncation there are ONE round (products_trunc_gen: the truncation fused into the
reshare). LayerNorm and RMSNorm: 10 rounds under rss. Softmax under rss takes this form for
rows of RSS_FAST_SOFTMAX_MIN entries or more (softmax_last), rss's own form below.
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import numpy as np
import torch

from .. import encoding
from ..mpc import circuits, protocol, rss
from ..mpc.parallel import alongside, drive, opened_sums, split
from ..mpc.binary import provider_get
from ..mpc.primitives import open_many
from ..mpc.replicated import Replicated
from ..provider.correlations import logical_shift
from ..session import current
from ._common import all_pairs_winners, mul_shares, mul_trunc, public_share, truncate

LOG2E = 1.0 / math.log(2.0)


# ---------------------------------------------------------------------- products
def _additive() -> bool:
    return getattr(current().config, "protocol", "additive") == "additive"


def _products(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], prec: int) -> list[torch.Tensor]:
    """Truncated products of several pairs (same-shape operands) in ONE round; a pair whose
    two operands are the same tensor is a square (one opened value instead of two)."""
    if not _additive():
        return mul_trunc(list(pairs), prec)
    s = current()
    sq = [i for i, (a, b) in enumerate(pairs) if a is b]
    ml = [i for i, (a, b) in enumerate(pairs) if a is not b]
    sq_x = torch.cat([pairs[i][0].reshape(-1) for i in sq]) if sq else None
    ml_x = torch.cat([pairs[i][0].reshape(-1) for i in ml]) if ml else None
    ml_y = torch.cat([pairs[i][1].reshape(-1) for i in ml]) if ml else None
    opened, corr_sq, corr_ml = [], None, None
    if sq:
        n = sq_x.numel()
        corr_sq = provider_get("square", n, lambda m: [(m,)], 1)
        opened.append(sq_x - corr_sq[0])
    if ml:
        n = ml_x.numel()
        corr_ml = provider_get("triple", n, lambda m: [(m,), (m,)], 1, op="mul")
        opened += [ml_x - corr_ml[0], ml_y - corr_ml[1]]
    vals = open_many(opened)
    flat = []
    if sq:
        e = vals[0]
        a, c = corr_sq.corrected()
        z = c + 2 * e * a
        if s.rank == 0:
            z += e * e
        flat.append(z)
    if ml:
        e, d = vals[-2], vals[-1]
        a, b, c = corr_ml.corrected()
        z = c + e * b + a * d
        if s.rank == 0:
            z += e * d
        flat.append(z)
    both = truncate(torch.cat(flat), prec)
    out: list = [None] * len(pairs)
    off = 0
    for i in sq + ml:
        m = pairs[i][0].numel()
        out[i] = both[off:off + m].view(pairs[i][0].shape)
        off += m
    return out


def _shifted(v: torch.Tensor, shift: int) -> torch.Tensor:
    """Shares that sum to v / 2^shift within (-(N - 1), 1] units, but only modulo
    2^(64 - shift): for a short MSB circuit on the low bits (a comparison), never as a value.
    Every party shifts its own share, the last one rounding up (between 2 parties: the local
    truncation, whose wrap only moves the bits above 2^(64 - shift)); no communication.
    Under rss every component (x_0, x_1, x_2) is shifted by both its holders alike, x_2
    rounding up: 3 terms, as between 3 additive parties."""
    s = current()
    if isinstance(v, Replicated):
        rank = v.share_rank()
        comps = []
        for j, t in ((rank, v.a), ((rank + 1) % 3, v.b)):
            comps.append(-logical_shift(-t, shift) if j == 2 else logical_shift(t, shift))
        return Replicated(comps[0], comps[1], rank)
    if s.rank == s.world_size - 1 and s.world_size > 1:
        return -logical_shift(-v, shift)
    return logical_shift(v, shift)


def _narrow() -> tuple[int, int]:
    """(shift, bits) of the narrow comparisons: NARROW_SHIFT and NARROW_BITS between 2
    parties. With N > 2 parties _shifted is off by up to N units (not 2), so the shift is
    ceil(log2(N - 1)) bits smaller: the error stays below 2^(NARROW_SHIFT - 16) = 1/16 and
    the circuit at NARROW_BITS, and the range (narrow_range) is that much smaller."""
    n = current().world_size
    extra = math.ceil(math.log2(n - 1)) if n > 2 else 0
    return NARROW_SHIFT - extra, NARROW_BITS


def narrow_range() -> float:
    """The narrow comparisons' range at 16 fractional bits: |x| < 2^11 between 2 parties
    (NARROW_RANGE), 2^10 between 3 (values compared, or a row's entries' differences)."""
    return 2.0 ** (NARROW_BITS - 1 + _narrow()[0] - 16)


def _msb_low(v: torch.Tensor, m: int) -> torch.Tensor:
    fn = getattr(protocol, "msb_low", None)
    if fn is None:  # older layout: the short MSB lives with the int8 protocol steps
        from ..quantized.mpc_ops import msb_low as fn
    return fn(v, m)


def neg_words(v: torch.Tensor, shift: int = 0, bits: int = 0) -> torch.Tensor:
    """Packed XOR shares of [v < 0]: the MSB of (v >> shift) mod 2^bits (default SHORT_BITS:
    3 rounds instead of 4 between 2 parties, half the bytes; NARROW_BITS: a quarter), exact
    for |v| < 2^(bits - 1 + shift) units (each party shifts its own share, _shifted: v moves
    by less than N units of 2^shift)."""
    return _msb_low(_shifted(v, shift) if shift else v, bits or SHORT_BITS)


SHORT_BITS = 32
# Narrow comparisons (2 parties): the values' top bits above 2^-4, in a 16-bit circuit (4
# bytes per comparison instead of 8.25): GELU's tails and the attention softmax's max and exp
# thresholds, whose inputs stay within 2^11 (NARROW_RANGE) of each other.
NARROW_BITS, NARROW_SHIFT = 16, 12
NARROW_RANGE = 2.0 ** (NARROW_BITS - 1 + NARROW_SHIFT - 16)


def _narrow_ok(prec: int) -> bool:
    return prec == 16


def products_round(jobs: Sequence[tuple]) -> list[torch.Tensor]:
    """Untruncated products of several jobs in ONE round (additive): ("square", x) opens one
    value; ("mul", x, y) with broadcasting shapes (e.g. (R, D) x (R, 1): a broadcasting
    triple, only x - A and the R values of y - B are opened)."""
    return drive(products_gen(jobs))


def products_gen(jobs: Sequence[tuple]):
    """products_round as a protocol in rounds (mpc.parallel): yields its one opening (under
    rss its one reshare, rss.products_gen)."""
    if not _additive():
        return (yield from rss.products_gen(jobs))
    s = current()
    corrs, opened = [], []
    for job in jobs:
        if job[0] == "square":
            corr = s.provider.get("square", [tuple(job[1].shape)])
            opened.append(job[1] - corr[0])
        else:
            corr = s.provider.get("triple", [tuple(job[1].shape), tuple(job[2].shape)], "mul", ())
            opened += [job[1] - corr[0], job[2] - corr[1]]
        corrs.append(corr)
    vals = split(opened_sums((yield torch.cat([t.reshape(-1) for t in opened]))), opened)
    out, i = [], 0
    for job, corr in zip(jobs, corrs):
        if job[0] == "square":
            e = vals[i]
            i += 1
            c = corr.corrected()[1]
            z = c + 2 * e * corr[0]
            if s.rank == 0:
                z = z + e * e
        else:
            e, d = vals[i], vals[i + 1]
            i += 2
            c = corr.corrected()[2]
            z = c + e * corr[1] + corr[0] * d
            if s.rank == 0:
                z = z + e * d
        out.append(z)
    return out


def products_trunc_gen(jobs: Sequence[tuple], bits):
    """A protocol in rounds: the values of several jobs, job j divided by 2^bits[j] (or all
    by 2^bits). Jobs: those of products_gen, ("square_sum", x) (the sum of x^2 over the last
    dim, kept) and ("share", x) (x itself, only truncated). Additive: the products' opening,
    then truncate_many_gen's (none where truncation is local); rss: ONE round, the
    truncations fused into the products (rss.products_trunc_gen)."""
    if not _additive():
        return (yield from rss.products_trunc_gen(jobs, bits))
    bits = [bits] * len(jobs) if isinstance(bits, int) else list(bits)
    prod_jobs = [("square", j[1]) if j[0] == "square_sum" else j for j in jobs if j[0] != "share"]
    prods = iter((yield from products_gen(prod_jobs)) if prod_jobs else [])
    vals = [j[1] if j[0] == "share" else next(prods).sum(-1, keepdim=True) if j[0] == "square_sum"
            else next(prods) for j in jobs]
    return (yield from protocol.truncate_many_gen(list(zip(vals, bits))))


def products_trunc(jobs: Sequence[tuple], bits) -> list[torch.Tensor]:
    """products_trunc_gen on its own."""
    return drive(products_trunc_gen(jobs, bits))


def _scaled_many(v: torch.Tensor, es: Sequence[int]) -> list[torch.Tensor]:
    """Shares of v 2^e for each e (a truncation for e < 0), the truncations together."""
    return protocol.truncate_many([(v * (1 << e), 0) if e >= 0 else (v, -e) for e in es])


def bucket_polys_gen(ts: torch.Tensor, coeffs: Sequence[Sequence[float]], prec: int, scale: int):
    """A protocol in rounds (mpc.parallel): shares of sum_k coeffs[n][k] t_n^k at 2^scale
    for the variables ts (N, ...) of N buckets (bucket n's own polynomial, any factor of it
    folded into its coefficients), degree 4: t^2, then t^3 and t^4 (2 rounds). A variable
    far outside [-1, 1] (a bucket the value is not in) gives garbage, which the selection
    (select_buckets) cancels exactly."""
    if any(len(c) != 5 for c in coeffs):
        raise ValueError("bucket_polys_gen: degree 4 polynomials only")
    (t2,) = yield from products_trunc_gen([("square", ts)], prec)
    t3, t4 = yield from products_trunc_gen([("mul", t2, ts), ("square", t2)], prec)
    pw = [None, ts, t2, t3, t4]
    view = (ts.shape[0],) + (1,) * (ts.dim() - 1)
    acc = torch.zeros_like(ts)
    for k in range(1, 5):
        acc = acc + pw[k] * torch.tensor([int(round(c[k] * (1 << scale))) for c in coeffs]).view(view)
    const = torch.tensor([int(round(c[0] * (1 << scale))) for c in coeffs]).view(view)
    (acc,) = yield from protocol.truncate_many_gen([(acc, prec)])
    return acc + public_share(const.expand_as(ts).contiguous())


def select_buckets(bits: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Shares of values[n] where n = the number of set bits, for bits (N - 1) x R (row-major;
    bit j of row r: [x_r >= threshold j], thresholds increasing, so the set bits come first)
    and values (N, R, ...): values[0] + sum_j bit_j (values[j + 1] - values[j]) in ONE round
    (bit times value). Exact in the ring: the values of the other buckets cancel, whatever
    they are."""
    return drive(select_buckets_gen(bits, values))


def select_buckets_gen(bits: torch.Tensor, values: torch.Tensor):
    """select_buckets as a protocol in rounds (mpc.parallel)."""
    return (yield from bits_times_gen(bits, [values[j + 1] - values[j] for j in range(values.shape[0] - 1)],
                                      values[0]))


def bits_times_gen(bits: torch.Tensor, values: Sequence[torch.Tensor], base: torch.Tensor):
    """A protocol in rounds (mpc.parallel): shares of base + sum_j bit_j * values[j] in ONE round
    (bit times value), for bits (len(values) x R, row-major) and values (R, ...) each."""
    if not values:
        return base
    rows = bits.numel() // len(values)
    shape = (rows,) + (1,) * (values[0].dim() - 1)
    muls = [(circuits.pack_bits(bits[j * rows:(j + 1) * rows]), shape, v) for j, v in enumerate(values)]
    _, prods = yield from protocol.finish_gen((), muls)
    out = base
    for p_ in prods:
        out = out + p_
    return out


def polys_many(ts: Sequence[torch.Tensor], coeffs: Sequence[Sequence[float]], prec: int) -> list[torch.Tensor]:
    """Shares of p_i(t_i) for several variables together. Degree 5..7 between 2 additive
    parties (where truncation is local): Paterson-Stockmeyer,
    p = a(t) + t^4 b(t) with a, b of degree <= 3: t^2 | t^3, t^4 | t^4 b(t), 3 rounds and
    48 bytes per element at degree 7 (instead of 72 for t^5, t^6, t^7). Else all powers."""
    degs = [len(c) - 1 for c in coeffs]
    if not all(5 <= d <= 7 for d in degs):
        pws = powers_many(ts, degs, prec)
        return _polys_from_powers(list(zip(pws, coeffs, ts)), prec)
    t2s = _products([(t, t) for t in ts], prec)
    rest = _products([p for t, t2 in zip(ts, t2s) for p in ((t2, t), (t2, t2))], prec)
    jobs = []
    for i, (t, c) in enumerate(zip(ts, coeffs)):
        pw = {1: t, 2: t2s[i], 3: rest[2 * i]}
        jobs += [(pw, c[:4], t), (pw, c[4:], t)]
    polys = _polys_from_powers(jobs, prec)
    tops = _products([(rest[2 * i + 1], polys[2 * i + 1]) for i in range(len(ts))], prec)
    return [polys[2 * i] + top for i, top in enumerate(tops)]


def powers_many(ts: Sequence[torch.Tensor], degree: Sequence[int], prec: int) -> list[dict[int, torch.Tensor]]:
    """Powers t^1..t^d of several variables, all in ceil(log2 max d) rounds; t^(2j) = (t^j)^2
    by squares."""
    pws = [{1: t} for t in ts]
    have = 1
    while have < max(degree):
        top = 2 * have
        jobs = []
        for pw, d in zip(pws, degree):
            for k in range(have + 1, min(top, d) + 1):
                if k % 2 == 0:
                    jobs.append((pw, k, pw[k // 2], pw[k // 2]))
                else:
                    jobs.append((pw, k, pw[have], pw[k - have]))
        prods = _products([(a, b) for _, _, a, b in jobs], prec)
        for (pw, k, _, _), p in zip(jobs, prods):
            pw[k] = p
        have = top
    return pws


def _poly_terms(pw: dict[int, torch.Tensor], coeffs: Sequence[float], prec: int, like):
    """(sum_k>=1 c_k t^k at 2^(2 prec), untruncated; the constant's shares at 2^prec)."""
    acc = torch.zeros_like(like)
    for k in range(1, len(coeffs)):
        acc = acc + pw[k] * int(round(coeffs[k] * (1 << prec)))
    return acc, public_share(torch.full_like(like, int(round(coeffs[0] * (1 << prec)))))


def _polys_from_powers(jobs: Sequence[tuple], prec: int) -> list[torch.Tensor]:
    """sum_k c_k t^k for each (powers, coeffs, like), the truncations together (one round
    where truncation takes one)."""
    terms = [_poly_terms(pw, c, prec, like) for pw, c, like in jobs]
    accs = protocol.truncate_many([(acc, prec) for acc, _ in terms])
    return [acc + const for acc, (_, const) in zip(accs, terms)]


def _to_units(y: torch.Tensor, prec: int, ranges: Sequence[tuple[float, float]]) -> list[torch.Tensor]:
    """Shares of t = (2y - lo - hi) / (hi - lo) (in [-1, 1] for y in [lo, hi]) for each
    range, the truncations together."""
    scaled = []
    for lo, hi in ranges:
        scale = 2.0 / (hi - lo)
        scaled.append((y * int(scale), 0) if scale == int(scale)
                      else (y * int(round(scale * (1 << prec))), prec))
    ts = protocol.truncate_many(scaled)
    return [t - public_share(torch.full_like(y, int(round((lo + hi) / (hi - lo) * (1 << prec)))))
            for t, (lo, hi) in zip(ts, ranges)]


# ------------------------------------------------------------------------- fits
def _gelu_e(y):
    from math import erf
    r = np.sqrt(y)
    return r * np.vectorize(erf)(r / math.sqrt(2.0)) / 2


def _gelu_tanh_e(y):
    r = np.sqrt(y)
    return r / 2 * np.tanh(math.sqrt(2.0 / math.pi) * (r + 0.044715 * r ** 3))


def _silu_e(y):
    r = np.sqrt(y)
    return r / 2 * np.tanh(r / 2)


def _exp2(f):
    return np.exp2(f)


FITS = {"gelu": _gelu_e, "gelu_tanh": _gelu_tanh_e, "silu": _silu_e, "exp2": _exp2}


@functools.lru_cache(maxsize=None)
def fit(name: str, lo: float, hi: float, degree: int) -> tuple[float, ...]:
    """Monomial coefficients in t = (2y - lo - hi) / (hi - lo) of the Chebyshev interpolant of
    FITS[name] on [lo, hi]."""
    nodes = np.cos(np.pi * (np.arange(degree + 1) + 0.5) / (degree + 1))
    ys = (nodes * (hi - lo) + (lo + hi)) / 2
    cheb = np.polynomial.chebyshev.chebfit(nodes, FITS[name](ys), degree)
    return tuple(float(c) for c in np.polynomial.chebyshev.cheb2poly(cheb))


# (tail T, segments of y = x^2 as (lo, hi, degree)); the last hi is T^2.
EVEN_SPECS = {
    # GELU's tail bits are narrow comparisons (|x| < NARROW_RANGE): x may be taken for inside
    # up to 1/16 past T = 4, so its polynomial covers y = x^2 up to 16.6
    "gelu": (4.0, ((0.0, 16.6, 7),)),
    "gelu_tanh": (4.0, ((0.0, 16.6, 7),)),
    "silu": (10.0, ((0.0, 25.0, 7), (25.0, 100.0, 5))),
}


def _enc(v: float, prec: int, like: torch.Tensor) -> torch.Tensor:
    return public_share(torch.full_like(like, int(round(v * (1 << prec)))))


def half_plus_even(xs: torch.Tensor, prec: int, name: str) -> torch.Tensor:
    """Shares of x/2 + E(x) for EVEN_SPECS[name] (gelu, gelu_tanh, silu)."""
    tail, segs = EVEN_SPECS[name]
    (y,) = _products([(xs, xs)], prec)
    ts = _to_units(y, prec, [(lo, hi) for lo, hi, _ in segs])
    polys = polys_many(ts, [fit(name, lo, hi, d) for lo, hi, d in segs], prec)
    # Bits: [y >= s_j] for the inner breakpoints, [x >= T], [x <= -T]; one MSB circuit.
    items = [y - _enc(lo, prec, xs) for lo, _, _ in segs[1:]]
    items += [xs - _enc(tail, prec, xs), -xs - _enc(tail, prec, xs)]
    flats = [v.reshape(-1) for v in items]
    n = xs.numel()
    if len(segs) == 1 and _narrow_ok(prec):              # only x against +-T: narrow
        words = neg_words(torch.cat(flats), *_narrow())
    else:
        words = neg_words(torch.cat(flats))              # [v < 0]: the complement of each bit
    bits = circuits.unpack_bits(words, n * len(items))
    bits = protocol.xor_public(bits, 1)                  # [v >= 0]
    half = _half(xs)
    values = [polys[j] - polys[j - 1] for j in range(1, len(polys))]
    values += [half - polys[-1], -half - polys[-1]]
    flat = drive(bits_times_gen(bits, [v.reshape(n) for v in values], (half + polys[0]).reshape(n)))
    return flat.view(xs.shape)


def _half(xs: torch.Tensor) -> torch.Tensor:
    """Shares of x / 2 (one local truncation at 2 parties)."""
    return truncate(xs, 1)


# ---------------------------------------------------------------------- softmax
EXP_BUCKETS = (-16, -12, -8, -4)   # thresholds of y = z log2 e; below the first: 0
EXP_DEGREE = 7


def _exp_threshold_items(z: torch.Tensor, prec: int) -> list[torch.Tensor]:
    """z - tau for the thresholds tau = EXP_BUCKETS / log2 e (in increasing order)."""
    return [z - public_share(encoding.encode(torch.tensor(float(t) / LOG2E), prec).expand_as(z))
            for t in EXP_BUCKETS]


def exp_nonpos(z: torch.Tensor, prec: int, narrow: bool = False) -> torch.Tensor:
    """Shares of exp(z) for z <= 0 (0 where z log2 e < -16), 8 rounds between 2 parties.
    narrow (2 parties, z > -NARROW_RANGE, z <= 1/8 allowed): narrow threshold comparisons."""
    items = _exp_threshold_items(z, prec)
    flats = [v.reshape(-1) for v in items]
    n = z.numel()
    if narrow and _narrow_ok(prec):
        words = neg_words(torch.cat(flats), *_narrow())
    else:
        words = neg_words(torch.cat(flats), 2)           # [z < tau]; |z| < 2^17
    bits = circuits.unpack_bits(words, n * len(items))
    bits = protocol.xor_public(bits, 1)                  # [z >= tau]
    arith = protocol.b2a(circuits.pack_bits(bits), n * len(items)).view(len(items), *z.shape)
    k = arith.sum(0)                                      # 0..4
    # bucket k >= 1: y in [4k - 20, 4k - 16), f = y + 20 - 4k in [0, 4); the polynomial's
    # variable t = f/2 - 1 = y/2 + 9 - 2k (y/2 straight from z: one truncation)
    half_y = truncate(z * int(round(LOG2E / 2 * (1 << prec))), prec)
    t = half_y + _enc(9.0, prec, z) - (k << (prec + 1))
    q = 16                                                # a = 2^(4k - 20) at 2^q: 1, 16, 256, 4096
    weights = [1, 15, 240, 3840]
    a = torch.zeros_like(z)
    for b, w in zip(arith, weights):
        a = a + b * w
    (p,) = polys_many([t], [fit("exp2", 0.0, 4.0, EXP_DEGREE)], prec)
    (out,) = mul_trunc([(a, p)], q)   # one round under rss (the truncation fused)
    return out


ALL_PAIRS_MAX = 1 << 16  # row_max(all_pairs=True): at most this many comparisons at once


def row_max(flat: torch.Tensor, all_pairs: bool = False, narrow: bool = False) -> torch.Tensor:
    """Shares of the max of each row of `flat` (R, k): all-pairs over groups of 8 while more
    than 16 remain, then all-pairs over the rest (a short row is padded with copies of its
    first entry, which leave the max alone). all_pairs (softmax_last of one query row per
    head: a decode step against its cache, 12 rows of 33 in GPT-2 small) takes all R k(k-1)/2
    pairs at once when they are at most ALL_PAIRS_MAX: one level instead of two or more.
    narrow (pairwise_max): a row's entries within NARROW_RANGE of each other; the result is
    an entry within 1/8 of the max."""
    v = flat
    rows = v.shape[0]
    if all_pairs and rows * v.shape[1] * (v.shape[1] - 1) // 2 <= ALL_PAIRS_MAX:
        return pairwise_max(v, narrow)
    while v.shape[1] > 16:
        pad = (-v.shape[1]) % 8
        if pad:
            v = torch.cat([v, v[:, :1].expand(rows, pad)], 1)
        v = pairwise_max(v.reshape(-1, 8), narrow).view(rows, -1)
    return pairwise_max(v, narrow)


def pairwise_max(v: torch.Tensor, narrow: bool = False) -> torch.Tensor:
    """Shares of each row's max (R, k) by all k(k-1)/2 comparisons at once (neg_words on the
    exact differences, no truncation, so that the comparisons stay a total order: between 2
    parties |x_i - x_j| < 2^15 at 16 fractional bits), the AND of each
    candidate's k - 1 wins (ceil(log2(k - 1)) rounds) and one bit-times-value round.
    narrow: the differences of the entries' top bits (each entry truncated once, so the
    order stays total) in a narrow circuit; the entry chosen is within 1/8 of the max."""
    rows, k = v.shape
    if k == 1:
        return v[:, 0]
    i, j = torch.triu_indices(k, k, 1)
    npairs = i.numel()
    beats = circuits.unpack_bits(_pair_lt_words(v, i, j, narrow),
                                 rows * npairs).view(rows, npairs)   # [x_i < x_j]: j beats i
    onehot = all_pairs_winners(beats, k)                  # (rows, k): the first largest
    _, (out,) = protocol.finish((), [(circuits.pack_bits(onehot.reshape(-1)), (rows, k), v)])
    return out.sum(1)


def _pair_lt_items(v: torch.Tensor, i: torch.Tensor, j: torch.Tensor, narrow: bool) -> torch.Tensor:
    """The values whose sign is [v_i < v_j] for the pairs (i, j) of each row (flat), for a
    circuit of NARROW_BITS (narrow, 2 parties: the entries' top bits) or SHORT_BITS."""
    if narrow:
        top = _shifted(v, _narrow()[0])
        return (top[:, i] - top[:, j]).reshape(-1)
    return (v[:, i] - v[:, j]).reshape(-1)


def _pair_lt_words(v: torch.Tensor, i: torch.Tensor, j: torch.Tensor, narrow: bool) -> torch.Tensor:
    items = _pair_lt_items(v, i, j, narrow)
    if narrow:
        return _msb_low(items, _narrow()[1])
    return neg_words(items)


def mul_rows(e: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """Shares of e * inv[:, None] (untruncated): a broadcasting mul triple, so only e and the
    R row values are opened."""
    if not _additive():
        (out,) = mul_shares([(e, inv.unsqueeze(-1))])
        return out
    return protocol.mul("mul", e, inv.unsqueeze(-1))


# -------------------------------------------------------------------- layer norm
ISQRT_J = range(-13, 16)      # thresholds 2^j on v = var + eps: v in [2^-14, 2^15)
ISQRT_DEGREE = 4              # 1/sqrt(m) on m in [1, 2): relative error 8.4e-5 (fit)
_Q2 = 24                      # scale of 1/sqrt(v) (up to 2^7) before the final product
VAR_EXTRA = 8                 # the variance's fractional bits beyond the precision's
VAR_DIV_BITS = 22             # 1/d at 2^22: relative error at most d 2^-23 (1e-4 at d = 768)


@functools.lru_cache(maxsize=None)
def _cheb_monomials(fn_name: str, degree: int) -> tuple[float, ...]:
    """Monomial coefficients in t in [-1, 1] of the Chebyshev interpolant of 1/sqrt(m)
    ("isqrt") or 1/m ("recip"), m = (t + 3) / 2 in [1, 2)."""
    nodes = np.cos(np.pi * (np.arange(degree + 1) + 0.5) / (degree + 1))
    m = (nodes + 3) / 2
    vals = 1.0 / np.sqrt(m) if fn_name == "isqrt" else 1.0 / m
    cheb = np.polynomial.chebyshev.chebfit(nodes, vals, degree)
    return tuple(float(x) for x in np.polynomial.chebyshev.cheb2poly(cheb))


def _octave_inverse(v: torch.Tensor, lo: int, js: Sequence[int], fn_name: str, prec: int,
                    scale: int, v_prec: int | None = None) -> torch.Tensor:
    """Shares of 1/sqrt(v) ("isqrt") or 1/v ("recip") per row of v (R, 1) at 2^scale, for v
    in [2^lo, 2^(js[-1] + 1)), thresholds 2^j (j in js, increasing, js[0] = lo + 1) between
    2 additive parties, in 4 rounds (under rss the same riding, in rss's circuit's rounds). Bucket n (n thresholds met): v in [2^L, 2^(L+1)),
    L = lo + n, v = 2^L m with m in [1, 2), and 1/sqrt(v) = 2^(-L/2) p((2m - 3)) with p of
    degree 4 (1/v = 2^-L p). The comparisons [v >= 2^j] (one short MSB circuit, 3 rounds)
    and the polynomials of EVERY bucket (2 rounds, their openings riding in the circuit's:
    mpc.parallel) run together; one bit-times-value round selects the row's bucket.
    v_prec: v's scale (default prec) when v carries more fractional bits than the
    polynomials (LayerNorm's variance: small variances keep their relative precision); the
    comparisons then drop the extra bits (a 32-bit circuit on v >> (2 + v_prec - prec))."""
    v_prec = prec if v_prec is None else v_prec
    extra = v_prec - prec
    rows = v.shape[0]
    ls = [lo + n for n in range(len(js) + 1)]
    ts = torch.stack(_scaled_many(v, [1 - L - extra for L in ls])) - _enc(3.0, prec, v)
    base = _cheb_monomials(fn_name, ISQRT_DEGREE)
    power = 0.5 if fn_name == "isqrt" else 1.0
    coeffs = [[c * 2.0 ** (-power * L) for c in base] for L in ls]
    side = bucket_polys_gen(ts, coeffs, prec, scale)
    if not js:
        return drive(side)[0]
    items = torch.cat([(v - _enc(2.0 ** j, v_prec, v)).reshape(-1) for j in js])
    words, values = alongside(lambda: neg_words(items, 2 + extra), side)
    bits = protocol.xor_public(circuits.unpack_bits(words, rows * len(js)), 1)   # [v >= 2^j]
    return select_buckets(bits, values)


def layer_norm_share(c: torch.Tensor, prec: int, eps: float, gamma: torch.Tensor | None,
                     public_weight: bool = False, saved: bool = False):
    """Shares of c / sqrt(mean(c^2) + eps) * gamma per row of the centered rows c (R, D), at
    `prec`; gamma: shares (D,), the encoded public weight (public_weight) or None. 8 rounds
    between 2 parties:
      1      c^2 (squares) and c * gamma (a broadcasting triple: D values of gamma opened)
      2      var = sum(c^2) / d at 2^(prec + 8), its truncation exact (R values)
      3-6    1/sqrt(v) per row, v = var + eps (_octave_inverse: [v >= 2^j] for every j in
             ISQRT_J by one short MSB circuit, beside the degree-4 polynomial of every
             octave; the bucket's value selected in round 6)
      7      (c gamma) * 1/sqrt(v) (a broadcasting triple: R values)
      8      its exact truncation (protocol.truncate_exact; a dealer pair per element)
    Between 3 additive parties round 1's truncations take a round more. Under rss 10 rounds:
    round 1 is one fused product-and-truncation round (the row sums of the squares' cross
    terms, R values, and c * gamma), then the variance's truncation, the octave polynomials
    (3 rounds) riding in the 32-bit comparison circuit's 6, the selection (1 round with
    random bits made offline, else 2), and round 7 with 8 (rss truncation is exact).
    Domain: var + eps in [2^-14, 2^15) (6.1e-5 to 32768). saved=True (autograd): returns
    (out, x_hat, inv_std) too, x_hat from one more product in round 7."""
    rows, d = c.shape
    secret = gamma is not None and not public_weight
    vp = prec + VAR_EXTRA
    # the variance at 2^(prec + VAR_EXTRA) (24 bits): a row of variance 6e-5 (MaxViT's LayerNorms) has
    # 4 units of 2^-16, whose rounding moved 1/sqrt by up to 12%; 2^-24 keeps 0.002%
    jobs = [("square_sum", c)]
    if secret:
        jobs.append(("mul", c, gamma.reshape(1, d)))
    elif gamma is not None:
        jobs.append(("share", c * gamma.reshape(1, d)))
    got = products_trunc(jobs, [2 * prec - vp, prec])
    total, cg = got[0], (got[1] if gamma is not None else c)
    # total / d at 2^vp: total (< d 2^15 at 2^vp) times 2^22 / d stays below 2^62; the product's
    # scale (2^(vp + 22)) makes a local truncation fail with probability var 2^-18 per row,
    # so this one is exact (R values, one round between 2 parties)
    var = protocol.truncate_exact(total * int(round((1 << VAR_DIV_BITS) / d)), VAR_DIV_BITS)
    v = var + _enc(eps, vp, var)
    js = list(ISQRT_J)
    inv = _octave_inverse(v, js[0] - 1, js, "isqrt", prec, _Q2, v_prec=vp)
    # The final products sit at scale 2^(prec + _Q2) = 2^40: a local truncation would fail
    # by a wrap with probability |y| 2^-24 per element (y the output), about 0.1 per
    # BERT-base inference (25 LayerNorms of 128 x 768); the exact one costs a round (under
    # rss none: its truncation is exact and fused into the product's round).
    jobs = [("mul", cg, inv)] + ([("mul", c, inv)] if saved else [])
    if _additive():
        outs = products_round(jobs)
        both = protocol.truncate_exact(torch.cat([o.reshape(-1) for o in outs]), _Q2)
        outs = [both[:outs[0].numel()].view(outs[0].shape)] + (
            [both[outs[0].numel():].view(outs[1].shape)] if saved else [])
    else:
        outs = products_trunc(jobs, _Q2)
    if not saved:
        return outs[0]
    return outs[0], outs[1], truncate(inv, _Q2 - prec)


# ------------------------------------------------------------- attention softmax
def poly7_gen(ts: torch.Tensor, coeffs: Sequence[float], prec: int):
    """A protocol in rounds (mpc.parallel): shares of p(t) (degree 7, Paterson-Stockmeyer
    p = a(t) + t^4 b(t)) for every entry of ts, in 3 rounds (t^2 | t^3, t^4 | t^4 b(t))."""
    (t2,) = yield from products_trunc_gen([("square", ts)], prec)
    t3, t4 = yield from products_trunc_gen([("mul", t2, ts), ("square", t2)], prec)
    pw = {1: ts, 2: t2, 3: t3}
    (low_acc, low_c), (high_acc, high_c) = (_poly_terms(pw, coeffs[:4], prec, ts),
                                            _poly_terms(pw, coeffs[4:], prec, ts))
    if not _additive():
        # rss: truncation is exact and fused into the product, so t^4 multiplies b(t) at
        # 2^(2 prec) untruncated (the product at 2^(3 prec), |t| <= 1 in the row's bucket)
        # and a(t)'s truncation shares that round: 3 rounds, 2 truncations per entry
        wide = high_acc + public_share(torch.full_like(ts, int(round(coeffs[4] * (1 << (2 * prec))))))
        low, top = yield from products_trunc_gen([("share", low_acc), ("mul", t4, wide)], [prec, 2 * prec])
        return low + low_c + top
    low, high = yield from protocol.truncate_many_gen([(low_acc, prec), (high_acc, prec)])
    (top,) = yield from products_trunc_gen([("mul", t4, high + high_c)], prec)
    return low + low_c + top


EXP_PAIRS_MAX = 1 << 14  # exp_pairs: at most this many ordered pairs (about 270 bytes each)


def exp_pairs(flat: torch.Tensor, prec: int, narrow: bool = False) -> torch.Tensor:
    """Shares of exp(x - max) per row of `flat` (R, k) without first computing the max: for
    every ordered pair (i, j) the exponential E_ij = exp(x_j - x_i) of exp_nonpos (four
    thresholds, the polynomial of each bucket), then e_j = sum_i w_i E_ij with w the one-hot
    of the row's first largest entry. 7 rounds instead of 7 (max) + 8 (exp):
      1-3    ONE short MSB circuit over the pairs' comparisons [x_i < x_j] and the four
             thresholds of every x_j - x_i, beside the four bucket polynomials of every pair
             (their openings riding in the circuit's rounds, mpc.parallel)
      4-6    w: the AND of each candidate's k - 1 wins (k <= 65), beside E_ij, the pair's
             bucket selected (bit times value), in round 4
      7      e_j = sum_i w_i E_ij (bit times value)
    A row whose i is not the max has z = x_j - x_i > 0 somewhere: its E_ij are garbage that
    w_i = 0 cancels exactly. For short rows (a decode step's query against its cache):
    k (k - 1) ordered pairs per row."""
    rows, k = flat.shape
    iu, ju = torch.triu_indices(k, k, 1)
    off = ~torch.eye(k, dtype=torch.bool)
    oi, oj = off.nonzero(as_tuple=True)                  # ordered pairs i != j, row-major
    npairs, nord = iu.numel(), oi.numel()
    z = (flat[:, oj] - flat[:, oi]).reshape(-1)          # x_j - x_i
    cmp = _pair_lt_items(flat, iu, ju, narrow)           # [x_i < x_j]: j beats i
    shift, bits_ = _narrow() if narrow else (2, SHORT_BITS)
    thr = [_shifted(v, shift) for v in _exp_threshold_items(z, prec)]   # [z < tau]
    half_y = truncate(z * int(round(LOG2E / 2 * (1 << prec))), prec)
    ts = torch.stack([half_y + _enc(9.0 - 2 * b, prec, z) for b in range(1, 5)])
    side = poly7_gen(ts, fit("exp2", 0.0, 4.0, EXP_DEGREE), prec)
    items = torch.cat([cmp] + thr)
    words, polys = alongside(lambda: _msb_low(items, bits_), side)
    bits = circuits.unpack_bits(words, items.numel())
    beats = bits[:cmp.numel()].view(rows, npairs)
    above = protocol.xor_public(bits[cmp.numel():], 1)   # [z >= tau], threshold-major
    # bucket b >= 1: exp = 2^(4b - 20) 2^f; below the first threshold: 0
    values = torch.stack([torch.zeros_like(z)] + protocol.truncate_many(
        [(polys[b - 1], 20 - 4 * b) for b in range(1, 5)]))
    # w (the AND of each candidate's wins), the pairs' buckets selected in its first round
    onehot, pair_exp = alongside(lambda: all_pairs_winners(beats, k), select_buckets_gen(above, values))
    grid = public_share(torch.full((rows, k, k), 1 << prec, dtype=torch.int64))
    grid[:, oi, oj] = pair_exp.view(rows, nord)
    _, (prods,) = protocol.finish((), [(circuits.pack_bits(onehot.reshape(-1)), (rows * k, 1),
                                        grid.reshape(rows * k, k))])
    return prods.view(rows, k, k).sum(1)


def softmax_rows_share(flat: torch.Tensor, prec: int, all_pairs: bool = False) -> torch.Tensor:
    """Shares of softmax over each row of `flat` (R, k), additive protocol: the row
    max and exp(x - max) as in nonlinear.softmax, then ONE reciprocal per row
    (_octave_inverse: [sum >= 2^j] for 2^j <= k beside the degree-4 polynomial of every
    octave, 4 rounds) and the final product (a broadcasting triple: only e and the R
    reciprocals are opened): max 12 (128 columns), exp 8, 1/sum and product 5."""
    rows, k = flat.shape
    narrow = _narrow_ok(prec)
    if all_pairs and k > 1 and rows * k * (k - 1) <= EXP_PAIRS_MAX:
        e = exp_pairs(flat, prec, narrow)
    else:
        mx = row_max(flat, all_pairs, narrow)
        e = exp_nonpos(flat - mx.unsqueeze(-1), prec, narrow)
    total = e.sum(-1, keepdim=True)                       # in [1, k]: the max's own term is 1
    js = list(range(1, max(1, math.ceil(math.log2(k))) + 1)) if k > 1 else []
    inv = _octave_inverse(total, 0, js, "recip", prec, prec)
    (out,) = products_trunc([("mul", e, inv)], prec)
    return out


RSS_FAST_SOFTMAX_MIN = 64   # under rss, rows at least this long take softmax_rows_share


def softmax_last(x):
    """softmax over the last dim of a float CrypTensor: softmax_rows_share (attention: a
    row's entries within narrow_range() of each other at 16 fractional bits, 2^11 between 2
    parties and 2^10 between 3; 2^15 at other precisions), nonlinear.softmax otherwise.
    Under rss softmax_rows_share only for rows of RSS_FAST_SOFTMAX_MIN entries or more (an
    encoder's attention over its sequence: 12 heads of [128, 128] in 38 rounds, 32.5 MB and
    0.8 s instead of 40, 54.9 MB, 1.0 s); shorter rows (a decode step's one query against
    its cache, a classifier's [1000, 10]) take rss's own form, whose fewer bytes and less
    work beat the fast form's fewer rounds there (12 heads of [1, 33]: 0.19 s against 0.24)."""
    from ..cryptensor import _record
    from .nonlinear import softmax
    from ._common import float_view, new_like
    if x.dim() == 0 or x.shape[-1] < 1 or (not _additive() and x.shape[-1] < RSS_FAST_SOFTMAX_MIN):
        return softmax(x, -1)
    x_f = float_view(x)
    flat = x_f.share.reshape(-1, x_f.shape[-1])
    one_query = x_f.dim() >= 2 and x_f.shape[-2] == 1   # a decode step's query row per head
    out = softmax_rows_share(flat, x_f.precision, all_pairs=one_query).view(x_f.shape)
    return _record(new_like(x_f, out), "softmax", (x,), dim=x_f.dim() - 1)
