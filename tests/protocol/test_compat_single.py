"""init() outside a launch: a session of one party in this process (CrypTen's world size 1),
with the same protocols as N parties, and the CrypTen API a notebook uses in it (crypten.print,
load_from_party of a module, from_pytorch with a torch.empty dummy). Each op against torch.

These run in the test process itself (no party processes): the fixture leaves no session behind.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import crypten_lite
import crypten_lite.compat as crypten
from crypten_lite import session
from crypten_lite.errors import NotInitializedError


@pytest.fixture
def single(monkeypatch):
    for key in [k for k in __import__("os").environ if k.startswith("CRYPTEN_LITE_")]:
        monkeypatch.delenv(key)
    assert not session.is_initialized()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monkeypatch.setattr(session, "_warned_single", False)
        crypten.init()
    yield caught
    crypten.uninit()
    assert not session.is_initialized()


def test_init_outside_a_launch_is_one_party_and_warns_once(single, monkeypatch):
    assert [str(w.message) for w in single if issubclass(w.category, session.SingleProcessWarning)] == \
        [session.SINGLE_PROCESS_WARNING]
    assert "NO privacy" in session.SINGLE_PROCESS_WARNING
    assert crypten.get_world_size() == 1 and crypten.get_rank() == 0
    assert session.current().provider.name == "one-party"
    crypten.uninit()
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        crypten_lite.init()          # the core API too; the warning is not repeated
    assert not [w for w in again if issubclass(w.category, session.SingleProcessWarning)]
    assert crypten_lite.get_world_size() == 1


def test_every_kind_of_protocol_runs_with_one_party(single):
    gen = torch.Generator().manual_seed(1)  # test data only
    a, b = torch.randn(3, 4, generator=gen), torch.randn(3, 4, generator=gen)
    x, y = crypten.cryptensor(a), crypten.cryptensor(b)
    tol = dict(atol=2e-2, rtol=2e-2)
    assert torch.allclose((x * y).get_plain_text(), a * b, **tol)                    # Beaver triple
    assert torch.allclose(x.matmul(y.t()).get_plain_text(), a @ b.t(), **tol)        # matmul triple
    assert torch.equal((x < y).get_plain_text(), (a < b).float())                    # A2B, circuits
    assert torch.allclose(x.relu().get_plain_text(), a.relu(), **tol)
    assert torch.allclose(x.max(dim=1)[0].get_plain_text(), a.max(dim=1)[0], **tol)
    assert torch.allclose(x.softmax(1).get_plain_text(), a.softmax(1), atol=2e-2)
    assert torch.allclose((x / (y.abs() + 1)).get_plain_text(), a / (b.abs() + 1), **tol)
    assert torch.allclose(x.exp().get_plain_text(), a.exp(), atol=5e-2, rtol=2e-2)
    bits = crypten.cryptensor(torch.tensor([5.0, 6.0]), ptype=crypten.mpc.binary)
    assert torch.equal((bits ^ bits).get_plain_text(), torch.zeros(2))
    assert torch.equal(bits.to(crypten.mpc.arithmetic).get_plain_text(), torch.tensor([5.0, 6.0]))
    # one party holds every share: its share is the encoding itself
    assert torch.equal(crypten.cryptensor([1.5]).share, torch.tensor([3 << 15]))


def test_crypten_print_with_one_party(single, capsys):
    crypten.print("a", 1, in_order=True)
    crypten.print("b", dst=0)
    crypten.print("never", dst=1)
    crypten.print("c", dst=[0, 1])
    assert capsys.readouterr().out == "a 1\nb\nc\n"


def test_load_from_party_of_a_module_and_an_empty_dummy(single, tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    torch.save(model, tmp_path / "model.pth")        # a whole module: the owner's own file
    loaded = crypten.load_from_party(tmp_path / "model.pth", src=0)
    assert isinstance(loaded, torch.nn.Sequential) and loaded.src == 0
    data = torch.rand(3, 4)
    for dummy in (torch.full((1, 4), float("nan")), torch.full((1, 4), 3e38), torch.empty(1, 4)):
        private = crypten.nn.from_pytorch(loaded, dummy).encrypt(src=0)
        assert torch.allclose(private(crypten.cryptensor(data)).get_plain_text(), model(data), atol=1e-2)
    with pytest.raises(TypeError, match="neither a tensor nor a torch module"):
        crypten.load_from_party(preloaded={"a": 1}, src=0)
    with pytest.raises(ValueError, match="src must be a rank"):
        crypten.load_from_party(tmp_path / "model.pth", src=1)
    remote = crypten.RemoteModule(0)
    with pytest.raises(TypeError, match="from_pytorch"):
        remote(torch.ones(1))


def test_ops_without_init_say_what_to_do(monkeypatch):
    assert not session.is_initialized()
    with pytest.raises(NotInitializedError, match="session of one party"):
        crypten_lite.cryptensor(torch.ones(2))


# ------------------------------------------------- bugs found running CrypTen's tests
def test_hardtanh_gradient_when_the_bounds_meet(single):
    t = torch.arange(-3, 4, dtype=torch.float32)
    for lo, hi in ((-1, 1), (0, 0), (2, 2), (-3, 3)):
        x = crypten.cryptensor(t, requires_grad=True)
        x.hardtanh(lo, hi).sum().backward()
        ref = t.clone().requires_grad_(True)
        torch.nn.functional.hardtanh(ref, lo, hi).sum().backward()
        assert torch.equal(x.grad.get_plain_text(), ref.grad), (lo, hi)   # 0 at the bounds


def test_cosine_similarity_of_0_dim_tensors(single):
    a = crypten.cryptensor(torch.tensor(2.0), requires_grad=True)
    for other, plain in ((crypten.cryptensor(torch.tensor(-3.0)), -3.0), (torch.tensor(0.5), 0.5)):
        got = a.cosine_similarity(other, dim=0)
        want = torch.nn.functional.cosine_similarity(torch.tensor(2.0), torch.tensor(plain), dim=0)
        assert got.shape == () and abs(got.get_plain_text().item() - want.item()) < 1e-2


def test_rappor_loss_forward_and_backward(single):
    logits, target, alpha = torch.tensor([0.3, -1.2, 2.0]), torch.tensor([1.0, 0.0, 1.0]), 0.3
    x = crypten.cryptensor(logits, requires_grad=True)
    loss = x.rappor_loss(crypten.cryptensor(target), alpha)
    loss.backward()
    ref = logits.clone().requires_grad_(True)
    s = ref.sigmoid()
    expected = torch.nn.functional.binary_cross_entropy(alpha * s + (1 - alpha) * (1 - s), target)
    expected.backward()
    assert abs(loss.get_plain_text().item() - expected.item()) < 2e-2
    assert torch.allclose(x.grad.get_plain_text(), ref.grad, atol=2e-2)


def test_from_pytorch_converts_adaptive_max_pool2d(single):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.pool = torch.nn.AdaptiveMaxPool2d((2, 3))

        def forward(self, x):
            return torch.nn.functional.adaptive_max_pool2d(self.pool(x), 1)

    torch.manual_seed(0)
    data = torch.randn(2, 2, 7, 5)
    private = crypten.nn.from_pytorch(Net(), torch.empty(1, 2, 7, 5)).encrypt()
    assert torch.allclose(private(crypten.cryptensor(data)).get_plain_text(), Net()(data), atol=1e-3)


def test_generators_follow_cryptens_relations_with_one_party(single):
    g = crypten.generators
    assert set(g) == {"prev", "next", "local", "global"}
    assert crypten.generators is g                        # one set per session
    assert g["prev"][torch.device("cpu")].initial_seed() == g["next"][torch.device("cpu")].initial_seed()
    with pytest.raises(ValueError, match="debug mode"):
        crypten.manual_seed(1, 2, 3)
    with crypten.cfg.temp_override({"debug.debug_mode": True}):
        crypten.manual_seed(11, 12, 13)
    assert [g[k][torch.device("cpu")].initial_seed() for k in ("prev", "next", "local", "global")] == \
        [11, 11, 12, 13]


def test_security_settings_are_never_silently_ignored():
    from crypten_lite.errors import UnsupportedError
    cfg = crypten.cfg
    with pytest.raises(UnsupportedError, match="does not verify the dealer's triples"):
        cfg.mpc.active_security = True
    with pytest.raises(UnsupportedError):
        with cfg.temp_override({"mpc.active_security": True}):
            pass
    assert cfg.mpc.active_security is False
    with pytest.raises(ValueError, match="mpc.protocol"):
        cfg.mpc.protocol = "spdz"
    with pytest.raises(ValueError, match="mpc.provider"):
        cfg["mpc.provider"] = "TTP2"
    with cfg.temp_override({"mpc.protocol": "replicated"}):
        assert crypten.config.protocol_name() == "rss"
    cfg.mpc.active_security = False                       # allowed: what crypten_lite does
    assert cfg.mpc.protocol == "beaver" and cfg.mpc.provider == "TTP"


# ---------------------------------------------- CrypTen's ONNX-era modules and nn.Graph
def test_graph_and_onnx_era_modules_follow_cryptens_calling_convention(single):
    torch.manual_seed(0)
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    lin = torch.nn.Linear(4, 4)
    layer = crypten.nn.Linear(4, 4)
    layer.set_parameter("weight", lin.weight)
    layer.set_parameter("bias", lin.bias)
    graph = crypten.nn.Graph(["x1", "x2"], "out")
    graph.add_module("x", crypten.nn.Add(), ["x1", "x2"])
    graph.add_module("lin", layer, ["x"])
    graph.add_module("out", crypten.nn.module.Sub(), ["lin", "x"])   # CrypTen's module path
    graph.encrypt()
    assert all(m.encrypted for m in graph.modules())
    got = graph(crypten.cryptensor(a), crypten.cryptensor(b)).get_plain_text()
    assert torch.allclose(got, lin(a + b) - (a + b), atol=1e-3)

    x = crypten.cryptensor(a)
    checks = {
        "Gemm": (crypten.nn.Gemm(2.0, 1.0), [x, crypten.cryptensor(b.t()), torch.ones(3, 3)],
                 2 * a @ b.t() + 1),
        "Concat": (crypten.nn.Concat.from_onnx({"axis": 1}), [x, x], torch.cat([a, a], 1)),
        "Gather": (crypten.nn.Gather(1), [x, torch.tensor([[3, 0]])], a[:, [3, 0]].reshape(3, 1, 2)),
        "Slice": (crypten.nn.Slice([1], [3]), x, a[1:3]),
        "Transpose": (crypten.nn.Transpose([1, 0]), x, a.t()),
        "Where": (crypten.nn.Where(), [a > 0, x, torch.zeros(3, 4)], a.relu()),
        "Reshape": (crypten.nn.Reshape.from_onnx({"shape": [4, 3]}), x, a.reshape(4, 3)),
        "Mean": (crypten.nn.Mean([0], True), x, a.mean(0, keepdim=True)),
    }
    for name, (module, inputs, want) in checks.items():
        assert torch.allclose(module(inputs).get_plain_text(), want, atol=1e-2), name
    assert torch.equal(crypten.nn.Shape()(x), torch.tensor([3, 4]))
    assert crypten.nn.Shape.SUPPORTS_PLAINTEXT_INPUTS and not crypten.nn.Gemm.SUPPORTS_PLAINTEXT_INPUTS
    with pytest.raises(ValueError, match="public"):
        crypten.nn.Gather(0)([x, crypten.cryptensor(torch.tensor([1.0]))])
    with pytest.raises(ValueError, match="list of 2"):
        crypten.nn.Add()(x)


def test_stateless_batch_normalization(single):
    torch.manual_seed(1)
    data, w, bias = torch.randn(6, 3, 4), torch.rand(3) + 0.5, torch.randn(3)
    rm, rv = torch.randn(3) * 0.1, torch.rand(3) + 0.5
    bn = torch.nn.BatchNorm1d(3)
    with torch.no_grad():
        bn.weight.copy_(w)
        bn.bias.copy_(bias)
        bn.running_mean.copy_(rm)
        bn.running_var.copy_(rv)
    module = crypten.nn.BatchNormalization().encrypt()
    inputs = [crypten.cryptensor(t) for t in (data, w, bias, rm, rv)]
    module.train(False)
    assert torch.allclose(module(inputs).get_plain_text(), bn.eval()(data), atol=2e-2)
    module.train(True)
    out, new_mean, new_var, _, _ = module(inputs)
    expected = bn.train()(data)
    assert torch.allclose(out.get_plain_text(), expected, atol=2e-2)
    assert torch.allclose(new_mean.get_plain_text(), bn.running_mean, atol=1e-2)
    assert torch.allclose(new_var.get_plain_text(), bn.running_var, atol=1e-2)


def test_cryptens_rules_for_encrypted_and_unencrypted_layers(single):
    layer, data = crypten.nn.Linear(4, 2), torch.randn(3, 4)
    with pytest.raises(RuntimeError, match="not encrypted"):
        layer(crypten.cryptensor(data))
    loss = crypten.nn.MSELoss()(layer(data), torch.zeros(3, 2))   # public training, torch grads
    loss.backward()
    before = [p.clone() for p in layer.parameters()]
    layer.update_parameters(0.5)
    assert all(not torch.equal(p, q) for p, q in zip(layer.parameters(), before))
    layer.encrypt()
    with pytest.raises(NotImplementedError, match="public input"):
        layer(data)


class _StepNet(torch.nn.Module):  # Tutorial 5's pattern: `out` rebound layer by layer
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(5, 4)
        self.fc2 = torch.nn.Linear(4, 2)

    def forward(self, x):
        out = self.fc1(x)
        out = torch.nn.functional.relu(out)
        out = self.fc2(out)
        return out


def test_cryptens_onnx_node_names_step_through_a_converted_model(single):
    """model._modules resolves the names CrypTen's ONNX converter gave (fc1.weight, out,
    onnx::Gemm_6, output); each computes on the encrypted parameters; iterating keeps torch's."""
    torch.manual_seed(0)
    net = _StepNet()
    model = crypten.nn.from_pytorch(net, torch.empty(1, 5))
    model.encrypt(src=0)
    assert list(model._modules) == ["fc1", "fc2"]
    x = torch.randn(3, 5)
    w1, b1 = model._modules["fc1.weight"].forward([]), model._modules["fc1.bias"].forward([])
    assert crypten.is_encrypted_tensor(w1)
    out = model._modules["out"].forward([crypten.cryptensor(x), w1, b1])
    out = model._modules["onnx::Gemm_6"].forward(out)
    out = model._modules["output"].forward([out, model._modules["fc2.weight"].forward([]),
                                             model._modules["fc2.bias"].forward([])])
    assert crypten.is_encrypted_tensor(out)
    assert torch.allclose(out.get_plain_text(), net(x).detach(), atol=0.01)
    assert "fc1" in model._modules and "out" not in model._modules  # membership: torch's names
    with pytest.raises(KeyError, match="no_such_node"):
        model._modules["no_such_node"]


