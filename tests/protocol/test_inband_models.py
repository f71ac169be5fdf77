"""One API for private models, the model shipped in-band (crypten_lite.nn.from_pytorch(..., src=)).

Party 0 (the model owner) imports the vendor's model module (tests/protocol/_vendor_models.py)
inside its own branch; every other party runs the same function without it and must never
import it. Outputs are checked against torch's own forward of the vendor's model, with 2 and
3 parties, for a float CNN (conv, BatchNorm folded, ReLU, max pool, linear) and the same CNN
quantized to int8 (torch.ao eager static quantization). The costs of a private run are those
of the old API (every party had the model), exactly. Hostile descriptions fail with a clear
error on the receiving parties.
"""

from __future__ import annotations

import importlib
import json
import pathlib
import sys
import warnings

import pytest
import torch

import crypten_lite
from crypten_lite import comm
from crypten_lite.errors import ProtocolError, UnsupportedError
from crypten_lite.nn import graph_desc as gd

OWNER = 0
VENDOR = (f"{__package__}." if __package__ else "") + "_vendor_models"

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


def _data():
    gen = torch.Generator().manual_seed(3)  # test data, not cryptographic
    return torch.rand(4, 1, 8, 8, generator=gen), torch.rand(64, 1, 8, 8, generator=gen)


# ------------------------------------------------------------------ party functions
def party_vendor_model(kind: str, x: torch.Tensor, calib: torch.Tensor) -> dict:
    """The vendor's model on party 0 only; party 1's images; the prediction revealed to all."""
    warnings.simplefilter("ignore")
    rank = crypten_lite.get_rank()
    c = comm.get()
    imported_before = VENDOR in sys.modules
    model = ref = None
    if rank == OWNER:
        vendor = importlib.import_module(VENDOR)
        model = vendor.float_cnn() if kind == "float" else vendor.int8_cnn(calib)
        with torch.no_grad():
            ref = model(x)
    c.reset_communication_stats()
    options = {"fold_batch_norm": True} if kind == "float" else {}
    private = crypten_lite.nn.from_pytorch(model if rank == OWNER else None, (1, 1, 8, 8), src=OWNER, **options)
    description = c.get_communication_stats()
    private.encrypt(src=OWNER)
    private.eval()
    enc = crypten_lite.cryptensor(x if rank == 1 else None, src=1)
    y = private(enc).get_plain_text()
    out = {"y": y, "ref": ref, "imported_before": imported_before, "imported": VENDOR in sys.modules,
           "description": description, "type": type(private).__name__}
    if kind == "int8":  # the data owner's plaintext input, quantized by that party as torch does
        out["y_owner_input"] = private(x if rank == 1 else None, src=1).get_plain_text()
        out["scale"] = private.output_info.scale
    return out


