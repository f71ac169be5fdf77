"""Nonlinear functions on float CrypTensors by range reduction + polynomials.

Range reduction by comparisons ("thresholds"): the bits s_t = [x >= tau_t] for public
tau_1 < ... < tau_T come out of ONE MSB circuit (7 rounds between 2 parties whatever T).
Any function of the bucket index k = sum_t s_t is then LINEAR in the bits, by telescoping:
F(k) = F(k0) + sum_t s_t (F(t) - F(t - 1)). That gives 2^k, 2^-k, 4^-j exactly, so
  exp(x)      = 2^k * 2^f          y = x log2 e = k + f, f in [0, 1)
  1/x         = 2^-k * 1/m         x = m 2^k, m in [1, 2) (sign folded into 2^-k)
  1/sqrt(x)   = 2^-j / sqrt(m)     x = m 4^j, m in [1, 4)
  sqrt(x)     = 2^j sqrt(m)
  log(x)      = log(m) + k log 2
with one Chebyshev-fitted polynomial on the reduced interval (evaluated with all powers in
ceil(log2 degree) Beaver rounds and one truncation). sigmoid / tanh use exp(-|x|) in
(0, 1], so 1 / (1 + e) needs no range reduction; erf and gelu go through sigmoid.
cos / sin use the fractional parts of the shares of x / 2pi: every party evaluates cos and
sin of its own part in plaintext and the angle-addition formula combines them (one round
for 2 parties), so they are accurate for every x.

exp and reciprocal, whose outputs go down to 1e-3 (65 units in the last place at 16
bits), end with an exact round-to-nearest (convert.round_exact) instead of the +-1 ulp
truncation. Input domains and measured errors: docs/functions.md.
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import numpy as np
import torch

from .. import encoding
from ..cryptensor import CrypTensor, _record, no_grad
from ..errors import UnsupportedError
from ..mpc import circuits, protocol
from ..mpc.replicated import Replicated
from ..session import current
from . import fast
from ._common import (add_public, float_view, mul_shares, mul_trunc, new_like, poly_share, powers, public_share,
                      truncate, xor_public)
from .comparisons import _needs_grad

LN2 = math.log(2.0)
LOG2E = 1.0 / LN2

# Bucket ranges (documented domains in docs/functions.md).
EXP_T = range(-17, 12)          # y = x log2 e in [-17, 12): x in [-11.8, 8.3); below -> 0
RECIP_T = range(-9, 11)         # |x| in [2^-10, 2^11)
ISQRT_J = range(-6, 11)         # x in [4^-7, 4^11) = [6.1e-5, 4.2e6)
LOG_T = range(-11, 15)          # x in [2^-12, 2^15)
SIGMOID_T = range(1, 18)        # |x| log2 e in [0, 17); beyond, exp(-|x|) -> 0


# ------------------------------------------------------------------------ polynomials
@functools.lru_cache(maxsize=None)
def cheb_fit(name: str, a: float, b: float, degree: int) -> tuple[float, ...]:
    """Monomial coefficients in t = (2x - a - b) / (b - a) of the Chebyshev interpolant."""
    fn = FUNCS[name]
    nodes = np.cos(np.pi * (np.arange(degree + 1) + 0.5) / (degree + 1))
    xs = (nodes * (b - a) + (a + b)) / 2
    cheb = np.polynomial.chebyshev.chebfit(nodes, fn(xs), degree)
    return tuple(float(c) for c in np.polynomial.chebyshev.cheb2poly(cheb))


FUNCS = {
    "exp2": lambda x: np.exp2(x),
    "exp2neg": lambda x: np.exp2(-x),
    "recip": lambda x: 1.0 / x,
    "isqrt": lambda x: 1.0 / np.sqrt(x),
    "sqrt": lambda x: np.sqrt(x),
    "log": lambda x: np.log(x),
}
DEGREES = {"exp2": 6, "exp2neg": 6, "recip": 8, "isqrt": 8, "sqrt": 8, "log": 8}


def poly_interval(x: torch.Tensor, prec: int, name: str, a: float, b: float) -> torch.Tensor:
    """Shares of FUNCS[name](x) for x in [a, b] (at `prec`)."""
    scale = 2.0 / (b - a)
    if scale == int(scale):
        t = x * int(scale)                    # exact, no truncation round
    else:
        t = truncate(x * int(round(scale * (1 << prec))), prec)
    t = add_public(t, -int(round((a + b) / (b - a) * (1 << prec))))
    return poly_share(t, cheb_fit(name, a, b, DEGREES[name]), prec)


# -------------------------------------------------------------------------- thresholds
def sign_bits(items: Sequence[tuple[torch.Tensor, bool]]) -> list[torch.Tensor]:
    """XOR shares (0/1, unpacked) of msb(v) ^ flip for every (v, flip), ONE MSB circuit."""
    flats = [v.reshape(-1) for v, _ in items]
    words = protocol.msb_words(torch.cat(flats))
    n = sum(f.numel() for f in flats)
    bits = circuits.unpack_bits(words, n)
    out, off = [], 0
    for (v, flip), f in zip(items, flats):
        b = bits[off:off + f.numel()].view(v.shape)
        out.append(xor_public(b, 1) if flip else b)
        off += f.numel()
    return out


def finish_bits(b2a: Sequence[torch.Tensor], muls: Sequence[tuple[torch.Tensor, torch.Tensor]] = ()):
    """ONE round: arithmetic 0/1 shares of XOR bits, and bit * value products."""
    flat = torch.cat([b.reshape(-1) for b in b2a]) if b2a else None
    jobs_b = [(circuits.pack_bits(flat), flat.numel())] if flat is not None else []
    jobs_m = [(circuits.pack_bits(b.reshape(-1)), tuple(b.shape), v) for b, v in muls]
    outs_b, outs_m = protocol.finish(jobs_b, jobs_m)
    res, off = [], 0
    for b in b2a:
        res.append(outs_b[0][off:off + b.numel()].view(b.shape))
        off += b.numel()
    return res, outs_m


def ge_items(xs: torch.Tensor, prec: int, taus: Sequence[float], negate: bool = False):
    """Items whose bits are [x >= tau] (or [x <= -tau] with negate) for each tau."""
    items = []
    for tau in taus:
        enc = public_share(encoding.encode(torch.tensor(float(tau)), prec))
        items.append((((-xs) if negate else xs) - enc, True))
    return items


def _stack(bits: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(bits) if bits else None


def _lin(bits: torch.Tensor | None, weights: Sequence[int], base: int, like: torch.Tensor) -> torch.Tensor:
    """Shares of base + sum_t bits[t] * weights[t] (public integer weights)."""
    out = public_share(torch.full_like(like, base))
    if bits is not None:
        for b, w in zip(bits, weights):
            out = out + b * w
    return out


# ------------------------------------------------------------------------- exp family
def exp_share(xs: torch.Tensor, prec: int, trange: range = EXP_T, exact: bool = True) -> torch.Tensor:
    """Shares of exp(x) at `prec`; y = x log2 e is bucketed by trange (below: 0)."""
    t_lo = trange.start
    items = ge_items(xs, prec, [t * LN2 for t in trange])
    (bits,), _ = finish_bits([torch.stack(sign_bits(items))])
    y = truncate(xs * int(round(LOG2E * (1 << prec))), prec)
    f = y - (bits.sum(0) << prec) - public_share(torch.full_like(xs, (t_lo - 1) << prec))
    q_bits = -t_lo
    weights = [1 << (t - 1 + q_bits) if t > t_lo else 1 for t in trange]   # A = 2^k, 0 below
    a = _lin(bits, weights, 0, xs)
    p = poly_interval(f, prec, "exp2", 0.0, 1.0)
    (prod,) = mul_shares([(a, p)])
    return protocol.round_exact(prod, q_bits) if exact else truncate(prod, q_bits)


def reciprocal_share(xs: torch.Tensor, prec: int, trange: range = RECIP_T, signed: bool = True,
                     exact: bool = True) -> torch.Tensor:
    """Shares of 1/x (|x| bucketed by powers of two; sign folded into the scale)."""
    q = 16
    t_lo = trange.start
    items = ge_items(xs, prec, [2.0 ** t for t in trange])
    if signed:
        items = [(xs, False)] + items + ge_items(xs, prec, [2.0 ** t for t in trange], negate=True)
    bits = sign_bits(items) if items else []
    (arith,), _ = finish_bits([torch.stack(bits)]) if bits else ((None,), None)
    base = 1 << (1 - t_lo + q)                        # 2^-(t_lo - 1)
    weights = [1 << (q - t) for t in trange]          # each threshold halves 2^-k
    if signed:
        neg, pos, negs = arith[0], arith[1:1 + len(trange)], arith[1 + len(trange):]
        scale = _lin(None, [], base, xs) - 2 * base * neg
        for b_p, b_n, w in zip(pos, negs, weights):
            scale = scale - (b_p - b_n) * w
    else:
        scale = _lin(arith, [-w for w in weights], base, xs)
    (m,) = mul_trunc([(xs, scale)], q)
    r = poly_interval(m, prec, "recip", 1.0, 2.0)
    (prod,) = mul_shares([(r, scale)])
    return protocol.round_exact(prod, q) if exact else truncate(prod, q)


def isqrt_share(xs: torch.Tensor, prec: int, want: str = "isqrt", jrange: range = ISQRT_J) -> torch.Tensor:
    """Shares of 1/sqrt(x) (want="isqrt") or sqrt(x) (want="sqrt") for x > 0."""
    j_lo = jrange.start
    items = ge_items(xs, prec, [4.0 ** j for j in jrange])
    (bits,), _ = finish_bits([torch.stack(sign_bits(items))])
    qb = 2 * (jrange.stop - 1)                        # 4^-j exact down to 4^-(j_max)
    b_base = 1 << (2 * (1 - j_lo) + qb)               # 4^-(j_lo - 1)
    b_scale = _lin(bits, [-(3 << (qb - 2 * j)) for j in jrange], b_base, xs)
    (m,) = mul_trunc([(xs, b_scale)], qb)             # m in [1, 4)
    q = 16
    if want == "isqrt":
        r = poly_interval(m, prec, "isqrt", 1.0, 4.0)
        e_scale = _lin(bits, [-(1 << (q - j)) for j in jrange], 1 << (1 - j_lo + q), xs)
    else:
        r = poly_interval(m, prec, "sqrt", 1.0, 4.0)
        e_scale = _lin(bits, [1 << (q + j - 1) for j in jrange], 1 << (q + j_lo - 1), xs)
    (out,) = mul_trunc([(r, e_scale)], q)
    return out


def log_share(xs: torch.Tensor, prec: int, trange: range = LOG_T) -> torch.Tensor:
    """Shares of log(x) for x > 0."""
    t_lo = trange.start
    q = 16
    items = ge_items(xs, prec, [2.0 ** t for t in trange])
    bits = sign_bits(items) if items else []
    arith = finish_bits([torch.stack(bits)])[0][0] if bits else None
    scale = _lin(arith, [-(1 << (q - t)) for t in trange], 1 << (1 - t_lo + q), xs)
    (m,) = mul_trunc([(xs, scale)], q)
    out = poly_interval(m, prec, "log", 1.0, 2.0)
    ln2 = int(round(LN2 * (1 << prec)))
    if arith is not None:
        out = out + arith.sum(0) * ln2
    return out + public_share(torch.full_like(xs, (t_lo - 1) * ln2))


def sigmoid_share(xs: torch.Tensor, prec: int) -> torch.Tensor:
    """Shares of sigmoid(x) = s(|x|) or 1 - s(|x|), s(u) = 1 / (1 + exp(-u))."""
    taus = [t * LN2 for t in SIGMOID_T]
    items = [(xs, False)] + ge_items(xs, prec, taus) + ge_items(xs, prec, taus, negate=True)
    bits = sign_bits(items)
    (arith,), (neg_x,) = finish_bits([torch.stack(bits)], [(bits[0], xs)])
    neg = arith[0]
    count = arith[1:].sum(0)                          # k = floor(|x| log2 e), capped at 17
    absx = xs - 2 * neg_x
    u = truncate(absx * int(round(LOG2E * (1 << prec))), prec)
    f = u - (count << prec)
    q = SIGMOID_T.stop - 1
    # 2^-k with 0 from the last bucket on: telescoping weights 2^-t, the last one 2^-(T-1).
    weights = [1 << (q - t) for t in SIGMOID_T[:-1]] + [1 << 1]
    pos_neg = arith[1:1 + len(SIGMOID_T)] + arith[1 + len(SIGMOID_T):]
    a = _lin(pos_neg, [-w for w in weights], 1 << q, xs)
    p = poly_interval(f, prec, "exp2neg", 0.0, 1.0)
    (e,) = mul_trunc([(a, p)], q)
    den = e + public_share(torch.full_like(xs, 1 << prec))
    r = poly_interval(den, prec, "recip", 1.0, 2.0)
    (flip,) = mul_shares([(neg, public_share(torch.full_like(xs, 1 << prec)) - 2 * r)])
    return r + flip


def cos_sin_share(xs: torch.Tensor, prec: int, want_cos: bool = True, want_sin: bool = True):
    """Shares of (cos x, sin x) from each party's own fractional part of x / 2pi."""
    s = current()
    k = 40
    frac_bits = prec + k
    # This party's own additive part of x (its first component under rss: x = sum of them).
    own = xs.a if isinstance(xs, Replicated) else xs
    theta = (own * int(round((1 << k) / (2 * math.pi)))) & ((1 << frac_bits) - 1)
    angle = theta.double() / float(1 << frac_bits) * 2 * math.pi
    cos_l, sin_l = [], []
    for r in range(s.world_size):
        mine_c = encoding.encode(torch.cos(angle), prec) if s.rank == r else None
        mine_s = encoding.encode(torch.sin(angle), prec) if s.rank == r else None
        cos_l.append(protocol.share(mine_c, r, xs.shape))
        sin_l.append(protocol.share(mine_s, r, xs.shape))
    # Angle addition, tree over the parties: cos(a+b) = ca cb - sa sb, sin(a+b) = sa cb + ca sb.
    while len(cos_l) > 1:
        pairs = []
        for i in range(0, len(cos_l) - 1, 2):
            ca, sa, cb, sb = cos_l[i], sin_l[i], cos_l[i + 1], sin_l[i + 1]
            pairs += [(ca, cb), (sa, sb), (sa, cb), (ca, sb)]
        prods = mul_trunc(pairs, prec)
        new_c, new_s = [], []
        for i in range(0, len(prods), 4):
            new_c.append(prods[i] - prods[i + 1])
            new_s.append(prods[i + 2] + prods[i + 3])
        if len(cos_l) % 2:
            new_c.append(cos_l[-1])
            new_s.append(sin_l[-1])
        cos_l, sin_l = new_c, new_s
    return cos_l[0], sin_l[0]


