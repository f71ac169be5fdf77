"""The serving pieces without processes: the leader's batching decisions, request
validation, and the saved-shares file's integrity check."""

from __future__ import annotations

import pathlib
from types import SimpleNamespace

import pytest
import torch

from crypten_lite.cryptensor import CrypTensor
from crypten_lite.errors import ProtocolError
from crypten_lite.serve import batching, store
from crypten_lite.serve.errors import ServeError
from crypten_lite.serve.wire import validate


def test_scheduler_batches_only_what_every_party_holds():
    s = batching.Scheduler(world_size=2, max_batch=4, max_wait=1.0)
    s.announce(0, [["a/1", [1, 3], 10.0], ["a/2", [2, 3], 10.0]], [], now=0.0)
    assert s.decide(now=0.1) == ([], [])            # party 1 holds nothing yet
    s.announce(1, [["a/1", [1, 3], 10.0]], [], now=0.2)
    assert s.decide(now=0.3) == ([], [])            # one sample ready, still within max_wait
    assert s.decide(now=1.5) == (["a/1"], [])       # max_wait reached
    s.announce(1, [["a/2", [3, 3], 10.0]], [], now=1.6)
    batch, fails = s.decide(now=1.7)
    assert batch == [] and fails[0][:2] == ("a/2", "invalid") and "different shapes" in fails[0][2]
    s.announce(0, [["b/1", [4, 3], 1.0]], [], now=2.0)
    batch, fails = s.decide(now=3.5)                # party 1 never got b/1's share
    assert fails[0][:2] == ("b/1", "deadline") and "only parties [0]" in fails[0][2]
    s.announce(0, [["c/1", [2, 3], 9.0], ["c/2", [2, 3], 9.0], ["c/3", [1, 3], 9.0]], [], now=4.0)
    s.announce(1, [["c/1", [2, 3], 9.0], ["c/2", [2, 3], 9.0], ["c/3", [1, 3], 9.0]], ["c/3"], now=4.0)
    batch, fails = s.decide(now=4.0)                # full batch of 4 samples at once
    assert batch == ["c/1", "c/2"] and fails == [("c/3", "cancelled", "the client cancelled the request")]
    assert s.entries == {}


def test_scheduler_gap_closes_a_batch_once_the_burst_is_in():
    s = batching.Scheduler(world_size=2, max_batch=8, max_wait=1.0, gap=0.03)
    for t, key in ((0.0, "a/1"), (0.02, "a/2"), (0.04, "a/3")):   # a burst, 20 ms apart
        for party in (0, 1):
            s.announce(party, [[key, [1, 3], 10.0]], [], now=t)
        assert s.decide(now=t + 0.01) == ([], [])   # still arriving: the batch waits
    assert s.decide(now=0.07) == (["a/1", "a/2", "a/3"], [])   # 30 ms without a new request
    s.announce(0, [["b/1", [1, 3], 10.0]], [], now=0.5)
    assert s.decide(now=0.9) == ([], [])            # held by party 0 only: never batched
    s.announce(1, [["b/1", [1, 3], 10.0]], [], now=0.95)
    assert s.decide(now=0.96) == ([], []) and s.decide(now=0.98) == (["b/1"], [])


def _msg(**kw):
    base = dict(request_id=b"r" * 16, shape=[1, 2], precision=16, dtype="ring64",
                components=[b"\0" * 16], timeout_ms=0)
    base.update(kw)
    return SimpleNamespace(**base)


@pytest.mark.parametrize("kw,kind", [
    (dict(request_id=b"short"), "invalid"), (dict(shape=[1, 3]), "invalid"),
    (dict(shape=[9, 2], components=[b"\0" * 144]), "too_large"), (dict(dtype="float32"), "invalid"),
    (dict(precision=12), "invalid"), (dict(components=[b"\0" * 15]), "invalid"),
    (dict(components=[b"\0" * 16, b"\0" * 16]), "invalid")])
