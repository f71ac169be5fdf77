"""Every gradient rule against torch.autograd, with 2 and 3 parties over gRPC on loopback.

One helper, `check`, runs the same function in torch (float64, autograd) and in
crypten_lite (inputs secret-shared by different parties, `backward` with a secret-shared
output gradient) and compares the output and every input gradient.

Tolerances (16 fractional bits, so one ulp is 2^-16 = 1.5e-5): each truncation errs by at
most one ulp (2 parties: plus a failure probability below 2^-30 per element for these
magnitudes); a sum over k truncated products errs by k ulps. `LINEAR` (atol 1e-3) covers
fan-ins up to ~60 with margin; measured worst case over the cases below: 1.1e-4.
Nonlinear ops use polynomial/iterative approximations whose own error tables live with
crypten_lite.functions (docs/functions.md); `NONLINEAR` (5e-3 absolute + relative) bounds
approximation plus the extra products of the backward formula on the input domains below
(|x| <= 4, positive inputs for log/sqrt/reciprocal); measured worst case: 1.0e-3 (gelu,
whose backward differentiates the forward's erf approximation), most ops below 1e-4.
"""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

import crypten_lite
import crypten_lite.autograd  # noqa: F401  (installs CrypTensor.backward)
from crypten_lite.mpc import PartyPool

LINEAR = dict(atol=1e-3, rtol=1e-3)
NONLINEAR = dict(atol=5e-3, rtol=5e-3)


# --------------------------------------------------------------------------- the helper
def party_forward_backward(table: tuple[str, str], key: str, inputs, private, grad_out):
    """On every party: share the private inputs, run, backward, reveal output and grads."""
    module, name = table
    fn = getattr(importlib.import_module(module), name)[key]
    ws = crypten_lite.get_world_size()
    xs = [crypten_lite.cryptensor(t, src=i % ws, requires_grad=True) if p else t
          for i, (t, p) in enumerate(zip(inputs, private))]
    out = fn(*xs)
    out.backward(crypten_lite.cryptensor(grad_out, src=len(xs) % ws))
    grads = []
    for x, p in zip(xs, private):
        grads.append(x.grad.get_plain_text() if p and x.grad is not None else None)
    return out.get_plain_text(), grads


def check(pool: PartyPool, table: tuple[str, str], key: str, *inputs: torch.Tensor,
          private: tuple[bool, ...] | None = None, tol: dict | None = None,
          seed: int = 0) -> None:
    """Compare table[key](*inputs) and its input gradients in crypten_lite and torch."""
    tol = tol or LINEAR
    private = private if private is not None else (True,) * len(inputs)
    fn = getattr(importlib.import_module(table[0]), table[1])[key]
    refs = [t.double().clone().requires_grad_(p and t.is_floating_point())
            for t, p in zip(inputs, private)]
    out = fn(*refs)
    gen = torch.Generator().manual_seed(seed)  # test data only
    grad_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    out.backward(grad_out)
    got, grads = pool.run(party_forward_backward, table, key, list(inputs), private,
                          grad_out.float())[0]
    torch.testing.assert_close(got.double(), out.detach(), **tol, msg=lambda m: f"{key} forward: {m}")
    for i, (ref, g, p) in enumerate(zip(refs, grads, private)):
        if not p:
            continue
        expected = ref.grad if ref.grad is not None else torch.zeros_like(ref)
        if g is None:
            g = torch.zeros_like(expected)
        torch.testing.assert_close(g.double(), expected, **tol,
                                   msg=lambda m, i=i: f"{key} grad of input {i}: {m}")


def randn(*shape, seed=0, scale=1.0):
    gen = torch.Generator().manual_seed(seed)  # test data only
    return torch.randn(*shape, generator=gen) * scale


def positive(*shape, seed=0, low=0.5, high=4.0):
    gen = torch.Generator().manual_seed(seed)  # test data only
    return low + (high - low) * torch.rand(*shape, generator=gen)


