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


_RESULTS: dict[int, dict] = {}


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
    if pool.world_size not in _RESULTS:
        keys = sorted(CASES)
        inputs = {k: CASES[k][1] for k in keys}
        grads = {k: _reference(k)[2].float() for k in keys}
        _RESULTS[pool.world_size] = pool.run(party_cases, T, keys, inputs, grads)[0]
    return _RESULTS[pool.world_size]


@pytest.mark.parametrize("key", sorted(CASES))
def test_op_against_torch(pool, key):
    got, grads = _results(pool)[key]
    ref, ref_grads, _ = _reference(key)
    tol = CASES[key][3]
    torch.testing.assert_close(got.double(), ref, **tol, msg=lambda m: f"{key} forward: {m}")
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        if r is None:
            continue
        assert g is not None, f"{key}: no gradient for input {i} (torch has {r})"
        torch.testing.assert_close(g.double(), r, **tol, msg=lambda m, i=i: f"{key} grad {i}: {m}")
