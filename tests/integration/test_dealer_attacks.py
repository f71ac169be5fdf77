"""Attacks on the dealer of correlated randomness, performed for real (issue 11, findings 1-2).

A real dealer process (`crypten-lite dealer`, INFO log with its audit line) and two party
processes over real gRPC, in one plaintext session (the weakest setting: nobody's identity is
proven) and one mutual-TLS session. The parties run PARTY_SCRIPT: honest computations, and
in between the attacks a deviating party can make; the test process plays the outsider.
Every attack must fail, every honest result must match torch, and the dealer's audit must
show that no counter was ever answered twice:

(a) plan recorded on x.square(), run x * y after prefetching it: the run continues past the
    prefetched range; rank 0 cannot get a second correction for the square's counter, and the
    algebra that recovered party 1's y from two corrections over the same streams fails;
(b) a plan recorded at batch 8 (chunked requests) run at batch 3: correct, no repeat;
(c) party 1, with its own dealer key, and an outsider ask for a trunc at a triple's counter:
    refused (bad or no MAC; with TLS, refused by certificate too);
(d) a valid rank-0 batch replayed by rank 0 and by an outsider: refused;
(e) requests whose broadcast result, or whose batch answer, is huge: refused before
    allocating (the dealer's peak memory stays small);
(g) kinds, ops, parameters and shapes no protocol uses: refused, no counter consumed.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import time

import grpc
import pytest

from crypten_lite import certs
from crypten_lite._proto import crypten_lite_pb2 as pb
from crypten_lite._proto import crypten_lite_pb2_grpc as pb_grpc
from crypten_lite.comm.grpc_comm import GRPC_OPTIONS, PROTOCOL_VERSION
from crypten_lite.config import Config
from crypten_lite.mpc.launcher import local_env
from crypten_lite.random import KeyPair

MAX_MESSAGE_BYTES = 64 << 20  # the session's limit on one component (8 Mi elements)
DEALER_PEAK_LIMIT = 1 << 30   # the dealer never comes near the sizes it refuses (GiBs)
BIG = 10 ** 9                 # counters far ahead of the session's, for rank 0's probes

PARTY_SCRIPT = r'''
import json, pathlib, sys, time
import torch
import crypten_lite
from crypten_lite import encoding
from crypten_lite._proto import crypten_lite_pb2 as pb
from crypten_lite.comm.dealer_rpc import Request
from crypten_lite.errors import CryptenLiteError
from crypten_lite.mpc import beaver, binary, offline
from crypten_lite.session import current

work, mode = pathlib.Path(sys.argv[1]), sys.argv[2]
BIG = 10 ** 9
crypten_lite.init()
s = current()
rank, provider = s.rank, s.provider
out = {"refused": 0}
honest = []  # every counter rank 0's provider asked the dealer for
if rank == 0:
    def counting(ask):
        def counted(requests):
            honest.extend(r.counter for r in requests)
            return ask(requests)
        return counted
    # on demand (batches) and offline (prepared, then pulled in chunks)
    provider._batch_corrections = counting(provider._batch_corrections)
    provider._prefetch_corrections = counting(provider._prefetch_corrections)


def ask(*requests):
    """Send a batch through this party's own dealer client: 'answered' or the refusal."""
    try:
        provider.client.request_batch(list(requests))()
        return "answered"
    except CryptenLiteError as e:
        out["refused"] += 1
        return str(e)


def wait_for(name):
    deadline = time.monotonic() + 240
    while not (work / name).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {name} from the test process")
        time.sleep(0.05)


def mlp(batch, w1, w2):
    g = torch.Generator().manual_seed(batch)  # test data only, never shares
    data = torch.randn(batch, w1.shape[0], generator=g)
    x = crypten_lite.cryptensor(data, src=1)
    h = (x @ crypten_lite.cryptensor(w1, src=0)).relu()
    got = (h @ crypten_lite.cryptensor(w2, src=0)).get_plain_text()
    return float((got - (data @ w1).relu() @ w2).abs().max())


def product():
    a = torch.tensor([1.5, -2.0, 3.0, 0.25])
    b = torch.tensor([2.0, 4.0, -1.0, -3.5])
    x = crypten_lite.cryptensor(a if rank == 0 else None, src=0)
    y = crypten_lite.cryptensor(b if rank == 1 else None, src=1)
    return a, b, x, y