# ------------------------------------------------------------------------ the cases
# key: (function on torch tensors *and* CrypTensors, inputs, private flags, tolerance)
OPS = {
    "add": lambda a, b: a + b,
    "add_broadcast": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "rsub_public": lambda a: 1.5 - a,
    "neg": lambda a: -a,
    "mul": lambda a, b: a * b,
    "mul_broadcast": lambda a, b: a * b,
    "square": lambda a: a.square(),
    "div_scalar": lambda a: a / 3.0,
    "div_tensor": lambda a, b: a / b,
    "matmul": lambda a, b: a @ b,
    "matmul_public_left": lambda a, b: a @ b,
    "matmul_batched": lambda a, b: torch.matmul(a, b),
    "matmul_vec": lambda a, b: torch.matmul(a, b),
    "vec_matmul": lambda a, b: torch.matmul(a, b),
    "dot": lambda a, b: torch.matmul(a, b),
    "conv1d": lambda x, w: F.conv1d(x, w, stride=2, padding=1, dilation=1),
    "conv1d_groups": lambda x, w: F.conv1d(x, w, padding=2, dilation=2, groups=2),
    "conv2d": lambda x, w: F.conv2d(x, w, stride=1, padding=1),
    "conv2d_strided": lambda x, w: F.conv2d(x, w, stride=2, padding=1),
    "conv2d_groups": lambda x, w: F.conv2d(x, w, stride=(1, 2), padding=(0, 1), dilation=2, groups=2),
    "conv2d_bias": lambda x, w, b: F.conv2d(x, w, b, padding=1),
    "conv_transpose2d": lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1),
    "conv_transpose2d_groups": lambda x, w: _conv_transpose2d_groups(x, w),
    "sum": lambda a: a.sum(),
    "sum_dim": lambda a: a.sum(1),
    "sum_dims_keepdim": lambda a: a.sum((0, 2), keepdim=True),
    "mean": lambda a: a.mean(),
    "mean_dim": lambda a: a.mean(-1, keepdim=True),
    "cumsum": lambda a: a.cumsum(1),
    "reshape": lambda a: a.reshape(4, 6),
    "view_flatten": lambda a: a.flatten(1) * 1.0,
    "transpose": lambda a: a.transpose(0, 2),
    "t": lambda a: a.t(),
    "permute": lambda a: a.permute(2, 0, 1),
    "squeeze_unsqueeze": lambda a: a.unsqueeze(1).squeeze(),
    "expand": lambda a: a.expand(3, 4, 5),
    "repeat": lambda a: a.repeat(2, 1, 3),
    "narrow": lambda a: a.narrow(1, 1, 2),
    "getitem": lambda a: a[1:, ::2],
    "getitem_int_none": lambda a: a[0, None, ..., 1],
    "getitem_tensor_dups": lambda a: a[torch.tensor([0, 2, 0])],
    "getitem_mask": lambda a: a[torch.tensor([[True, False, True, False]] * 3)],
    "gather": lambda a: a.gather(1, torch.tensor([[0, 0, 3], [1, 2, 1], [3, 3, 3]])),
    "pad": lambda a: F.pad(a, (1, 2, 0, 1)),
    "pad_value": lambda a: F.pad(a, (1, 1), value=0.5),
    "pad_crop": lambda a: F.pad(a, (-1, 2)),
    "pad_reflect": lambda a: F.pad(a, (2, 1), mode="reflect"),
    "pad_replicate": lambda a: F.pad(a, (1, 2, 2, 1), mode="replicate"),
    "roll": lambda a: torch.roll(a, (1, -2), (0, 1)),
    "flip": lambda a: torch.flip(a, (0, 1)),
    "cat": lambda a, b: torch.cat([a, b], 1),
    "stack": lambda a, b: torch.stack([a, b], 0),
    "split": lambda a: torch.split(a, 2, 1)[1] * 2.0,
    "chunk_unbind": lambda a: a.chunk(2, 0)[0] + a.unbind(0)[2],
    "clone": lambda a: a.clone(),
    "shared_subexpression": lambda a, b: (a * b + a) * a + (a * b).sum(),
    "reuse_input_in_matmul": lambda a: a @ a.t(),
    "align_to": lambda a: _align(a),
}
T = (__name__, "OPS")


