"""Products, norms and moments built from the core ops: prod, var, std, norm,
cosine_similarity, pos_pow, softplus, logsigmoid, cossin, polynomial with private
coefficients.

They compose recorded CrypTensor ops, so autograd differentiates them through the rules of
their parts (no rule of their own). Communication, 2 parties (exact figures are asserted in
tests/protocol/test_crypten_ops.py; docs/functions.md lists them):

* prod over k elements: ceil(log2 k) Beaver rounds (a product tree);
* var: one Beaver round (the square; the divisions by public counts are local truncations
  between 2 parties); std = var then sqrt;
* norm: p=1 abs + sum, p=2 square + sum + sqrt, p=inf abs + amax, other p by pos_pow;
* cosine_similarity: one Beaver round for x1*x2, x1*x1, x2*x2 together, one inv_sqrt for
  both squared norms, two more Beaver rounds.
"""

from __future__ import annotations

import math

import torch

from ..cryptensor import CrypTensor, _record, cat, no_grad, stack
from ..errors import ProtocolError, UnsupportedError
from ._common import float_view, powers
from .comparisons import _needs_grad


def _dims(x: CrypTensor, dim) -> tuple[int, ...]:
    if dim is None:
        return tuple(range(x.dim()))
    dims = dim if isinstance(dim, (tuple, list)) else (dim,)
    n = max(1, x.dim())
    return tuple(sorted(x._dim(d) % n for d in dims))


# ------------------------------------------------------------------------------ prod
def prod(x: CrypTensor, dim=None, keepdim: bool = False) -> CrypTensor:
    """Product of the elements (or along `dim`): a tree, ceil(log2 k) Beaver rounds."""
    if dim is None:
        return prod(x.reshape(-1), 0) if x.dim() else x.clone()
    if x.dim() == 0:
        _dims(x, dim)
        return x.clone()
    d = x._dim(dim) % x.dim()
    out = x
    while out.shape[d] > 1:
        n = out.shape[d]
        half = n // 2
        paired = out.narrow(d, 0, half).mul(out.narrow(d, half, half))
        out = cat([paired, out.narrow(d, 2 * half, 1)], d) if n % 2 else paired
    return out if keepdim else out.squeeze(d)


# ------------------------------------------------------------------------ var / std
def var(x: CrypTensor, dim=None, unbiased=None, keepdim: bool = False, *, correction=None) -> CrypTensor:
    """Variance like torch.var: sum((x - mean)^2) / (n - correction), correction 1 by
    default (unbiased=False means 0). One Beaver round (the square) between 2 parties."""
    if isinstance(dim, bool):  # torch.var(x, unbiased)
        dim, unbiased = None, dim
    if correction is None:
        correction = 0 if unbiased is False else 1
    xf = float_view(x)
    mean = xf.mean(dim, keepdim=True) if dim is not None else xf.mean()
    total = xf.sub(mean).square()
    total = total.sum(dim, keepdim=keepdim) if dim is not None else total.sum()
    if keepdim and dim is None:
        total = total.reshape([1] * x.dim())
    n = x.numel() // max(1, total.numel())
    if n - correction <= 0:
        raise ProtocolError(f"var/std over {n} element(s) with correction={correction}: the "
                            "divisor n - correction is not positive (torch returns nan/inf); "
                            "use correction=0 or more elements")
    return total.div(n - correction)


def std(x: CrypTensor, dim=None, unbiased=None, keepdim: bool = False, *, correction=None) -> CrypTensor:
    """Standard deviation: sqrt(var) (var must lie in sqrt's domain [6.1e-5, 4.2e6))."""
    return var(x, dim, unbiased, keepdim, correction=correction).sqrt()


# -------------------------------------------------------------------------- powers
def pos_pow(x: CrypTensor, p) -> CrypTensor:
    """x ** p for x > 0: exp(p log x); p may be a number, a public tensor or a CrypTensor.
    Integer p goes through pow (exact products)."""
    if isinstance(p, (int, float)) and float(p) == int(p):
        return x.pow(int(p))
    return x.log().mul(p).exp()


# ----------------------------------------------------------------------------- norm
def norm(x: CrypTensor, p="fro", dim=None, keepdim: bool = False) -> CrypTensor:
    """p-norm like torch.norm: p in {1, 2, 'fro', inf, -inf} or any p > 0 (pos_pow, |x| > 0).

    p=2 needs sum(x^2) in sqrt's domain [6.1e-5, 4.2e6) (a zero vector is outside it).
    """
    if p == "fro" or p is None:
        p = 2
    if p == "nuc" or isinstance(p, str):
        raise UnsupportedError(f"norm(p={p!r}) is not supported on CrypTensors; use p=1, 2, "
                               "'fro', inf or a positive number")
    p = float(p)
    if p == math.inf or p == -math.inf:
        a = x.abs()
        return a.amax(dim, keepdim) if p > 0 else a.amin(dim, keepdim)
    if p <= 0:
        raise UnsupportedError(f"norm(p={p}) is not supported on CrypTensors; use p > 0")

    def total(t):
        return t.sum(dim, keepdim=keepdim) if dim is not None else (
            t.sum().reshape([1] * x.dim()) if keepdim else t.sum())
    if p == 1:
        return total(x.abs())
    if p == 2:
        return total(float_view(x).square()).sqrt()
    a = x.abs()
    return pos_pow(total(a.pow(int(p)) if p == int(p) else pos_pow(a, p)), 1.0 / p)