def test_a_layer_called_by_forward_and_plain_tensors_in_parameters(single):
    """Tutorial 5: `layer._parameters['weight'] = torch.eye(3) * 5` (a plain tensor) is a
    parameter of the converted layer, and `layer_enc.forward(x)` takes an MPCTensor."""
    layer = torch.nn.Linear(3, 3)
    layer._parameters["weight"] = torch.eye(3) * 5
    layer._parameters["bias"] = torch.zeros(3)
    enc = crypten.nn.from_pytorch(layer, dummy_input=torch.empty((1, 3)))
    assert type(layer._parameters["weight"]) is torch.Tensor  # the user's layer is left alone
    enc.encrypt(src=0)
    assert crypten.is_encrypted_tensor(enc.weight) and crypten.is_encrypted_tensor(enc.bias)
    out = enc.forward(crypten.cryptensor(torch.tensor([[1.0, 2.0, -1.0]])))
    assert crypten.is_encrypted_tensor(out)
    assert torch.allclose(out.get_plain_text(), torch.tensor([[5.0, 10.0, -5.0]]), atol=1e-3)


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("kind", ["mpc", "ptt"])
def test_get_grad_fn_batchnorm_against_torch(single, training, kind):
    from crypten_lite.compat.gradients import AutogradContext
    gen = torch.Generator().manual_seed(2)  # test data only
    x = torch.randn(6, 3, 2, generator=gen)
    weight, bias = torch.rand(3, generator=gen) + 0.5, torch.randn(3, generator=gen)
    rm, rv = x.mean((0, 2)), x.var((0, 2)) + 0.5
    grad = torch.randn(6, 3, 2, generator=gen)
    xt, wt, bt = (t.clone().requires_grad_(True) for t in (x, weight, bias))
    rm_t, rv_t = rm.clone(), rv.clone()
    ref = torch.nn.functional.batch_norm(xt, rm_t, rv_t, wt, bt, training=training)
    ref.backward(grad)
    fn = crypten.gradients.get_grad_fn("batchnorm")
    assert crypten.gradients.get_grad_fn("no_such_function") is None
    enc_rm = crypten.cryptensor(rm, cryptensor_type=kind)
    enc_rv = crypten.cryptensor(rv, cryptensor_type=kind)
    ctx = AutogradContext()
    with crypten.no_grad():
        out = fn.forward(ctx, crypten.cryptensor(x, cryptensor_type=kind), weight, bias,
                         running_mean=enc_rm, running_var=enc_rv, training=training)
        grads = fn.backward(ctx, crypten.cryptensor(grad, cryptensor_type=kind))
    assert torch.allclose(out.get_plain_text(), ref.detach(), atol=0.02)
    for got, want in zip(grads, (xt.grad, wt.grad, bt.grad)):
        assert torch.allclose(got.get_plain_text(), want, atol=0.05), (got.get_plain_text(), want)
    assert torch.allclose(enc_rm.get_plain_text(), rm_t, atol=0.01)  # running statistics as torch's
    assert torch.allclose(enc_rv.get_plain_text(), rv_t, atol=0.01)


def test_onnx_names_of_a_model_torchs_exporter_cannot_trace_are_a_key_error(single):
    class Untraceable(torch.nn.Module):
        def forward(self, x):
            raise RuntimeError("no trace here")

    model = crypten.nn.from_pytorch(torch.nn.Sequential(torch.nn.Linear(2, 2)), torch.empty(1, 2))
    from crypten_lite.compat.nn import onnx_names
    onnx_names.attach(model, Untraceable(), torch.empty(1, 2), None)
    with pytest.raises(KeyError, match="'out'.*could not be computed .RuntimeError: no trace here"):
        model._modules["out"]
    assert isinstance(model._modules["0"], crypten.nn.Linear)  # torch's names as before
