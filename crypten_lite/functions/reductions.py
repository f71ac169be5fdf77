"""max / min / argmax / argmin over all elements or along a dim.

Two algorithms, both with torch's tie rule (the FIRST index of the extreme value wins):

* ``tree`` (default): pad the k candidates to a power of two with a sentinel, then
  log2(k) levels; a level compares neighbours (left, right) and keeps right only if it is
  strictly better, multiplying the choice bit into [right - left] and into both one-hot
  blocks in the B2A round (kind bit_mul): 5 rounds per level between 2 parties, 6 at 3
  (additive; rss folds the product into the MSB's last round: protocol.msb_finish).
* ``pairwise``: every pair compared at once (k(k-1)/2 comparisons, one MSB circuit), the
  winner's one-hot is the AND of its k-1 wins (ceil(log4(k-1)) rounds), then one fold
  round: 4 + ceil(log4(k-1)) + 1 rounds, more bytes. Used by softmax for small k.
* ``grouped``: levels of all-pairs groups (argmax_grouped, group sizes from grouped_plan):
  the fewest rounds with no more bytes than the tree (2 parties), about a third of the tree's
  rounds for long vectors (the tree's bytes are mostly its one-hot blocks, folded at every
  one of its log2(k) levels). Used by generation's argmax over the vocabulary.

Inputs must satisfy |x| < 2^59 at their scale (the sentinel is -/+2^60).
"""

from __future__ import annotations

import functools
from collections import namedtuple

import torch

from ..cryptensor import CrypTensor, _record, _reduce_names
from ..errors import ProtocolError
from ..mpc import circuits, protocol
from ._common import all_pairs_winners, bool_tensor, public_share
from .comparisons import _needs_grad

SENTINEL = 1 << 60
MaxResult = namedtuple("MaxResult", ["values", "indices"])


def _next_pow2(k: int) -> int:
    w = 1
    while w < k:
        w *= 2
    return w


def argmax_tree(v: torch.Tensor, largest: bool = True, want_onehot: bool = True):
    """v: shares (R, k) -> (shares of the extreme values (R,), arithmetic one-hot (R, k) or None)."""
    rows, k = v.shape
    kp = _next_pow2(k)
    if kp > k:
        fill = public_share(torch.full((rows, kp - k), -SENTINEL if largest else SENTINEL, dtype=torch.int64))
        v = torch.cat([v, fill], 1)
    oh = public_share(torch.ones(rows, kp, 1, dtype=torch.int64)) if want_onehot else None
    while v.shape[1] > 1:
        left, right = v[:, 0::2], v[:, 1::2]
        h = left.shape[1]
        parts = [(right - left).unsqueeze(-1)]
        if oh is not None:
            parts += [oh[:, 0::2], oh[:, 1::2]]
        value = torch.cat(parts, -1)
        # [right better] times the level's values: the MSB and its bit * value product (under
        # rss folded into the MSB's last round: 6 rounds a level, as the additive MSB + fold)
        _, (prod,) = protocol.msb_finish(left - right if largest else right - left, False,
                                         [((rows, h, 1), value)])
        v = left + prod[..., 0]
        if oh is not None:
            b = oh.shape[-1]
            oh = torch.cat([oh[:, 0::2] - prod[..., 1:1 + b], prod[..., 1 + b:]], -1)
    return v[:, 0], (oh[:, 0, :k] if oh is not None else None)


def argmax_pairwise(v: torch.Tensor, largest: bool = True, want_onehot: bool = True):
    """Same contract as argmax_tree, by all-pairs comparisons (fewer rounds, more bytes)."""
    rows, k = v.shape
    if k == 1:
        return v[:, 0], public_share(torch.ones(rows, 1, dtype=torch.int64))
    i, j = torch.triu_indices(k, k, 1)
    z = v[:, i] - v[:, j] if largest else v[:, j] - v[:, i]   # msb: j beats i
    npairs = i.numel()
    beats = circuits.unpack_bits(protocol.msb_words(z), rows * npairs).view(rows, npairs)
    onehot_bits = all_pairs_winners(beats, k)                 # (rows, k) xor shares
    words = circuits.pack_bits(onehot_bits.reshape(-1))
    bs, ms = protocol.finish([(words, rows * k)] if want_onehot else [], [(words, (rows, k), v)])
    oh = bs[0].view(rows, k) if want_onehot else None
    return ms[0].sum(1), oh


