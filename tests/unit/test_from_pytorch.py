"""from_pytorch in plaintext: conversion tables, state_dict paths, train/eval, fallbacks, errors.

A converted model with public parameters run on public tensors executes the very torch
functions of its table, so these tests need no parties; private execution of the same
models is checked in tests/protocol/test_nn.py.
"""

from __future__ import annotations

import math
import os
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as TF

import crypten_lite.nn as cnn
from crypten_lite.errors import UnsupportedError

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from resnet_inference import ResNet18, build_model  # noqa: E402


# -------------------------------------------------------------------- torch models
class MLP(nn.Module):
    def __init__(self, n_in=64, hidden=32, n_out=10):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Dropout(0.2),
                                 nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, n_out))

    def forward(self, x):
        return self.net(x.flatten(1))


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = TF.max_pool2d(TF.relu(self.conv1(x)), 2)
        x = TF.avg_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        x = TF.relu(self.fc1(x))
        return self.fc3(TF.relu(self.fc2(x)))


class TransformerBlock(nn.Module):
    """Pre-norm encoder block: multi-head self-attention (softmax) and a GELU MLP."""

    def __init__(self, dim=16, heads=2, hidden=32):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        b, t, d = x.size()
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.heads))
        att = att.softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.drop(self.proj(y))
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class TransformerClassifier(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.block = TransformerBlock(dim)
        self.head = nn.Linear(dim, 4)

    def forward(self, x):
        return self.head(self.block(x).mean(1))


class Attention(nn.Module):
    """torch.nn.MultiheadAttention (batch first, a causal boolean mask) and an einsum attention,
    Hardswish between."""

    def __init__(self, dim=8, length=4):
        super().__init__()
        self.mha = nn.MultiheadAttention(dim, 2, batch_first=True)
        self.register_buffer("causal", torch.triu(torch.ones(length, length, dtype=torch.bool), 1))
        self.qkv = nn.Linear(dim, 3 * dim)
        self.act = nn.Hardswish()
        self.head = nn.Linear(dim, 3)

    def forward(self, x):
        x = x + self.mha(x, x, x, need_weights=False, attn_mask=self.causal)[0]
        q, k, v = self.qkv(self.act(x)).chunk(3, -1)
        att = torch.einsum("bid,bjd->bij", q, k).softmax(-1)
        x = x + torch.einsum("bij,bjd->bid", att, v)
        return self.head(TF.hardsigmoid(x).mean(1))


class ControlFlow(nn.Module):
    """Python control flow on a tensor value: torch.fx cannot trace it, torch.export can."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x):
        if x.shape[0] > 1 and bool(x.numel() > 0):
            x = x * 2
        return TF.relu(self.bn(self.fc(x)))


class Unsupported(nn.Module):
    def forward(self, x):
        return torch.sort(x, dim=1).values


class UnsupportedLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, x):
        return self.emb(x)


def seeded(cls, *args, **kwargs):
    torch.manual_seed(0)  # test models only
    return cls(*args, **kwargs).eval()


MODELS = {
    "mlp": (lambda: seeded(MLP), (3, 64)),
    "lenet": (lambda: seeded(LeNet), (2, 1, 28, 28)),
    "resnet18": (lambda: build_model(width=8), (2, 3, 32, 32)),
    "transformer": (lambda: seeded(TransformerClassifier), (2, 5, 16)),
    "attention": (lambda: seeded(Attention), (2, 4, 8)),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_plaintext_conversion_matches_torch(name):
    make, shape = MODELS[name]
    model = make()
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    converted = cnn.from_pytorch(model, x, fold_batch_norm=False)  # as it is: torch's keys
    assert isinstance(converted, cnn.Module) and converted.source == "fx"
    assert set(converted.state_dict()) == set(model.state_dict())
    assert not converted.encrypted
    folded = cnn.from_pytorch(model, x)  # the default for an eval-mode model: simplified
    with torch.no_grad():
        torch.testing.assert_close(converted(x), model(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(folded(x), model(x), atol=1e-5, rtol=1e-5)


def test_resnet18_standard_width_converts():
    model = ResNet18()
    converted = cnn.from_pytorch(model.eval(), torch.zeros(1, 3, 32, 32), fold_batch_norm=False)
    n = sum(p.numel() for p in converted.parameters())
    assert n == sum(p.numel() for p in model.parameters()) > 11_000_000


def test_batchnorm_and_dropout_follow_train_eval():
    torch.manual_seed(0)  # test model only
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Dropout(0.5)).eval()
    x = torch.randn(8, 4)
    converted = cnn.from_pytorch(model, x, fold_batch_norm=False)  # trainable, as torch's
    converted.train()
    model.train()
    out = converted(x)
    with torch.no_grad():
        ref = model[1](model[0](x))  # batch statistics; updates torch's running stats
    kept = out != 0  # dropout: zeros, or values scaled by 1 / (1 - p) = 2
    torch.testing.assert_close(out[kept], 2 * ref[kept], atol=1e-5, rtol=1e-5)
    assert 0 < kept.float().mean() < 1
    state = converted.state_dict()
    torch.testing.assert_close(state["1.running_mean"], model[1].running_mean)
    torch.testing.assert_close(state["1.running_var"], model[1].running_var)
    converted.eval()
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(converted(x), model(x))


def test_size_arithmetic_and_residuals():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 6)

        def forward(self, x):
            n, c = x.shape
            y = x.view(n * c // 6, -1)
            y = self.fc(y) + y
            y = torch.cat([y, x], 1)
            return TF.softmax(y.reshape(x.size(0), -1), dim=1)

    model = seeded(M)
    x = torch.randn(3, 6)
    torch.testing.assert_close(cnn.from_pytorch(model, x)(x), model(x))


def test_export_fallback_for_control_flow():
    model = seeded(ControlFlow)
    x = torch.randn(5, 4)
    converted = cnn.from_pytorch(model, x)
    assert converted.source == "export"
    assert set(converted.state_dict()) == set(model.state_dict())
    torch.testing.assert_close(converted(x), model(x))


def test_unsupported_function_names_node_target_and_table():
    with pytest.raises(UnsupportedError) as info:
        cnn.from_pytorch(Unsupported(), torch.randn(2, 3))
    message = str(info.value)
    assert "'sort'" in message and "call_function" in message and "torch.sort" in message
    assert "crypten_lite.nn.from_pytorch.FUNCTIONS" in message


def test_unsupported_layer_names_node_target_and_table():
    with pytest.raises(UnsupportedError) as info:
        cnn.from_pytorch(UnsupportedLayer(), torch.zeros(2, dtype=torch.long))
    message = str(info.value)
    assert "'emb'" in message and "torch.nn.modules.sparse.Embedding" in message
    assert "CONVERTERS" in message


def test_tables_cover_the_issue_list():
    for layer in (nn.Linear, nn.Conv2d, nn.BatchNorm2d, nn.LayerNorm, nn.Dropout, nn.GELU,
                  nn.MaxPool2d, nn.AdaptiveAvgPool2d, nn.Flatten):
        assert layer in cnn.CONVERTERS
    for fn in (TF.relu, TF.softmax, TF.max_pool2d, TF.avg_pool2d, torch.cat, torch.flatten):
        assert fn in cnn.FUNCTIONS
    for method in ("view", "reshape", "size", "flatten", "softmax", "transpose"):
        assert method in cnn.METHODS


def test_from_pytorch_detects_quantized_models():
    import warnings

    from crypten_lite.quantized.ir import QuantizedProgram
    from crypten_lite.quantized.testing import quantize_fx
    torch.manual_seed(0)  # test model only
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(2 * 6 * 6, 3)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = quantize_fx(model, torch.rand(8, 1, 8, 8))
        from crypten_lite.nn import from_pytorch
        converted = from_pytorch(q, torch.zeros(1, 1, 8, 8))
    assert isinstance(converted, QuantizedProgram)


class _FloatWithFunctional(nn.Module):
    """A float model prepared for eager quantization (FloatFunctional, stubs) but not converted."""

    def __init__(self):
        super().__init__()
        self.quant = torch.ao.quantization.QuantStub()
        self.fc = nn.Linear(6, 4)
        self.skip = torch.ao.nn.quantized.FloatFunctional()
        self.dequant = torch.ao.quantization.DeQuantStub()

    def forward(self, x):
        x = self.quant(x)
        return self.dequant(self.skip.add(self.fc(x), x[:, :4]))


def test_float_model_with_float_functional_is_not_int8():
    from crypten_lite.nn.from_pytorch import is_quantized
    torch.manual_seed(0)
    model = _FloatWithFunctional().eval()
    assert not is_quantized(model)
    x = torch.randn(3, 6)
    converted = cnn.from_pytorch(model, x)
    assert isinstance(converted, cnn.Module)
    assert torch.allclose(converted(x), model(x), atol=1e-6)


def test_eval_models_are_simplified_for_inference_by_default():
    """Eval mode: Conv/Linear->BatchNorm folded, other BatchNorms a per-channel affine map,
    dropout removed (no normalization left to compute privately); train() is refused."""
    from crypten_lite.nn.layers import FoldedBatchNorm, _BatchNorm
    torch.manual_seed(0)  # test model only
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.BatchNorm2d(4),
                          nn.Dropout(0.3), nn.Flatten(), nn.Linear(4 * 4 * 4, 5), nn.BatchNorm1d(5))
    for bn in (model[1], model[3], model[7]):
        with torch.no_grad():
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.2, 3)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
    model.eval()
    x = torch.randn(2, 3, 6, 6)
    converted = cnn.from_pytorch(model, x)
    kinds = [type(m) for m in converted.modules()]
    assert not any(issubclass(k, _BatchNorm) for k in kinds) and kinds.count(FoldedBatchNorm) == 1
    assert "3.scale" in converted.state_dict() and "1.running_mean" not in converted.state_dict()
    with torch.no_grad():
        torch.testing.assert_close(converted(x), model(x), atol=1e-5, rtol=1e-5)
    with pytest.raises(UnsupportedError, match="fold_batch_norm=False"):
        converted.train()
    kept = cnn.from_pytorch(model, x, fold_batch_norm=False)
    assert sum(issubclass(type(m), _BatchNorm) for m in kept.modules()) == 3
    kept.train()
    with pytest.raises(UnsupportedError, match="eval mode"):
        cnn.from_pytorch(model.train(), x, fold_batch_norm=True)
    assert not any(isinstance(m, FoldedBatchNorm) for m in cnn.from_pytorch(model.train(), x).modules())


def test_public_op_of_a_hostile_description_is_refused_before_allocating():
    """A description may name a public op (arange, full...) with any arguments: an output of
    2^40 elements is refused from its meta shape, before anything is allocated; ordinary
    public ops still run."""
    import torch.fx

    from crypten_lite.errors import UnsupportedError
    from crypten_lite.nn import transformer_ops

    graph = torch.fx.Graph()
    arange = transformer_ops.public_only(graph.call_function(torch.ops.aten.arange.default, (1 << 40,)))
    with pytest.raises(UnsupportedError, match="1,099,511,627,776 elements"):
        arange(1 << 40, dtype=torch.int64, device=torch.device("cpu"))
    full = transformer_ops.public_only(graph.call_function(torch.ops.aten.full.default, ()))
    with pytest.raises(UnsupportedError, match="more than"):
        full([1 << 20, 1 << 20], 0.0)
    assert torch.equal(arange(4, dtype=torch.int64, device=torch.device("cpu")), torch.arange(4))
    eq = transformer_ops.public_only(graph.call_function(torch.ops.aten.eq.Tensor, ()))
    assert eq(torch.arange(3), torch.tensor([0, 1, 5])).tolist() == [True, True, False]


def test_forward_drops_each_value_after_its_last_use():
    """The converted forward keeps an intermediate only until the last node reading it (a
    private model's activations otherwise stayed to the end of the forward: BERT-base seq
    128's peak was about 100 MB higher per party); outputs unchanged."""
    import weakref

    class Chain(nn.Module):
        def forward(self, x):
            y = torch.tanh(x * 2)
            y = torch.sigmoid(y + 1)
            y = torch.tanh(y - x)  # x read again: kept until here
            return torch.sigmoid(y * 3) + 1

    model = Chain()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    converted = cnn.from_pytorch(model, x)
    made: list = []
    most_alive = [0]

    def watch(fn):
        def run(*args, **kwargs):
            alive = sum(ref() is not None for ref in made)
            most_alive[0] = max(most_alive[0], alive)
            out = fn(*args, **kwargs)
            made.append(weakref.ref(out))
            return out
        return run

    impl = converted.__dict__["_impl"]
    assert len(impl) >= 8
    for node in list(impl):
        impl[node] = watch(impl[node])
    with torch.no_grad():
        got = converted(x)
    torch.testing.assert_close(got, model(x))
    # a chain holds its argument only (x is a placeholder, not counted): never the whole chain
    assert most_alive[0] == 1, most_alive[0]
    del got
    assert all(ref() is None for ref in made)


def test_own_mapping_copies_into_a_mapping_of_its_own():
    from crypten_lite.mpc.offline import OWN_MAPPING_BYTES, own_mapping
    big = torch.arange(OWN_MAPPING_BYTES // 8, dtype=torch.int64).view(-1, 256).t()  # not contiguous
    got = own_mapping(big)
    assert torch.equal(got, big) and got.is_contiguous() and got.dtype == torch.int64
    assert got.data_ptr() % 4096 == 0 and got.untyped_storage().data_ptr() != big.untyped_storage().data_ptr()
    got[0, 0] = -1  # writable, and a copy
    assert big[0, 0] == 0
    small = torch.arange(10)
    copy = own_mapping(small)
    assert torch.equal(copy, small) and copy.data_ptr() != small.data_ptr()


def test_trim_heap_growth_trims_on_growth_only(monkeypatch):
    from crypten_lite.errors import ConfigError
    from crypten_lite.mpc import offline
    page = os.sysconf("SC_PAGE_SIZE")
    assert offline._resident_bytes(page) > 0 and offline._resident_bytes(page) % page == 0
    # the resident sizes the trim sees, fed in (the test process's own memory moves with
    # whatever else runs in it): baseline, no growth, +64 MiB, what the trim left, the same
    mib = 1 << 20
    seen = iter([500 * mib, 500 * mib, 564 * mib, 520 * mib, 530 * mib])
    monkeypatch.setattr(offline, "_resident_bytes", lambda page: next(seen))
    calls = []
    monkeypatch.setattr(offline, "_trim_state", {"base": None, "libc": lambda pad: calls.append(pad),
                                                 "page": page, "step": 16 << 20})
    offline.trim_heap_growth()                      # first call: the baseline
    offline.trim_heap_growth()
    assert calls == []                              # no growth: nothing handed back
    offline.trim_heap_growth()
    assert calls == [0]                             # grown by more than the step: one trim
    assert offline._trim_state["base"] == 520 * mib  # the base is what the trim left
    offline.trim_heap_growth()
    assert calls == [0]                             # grown by less than the step: no second trim
    monkeypatch.setenv(offline.HEAP_TRIM_ENV, "0")
    monkeypatch.setattr(offline, "_trim_state", {"base": None, "libc": lambda pad: calls.append(pad),
                                                 "page": 4096, "step": None})
    offline.trim_heap_growth()
    assert offline._trim_state["step"] == 0 and offline._trim_state["base"] is None  # off
    monkeypatch.setenv(offline.HEAP_TRIM_ENV, "lots")
    with pytest.raises(ConfigError, match="CRYPTEN_LITE_HEAP_TRIM_MB='lots'"):
        offline._trim_step()
