"""Comparisons and the piecewise-linear functions built on the MSB.

Every comparison reduces to the sign of a difference: x < y  <=>  msb(x - y) = 1, computed
by crypten_lite.mpc.convert.msb_words (2 parties: 6 binary rounds, 23.25 bytes per element
per party) and converted to an arithmetic 0/1 share by one B2A round: lt/le/gt/ge cost
7 rounds and 23.375 bytes per element between 2 parties. Results are bool CrypTensors
(precision 0, arithmetic shares of 0/1), exact whenever |x - y| < 2^63 at the common scale.

relu / abs / clamp multiply by the comparison bit in the B2A round itself (kind bit_mul):
relu = x * [x > 0] costs 7 rounds and 31.375 bytes per element between 2 parties.

eq / ne between 2 parties test z = x - y for zero directly (z_0 == -z_1: an AND tree over
the 64 bits of ~(z_0 ^ -z_1), 6 rounds + B2A); with more parties eq = not(msb(z) ^ msb(-z)).
"""

from __future__ import annotations

import torch

from .. import encoding
from ..cryptensor import CrypTensor, _record, is_grad_enabled, result_type
from ..mpc import circuits, protocol
from ..mpc.protocol import and_many, xor_public
from ..session import current
from ._common import (as_private, bool_tensor, diff_share, mul_shares, mul_trunc, new_like,
                      public_share, truncate, unify_names)


def _needs_grad(*xs) -> bool:
    return is_grad_enabled() and any(isinstance(x, CrypTensor) and x.requires_grad for x in xs)


def _bool_from_words(words: torch.Tensor, shape, names=None) -> CrypTensor:
    n = 1
    for d in shape:
        n *= d
    return bool_tensor(protocol.b2a(words, n).view(shape), names)


def _not_words(words: torch.Tensor) -> torch.Tensor:
    return xor_public(words, -1)


def _eqz_words(z: torch.Tensor) -> torch.Tensor:
    """Packed XOR shares of [z == 0] for an arithmetic share z."""
    s = current()
    flat = z.reshape(-1)
    if s.world_size == 2:
        # z_0 + z_1 = 0  <=>  z_0 == -z_1  <=>  every bit of ~(z_0 ^ -z_1) is 1.
        w = ~flat if s.rank == 0 else -flat
        return protocol.and_tree_words(w, 64)
    n = flat.numel()
    words = protocol.msb_words(torch.cat([flat, -flat]))
    bits = circuits.unpack_bits(words, 2 * n)
    return _not_words(circuits.pack_bits(bits[:n] ^ bits[n:]))


def _compare(x, y, op: str) -> CrypTensor:
    if not isinstance(x, CrypTensor):
        flip = {"lt": "gt", "gt": "lt", "le": "ge", "ge": "le", "eq": "eq", "ne": "ne"}
        return _compare(y, x, flip[op])
    z = diff_share(x, y)
    names = unify_names(x, y)
    if op in ("eq", "ne"):
        bit = protocol.eqz(z)
        if bit is not None:  # rss: one 7-round circuit
            return bool_tensor(protocol.add_public(-bit, 1) if op == "ne" else bit, names)
        words = _eqz_words(z)
        if op == "ne":
            words = _not_words(words)
        return _bool_from_words(words, z.shape, names)
    if protocol.is_rss():  # the B2A folded into the MSB's last round
        bit, _ = protocol.msb_finish(z if op in ("lt", "ge") else -z)
        return bool_tensor(protocol.add_public(-bit, 1) if op in ("ge", "le") else bit, names)
    if op in ("lt", "ge"):
        words = protocol.msb_words(z)          # [x - y < 0]
    else:
        words = protocol.msb_words(-z)         # [y - x < 0]
    if op in ("ge", "le"):
        words = _not_words(words)
    return _bool_from_words(words, z.shape, names)


def lt(x, y) -> CrypTensor:
    """Elementwise x < y (bool CrypTensor)."""
    return _compare(x, y, "lt")


def le(x, y) -> CrypTensor:
    """Elementwise x <= y (bool CrypTensor)."""
    return _compare(x, y, "le")


def gt(x, y) -> CrypTensor:
    """Elementwise x > y (bool CrypTensor)."""
    return _compare(x, y, "gt")


def ge(x, y) -> CrypTensor:
    """Elementwise x >= y (bool CrypTensor)."""
    return _compare(x, y, "ge")


def eq(x, y) -> CrypTensor:
    """Elementwise x == y (bool CrypTensor)."""
    return _compare(x, y, "eq")