# ---------------------------------------------------------------- CrypTensor functions
def _unary(x: CrypTensor, fn, op: str, **saved) -> CrypTensor:
    x_f = float_view(x)
    out = new_like(x_f, fn(x_f.share, x_f.precision))
    return _record(out, op, (x,), **saved)


def exp(x: CrypTensor) -> CrypTensor:
    """e^x; domain [-11.8, 8.3) (0 below), relative error < 1e-2 where e^x >= 1e-3."""
    return _unary(x, exp_share, "exp")


def reciprocal(x: CrypTensor) -> CrypTensor:
    """1/x for 2^-10 <= |x| < 2^11 (either sign)."""
    return _unary(x, reciprocal_share, "reciprocal")


def div_private(x: CrypTensor, y: CrypTensor) -> CrypTensor:
    """x / y for a private divisor: x * reciprocal(y) (y in reciprocal's domain)."""
    with no_grad():
        inv = reciprocal(y)
        out = float_view(x.detach()).mul(inv)
    grad = _needs_grad(x, y)
    return _record(out, "div_private", (x, y), **({"reciprocal": inv} if grad else {}))


def sqrt(x: CrypTensor) -> CrypTensor:
    """sqrt(x) for x in [6.1e-5, 4.2e6)."""
    return _unary(x, lambda s, p: isqrt_share(s, p, "sqrt"), "sqrt")


