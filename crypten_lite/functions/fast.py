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
  gelu (erf and tanh forms): T = 4, one segment of degree 7 in y: |err| <= 2.8e-4 (fit).
  silu: T = 10, segments y in [0, 25) (degree 7) and [25, 100) (degree 5): |err| <= 5.5e-4.
Rounds (2 parties): 1 (y) + 3 (powers) + 6 (MSB) + 1 (fold) = 11. Domain: |x| < 2^14 at 16
fractional bits (y = x^2 must not wrap); the tails are exact relu beyond.

Softmax's exp on z = x - max <= 0: y = z log2 e bucketed by FOUR thresholds at y = -4, -8,
-12, -16 (one MSB circuit; below -16: 0, which also clips masked entries) and
exp(z) = 2^(4k - 20) 2^f, f in [0, 4), 2^f by a degree-7 polynomial (relative error 1e-5):
the same 11 rounds as the old 17-threshold exp with a quarter of its comparisons. The row max
is an all-pairs maximum over groups of 8, then over the <= 16 group winners: 21 rounds for
128 columns instead of 49 for the binary tree. One reciprocal per row; the final product
broadcasts it (a mul triple of shapes (R, k) and (R, 1): only e and the R sums are opened).
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import numpy as np
import torch

from .. import encoding
from ..mpc import beaver, circuits, protocol
from ..mpc.binary import provider_get
from ..mpc.primitives import open_many
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


def _short_ok() -> bool:
    """Short comparisons (and free local truncation) apply: 2 parties, additive sharing."""
    return _additive() and current().world_size == 2


def _msb_low(v: torch.Tensor, m: int) -> torch.Tensor:
    fn = getattr(protocol, "msb_low", None)
    if fn is None:  # older layout: the short MSB lives with the int8 protocol steps
        from ..quantized.mpc_ops import msb_low as fn
    return fn(v, m)


def neg_words(v: torch.Tensor, shift: int = 0) -> torch.Tensor:
    """Packed XOR shares of [v < 0]. Between 2 additive parties: the MSB of (v >> shift)
    mod 2^32 (5 rounds instead of 6, half the bytes), exact for |v| < 2^(31 + shift) units
    (the local truncation by `shift` bits moves v by at most one unit of 2^shift); otherwise
    the full 64-bit MSB."""
    if not _short_ok():
        return protocol.msb_words(v)
    return _msb_low(truncate(v, shift) if shift else v, SHORT_BITS)


SHORT_BITS = 32


def products_round(jobs: Sequence[tuple]) -> list[torch.Tensor]:
    """Untruncated products of several jobs in ONE round (additive): ("square", x) opens one
    value; ("mul", x, y) with broadcasting shapes (e.g. (R, D) x (R, 1): a broadcasting
    triple, only x - A and the R values of y - B are opened)."""
    if not _additive():
        return [mul_shares([(j[1], j[1] if j[0] == "square" else j[2])])[0] for j in jobs]
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
    vals = open_many(opened)
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


def polys_many(ts: Sequence[torch.Tensor], coeffs: Sequence[Sequence[float]], prec: int) -> list[torch.Tensor]:
    """Shares of p_i(t_i) for several variables together. Degree 5..7 between 2 additive
    parties (where truncation is local): Paterson-Stockmeyer,
    p = a(t) + t^4 b(t) with a, b of degree <= 3: t^2 | t^3, t^4 | t^4 b(t), 3 rounds and
    48 bytes per element at degree 7 (instead of 72 for t^5, t^6, t^7). Else all powers."""
    degs = [len(c) - 1 for c in coeffs]
    if not (_short_ok() and all(5 <= d <= 7 for d in degs)):  # b(t)'s truncation: local at 2
        pws = powers_many(ts, degs, prec)
        return [_poly_from_powers(pw, c, prec, t) for pw, c, t in zip(pws, coeffs, ts)]
    t2s = _products([(t, t) for t in ts], prec)
    rest = _products([p for t, t2 in zip(ts, t2s) for p in ((t2, t), (t2, t2))], prec)
    lows, highs = [], []
    for i, (t, c) in enumerate(zip(ts, coeffs)):
        pw = {1: t, 2: t2s[i], 3: rest[2 * i]}
        lows.append(_poly_from_powers(pw, c[:4], prec, t))
        highs.append(_poly_from_powers(pw, c[4:], prec, t))
    tops = _products([(rest[2 * i + 1], highs[i]) for i in range(len(ts))], prec)
    return [lo + hi for lo, hi in zip(lows, tops)]


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