def _align(a):
    """Named-tensor alignment (crypten_lite implements PyTorch 1.3's names; torch permutes)."""
    if not isinstance(a, crypten_lite.CrypTensor):
        return a.permute(2, 0, 1).unsqueeze(1) * 1.0
    # Name the leaf in place: rename/refine_names do not record autograd nodes (reported).
    a._names = ("n", "c", "w")
    out = a.align_to("w", "h", "n", "c")
    a._names, out._names = None, None
    return out * 1.0


def _conv_transpose2d_groups(x, w):
    """Grouped, dilated transposed convolution; on CrypTensors the forward is built from the
    Beaver op (params in TRIPLE_OPS order) so that the test checks the gradient rule alone."""
    if not isinstance(x, crypten_lite.CrypTensor):
        return F.conv_transpose2d(x, w, stride=2, padding=1, groups=2, dilation=2)
    out = x._bilinear("conv_transpose2d", w, (2, 2, 1, 1, 0, 0, 2, 2, 2))
    return crypten_lite.autograd.record(out, "conv_transpose2d", (x, w), stride=2, padding=1,
                                        output_padding=0, groups=2, dilation=2)

CASES = {
    "add": [randn(3, 4), randn(3, 4, seed=1)],
    "add_broadcast": [randn(2, 3, 4), randn(3, 1, seed=1)],
    "sub": [randn(3, 4), randn(4, seed=1)],
    "rsub_public": [randn(3, 4)],
    "neg": [randn(5)],
    "mul": [randn(3, 4), randn(3, 4, seed=1)],
    "mul_broadcast": [randn(3, 4), randn(4, seed=1)],
    "square": [randn(3, 4)],
    "div_scalar": [randn(3, 4)],
    "div_tensor": ([randn(3, 4), positive(4)], (True, False)),
    "matmul": [randn(3, 4), randn(4, 5, seed=1)],
    "matmul_public_left": ([randn(3, 4), randn(4, 5, seed=1)], (False, True)),
    "matmul_batched": [randn(2, 3, 4), randn(4, 2, seed=1)],
    "matmul_vec": [randn(3, 4), randn(4, seed=1)],
    "vec_matmul": [randn(4), randn(2, 4, 3, seed=1)],
    "dot": [randn(6), randn(6, seed=1)],
    "conv1d": [randn(2, 3, 9), randn(4, 3, 3, seed=1)],
    "conv1d_groups": [randn(2, 4, 9), randn(4, 2, 3, seed=1)],
    "conv2d": [randn(2, 3, 6, 6), randn(4, 3, 3, 3, seed=1)],
    "conv2d_strided": [randn(1, 2, 7, 7), randn(3, 2, 3, 3, seed=1)],
    "conv2d_groups": [randn(2, 4, 8, 7), randn(6, 2, 2, 3, seed=1)],
    "conv2d_bias": [randn(1, 2, 5, 5), randn(3, 2, 3, 3, seed=1), randn(3, seed=2)],
    "conv_transpose2d": [randn(1, 3, 4, 4), randn(3, 2, 3, 3, seed=1)],
    "conv_transpose2d_groups": [randn(2, 4, 3, 3), randn(4, 3, 2, 2, seed=1)],
    "sum": [randn(3, 4)],
    "sum_dim": [randn(3, 4, 2)],
    "sum_dims_keepdim": [randn(3, 4, 2)],
    "mean": [randn(3, 4)],
    "mean_dim": [randn(3, 4)],
    "cumsum": [randn(3, 4)],
    "reshape": [randn(2, 3, 4)],
    "view_flatten": [randn(2, 3, 4)],
    "transpose": [randn(2, 3, 4)],
    "t": [randn(3, 4)],
    "permute": [randn(2, 3, 4)],
    "squeeze_unsqueeze": [randn(3, 1, 4)],
    "expand": [randn(4, 1)],
    "repeat": [randn(3, 2)],
    "narrow": [randn(3, 4)],
    "getitem": [randn(3, 4)],
    "getitem_int_none": [randn(2, 3, 4)],
    "getitem_tensor_dups": [randn(3, 4)],
    "getitem_mask": [randn(3, 4)],
    "gather": [randn(3, 4)],
    "pad": [randn(2, 3, 4)],
    "pad_value": [randn(3, 4)],
    "pad_crop": [randn(3, 4)],
    "pad_reflect": [randn(1, 2, 5)],
    "pad_replicate": [randn(1, 2, 3, 4)],
    "roll": [randn(3, 4)],
    "flip": [randn(3, 4)],
    "cat": [randn(3, 2), randn(3, 4, seed=1)],
    "stack": [randn(3, 2), randn(3, 2, seed=1)],
    "split": [randn(3, 5)],
    "chunk_unbind": [randn(4, 3)],
    "clone": [randn(3)],
    "shared_subexpression": [randn(3, 4), randn(3, 4, seed=1)],
    "reuse_input_in_matmul": [randn(3, 4)],
    "align_to": [randn(2, 3, 4)],
}


