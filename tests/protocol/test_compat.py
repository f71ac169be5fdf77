"""crypten_lite.compat (CrypTen 0.4's API) over real gRPC parties: every public name once.

Each check compares with plaintext torch. Tolerances: 16-bit fixed point, 1e-3 for linear
ops; comparisons, one-hot indices and ptype round trips are exact.
"""

from __future__ import annotations

import io
import os
import tempfile

import pytest
import torch

import crypten_lite.compat as crypten
import crypten_lite.compat.communicator as comm
from crypten_lite.compat import mpc

TOL = dict(atol=1e-3, rtol=1e-3)


def _data(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)  # test data only, same at every party
    return torch.randn(3, 4, generator=gen), torch.randn(3, 4, generator=gen)


# ------------------------------------------------------------------------------ tensors
def tensor_api():
    crypten.init()  # no-op inside a party that already joined (CrypTen scripts call it)
    a, b = _data()
    x = crypten.cryptensor(a)
    y = mpc.MPCTensor(b, src=1)
    out = {
        "types": (type(x).__name__, isinstance(y, crypten.CrypTensor), crypten.is_encrypted_tensor(a)),
        "add": (x + y).get_plain_text(), "sub": (2 - x).get_plain_text(),
        "mul": (x * y).get_plain_text(), "matmul": x.matmul(y.t()).get_plain_text(),
        "div": (x / 4).get_plain_text(), "relu": x.relu().get_plain_text(),
        "lt": (x < y).get_plain_text(), "ge_public": x.ge(b).get_plain_text(),
        "ger": x[0].ger(y[1]).get_plain_text(),
        "where": crypten.where(a > 0, x, y).get_plain_text(),
        "cat": crypten.cat([x, y], dim=1).get_plain_text(),
        "torch_cat": torch.cat([x, y]).get_plain_text(),
        "stack": crypten.stack([x, y]).get_plain_text(),
        "int_input": crypten.cryptensor(torch.tensor([1, -2, 3])).get_plain_text(),
        "dst": x.get_plain_text(dst=1),
        "shape": (tuple(x.size()), x.dim(), x.nelement(), len(x)),
    }
    m, idx = x.max(dim=1)
    out["max"], out["max_onehot"] = m.get_plain_text(), idx.get_plain_text()
    out["argmax"] = x.argmax(dim=0).get_plain_text()
    out["argmax_index"] = x.argmax(dim=0, one_hot=False).get_plain_text()
    z = x.clone()
    z.add_(y)
    out["inplace"] = z.get_plain_text()
    return out


def test_tensor_api_follows_cryptens_semantics(pool2):
    a, b = _data()
    r0, r1 = pool2.run(tensor_api)
    assert r0["types"] == ("MPCTensor", True, False)
    for key, ref in [("add", a + b), ("sub", 2 - a), ("mul", a * b), ("matmul", a @ b.t()),
                     ("div", a / 4), ("relu", a.relu()), ("ger", torch.outer(a[0], b[1])),
                     ("where", torch.where(a > 0, a, b)), ("cat", torch.cat([a, b], 1)),
                     ("torch_cat", torch.cat([a, b])), ("stack", torch.stack([a, b])),
                     ("max", a.max(1).values), ("inplace", a + b)]:
        assert torch.allclose(r0[key], ref, **TOL), key
    # comparisons are float 0/1 tensors (CrypTen), integers come back as floats
    assert r0["lt"].dtype == torch.float32 and torch.equal(r0["lt"], (a < b).float())
    assert torch.equal(r0["ge_public"], (a >= b).float())
    assert torch.equal(r0["int_input"], torch.tensor([1.0, -2.0, 3.0]))
    # max / argmax indices in one-hot form by default
    assert torch.equal(r0["max_onehot"], torch.nn.functional.one_hot(a.argmax(1), 4).float())
    assert torch.equal(r0["argmax"], torch.nn.functional.one_hot(a.argmax(0), 3).t().float())
    assert torch.equal(r0["argmax_index"], a.argmax(0).float())
    assert r0["dst"] is None and torch.allclose(r1["dst"], a, **TOL)
    assert r0["shape"] == ((3, 4), 2, 12, 3)


