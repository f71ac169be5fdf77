"""Provider 'pairwise' (two parties, no dealer: lattice HE and OT between the parties): every
correlation kind the provider layer knows satisfies its relation once both parties' shares
are combined; ops and a small model agree with torch; offline prefetch works; what a party
receives is fresh and uniform; tampered, replayed or malformed offline messages and
mismatched parameters are a ProtocolError on both parties.

Small sizes only: every correlation costs homomorphic encryptions or OTs (docs/protocols.md)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("tenseal")
pytest.importorskip("nacl")

import crypten_lite  # noqa: E402
from crypten_lite.provider import correlations as C  # noqa: E402
from crypten_lite.provider.correlations import TRIPLE_OPS, logical_shift  # noqa: E402

from tests.conftest import get_pool  # noqa: E402


@pytest.fixture(scope="module")
def pw():
    return get_pool(2, provider="pairwise")


CONV2D = (1, 1, 1, 1, 1, 1, 1)          # stride, padding, dilation, groups
CONV2D_G = (2, 1, 0, 1, 1, 2, 2)        # stride (2, 1), padding (0, 1), dilation 1, groups 2
CONV2D_DIRECT = (1, 2, 1, 0, 1, 1, 1)   # stride (1, 2), padding (1, 0): cheaper direct than unfolded
CONV1D = (1, 2, 1, 1)
CONVT = (2, 1, 1, 0, 1, 0, 1, 1, 1)     # stride, padding, output_padding, dilation, groups
REQUESTS = [
    ("triple", "mul", [(3, 4), (3, 4)], ()),
    ("triple", "mul", [(2, 3), (3,)], ()),
    ("triple", "matmul", [(3, 5), (5, 2)], ()),
    ("triple", "matmul", [(2, 3, 4), (4, 2)], ()),
    ("triple", "linear", [(3, 5), (2, 5)], ()),  # a @ b^T: a tied weight's transposed layout
    ("triple", "conv2d", [(2, 2, 5, 5), (3, 2, 3, 3)], CONV2D),
    ("triple", "conv2d", [(1, 4, 5, 4), (4, 2, 2, 3)], CONV2D_G),
    ("triple", "conv2d", [(64, 2, 6, 6), (3, 2, 3, 3)], CONV2D_DIRECT),   # he_conv's direct encoding
    ("triple", "conv1d", [(2, 3, 7), (2, 3, 3)], CONV1D),
    ("triple", "conv_transpose2d", [(1, 2, 3, 3), (2, 3, 3, 3)], CONVT),
    ("square", "", [(5,)], ()),
    ("bit", "", [(6,)], ()),
    ("binary_triple", "", [(4,)], ()),
    ("trunc", "", [(5,)], (16,)),
    ("trunc_exact", "", [(5,)], (12,)),
    ("bit_mul", "", [(3, 1), (3, 2)], ()),
    ("binary_monomials", "", [(3,)], C.monomial_params([-1, 0, 1], [0b011, 0b111, 0b110, 0b001])),
]


def _every_kind():
    from crypten_lite.session import current
    p = current().provider
    out = [[t.clone() for t in p.get(k, s, op, par).corrected()] for k, op, s, par in REQUESTS]
    mask = p.get("weight_mask", [(3, 2)])
    wt = p.get("weight_triple", [(4, 3), (3, 2)], "matmul", (mask_counter := p.counter - 1,))
    out.append([mask[0].clone()] + [t.clone() for t in wt.corrected()])
    return out, p.name, mask_counter >= 0


def _check(kind, op, params, a, b):
    """a, b: the two parties' component lists of one request."""
    s = [x + y for x, y in zip(a, b)]
    x = [u ^ v for u, v in zip(a, b)]
    if kind == "triple":
        assert torch.equal(s[2], TRIPLE_OPS[op](s[0], s[1], params)), op
    elif kind == "square":
        assert torch.equal(s[1], s[0] * s[0])
    elif kind == "bit":
        assert set(x[0].unique().tolist()) <= {0, 1} and torch.equal(s[1], x[0])
    elif kind == "binary_triple":
        assert torch.equal(x[2], x[0] & x[1])
    elif kind == "trunc":
        assert torch.equal(s[1], logical_shift(s[0], params[0]))
        assert torch.equal(s[2], logical_shift(s[0], 63))
    elif kind == "trunc_exact":
        assert torch.equal(x[1], s[0] & ((1 << params[0]) - 1))
        assert torch.equal(s[2], logical_shift(s[0], params[0]))
        assert torch.equal(s[3], logical_shift(s[0], 63))
    elif kind == "bit_mul":
        assert torch.equal(s[2], x[0] & 1) and torch.equal(s[3], s[1] * (x[0] & 1))
    elif kind == "binary_monomials":
        k, owners, subsets = C._split_monomial_params(params)
        masks = [x[j] if o == -1 else (a, b)[o][j] for j, o in enumerate(owners)]
        for i, sub in enumerate(subsets):
            want = None
            for j in range(k):
                if sub >> j & 1:
                    want = masks[j] if want is None else want & masks[j]
            assert torch.equal(x[k + i], want), (i, sub)
    else:
        raise AssertionError(kind)


