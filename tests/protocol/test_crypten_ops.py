"""CrypTen's CrypTensor ops that crypten_lite added (issue 12), against plaintext torch.

Every case runs the same function on torch tensors (float64, torch.autograd) and on
CrypTensors over real gRPC parties (2 and 3), forward and backward with a secret-shared
output gradient; all cases of a table run in ONE party call to keep the suite fast.
Costs of the nonlinear ones (rounds and bytes sent per party) are asserted exactly.

Tolerances: LINEAR as in test_autograd.py (a few truncations); NONLINEAR covers the
approximations of crypten_lite.functions (docs/functions.md) on the domains used here.
"""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

import crypten_lite
from crypten_lite import comm

from _costs import cost  # tests/protocol/_costs.py

LINEAR = dict(atol=1e-3, rtol=1e-3)
NONLINEAR = dict(atol=1e-2, rtol=1e-2)


def randn(*shape, seed=0, scale=1.0):
    gen = torch.Generator().manual_seed(seed)  # test data only
    return torch.randn(*shape, generator=gen) * scale


def positive(*shape, seed=0, low=0.5, high=3.0):
    gen = torch.Generator().manual_seed(seed)  # test data only
    return low + (high - low) * torch.rand(*shape, generator=gen)


def _imatmul(a, b):
    a @= b
    return a


def _pos_pow(a, p):
    if isinstance(a, crypten_lite.CrypTensor):
        return a.pos_pow(p)
    return a ** p


def _polynomial(x, c):
    if isinstance(x, crypten_lite.CrypTensor):
        return x.polynomial(c)
    return sum(c[i] * x ** (i + 1) for i in range(c.shape[0]))


def _take_dim(a):
    idx = torch.tensor([3, 0, 3])
    if isinstance(a, crypten_lite.CrypTensor):
        return a.take(idx, 1)            # CrypTen's take(index, dimension)
    return a[:, idx]


def _cossin(a):
    if isinstance(a, crypten_lite.CrypTensor):
        c, s = a.cossin()
    else:
        c, s = a.cos(), a.sin()
    return c * 2.0 + s


def _dot_weights(a, b):
    w = torch.tensor([0.5, -1.0, 2.0, 0.25])
    if isinstance(a, crypten_lite.CrypTensor):
        return a.dot(b, weights=w)       # CrypTen's weighted dot
    return (a * w * b).sum()


def _conv_t1d(x, w, b):
    return F.conv_transpose1d(x, w, b, stride=1, padding=1, groups=2, dilation=2)


IDX = torch.tensor([[4, 1], [0, 2], [3, 3]])          # scatter: duplicates in a row allowed
IDX_ADD = torch.tensor([[0, 0, 4, 1], [2, 2, 2, 2], [1, 3, 0, 1]])