class SharedCNN(torch.nn.Module):
    """A model every party has (defined in this test module): the old API needs it everywhere."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.pool = torch.nn.MaxPool2d(2)
        self.fc = torch.nn.Linear(4 * 4 * 4, 3)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(torch.relu(self.conv(x))), 1))


def _shared_cnn() -> torch.nn.Module:
    torch.manual_seed(11)  # test model weights, not cryptographic
    return SharedCNN().eval()


def _stats(c) -> tuple[int, int]:
    s = c.get_communication_stats()
    return int(s["rounds"]), int(s["bytes_sent"])


def party_costs(x: torch.Tensor, calib: torch.Tensor) -> dict:
    """Rounds and bytes of one private run, old API (every party has the model) and new."""
    warnings.simplefilter("ignore")
    from crypten_lite.quantized import from_quantized, run_private
    from crypten_lite.quantized.testing import quantize_eager

    rank = crypten_lite.get_rank()
    c = comm.get()
    mine = x if rank == 1 else None
    out = {}
    # float, old API: every party converts the same model
    model = _shared_cnn()
    old = crypten_lite.nn.from_pytorch(model, torch.zeros(1, 1, 8, 8))
    c.reset_communication_stats()
    old.encrypt(src=0)
    y_old = old(crypten_lite.cryptensor(mine, src=1)).get_plain_text()
    out["float_old"] = _stats(c)
    new = crypten_lite.nn.from_pytorch(model if rank == 0 else None, (1, 1, 8, 8), src=0)
    c.reset_communication_stats()
    new.encrypt(src=0)
    y_new = new(crypten_lite.cryptensor(mine, src=1)).get_plain_text()
    out["float_new"] = _stats(c)
    # int8, old API: every party quantizes the same model; run_private shares weights and input
    qmodel = quantize_eager(_stubbed(model), calib)
    program = from_quantized(qmodel, x[:2])
    c.reset_communication_stats()
    q_old = run_private(program, mine, src_model=0, src_input=1)
    out["int8_old"] = _stats(c)
    private = crypten_lite.nn.from_pytorch(qmodel if rank == 0 else None, (2, 1, 8, 8), src=0)
    c.reset_communication_stats()
    private.encrypt(src=0)
    q_new = private(mine, src=1).get_plain_text()
    out["int8_new"] = _stats(c)
    c.reset_communication_stats()
    q_shared = private(crypten_lite.cryptensor(mine, src=1)).get_plain_text()
    out["int8_cryptensor_input"] = _stats(c)
    with torch.no_grad():
        out["ref"], out["qref"] = model(x), qmodel(x)
    out["qscale"] = private.output_info.scale
    out["y"] = (y_old, y_new, q_old, q_new, q_shared)
    return out


class _Stubbed(torch.nn.Module):
    def __init__(self, body: torch.nn.Module) -> None:
        super().__init__()
        from torch.ao.quantization import DeQuantStub, QuantStub
        self.quant, self.body, self.dequant = QuantStub(), body, DeQuantStub()

    def forward(self, x):
        return self.dequant(self.body(self.quant(x)))


def _stubbed(model: torch.nn.Module) -> torch.nn.Module:
    import copy
    return _Stubbed(copy.deepcopy(model)).eval()


def party_misuse() -> dict:
    """Wrong calls fail with a clear error on the party that makes them (or on all)."""
    rank = crypten_lite.get_rank()
    out = {}
    model = _shared_cnn() if rank == 0 else None
    private = crypten_lite.nn.from_pytorch(model, (1, 1, 8, 8), src=0)
    if rank != 0:
        try:  # a non-owner's rebuilt model holds only placeholders
            private(torch.zeros(1, 1, 8, 8))
        except ProtocolError as e:
            out["forward_before_encrypt"] = str(e)
    try:  # every party knows who owns the model: no hang, the same error everywhere
        private.encrypt(src=1)
    except ProtocolError as e:
        out["wrong_src"] = str(e)
    # the owner fails to convert (an op crypten_lite does not support): the others are told
    bad = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.Softsign()) if rank == 0 else None
    try:
        crypten_lite.nn.from_pytorch(bad, (1, 1, 8, 8), src=0)
    except (UnsupportedError, ProtocolError) as e:
        out["owner_failed"] = f"{type(e).__name__}: {e}"
    # a non-owner that passes a model is told to pass None (after the description arrived)
    try:
        crypten_lite.nn.from_pytorch(_shared_cnn(), (1, 1, 8, 8), src=0)
    except UnsupportedError as e:
        out["model_on_non_owner"] = str(e)
    return out


def party_hostile(payload: bytes, kind: str) -> str:
    """Party 0 sends a hostile description (or size); the others try to rebuild a model from it."""
    c = comm.get()
    if crypten_lite.get_rank() == 0:
        if kind == "oversize":
            c.broadcast(torch.tensor([gd.MAX_DESCRIPTION_BYTES + 1], dtype=torch.int64), 0, rounds=0)
        elif kind == "short":
            c.broadcast(torch.tensor([len(payload) + 5], dtype=torch.int64), 0, rounds=0)
            c.broadcast(torch.frombuffer(bytearray(payload), dtype=torch.uint8), 0)
        else:
            gd.broadcast(payload, 0)
        return "sent"
    try:
        crypten_lite.nn.from_pytorch(None, (1, 1, 8, 8), src=0)
    except ProtocolError as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


# ------------------------------------------------------------------ tests
@pytest.mark.parametrize("kind", ["float", "int8"])
def test_vendor_model_in_band(pool_all, kind):
    pool = pool_all  # 2 and 3 parties additive, 3 parties rss
    x, calib = _data()
    got = pool.run(party_vendor_model, kind, x, calib)
    owner, others = got[OWNER], [g for r, g in enumerate(got) if r != OWNER]
    assert owner["imported"]
    for g in others:  # the function the others ran never imported the vendor's module
        assert not g["imported_before"] and not g["imported"]
        assert torch.equal(g["y"], owner["y"])
        assert g["description"]["bytes_received"] * len(others) == owner["description"]["bytes_sent"] > 0
    assert owner["description"]["rounds"] == 1
    assert len({g["type"] for g in got}) == 1
    ref = owner["ref"]
    if kind == "float":
        assert torch.allclose(owner["y"], ref, atol=2e-3), (owner["y"] - ref).abs().max()
    else:  # int8: within one output step of torch's quantized model, nearly all exact
        for y in (owner["y"], owner["y_owner_input"]):
            steps = ((y - ref).abs() / owner["scale"]).round()
            assert steps.max() <= 1 and (steps == 0).double().mean() >= 0.95, steps
        assert all(torch.equal(g["y_owner_input"], owner["y_owner_input"]) for g in others)


def test_costs_equal_the_old_api(pool2):
    x, calib = _data()
    got = pool2.run(party_costs, x, calib)
    r = got[0]
    assert r["float_new"] == r["float_old"]
    assert r["int8_new"] == r["int8_old"]
    # both APIs agree with torch
    y_old, y_new, q_old, q_new, q_shared = r["y"]
    assert torch.allclose(y_new, r["ref"], atol=2e-3) and torch.allclose(y_old, r["ref"], atol=2e-3)
    assert torch.equal(q_new, q_old)
    for q in (q_new, q_shared):  # within one output step of torch's quantized model
        assert (q - r["qref"]).abs().max() <= r["qscale"] * 1.001
    print({k: v for k, v in r.items() if k.startswith(("float", "int8"))})


def test_misuse_gives_clear_errors(pool2):
    got = pool2.run(party_misuse)
    assert "holds only the architecture" in got[1]["forward_before_encrypt"]
    for r in got:
        assert "came from party 0" in r["wrong_src"] and "encrypt(src=0)" in r["wrong_src"]
    assert got[0]["owner_failed"].startswith("UnsupportedError") and "Softsign" in got[0]["owner_failed"]
    assert "party 0 could not convert its model" in got[1]["owner_failed"]
    assert "pass None on the other parties" in got[1]["model_on_non_owner"]
    assert "model_on_non_owner" not in got[0]


def _graph_payload() -> bytes:
    """A real description of SharedCNN, to be tampered with."""
    converted = crypten_lite.nn.from_pytorch(_shared_cnn(), torch.zeros(1, 1, 8, 8))
    return gd.describe_graph(converted, [[1, 1, 8, 8]])


def _retarget(payload: bytes, old: str, new: str) -> bytes:
    """Replace a string in the JSON part (and fix its length)."""
    import struct
    (n,) = struct.unpack("<Q", payload[8:16])
    text = payload[16:16 + n].replace(old.encode(), new.encode(), 1)
    assert text != payload[16:16 + n]
    return gd.MAGIC + struct.pack("<Q", len(text)) + text + payload[16 + n:]


@pytest.mark.parametrize("kind", ["unknown_op", "oversize", "short"])
def test_hostile_description_over_the_session(pool2, kind):
    payload = _retarget(_graph_payload(), '"torch.relu"', '"os.system"') if kind == "unknown_op" else _graph_payload()
    got = pool2.run(party_hostile, payload, kind)
    assert got[0] == "sent"
    expected = {"unknown_op": "calls 'os.system', which is not an op",
                "oversize": "announced 67108865 bytes",
                "short": "but sent a torch.uint8 tensor of shape"}[kind]
    assert got[1].startswith("DescriptionError") and expected in got[1], got[1]


# ------------------------------------------------------------------ hostile descriptions (no session)
def _quantized_payload() -> bytes:
    from crypten_lite.quantized import from_quantized
    from crypten_lite.quantized.testing import quantize_eager

    x, calib = _data()
    return gd.describe_program(from_quantized(quantize_eager(_stubbed(_shared_cnn()), calib), x[:2]))


def _rebuild(payload: bytes):
    kind, reader = gd.read(payload)
    return gd.rebuild_graph(reader) if kind == "graph" else gd.rebuild_program(reader)


def test_descriptions_round_trip_without_weights():
    model = _shared_cnn()
    converted = crypten_lite.nn.from_pytorch(model, torch.zeros(1, 1, 8, 8))
    payload = _graph_payload()
    for p in model.parameters():  # no weight's bytes travel
        assert p.detach().numpy().tobytes()[:16] not in payload
    rebuilt = _rebuild(payload)
    assert all(v.device.type == "meta" for v in rebuilt.state_dict().values())
    assert list(rebuilt.state_dict()) == list(converted.state_dict())
    owner = gd.rebuild_graph(gd.read(payload)[1], values=dict(converted.state_dict()))
    x = _data()[0]
    with torch.no_grad():
        assert torch.allclose(owner(x), model(x), atol=1e-6)
    program = _rebuild(_quantized_payload())
    assert all(w.device.type == "meta" for n in program.nodes for w in n.weights.values())


class _Branchy(torch.nn.Module):
    """Python control flow on a tensor: torch.fx fails, torch.export converts it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 3)
        self.bn = torch.nn.BatchNorm1d(3)

    def forward(self, x):
        if x.shape[0] > 0:
            x = x * 2
        return torch.relu(self.bn(self.fc(x)))


