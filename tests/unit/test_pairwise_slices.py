"""How provider pairwise slices an HE matrix product over its working-set budget
(crypten_lite/provider/pairwise_slices.py, PairwiseProvider._matmul): the pieces tile the
product, each fits the budget, the plan moves no more bytes than the old fixed rule (batch,
then the larger output dimension) and fewer where that rule re-sent an operand, and the
pieces recombine (concatenated, or summed along k) to the exact product mod 2^64."""

from __future__ import annotations

import math
import types

import numpy as np
import pytest

from crypten_lite.provider import pairwise_slices as S


def _lhs_encrypted(b, m, k, n):
    """A coefficient encoding's shape of cost: the left operand sent, the outputs returned,
    the right operand a plaintext (not sent), plus a fixed cost per call."""
    return b * (m * k + m * n) + 64


def _old_rule(shape, cost, budget):
    """The fixed rule the search replaced: the batch, then the larger output dimension."""
    b, m, k, n = shape
    if max(b, m, n) == 1 or cost(*shape) <= budget:
        return [shape]
    d = 0 if b > 1 else (3 if n >= m else 1)
    lo, hi = S.halves(shape, d)
    return _old_rule(lo, cost, budget) + _old_rule(hi, cost, budget)


@pytest.mark.parametrize("shape,budget", [((1, 8, 16, 64), 600), ((3, 5, 7, 9), 100), ((1, 1, 40, 3), 50),
                                          ((2, 6, 4, 6), 1)])
def test_pieces_tile_the_product_and_fit(shape, budget):
    got = S.pieces(shape, _lhs_encrypted, budget)
    b, m, k, n = shape
    assert sum(math.prod(p) for p in got) == b * m * k * n
    for p in got:
        assert _lhs_encrypted(*p) <= budget or p[0] == p[1] == p[3] == 1, p
    total = sum(_lhs_encrypted(*p) for p in got)
    old = sum(_lhs_encrypted(*p) for p in _old_rule(shape, _lhs_encrypted, budget))
    assert total == S.best_split(shape, _lhs_encrypted, budget, {})[0]
    assert total <= old, (total, old)


def test_search_avoids_resending_the_encrypted_operand():
    # [8, 16] x [16, 64]: halving n (the old rule: the larger output dimension) re-sends
    # the encrypted left operand with every piece; halving m does not
    shape, budget = (1, 8, 16, 64), 400
    old = _old_rule(shape, _lhs_encrypted, budget)
    new = S.pieces(shape, _lhs_encrypted, budget)
    assert all(p[3] == 64 for p in new), new          # never cut along n
    assert sum(_lhs_encrypted(*p) for p in new) < sum(_lhs_encrypted(*p) for p in old)


def test_within_budget_is_one_call():
    assert S.pieces((2, 3, 4, 5), _lhs_encrypted, 10 ** 9) == [(2, 3, 4, 5)]
    assert S.best_split((2, 3, 4, 5), _lhs_encrypted, 10 ** 9, {})[1] is None


def test_past_the_search_limit_it_still_plans(monkeypatch):
    monkeypatch.setattr(S, "SEARCH_LIMIT", 3)
    got = S.pieces((4, 16, 16, 16), _lhs_encrypted, 300)
    assert sum(math.prod(p) for p in got) == 4 * 16 ** 3
    assert all(_lhs_encrypted(*p) <= 300 for p in got)


def test_sliced_matmul_recombines_exactly():
    """PairwiseProvider._matmul over a stand-in engine (a plain product mod 2^64, which
    records each call's bound): the pieces' results, concatenated or summed along k, are
    the whole product, and each piece's bound covers its own k."""
    from crypten_lite.provider.pairwise import PairwiseProvider, _log2
    calls = []

    def engine_matmul(lhs, rhs, bound_bits):
        calls.append((lhs.shape, rhs.shape, bound_bits))
        assert bound_bits >= 129 + _log2(lhs.shape[2])
        with np.errstate(over="ignore"):
            return np.einsum("bmk,bkn->bmn", lhs, rhs, dtype=np.uint64)

    def both_encrypted(b, m, k, n, bits):      # a joint encoding's shape: halving k is cheapest
        return b * (m * k + k * n) + m * n + 64

    fake = types.SimpleNamespace(_chunk=300, _engine=types.SimpleNamespace(matmul=engine_matmul),
                                 _he_matmul_bytes=both_encrypted)
    fake._matmul_pieces = types.MethodType(PairwiseProvider._matmul_pieces, fake)
    rng = np.random.default_rng(5)  # insecure-ok: test data, not shares
    lhs = rng.integers(0, 2 ** 63, size=(3, 9, 20), dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    rhs = rng.integers(0, 2 ** 63, size=(3, 20, 11), dtype=np.uint64) * np.uint64(3)
    got = PairwiseProvider._matmul(fake, lhs, rhs, 129 + _log2(20))
    with np.errstate(over="ignore"):
        want = np.einsum("bmk,bkn->bmn", lhs, rhs, dtype=np.uint64)
    assert got.dtype == np.uint64 and np.array_equal(got, want)
    assert len(calls) > 1                                  # it was sliced
    assert any(c[0][2] < 20 for c in calls)                # k among the cuts (sums checked above)


def test_docs_quote_the_bert_breakdown():
    """docs/protocols.md's BERT-base breakdown table is the one benchmarks/pairwise_tables.py
    renders from docs/pairwise_bert_breakdown.jsonl (pairwise_breakdown.py's lines)."""
    import pathlib
    import sys
    root = pathlib.Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "benchmarks"))
    try:
        import pairwise_tables
    finally:
        sys.path.pop(0)
    table = pairwise_tables.bert_breakdown_table()
    assert "bert_layer_h768_a12_f3072_s32" in table and "weight_triple/matmul" in table
    assert table in (root / "docs" / "protocols.md").read_text()