# ----------------------------------------------------------------- cosine similarity
def cosine_similarity(x1, x2, dim: int = 1, eps: float = 1e-8) -> CrypTensor:
    """sum(x1 x2) / (|x1| |x2|) along `dim` (torch.nn.functional.cosine_similarity).

    The three products are one Beaver round, both 1/|x| one inv_sqrt: every squared norm
    must lie in inv_sqrt's domain [6.1e-5, 4.2e6) (`eps` is accepted for torch's signature;
    norms that small are outside the domain anyway).
    """
    if not isinstance(x1, CrypTensor):
        x1, x2 = x2, x1
    shape = torch.broadcast_shapes(tuple(x1.shape), tuple(x2.shape))
    if not shape:  # 0-dim operands: as torch, the similarity of one-element vectors (dim 0)
        if dim not in (0, -1):
            raise IndexError(f"cosine_similarity: dim {dim} is out of range for 0-dim tensors")
        x2 = x2.reshape(1) if isinstance(x2, CrypTensor) else torch.as_tensor(x2).reshape(1)
        return cosine_similarity(x1.reshape(1), x2, 0, eps).reshape(())
    a = float_view(x1).expand(shape)
    if isinstance(x2, CrypTensor):
        b = float_view(x2).expand(shape)
        prods = stack([a, a, b]).mul(stack([b, a, b]))        # one Beaver round
        d = (dim % len(shape)) + 1
        sums = prods.sum(d)
        dot, sq = sums[0], sums[1:]
    else:
        b = torch.as_tensor(x2, dtype=torch.float64).expand(shape)
        d = dim % len(shape)
        # Public x2: its norm is public, x1's squared norm one Beaver round.
        return a.mul(b).sum(d).mul(a.square().sum(d).inv_sqrt()).mul(torch.rsqrt((b * b).sum(d)))
    inv = sq.inv_sqrt()                                     # 1/|x1|, 1/|x2|
    return dot.mul(inv[0]).mul(inv[1])


# ------------------------------------------------------------------- softplus family
def softplus(x: CrypTensor, beta: float = 1.0, threshold: float = 20.0) -> CrypTensor:
    """log(1 + exp(beta x)) / beta = (relu(bx) + log(1 + exp(-|bx|))) / beta.

    abs (one comparison) then exp and log; above `threshold` torch returns x itself, which
    this formula matches to within exp(-threshold)."""
    bx = float_view(x).mul(beta) if beta != 1 else float_view(x)
    magnitude = bx.abs()
    relu = bx.add(magnitude).div(2)
    out = relu.add(magnitude.neg().exp().add(1.0).log())
    return out.div(beta) if beta != 1 else out


def logsigmoid(x: CrypTensor) -> CrypTensor:
    """log(sigmoid(x)) = -softplus(-x)."""
    return softplus(x.neg()).neg()


def cossin(x: CrypTensor) -> tuple[CrypTensor, CrypTensor]:
    """(cos x, sin x) from one protocol run (CrypTen's cossin)."""
    from .nonlinear import cos_sin_share
    from ._common import new_like
    x_f = float_view(x)
    with no_grad():
        c, s = cos_sin_share(x_f.share, x_f.precision)
    grad = _needs_grad(x)
    c_out, s_out = new_like(x_f, c), new_like(x_f, s)
    c_out = _record(c_out, "cos", (x,), **({"sin": new_like(x_f, s)} if grad else {}))
    s_out = _record(s_out, "sin", (x,), **({"cos": new_like(x_f, c)} if grad else {}))
    return c_out, s_out


# ------------------------------------------------------- polynomial, private coefficients
def polynomial_private(x: CrypTensor, coeffs: CrypTensor) -> CrypTensor:
    """sum_i coeffs[i] x^(i+1) with secret coefficients (CrypTen's order: linear first).

    The powers x^1..x^k take ceil(log2 k) rounds as for public coefficients, the products
    with the coefficients one more Beaver round. Records `polynomial_private` (rules.py).
    """
    if coeffs.dim() != 1:
        raise UnsupportedError(f"polynomial: coefficients must be 1-D, got shape {tuple(coeffs.shape)}")
    x_f = float_view(x)
    k = coeffs.shape[0]
    with no_grad():
        pw = powers(x_f.share, k, x_f.precision)
        terms = CrypTensor(torch.stack([pw[i] for i in range(1, k + 1)]), x_f.precision, x_f.dtype)
        c = float_view(coeffs.detach()).reshape(k, *([1] * x.dim()))
        out = terms.mul(c).sum(0)
    out._names = x._names
    saved = {"terms": terms} if _needs_grad(x, coeffs) else {}
    return _record(out, "polynomial_private", (x, coeffs), **saved)