def test_export_graph_round_trip():
    torch.manual_seed(5)  # test model weights, not cryptographic
    model = _Branchy().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-1, 1)
    x = torch.randn(4, 6)
    converted = crypten_lite.nn.from_pytorch(model, x)
    payload = gd.describe_graph(converted, [[4, 6]])
    rebuilt = gd.rebuild_graph(gd.read(payload)[1], values=dict(converted.state_dict()))
    assert rebuilt.source == converted.source
    with torch.no_grad():
        assert torch.allclose(rebuilt.eval()(x), model(x), atol=1e-5)


def _set_json(payload: bytes, edit) -> bytes:
    import json
    import struct
    (n,) = struct.unpack("<Q", payload[8:16])
    doc = json.loads(payload[16:16 + n])
    edit(doc)
    text = json.dumps(doc).encode()
    return gd.MAGIC + struct.pack("<Q", len(text)) + text + payload[16 + n:]


def _first(doc, op):
    return next(n for n in doc["nodes"] if n["op"] == op)


HOSTILE = {
    # name: (which payload, tamper, expected words in the error)
    "unknown function": ("graph", lambda p: _retarget(p, '"torch.relu"', '"builtins.eval"'),
                         "calls 'builtins.eval', which is not an op"),
    "unknown method": ("graph", lambda p: _set_json(p, lambda d: _first(d, "call_function").update(
        op="call_method", target="__reduce__")), "tensor method '__reduce__'"),
    "unknown layer": ("graph", lambda p: _retarget(p, '"type":"Conv2d"', '"type":"subprocess.Popen"'),
                      "unknown layer type 'subprocess.Popen'"),
    "layer argument": ("graph", lambda p: _retarget(p, '"kernel_size"', '"__class__"'),
                       "has arguments"),
    "unknown node kind": ("graph", lambda p: _set_json(p, lambda d: d["nodes"][1].update(op="exec")),
                          "unknown kind 'exec'"),
    "dunder path": ("graph", lambda p: _retarget(p, '"path":"conv"', '"path":"__dict__"'),
                    "is not a dotted path"),
    "unknown int8 op": ("quantized", lambda p: _set_json(p, lambda d: d["nodes"][1].update(op="exec")),
                        "unknown op 'exec'"),
    "unknown tag": ("quantized", lambda p: _set_json(
        p, lambda d: d["nodes"][0]["attrs"].update(scale={"pickle": "cos\nsystem\n"})), "unknown value tag 'pickle'"),
    "unknown kind": ("graph", lambda p: _retarget(p, '"kind":"graph"', '"kind":"python"'), "unknown model kind"),
    "oversize tensor": ("quantized", lambda p: _set_json(p, lambda d: d["tensors"][0].update(
        shape=[1 << 20, 1 << 20])), "more than 2147483648 elements"),
    "too many dims": ("quantized", lambda p: _set_json(p, lambda d: d["tensors"][0].update(shape=[1] * 9)),
                      "entries (limit 8)"),
    "unknown dtype": ("quantized", lambda p: _set_json(p, lambda d: d["tensors"][0].update(dtype="object")),
                      "unknown dtype 'object'"),
    "wrong byte count": ("quantized", lambda p: _set_json(p, lambda d: next(
        t for t in d["tensors"] if "nbytes" in t).update(nbytes=3)), "declares 3 bytes"),
    "missing bytes": ("quantized", lambda p: p[:-1], "wrong byte length"),
    "extra bytes": ("quantized", lambda p: p + b"\0", "wrong byte length"),
    "bad magic": ("graph", lambda p: b"\x80\x04" + p[2:], "bad magic"),
    "bad json": ("graph", lambda p: p[:16] + b"[" + p[17:], "does not parse"),
    "huge integer": ("graph", lambda p: _retarget(p, '"training":false', '"training":' + "9" * 5000),
                     "does not parse"),
    "deep nesting": ("graph", lambda p: _set_json(p, lambda d: _first(d, "call_function").update(
        args=_nest(40))), "nested deeper"),
    "dangling node": ("graph", lambda p: _set_json(p, lambda d: _first(d, "call_function").update(
        args={"t": [{"node": "nowhere"}]})), "not an earlier node"),
    "secret as constant": ("quantized", lambda p: _set_json(p, lambda d: d["nodes"][0]["attrs"].update(
        scale={"tensor": d["nodes"][1]["weights"]["weight"]})), "secret placeholder"),
}


