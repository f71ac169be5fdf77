"""`crypten-lite serve` with the torch-free client: 2 additive parties + dealer, real processes,
real gRPC. Answers against torch's forward; every bad request fails for its client alone while
another client's concurrent request succeeds; clients cannot reach each other's outputs."""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import secrets
import subprocess
import sys
import time

import grpc
import numpy as np
import pytest
import torch

from serve_service import CLIENT_DIR, Service
from crypten_lite_client import ClientError
from crypten_lite_client._proto import serve_pb2 as pb
from crypten_lite.serve.server import build_model

TOL = 2e-2  # 16-bit fixed point through LeNet (observed errors are ~1e-4)
MAX_BATCH = 4
TOKENS = {"alice": secrets.token_urlsafe(24), "bob": secrets.token_urlsafe(24)}


def torch_answer(x: np.ndarray) -> np.ndarray:
    model, _ = build_model("lenet")
    with torch.no_grad():
        return model(torch.tensor(x, dtype=torch.float32)).numpy()


def inputs(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 1, 28, 28))


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    d = tmp_path_factory.mktemp("serve")
    tokens = d / "tokens.txt"
    tokens.write_text("".join(f"{c}:{hashlib.sha256(t.encode()).hexdigest()}\n" for c, t in TOKENS.items()))
    s = Service(d / "state", "--model", "lenet", "--max-batch", str(MAX_BATCH), tokens=str(tokens))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def alice(service):
    with service.client(TOKENS["alice"]) as c:
        yield c


@pytest.fixture(scope="module")
def bob(service):
    with service.client(TOKENS["bob"]) as c:
        yield c


def send(client, reqs, timeout: float = 120.0, metadata=None):
    """Send reqs[r] to party r; each party's reply or RpcError."""
    futs = [client._stubs[r].Predict.future(q, metadata=metadata or client.metadata(r), timeout=timeout)
            for r, q in enumerate(reqs)]
    out = []
    for f in futs:
        try:
            out.append(f.result())
        except grpc.RpcError as e:
            out.append(e)
    return out


def test_prediction_matches_torch(alice):
    x = inputs(3, 0)
    np.testing.assert_allclose(alice.predict(x), torch_answer(x), atol=TOL)
    one = alice.predict(x[0])  # one sample without the batch dimension
    assert one.shape == (10,)
    np.testing.assert_allclose(one, torch_answer(x[:1])[0], atol=TOL)


def test_info_is_public_metadata(alice):
    infos = alice.info()
    assert [i.party for i in infos] == [0, 1]
    assert all(i.ready and i.protocol == "additive" and tuple(i.sample_shape) == (1, 28, 28)
               and i.max_batch == MAX_BATCH for i in infos)
    assert len({i.model for i in infos}) == 1 and infos[0].model.startswith("lenet@")


def _bad(kind: str, client):
    """(requests per party, metadata or None, expected status per party, message part)."""
    x = inputs(1, 7)
    reqs = client.requests_for(x, 120.0)
    meta = None
    if kind == "shape":
        for q in reqs:
            del q.shape[:]
            q.shape.extend([1, 1, 27, 28])
        return reqs, meta, ["INVALID_ARGUMENT"] * 2, "does not fit the model"
    if kind == "dtype":
        for q in reqs:
            q.dtype = "float32"
        return reqs, meta, ["INVALID_ARGUMENT"] * 2, "dtype"
    if kind == "precision":
        for q in reqs:
            q.precision = 8
        return reqs, meta, ["INVALID_ARGUMENT"] * 2, "precision"
    if kind == "oversized":
        reqs = client.requests_for(inputs(MAX_BATCH + 1, 7), 120.0)
        return reqs, meta, ["RESOURCE_EXHAUSTED"] * 2, f"1 to {MAX_BATCH} samples"
    if kind == "truncated":  # party 1 refuses it; party 0 never sees party 1 announce it
        reqs = client.requests_for(x, 3.0)
        reqs[1].components[0] = reqs[1].components[0][:-8]
        return reqs, meta, ["DEADLINE_EXCEEDED", "INVALID_ARGUMENT"], ""
    if kind == "different_shapes":  # party 0 gets 1 sample, party 1 gets 2, same request id
        two = client.requests_for(inputs(2, 7), 120.0)
        two[1].request_id = reqs[0].request_id
        return [reqs[0], two[1]], meta, ["INVALID_ARGUMENT"] * 2, "different shapes"
    if kind == "token":
        return reqs, [("authorization", "Bearer not-a-token")], ["UNAUTHENTICATED"] * 2, "token"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["shape", "dtype", "precision", "oversized", "truncated",
                                  "different_shapes", "token"])