if mode == "tls":
    a, b, x, y = product()
    z = (x * y).get_plain_text()
    out["err"] = float((z - a * b).abs().max())
    kt = provider.counter - 1  # the product's triple (2 parties: local truncation)
    trunc = Request("trunc", kt, "", ((4,),), (16,))
    out["trunc_at_triple"] = ask(trunc)
    if rank == 0:
        (work / "outsider.json").write_text(json.dumps({"kt": kt}))
    wait_for("outsider_done")
    out["after"] = float(((x * y).get_plain_text() - a * b).abs().max())
    print("RESULT " + json.dumps(out), flush=True)
    crypten_lite.uninit()
    sys.exit(0)

# (b) a plan recorded at batch 8 run at batch 3, with chunked elementwise requests
g = torch.Generator().manual_seed(0)  # test data only, never shares
w1, w2 = torch.randn(6, 16, generator=g) / 3, torch.randn(16, 2, generator=g) / 3
binary.MAX_CORRECTION_BYTES = 256  # 32 words per request: the hidden layer is chunked
with offline.record() as plan:
    errs = [mlp(8, w1, w2)]
offline.prefetch(plan)
errs.append(mlp(3, w1, w2))
offline.prefetch(plan)
errs.append(mlp(8, w1, w2))
out["b"] = {"errs": errs, "diverged": provider.stats["diverged"], "plan": len(plan),
            "prefetched": provider.stats["prefetched"]}

# (a) plan recorded on x.square(), run x * y with the plan prefetched
a, b, x, y = product()
with offline.record() as plan:
    x.square()
offline.prefetch(plan)
k0 = provider.counter  # the square's counter in the prefetched range
captured = {}
if rank == 0:
    square_fix = provider._prefetched[k0]()[0]  # rank 0 holds the square's correction
    get, open_diffs = provider.get, beaver.open_differences
    def spy_get(kind, shapes, op="", params=()):
        corr = get(kind, shapes, op, params)
        captured.setdefault("triple", (provider.counter - 1, corr))
        return corr
    def spy_open(pairs, dst=None, **kw):  # on_range (streamed openings) passed through
        return captured.setdefault("opened", open_diffs(pairs, dst, **kw))
    provider.get, beaver.open_differences = spy_get, spy_open
z = (x * y).get_plain_text()
kt = provider.counter - 1
out["a"] = {"err": float((z - a * b).abs().max()), "k0": k0, "kt": kt,
            "diverged": provider.stats["diverged"]}
if rank == 0:
    provider.get, beaver.open_differences = get, open_diffs
    (kt0, triple), (e, d) = captured["triple"], captured["opened"]
    prec = s.config.precision
    # The attack of finding 1: with the square and the triple at one counter over the same
    # streams, a1 = x - e - a0 and party 1's b1 = a^2 - square_fix, so y = d + b0 + b1.
    whole_a = encoding.encode(a, prec) - e
    y_guess = encoding.decode(d + triple[1] + whole_a * whole_a - square_fix, prec)
    out["a"].update(
        kt0=kt0,
        recovered=bool(torch.allclose(y_guess, b, atol=1e-2)),
        guess_err=float((y_guess.double() - b.double()).abs().min()),
        second_triple_at_square=ask(Request("triple", k0, "mul", ((4,), (4,)))),
        second_triple=ask(Request("triple", kt, "mul", ((4,), (4,)))),
        trunc_at_triple=ask(Request("trunc", kt, "", ((4,),), (16,))))

# (c) party 1 posing as requester, with its own dealer key
if rank == 1:
    out["c"] = {"trunc_at_triple": ask(Request("trunc", kt, "", ((4,),), (16,))),
                "fresh": ask(Request("square", BIG + 7, "", ((4,),)))}