def ptypes():
    a = torch.tensor([[1.5, -2.25, 3.0], [0.0, 7.0, -0.5]])
    x = crypten.cryptensor(a)
    b = x.to(mpc.binary)
    c = mpc.MPCTensor(a, ptype=mpc.binary)
    mask = crypten.cryptensor(torch.ones(2, 3)).to(mpc.binary)
    return {
        "ptypes": (x.ptype, b.ptype, c.ptype, b.to(mpc.arithmetic).ptype),
        "binary_reveal": b.get_plain_text(), "created_binary": c.get_plain_text(),
        "back": b.to(mpc.arithmetic).get_plain_text(),
        "xor_self": (b ^ c).get_plain_text(),
        "and_words": (b & mask).share.shape,
        "and_open": (b & mask).get_plain_text(),
        "after_binary_ops": (b.to(mpc.arithmetic) * 2).get_plain_text(),
    }


def test_ptype_conversions_round_trip(pool2):
    a = torch.tensor([[1.5, -2.25, 3.0], [0.0, 7.0, -0.5]])
    r0, _ = pool2.run(ptypes)
    assert r0["ptypes"] == (mpc.arithmetic, mpc.binary, mpc.binary, mpc.arithmetic)
    for key in ("binary_reveal", "created_binary", "back"):
        assert torch.equal(r0[key], a), key
    assert torch.equal(r0["xor_self"], torch.zeros(2, 3))
    # AND of the fixed-point words: 1.0 = 2^16 keeps bit 16 of each encoded value
    enc = (a * 2 ** 16).round().long()
    assert torch.equal(r0["and_open"], (enc & (1 << 16)).double().div(2 ** 16).float())
    assert torch.equal(r0["after_binary_ops"], 2 * a)


# --------------------------------------------------------------------------- cfg, ptt
def cfg_and_ptt():
    out = {"default": (crypten.cfg.mpc.provider, crypten.cfg.encoder.precision_bits,
                       crypten.cfg.functions.max_method)}
    with crypten.cfg.temp_override({"encoder.precision_bits": 10,
                                    "functions.max_method": "pairwise"}):
        x = crypten.cryptensor(torch.tensor([1.0, 3.0, 2.0]))
        out["precision"] = x._tensor.precision
        out["pairwise_max"] = x.max().get_plain_text()
    out["restored"] = crypten.cfg.encoder.precision_bits
    with mpc.ConfigManager("max_method", "pairwise"):
        out["config_manager"] = crypten.cfg.functions.max_method
    crypten.cfg.communicator.verbose = True
    crypten.cfg.communicator.verbose = False
    with pytest.raises(AttributeError):
        crypten.cfg.mpc.no_such_setting = 1

    crypten.set_default_cryptensor_type("ptt")
    try:
        p = crypten.cryptensor(torch.tensor([[0.5, -1.0], [2.0, 0.25]]), requires_grad=True)
        out["ptt_type"] = (crypten.get_default_cryptensor_type(), crypten.get_cryptensor_type(p))
        y = (p.exp() * p).sum()
        y.backward()
        out["ptt_grad"] = p.grad.get_plain_text()
        out["ptt_cmp"] = (p > 0.3).get_plain_text()
        out["ptt_matmul"] = p.matmul(p).get_plain_text()
    finally:
        crypten.set_default_cryptensor_type("mpc")
    with pytest.raises(ValueError):
        crypten.set_default_cryptensor_type("nope")
    return out


def test_cfg_overrides_and_plaintext_backend(pool2):
    r0, _ = pool2.run(cfg_and_ptt)
    assert r0["default"] == ("TTP", 16, "log_reduction")
    assert r0["precision"] == 10 and r0["restored"] == 16
    assert r0["pairwise_max"].item() == 3.0 and r0["config_manager"] == "pairwise"
    p = torch.tensor([[0.5, -1.0], [2.0, 0.25]], requires_grad=True)
    (p.exp() * p).sum().backward()
    assert r0["ptt_type"] == ("ptt", "ptt")
    assert torch.allclose(r0["ptt_grad"], p.grad)
    assert torch.equal(r0["ptt_cmp"], (p > 0.3).float())
    assert torch.allclose(r0["ptt_matmul"], p.detach() @ p.detach())