def _nest(depth: int):
    v = 0
    for _ in range(depth):
        v = [v]
    return v


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_description_is_refused(case):
    which, tamper, expected = HOSTILE[case]
    payload = tamper(_graph_payload() if which == "graph" else _quantized_payload())
    with pytest.raises(gd.DescriptionError, match="model description") as err:
        _rebuild(payload)
    assert expected in str(err.value), str(err.value)


def test_float_description_sizes_in_the_docs():
    """docs/private_models.md's figures: a float description holds no tensor data, so its size
    depends on the architecture alone."""
    from crypten_lite.models import build_model

    vendor = importlib.import_module(VENDOR)  # this test process is no party (parties are spawned)
    cnn = crypten_lite.nn.from_pytorch(vendor.float_cnn(), torch.zeros(1, 1, 8, 8), fold_batch_norm=True)
    resnet = crypten_lite.nn.from_pytorch(build_model(64), torch.zeros(1, 3, 32, 32), fold_batch_norm=True,
                                          check=False)
    sizes = (len(gd.describe_graph(cnn, [[1, 1, 8, 8]])), len(gd.describe_graph(resnet, [[1, 3, 32, 32]])))
    docs = pathlib.Path(__file__).parents[2] / "docs"
    want = json.loads((docs / "model_descriptions.json").read_text())["sizes"]  # the docs' source
    assert sizes == (want["vendor_cnn_bytes"], want["resnet18_bytes"]) == (2454, 17063), sizes
    text = (docs / "private_models.md").read_text()
    assert "2,454 bytes" in text and "17,063 bytes" in text


def test_every_layer_of_the_nn_tests_survives_its_description():
    """Each torch layer of tests/protocol/test_nn.py's table, converted, described and rebuilt
    (the owner's values filled in), computes what torch computes, in train and eval mode."""
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from test_nn import LAYERS, _layer

    for key, (_, shape, _, _) in LAYERS.items():
        for train in (False, True):
            torch_layer = _layer(key).train(train)
            x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
            converted = crypten_lite.nn.from_pytorch(torch_layer, x, check=False).train(train)
            payload = gd.describe_graph(converted, [list(shape)])
            rebuilt = gd.rebuild_graph(gd.read(payload)[1], values=dict(converted.state_dict()))
            assert rebuilt.training == train and repr(rebuilt) == repr(converted), key
            if "dropout" in key and train:
                continue  # random masks
            with torch.no_grad():
                assert torch.allclose(rebuilt(x), torch_layer(x), atol=1e-5), key