def ne(x, y) -> CrypTensor:
    """Elementwise x != y (bool CrypTensor)."""
    return _compare(x, y, "ne")


# ----------------------------------------------------------------- piecewise linear
def relu(x: CrypTensor) -> CrypTensor:
    """max(x, 0) = x * [x > 0]; saves `mask` = [x > 0] for autograd."""
    grad = _needs_grad(x)
    bit, ms = protocol.msb_finish(-x.share, grad, [(tuple(x.shape), x.share)])  # [-x < 0] = [x > 0]
    out = new_like(x, ms[0])
    saved = {"mask": bool_tensor(bit, x._names)} if grad else {}
    return _record(out, "relu", (x,), **saved)


def abs_(x: CrypTensor) -> CrypTensor:
    """|x| = x - 2 x [x < 0]; saves `neg` = [x < 0] for autograd."""
    grad = _needs_grad(x)
    bit, ms = protocol.msb_finish(x.share, grad, [(tuple(x.shape), x.share)])
    out = new_like(x, x.share - 2 * ms[0])
    saved = {"neg": bool_tensor(bit, x._names)} if grad else {}
    return _record(out, "abs", (x,), **saved)


def sign(x: CrypTensor) -> CrypTensor:
    """-1, 0 or 1 like torch.sign, in x's dtype: [x > 0] - [x < 0] (7 rounds)."""
    flat = x.share.reshape(-1)
    n = flat.numel()
    bits, _ = protocol.msb_finish(torch.cat([-flat, flat]))
    share = (bits[:n] - bits[n:]).view(x.shape)
    dtype = x.dtype if x.dtype != torch.bool else torch.int64
    out = new_like(x, share << x.precision, dtype=dtype)
    return _record(out, "sign", (x,))


def where(condition, input, other) -> CrypTensor:
    """input where condition else other; condition public (bool tensor) or private (0/1).

    A private condition costs one Beaver round (no truncation for a bool/int condition),
    or nothing when both branches are public.
    """
    private = [t for t in (input, other) if isinstance(t, CrypTensor)]
    if not private and not isinstance(condition, CrypTensor):
        raise TypeError("where() needs a CrypTensor condition or branch; use torch.where otherwise")
    ref = private[0] if private else (condition.float() if torch.as_tensor(input).is_floating_point()
                                      or torch.as_tensor(other).is_floating_point() else condition.long())
    a, b = as_private(input, ref), as_private(other, ref)
    dtype = result_type(a, b)
    p = max(a.precision, b.precision) if dtype.is_floating_point else 0
    if p == 0 and dtype.is_floating_point:
        p = ref.precision
    sa, sb = a._rescaled(p, dtype), b._rescaled(p, dtype)
    names = unify_names(a, b)
    if not isinstance(condition, CrypTensor):
        cond = torch.as_tensor(condition, dtype=torch.bool)
        out = CrypTensor(torch.where(cond, sa, sb), p, dtype, names)
        return _record(out, "where", (input, other), condition=cond)
    c = condition.share
    if private:  # one round (the truncation fused into it under rss)
        (prod,) = mul_trunc([(c, sa - sb)], condition.precision)
    else:  # public branches: c times a public integer tensor, local
        prod = c * (encoding.encode(torch.as_tensor(input), p) - encoding.encode(torch.as_tensor(other), p))
        if condition.precision:
            prod = truncate(prod, condition.precision)
    out = CrypTensor(sb + prod, p, dtype, names or condition._names)
    return _record(out, "where", (input, other), condition=condition)


