"""A party killed (SIGKILL) under load: the service restarts, every party reloads its own
saved weight shares (not shared again), clients retry transparently, no answer is wrong.
Over TLS (certificates from `crypten-lite certs`, made by the local form)."""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time

import numpy as np
import pytest
import torch

from serve_service import Service
from crypten_lite_client import ClientError
from crypten_lite.serve.server import build_model

TOL = 2e-2
GUARD = 900.0  # hang guard only; every step waits for a condition


def _wait(cond, what: str) -> None:
    end = time.monotonic() + GUARD
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.1)


@pytest.mark.slow
def test_kill_party_under_load_restarts_from_saved_shares(tmp_path):
    svc = Service(tmp_path / "state", "--model", "lenet", "--tls", "--max-batch", "8")
    try:
        model, _ = build_model("lenet")
        xs = np.random.default_rng(1).standard_normal((6, 1, 1, 28, 28))
        with torch.no_grad():
            ys = [model(torch.tensor(x, dtype=torch.float32)).numpy() for x in xs]
        counts = {"answered": 0, "wrong": 0}
        failures: list[str] = []
        lock, stop = threading.Lock(), threading.Event()

        def worker(i: int) -> None:
            with svc.client(timeout=GUARD) as c:
                k = i
                while not stop.is_set():
                    try:
                        out = c.predict(xs[k % 6], timeout=GUARD)
                    except ClientError as e:
                        with lock:
                            failures.append(f"{e.code}: {e}")
                        continue
                    with lock:
                        counts["answered" if np.allclose(out, ys[k % 6], atol=TOL) else "wrong"] += 1
                    k += 1

        shares = {p: hashlib.sha256(p.read_bytes()).hexdigest()
                  for p in sorted((tmp_path / "state").glob("shares-party*.bin"))}
        assert len(shares) == 2
        assert all("reloaded=0" in (tmp_path / "state" / f"ready-party{r}").read_text() for r in range(2))
        threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(3)]
        for t in threads:
            t.start()
        _wait(lambda: counts["answered"] >= 3, "answers before the kill")
        os.kill(svc.party_pids()[1], signal.SIGKILL)
        _wait(lambda: svc.party_pids() and __import__("json").loads(
            (tmp_path / "state" / "pids.json").read_text())["epoch"] >= 1
            and all((tmp_path / "state" / f"ready-party{r}").exists() for r in range(2)),
            "the restarted service")
        after = counts["answered"]
        _wait(lambda: counts["answered"] >= after + 3, "answers after the restart")
        stop.set()
        for t in threads:
            t.join(GUARD)
        assert counts["wrong"] == 0
        assert failures == [], failures
        assert all("reloaded=1" in (tmp_path / "state" / f"ready-party{r}").read_text() for r in range(2))
        assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in shares} == shares
        # TLS: a client that does not verify with the service's CA gets no answer
        from crypten_lite_client import Client
        with Client(svc.conn["endpoints"], svc.conn["token"], tls=None, timeout=3) as plain:
            with pytest.raises(ClientError):
                plain.predict(xs[0])
    except BaseException:
        print(svc.output())
        raise
    finally:
        svc.stop()
