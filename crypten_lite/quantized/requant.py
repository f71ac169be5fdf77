"""Pure integer arithmetic of requantization: multipliers, shifts, rounding, bounds.

Requantization turns an integer accumulator ``acc`` with real value ``acc * r`` into an
output integer ``round(acc * r) + zero_point``. The public ratio ``r`` (for example
``s_x * s_w / s_y``) becomes ``m / 2**shift`` with an integer ``m`` of ``bits`` significant
bits; ``bits = 24`` represents a float32 ratio exactly, which is how torch's fbgemm / x86
kernels compute (``lrintf(acc * (float)M)``), so the integer result equals torch's whenever
the float32 product is exact.

Rounding: torch rounds half to even. An exact tie needs ``acc * m + bias`` to be an odd
multiple of ``2**(shift - 1)``; :func:`tie_possible` decides statically whether any ``acc``
in the accumulator's range can hit one. Only then does a rescale need ``"half_even"``
(which in MPC costs an extra bit extraction); otherwise ``"half_up"`` gives the same result.
Every function here works on Python ints (unbounded) and is unit-tested on its own.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Sequence

from crypten_lite.errors import UnsupportedError
from crypten_lite.quantized.ir import bits_for

# Below this many significant bits a multiplier is too coarse to follow torch: refuse rather
# than silently change the model.
MIN_MULTIPLIER_BITS = 8
# A pre-shift may round an accumulator by at most 2**-12 of an output step.
PRE_SHIFT_SLACK = 12


def multiplier_for(ratio: float, bits: int) -> tuple[int, int]:
    """``(m, shift)`` with ``m / 2**shift`` the ratio rounded to ``bits`` significant bits.

    ``m < 2**bits``; ``shift >= 0`` (a ratio of ``2**bits`` or more gets a larger ``m``).
    The ratio must be finite and non-negative (scales are positive).
    """
    if ratio < 0 or ratio != ratio or ratio == float("inf"):
        raise ValueError(f"a requantization ratio must be finite and >= 0, got {ratio}")
    if ratio == 0:
        return 0, 0
    exact = Fraction(ratio)
    shift = bits - 1 - _floor_log2(exact)
    m = _round_half_even(exact * (Fraction(2) ** shift))
    if m >= 1 << bits:  # rounding carried into a new bit
        m, shift = m >> 1, shift - 1
    if shift < 0:
        m, shift = m << -shift, 0
    return m, shift


def common_multipliers(ratios: Sequence[float], bits: int) -> tuple[list[int], int]:
    """Multipliers for several ratios that share one shift (one truncation in MPC).

    Each ratio is first rounded to ``bits`` significant bits on its own, then all are
    brought to the largest shift (exact: a left shift) and common factors of two are removed.
    """
    pairs = [multiplier_for(r, bits) for r in ratios]
    shift = max(s for _, s in pairs)
    ms = [m << (shift - s) for m, s in pairs]
    while shift > 0 and all(m % 2 == 0 for m in ms):
        ms = [m >> 1 for m in ms]
        shift -= 1
    return ms, shift


def fit_multipliers(
    ratios: Sequence[float], acc_bits: int, bits: int, max_bits: int, what: str, allow_pre: bool = True
) -> tuple[list[int], int, int]:
    """Multipliers such that ``acc * m`` fits into ``max_bits``: ``(ms, shift, pre_shift)``.

    An accumulator far finer than the output (fixed-point products) is first rounded by
    ``pre_shift`` bits, as long as that moves the result by less than 2**-PRE_SHIFT_SLACK
    of an output step; only then are multipliers given fewer than ``bits`` bits.
    """
    pre = 0
    need = acc_bits + bits - max_bits
    top = max(ratios)
    if allow_pre and need > 0 and top > 0:
        room = -PRE_SHIFT_SLACK - _floor_log2(Fraction(top)) - 1  # 2**room * top < 2**-slack
        pre = max(0, min(need, room))
    ratios = [r * (1 << pre) for r in ratios]
    acc_bits -= pre
    b = bits
    while b >= MIN_MULTIPLIER_BITS:
        ms, shift = common_multipliers(ratios, b)
        if acc_bits + max(m.bit_length() for m in ms) <= max_bits:
            return ms, shift, pre
        b -= 1
    raise UnsupportedError(
        f"{what}: an accumulator of {acc_bits} bits leaves fewer than {MIN_MULTIPLIER_BITS} "
        f"bits for the requantization multiplier under max_bits={max_bits}; raise max_bits "
        "or use smaller layers"
    )


def round_shift(v: int, shift: int, rounding: str = "half_up") -> int:
    """Reference of the backend's truncation: ``round(v / 2**shift)``."""
    if shift == 0:
        return v
    q, r = divmod(v, 1 << shift)  # floor division, r >= 0
    half = 1 << (shift - 1)
    if r > half or (r == half and (rounding == "half_up" or q % 2 == 1)):
        q += 1
    return q