def _relus(values: list[torch.Tensor], want_masks: bool,
           strict: list[bool] | None = None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """relu of several shares (same scale) in one MSB circuit and one fold round.

    The mask of value v is [v > 0] (strict[i] False or absent) or [v < 0] (strict[i] True,
    relu(v) = v - v [v < 0]): the same circuit either way, so a caller picks on which side
    of a tie (v == 0) the mask falls. Returns (relus, masks).
    """
    strict = strict or [False] * len(values)
    flat = torch.cat([v.reshape(-1) for v in values])
    signed = torch.cat([(v if s else -v).reshape(-1) for v, s in zip(values, strict)])
    words = protocol.msb_words(signed)          # [v < 0] if strict else [v > 0]
    n = flat.numel()
    bs, ms = protocol.finish([(words, n)] if want_masks else [], [(words, (n,), flat)])
    outs, masks, off = [], [], 0
    for v, s in zip(values, strict):
        part = ms[0][off:off + v.numel()].view(v.shape)   # v times the mask
        outs.append(v - part if s else part)
        if want_masks:
            masks.append(bs[0][off:off + v.numel()].view(v.shape))
        off += v.numel()
    return outs, masks


def clamp(x: CrypTensor, min=None, max=None, *, _at_bound: bool = True) -> CrypTensor:
    """min(max(x, min), max) = min + relu(x - min) - relu(x - max) (7 rounds, one circuit).

    Bounds may be public (numbers, tensors) or private. Saves `below` = [x < min] and
    `above` = [x > max] (bool CrypTensors, None for an absent bound) for autograd, so that
    the gradient passes at a bound like torch.clamp's; `_at_bound=False` (hardtanh, relu6)
    saves [x <= min] and [x >= max] instead: no gradient at a bound, like torch.hardtanh.
    The same circuit computes either pair (costs unchanged).
    """
    if min is None and max is None:
        raise ValueError("clamp needs at least one of min and max")
    lo = as_private(min, x) if min is not None else None
    hi = as_private(max, x) if max is not None else None
    p = x.precision
    for b in (lo, hi):
        if b is not None and b.dtype.is_floating_point and not x.dtype.is_floating_point:
            x = x.float()
            p = x.precision
    values = []
    if lo is not None:
        values.append(x.share - lo._rescaled(p, x.dtype))
    if hi is not None:
        values.append(x.share - hi._rescaled(p, x.dtype))
    grad = _needs_grad(x, min, max)
    # Which side of a tie each mask takes: [v < 0] (strict) or [v > 0], v = x - bound.
    strict = ([_at_bound] if lo is not None else []) + ([not _at_bound] if hi is not None else [])
    relus, masks = _relus(values, grad, strict)
    if lo is not None and hi is not None:
        share = lo._rescaled(p, x.dtype) + relus[0] - relus[1]
    elif lo is not None:
        share = lo._rescaled(p, x.dtype) + relus[0]
    else:
        share = x.share - relus[0]   # x - relu(x - max)
    share = share + torch.zeros(torch.broadcast_shapes(share.shape, x.shape), dtype=torch.int64)
    out = new_like(x, share)
    saved = {}
    if grad:
        i = 0
        below = above = None
        if lo is not None:   # [x < min] directly, or [x <= min] = 1 - [x > min]
            below = bool_tensor(masks[0] if _at_bound else
                                public_share(torch.ones_like(masks[0])) - masks[0])
            i = 1
        if hi is not None:   # [x > max] directly, or [x >= max] = 1 - [x < max]
            above = bool_tensor(public_share(torch.ones_like(masks[i])) - masks[i]
                                if not _at_bound else masks[i])
            if below is not None and not _at_bound and _same_public_bound(min, max):
                # min == max: [x <= min] and [x >= max] overlap at x == min; torch's gradient
                # is zero everywhere there, so the second mask is the first one's complement
                above = bool_tensor(public_share(torch.ones_like(masks[0])) - below.share)
        saved = {"below": below, "above": above}
    # Both bounds are inputs (public ones and None get no gradient), so that the rule knows
    # which bound a private one is.
    return _record(out, "clamp", (x, min, max), **saved)


def _same_public_bound(lo, hi) -> bool:
    """Both bounds public (numbers or tensors) and equal everywhere."""
    if isinstance(lo, CrypTensor) or isinstance(hi, CrypTensor):
        return False
    return bool(torch.equal(*torch.broadcast_tensors(torch.as_tensor(lo, dtype=torch.float64),
                                                     torch.as_tensor(hi, dtype=torch.float64))))


def hardtanh(x: CrypTensor, min_val: float = -1.0, max_val: float = 1.0) -> CrypTensor:
    """clamp(x, min_val, max_val); gradient 0 at the bounds, like torch.hardtanh."""
    return clamp(x, min_val, max_val, _at_bound=False)


def relu6(x: CrypTensor) -> CrypTensor:
    """clamp(x, 0, 6); gradient 0 at 0 and 6, like torch.nn.functional.relu6."""
    return clamp(x, 0.0 if x.dtype.is_floating_point else 0, 6.0 if x.dtype.is_floating_point else 6,
                 _at_bound=False)


def maximum(x, y) -> CrypTensor:
    """Elementwise max(x, y) = y + relu(x - y)."""
    if not isinstance(x, CrypTensor):
        x, y = y, x
    return clamp(x, min=y)


def minimum(x, y) -> CrypTensor:
    """Elementwise min(x, y) = x - relu(x - y)."""
    if not isinstance(x, CrypTensor):
        x, y = y, x
    return clamp(x, max=y)