# (d) rank 0 replays one of its own valid batches; the outsider gets the bytes too
if rank == 0:
    batch = provider.client.batch_proto([Request("square", BIG + 100, "", ((4,),))])
    first = provider.client.stub.Correlations(batch, timeout=30)
    again = provider.client.stub.Correlations(batch, timeout=30)
    tampered = pb.CorrelationBatch()
    tampered.CopyFrom(batch)
    tampered.requests[0].shapes[:] = [1, 5]
    changed = provider.client.stub.Correlations(tampered, timeout=30)
    out["refused"] += bool(again.error) + bool(changed.error)
    out["d"] = {"first": first.error or f"answered {len(first.tensors)}",
                "again": again.error, "tampered": changed.error}
    (work / "replay.bin").write_bytes(batch.SerializeToString())
    (work / "outsider.json").write_text(json.dumps({"kt": kt}))
wait_for("outsider_done")

if rank == 0:
    # (e) answers too large, refused before allocating; the counter is not consumed
    out["e"] = {
        "broadcast": ask(Request("triple", BIG + 200, "mul", ((1 << 16, 1), (1, 1 << 16)))),
        "broadcast_over_limit": ask(Request("triple", BIG + 201, "mul", ((4096, 1), (1, 4096)))),
        "batch": ask(*[Request("square", BIG + 300 + i, "", ((7_500_000,),)) for i in range(40)]),
        "same_counter_small": ask(Request("square", BIG + 200, "", ((4,),))),
    }
    # (g) kinds, ops, parameters, shapes no protocol uses
    out["g"] = {name: ask(req) for name, req in {
        "kind": Request("nope", BIG + 400, "", ((4,),)),
        "op": Request("triple", BIG + 401, "add", ((4,), (4,))),
        "bits": Request("trunc", BIG + 402, "", ((4,),), (64,)),
        "params": Request("square", BIG + 403, "", ((4,),), (1,)),
        "operands": Request("bit", BIG + 404, "", ((4,), (4,))),
        "owner": Request("binary_monomials", BIG + 405, "", ((4,),), (2, 0, 9, 3)),
        "stride": Request("triple", BIG + 406, "conv2d", ((1, 1, 4, 4), (1, 1, 2, 2)),
                          (0, 1, 0, 0, 1, 1, 1)),
        "negative": Request("square", BIG + 407, "", ((-4,),)),
    }.items()}

# the session still computes correctly after every attack
out["final"] = float(((x * y).get_plain_text() - a * b).abs().max())
if rank == 0:
    out["honest"] = {"requests": len(honest), "distinct": len(set(honest))}