# key: (function on torch tensors *and* CrypTensors, inputs, private flags or None, tolerance)
CASES = {
    # ---------------------------------------------------------------- linear, 0 rounds
    "scatter": (lambda a, b: a.scatter(1, torch.tensor([[4, 1], [0, 2], [3, 0]]), b),
                [randn(3, 5), randn(3, 2, seed=1)], None, LINEAR),
    "scatter_public_src": (lambda a, b: a.scatter(0, torch.tensor([[1, 0, 2, 1, 0]]), b),
                           [randn(3, 5), randn(1, 5, seed=1)], (True, False), LINEAR),
    "scatter_value": (lambda a: a.scatter(1, IDX, 0.5), [randn(3, 5)], None, LINEAR),
    "scatter_big_src": (lambda a, b: a.scatter(1, torch.tensor([[2], [0], [4]]), b),
                        [randn(3, 5), randn(3, 3, seed=1)], (True, False), LINEAR),
    "scatter_add": (lambda a, b: a.scatter_add(1, IDX_ADD, b), [randn(3, 5), randn(3, 4, seed=1)],
                    None, LINEAR),
    "scatter_add_public_self": (lambda a, b: torch.scatter_add(a, 1, IDX_ADD, b),
                                [randn(3, 5), randn(3, 4, seed=1)], (False, True), LINEAR),
    "index_select": (lambda a: a.index_select(1, torch.tensor([4, 0, 0, 2])), [randn(3, 5)], None,
                     LINEAR),
    "torch_index_select": (lambda a: torch.index_select(a, 0, torch.tensor([2, 2])), [randn(3, 5)],
                           None, LINEAR),
    "index_add": (lambda a, b: a.index_add(1, torch.tensor([0, 2, 0]), b),
                  [randn(3, 5), randn(3, 3, seed=1)], None, LINEAR),
    "index_add_alpha": (lambda a, b: a.index_add(0, torch.tensor([2, 0]), b, alpha=2),
                        [randn(3, 5), randn(2, 5, seed=1)], None, LINEAR),
    "take": (lambda a: torch.take(a, torch.tensor([[0, 14], [7, 7], [-1, 3]])), [randn(3, 5)], None,
             LINEAR),
    "take_dim": (_take_dim, [randn(3, 5)], None, LINEAR),
    "unfold": (lambda a: a.unfold(1, 3, 2), [randn(3, 7)], None, LINEAR),
    "unfold_overlap": (lambda a: a.unfold(0, 2, 1) * 1.0, [randn(4, 2)], None, LINEAR),
    "trace": (lambda a: a.trace(), [randn(4, 5)], None, LINEAR),
    "torch_trace": (lambda a: torch.trace(a), [randn(3, 3)], None, LINEAR),
    "ger": (lambda a, b: a.ger(b), [randn(4), randn(3, seed=1)], None, LINEAR),
    "outer_public": (lambda a, b: torch.outer(a, b), [randn(4), randn(3, seed=1)], (True, False),
                     LINEAR),
    "conv_transpose1d": (lambda x, w: F.conv_transpose1d(x, w, stride=2, padding=1, output_padding=1),
                         [randn(2, 3, 6), randn(3, 2, 3, seed=1)], None, LINEAR),
    "conv_transpose1d_groups_bias": (_conv_t1d, [randn(1, 4, 5), randn(4, 1, 2, seed=1),
                                                 randn(2, seed=2)], None, LINEAR),
    "conv_transpose1d_public_w": (lambda x, w: F.conv_transpose1d(x, w, stride=3),
                                  [randn(1, 2, 4), randn(2, 3, 2, seed=1)], (True, False), LINEAR),
    "in_place": (lambda a, b: (a * 1.0).index_add_(0, torch.tensor([1, 1]), b).scatter_(
        1, torch.tensor([[0], [2], [1]]), 0.25).clamp_(-1.5, 1.5).pow_(2).square_(),
        [randn(3, 4), randn(2, 4, seed=1)], None, NONLINEAR),
    "dot_weights": (_dot_weights, [randn(4), randn(4, seed=1)], None, LINEAR),
    "conv_transpose1d_public_x": (lambda x, w: F.conv_transpose1d(x, w, padding=1),
                                  [randn(1, 2, 4), randn(2, 3, 3, seed=1)], (False, True), LINEAR),
    "imatmul": (_imatmul, [randn(3, 4), randn(4, 2, seed=1)], None, LINEAR),
    "cumsum_0d": (lambda a: a.cumsum(0), [randn(())], None, LINEAR),
    "sum_0d": (lambda a: a.sum(0) + a.sum(-1, keepdim=True) + a.sum(), [randn(())], None, LINEAR),
    "mean_0d": (lambda a: a.mean(0) + a.mean(), [randn(())], None, LINEAR),
    "dropout_eval": (lambda a: F.dropout(a, 0.5, training=False) + F.dropout2d(a, 0.3, False),
                     [randn(2, 3, 2, 2)], None, LINEAR),
    # ----------------------------------------------------------------------- nonlinear
    "prod_dim": (lambda a: a.prod(1), [randn(3, 5)], None, NONLINEAR),
    "prod_all": (lambda a: torch.prod(a), [positive(2, 3)], None, NONLINEAR),
    "prod_keepdim": (lambda a: a.prod(0, keepdim=True), [randn(4, 2)], None, NONLINEAR),
    "prod_0d": (lambda a: a.prod(0) + a.prod(), [randn(())], None, NONLINEAR),
    "var": (lambda a: a.var(1), [randn(3, 5)], None, NONLINEAR),
    "var_biased": (lambda a: a.var(unbiased=False), [randn(3, 5)], None, NONLINEAR),
    "var_dims_keepdim": (lambda a: torch.var(a, dim=(0, 2), keepdim=True), [randn(2, 3, 4)], None,
                         NONLINEAR),
    "var_correction0_0d": (lambda a: a.var(correction=0) + a.var(0, correction=0), [randn(())],
                           None, NONLINEAR),
    "std": (lambda a: a.std(1, keepdim=True), [randn(3, 6)], None, NONLINEAR),
    "torch_std": (lambda a: torch.std(a), [randn(4, 5)], None, NONLINEAR),
    "norm_fro": (lambda a: a.norm(), [randn(3, 4)], None, NONLINEAR),
    "norm_2_dim": (lambda a: torch.norm(a, 2, 1), [randn(3, 4)], None, NONLINEAR),
    "norm_1": (lambda a: a.norm(p=1, dim=0, keepdim=True), [randn(3, 4)], None, NONLINEAR),
    "norm_inf": (lambda a: a.norm(p=float("inf"), dim=1), [randn(3, 4)], None, NONLINEAR),
    "norm_3": (lambda a: a.norm(p=3), [randn(2, 3)], None, NONLINEAR),
    "norm_1_5": (lambda a: a.norm(p=1.5, dim=1), [positive(2, 3)], None, NONLINEAR),
    "vector_norm": (lambda a: torch.linalg.vector_norm(a, dim=0), [randn(4, 3)], None, NONLINEAR),
    "cosine_similarity": (lambda a, b: F.cosine_similarity(a, b), [randn(4, 6), randn(4, 6, seed=1)],
                          None, NONLINEAR),
    "cosine_similarity_dim0_public": (lambda a, b: torch.cosine_similarity(a, b, 0),
                                      [randn(5, 3), randn(5, 3, seed=1)], (True, False), NONLINEAR),
    "pos_pow": (lambda a: _pos_pow(a, 1.5), [positive(3, 4)], None, NONLINEAR),
    "pos_pow_private": (_pos_pow, [positive(3, 4), positive(3, 4, seed=1, low=0.5, high=2.0)], None,
                        NONLINEAR),
    "pos_pow_int": (lambda a: _pos_pow(a, 3.0), [randn(3, 4)], None, NONLINEAR),
    "polynomial_private": (_polynomial, [randn(3, 4), randn(3, seed=1, scale=0.5)], None, NONLINEAR),
    "polynomial_private_linear": (_polynomial, [randn(5), randn(1, seed=1)], None, NONLINEAR),
    "softplus": (lambda a: F.softplus(a), [randn(3, 4, scale=3.0)], None, NONLINEAR),
    "softplus_beta": (lambda a: F.softplus(a, beta=2.0), [randn(3, 4)], None, NONLINEAR),
    "logsigmoid": (lambda a: F.logsigmoid(a), [randn(3, 4, scale=3.0)], None, NONLINEAR),
    "cossin": (_cossin, [randn(3, 4)], None, NONLINEAR),
    "softmax_0d": (lambda a: a.softmax(0) + torch.log_softmax(a, -1), [randn(())], None, NONLINEAR),
    "max_min_0d": (lambda a: a.max(0).values + a.min(-1, keepdim=True)[0] + a.max() + a.amax(0),
                   [randn(())], None, NONLINEAR),
    "norm_0d": (lambda a: a.norm(p=1) + a.norm(p=float("inf")), [randn(())], None, NONLINEAR),
    "bce": (lambda a, y: F.binary_cross_entropy(a, y), [positive(3, 4, low=0.1, high=0.9),
                                                        positive(3, 4, seed=1, low=0.0, high=1.0)],
            (True, False), NONLINEAR),
    "bce_method": (lambda a, y: F.binary_cross_entropy(a, y, reduction="sum")
                   if not isinstance(a, crypten_lite.CrypTensor)
                   else a.binary_cross_entropy(y, reduction="sum"),
                   [positive(5, low=0.1, high=0.9), positive(5, seed=1, low=0.0, high=1.0)], None,
                   NONLINEAR),
    "bce_with_logits": (lambda a, y: F.binary_cross_entropy_with_logits(a, y),
                        [randn(3, 4, scale=2.0), positive(3, 4, seed=1, low=0.0, high=1.0)],
                        (True, False), NONLINEAR),
    "smooth_l1": (lambda a, y: F.smooth_l1_loss(a, y, beta=0.5), [randn(3, 4), randn(3, 4, seed=1)],
                  None, NONLINEAR),
    "huber": (lambda a, y: F.huber_loss(a, y, delta=0.7), [randn(3, 4), randn(3, 4, seed=1)],
              (True, False), NONLINEAR),
    "mse_F": (lambda a, y: F.mse_loss(a, y), [randn(3, 4), randn(3, 4, seed=1)], None, NONLINEAR),
    "sign_zero_grad": (lambda a: a.sign(), [randn(3, 4)], None, LINEAR),
    "floor_zero_grad": (lambda a: torch.floor(a * 3.0), [randn(3, 4)], None, LINEAR),
    # --------------------------------------------------------- gradients at the bounds
    "hardtanh_at_bounds": (lambda a: F.hardtanh(a, -1.0, 1.0),
                           [torch.tensor([-1.0, 1.0, 0.5, 2.0, -3.0, -0.25])], None, LINEAR),
    "clamp_at_bounds": (lambda a: a.clamp(-1.0, 1.0),
                        [torch.tensor([-1.0, 1.0, 0.5, 2.0, -3.0, -0.25])], None, LINEAR),
    "relu6_at_bounds": (lambda a: F.relu6(a), [torch.tensor([0.0, 6.0, 3.0, 7.0, -1.0])], None,
                        LINEAR),
    "clamp_private_min_public_max": (lambda a, lo: torch.clamp(a, lo, torch.tensor(0.5)),
                                     [randn(3, 4), randn(3, 4, seed=1, scale=0.3) - 0.5], None,
                                     LINEAR),
    "clamp_public_min_private_max": (lambda a, hi: torch.clamp(a, torch.tensor(-0.5), hi),
                                     [randn(3, 4), randn(3, 4, seed=1, scale=0.3) + 0.5], None,
                                     LINEAR),
}
T = (__name__, "CASES")