def inv_sqrt(x: CrypTensor) -> CrypTensor:
    """1/sqrt(x) for x in [6.1e-5, 4.2e6)."""
    return _unary(x, isqrt_share, "inv_sqrt")


def log(x: CrypTensor) -> CrypTensor:
    """Natural log for x in [2^-12, 2^15)."""
    return _unary(x, log_share, "log")


def sigmoid(x: CrypTensor) -> CrypTensor:
    """1 / (1 + e^-x) for any x (|x| log2 e >= 17 saturates)."""
    return _unary(x, sigmoid_share, "sigmoid")


def tanh(x: CrypTensor) -> CrypTensor:
    """tanh(x) = 2 sigmoid(2x) - 1."""
    def fn(s, p):
        return 2 * sigmoid_share(s << 1, p) - public_share(torch.full_like(s, 1 << p))
    return _unary(x, fn, "tanh")


# erf(x) ~ tanh(ERF_A x + ERF_B x^3), max error 3.4e-4 (fitted on [0, 6]).
ERF_A, ERF_B = 1.129, 0.1005


def _erf_arg(xs: torch.Tensor, prec: int, scale: float) -> torch.Tensor:
    """Shares of 2 (a x' + b x'^3) with x' = x * scale (the sigmoid argument of erf)."""
    c1 = 2 * ERF_A * scale
    c3 = 2 * ERF_B * scale ** 3
    (sq,) = mul_trunc([(xs, xs)], prec)
    inner = truncate(sq * int(round(c3 * (1 << prec))), prec) + public_share(
        torch.full_like(xs, int(round(c1 * (1 << prec)))))
    (z,) = mul_trunc([(xs, inner)], prec)
    return z