def test_every_kind_combines_to_its_relation(pw):
    (r0, name0, _), (r1, name1, _) = pw.run(_every_kind)
    assert name0 == name1 == "pairwise"
    for (kind, op, _, params), a, b in zip(REQUESTS, r0[:-1], r1[:-1]):
        _check(kind, op, params, a, b)
    # weight_triple: C = A @ B, B the weight mask's sum
    (m0, a0, c0), (m1, a1, c1) = r0[-1], r1[-1]
    assert torch.equal(c0 + c1, (a0 + a1) @ (m0 + m1))


def _ops():
    g = torch.Generator().manual_seed(3)  # test data only
    a, b = torch.randn(3, 4, generator=g), torch.randn(4, 2, generator=g)
    x, y = crypten_lite.cryptensor(a, src=0), crypten_lite.cryptensor(b, src=1)
    z = crypten_lite.cryptensor(a, src=1)
    return {"mul": ((x * z).get_plain_text() - a * a).abs().max().item(),
            "matmul": ((x @ y).get_plain_text() - a @ b).abs().max().item(),
            "relu": ((x.relu()).get_plain_text() - a.relu()).abs().max().item(),
            "gt": ((x > 0.1).get_plain_text().float() - (a > 0.1).float()).abs().max().item()}


def test_ops_agree_with_torch(pw):
    for errs in pw.run(_ops):
        assert all(e < 1e-2 for e in errs.values()), errs


# ---------------------------------------------------------------- the suite's own programs
from tests.protocol import test_arithmetic as arithmetic  # noqa: E402
from tests.protocol import test_nn as nn_tests  # noqa: E402
from tests.protocol import test_offline as offline_tests  # noqa: E402


@pytest.mark.parametrize("fn", [arithmetic.binary_ops, arithmetic.matmul_ops, arithmetic.conv_ops])
def test_arithmetic_suite_under_pairwise(pw, fn):
    results = pw.run(fn)
    assert results[0] == results[1]
    bad = {k: v for k, v in results[0].items() if not v <= arithmetic.TOL}
    assert not bad, f"ops off from torch by more than {arithmetic.TOL}: {bad}"


def test_online_rounds_and_bytes_are_the_dealers(pw):
    """The same assertions as test_arithmetic's 2-party counts: the provider adds nothing."""
    n, m, k, p = 1000, 8, 16, 4
    r = pw.run(arithmetic.counts, n, m, k, p)[0]
    assert r["mul"]["rounds"] == 1 and r["mul"]["bytes_sent"] == 16 * n
    assert r["matmul"]["rounds"] == 1 and r["matmul"]["bytes_sent"] == 8 * (m * k + k * p)
    assert r["reveal"]["rounds"] == 1 and r["reveal"]["bytes_sent"] == 8 * n


def test_offline_plan_is_made_ahead_and_used(pw):
    for n, used, same, err in pw.run(offline_tests.planned_runs):
        assert n > 0 and used == n   # both parties made every correlation in the offline phase
        assert err <= 1e-3


def test_divergent_run_continues_past_the_prefetched_range(pw):
    results = pw.run(offline_tests.divergent_program)
    for r in results:
        assert r["err"] <= 1e-3 and r["after"]["diverged"] - r["before"]["diverged"] == 1
    assert len({r["after"]["counter"] for r in results}) == 1


@pytest.mark.parametrize("key", ["mlp", "conv2d", "conv_transpose2d"])
def test_layers_train_under_pairwise(pw, key):
    """Forward and backward of encrypted layers (nn tests' own comparison with torch)."""
    nn_tests._compare_layer(pw, key, encrypt=True, train=True)