def test_validation_refuses_before_allocating(kw, kind):
    with pytest.raises(ServeError) as e:
        validate(_msg(**kw), (2,), 16, 1, 8, 30.0, 60.0)
    assert e.value.kind == kind
    ok = validate(_msg(), (2,), 16, 1, 8, 30.0, 60.0)
    assert ok.shape == (1, 2) and ok.components[0].dtype == torch.int64


class _Tiny:
    """The minimal module interface store walks (named_modules, _parameters, _buffers)."""

    def __init__(self):
        self._parameters = {"w": CrypTensor(torch.arange(6, dtype=torch.int64).reshape(2, 3), 16)}
        self._buffers = {}

    def named_modules(self):
        return [("", self)]


def test_saved_shares_roundtrip_and_integrity(tmp_path: pathlib.Path):
    path = tmp_path / "shares-party0.bin"
    store.save(_Tiny(), path, {"model_id": "x"})
    header, data = store.read_meta(path)
    fresh = _Tiny()
    fresh._parameters["w"] = torch.zeros(2, 3)
    store.load(fresh, header, data, 0)
    assert torch.equal(fresh._parameters["w"].share, torch.arange(6).reshape(2, 3))
    raw = bytearray(path.read_bytes())
    raw[-40] ^= 1                                    # one bit of a share altered
    path.write_bytes(bytes(raw))
    with pytest.raises(ProtocolError, match="integrity"):
        store.read_meta(path)
    path.write_bytes(bytes(raw[:20]))
    with pytest.raises(ProtocolError, match="truncated"):
        store.read_meta(path)


def test_docs_figures_are_the_benchmark_rows():
    """docs/serving.md's table is benchmarks/serve_load.py's rendering of docs/serve_load.jsonl."""
    import importlib.util
    import json
    root = pathlib.Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("serve_load", root / "benchmarks" / "serve_load.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = [json.loads(line) for line in (root / "docs" / "serve_load.jsonl").read_text().splitlines() if line]
    assert rows and all(r["wrong"] == 0 for r in rows)
    assert mod.table(rows) in (root / "docs" / "serving.md").read_text()
    assert (root / "docs" / "serve_latency.svg").read_text().startswith("<svg")


def test_compose_profile_runs_the_party_server():
    """docker-compose.serve.yml's parties run crypten_lite.serve.server with arguments it
    accepts, over TLS, 3 rss parties, each with its own share volume and client port."""
    import yaml
    from crypten_lite.serve.server import parser
    root = pathlib.Path(__file__).resolve().parents[2]
    doc = yaml.safe_load((root / "docker-compose.serve.yml").read_text())
    parties = [doc["services"][f"party{r}"] for r in range(3)]
    for r, svc in enumerate(parties):
        assert svc["entrypoint"] == ["python", "-m", "crypten_lite.serve.server"]
        args = parser().parse_args(svc["command"])
        assert args.tls and args.state_dir == "/state" and args.tokens.startswith("/certs/")
        env = svc["environment"]
        assert env["CRYPTEN_LITE_RANK"] == str(r) and env["CRYPTEN_LITE_PROTOCOL"] == "rss"
        assert f"state-party{r}:/state" in svc["volumes"] and svc["restart"] == "on-failure"
    assert len({p["ports"][0] for p in parties}) == 3


def test_compare_bits_without_tree_pooling_is_refused(capsys):
    """--compare-bits only shapes --prefer compute's pooling: with --prefer rounds it is refused,
    never silently ignored (by the local form and by a party's server alike)."""
    from crypten_lite.serve import local, server
    assert local.main(["--prefer", "rounds", "--compare-bits", "32"]) == 2
    with pytest.raises(SystemExit) as e:
        server.main(["--listen", "127.0.0.1:1", "--tokens", "t", "--state-dir", "d",
                     "--prefer", "rounds", "--compare-bits", "32"])
    assert e.value.code == 2
    assert "--compare-bits" in capsys.readouterr().err