def _and_rounds(x: int) -> int:
    """Rounds of the AND of x bits (convert.and_reduce_bits: four per round)."""
    rounds = 0
    while x > 1:
        x = _ceil(x, 4)
        rounds += 1
    return rounds


def _level_rounds(g: int) -> int:
    """Rounds of one grouped level (2 parties): MSB (4: level 1 and three radix-4 carry
    levels) + the AND of the g-1 wins + one fold."""
    return 5 + _and_rounds(g - 1)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _msb_words(n: int) -> int:
    """Words one of 2 parties sends for the MSB of n values (convert.msb_words: level 1, then
    radix-4 levels 32 -> 8 -> 2 of 7 opened inputs and 2 -> 1 of 2)."""
    w1 = _ceil(_ceil(_ceil(n, 2), 2), 2)
    w2 = _ceil(_ceil(w1, 2), 2)
    return n + 7 * (w1 + w2) + 2 * _ceil(w2, 2)


def _level_words(n: int, g: int, b: int) -> int:
    """Words one of 2 parties sends for a grouped level over n candidates with one-hot blocks
    of b: the pairs' MSB, the AND tree of each candidate's g-1 wins, the fold round."""
    cands = _ceil(n, g) * g
    words = _msb_words(cands * (g - 1) // 2)
    x = g - 1
    while x > 1:  # convert.and_reduce_bits: runs of four (and the rest) per round
        full, rest = divmod(x, 4)
        words += 4 * _ceil(cands * full, 64) if full else 0
        words += rest * _ceil(cands, 64) if rest > 1 else 0
        x = full + (1 if rest else 0)
    return words + _ceil(cands, 64) + cands * (1 + b)


def _tree_words(k: int) -> int:
    n, b, words = _next_pow2(k), 1, 0
    while n > 1:
        n //= 2
        words += _msb_words(n) + _ceil(n, 64) + n * (1 + 2 * b)
        b *= 2
    return words


@functools.lru_cache(maxsize=256)
def grouped_plan(k: int) -> tuple[int, ...] | None:
    """The group sizes of argmax_grouped's levels for k candidates (public: depends on k only),
    or None where no grouped tournament sends fewer bytes than the tree (k <= 2).

    Level sizes g are 2^j + 1 (the g-1 wins of a candidate AND in ceil(j/2) rounds) or all
    the candidates left. The plan has the fewest rounds among those that send no more bytes than
    the tree (counted for 2 parties): dynamic programming over (candidates left, block size)
    minimising rounds + mu * words, for a sweep of mu, keeping the best plan under the bound."""
    budget = _tree_words(k)
    found = None
    for mu in [0.0] + [2.0 ** -e for e in range(30)]:
        memo: dict[tuple[int, int], tuple[float, tuple[int, ...]]] = {}

        def best(n: int, b: int):
            if n == 1:
                return 0.0, ()
            if (n, b) not in memo:
                options = {2 ** j + 1 for j in range(11) if 2 ** j + 1 < n} | ({n} if n <= 4096 else set())
                out = None
                for g in sorted(options):
                    cost, rest = best(_ceil(n, g), b * g)
                    cost += _level_rounds(g) + mu * _level_words(n, g, b)
                    if out is None or cost < out[0]:
                        out = (cost, (g,) + rest)
                memo[(n, b)] = out
            return memo[(n, b)]

        plan = best(k, 1)[1]
        n, b, words = k, 1, 0
        for g in plan:
            words += _level_words(n, g, b)
            n, b = _ceil(n, g), b * g
        rounds = sum(_level_rounds(g) for g in plan)
        if words <= budget and (found is None or (rounds, words) < found[:2]):
            found = (rounds, words, plan)
    return found[2] if found is not None else None


def argmax_grouped(v: torch.Tensor, largest: bool = True, want_onehot: bool = True):
    """Same contract as argmax_tree, by a tournament of groups (grouped_plan): a level splits
    the candidates into groups of g (the last padded with the sentinel), compares every pair
    of a group at once (one MSB circuit), ANDs each candidate's g-1 wins into the group's
    one-hot (ceil(log2(g-1)) AND rounds) and folds value and one-hot block by that one-hot in
    one bit * value round. Ties: within a group the first largest wins, and an earlier group's
    winner beats a later one's on a tie, so the first largest index wins overall.
    Rounds (2 parties): sum of 7 + ceil(log2(g-1)) over the levels, e.g. 27 for k = 100
    (groups 3, 5, 7) and 37 for k = 50257 (groups 9, 17, 329) against 49 and 112 for the
    tree, with fewer bytes (8,544 against 11,616 for k = 100; the tree folds its one-hot
    blocks at each of its log2(k) levels). Where no plan beats the tree's bytes (k = 2), the tree."""
    rows, k = v.shape
    plan = grouped_plan(k)
    if plan is None:
        return argmax_tree(v, largest, want_onehot)
    oh = public_share(torch.ones(rows, k, 1, dtype=torch.int64)) if want_onehot else None
    fill = -SENTINEL if largest else SENTINEL
    for g in plan:
        n = v.shape[1]
        m = _ceil(n, g)
        if m * g > n:
            v = torch.cat([v, public_share(torch.full((rows, m * g - n), fill, dtype=torch.int64))], 1)
            if oh is not None:
                oh = torch.cat([oh, public_share(torch.zeros(rows, m * g - n, oh.shape[-1], dtype=torch.int64))], 1)
        vg = v.reshape(rows * m, g)
        i, j = torch.triu_indices(g, g, 1)
        z = vg[:, i] - vg[:, j] if largest else vg[:, j] - vg[:, i]   # msb: j strictly beats i
        npairs = i.numel()
        beats = circuits.unpack_bits(protocol.msb_words(z), rows * m * npairs).view(rows * m, npairs)
        bits = all_pairs_winners(beats, g)                      # (rows * m, g): the group's one-hot
        parts = [vg.unsqueeze(-1)]
        if oh is not None:
            parts.append(oh.reshape(rows * m, g, -1))
        (prod,) = protocol.finish((), [(circuits.pack_bits(bits.reshape(-1)), (rows * m, g, 1),
                                        torch.cat(parts, -1))])[1]
        v = prod[..., 0].sum(1).view(rows, m)
        if oh is not None:
            oh = prod[..., 1:].reshape(rows, m, -1)
    return v[:, 0], (oh[:, 0, :k] if oh is not None else None)


ALGORITHMS = {"tree": argmax_tree, "pairwise": argmax_pairwise, "grouped": argmax_grouped}


def _reduce(x: CrypTensor, dim, keepdim: bool, largest: bool, method: str, want_onehot: bool):
    if method not in ALGORITHMS:
        raise ProtocolError(f"max/min method must be one of {sorted(ALGORITHMS)}, got {method!r}")
    if x.numel() == 0:
        raise ProtocolError("max/min of an empty CrypTensor")
    if dim is None:
        v = x.share.reshape(1, -1)
        vals, oh = ALGORITHMS[method](v, largest, want_onehot)
        return vals.reshape(()), (oh.view(x.shape) if oh is not None else None)
    d = x._dim(dim) % max(1, x.dim())
    moved = x.share.movedim(d, -1)
    rest = moved.shape[:-1]
    vals, oh = ALGORITHMS[method](moved.reshape(-1, moved.shape[-1]), largest, want_onehot)
    vals = vals.view(rest)
    if keepdim:
        vals = vals.unsqueeze(d)
    if oh is not None:
        oh = oh.view(*rest, moved.shape[-1]).movedim(-1, d)
    return vals, oh


def _index_of(oh: torch.Tensor, d: int, keepdim: bool) -> torch.Tensor:
    k = oh.shape[d]
    weights = torch.arange(k).view(*([1] * d), k, *([1] * (oh.dim() - d - 1)))
    return (oh * weights).sum(d, keepdim=keepdim)


def _scalar(x: CrypTensor, dim) -> bool:
    """True for a 0-d x reduced along a dim (0 or -1, like torch): reduce x.reshape(1)."""
    if x.dim() != 0 or dim is None:
        return False
    for d in (dim if isinstance(dim, (tuple, list)) else (dim,)):
        if x._dim(d) not in (0, -1):
            raise IndexError(f"dimension {d} out of range for a 0-d CrypTensor (use 0 or -1)")
    return True


def _extreme(x: CrypTensor, dim, keepdim: bool, one_hot: bool, largest: bool, method: str):
    op = "max" if largest else "min"
    if _scalar(x, dim):  # torch: values x, index 0, whatever keepdim
        res = _extreme(x.reshape(1), 0, False, one_hot, largest, method)
        return MaxResult(res.values, res.indices.reshape(()))
    grad = _needs_grad(x)
    if dim is None:
        vals, oh = _reduce(x, None, False, largest, method, grad)
        out = CrypTensor(vals, x.precision, x.dtype)
        saved = {"one_hot": bool_tensor(oh, x._names)} if grad else {}
        return _record(out, op, (x,), dim=None, keepdim=False, **saved)
    d = x._dim(dim) % max(1, x.dim())
    vals, oh = _reduce(x, d, keepdim, largest, method, True)
    out = CrypTensor(vals, x.precision, x.dtype, _reduce_names(x, d, keepdim))
    out = _record(out, op, (x,), dim=d, keepdim=keepdim,
                  **({"one_hot": bool_tensor(oh, x._names)} if grad else {}))
    if one_hot:
        indices = bool_tensor(oh, x._names)
    else:
        indices = CrypTensor(_index_of(oh, d, keepdim), 0, torch.int64, _reduce_names(x, d, keepdim))
    return MaxResult(out, indices)


def max_(x: CrypTensor, dim=None, keepdim: bool = False, one_hot: bool = False, method: str = "tree"):
    """Largest element (dim=None) or (values, indices) along `dim` like torch.max.

    one_hot=True returns the indices as a bool one-hot CrypTensor of x's shape.
    """
    return _extreme(x, dim, keepdim, one_hot, True, method)


def min_(x: CrypTensor, dim=None, keepdim: bool = False, one_hot: bool = False, method: str = "tree"):
    """Smallest element (dim=None) or (values, indices) along `dim` like torch.min."""
    return _extreme(x, dim, keepdim, one_hot, False, method)


def _arg(x: CrypTensor, dim, keepdim: bool, one_hot: bool, largest: bool, method: str) -> CrypTensor:
    if _scalar(x, dim):
        return _arg(x.reshape(1), 0, False, one_hot, largest, method).reshape(())
    if dim is None:
        _, oh = _reduce(x, None, False, largest, method, True)
        if one_hot:
            return bool_tensor(oh, x._names)
        flat = oh.reshape(-1)
        share = (flat * torch.arange(flat.numel())).sum()
        if keepdim:
            share = share.view([1] * x.dim())
        return CrypTensor(share, 0, torch.int64)
    d = x._dim(dim) % max(1, x.dim())
    _, oh = _reduce(x, d, keepdim, largest, method, True)
    if one_hot:
        return bool_tensor(oh, x._names)
    return CrypTensor(_index_of(oh, d, keepdim), 0, torch.int64, _reduce_names(x, d, keepdim))


def argmax(x: CrypTensor, dim=None, keepdim: bool = False, one_hot: bool = False,
           method: str = "tree") -> CrypTensor:
    """Index of the first largest element (flattened if dim is None), or its one-hot."""
    return _arg(x, dim, keepdim, one_hot, True, method)


def argmin(x: CrypTensor, dim=None, keepdim: bool = False, one_hot: bool = False,
           method: str = "tree") -> CrypTensor:
    """Index of the first smallest element (flattened if dim is None), or its one-hot."""
    return _arg(x, dim, keepdim, one_hot, False, method)


def _amax(x: CrypTensor, dim, keepdim: bool, largest: bool) -> CrypTensor:
    if x.dim() == 0:  # torch: amax of a 0-d tensor is itself
        _scalar(x, dim)
        return _extreme(x.reshape(1), 0, False, False, largest, "tree").values
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        dims = tuple(range(x.dim()))
    else:
        dims = tuple(x._dim(d) % max(1, x.dim()) for d in (dim if isinstance(dim, (tuple, list)) else (dim,)))
    rest = [d for d in range(x.dim()) if d not in dims]
    moved = x.permute(*rest, *dims) if rest or dims != tuple(range(x.dim())) else x
    flat = moved.reshape(*[x.shape[d] for d in rest], -1)
    out = _extreme(flat, flat.dim() - 1, False, False, largest, "tree").values
    if keepdim:
        out = out.reshape([1 if d in dims else x.shape[d] for d in range(x.dim())])
    return out


def amax(x: CrypTensor, dim=None, keepdim: bool = False) -> CrypTensor:
    """Largest values over one or several dims (like torch.amax; no indices)."""
    return _amax(x, dim, keepdim, True)


def amin(x: CrypTensor, dim=None, keepdim: bool = False) -> CrypTensor:
    """Smallest values over one or several dims (like torch.amin; no indices)."""
    return _amax(x, dim, keepdim, False)
