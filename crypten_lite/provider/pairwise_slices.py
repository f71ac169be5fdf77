"""How provider pairwise slices one HE matrix product [B, m, k] x [B, k, n] that exceeds its
working-set budget (pairwise.py's _matmul): a tree of halvings along the batch, m, k (the
pieces' products summed) or n, chosen to minimise the bytes the pieces move, as the engine
estimates them (PairwiseProvider._he_matmul_bytes).

Why not a fixed rule: a coefficient encoding's ciphertexts do not add up across pieces. A
piece re-sends whatever operand is encrypted whole in every piece: halving n re-encrypts
the left operand once per piece, halving k returns the outputs once per piece, and smaller
pieces pack fewer values per ciphertext. The old rule (the batch, then the larger output
dimension) cut BERT-base's FFN products ([128, 768] x [768, 3072]) into 64 pieces along n
that moved 3.5x the bytes of the product made whole (4.5 GB each at seq 128).

Both parties compute the same tree from public values (shapes, the budget both announced
in the handshake, the engine's parameters), so they slice alike.
"""

from __future__ import annotations

from typing import Callable

Shape = tuple[int, int, int, int]          # (batch, m, k, n)
DIMS = ("batch", "m", "k", "n")
SEARCH_LIMIT = 4096   # shapes searched exhaustively; past it, each split by one level's look-ahead


def best_split(shape: Shape, cost: Callable[[int, int, int, int], int], budget: int,
               memo: dict) -> tuple[int, int | None]:
    """(bytes of the pieces, the dimension to halve first, or None: make it in one call)
    for a product of `shape`, where cost(b, m, k, n) is one call's bytes. A product within
    the budget is one call; otherwise every halving is tried and
    its two halves planned alike (memoised in `memo`, per budget and cost function, across
    calls). The dimension order (batch, m, k, n) breaks ties. A single output element is
    one call whatever its k (as before: a budget no call fits gives one call per output);
    the old rule's tree is among those searched, so the plan never moves more bytes."""
    shape = tuple(int(d) for d in shape)
    if shape in memo:
        return memo[shape]
    whole = cost(*shape)
    if whole <= budget or max(shape[0], shape[1], shape[3]) == 1:
        memo[shape] = (whole, None)
        return memo[shape]
    exhaustive = len(memo) < SEARCH_LIMIT
    best = None
    for d in range(4):
        if shape[d] < 2:
            continue
        lo, hi = halves(shape, d)
        if exhaustive:
            total = best_split(lo, cost, budget, memo)[0] + best_split(hi, cost, budget, memo)[0]
        else:
            total = cost(*lo) + cost(*hi)
        if best is None or total < best[0]:
            best = (total, d)
    if not exhaustive:                       # the pieces' bytes, by the choice made
        lo, hi = halves(shape, best[1])
        best = (best_split(lo, cost, budget, memo)[0] + best_split(hi, cost, budget, memo)[0], best[1])
    memo[shape] = best
    return best


def halves(shape: Shape, d: int) -> tuple[Shape, Shape]:
    """The two pieces of `shape` halved along dimension d (the first one the smaller)."""
    h = shape[d] // 2
    lo, hi = list(shape), list(shape)
    lo[d], hi[d] = h, shape[d] - h
    return tuple(lo), tuple(hi)


def pieces(shape: Shape, cost: Callable[[int, int, int, int], int], budget: int,
           memo: dict | None = None) -> list[Shape]:
    """The calls' shapes of the plan, in order (for tests and benchmarks)."""
    memo = {} if memo is None else memo
    _, d = best_split(shape, cost, budget, memo)
    if d is None:
        return [tuple(shape)]
    lo, hi = halves(tuple(shape), d)
    return pieces(lo, cost, budget, memo) + pieces(hi, cost, budget, memo)