def _poly_from_powers(pw: dict[int, torch.Tensor], coeffs: Sequence[float], prec: int, like) -> torch.Tensor:
    acc = torch.zeros_like(like)
    for k in range(1, len(coeffs)):
        acc = acc + pw[k] * int(round(coeffs[k] * (1 << prec)))
    return truncate(acc, prec) + public_share(torch.full_like(like, int(round(coeffs[0] * (1 << prec)))))


def _to_unit(y: torch.Tensor, prec: int, lo: float, hi: float) -> torch.Tensor:
    """Shares of t = (2y - lo - hi) / (hi - lo) (in [-1, 1] for y in [lo, hi])."""
    scale = 2.0 / (hi - lo)
    if scale == int(scale):
        t = y * int(scale)
    else:
        t = truncate(y * int(round(scale * (1 << prec))), prec)
    return t - public_share(torch.full_like(y, int(round((lo + hi) / (hi - lo) * (1 << prec)))))


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
    "gelu": (4.0, ((0.0, 16.0, 7),)),
    "gelu_tanh": (4.0, ((0.0, 16.0, 7),)),
    "silu": (10.0, ((0.0, 25.0, 7), (25.0, 100.0, 5))),
}


def _enc(v: float, prec: int, like: torch.Tensor) -> torch.Tensor:
    return public_share(torch.full_like(like, int(round(v * (1 << prec)))))


def half_plus_even(xs: torch.Tensor, prec: int, name: str) -> torch.Tensor:
    """Shares of x/2 + E(x) for EVEN_SPECS[name] (gelu, gelu_tanh, silu)."""
    tail, segs = EVEN_SPECS[name]
    (y,) = _products([(xs, xs)], prec)
    ts = [_to_unit(y, prec, lo, hi) for lo, hi, _ in segs]
    polys = polys_many(ts, [fit(name, lo, hi, d) for lo, hi, d in segs], prec)
    # Bits: [y >= s_j] for the inner breakpoints, [x >= T], [x <= -T]; one MSB circuit.
    items = [y - _enc(lo, prec, xs) for lo, _, _ in segs[1:]]
    items += [xs - _enc(tail, prec, xs), -xs - _enc(tail, prec, xs)]
    flats = [v.reshape(-1) for v in items]
    n = xs.numel()
    words = neg_words(torch.cat(flats))                  # [v < 0]: the complement of each bit
    bits = circuits.unpack_bits(words, n * len(items))
    bits = protocol.xor_public(bits, 1)                  # [v >= 0]
    half = _half(xs)
    values = [polys[j] - polys[j - 1] for j in range(1, len(polys))]
    values += [half - polys[-1], -half - polys[-1]]
    muls = [(circuits.pack_bits(bits[i * n:(i + 1) * n]), (n, 1), v.reshape(n, 1))
            for i, v in enumerate(values)]
    _, prods = protocol.finish((), muls)
    out = half + polys[0]
    for p in prods:
        out = out + p.view(xs.shape)
    return out


def _half(xs: torch.Tensor) -> torch.Tensor:
    """Shares of x / 2 (one local truncation at 2 parties)."""
    return truncate(xs, 1)


# ---------------------------------------------------------------------- softmax
EXP_BUCKETS = (-16, -12, -8, -4)   # thresholds of y = z log2 e; below the first: 0
EXP_DEGREE = 7