# --------------------------------------------------------------------------- the helper
def party_cases(table, keys, inputs, grad_outs):
    """On every party: run every case forward and backward; reveal outputs and gradients."""
    cases = getattr(importlib.import_module(table[0]), table[1])
    ws = crypten_lite.get_world_size()
    results = {}
    for key in keys:
        fn, _, private, _ = cases[key]
        private = private or (True,) * len(inputs[key])
        xs = [crypten_lite.cryptensor(t, src=i % ws, requires_grad=True) if p else t
              for i, (t, p) in enumerate(zip(inputs[key], private))]
        out = fn(*xs)
        out.backward(crypten_lite.cryptensor(grad_outs[key], src=len(xs) % ws))
        grads = [x.grad.get_plain_text() if p and x.grad is not None else None
                 for x, p in zip(xs, private)]
        results[key] = (out.get_plain_text(), grads)
    return results


_RESULTS: dict[tuple[int, str], dict] = {}


def _reference(key):
    fn, inputs, private, _ = CASES[key]
    private = private or (True,) * len(inputs)
    refs = [t.double().clone().requires_grad_(p) for t, p in zip(inputs, private)]
    out = fn(*refs)
    gen = torch.Generator().manual_seed(7)  # test data only
    grad_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    out.backward(grad_out)
    return out.detach(), [r.grad if p else None for r, p in zip(refs, private)], grad_out