def test_bad_request_fails_alone(alice, bob, kind):
    """Each bad request gets a clear error for its client while bob's request succeeds."""
    good_x = inputs(2, 11)
    reqs, meta, codes, words = _bad(kind, alice)
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        good = ex.submit(bob.predict, good_x, 120.0)
        got = send(alice, reqs, metadata=meta)
        np.testing.assert_allclose(good.result(), torch_answer(good_x), atol=TOL)
    for r, (reply, code) in enumerate(zip(got, codes)):
        assert isinstance(reply, grpc.RpcError), f"party {r} answered a bad request ({kind})"
        assert reply.code().name == code, (kind, r, reply.code(), reply.details())
        assert words in reply.details()
    if kind == "different_shapes":
        assert "party 0: (1, 1, 28, 28)" in got[0].details()


def test_nan_and_duplicate_and_cancel(alice, bob):
    x = inputs(1, 3)
    bad = x.copy()
    bad[0, 0, 5, 5] = np.nan
    with pytest.raises(ClientError, match="NaN") as e:
        alice.predict(bad)
    assert e.value.code == "input"
    # the same request id twice at party 0 (the first parked, waiting for party 1's share):
    # the second is refused at once, the first is answered once party 1 gets its share
    reqs = alice.requests_for(x, 60.0)
    metrics = lambda: json.loads(alice.info()[0].metrics_json)  # noqa: E731
    seen, refused = metrics()["requests"], metrics()["errors"].get("duplicate", 0)
    first = alice._stubs[0].Predict.future(reqs[0], metadata=alice.metadata(0), timeout=120)
    while metrics()["requests"] == seen:
        time.sleep(0.05)  # until party 0 has the first (conditions, not time limits)
    dup = alice._stubs[0].Predict.future(reqs[0], metadata=alice.metadata(0), timeout=120)
    while metrics()["errors"].get("duplicate", 0) == refused:
        time.sleep(0.05)  # until party 0 has refused one of the two
    second = alice._stubs[1].Predict(reqs[1], metadata=alice.metadata(1), timeout=120)
    outcomes = []
    for f in (first, dup):  # whichever reached the table first is answered, the other refused
        try:
            outcomes.append(("OK", f.result().computation))
        except grpc.RpcError as err:
            outcomes.append((err.code().name, ""))
    assert sorted(o[0] for o in outcomes) == ["ALREADY_EXISTS", "OK"], outcomes
    assert [c for o, c in outcomes if o == "OK"] == [second.computation]
    # a client that goes away mid-request costs the others nothing
    gone = alice.requests_for(x, 60.0)
    futs = [alice._stubs[r].Predict.future(q, metadata=alice.metadata(r), timeout=60) for r, q in enumerate(gone)]
    for f in futs:
        f.cancel()
    np.testing.assert_allclose(bob.predict(x), torch_answer(x), atol=TOL)