# ------------------------------------------------------------------------ communicator
def communicator_api():
    c = comm.get()
    rank = c.get_rank()
    out = {"rank": rank, "world_size": c.get_world_size(), "initialized": comm.is_initialized()}
    buf = torch.zeros(3)
    if rank == 0:
        c.send(torch.tensor([1.0, 2.0, 3.0]), 1)
    else:
        c.recv(buf, 0)
    out["recv"] = buf
    t = torch.full((2,), float(rank))
    c.broadcast(t, 1)  # in place at every party, CrypTen's way
    out["broadcast"] = t
    out["all_reduce"] = c.all_reduce(torch.tensor([rank + 1]))
    out["obj"] = c.broadcast_obj({"lr": 0.1, "tags": ["a"]} if rank == 0 else None, 0)
    try:
        c.broadcast_obj(object() if rank == 0 else None, 0) if rank == 0 else None
        out["pickle_refused"] = False
    except TypeError:
        out["pickle_refused"] = True
    c.reset_communication_stats()
    c.broadcast(torch.zeros(4, dtype=torch.int64), 0)
    out["stats"] = c.get_communication_stats()
    return out


def test_communicator_methods(pool2):
    r0, r1 = pool2.run(communicator_api)
    assert (r0["rank"], r1["rank"], r0["world_size"], r0["initialized"]) == (0, 1, 2, True)
    assert torch.equal(r1["recv"], torch.tensor([1.0, 2.0, 3.0]))
    assert torch.equal(r0["broadcast"], torch.ones(2)) and torch.equal(r1["broadcast"], torch.ones(2))
    assert r0["all_reduce"].tolist() == [3] == r1["all_reduce"].tolist()
    assert r1["obj"] == {"lr": 0.1, "tags": ["a"]}
    assert r0["pickle_refused"]  # only JSON values and tensors travel, never pickles
    # one broadcast of 4 int64 from party 0: one round, 32 bytes sent by 0, none by 1
    assert (r0["stats"]["rounds"], r0["stats"]["bytes"], r1["stats"]["bytes"]) == (1, 32, 0)
    assert "time" in r0["stats"]


# --------------------------------------------------------------------------- save / load
def save_load(tmpdir):
    rank = comm.get().get_rank()
    a = torch.arange(6.0).reshape(2, 3) / 3
    x = crypten.cryptensor(a)
    f = io.BytesIO()
    crypten.save(x, f)
    f.seek(0)
    y = crypten.load(f)
    out = {"same_share": torch.equal(x.share, y.share), "loaded": y.get_plain_text()}
    path = os.path.join(tmpdir, "plain.pt")
    crypten.save_from_party(a * rank + 1, path, src=1)
    out["from_party"] = crypten.load_from_party(path, src=1).get_plain_text()
    out["preloaded"] = crypten.load_from_party(preloaded=a if rank == 0 else None, src=0).get_plain_text()
    try:
        crypten.load_from_party(path, src=1, load_closure=lambda f: None)
        out["bad_closure"] = None
    except TypeError:
        out["bad_closure"] = "TypeError"
    return out


def test_save_and_load(pool2):
    a = torch.arange(6.0).reshape(2, 3) / 3
    with tempfile.TemporaryDirectory() as d:
        r0, r1 = pool2.run(save_load, d)
    for r in (r0, r1):
        assert r["same_share"] and torch.allclose(r["loaded"], a, **TOL)
        assert torch.allclose(r["from_party"], a + 1, **TOL)  # party 1's tensor
        assert torch.allclose(r["preloaded"], a, **TOL)
        assert r["bad_closure"] == "TypeError"  # at every party


# --------------------------------------------------------------------------------- nn
class _Net(crypten.nn.Module):
    """A user's CrypTen model: its forward sees MPCTensors."""

    def __init__(self):
        super().__init__()
        self.fc1 = crypten.nn.Linear(4, 3)
        self.fc2 = crypten.nn.Linear(3, 2)

    def forward(self, x):
        return self.fc2(self.fc1(x).relu())