@pytest.mark.parametrize("key", sorted(CASES))
def test_linear_rule(pool_all, key):
    """Additive at 2 and 3 parties, and replicated sharing at 3 parties (no dealer)."""
    case = CASES[key]
    inputs, private = case if isinstance(case, tuple) else (case, None)
    check(pool_all, T, key, *inputs, private=private)


def test_every_linear_op_has_a_case():
    assert set(OPS) == set(CASES)


# ------------------------------------------------------------------ nonlinear rules
# key: (function, inputs, private flags or None, CrypTensor methods needed, tolerance)
NONLINEAR_OPS = {
    "relu": lambda a: F.relu(a),
    "abs": lambda a: a.abs(),
    "clamp": lambda a: a.clamp(-0.5, 0.8),
    "relu6": lambda a: F.relu6(a * 4.0),
    "hardtanh": lambda a: F.hardtanh(a),
    "maximum": lambda a, b: torch.maximum(a, b),
    "minimum_public": lambda a, b: torch.minimum(a, b),
    "max_all": lambda a: a.max(),
    "max_dim": lambda a: a.max(dim=1).values,
    "min_dim_keepdim": lambda a: a.min(1, keepdim=True).values,
    "where_public": lambda a, b: torch.where(torch.tensor([[True, False, True, False]] * 3), a, b),
    "where_private": lambda a, b: torch.where(a > 0, a, b),
    "max_pool2d": lambda a: F.max_pool2d(a, 2),
    "max_pool2d_pad": lambda a: F.max_pool2d(a, 3, 2, 1),
    "max_pool1d": lambda a: F.max_pool1d(a, 2),
    "adaptive_max_pool2d": lambda a: F.adaptive_max_pool2d(a, (2, 2)),
    "avg_pool2d": lambda a: F.avg_pool2d(a, 2),
    "avg_pool2d_ceil": lambda a: F.avg_pool2d(a, 3, 2, 1, ceil_mode=True, count_include_pad=False),
    "avg_pool2d_divisor": lambda a: F.avg_pool2d(a, (2, 3), (1, 2), divisor_override=4),
    "adaptive_avg_pool2d": lambda a: F.adaptive_avg_pool2d(a, (2, 3)),
    "exp": lambda a: torch.exp(a),
    "log": lambda a: torch.log(a),
    "reciprocal": lambda a: torch.reciprocal(a),
    "div_private": lambda a, b: a / b,
    "sqrt": lambda a: torch.sqrt(a),
    "inv_sqrt": lambda a: torch.rsqrt(a),
    "sigmoid": lambda a: torch.sigmoid(a),
    "tanh": lambda a: torch.tanh(a),
    "erf": lambda a: torch.erf(a),
    "gelu": lambda a: F.gelu(a),
    "gelu_tanh": lambda a: F.gelu(a, approximate="tanh"),
    "silu": lambda a: F.silu(a),
    "softmax": lambda a: torch.softmax(a, 1),
    "log_softmax": lambda a: torch.log_softmax(a, 0),
    "cos": lambda a: torch.cos(a),
    "sin": lambda a: torch.sin(a),
    "pow3": lambda a: a.pow(3),
    "pow_half": lambda a: a.pow(0.5),
    "floor_ceil": lambda a: torch.floor(a) + torch.ceil(a) * 0.5 + a,
    "amax": lambda a: torch.amax(a, dim=(0, 2)),
    "clamp_min": lambda a: torch.clamp_min(a, 0.1),
    "layer_norm": lambda a, w, b: F.layer_norm(a, (4,), w, b),
    "rms_norm": lambda a, w: F.rms_norm(a, (4,), w, 1e-6),
    "batch_norm_train": lambda a, w, b: F.batch_norm(a, None, None, w, b, training=True),
    "batch_norm_eval": lambda a, m, v, w, b: F.batch_norm(a, m, v, w, b, training=False),
}
T_NONLINEAR = (__name__, "NONLINEAR_OPS")