def erf(x: CrypTensor) -> CrypTensor:
    """Error function: 2 sigmoid(2 (a x + b x^3)) - 1, abs error < 1e-3."""
    def fn(s, p):
        return 2 * sigmoid_share(_erf_arg(s, p, 1.0), p) - public_share(torch.full_like(s, 1 << p))
    return _unary(x, fn, "erf")


def _gelu_cdf_share(s: torch.Tensor, p: int, approximate: str) -> torch.Tensor:
    """Shares of Phi(x) as sigmoid(z(x)) (erf or tanh form): what gelu's backward needs."""
    if approximate == "tanh":
        c = math.sqrt(2.0 / math.pi)
        (sq,) = mul_trunc([(s, s)], p)
        inner = truncate(sq * int(round(2 * c * 0.044715 * (1 << p))), p) + public_share(
            torch.full_like(s, int(round(2 * c * (1 << p)))))
        (z,) = mul_trunc([(s, inner)], p)
    else:
        z = _erf_arg(s, p, 1.0 / math.sqrt(2.0))
    return sigmoid_share(z, p)


def gelu_cdf(x: CrypTensor, approximate: str = "none") -> CrypTensor:
    """Phi(x) (the sigmoid form), computed by gelu's backward rule when it runs."""
    x_f = float_view(x.detach())
    return new_like(x_f, _gelu_cdf_share(x_f.share, x_f.precision, approximate))