def nn_training():
    torch.manual_seed(0)  # same public initialization at every party
    ref = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    net = _Net()
    for i, layer in ((0, net.fc1), (2, net.fc2)):
        layer.set_parameter("weight", ref[i].weight)
        layer.set_parameter("bias", ref[i].bias)
    net.encrypt(mode=True, src=0)
    out = {"encrypted": net.encrypted, "param_type": type(next(net.parameters())).__name__}
    x = torch.randn(5, 4)
    y = crypten.cryptensor(torch.randn(5, 2))
    loss = crypten.nn.MSELoss()(net(crypten.cryptensor(x)), y)
    loss.backward()
    net.update_parameters(0.1)
    opt = crypten.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    loss2 = crypten.nn.MSELoss()(net(crypten.cryptensor(x)), y)
    net.zero_grad()
    loss2.backward()
    opt.step()
    opt.zero_grad()
    out["grads_cleared"] = all(p.grad is None for p in net.parameters())
    out["params"] = {k: v.get_plain_text() for k, v in net.state_dict().items()}
    out["inputs"] = (x, y.get_plain_text())
    converted = crypten.nn.from_pytorch(ref, torch.zeros(1, 4)).encrypt()
    out["from_pytorch"] = converted(crypten.cryptensor(x)).get_plain_text()
    out["from_pytorch_type"] = type(converted).__mro__[1].__module__
    seq = crypten.nn.Sequential(crypten.nn.Linear(4, 2), crypten.nn.Sigmoid()).encrypt()
    out["seq"] = tuple(seq(crypten.cryptensor(x)).size())
    net.encrypt(mode=False)
    out["decrypted"] = (net.encrypted, type(net.fc1.weight).__name__)
    return out


def test_nn_module_api_training_matches_torch(pool2):
    r0, _ = pool2.run(nn_training)
    assert r0["encrypted"] and r0["param_type"] == "MPCTensor" and r0["grads_cleared"]
    assert r0["decrypted"] == (False, "Tensor")
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    x, y = r0["inputs"]
    assert torch.allclose(r0["from_pytorch"], ref(x).detach(), atol=2e-3)
    loss = torch.nn.functional.mse_loss(ref(x), y)
    loss.backward()
    with torch.no_grad():  # update_parameters: p -= 0.1 * grad
        for p in ref.parameters():
            p -= 0.1 * p.grad
            p.grad = None
    opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    torch.nn.functional.mse_loss(ref(x), y).backward()
    opt.step()
    names = {"fc1.weight": ref[0].weight, "fc1.bias": ref[0].bias,
             "fc2.weight": ref[2].weight, "fc2.bias": ref[2].bias}
    for k, v in names.items():
        assert torch.allclose(r0["params"][k], v.detach(), atol=3e-3), k
    assert r0["seq"] == (5, 2)


# -------------------------------------------------------------------------- gradients
class _Cube(crypten.gradients.AutogradFunction):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output * x * x * 3


def custom_gradient():
    a = torch.tensor([0.5, -1.0, 1.5])
    x = crypten.cryptensor(a, requires_grad=True)
    y = _Cube.apply(x).sum()
    y.backward()
    return y.get_plain_text(), x.grad.get_plain_text()


def test_custom_autograd_function(pool2):
    (value, grad), _ = pool2.run(custom_gradient)
    a = torch.tensor([0.5, -1.0, 1.5])
    assert torch.allclose(value, (a ** 3).sum(), **TOL)
    assert torch.allclose(grad, 3 * a * a, **TOL)


# ----------------------------------------------------------------------- run_multiprocess
def test_compat_run_multiprocess_carries_cfg_and_provider():
    def inner(k):  # a local function: travels by value
        x = crypten.cryptensor(torch.tensor([1.0, 2.0]) * k)
        return (x * x).get_plain_text(), x._tensor.precision, crypten.cfg.mpc.provider

    with crypten.cfg.temp_override({"mpc.provider": "TFP", "encoder.precision_bits": 12}):
        results = mpc.run_multiprocess(world_size=2)(inner)(3.0)
    assert [r[1:] for r in results] == [(12, "TFP"), (12, "TFP")]
    assert torch.allclose(results[0][0], torch.tensor([9.0, 36.0]), **TOL)
    with pytest.raises(ValueError):
        mpc.run_multiprocess(world_size=1)