def _results(pool):
    """Every case in one party call per pool (2 and 3 parties additive, 3 parties rss)."""
    pool_key = (pool.world_size, pool.protocol)
    if pool_key not in _RESULTS:
        keys = sorted(CASES)
        inputs = {k: CASES[k][1] for k in keys}
        grads = {k: _reference(k)[2].float() for k in keys}
        _RESULTS[pool_key] = pool.run(party_cases, T, keys, inputs, grads)[0]
    return _RESULTS[pool_key]


@pytest.mark.parametrize("key", sorted(CASES))
def test_op_against_torch(pool_all, key):
    got, grads = _results(pool_all)[key]
    ref, ref_grads, _ = _reference(key)
    tol = CASES[key][3]
    torch.testing.assert_close(got.double(), ref, **tol, msg=lambda m: f"{key} forward: {m}")
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        if r is None:
            continue
        assert g is not None, f"{key}: no gradient for input {i} (torch has {r})"
        torch.testing.assert_close(g.double(), r, **tol, msg=lambda m, i=i: f"{key} grad {i}: {m}")


# ----------------------------------------------------------------------------- costs
def party_costs():
    """(rounds, bytes sent by this party) of each op on (4, 8) inputs, along dim 1."""
    x = crypten_lite.cryptensor(randn(4, 8) + 3.0, src=0)
    y = crypten_lite.cryptensor(randn(4, 8, seed=1), src=1)
    w = randn(4, 2, 3)
    c = crypten_lite.cryptensor(randn(3, seed=2), src=1)
    x.dropout(0.5)  # the parties' common PRG is seeded once per session (one all-gather)
    ops = {
        "scatter": lambda: x.scatter(1, torch.zeros(4, 2, dtype=torch.long), y[:, :2]),
        "scatter_add": lambda: x.scatter_add(1, torch.zeros(4, 8, dtype=torch.long), y),
        "index_select": lambda: x.index_select(1, torch.tensor([1, 1, 0])),
        "index_add": lambda: x.index_add(1, torch.tensor([1, 1, 0]), y[:, :3]),
        "take": lambda: x.take(torch.tensor([0, 31])),
        "unfold": lambda: x.unfold(1, 3, 2),
        "trace": lambda: x.trace(),
        "cumsum": lambda: x.cumsum(1),
        "conv_transpose1d_public_w": lambda: x.unsqueeze(0).conv_transpose1d(w),
        "dropout": lambda: x.dropout(0.3),
        # 32 channels: a mask with every channel dropped (a product by zero, which needs no
        # truncation and so costs nothing) has probability 0.3^32, not the 0.3^4 of (1, 4, 8)
        "dropout2d": lambda: x.reshape(1, 32, 1).dropout2d(0.3),
        "ger": lambda: x[0].ger(y[1]),
        "conv_transpose1d": lambda: x.unsqueeze(0).conv_transpose1d(
            crypten_lite.cryptensor(w, src=1)),
        "prod": lambda: x.prod(1),
        "var": lambda: x.var(1),
        "std": lambda: x.std(1),
        "norm_1": lambda: x.norm(p=1, dim=1),
        "norm_2": lambda: x.norm(dim=1),
        "norm_inf": lambda: x.norm(p=float("inf"), dim=1),
        "cosine_similarity": lambda: x.cosine_similarity(y, 1),
        "polynomial_private": lambda: x.polynomial(c),
        "softplus": lambda: x.softplus(),
    }
    return {k: cost(fn)[1:] for k, fn in ops.items()}


