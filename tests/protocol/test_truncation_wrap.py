"""Wrap failures of the 2-party local truncation, performed, and where they are ruled out.

Local truncation (mpc/truncation.py) fails catastrophically when the shares of x straddle the
wrap: probability |x| / 2^64 per element. The test below builds such shares on purpose (as an
unlucky draw would) and checks that protocol.truncate_exact, used for LayerNorm's final product
at scale 2^40, is right on them. The audit (benchmarks/truncation_audit.py) measures where a
whole layer's expected failures sit."""

from __future__ import annotations

import importlib.util
import pathlib

import torch

from crypten_lite import comm
from crypten_lite.mpc import protocol
from crypten_lite.session import current

ROOT = pathlib.Path(__file__).resolve().parents[2]
BITS = 24
VALUES = torch.tensor([3 << 40, -(5 << 40), 1 << 52, 7, -(1 << 61)], dtype=torch.int64)


def _straddling_shares(rank: int) -> torch.Tensor:
    """Shares of VALUES whose sum as integers overflows int64: party 1 holds 1 - 2^63 for a
    value x > 0 (then x_0 = x - 1 + 2^63 wraps) and 2^63 - 1 for x < 0."""
    far = torch.where(VALUES > 0, torch.full_like(VALUES, 1 - (1 << 63)), torch.full_like(VALUES, (1 << 63) - 1))
    return far if rank == 1 else VALUES - far


def party_truncations() -> dict:
    share = _straddling_shares(current().rank)
    c = comm.get()
    c.reset_communication_stats()
    exact = protocol.truncate_exact(share, BITS)
    st = c.get_communication_stats()
    local = protocol.truncate(share, BITS)
    both = c.all_gather(torch.stack([exact, local]))
    return {"exact": both[0][0] + both[1][0], "local": both[0][1] + both[1][1],
            "cost": (int(st["rounds"]), int(st["bytes_sent"]))}


def test_straddling_shares_break_local_truncation_not_the_exact_one(pool2):
    r = pool2.run(party_truncations)[0]
    want = VALUES >> BITS
    assert ((r["exact"] - want).abs() <= 1).all(), (r["exact"], want)
    # the local truncation on the same shares is off by about 2^(64 - BITS): the failure
    assert ((r["local"] - want).abs() >= 1 << (62 - BITS)).all(), (r["local"], want)
    # one round: each party opens its masked share to the other, 8 bytes per element
    assert r["cost"] == (1, 8 * VALUES.numel())


def _audit_module():
    spec = importlib.util.spec_from_file_location("truncation_audit", ROOT / "benchmarks" / "truncation_audit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_audit_of_a_transformer_layer():
    """One bert_layer_tiny inference: LayerNorm's final products (2 LayerNorms, 8 x 32) and
    its variances (8 rows each) are truncated exactly, and no local truncation is left at a
    large scale."""
    audit = _audit_module()
    data = audit.audit("bert_layer_tiny")
    assert data["max_error"] <= 1e-2
    layer_norm = sum(n for site, n in data["exact"].items() if "layer_norm_share" in site)
    assert layer_norm == 2 * (8 * 32 + 8), data["exact"]
    # every local truncation is seen, the batched ones too (a step's truncations together)
    assert any("_polys_from_powers" in site for site in data["local"]), sorted(data["local"])
    worst = max(v["max_failure_probability"] for v in data["local"].values())
    assert worst < 2.0 ** -20, sorted(data["local"].items(), key=lambda kv: -kv[1]["max_failure_probability"])[:3]
    total = sum(v["expected_failures"] for v in data["local"].values())
    assert 0 < total < 1e-4
    assert "expected wrap failures per inference" in audit.report(data, 5)


# CRYPTEN_LITE_TRUNCATION=exact between 2 parties: every truncation is the dealer-assisted
# round, and the transformer fast paths (which truncate inside their rounds for free) give way
# to the general ones. One bert_layer_tiny inference: (rounds, bytes sent by each party).
EXACT_BERT_TINY_COST = (87, [209840, 209840])   # local truncation: (51, [120496, 120496])


def test_exact_truncation_runs_a_transformer_layer():
    from crypten_lite.mpc import PartyPool
    from tests.protocol.test_transformer_blocks import party_bert_layer_tiny
    with PartyPool(2, timeout=600, env={"CRYPTEN_LITE_TRUNCATION": "exact"}) as pool:
        r = pool.run(party_bert_layer_tiny)
    assert r[0]["max_error"] <= 1e-2
    assert (r[0]["rounds"], [p["bytes_sent"] for p in r]) == EXACT_BERT_TINY_COST
