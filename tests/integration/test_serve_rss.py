"""`crypten-lite serve --protocol rss`: 3 replicated parties, no dealer; the client sends each
party its pair of components. Answers against torch; shares of different shapes at the
parties fail for that client only."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal

import grpc
import numpy as np
import pytest
import torch

from serve_service import Service
from crypten_lite.serve.server import build_model

TOL = 2e-2


@pytest.fixture(scope="module")
def rss_service(tmp_path_factory):
    s = Service(tmp_path_factory.mktemp("serve-rss") / "state", "--model", "lenet",
                "--protocol", "rss", "--max-batch", "4")
    yield s
    s.stop()


def test_rss_prediction_and_mismatch(rss_service):
    model, _ = build_model("lenet")
    x = np.random.default_rng(4).standard_normal((2, 1, 28, 28))
    with torch.no_grad():
        want = model(torch.tensor(x, dtype=torch.float32)).numpy()
    with rss_service.client() as good, rss_service.client() as bad:
        assert [i.protocol for i in good.info()] == ["rss"] * 3
        one, two = bad.requests_for(x[:1], 120.0), bad.requests_for(x, 120.0)
        two[2].request_id = one[0].request_id
        reqs = [one[0], one[1], two[2]]  # party 2 gets 2 samples, the others 1
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            ok = ex.submit(good.predict, x, 120.0)
            futs = [ex.submit(bad._stubs[r].Predict, q, metadata=bad.metadata(r), timeout=120)
                    for r, q in enumerate(reqs)]
            np.testing.assert_allclose(ok.result(), want, atol=TOL)
            for f in futs:
                with pytest.raises(grpc.RpcError) as e:
                    f.result()
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "different shapes" in e.value.details()


def test_two_stop_signals_end_the_service_cleanly(rss_service):
    """SIGINT and SIGTERM back to back (a terminal's Ctrl-C while `timeout` or a process manager
    sends TERM too): the supervisor stops every child once, exits 0 and prints no traceback.
    Runs last in this module: it ends the module's service."""
    proc = rss_service.proc
    pids = json.loads((rss_service.state / "pids.json").read_text())["all"]
    os.kill(proc.pid, signal.SIGINT)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(120) == 0, rss_service.output()  # a hang guard only
    log = (rss_service.state.parent / f"{rss_service.state.name}-supervisor.log").read_text()
    assert "Traceback" not in log, log
    for pid in pids:  # every child was stopped and reaped by the supervisor
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