def gelu(x: CrypTensor, approximate: str = "none") -> CrypTensor:
    """x * Phi(x); approximate="tanh" uses torch's tanh formula.

    The piecewise polynomial of functions.fast (11 rounds between 2 parties, one MSB
    circuit). With autograd it saves `cdf` = None: the backward rule computes Phi(x) by
    gelu_cdf only if a backward pass runs, so inference costs the same with or without grad."""
    if approximate not in ("none", "tanh"):
        raise UnsupportedError(f"gelu approximate must be 'none' or 'tanh', got {approximate!r}")
    x_f = float_view(x)
    out = fast.half_plus_even(x_f.share, x_f.precision, "gelu" if approximate == "none" else "gelu_tanh")
    saved = {"cdf": None} if _needs_grad(x) else {}
    return _record(new_like(x_f, out), "gelu", (x,), approximate=approximate, **saved)


def silu_sigmoid(x: CrypTensor) -> CrypTensor:
    """sigmoid(x), computed by silu's backward rule when it runs."""
    x_f = float_view(x.detach())
    return new_like(x_f, sigmoid_share(x_f.share, x_f.precision))


def silu(x: CrypTensor) -> CrypTensor:
    """x * sigmoid(x): the piecewise polynomial of functions.fast (11 rounds between 2
    parties, one MSB circuit). With autograd it saves `sigmoid` = None, computed by the
    backward rule (silu_sigmoid) only if a backward pass runs."""
    x_f = float_view(x)
    out = fast.half_plus_even(x_f.share, x_f.precision, "silu")
    saved = {"sigmoid": None} if _needs_grad(x) else {}
    return _record(new_like(x_f, out), "silu", (x,), **saved)