NONLINEAR_CASES = {
    "relu": ([randn(3, 4)], None, ("relu",)),
    "abs": ([randn(3, 4)], None, ("abs",)),
    "clamp": ([randn(3, 4)], None, ("clamp",)),
    "relu6": ([randn(3, 4)], None, ("relu6",)),
    "hardtanh": ([randn(3, 4)], None, ("hardtanh",)),
    "maximum": ([randn(3, 4), randn(3, 4, seed=1)], None, ("maximum",)),
    "minimum_public": ([randn(3, 4), randn(3, 4, seed=1)], (True, False), ("minimum",)),
    "max_all": ([randn(3, 4)], None, ("max",)),
    "max_dim": ([randn(3, 4)], None, ("max",)),
    "min_dim_keepdim": ([randn(3, 4)], None, ("min",)),
    "where_public": ([randn(3, 4), randn(3, 4, seed=1)], None, ("where",)),
    "where_private": ([randn(3, 4), randn(3, 4, seed=1)], None, ("where", "gt")),
    "max_pool2d": ([randn(2, 2, 4, 4)], None, ("max_pool2d",)),
    "max_pool2d_pad": ([randn(1, 2, 5, 5)], None, ("max_pool2d",)),
    "max_pool1d": ([randn(2, 3, 6)], None, ("max_pool1d",)),
    "adaptive_max_pool2d": ([randn(1, 2, 5, 4)], None, ("adaptive_max_pool2d",)),
    "avg_pool2d": ([randn(2, 2, 4, 4)], None, ("avg_pool2d",)),
    "avg_pool2d_ceil": ([randn(1, 2, 6, 5)], None, ("avg_pool2d",)),
    "avg_pool2d_divisor": ([randn(1, 2, 4, 7)], None, ("avg_pool2d",)),
    "adaptive_avg_pool2d": ([randn(1, 2, 5, 7)], None, ("adaptive_avg_pool2d",)),
    "exp": ([randn(3, 4)], None, ("exp",)),
    "log": ([positive(3, 4)], None, ("log",)),
    "reciprocal": ([positive(3, 4)], None, ("reciprocal",)),
    "div_private": ([randn(3, 4), positive(3, 4, seed=1)], None, ("reciprocal",)),
    "sqrt": ([positive(3, 4)], None, ("sqrt",)),
    "inv_sqrt": ([positive(3, 4)], None, ("inv_sqrt",)),
    "sigmoid": ([randn(3, 4, scale=2.0)], None, ("sigmoid",)),
    "tanh": ([randn(3, 4)], None, ("tanh",)),
    "erf": ([randn(3, 4)], None, ("erf",)),
    "gelu": ([randn(3, 4, scale=2.0)], None, ("gelu",)),
    "gelu_tanh": ([randn(3, 4, scale=2.0)], None, ("gelu",)),
    "silu": ([randn(3, 4, scale=2.0)], None, ("silu",)),
    "softmax": ([randn(3, 5, scale=2.0)], None, ("softmax",)),
    "log_softmax": ([randn(4, 3, scale=2.0)], None, ("log_softmax",)),
    "cos": ([randn(3, 4)], None, ("cos",)),
    "sin": ([randn(3, 4)], None, ("sin",)),
    "pow3": ([randn(3, 4)], None, ("pow",)),
    "pow_half": ([positive(3, 4)], None, ("pow",)),
    "floor_ceil": ([randn(3, 4, scale=3.0)], None, ("floor", "ceil")),
    "amax": ([randn(3, 4, 2)], None, ("amax",)),
    "clamp_min": ([randn(3, 4)], None, ("clamp_min",)),
    "layer_norm": ([randn(3, 4), positive(4), randn(4, seed=2)], None, ("layer_norm",)),
    "rms_norm": ([randn(3, 4), positive(4)], None, ("rms_norm",)),
    "batch_norm_train": ([randn(6, 3, 2), positive(3), randn(3, seed=2)], None, ("batch_norm",)),
    "batch_norm_eval": ([randn(6, 3), randn(3, seed=1), positive(3, seed=2), positive(3, seed=3),
                         randn(3, seed=4)], (True, False, False, True, True), ("batch_norm",)),
}