def test_alias_loads_compat_by_name():
    import importlib
    import sys

    from crypten_lite.compat.testing import install_alias
    install_alias()
    try:
        crypten_alias = importlib.import_module("crypten")
        mpc_alias = importlib.import_module("crypten.mpc")
        assert crypten_alias is crypten and mpc_alias is mpc
        assert importlib.import_module("crypten.nn").Linear is crypten.nn.Linear
    finally:
        for name in [n for n in sys.modules if n == "crypten" or n.startswith("crypten.")]:
            del sys.modules[name]


def _rss_stats(c) -> dict:
    got = c.get_communication_stats()
    return {k: got[k] for k in ("rounds", "bytes_sent")}


def share_attr_under_rss():
    """CrypTen's share getter and setter under its "replicated" protocol (crypten_lite's rss):
    one additive tensor per party. Test data from fixed generators (the same at every party)."""
    from crypten_lite import encoding
    crypten.init()
    c = comm.get()
    rank = c.get_rank()
    out = {}
    value = torch.tensor([[1.5, -2.25, 0.125], [3.0, -0.5, 2.0]])
    x = crypten.cryptensor(value)
    got = x.share
    out["getter"] = (type(got) is torch.Tensor, got.dtype, torch.equal(x.share, got), got.clone())
    # a known additive sharing of `value` (encoded), one component per party
    gen = torch.Generator().manual_seed(7)
    r = [torch.randint(-2 ** 62, 2 ** 62, value.shape, generator=gen) for _ in range(2)]
    comps = r + [encoding.encode(value, 16) - r[0] - r[1]]
    mine = comps[rank].clone()
    x.share = mine
    out["set_is_exact"] = x.share is mine
    c.reset_communication_stats()
    out["reveal"] = x.get_plain_text()
    out["first_reveal_stats"] = _rss_stats(c)  # the re-replication (1 round) and the reveal
    c.reset_communication_stats()
    x.get_plain_text()
    out["second_reveal_stats"] = _rss_stats(c)
    out["after_use"] = torch.equal(x.share, comps[rank])  # still the share that was set
    y = crypten.cryptensor(torch.tensor([[0.5, 1.0, -2.0], [1.5, 0.25, -1.0]]), src=2)
    out["ops"] = ((x * y + x).get_plain_text(), (x - 1).relu().get_plain_text())
    # writing into the getter's tensor in place sets the share (CrypTen's getter gives the share)
    x.share.add_(encoding.encode(torch.tensor(1.0), 16) if rank == 1 else 0)
    out["inplace"] = x.get_plain_text()
    # garbage shares: the reveal is the sum of what the parties set, nothing else
    garbage = torch.randint(-2 ** 63, 2 ** 63 - 1, (4,), generator=torch.Generator().manual_seed(100 + rank))
    z = crypten.cryptensor(torch.zeros(4))
    z.share = garbage
    out["garbage"] = (garbage, z.get_plain_text())
    # binary: XOR components
    b = crypten.cryptensor(value).to(mpc.binary)
    bits = [torch.randint(-2 ** 62, 2 ** 62, value.shape, generator=gen) for _ in range(2)]
    bcomps = bits + [encoding.encode(value, 16) ^ bits[0] ^ bits[1]]
    b.share = bcomps[rank].clone()
    out["binary"] = (torch.equal(b.share, bcomps[rank]), b.get_plain_text(),
                     b.to(mpc.arithmetic).get_plain_text())
    try:
        x.share = torch.zeros(2, 3)  # a float tensor is not a share
        out["float_refused"] = None
    except TypeError as e:
        out["float_refused"] = str(e)
    f = io.BytesIO()
    crypten.save(x, f)
    f.seek(0)
    loaded = crypten.load(f)
    out["save_load"] = (torch.equal(loaded.share, x.share), loaded.get_plain_text())
    return out