def cos(x: CrypTensor) -> CrypTensor:
    """cos(x) for any x (abs error ~1e-4). Saves `sin` when autograd needs it."""
    x_f = float_view(x)
    grad = _needs_grad(x)
    c, s = cos_sin_share(x_f.share, x_f.precision)
    saved = {"sin": new_like(x_f, s)} if grad else {}
    return _record(new_like(x_f, c), "cos", (x,), **saved)


def sin(x: CrypTensor) -> CrypTensor:
    """sin(x) for any x (abs error ~1e-4). Saves `cos` when autograd needs it."""
    x_f = float_view(x)
    grad = _needs_grad(x)
    c, s = cos_sin_share(x_f.share, x_f.precision)
    saved = {"cos": new_like(x_f, c)} if grad else {}
    return _record(new_like(x_f, s), "sin", (x,), **saved)


def polynomial(x: CrypTensor, coeffs) -> CrypTensor:
    """sum_i coeffs[i] x^(i+1) (CrypTen's convention: linear term first, no constant).

    Coefficients may be public (list, tensor) or a 1-D CrypTensor (one more Beaver round).
    """
    if isinstance(coeffs, CrypTensor):
        from .statistics import polynomial_private
        return polynomial_private(x, coeffs)
    c = [float(v) for v in torch.as_tensor(coeffs, dtype=torch.float64).reshape(-1)]
    return _unary(x, lambda s, p: poly_share(s, [0.0] + c, p), "polynomial", coeffs=tuple(c))


def pow_(x: CrypTensor, exponent) -> CrypTensor:
    """x ** exponent for a public exponent: integers by products (log rounds), 0.5 / -0.5 /
    -1 by sqrt / inv_sqrt / reciprocal, other floats as exp(p log x) for x > 0."""
    if isinstance(exponent, CrypTensor):
        raise UnsupportedError("pow with a private exponent is not supported; use exp(y * log(x))")
    e = float(exponent)
    with no_grad():
        if e == int(e) and abs(e) <= 64:
            n = int(e)
            if n == 0:
                out = float_view(x.detach()).mul(0).add(1.0)
            else:
                base = x.detach() if n > 0 else reciprocal(x.detach())
                if abs(n) == 1:
                    out = base.clone()
                else:
                    from ._common import powers
                    xb = float_view(base)
                    out = new_like(xb, powers(xb.share, abs(n), xb.precision)[abs(n)])
        elif e == 0.5:
            out = sqrt(x.detach())
        elif e == -0.5:
            out = inv_sqrt(x.detach())
        else:
            out = exp(log(x.detach()).mul(e))
    return _record(CrypTensor(out.share, out.precision, out.dtype, x._names), "pow", (x,), exponent=exponent)


def _softmax_parts(x: CrypTensor, dim):
    x_f = float_view(x)
    d = x_f._dim(dim) % max(1, x_f.dim())
    moved = x_f.share.movedim(d, -1)
    k = moved.shape[-1]
    flat = moved.reshape(-1, k)
    # all-pairs over groups of <= 16; under rss every pair at once when they are few (a
    # decode step's one query row per head against its cache: one level instead of two,
    # since rss's comparison levels cost more rounds than the bytes saved)
    mx = fast.row_max(flat, all_pairs=protocol.is_rss())
    z = flat - mx.unsqueeze(-1)                       # <= 0
    return x_f, d, moved.shape, k, z


def _log2_ceil(k: int) -> int:
    return max(0, math.ceil(math.log2(k))) if k > 1 else 0


