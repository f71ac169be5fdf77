"""A `crypten-lite serve` service for the serving tests: real processes, real gRPC.

Service(tmp_path, "--model", "lenet", ...) starts the local form (supervisor, dealer, one
server per party) in its own process group, waits until every party is ready (the
torch-free client's Info call) and stop() ends the group: no process is left behind.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
CLIENT_DIR = ROOT / "client"
if str(CLIENT_DIR) not in sys.path:
    sys.path.insert(0, str(CLIENT_DIR))

from crypten_lite_client import Client  # noqa: E402

START_TIMEOUT = 600.0  # a hang guard only: a loaded machine may take minutes to start parties


class Service:
    def __init__(self, state_dir: pathlib.Path, *flags: str, tokens: str = "",
                 client_kw: dict | None = None):
        self.state = pathlib.Path(state_dir)
        self.client_kw = client_kw or {}  # e.g. cert=(pem, key) for a --client-ca service
        cmd = [sys.executable, "-m", "crypten_lite.cli", "serve", "--state-dir", str(self.state), *flags]
        cmd += ["--tokens", tokens] if tokens else []
        env = {k: v for k, v in os.environ.items() if not k.startswith("CRYPTEN_LITE_")}
        self.log = open(self.state.parent / f"{self.state.name}-supervisor.log", "w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            end = time.monotonic() + START_TIMEOUT
            while not (self.state / "client.json").exists():
                if self.proc.poll() is not None or time.monotonic() > end:
                    raise RuntimeError(f"serve did not start: {self.output()}")
                time.sleep(0.2)
            self.conn = json.loads((self.state / "client.json").read_text())
            with self.client() as c:
                c.wait_ready(START_TIMEOUT)
        except BaseException:
            self.stop()
            raise

    def output(self) -> str:
        self.log.flush()
        text = (self.state.parent / f"{self.state.name}-supervisor.log").read_text()
        for f in sorted(self.state.glob("*.log")):
            text += f"\n--- {f.name}\n" + f.read_text()[-4000:]
        return text

    def client(self, token: str | None = None, **kw) -> Client:
        return Client(self.conn["endpoints"], self.conn["token"] if token is None else token,
                      tls=self.conn["ca"], **{**self.client_kw, **kw})

    def party_pids(self) -> list[int]:
        return json.loads((self.state / "pids.json").read_text())["parties"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(60)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        # the children run in process groups of their own: kill any the supervisor left
        pids = (json.loads((self.state / "pids.json").read_text())["all"]
                if (self.state / "pids.json").exists() else [])
        for pid in [self.proc.pid, *pids]:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.proc.wait()
        self.log.close()