print("RESULT " + json.dumps(out), flush=True)
crypten_lite.uninit()
'''


def _outsider_batch(session: str, counter: int, mac: bytes = b"") -> pb.CorrelationBatch:
    """A trunc request at `counter` as anybody could write it (shapes length-prefixed)."""
    req = pb.CorrelationRequest(session=session, kind="trunc", counter=counter, op="",
                                shapes=[1, 4], params=[16])
    return pb.CorrelationBatch(requests=[req], mac=mac)


def _wait_for_file(path: pathlib.Path, procs: list[subprocess.Popen], logs: dict, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        dead = [name for name, p in zip(logs, procs) if p.poll() is not None]
        assert not dead, "\n".join(f"--- {n} ---\n{logs[n].read_text()}" for n in logs)
        assert time.monotonic() < deadline, f"no {path.name} within {timeout} s"
        time.sleep(0.1)


def _peak_rss(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def _run_session(tmp_path: pathlib.Path, mode: str, tls_dir: str = "", outsider=None) -> dict:
    """Dealer + 2 parties running PARTY_SCRIPT; `outsider(config, work)` runs when rank 0 asks."""
    extra = {"CRYPTEN_LITE_MAX_MESSAGE_BYTES": str(MAX_MESSAGE_BYTES), "CRYPTEN_LITE_LOG": "INFO"}
    if tls_dir:
        extra["CRYPTEN_LITE_TLS_DIR"] = tls_dir
    party_envs, dealer_env = local_env(2, "dealer", timeout=60, extra=extra)
    base = {k: v for k, v in os.environ.items() if not k.startswith("CRYPTEN_LITE_")}
    base["PYTHONUNBUFFERED"] = "1"
    work = tmp_path / mode
    work.mkdir()
    script = work / "party.py"
    script.write_text(PARTY_SCRIPT)
    logs = {name: work / f"{name}.log" for name in ("dealer", "rank0", "rank1")}
    procs: list[subprocess.Popen] = []
    try:
        with open(logs["dealer"], "w") as f:
            procs.append(subprocess.Popen([sys.executable, "-m", "crypten_lite.cli", "dealer"],
                                          env={**base, **dealer_env}, stdout=f, stderr=subprocess.STDOUT))
        for rank in range(2):
            with open(logs[f"rank{rank}"], "w") as f:
                procs.append(subprocess.Popen([sys.executable, str(script), str(work), mode],
                                              env={**base, **party_envs[rank]}, stdout=f,
                                              stderr=subprocess.STDOUT))
        config = Config.from_env(party_envs[0])
        result: dict = {"outsider": None}
        if outsider is not None:
            _wait_for_file(work / "outsider.json", procs, logs, timeout=300)
            result["outsider"] = outsider(config, work)
            (work / "outsider_done").write_text("done")
        for p in procs[1:]:
            try:
                p.wait(timeout=300)
            except subprocess.TimeoutExpired:
                pytest.fail("a party did not finish:\n" + "\n".join(l.read_text() for l in logs.values()))
        result["dealer_peak"] = _peak_rss(procs[0].pid)
        texts = {n: logs[n].read_text() for n in logs}
        for rank in range(2):
            assert procs[1 + rank].returncode == 0, "\n".join(f"--- {n} ---\n{t}" for n, t in texts.items())
            line = next(ln for ln in texts[f"rank{rank}"].splitlines() if ln.startswith("RESULT "))
            result[rank] = json.loads(line[len("RESULT "):])
        audits = re.findall(r"dealer audit: .*", texts["dealer"])
        assert audits, texts["dealer"]
        result["audit"] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", audits[-1])}
        result["dealer_log"] = texts["dealer"]
        return result
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _outsider_attacks(config: Config, work: pathlib.Path) -> dict:
    """What a stranger on the network can try against the dealer without TLS."""
    kt = json.loads((work / "outsider.json").read_text())["kt"]
    replay = pb.CorrelationBatch.FromString((work / "replay.bin").read_bytes())
    channel = grpc.insecure_channel(config.dealer, GRPC_OPTIONS)
    try:
        stub = pb_grpc.DealerStub(channel)
        hello = pb.Hello(protocol_version=PROTOCOL_VERSION, session=config.session,
                         world_size=2, rank=0, config_digest=config.digest(),
                         public_key=KeyPair().public_bytes)
        return {
            "no_mac": stub.Correlations(_outsider_batch(config.session, kt), timeout=30).error,
            "random_mac": stub.Correlations(_outsider_batch(config.session, kt, os.urandom(32)),
                                            timeout=30).error,
            "replay": stub.Correlations(replay, timeout=30).error,
            "handshake_as_rank0": stub.Handshake(hello, timeout=30).error,
        }
    finally:
        channel.close()


@pytest.fixture(scope="module")
def plaintext(tmp_path_factory):
    return _run_session(tmp_path_factory.mktemp("attacks"), "plain", outsider=_outsider_attacks)


def test_a_divergent_prefetch_never_gives_rank0_a_second_correction(plaintext):
    r0, r1 = plaintext[0]["a"], plaintext[1]["a"]
    assert r0["err"] <= 1e-3 and r1["err"] <= 1e-3
    # the run continued past the prefetched range, on both parties alike
    assert r0["kt"] == r1["kt"] == r0["kt0"] > r0["k0"] and r0["diverged"] == r1["diverged"]
    for key in ("second_triple_at_square", "second_triple", "trunc_at_triple"):
        assert "already answered" in r0[key], (key, r0[key])
    # the algebraic recovery of party 1's y no longer works
    assert not r0["recovered"] and r0["guess_err"] > 1.0


def test_b_plan_at_another_batch_size_is_correct_and_never_repeats_a_counter(plaintext):
    for rank in range(2):
        b = plaintext[rank]["b"]
        assert max(b["errs"]) <= 2e-3, b["errs"]
        assert b["diverged"] == 1
    assert plaintext[0]["b"]["prefetched"] == plaintext[0]["b"]["plan"]  # 2nd plan fully used
    honest, audit = plaintext[0]["honest"], plaintext["audit"]
    assert honest["requests"] == honest["distinct"]  # the provider never re-requested a counter
    # the dealer answered exactly those counters (plus rank 0's two valid probes), each once
    assert audit["counters_answered"] == honest["distinct"] + 2
    refused = plaintext[0]["refused"] + plaintext[1]["refused"] + 3  # the outsider's three
    assert audit["batches_refused"] == refused
    assert plaintext[0]["final"] <= 1e-3 and plaintext[1]["final"] <= 1e-3


def test_c_party1_and_outsider_cannot_request_a_trunc_at_a_triples_counter(plaintext):
    c = plaintext[1]["c"]
    assert "not authenticated (bad MAC)" in c["trunc_at_triple"]
    assert "not authenticated (bad MAC)" in c["fresh"]
    outsider = plaintext["outsider"]
    assert "not authenticated (no MAC)" in outsider["no_mac"]
    assert "not authenticated (bad MAC)" in outsider["random_mac"]
    assert "already joined" in outsider["handshake_as_rank0"]


def test_d_replayed_rank0_batch_is_refused(plaintext):
    d = plaintext[0]["d"]
    assert d["first"] == "answered 1"
    assert "already answered" in d["again"]
    assert "not authenticated (bad MAC)" in d["tampered"]
    assert "already answered" in plaintext["outsider"]["replay"]


def test_e_huge_broadcast_results_are_refused_before_allocating(plaintext):
    e = plaintext[0]["e"]
    assert re.search(r"component of shape \(65536, 65536\) \(34359738368 bytes\) exceeds", e["broadcast"])
    assert "component of shape (4096, 4096)" in e["broadcast_over_limit"]
    assert re.search(r"the answer \(2400000000 bytes\) exceeds", e["batch"])
    assert e["same_counter_small"] == "answered"  # a refused request consumes no counter
    assert plaintext["dealer_peak"] < DEALER_PEAK_LIMIT, plaintext["dealer_peak"]


def test_g_requests_no_protocol_makes_are_refused(plaintext):
    expected = {"kind": "unknown kind", "op": "no Beaver triple", "bits": "one shift",
                "params": "no parameters", "operands": "operand shapes", "owner": "mask owner",
                "stride": "parameter 0", "negative": "negative dimension"}
    g = plaintext[0]["g"]
    for name, why in expected.items():
        assert "refused" in g[name] and why in g[name], (name, g[name])


# --- with mutual TLS ----------------------------------------------------------------------


def _tls_outsider(tls_dir: str):
    def attack(config: Config, work: pathlib.Path) -> dict:
        """Without a client certificate a stranger cannot even reach the dealer's service."""
        ca = (pathlib.Path(tls_dir) / "ca.pem").read_bytes()
        creds = grpc.ssl_channel_credentials(root_certificates=ca)
        channel = grpc.secure_channel(config.dealer, creds, GRPC_OPTIONS + [
            ("grpc.ssl_target_name_override", "dealer")])
        try:
            stub = pb_grpc.DealerStub(channel)
            try:
                stub.Correlations(_outsider_batch(config.session, 0, os.urandom(32)), timeout=60)
                return {"code": "OK"}
            except grpc.RpcError as e:
                return {"code": e.code().name}
        finally:
            channel.close()
    return attack


@pytest.fixture(scope="module")
def with_tls(tmp_path_factory):
    tls_dir = tmp_path_factory.mktemp("certs")
    certs.generate(tls_dir, parties=2)
    return _run_session(tmp_path_factory.mktemp("tls"), "tls", tls_dir=str(tls_dir),
                        outsider=_tls_outsider(str(tls_dir)))


def test_c_with_tls_party1_is_refused_by_certificate_and_rank0_by_the_ledger(with_tls):
    assert with_tls[0]["err"] <= 1e-3 and with_tls[0]["after"] <= 1e-3
    assert "PERMISSION_DENIED" in with_tls[1]["trunc_at_triple"]
    assert "already answered" in with_tls[0]["trunc_at_triple"]  # a deviating rank 0
    assert with_tls["audit"]["batches_refused"] == 2
    assert with_tls["outsider"]["code"] == "UNAVAILABLE"  # no client certificate: no service