def exp_nonpos(z: torch.Tensor, prec: int) -> torch.Tensor:
    """Shares of exp(z) for z <= 0 (0 where z log2 e < -16), 11 rounds between 2 parties."""
    items = [(z - public_share(encoding.encode(torch.tensor(float(t) / LOG2E), prec).expand_as(z)))
             for t in EXP_BUCKETS]
    flats = [v.reshape(-1) for v in items]
    n = z.numel()
    words = neg_words(torch.cat(flats), 2)               # [z < tau]; |z| < 2^17
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
    (prod,) = mul_shares([(a, p)])
    return truncate(prod, q)


ALL_PAIRS_MAX = 1 << 16  # row_max(all_pairs=True): at most this many comparisons at once


def row_max(flat: torch.Tensor, all_pairs: bool = False) -> torch.Tensor:
    """Shares of the max of each row of `flat` (R, k): all-pairs over groups of 8 while more
    than 16 remain, then all-pairs over the rest (a short row is padded with copies of its
    first entry, which leave the max alone). all_pairs (softmax_last of one query row per
    head: a decode step against its cache, 12 rows of 33 in GPT-2 small) takes all R k(k-1)/2
    pairs at once when they are at most ALL_PAIRS_MAX: one level instead of two or more."""
    v = flat
    rows = v.shape[0]
    if all_pairs and rows * v.shape[1] * (v.shape[1] - 1) // 2 <= ALL_PAIRS_MAX:
        return pairwise_max(v)
    while v.shape[1] > 16:
        pad = (-v.shape[1]) % 8
        if pad:
            v = torch.cat([v, v[:, :1].expand(rows, pad)], 1)
        v = pairwise_max(v.reshape(-1, 8)).view(rows, -1)
    return pairwise_max(v)


def pairwise_max(v: torch.Tensor) -> torch.Tensor:
    """Shares of each row's max (R, k) by all k(k-1)/2 comparisons at once (neg_words on the
    exact differences, no truncation, so that the comparisons stay a total order: between 2
    parties |x_i - x_j| < 2^15 at 16 fractional bits), the AND of each
    candidate's k - 1 wins (ceil(log2(k - 1)) rounds) and one bit-times-value round."""
    rows, k = v.shape
    if k == 1:
        return v[:, 0]
    i, j = torch.triu_indices(k, k, 1)
    npairs = i.numel()
    beats = circuits.unpack_bits(neg_words((v[:, i] - v[:, j]).reshape(-1)),
                                 rows * npairs).view(rows, npairs)   # [x_i < x_j]: j beats i
    onehot = all_pairs_winners(beats, k)                  # (rows, k): the first largest
    _, (out,) = protocol.finish((), [(circuits.pack_bits(onehot.reshape(-1)), (rows, k), v)])
    return out.sum(1)


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
_Q = 16                       # scale of the bucket factors 2^-L (exact: L <= 16)
_Q2 = 24                      # scale of 2^(-L/2)


def layer_norm_ok() -> bool:
    """The fast LayerNorm applies (2 additive parties: short comparisons, local truncation)."""
    return _short_ok()