def _scalar_dim(x: CrypTensor, dim) -> None:
    if dim is not None and x._dim(dim) not in (0, -1):
        raise IndexError(f"dimension {dim} out of range for a 0-d CrypTensor (use 0 or -1)")


# ------------------------------------------------------------------ softmax under rss
# exp(z) for z <= 0 in buckets of y = z log2 e: [y >= -16], [y >= -12], [y >= -8], [y >= -4]
# (below -16: 0); bucket k (1..4) is z in [(4k - 20) ln 2, (4k - 16) ln 2), centre
# c_k = (4k - 18) ln 2, and exp(z) = 2^(4k - 18) e^u with u = z - c_k in [-2 ln 2, 2 ln 2].
RSS_EXP_BUCKETS = (-16, -12, -8, -4)
RSS_EXP_DEGREE = 7
RSS_RECIP_DEGREE = 8


@functools.lru_cache(maxsize=None)
def _monomial_fit(name: str, lo: float, hi: float, degree: int) -> tuple[float, ...]:
    """Monomial coefficients in the variable itself (not rescaled) of the Chebyshev
    interpolant of FUNCS_RSS[name] on [lo, hi]."""
    fn = {"exp": np.exp, "recip_t": lambda t: 1.0 / ((t + 3.0) / 2.0)}[name]
    nodes = np.cos(np.pi * (np.arange(degree + 1) + 0.5) / (degree + 1))
    half, mid = (hi - lo) / 2, (hi + lo) / 2
    cheb = np.polynomial.chebyshev.chebfit(nodes, fn(nodes * half + mid), degree)
    c = np.polynomial.polynomial.Polynomial(np.polynomial.chebyshev.cheb2poly(cheb))
    # c(t) with t = (v - mid) / half  ->  coefficients in v
    shifted = c(np.polynomial.polynomial.Polynomial([-mid / half, 1.0 / half]))
    return tuple(float(v) for v in shifted.coef) + (0.0,) * (degree + 1 - len(shifted.coef))


def _thresholds_rss(xs: torch.Tensor, prec: int, taus: Sequence[float]) -> torch.Tensor:
    """Arithmetic 0/1 shares (T, *xs.shape) of [x >= tau] for each public tau: ONE MSB circuit
    with its B2A folded in (protocol.msb_finish: 7 rounds under rss)."""
    items = [xs - public_share(torch.full_like(xs, int(round(t * (1 << prec))))) for t in taus]
    below, _ = protocol.msb_finish(torch.stack(items))    # [x - tau < 0]
    return public_share(torch.ones(below.shape, dtype=torch.int64)) - below


def _telescope(bits: torch.Tensor, values: Sequence[int], like: torch.Tensor) -> torch.Tensor:
    """Shares of values[k] for the bucket index k = sum_j bits[j] (bits of increasing
    thresholds): values[0] + sum_j bits[j] (values[j + 1] - values[j]), public integers."""
    out = public_share(torch.full_like(like, values[0]))
    for j in range(bits.shape[0]):
        out = out + bits[j] * (values[j + 1] - values[j])
    return out


def _poly_wide(pw: dict[int, torch.Tensor], coeffs: Sequence[float], prec: int, wide: int,
               like: torch.Tensor) -> torch.Tensor:
    """sum_i coeffs[i] v^i at scale 2^wide (powers at `prec`), NOT truncated: the product
    that follows truncates it (mul_trunc by wide + its operand's extra bits)."""
    acc = public_share(torch.full_like(like, int(round(coeffs[0] * (1 << wide)))))
    for i in range(1, len(coeffs)):
        acc = acc + pw[i] * int(round(coeffs[i] * (1 << (wide - prec))))
    return acc


