"""The attention softmax of one query row per head (a decode step against its KV cache,
fast.softmax_last): exp(x_j - x_i) of every ordered pair computed beside the max's
comparisons of all pairs at once (fast.exp_pairs), instead of the max (groups of 8, then the
winners) and then exp; same values as torch, exact rounds and bytes (2 parties, dealer)."""

from __future__ import annotations

import torch

import crypten_lite
from crypten_lite.functions.fast import softmax_last
from crypten_lite.nn.transformer_ops import MASK_VALUE

from _costs import cost_pair  # tests/protocol/_costs.py

SCALE = 2 ** 16


def party_decode_softmax():
    g = torch.Generator().manual_seed(7)  # test data only
    s = torch.randn(1, 4, 1, 40, generator=g) * 4        # 4 heads, one query, 40 cached keys
    s[0, 0, 0, :6] = MASK_VALUE                          # empty cache slots (masked): weight 0
    s[0, 1, 0, 3] = s[0, 1, 0, 30] = 9.0                 # a tie for the max
    q = torch.round(s.double() * SCALE) / SCALE
    x = crypten_lite.cryptensor(s, src=1)
    out = {}
    for name, t, ref in (("one_query", x, q), ("rows", x.reshape(4, 40), q.reshape(4, 40))):
        y, out[f"{name}_cost"] = cost_pair(lambda: softmax_last(t))
        out[f"{name}_err"] = (y.get_plain_text().double() - ref.softmax(-1)).abs().max().item()
    out["masked"] = float(softmax_last(x).get_plain_text()[0, 0, 0, :6].abs().max())
    return out


def test_one_query_row_softmax(pool2):
    r = pool2.run(party_decode_softmax)[0]
    assert r["one_query_err"] <= 1e-3 and r["rows_err"] <= 1e-3, r
    assert r["masked"] == 0.0, r
    # the same 4 x 40 values: the one-query layout (exp of every ordered pair beside the max
    # comparisons, fast.exp_pairs) takes 12 rounds instead of 24, for more bytes
    assert r["one_query_cost"] == ONE_QUERY_COST and r["rows_cost"] == ROWS_COST, r
    assert r["one_query_cost"][0] < r["rows_cost"][0]


ONE_QUERY_COST, ROWS_COST = (12, 1_568_264), (24, 19_784)