def tie_possible(m: int, shift: int, bias: int, lo: int, hi: int) -> bool:
    """Whether some ``acc`` in ``[lo, hi]`` makes ``acc * m + bias`` an exact rounding tie.

    A tie is ``acc * m + bias == 2**(shift-1)  (mod 2**shift)``. With ``m = o * 2**e``
    (``o`` odd) it needs ``2**e`` to divide ``2**(shift-1) - bias`` and then
    ``acc == t * o**-1  (mod 2**(shift-e))``: one residue class, checked against the range.
    """
    if shift == 0 or lo > hi:
        return False
    modulus = 1 << shift
    target = ((1 << (shift - 1)) - bias) % modulus
    if m == 0:
        return target == 0
    e = min(_trailing_zeros(m), shift)
    if target % (1 << e):
        return False
    period = 1 << (shift - e)
    odd = m >> e
    a0 = ((target >> e) * pow(odd, -1, period)) % period if period > 1 else 0
    first = lo + ((a0 - lo) % period)  # smallest acc >= lo in the residue class
    return first <= hi


def tie_possible_sum(ms: Sequence[int], ranges: Sequence[tuple[int, int]], shift: int) -> bool:
    """Ties of ``sum_i x_i * ms[i]`` with ``x_i`` in ``ranges[i]``; exact for two small ranges."""
    if shift == 0:
        return False
    if len(ms) == 1:
        return tie_possible(ms[0], shift, 0, *ranges[0])
    sizes = [hi - lo + 1 for lo, hi in ranges]
    if len(ms) == 2 and sizes[0] * sizes[1] <= 1 << 22:
        (lo0, hi0), (lo1, hi1) = ranges
        return any(tie_possible(ms[1], shift, x * ms[0], lo1, hi1) for x in range(lo0, hi0 + 1))
    return True  # too many combinations to enumerate: assume the worst


def product_bounds(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    """Interval of ``x * y`` for ``x`` in ``a`` and ``y`` in ``b``."""
    corners = [a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]]
    return min(corners), max(corners)


def plan_clamp(
    pre_lo: int, pre_hi: int, lo: int | None, hi: int | None
) -> tuple[int | None, int | None, int, int]:
    """Drop clamp bounds that already hold; return them and the clamped value's bounds."""
    lo = lo if lo is not None and pre_lo < lo else None
    hi = hi if hi is not None and pre_hi > hi else None

    def clamp(v: int) -> int:
        v = max(v, lo) if lo is not None else v
        return min(v, hi) if hi is not None else v

    return lo, hi, clamp(pre_lo), clamp(pre_hi)


def rescale_bounds(
    ms: Sequence[int],
    acc_ranges: Sequence[tuple[int, int]],
    biases: Sequence[int] | None,
    shift: int,
    offset: int,
) -> tuple[int, int, int, int, bool]:
    """Bounds of ``v = acc * m + bias`` and of ``round(v / 2**shift) + offset``.

    One ``(m, acc range, bias)`` per channel / position. Returns
    ``(v_lo, v_hi, pre_lo, pre_hi, ties)`` where ``ties`` tells whether any channel can
    meet an exact rounding tie.
    """
    v_lo = v_hi = None
    ties = False
    for i, (m, (lo, hi)) in enumerate(zip(ms, acc_ranges)):
        b = biases[i] if biases is not None else 0
        lo_i, hi_i = product_bounds((lo, hi), (m, m))
        lo_i, hi_i = lo_i + b, hi_i + b
        v_lo = lo_i if v_lo is None else min(v_lo, lo_i)
        v_hi = hi_i if v_hi is None else max(v_hi, hi_i)
        ties = ties or tie_possible(m, shift, b, lo, hi)
    assert v_lo is not None and v_hi is not None
    # floor / ceil: sound for either rounding, and for an MPC truncation that is off by one
    pre_lo = (v_lo >> shift) + offset
    pre_hi = -((-v_hi) >> shift) + offset
    return v_lo, v_hi, pre_lo, pre_hi, ties


