"""Transformer blocks at literature cost levels (crypten_lite.functions.fast) and fixed model
weights masked once (crypten_lite.mpc.fixed), between real parties with the dealer.

Every result is checked against torch (float64 on the fixed-point inputs); rounds and bytes
are exact. The attacks on the fixed-weight correlations (a weight_triple naming a counter
that is not a weight mask of that weight) are performed against the real dealer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import crypten_lite
from crypten_lite import comm

from _costs import cost_pair  # tests/protocol/_costs.py

SCALE = 2 ** 16


def _q(t: torch.Tensor) -> torch.Tensor:
    return torch.round(t.double() * SCALE) / SCALE


# ------------------------------------------------------------------ party functions
def party_fast_functions():
    g = torch.Generator().manual_seed(3)
    a = torch.randn(4, 64, generator=g) * 3           # 256 elements, both tails included
    a[0, :4] = torch.tensor([-40.0, -4.0, 4.0, 40.0])
    x = crypten_lite.cryptensor(a, src=0)
    q = _q(a)
    out = {}
    y, out["gelu_cost"] = cost_pair(lambda: x.gelu())
    out["gelu_err"] = (y.get_plain_text().double() - F.gelu(q)).abs().max().item()
    y, out["gelu_tanh_cost"] = cost_pair(lambda: x.gelu("tanh"))
    out["gelu_tanh_err"] = (y.get_plain_text().double() - F.gelu(q, approximate="tanh")).abs().max().item()
    y, out["silu_cost"] = cost_pair(lambda: x.silu())
    out["silu_err"] = (y.get_plain_text().double() - F.silu(q)).abs().max().item()
    s = torch.randn(6, 40, generator=g) * 4           # 40 columns: grouped all-pairs max
    s[0, 5] = -1e4                                    # a masked score: weight 0
    xs = crypten_lite.cryptensor(s, src=1)
    y, out["softmax_cost"] = cost_pair(lambda: xs.softmax(-1))
    out["softmax_err"] = (y.get_plain_text().double() - _q(s).softmax(-1)).abs().max().item()
    out["masked_weight"] = y.get_plain_text()[0, 5].item()
    h = torch.randn(3, 16, generator=g) * 2 + 1
    w = torch.rand(16, generator=g) + 0.5
    xh = crypten_lite.cryptensor(h, src=0)
    y, out["rms_norm_cost"] = cost_pair(lambda: F.rms_norm(xh, (16,), w, 1e-6))
    out["rms_norm_err"] = (y.get_plain_text().double()
                           - F.rms_norm(_q(h), (16,), w.double(), 1e-6)).abs().max().item()
    # attention scores over a sequence (rows of 64: softmax_rows_share under every protocol)
    from crypten_lite.functions.fast import softmax_last
    sc = torch.randn(2, 3, 64, generator=g) * 3
    sc[1, 2, 7] = -500.0                              # a masked score: weight 0
    xa = crypten_lite.cryptensor(sc, src=1)
    y, out["attention_softmax_cost"] = cost_pair(lambda: softmax_last(xa))
    out["attention_softmax_err"] = (y.get_plain_text().double() - _q(sc).softmax(-1)).abs().max().item()
    out["attention_masked_weight"] = y.get_plain_text()[1, 2, 7].item()
    return out


def party_fixed_weights():
    from crypten_lite import nn
    c = comm.get()
    torch.manual_seed(0)  # test model, not cryptographic
    lin = torch.nn.Linear(16, 8)
    conv = torch.nn.Conv2d(2, 3, 3)
    model = nn.from_pytorch(torch.nn.Sequential(lin), torch.zeros(1, 16))
    model.encrypt(src=0)
    model.eval()
    cmodel = nn.from_pytorch(torch.nn.Sequential(conv), torch.zeros(1, 2, 5, 5))
    cmodel.encrypt(src=0)
    g = torch.Generator().manual_seed(4)
    out = {"costs": [], "errs": []}
    for _ in range(3):
        t = torch.randn(4, 16, generator=g)
        x = crypten_lite.cryptensor(t if c.rank == 1 else None, src=1)
        y, cost = cost_pair(lambda: model(x))
        out["costs"].append(cost)
        out["errs"].append((y.get_plain_text() - lin(t)).abs().max().item())
    # A changed weight (in place, as an optimizer or load_state_dict would) gets a new mask.
    weight = [p for p in model.parameters() if p.dim() == 2][0]
    with crypten_lite.no_grad():
        weight._inplace(weight.add(1.0))
    lin.weight.data += 1.0
    t = torch.randn(4, 16, generator=g)
    x = crypten_lite.cryptensor(t if c.rank == 1 else None, src=1)
    y, out["after_update"] = cost_pair(lambda: model(x))
    out["errs"].append((y.get_plain_text() - lin(t)).abs().max().item())
    img = torch.randn(1, 2, 5, 5, generator=g)
    xi = crypten_lite.cryptensor(img, src=1)
    out["conv_costs"] = []
    for _ in range(2):
        y, cost = cost_pair(lambda: cmodel(xi))
        out["conv_costs"].append(cost)
        out["errs"].append((y.get_plain_text() - conv(img)).abs().max().item())
    return out


def party_forged_weight_triples():
    """Rank 0 asks the dealer for weight_triples naming masks it never drew: refused."""
    from crypten_lite.errors import CommunicationError
    from crypten_lite.session import current
    provider = current().provider
    provider.get("weight_mask", [(16, 8)]).corrected()   # answered before any reference
    mask = provider.counter - 1
    provider.get("triple", [(4, 16), (16, 8)], "matmul")
    plain = provider.counter - 1
    attempts = {"unknown counter": (mask + 1000, (16, 8)), "a triple's counter": (plain, (16, 8)),
                "another shape": (mask, (16, 4))}
    out = {}
    for name, (counter, shape) in attempts.items():
        corr = provider.get("weight_triple", [(4, 16), shape], "matmul", (counter,))
        if current().rank != 0:
            continue
        try:
            corr.corrected()
            out[name] = "answered"
        except CommunicationError as e:
            out[name] = str(e)
    if current().rank == 0:  # the genuine one is answered
        corr = provider.get("weight_triple", [(4, 16), (16, 8)], "matmul", (mask,))
        corr.corrected()
    else:
        provider.get("weight_triple", [(4, 16), (16, 8)], "matmul", (mask,))
    return out


def party_bert_layer_tiny():
    from crypten_lite import bench
    return bench.WORKLOADS["bert_layer_tiny"]()


# ---------------------------------------------------------------------------- tests
def test_fast_functions_accuracy_and_costs(pool2):
    r = pool2.run(party_fast_functions)[0]
    # 256 elements: 1 + 3 + 3 (32-bit MSB) + 1 rounds; softmax [6, 40]: 40 -> 5 (groups of 8) -> 1
    _check_fast_functions(r, (GELU_COST, SOFTMAX_COST, RMS_NORM_COST, ATTENTION_SOFTMAX_COST))
    assert r["gelu_tanh_cost"] == GELU_COST
    assert r["silu_cost"] == SILU_COST


def test_fixed_weights_open_w_minus_b_once(pool2):
    r = pool2.run(party_fixed_weights)[0]
    assert max(r["errs"]) <= 1e-3, r["errs"]
    first, second, third = r["costs"]
    # first call: x - A (4 x 16) and W^T - B (16 x 8); later calls: x - A only
    assert first == (1, 8 * (4 * 16 + 16 * 8)) and second == third == (1, 8 * 4 * 16)
    assert r["after_update"] == first                # a changed weight: a new mask, opened once
    conv_first, conv_second = r["conv_costs"]
    assert conv_first == (1, 8 * (2 * 25 + 3 * 2 * 9)) and conv_second == (1, 8 * 2 * 25)


def test_dealer_refuses_forged_weight_triples(pool2):
    r = pool2.run(party_forged_weight_triples)[0]
    assert set(r) == {"unknown counter", "a triple's counter", "another shape"}
    for name, msg in r.items():
        assert "did not answer as a weight_mask" in msg, (name, msg)


def test_bert_layer_tiny_costs(pool2):
    r = pool2.run(party_bert_layer_tiny)
    assert r[0]["max_error"] <= 1e-2
    assert (r[0]["rounds"], [p["bytes_sent"] for p in r]) == BERT_TINY_COST
    assert r[0]["dealer_bytes"] + r[0]["offline_dealer_bytes"] == BERT_TINY_DEALER


def test_large_bench_workloads_are_opt_in():
    from crypten_lite import bench
    assert "bert_base_layer_seq128" in bench.LARGE <= set(bench.WORKLOADS)
    assert not bench.LARGE & set(bench.default_workloads())
    assert bench.LARGE <= set(bench.default_workloads(large=True))
    assert "bert_layer_tiny" in bench.default_workloads()


# (rounds, bytes sent by one party) between 2 parties
GELU_COST = (8, 20544)           # 256 elements: 80.25 bytes each (narrow tail comparisons)
SILU_COST = (8, 39200)           # two segments: 153.1 bytes each
SOFTMAX_COST = (30, 36968)       # [6, 40]: 11 (max) + 8 (exp) + 10 (1/sum per row) + 1
RMS_NORM_COST = (8, 5792)        # [3, 16]: the 8-round path of layer_norm, per row
ATTENTION_SOFTMAX_COST = (25, 46184)  # [2, 3, 64]: softmax_last (row max, exp, 1/sum, product)
# One encoder layer (hidden 32, 2 heads, FFN 64, seq 8), weights masked at load time:
# per inference, rounds and bytes sent by each party; dealer bytes (online + offline).
BERT_TINY_COST = (51, [120496, 120496])
BERT_TINY_DEALER = 144896


# The same functions and layer between 3 parties (additive, dealer): the fast paths with every
# truncation a dealer-assisted round shared by its step, the narrow comparisons one bit
# shorter in shift (functions/fast.py, "Any number of additive parties").
GELU_COST_3 = (16, 82048)       # 256 elements: 320.5 bytes each
SOFTMAX_COST_3 = (47, 140368)    # [6, 40]
RMS_NORM_COST_3 = (12, 20624)    # [3, 16]
ATTENTION_SOFTMAX_COST_3 = (38, 175792)  # [2, 3, 64]
BERT_TINY_COST_3 = (90, [443744, 443744, 443744])


def _check_fast_functions(first: dict, costs: tuple) -> None:
    """The accuracy bounds of party_fast_functions' results and their exact costs."""
    assert first["gelu_err"] <= 1e-3 and first["gelu_tanh_err"] <= 1e-3, first
    assert first["silu_err"] <= 2e-3, first
    assert first["softmax_err"] <= 1e-3 and first["masked_weight"] == 0.0, first
    assert first["rms_norm_err"] <= 5e-3, first
    assert first["attention_softmax_err"] <= 1e-3 and first["attention_masked_weight"] == 0.0, first
    assert (first["gelu_cost"], first["softmax_cost"], first["rms_norm_cost"],
            first["attention_softmax_cost"]) == costs