def _softmax_rows_rss(z: torch.Tensor, prec: int) -> torch.Tensor:
    """exp(z) / sum_row exp(z) for z = x - rowmax <= 0 (R, k), under rss in 23 rounds:
    exp: thresholds (7) + powers of u (3) + the bucket's scale times the polynomial, its
    truncation fused (1); reciprocal of the row sums s in [1, k]: thresholds at 2^1..2^T (7),
    m = s 2^-j and e 2^-j in one round (1), powers of t = 2m - 3 (3), e 2^-j times the
    polynomial of 1/m, truncation fused (1). The polynomials are summed untruncated at
    2^wide; their product's fused truncation removes the extra bits."""
    wide = min(2 * prec, 58 - prec)
    # ---- exp(z)
    ln2 = math.log(2.0)
    taus = [t * ln2 for t in RSS_EXP_BUCKETS]
    s = _thresholds_rss(z, prec, taus)                             # (4, R, k)
    centres = [(4 * k - 18) * ln2 for k in range(len(taus) + 1)]   # bucket 0 (unused) .. 4
    u = z - _telescope(s, [int(round(c * (1 << prec))) for c in centres], z)
    # bucket scale 2^(4k - 18) at `prec` (exact powers of two; 0 for bucket 0)
    scales = [0] + [1 << (4 * k - 18 + prec) for k in range(1, len(taus) + 1)]
    a = _telescope(s, scales, z)
    half = 2 * ln2
    pw = powers(u, RSS_EXP_DEGREE, prec)
    p_exp = _poly_wide(pw, _monomial_fit("exp", -half, half, RSS_EXP_DEGREE), prec, wide, z)
    (e,) = mul_trunc([(a, p_exp)], wide)                           # at prec
    # ---- 1 / sum
    k = z.shape[-1]
    total = e.sum(-1)
    T = _log2_ceil(k)
    q = 16
    if T:
        bits = _thresholds_rss(total, prec, [2.0 ** t for t in range(1, T + 1)])
        b = _telescope(bits, [1 << (q - j) for j in range(T + 1)], total)
    else:
        b = public_share(torch.full_like(total, 1 << q))
    m, e_b = mul_trunc([(total, b), (e, b.unsqueeze(-1).expand_as(e))], q)   # m in [1, 2)
    t = 2 * m - public_share(torch.full_like(m, 3 << prec))
    pw = powers(t, RSS_RECIP_DEGREE, prec)
    p_rec = _poly_wide(pw, _monomial_fit("recip_t", -1.0, 1.0, RSS_RECIP_DEGREE), prec, wide, m)
    (out,) = mul_trunc([(e_b, p_rec.unsqueeze(-1).expand_as(e_b))], wide)
    return out


def softmax(x: CrypTensor, dim=-1) -> CrypTensor:
    """exp(x - max) / sum exp(x - max) along `dim` (max: pairwise for dims <= 16)."""
    if x.dim() == 0:  # torch: softmax of a 0-d tensor is 1
        _scalar_dim(x, dim)
        return softmax(x.reshape(1), 0).reshape(())
    x_f, d, shape, k, z = _softmax_parts(x, dim)
    p = x_f.precision
    if protocol.is_rss() and p >= 14:
        out = _softmax_rows_rss(z, p).view(shape).movedim(-1, d)
        return _record(new_like(x_f, out), "softmax", (x,), dim=d)
    e = fast.exp_nonpos(z, p)                         # 4 thresholds; 0 below z = -11.1
    total = e.sum(-1)                                 # in [1, k]: one reciprocal per row
    inv = reciprocal_share(total, p, range(1, _log2_ceil(k) + 1), signed=False, exact=False)
    out = truncate(fast.mul_rows(e, inv), p)
    out = out.view(shape).movedim(-1, d)
    return _record(new_like(x_f, out), "softmax", (x,), dim=d)


def log_softmax(x: CrypTensor, dim=-1) -> CrypTensor:
    """(x - max) - log(sum exp(x - max)) along `dim`."""
    if x.dim() == 0:  # torch: log_softmax of a 0-d tensor is 0
        _scalar_dim(x, dim)
        return log_softmax(x.reshape(1), 0).reshape(())
    x_f, d, shape, k, z = _softmax_parts(x, dim)
    p = x_f.precision
    e = fast.exp_nonpos(z, p)
    total = e.sum(-1)
    lse = log_share(total, p, range(1, _log2_ceil(k) + 1))
    out = (z - lse.unsqueeze(-1)).view(shape).movedim(-1, d)
    return _record(new_like(x_f, out), "log_softmax", (x,), dim=d)