def div_round_half_even(x: int, d: int) -> int:
    """Reference: ``round(x / d)`` with ties to even, for a positive integer ``d``."""
    return _round_half_even(Fraction(x, d))


def plan_exact_divide(divisors: Sequence[int], x_lo: int, x_hi: int) -> dict[str, Any]:
    """Integer constants that compute ``round_half_even(x / d)`` exactly with MPC operations.

    ``d = o * 2**a`` with ``o`` odd. Steps (all per position, public constants):

    1. ``x' = x + k * o >= 0`` (``k = ceil(-x_lo / o)``);
    2. ``q = floor(x' * magic / 2**magic_shift) - k = floor(x / o)`` with
       ``magic = ceil(2**magic_shift / o)`` (exact for ``x' < 2**(magic_shift - log2 o)``);
    3. ``r = x - q * o`` in ``[0, o)``;
    4. ``bit = clamp(r - bit_offset, 0, 1)``: for ``a >= 1`` whether ``r > 0`` (sticky),
       for ``a == 0`` whether ``r / o > 1/2``;
    5. ``y = (2 q + bit_weight * bit) * 2**(a_max - a)`` and the result is
       ``round_half_even(y / 2**(a_max + 1))``.

    Ties of ``x / d`` need ``a >= 1``; then ``x / d`` sits on a half exactly when
    ``q = (2 h + 1) 2**(a-1)`` and ``r == 0``, which ``y`` reproduces; for ``a == 0``
    ``q + bit`` is already the rounded result.
    """
    odd = [d >> _trailing_zeros(d) for d in divisors]
    a = [_trailing_zeros(d) for d in divisors]
    a_max = max(a)
    k = [max(0, -(x_lo // o)) for o in odd]  # ceil(-x_lo / o) for x_lo <= 0
    xp_hi = max(x_hi + ki * o for ki, o in zip(k, odd))
    magic_shift = xp_hi.bit_length() + max(o.bit_length() for o in odd)
    magic = [-((-(1 << magic_shift)) // o) for o in odd]
    q_hi = max(x_hi // o for o in odd) + 1
    q_lo = min(x_lo // o for o in odd)
    y_hi = (2 * q_hi + 2) << a_max
    y_lo = (2 * q_lo) << a_max
    return dict(
        odd=odd,
        k=k,
        magic=magic,
        magic_shift=magic_shift,
        magic_bits=bits_for(-(1 << (magic_shift - 1)), max(xp_hi * m for m in magic)),
        r_bits=bits_for(-max(odd), max(odd)),
        bit_offset=[(o - 1) // 2 if ai == 0 else 0 for o, ai in zip(odd, a)],
        bit_weight=[2 if ai == 0 else 1 for ai in a],
        scale_up=[1 << (a_max - ai) for ai in a],
        shift=a_max + 1,
        y_bits=bits_for(y_lo, y_hi),
    )


def _floor_log2(x: Fraction) -> int:
    e = x.numerator.bit_length() - x.denominator.bit_length()
    if Fraction(2) ** e > x:
        e -= 1
    return e


def _round_half_even(x: Fraction) -> int:
    q, r = divmod(x.numerator, x.denominator)
    if 2 * r > x.denominator or (2 * r == x.denominator and q % 2 == 1):
        q += 1
    return q


def _trailing_zeros(m: int) -> int:
    return (m & -m).bit_length() - 1


__all__ = [
    "MIN_MULTIPLIER_BITS",
    "bits_for",
    "common_multipliers",
    "div_round_half_even",
    "plan_exact_divide",
    "fit_multipliers",
    "multiplier_for",
    "plan_clamp",
    "product_bounds",
    "rescale_bounds",
    "round_shift",
    "tie_possible",
    "tie_possible_sum",
]