def layer_norm_share(c: torch.Tensor, prec: int, eps: float, gamma: torch.Tensor | None,
                     public_weight: bool = False, saved: bool = False):
    """Shares of c / sqrt(mean(c^2) + eps) * gamma per row of the centered rows c (R, D), at
    `prec`; gamma: shares (D,), the encoded public weight (public_weight) or None. 10 rounds
    between 2 parties:
      1      c^2 (squares) and c * gamma (a broadcasting triple: D values of gamma opened)
      2-6    [v >= 2^j] for every j in ISQRT_J, v = var + eps (one short MSB circuit, per row)
      7      B2A of the bits and m = v 2^-L in [1, 2) as bits times public multiples of v
      8      t^2 of t = 2m - 3, and (c gamma) * 2^(-L/2) (a broadcasting triple: R values)
      9      t^3, t^4: p(t) ~ 1/sqrt(m) (degree 4)
      10     (c gamma 2^(-L/2)) * p (a broadcasting triple)
    Domain: var + eps in [2^-14, 2^15) (6.1e-5 to 32768). saved=True (autograd): returns
    (out, x_hat, inv_std) too, x_hat and inv_std from two more products in rounds 8 and 10."""
    rows, d = c.shape
    secret = gamma is not None and not public_weight
    jobs = [("square", c)] + ([("mul", c, gamma.reshape(1, d))] if secret else [])
    outs = products_round(jobs)
    sq = outs[0]
    if secret:
        cg = truncate(outs[1], prec)
    elif gamma is not None:
        cg = truncate(c * gamma.reshape(1, d), prec)
    else:
        cg = c
    total = truncate(sq.sum(1, keepdim=True), prec)
    var = truncate(total * int(round((1 << (prec + 8)) / d)), prec + 8)
    v = var + _enc(eps, prec, var)
    js = list(ISQRT_J)
    items = torch.cat([(v - _enc(2.0 ** j, prec, v)).reshape(-1) for j in js])
    bits = circuits.unpack_bits(neg_words(items, 2), rows * len(js))
    bits = protocol.xor_public(bits, 1)                  # [v >= 2^j], (len(js) * rows,)
    # bucket n (bits set): v in [2^(L), 2^(L+1)) with L = js[0] - 1 + n
    lo = js[0] - 1
    a = [2.0 ** -(lo + n) for n in range(len(js) + 1)]   # m = v * a[n]
    b = [2.0 ** (-(lo + n) / 2) for n in range(len(js) + 1)]
    words = circuits.pack_bits(bits)
    muls = [(circuits.pack_bits(bits[n * rows:(n + 1) * rows]), (rows, 1),
             v * int(round((a[n + 1] - a[n]) * (1 << _Q)))) for n in range(len(js))]
    (arith,), prods = protocol.finish([(words, rows * len(js))], muls)
    m = v * int(round(a[0] * (1 << _Q)))
    for p_ in prods:
        m = m + p_
    m = truncate(m, _Q)
    arith = arith.view(len(js), rows, 1)
    scale = public_share(torch.full_like(v, int(round(b[0] * (1 << _Q2)))))
    for n in range(len(js)):
        scale = scale + arith[n] * int(round((b[n + 1] - b[n]) * (1 << _Q2)))
    t = 2 * m - _enc(3.0, prec, m)
    extra = [("mul", c, scale)] if saved else []
    t2, cgs, *cs = products_round([("square", t), ("mul", cg, scale)] + extra)
    t2, cgs = truncate(t2, prec), truncate(cgs, _Q2)
    t3, t4 = products_round([("mul", t2, t), ("square", t2)])
    pw = {1: t, 2: t2, 3: truncate(t3, prec), 4: truncate(t4, prec)}
    nodes = np.cos(np.pi * (np.arange(ISQRT_DEGREE + 1) + 0.5) / (ISQRT_DEGREE + 1))
    cheb = np.polynomial.chebyshev.chebfit(nodes, 1.0 / np.sqrt((nodes + 3) / 2), ISQRT_DEGREE)
    coeffs = [float(x) for x in np.polynomial.chebyshev.cheb2poly(cheb)]
    p = _poly_from_powers(pw, coeffs, prec, t)
    if not saved:
        (out,) = products_round([("mul", cgs, p)])
        return truncate(out, prec)
    out, x_hat, inv_std = products_round([("mul", cgs, p), ("mul", truncate(cs[0], _Q2), p), ("mul", scale, p)])
    return truncate(out, prec), truncate(x_hat, prec), truncate(inv_std, _Q2)


# ------------------------------------------------------------- attention softmax
RECIP_DEGREE = 4              # 1/m on m in [1, 2): relative error 3.0e-4 (fit)