def test_share_attr_follows_cryptens_replicated_protocol_under_rss(pool3_rss):
    from crypten_lite import encoding
    value = torch.tensor([[1.5, -2.25, 0.125], [3.0, -0.5, 2.0]])
    y = torch.tensor([[0.5, 1.0, -2.0], [1.5, 0.25, -1.0]])
    outs = pool3_rss.run(share_attr_under_rss)
    total = sum(o["getter"][3] for o in outs)  # the parties' additive components sum to the value
    assert torch.equal(encoding.decode(total, 16, torch.float32), value)
    n = value.numel()
    for rank, o in enumerate(outs):
        is_plain, dtype, stable, _ = o["getter"]
        assert is_plain and dtype == torch.int64 and stable
        assert o["set_is_exact"] and o["after_use"]
        assert torch.equal(o["reveal"], value)  # exact: the set sharing is of the encoded value
        second = o["second_reveal_stats"]
        assert second["rounds"] == 1
        assert o["first_reveal_stats"] == {"rounds": 2, "bytes_sent": second["bytes_sent"] + 8 * n}
        prod, relu = o["ops"]
        assert torch.allclose(prod, value * y + value, **TOL)
        assert torch.allclose(relu, (value - 1).relu(), **TOL)
        assert torch.allclose(o["inplace"], value + 1, **TOL)
        garbage_sum = sum(p["garbage"][0] for p in outs)
        assert torch.equal(o["garbage"][1], encoding.decode(garbage_sum, 16, torch.float32))
        same, plain, arith = o["binary"]
        assert same and torch.equal(plain, value) and torch.allclose(arith, value, **TOL)
        assert o["float_refused"] is not None and f"party {rank}" in o["float_refused"]
        assert "int64" in o["float_refused"]
        assert o["save_load"][0] and torch.allclose(o["save_load"][1], value + 1, **TOL)


# ---------------------------------------------------------------- BatchNorm modules (CrypTen's flow)
def _bn_data(size, seed):
    gen = torch.Generator().manual_seed(seed)  # test data only, the same at every party
    c = size[1]
    return (torch.rand(size, generator=gen) * 12 - 6, torch.rand(c, generator=gen) * 2 - 1,
            torch.rand(c, generator=gen) * 2 - 1)


BN_CASES = [("BatchNorm1d", (10, 5, 4)), ("BatchNorm2d", (6, 7, 4, 5)), ("BatchNorm3d", (4, 5, 4, 2, 3))]


def batchnorm_modules(seed: int):
    """CrypTen's test_batchnorm_module flow (its inputs' ranges, smaller batches): modules with
    set parameters, train and eval, running statistics, and the stateless module."""
    crypten.init()
    out = []
    for name, size in BN_CASES:
        for training in (True, False):
            x, w, b = _bn_data(size, seed)
            model = getattr(crypten.nn.module, name)(size[1])
            model.set_parameter("weight", w)
            model.set_parameter("bias", b)
            model = model.encrypt()
            model.train(training)
            enc_x = crypten.cryptensor(x)
            y = model.forward(enc_x).get_plain_text()
            stats = [model._buffers[k].get_plain_text() for k in ("running_mean", "running_var")]
            stateless = crypten.nn.module.BatchNormalization().encrypt()
            stateless.train(training)
            got = stateless((enc_x, crypten.cryptensor(w), crypten.cryptensor(b),
                             crypten.cryptensor(torch.zeros(size[1])), crypten.cryptensor(torch.ones(size[1]))))
            got = [t.get_plain_text() for t in (got if training else (got,))]
            out.append((name, training, y, stats, got))
    return out


def test_batchnorm_modules_follow_torch_on_fixed_inputs(pool2):
    outs = pool2.run(batchnorm_modules, 3)[0]
    for (name, training, y, stats, stateless), (_, size) in zip(outs, [c for c in BN_CASES for _ in (0, 1)]):
        x, w, b = _bn_data(size, 3)
        ref_model = getattr(torch.nn, name)(size[1])
        with torch.no_grad():
            ref_model.weight.copy_(w)
            ref_model.bias.copy_(b)
        ref_model.train(training)
        ref = ref_model(x).detach()
        # far inside CrypTen's tolerance (relative 0.05 or absolute 0.01): 16-bit fixed point
        assert torch.allclose(y, ref, atol=2e-3, rtol=1e-2), (name, training)
        assert torch.allclose(stats[0], ref_model.running_mean, atol=2e-3), (name, training)
        assert torch.allclose(stats[1], ref_model.running_var, atol=2e-3, rtol=1e-2), (name, training)
        assert len(stateless) == (5 if training else 1)
        assert torch.allclose(stateless[0], ref, atol=2e-3, rtol=1e-2), (name, training)
        if training:
            assert torch.allclose(stateless[1], ref_model.running_mean, atol=2e-3), name
            assert torch.allclose(stateless[2], ref_model.running_var, atol=2e-3, rtol=1e-2), name