# Public-index ops move shares only: 0 rounds, 0 bytes at any number of parties.
LOCAL_OPS = ("scatter", "scatter_add", "index_select", "index_add", "take", "unfold", "trace",
             "cumsum")
# (rounds, bytes sent by one party) on (4, 8) inputs; docs/functions.md lists the same.
# With 2 parties truncation is local; with 3 each truncation is one dealer-assisted round,
# so a public float product (conv with a public weight, dropout's 1/(1-p)) costs 1 round.
COSTS = {
    2: {"conv_transpose1d_public_w": (0, 0), "dropout": (0, 0), "dropout2d": (0, 0),
        "ger": (1, 128), "conv_transpose1d": (1, 448), "prod": (3, 448), "var": (1, 256),
        "std": (11, 2096), "norm_1": (5, 816), "norm_2": (11, 2096), "norm_inf": (20, 2496),
        "cosine_similarity": (13, 5208), "polynomial_private": (3, 1816), "softplus": (28, 38696)},
    3: {"conv_transpose1d_public_w": (1, 320), "dropout": (1, 512), "dropout2d": (1, 512),
        "ger": (2, 1280), "conv_transpose1d": (2, 1216), "prod": (6, 1344), "var": (4, 1152),
        "std": (22, 7712), "norm_1": (6, 2656), "norm_2": (20, 7584), "norm_inf": (24, 6912),
        "cosine_similarity": (24, 17840), "polynomial_private": (6, 6192),
        "softplus": (42, 143440)},
}
# Under rss (3 parties, no dealer) a truncation with no pair prefetched runs the helper
# truncation (crypten_lite.mpc.rss: 2 rounds with the fused product); bytes sent differ by
# rank (the helper, the call's size mod 3, sends more; so does the party in role 1 of the
# comparison circuits), so the figures are per party: {op: [(rounds, bytes) of party 0, 1, 2]}.
_RSS_BYTES = {
    "conv_transpose1d_public_w": (320, 320, 320), "dropout": (512, 512, 512), "dropout2d": (512, 512, 512),
    "ger": (1024, 2048, 1024), "conv_transpose1d": (320, 592, 640), "prod": (448, 768, 576),
    "var": (640, 640, 1152), "std": (3456, 3224, 3416), "norm_1": (912, 912, 1248),
    "norm_2": (3328, 3096, 3288), "norm_inf": (2656, 2656, 3408), "cosine_similarity": (7352, 7520, 6712),
    "polynomial_private": (4096, 2560, 3584), "softplus": (45168, 56968, 57352)}
