"""The one interface the layers above mpc/ call: it routes every protocol to the session's
sharing scheme (``config.protocol``).

* ``additive`` (N >= 2 parties): a share is one int64 tensor, x = sum_i x_i mod 2^64, and
  correlated randomness comes from the dealer (or TFP). Implementations: primitives (share,
  open), beaver (products), truncation, binary (AND, XOR), convert (MSB, A2B, B2A, rounding).
* ``rss`` (exactly 3 parties, no dealer): a share is a ``Replicated`` (two of the three
  components). Implementations: rss (share, open, products, truncation), rss_binary (AND,
  MSB, A2B, B2A, bit injection, exact rounding).

The layers above never test a rank to add a public constant: ``public_share``,
``add_public`` and ``xor_public`` do it, as the scheme requires (rank 0 under additive,
share index 0 under rss). This module only routes; it holds no protocol of its own.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from ..errors import ProtocolError, UnsupportedError
from ..session import current
from . import beaver, binary, circuits, convert, primitives, rss, truncation
from .replicated import Replicated

ALL_ONES = -1


def name() -> str:
    """The session's sharing scheme: "additive" or "rss"."""
    return current().config.protocol


def is_rss() -> bool:
    return current().config.protocol == "rss"


def is_lead() -> bool:
    """Whether this party alone holds public terms under the additive scheme (rank 0).
    Under rss no single party does (share index 0 is held by parties 0 and 2): use
    public_share / add_public instead wherever possible."""
    return current().rank == 0


def _rss_binary(op: str) -> Callable:
    """The rss_binary implementation of `op` (same signature as the additive one)."""
    try:
        from . import rss_binary
    except ImportError:
        rss_binary = None
    fn = getattr(rss_binary, op, None)
    if fn is None:
        raise UnsupportedError(f"{op} is not implemented under protocol 'rss' yet "
                               "(crypten_lite.mpc.rss_binary); use CRYPTEN_LITE_PROTOCOL=additive")
    return fn


# ---------------------------------------------------------------- sharing and opening
def share(encoded: torch.Tensor | None, src: int, shape) -> torch.Tensor:
    """This party's share of `encoded` (held by `src`; None elsewhere). Call
    primitives.announce first (shape and dtype, checked on every party)."""
    if is_rss():
        return rss.share(encoded, src, shape)
    return primitives.share(encoded, src, shape)


def open_many(shares: Sequence[torch.Tensor], dst: int | None = None) -> list[torch.Tensor] | None:
    """Reveal several shared tensors in one round (to all, or only to `dst`)."""
    if is_rss():
        return rss.open_many(shares, dst)
    return primitives.open_many(list(shares), dst)


def open_(x: torch.Tensor, dst: int | None = None) -> torch.Tensor | None:
    """Reveal one shared tensor (one round)."""
    if is_rss():
        return rss.open_(x, dst)
    return primitives.open_(x, dst)


def open_xor(x: torch.Tensor) -> torch.Tensor:
    """Reveal a binary (xor) shared tensor to every party (one round)."""
    if is_rss():
        return rss.open_xor(x)
    return binary.open_xor(x)


def public_share(encoded: torch.Tensor) -> torch.Tensor:
    """The trivial sharing of a public (encoded) tensor; no communication. A public constant
    made in a share's shape (`torch.full_like(share, c)`) is already that sharing under rss."""
    if isinstance(encoded, Replicated):
        return encoded
    if is_rss():
        return rss.public(torch.as_tensor(encoded))
    return encoded if current().rank == 0 else torch.zeros_like(encoded)


def zeros_share(like: torch.Tensor) -> torch.Tensor:
    """A sharing of zeros in the form of `like`'s shares."""
    return torch.zeros_like(like)


def add_public(x: torch.Tensor, c) -> torch.Tensor:
    """Shares of x + c for a public c (broadcasting like torch)."""
    if isinstance(x, Replicated):
        return x + c
    if current().rank == 0:
        return x + c
    return x + torch.zeros_like(torch.as_tensor(c))


def xor_public(x: torch.Tensor, c) -> torch.Tensor:
    """Binary shares of x ^ c for a public c."""
    if isinstance(x, Replicated):
        return x ^ c
    return binary.xor_public(x, c)


def lead_of(like: torch.Tensor) -> torch.Tensor:
    """A binary sharing of all-ones words in `like`'s shape (xor public constants through
    `lead & c`)."""
    if isinstance(like, Replicated) or is_rss():
        return public_share(torch.full(like.shape, ALL_ONES, dtype=torch.int64))
    return binary.lead_of(like)


# ---------------------------------------------------------------------- products
def mul(op: str, x: torch.Tensor, y: torch.Tensor, params: Sequence[int] = ()) -> torch.Tensor:
    """Shares of op(x, y) for a bilinear op (mul, matmul, conv1d, conv2d, conv_transpose2d),
    at the sum of the operands' scales (one round)."""
    if is_rss():
        return rss.mul(op, x, y, params)
    return beaver.beaver(op, x, y, params)