def test_fast_functions_three_parties(pool3):
    r = pool3.run(party_fast_functions)
    _check_fast_functions(r[0], (GELU_COST_3, SOFTMAX_COST_3, RMS_NORM_COST_3, ATTENTION_SOFTMAX_COST_3))


def test_bert_layer_tiny_three_parties(pool3):
    r = pool3.run(party_bert_layer_tiny)
    assert r[0]["max_error"] <= 1e-2
    assert (r[0]["rounds"], [p["bytes_sent"] for p in r]) == BERT_TINY_COST_3


# The same under rss (3 parties, no dealer), online after the offline phase (the truncation
# pairs and random bits made ahead, as the bench does): GELU and SiLU take the fast
# piecewise polynomials (short and narrow comparisons, the truncations of a step in one
# round) and so do LayerNorm and RMSNorm (their octave polynomials riding in the comparison
# circuit's rounds, a product and its truncation one round); softmax keeps rss's own form for
# rows shorter than 64 (fewer bytes and less work) and takes the fast form for longer ones.
GELU_COST_RSS = (12, 35904)      # 256 elements (general path before: 14 rounds, 49,728 B)
SOFTMAX_COST_RSS = (33, 109520)  # [6, 40]: all 780 pairs of a row in one comparison level
RMS_NORM_COST_RSS = (10, 9160)   # [3, 16]: octave polynomials riding in the comparisons (18 rounds before)
ATTENTION_SOFTMAX_COST_RSS = (35, 60568)  # [2, 3, 64]: the fast form, its polynomials riding
BERT_TINY_COST_RSS = (73, [197088, 192224, 201584])  # 91 before LayerNorm's polynomials rode in its comparisons