_RSS_ROUNDS = {"conv_transpose1d_public_w": 2, "dropout": 2, "dropout2d": 2, "ger": 2,
               "conv_transpose1d": 2, "prod": 6, "var": 6, "std": 28, "norm_1": 6, "norm_2": 24,
               "norm_inf": 24, "cosine_similarity": 28, "polynomial_private": 6, "softplus": 50}
COSTS_RSS = {k: [(_RSS_ROUNDS[k], b) for b in _RSS_BYTES[k]] for k in _RSS_BYTES}


def test_costs(pool_all):
    results = pool_all.run(party_costs)
    for rank, r in enumerate(results):
        for k in LOCAL_OPS:
            assert r[k] == (0, 0), (rank, k, r[k])
    if pool_all.protocol == "rss":
        got = {k: [r[k] for r in results] for k in COSTS_RSS}
        assert got == COSTS_RSS
    else:
        expected = COSTS[pool_all.world_size]
        assert {k: results[0][k] for k in expected} == expected


# ---------------------------------------------------------------------- random and errors
def party_random():
    """rand / bernoulli (secret, fresh each call) and dropout masks (public, shared PRG)."""
    from crypten_lite.functions import rand
    c = comm.get()
    c.reset_communication_stats()
    u = rand(64, 64)
    cost = (c.get_communication_stats()["rounds"], c.get_communication_stats()["bytes_sent"])
    probs = torch.tensor([0.0, 1.0, 0.5, 0.25]).repeat(1024)
    b = torch.bernoulli(crypten_lite.cryptensor(probs)).get_plain_text()
    x = crypten_lite.cryptensor(positive(4, 3, 5, 5))
    # Channel dropout on many channels (100 and 60), so that "some kept, some dropped" below
    # fails with probability 2**-59 at most, not 1/16 (dropout3d of x.unsqueeze(0): 4 channels).
    d2 = F.dropout2d(x.reshape(1, 100, 3, 1), 0.5).get_plain_text().reshape(x.shape)
    d3 = x.reshape(1, 60, 5, 1, 1).dropout3d(0.5).get_plain_text().reshape(x.shape)
    d1 = F.dropout(x, 0.25).get_plain_text()
    y = x.clone()
    y.dropout(0.5, inplace=True)
    weights = crypten_lite.cryptensor(torch.tensor([[1.0, 6.0, 0.0]]).repeat(1024, 1))
    value, onehot = weights.weighted_sample(1)
    return dict(value=value.get_plain_text(), onehot=onehot.get_plain_text(),
                u=u.get_plain_text(), u_dtype=u.dtype, cost=cost, b=b, x=x.get_plain_text(),
                d2=d2, d3=d3, d1=d1, inplace=y.get_plain_text())