def mul_trunc(op: str, x: torch.Tensor, y: torch.Tensor, params: Sequence[int], bits: int) -> torch.Tensor:
    """Shares of op(x, y) / 2^bits. Additive: Beaver then truncation (as before); rss: ONE
    round, truncation fused into the reshare."""
    if is_rss():
        return rss.mul_trunc(op, x, y, params, bits)
    if op == "mul" and bits and truncation.is_local():  # truncated range by range as it is made
        return beaver.beaver(op, x, y, params, local_shift=bits)
    return truncation.truncate(beaver.beaver(op, x, y, params), bits, owned=True)


def square(x: torch.Tensor) -> torch.Tensor:
    """Shares of x * x (one round)."""
    if is_rss():
        return rss.square(x)
    return beaver.square(x)


def square_trunc(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Shares of x * x / 2^bits (additive: square then truncation; rss: one round)."""
    if is_rss():
        return rss.square_trunc(x, bits)
    return truncation.truncate(beaver.square(x), bits, owned=True)


def truncate(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Shares of x / 2^bits (+-1 ulp)."""
    if bits == 0:
        return x
    if is_rss():
        return rss.truncate(x, bits)
    return truncation.truncate(x, bits)


def truncate_many(items: Sequence[tuple[torch.Tensor, int]]) -> list[torch.Tensor]:
    """truncate for several (x, bits) at once: where truncation takes a round, ONE round."""
    if is_rss():
        return rss.truncate_many(items)
    return truncation.truncate_many(items)


def truncate_many_gen(items: Sequence[tuple[torch.Tensor, int]]):
    """truncate_many as a protocol in rounds (mpc.parallel): yields nothing where truncation
    is local, else its one opening (under rss its one request, rss.truncate_many_gen)."""
    if is_rss():
        return (yield from rss.truncate_many_gen(items))
    return (yield from truncation.truncate_many_gen(items))


def truncate_exact(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Shares of x / 2^bits (+-1 ulp) that never fail by a wrap, whatever the truncation
    setting: between 2 additive parties the dealer-assisted round (mpc.truncation) even where
    local truncation is configured. For products at a large scale, whose local truncation
    would fail with probability |x| / 2^64 per element (fast.layer_norm_share)."""
    if bits == 0:
        return x
    if is_rss():
        return rss.truncate(x, bits)
    return truncation.truncate_exact(x, bits)


# ---------------------------------------------------------- binary and conversions
def and_many(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
    """Binary shares of x & y for every pair, in one round."""
    if is_rss():
        return _rss_binary("and_many")(pairs)
    return binary.and_many(pairs)


def eval_polys(jobs: Sequence[binary.PolyJob]) -> list[list[torch.Tensor]]:
    """XORs of ANDs of several inputs, in one round (binary.PolyJob)."""
    if is_rss():
        return _rss_binary("eval_polys")(jobs)
    return binary.eval_polys(jobs)


def msb_words(x: torch.Tensor) -> torch.Tensor:
    """Packed binary shares (64 per word) of msb(x), i.e. x < 0."""
    if is_rss():
        return _rss_binary("msb_words")(x)
    return convert.msb_words(x)


def msb_finish(x: torch.Tensor, want_bit: bool = True, muls: Sequence[tuple[Sequence[int], torch.Tensor]] = ()):
    """msb(x) (x < 0) as arithmetic 0/1 shares of x's shape (if want_bit) and times each value
    of `muls` ((bit_shape, value), at most one): msb_words then one finish round (additive),
    or rss_binary.msb_finish (7 rounds: the B2A folded into the MSB's last round).
    Returns (bits or None, [bit * value])."""
    if is_rss():
        return _rss_binary("msb_finish")(x, want_bit, muls)
    words = convert.msb_words(x)
    bs, ms = convert.finish([(words, x.numel())] if want_bit else [],
                            [(words, tuple(shape), v) for shape, v in muls])
    return (bs[0].view(x.shape) if want_bit else None), ms


def eqz(z: torch.Tensor):
    """[z == 0] as arithmetic 0/1 shares under rss (rss_binary.eqz_finish, 7 rounds); None
    under the additive protocol, whose comparisons build it from binary words."""
    if is_rss():
        return _rss_binary("eqz_finish")(z)
    return None


def a2b(x: torch.Tensor) -> torch.Tensor:
    """Binary shares of every bit of x."""
    if is_rss():
        return _rss_binary("a2b")(x)
    return convert.a2b(x)


def finish(b2as=(), muls=()):
    """ONE round: B2A of packed bit words, and bit * value products (convert.finish)."""
    if is_rss():
        return _rss_binary("finish")(b2as, muls)
    return convert.finish(b2as, muls)


def finish_gen(b2as=(), muls=()):
    """finish as a protocol in rounds (mpc.parallel): one message (under rss one request,
    or two rounds where no random bits were prefetched)."""
    if is_rss():
        return (yield from _rss_binary("finish_gen")(b2as, muls))
    return (yield from convert.finish_gen(b2as, muls))


def b2a(words: torch.Tensor, n: int) -> torch.Tensor:
    """Arithmetic 0/1 shares (n,) of packed binary-shared bits (one round)."""
    return finish([(words, n)])[0][0]


def bit_mul(words: torch.Tensor, bit_shape: Sequence[int], value: torch.Tensor) -> torch.Tensor:
    """Shares of bit * value for packed binary-shared bits (one round)."""
    return finish((), [(words, bit_shape, value)])[1][0]


def round_exact(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Shares of floor((x + 2^(bits-1)) / 2^bits), exactly."""
    if is_rss():
        return _rss_binary("round_exact")(x, bits)
    return convert.round_exact(x, bits)


def and_bits(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """AND of 0/1-valued binary shares (one round)."""
    if is_rss():
        return _rss_binary("and_bits")(x, y)
    return convert.and_bits(x, y)


def not_bits(x: torch.Tensor) -> torch.Tensor:
    """NOT of 0/1-valued binary shares (local)."""
    return xor_public(x, 1)


def and_tree_words(x: torch.Tensor, width: int) -> torch.Tensor:
    """AND of the `width` lane-packed bits of each element -> packed bits (additive: four
    bits per round, circuits.and_tree with binary.xor_polys; rss: two, with its AND)."""
    if is_rss():
        return circuits.and_tree(x, width, and_fn=_rss_binary("and_many"))
    return circuits.and_tree(x, width, poly_fn=binary.xor_polys)


def and_reduce_bits(x: torch.Tensor) -> torch.Tensor:
    """AND over the last axis of 0/1 binary shares (additive: ceil(log4 k) rounds; rss:
    ceil(log2 k))."""
    if is_rss():
        return _rss_binary("and_reduce_bits")(x)
    return convert.and_reduce_bits(x)


# ------------------------------------------- short integers (int8 inference) and sampling
# Additive: crypten_lite.mpc.intops; rss: crypten_lite.mpc.rss_int / rss_binary.
def msb_low(x: torch.Tensor, m: int) -> torch.Tensor:
    """Packed binary shares of bit m-1 of x mod 2^m (x < 0 when -2^(m-1) <= x < 2^(m-1))."""
    if is_rss():
        return _rss_binary("msb_low")(x, m)
    from . import intops
    return intops.msb_low(x, m)


def round_shift(x: torch.Tensor, shift: int, bits: int, rounding: str = "half_up",
                carry_bits: int = 16, method: str = "auto") -> torch.Tensor:
    """Shares of round(x / 2^shift) (half_up or half_even) for -2^bits <= x < 2^bits, exactly
    (additive: exact for shift <= carry_bits, see intops; rss: exact for every shift).
    The arguments are checked here, once, for both schemes."""
    if shift == 0:
        return x
    if rounding not in ("half_up", "half_even"):
        raise ValueError(f"unknown rounding {rounding!r}")
    from .intops import BIAS_BITS, MAX_BITS
    if bits > MAX_BITS or shift > BIAS_BITS:
        raise ProtocolError(f"round_shift: {bits}-bit values / shift {shift} exceed the "
                            f"{MAX_BITS}-bit range of exact truncation")
    if is_rss():
        from . import rss_int
        return rss_int.round_shift(x, shift, bits, rounding, carry_bits, method)
    from . import intops
    return intops.round_shift(x, shift, bits, rounding, carry_bits, method)


def has_requantize_clamp() -> bool:
    """Whether requantize_clamp exists for this session (additive, 2 parties)."""
    return not is_rss() and current().world_size == 2


def requantize_clamp(v: torch.Tensor, shift: int, offset: int, lo, hi, m: int, carry_bits: int = 16) -> torch.Tensor:
    """clamp(round(v / 2^shift) + offset, lo, hi) fused (intops.requantize_clamp; 2 parties,
    additive only: see has_requantize_clamp)."""
    if not has_requantize_clamp():
        raise UnsupportedError("requantize_clamp exists for 2 parties under the additive protocol "
                               "only; use round_shift and a clamp")
    from . import intops
    return intops.requantize_clamp(v, shift, offset, lo, hi, m, carry_bits)


def random_words(n_words: int) -> torch.Tensor:
    """Packed binary shares of 64 * n_words uniform secret bits, with no communication
    (additive: each party's own PRG; rss: pairwise PRG streams)."""
    if is_rss():
        from . import rss_int
        return rss_int.random_words(n_words)
    from . import intops
    return intops.random_words(n_words)


def msb_low_mul(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], m: int) -> list[torch.Tensor]:
    """[x < 0] * v for each (x, v), v of x's shape and -2^(m-1) <= x < 2^(m-1) (additive:
    short MSB then one bit-times-value round; rss: the product folded into the MSB's rounds)."""
    if is_rss():
        from . import rss_int
        return rss_int.msb_low_mul(pairs, m)
    from . import intops
    return intops.msb_low_mul(pairs, m)