def party_fast_functions_prefetched():
    from crypten_lite.mpc import offline
    with offline.record() as plan:
        party_fast_functions()
    offline.prefetch(plan)
    return party_fast_functions()


def party_bert_layer_tiny_twice():
    party_bert_layer_tiny()          # records the plan
    return party_bert_layer_tiny()   # offline: the plan's pairs; then online


def test_fast_functions_rss(pool3_rss):
    r = pool3_rss.run(party_fast_functions_prefetched)
    _check_fast_functions(r[0], (GELU_COST_RSS, SOFTMAX_COST_RSS, RMS_NORM_COST_RSS, ATTENTION_SOFTMAX_COST_RSS))


def test_bert_layer_tiny_rss(pool3_rss):
    r = pool3_rss.run(party_bert_layer_tiny_twice)
    assert r[0]["max_error"] <= 1e-2
    assert all(p["dealer_bytes"] == 0 for p in r)
    assert (r[0]["rounds"], [p["bytes_sent"] for p in r]) == BERT_TINY_COST_RSS


def party_small_rows_norms():
    """LayerNorm and RMSNorm of rows of std 0.05 (a small LLaMA's hidden states): the 1/sqrt
    of a small variance must keep its relative precision (rss's general path was off by 1e-2)."""
    g = torch.Generator().manual_seed(5)
    h = torch.randn(16, 256, generator=g) * 0.05 + 0.01
    w = torch.rand(256, generator=g) + 0.5
    b = torch.randn(256, generator=g) * 0.1
    x = crypten_lite.cryptensor(h, src=0)
    q = _q(h)
    rms = F.rms_norm(x, (256,), w, 1e-6).get_plain_text().double()
    ln = F.layer_norm(x, (256,), w, b, 1e-5).get_plain_text().double()
    return {"rms_err": (rms - F.rms_norm(q, (256,), w.double(), 1e-6)).abs().max().item(),
            "ln_err": (ln - F.layer_norm(q, (256,), w.double(), b.double(), 1e-5)).abs().max().item()}


