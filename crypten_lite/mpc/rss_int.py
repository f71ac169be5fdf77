"""Integer protocols on REPLICATED shares of small values (int8 inference) and secret random
bits, 3 parties, no dealer. ``crypten_lite.mpc.protocol`` routes ``msb_low``,
``round_shift`` and ``random_words`` here under ``rss`` (crypten_lite.mpc.intops holds the
additive ones); the layers above (crypten_lite.quantized.mpc_ops, functions.sampling) call
only the protocol interface.

* Short MSB: :func:`crypten_lite.mpc.rss_binary.msb_low` (carry circuit on the low m - 1 bits).
* Rounding division ``round(x / 2**k)`` (:func:`round_shift`): ``half_up`` is
  :func:`crypten_lite.mpc.rss_binary.round_exact`, EXACT for every shift 1..62 (the carry
  circuit covers all k low bits, so no ``carry_bits`` approximation: ``carry_bits`` is
  ignored). ``half_even`` subtracts the tie bit ``[x mod 2**(k+1) == 2**(k-1)]``: a short
  MSB of ``x - 2**(k-1)`` and of its negation on ``k + 1`` bits, a NOR (one AND round) and
  a B2A.
* Random bits (:func:`random_words`): component j of a binary replicated sharing is the next
  draw of the PRG stream of pair (j, j-1) (purpose ``rss-rand``): party i draws component i
  with its prev and component i+1 with its next. No communication; a single party misses
  one component, so the XOR is uniform to it.
"""

from __future__ import annotations

import torch

from ..errors import ProtocolError
from ..session import current
from . import circuits, rss, rss_binary
from .replicated import Replicated


def tie_words(x: Replicated, k: int) -> Replicated:
    """Packed binary shares of [x mod 2**(k+1) == 2**(k-1)] (a tie whose half-up result is odd)."""
    z = x - (1 << (k - 1))
    n = z.numel()
    words = rss_binary.msb_low(torch.cat([z, -z]), k + 1)
    both = circuits.unpack_bits(words, 2 * n)
    (nor,) = rss_binary.and_many([(rss_binary.xor_public(circuits.pack_bits(both[:n]), -1),
                                   rss_binary.xor_public(circuits.pack_bits(both[n:]), -1))])
    return nor


def round_shift(x: Replicated, shift: int, bits: int, rounding: str = "half_up",
                carry_bits: int = 16, method: str = "auto") -> Replicated:
    """Replicated shares of ``round(x / 2**shift)`` for ``-2**bits <= x < 2**bits`` (``bits <= 61``),
    exactly. ``method``: ``"auto"`` (exact) or ``"probabilistic"`` (rss.truncate of
    ``x + 2**(shift-1)``: one round, off by one on about half the values; for measurements).
    The additive methods ``"local"`` / ``"dealer"`` do not exist here."""
    if method == "probabilistic":
        return rss.truncate(x + (1 << (shift - 1)), shift)
    if method != "auto":
        raise ProtocolError(f"round_shift: method {method!r} is one of the additive protocol's "
                            "(local: 2 parties; dealer: a dealer's correlations); under protocol "
                            "'rss' use 'auto' (exact, no dealer) or 'probabilistic'")
    shape = x.shape
    flat = x.reshape(-1)
    q = rss_binary.round_exact(flat, shift)
    if rounding == "half_even":
        q = q - rss_binary.b2a(tie_words(flat, shift), flat.numel())
    return q.view(shape)


def random_words(n_words: int) -> Replicated:
    """Binary replicated shares of ``64 * n_words`` uniform secret bits, packed (no
    communication; see the module docstring)."""
    s = current()
    nxt, prev = (s.rank + 1) % 3, (s.rank + 2) % 3
    a = s.pair_prg(rss_binary.PURPOSE, prev).draw((n_words,))
    b = s.pair_prg(rss_binary.PURPOSE, nxt).draw((n_words,))
    return Replicated(a, b, s.rank)


def msb_low_mul(pairs, m: int) -> list[Replicated]:
    """[x < 0] * v for each (x, v) (v of x's shape; -2^(m-1) <= x < 2^(m-1)), all in one run:
    the short MSB's XOR sharing (rss_binary._g_msb_low) is opened masked by a random bit made
    during its rounds, and the products [r v] are made meanwhile (as rss_binary.msb_finish
    does for 64 bits): 1 + log2(W/2) + 1 rounds, W = next_pow2(m - 1) (m = 10: 5 rounds)."""
    if not 1 <= m <= 64:
        raise ProtocolError(f"msb_low_mul: m must be 1..64, got {m}")
    jobs, targets = [], []
    for x, v in pairs:
        xa, xb = rss_binary._flat(x)
        if tuple(v.shape) != tuple(x.shape):
            raise ProtocolError(f"msb_low_mul: value of shape {tuple(v.shape)} for x of shape {tuple(x.shape)}")
        va, vb, target = rss_binary._mul_operand(tuple(x.shape), v)
        jobs.append({"n": xa.numel(), "want_bit": False, "xa": xa, "xb": xb, "va": va, "vb": vb})
        targets.append(target)

    def first(ro, job, lo, hi):
        return rss_binary._g_msb_low(ro, job["xa"][lo:hi], job["xb"][lo:hi], m)

    _, prods = rss_binary._run(rss_binary._finish_jobs(jobs, first))
    return [rss_binary._cat_rep(p, t) for p, t in zip(prods, targets)]