def test_clients_get_only_their_own_output(alice, bob):
    """Bob reusing alice's request id (with his own shares) gets his answer, alice hers; bob
    sending shares under alice's id to one party only gets nothing of alice's."""
    xa, xb = inputs(1, 21), inputs(1, 22)
    ra, rb = alice.requests_for(xa, 60.0), bob.requests_for(xb, 60.0)
    for q in rb:
        q.request_id = ra[0].request_id
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        fa, fb = ex.submit(send, alice, ra), ex.submit(send, bob, rb)
        got_a, got_b = fa.result(), fb.result()

    def value(replies):
        from crypten_lite_client import decode, reconstruct
        shares = [np.frombuffer(r.share, dtype="<u8").reshape(tuple(r.shape)) for r in replies]
        return decode(reconstruct(shares), replies[0].precision)
    np.testing.assert_allclose(value(got_a), torch_answer(xa), atol=TOL)
    np.testing.assert_allclose(value(got_b), torch_answer(xb), atol=TOL)
    # an answer's share alone is re-randomised: the same input twice gives unrelated shares
    again = send(alice, alice.requests_for(xa, 60.0))
    assert again[0].share != got_a[0].share and again[1].share != got_a[1].share
    np.testing.assert_allclose(value(again), value(got_a), atol=TOL)


def test_metrics_count_requests_errors_batches(alice):
    before = json.loads(alice.info()[0].metrics_json)
    reqs = alice.requests_for(inputs(1, 5), 20.0)
    reqs[0].dtype = "float64"
    send(alice, [reqs[0]])  # party 0 only
    alice.predict(inputs(1, 5))
    after = json.loads(alice.info()[0].metrics_json)
    assert after["requests"] == before["requests"] + 2
    assert after["errors"].get("invalid", 0) == before["errors"].get("invalid", 0) + 1
    assert after["answered"] == before["answered"] + 1
    assert after["batches"] >= before["batches"] + 1
    assert after["latency"]["p50_ms"] is not None


def test_batches_after_the_first_of_a_size_run_a_plan(alice):
    """Every batch of a size already planned runs its plan to the end, corrections prefetched
    (the warm-up made the fixed-weight masks, which a model's first forward would otherwise
    draw: a plan recorded on it differs from every later forward, mpc.offline)."""
    for _ in range(2):
        alice.predict(inputs(1, 5))          # the size is planned by now, whatever ran before
    before = json.loads(alice.info()[0].metrics_json)
    for _ in range(3):
        alice.predict(inputs(1, 5))
    after = json.loads(alice.info()[0].metrics_json)
    assert after["batches"] - before["batches"] == 3
    assert after["planned_batches"] - before["planned_batches"] == 3


def test_client_imports_and_predicts_without_torch(service):
    """The client distribution runs with torch blocked (sys.modules['torch'] = None)."""
    code = f"""
import sys, json
sys.modules['torch'] = None
sys.path.insert(0, {str(CLIENT_DIR)!r})
import numpy as np
from crypten_lite_client import Client, encode, split, reconstruct, decode
x = np.random.default_rng(0).standard_normal((2, 1, 28, 28))
assert np.allclose(decode(reconstruct(split(encode(x), 3)), 16), x, atol=2**-16)
with Client({service.conn['endpoints']!r}, {TOKENS['alice']!r}) as c:
    print(json.dumps(c.predict(x).tolist()))
import asyncio
from crypten_lite_client import AsyncClient
async def both():  # asyncio: the two samples as two concurrent requests of one client
    async with AsyncClient({service.conn['endpoints']!r}, {TOKENS['alice']!r}) as c:
        return await asyncio.gather(c.predict(x[0]), c.predict(x[1]))
print(json.dumps([y.tolist() for y in asyncio.run(both())]))
assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None and m.startswith('torch')]
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    x = np.random.default_rng(0).standard_normal((2, 1, 28, 28))
    sync, concurrent = out.stdout.splitlines()
    np.testing.assert_allclose(np.array(json.loads(sync)), torch_answer(x), atol=TOL)
    np.testing.assert_allclose(np.array(json.loads(concurrent)), torch_answer(x), atol=TOL)