def test_norms_of_small_rows_stay_accurate(pool_all):
    r = pool_all.run(party_small_rows_norms)[0]
    assert r["rms_err"] <= 2e-3 and r["ln_err"] <= 2e-3, r


def party_weights_in_own_mappings():
    from crypten_lite import nn
    from crypten_lite.mpc.offline import OWN_MAPPING_BYTES
    c = comm.get()
    torch.manual_seed(0)  # test model, not cryptographic
    lin = torch.nn.Linear(512, 256)                   # 1 MiB of int64 shares: its own mapping
    model = nn.from_pytorch(torch.nn.Sequential(lin), torch.zeros(1, 512))
    model.encrypt(src=0)
    model.eval()
    weight, bias = sorted(model.parameters(), key=lambda p: -p.dim())
    t = torch.randn(2, 512, generator=torch.Generator().manual_seed(5))
    x = crypten_lite.cryptensor(t if c.rank == 1 else None, src=1)
    out = {"errs": [], "costs": []}
    for _ in range(2):
        y, cost = cost_pair(lambda: model(x))
        out["costs"].append(cost)
        out["errs"].append((y.get_plain_text() - lin(t)).abs().max().item())
    masks = [m for m in weight.__dict__["_fixed_masks"].values() if m.d is not None]
    d = masks[0].d
    out["masks"] = len(masks)
    out["weight_bytes"] = weight.share.numel() * 8
    # page-aligned: a mapping of its own (malloc's blocks, mapped or not, start past a header)
    out["weight_mapped"] = weight.share.data_ptr() % 4096 == 0
    out["d_mapped"] = d.data_ptr() % 4096 == 0 and d.numel() == weight.share.numel()
    out["bias_small"] = bias.share.numel() * 8 < OWN_MAPPING_BYTES
    return out


def test_large_weights_and_masks_live_in_their_own_mappings(pool2):
    """A large weight's share and its mask's D are kept in mappings of their own, off the heap
    the operations' temporaries reuse (offline.own_mapping); results and costs unchanged."""
    for r in pool2.run(party_weights_in_own_mappings):
        assert max(r["errs"]) <= 1e-3, r["errs"]
        first, second = r["costs"]
        assert first == (1, 8 * (2 * 512 + 512 * 256)) and second == (1, 8 * 2 * 512)
        assert r["weight_bytes"] == 1 << 20 and r["weight_mapped"] and r["d_mapped"] and r["masks"] == 1
        assert r["bias_small"]