def test_random_and_dropout(pool_all):
    pool = pool_all
    r = pool.run(party_random)
    u, b = r[0]["u"], r[0]["b"].reshape(1024, 4)
    assert all(torch.equal(p["u"], u) for p in r)           # one secret value, revealed alike
    assert u.min() >= 0 and u.max() < 1 and r[0]["u_dtype"] == torch.float32
    # 4096 uniform draws: mean 0.5 +- 0.0045 (1 sigma); 0.05 is 11 sigma.
    assert abs(u.mean().item() - 0.5) < 0.05 and u.unique().numel() > 3000
    n = 64 * 64 * 16  # bits converted by B2A
    if pool.protocol == "rss":
        # random bits from the pairwise PRG streams (no traffic), then rss_binary's B2A:
        # 2 rounds, 8 + 1/6 B per bit on average (party 0 sends 2 words more than the others)
        assert [p["cost"] for p in r] == [(2, 535232), (2, 535200), (2, 535200)]
    else:
        assert r[0]["cost"] == (1, (pool.world_size - 1) * n // 8)   # one bit per bit, one round
    assert torch.equal(b[:, 0], torch.zeros(1024)) and torch.equal(b[:, 1], torch.ones(1024))
    assert abs(b[:, 2].mean().item() - 0.5) < 0.08 and abs(b[:, 3].mean().item() - 0.25) < 0.08
    x = r[0]["x"]
    for key, p, scale in (("d2", 0.5, 2.0), ("d3", 0.5, 2.0), ("d1", 0.25, 1 / 0.75)):
        ratio = r[0][key] / (x * scale)
        kept = (ratio - 1).abs() < 1e-2
        assert bool((kept | (r[0][key] == 0)).all()), key   # every element dropped or scaled
        assert 0 < int(kept.sum()) < x.numel(), key
        if key in ("d2", "d3"):  # one draw per channel: a channel is all kept or all dropped
            per_channel = kept.reshape({"d2": 100, "d3": 60}[key], -1)
            assert bool((per_channel.all(-1) | ~per_channel.any(-1)).all()), key
    assert not torch.equal(r[0]["inplace"], x)
    onehot, value = r[0]["onehot"], r[0]["value"]
    assert torch.equal(onehot.sum(1), torch.ones(1024)) and bool((onehot[:, 2] == 0).all())
    assert abs(onehot[:, 1].mean().item() - 6 / 7) < 0.06        # 1024 draws: 6 sigma
    torch.testing.assert_close(value, onehot @ torch.tensor([1.0, 6.0, 0.0]), **LINEAR)


def party_errors():
    from crypten_lite.errors import CryptenLiteError
    x = crypten_lite.cryptensor(randn(3, 4))
    idx = crypten_lite.cryptensor(torch.tensor([[0, 1]]))
    out = {}
    for name, fn in (("gather", lambda: x.gather(1, idx)), ("index_select", lambda: x.index_select(1, idx)),
                     ("take", lambda: x.take(idx)), ("scatter", lambda: x.scatter(1, idx, 1.0)),
                     ("scatter_add", lambda: x.scatter_add(0, idx, x)),
                     ("index_add", lambda: x.index_add(0, idx, x)),
                     ("float_index", lambda: x.index_select(0, torch.tensor([0.0]))),
                     ("var_one", lambda: x[0, 0].var()), ("norm_nuc", lambda: x.norm("nuc")),
                     ("trace_3d", lambda: x.unsqueeze(0).trace()),
                     ("ger_2d", lambda: x.ger(x)), ("softmax_0d_dim", lambda: x[0, 0].softmax(1)),
                     ("poly_2d_coeffs", lambda: x.polynomial(x)),
                     ("in_place_on_leaf", lambda: crypten_lite.cryptensor(
                         torch.ones(2), requires_grad=True).pow_(2))):
        try:
            fn()
            out[name] = None
        except (CryptenLiteError, IndexError) as e:
            out[name] = (type(e).__name__, str(e))
    s = x[1, 2]                                    # 0-d: torch gives index 0, values x
    values, index = s.min(0)
    out["zero_d"] = (s.argmax(0).get_plain_text(), s.argmin().get_plain_text(),
                     index.get_plain_text(), values.get_plain_text(), s.get_plain_text())
    return out


def test_bad_input_errors(pool2):
    r = pool2.run(party_errors)[0]
    argmax, argmin, index, value, s = r.pop("zero_d")
    assert argmax.dim() == argmin.dim() == index.dim() == 0 and int(argmax) == int(index) == 0
    assert int(argmin) == 0 and torch.equal(value, s)
    assert all(v is not None for v in r.values()), r
    for k in ("gather", "index_select", "take", "scatter", "scatter_add", "index_add"):
        assert r[k][0] == "UnsupportedError", (k, r[k])
        assert "private" in r[k][1] or "CrypTensor" in r[k][1], (k, r[k])
    assert r["var_one"][0] == "ProtocolError" and r["softmax_0d_dim"][0] == "IndexError"
    assert r["in_place_on_leaf"][0] == "ProtocolError" and "leaf" in r["in_place_on_leaf"][1]