def softmax_rows_share(flat: torch.Tensor, prec: int, all_pairs: bool = False) -> torch.Tensor:
    """Shares of softmax over each row of `flat` (R, k), between 2 additive parties: the row
    max and exp(x - max) as in nonlinear.softmax, then ONE reciprocal per row in 9 rounds
    with the final product: [sum >= 2^j] for 2^j <= k (one 32-bit MSB circuit), the B2A
    round also making m = sum 2^-n in [1, 2) (bits times public multiples of the sum), then
    t^2 of t = 2m - 3 beside e * 2^-n (a broadcasting triple), t^3 and t^4, and
    (e 2^-n) * p(t) with p ~ 1/m of degree 4: max - 19 (128 columns), exp 10, 1/sum 9."""
    rows, k = flat.shape
    mx = row_max(flat, all_pairs)
    e = exp_nonpos(flat - mx.unsqueeze(-1), prec)
    total = e.sum(-1, keepdim=True)                       # in [1, k]: the max's own term is 1
    js = list(range(1, max(1, math.ceil(math.log2(k))) + 1)) if k > 1 else []
    a = [2.0 ** -n for n in range(len(js) + 1)]           # bucket n: sum in [2^n, 2^(n+1))
    if js:
        items = torch.cat([(total - _enc(2.0 ** j, prec, total)).reshape(-1) for j in js])
        bits = protocol.xor_public(circuits.unpack_bits(neg_words(items, 2), rows * len(js)), 1)
        muls = [(circuits.pack_bits(bits[n * rows:(n + 1) * rows]), (rows, 1),
                 total * int(round((a[n + 1] - a[n]) * (1 << _Q)))) for n in range(len(js))]
        (arith,), prods = protocol.finish([(circuits.pack_bits(bits), rows * len(js))], muls)
        arith = arith.view(len(js), rows, 1)
    else:
        arith, prods = torch.zeros(0, rows, 1, dtype=torch.int64), []
    m = total * (1 << _Q)
    for p_ in prods:
        m = m + p_
    m = truncate(m, _Q)
    scale = public_share(torch.full_like(total, 1 << _Q))
    for n in range(len(js)):
        scale = scale + arith[n] * int(round((a[n + 1] - a[n]) * (1 << _Q)))
    t = 2 * m - _enc(3.0, prec, m)
    t2, es = products_round([("square", t), ("mul", e, scale)])
    t2, es = truncate(t2, prec), truncate(es, _Q)
    t3, t4 = products_round([("mul", t2, t), ("square", t2)])
    pw = {1: t, 2: t2, 3: truncate(t3, prec), 4: truncate(t4, prec)}
    nodes = np.cos(np.pi * (np.arange(RECIP_DEGREE + 1) + 0.5) / (RECIP_DEGREE + 1))
    cheb = np.polynomial.chebyshev.chebfit(nodes, 2.0 / (nodes + 3), RECIP_DEGREE)
    p = _poly_from_powers(pw, [float(c) for c in np.polynomial.chebyshev.cheb2poly(cheb)], prec, t)
    (out,) = products_round([("mul", es, p)])
    return truncate(out, prec)


def softmax_last(x):
    """softmax over the last dim of a float CrypTensor: softmax_rows_share between 2 additive
    parties (attention: rows within 2^15 of each other), nonlinear.softmax otherwise."""
    from ..cryptensor import _record
    from .nonlinear import softmax
    from ._common import float_view, new_like
    if not _short_ok() or x.dim() == 0 or x.shape[-1] < 1:
        return softmax(x, -1)
    x_f = float_view(x)
    flat = x_f.share.reshape(-1, x_f.shape[-1])
    one_query = x_f.dim() >= 2 and x_f.shape[-2] == 1   # a decode step's query row per head
    out = softmax_rows_share(flat, x_f.precision, all_pairs=one_query).view(x_f.shape)
    return _record(new_like(x_f, out), "softmax", (x,), dim=x_f.dim() - 1)