def _needs(*methods: str) -> None:
    crypten_lite._load_extensions()
    missing = [m for m in methods if not hasattr(crypten_lite.CrypTensor, m)]
    if missing:
        pytest.skip(f"CrypTensor.{', CrypTensor.'.join(missing)} not implemented yet "
                    "(crypten_lite.functions)")


@pytest.mark.parametrize("key", sorted(NONLINEAR_CASES))
def test_nonlinear_rule(pool_all, key):
    """Additive at 2 and 3 parties, and replicated sharing at 3 parties (no dealer)."""
    inputs, private, methods = NONLINEAR_CASES[key]
    _needs(*methods)
    check(pool_all, T_NONLINEAR, key, *inputs, private=private, tol=NONLINEAR)


def test_every_nonlinear_op_has_a_case():
    assert set(NONLINEAR_OPS) == set(NONLINEAR_CASES)


# ----------------------------------------------------------------------- engine semantics
def party_engine_semantics():
    from crypten_lite.errors import CryptenLiteError
    x = crypten_lite.cryptensor(torch.tensor([1.0, -2.0, 3.0]), src=0, requires_grad=True)
    c = crypten_lite.cryptensor(torch.tensor([0.5, 0.5, 0.5]), src=1)  # requires_grad=False
    (x * 2.0 + c).sum().backward()
    first = x.grad.get_plain_text()
    (x * c).sum().backward()                                  # accumulates
    accumulated = x.grad.get_plain_text()
    x.grad = None
    y = x * x
    y.backward(torch.tensor([1.0, 1.0, 2.0]))                 # public seed gradient
    public_seed = x.grad.get_plain_text()
    with crypten_lite.no_grad():
        z = x * 3.0
        with crypten_lite.enable_grad():
            w = x * 3.0
    with torch.no_grad():                                     # torch's own switch, as for torch tensors
        t = x * 3.0
        with crypten_lite.enable_grad():
            u = x * 3.0
    with torch.inference_mode():
        v = x * 3.0
    d = x.detach() * 3.0
    errors = []
    for bad in (lambda: (x * 2.0).backward(), lambda: d.sum().backward()):
        try:
            bad()
        except CryptenLiteError as e:
            errors.append(type(e).__name__)
    return dict(first=first, accumulated=accumulated, public_seed=public_seed, c_grad=c.grad,
                no_grad=(z.requires_grad, z.grad_fn), enable_grad=w.requires_grad,
                torch_no_grad=(t.requires_grad, t.grad_fn, u.requires_grad, v.requires_grad),
                detach=d.requires_grad, errors=errors)


def test_engine_semantics(pool_all):
    pool = pool_all  # 2 and 3 parties additive, 3 parties rss
    r = pool.run(party_engine_semantics)[0]
    torch.testing.assert_close(r["first"], torch.full((3,), 2.0))
    torch.testing.assert_close(r["accumulated"], torch.full((3,), 2.5))
    torch.testing.assert_close(r["public_seed"], torch.tensor([2.0, -4.0, 12.0]), **LINEAR)
    assert r["c_grad"] is None
    assert r["no_grad"] == (False, None) and r["enable_grad"] and not r["detach"]
    assert r["torch_no_grad"] == (False, None, True, False)
    assert r["errors"] == ["UnsupportedError", "ProtocolError"]
