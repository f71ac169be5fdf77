"""Faults, repeated (issue 7): 20 kills mid-protocol, start order, a new session after a crash.

Every party and dealer here is a real process running the container entrypoint
(`crypten-lite party SCRIPT` / `crypten-lite dealer`, i.e. `crypten_lite.cli.main`). To fit
60 process starts in a test run they are forked from one "zygote" that has imported torch
once. It never imports grpc (nor crypten_lite, which does): gRPC state does not survive a
fork, so each child imports it and builds its own server and channels (docs/design.md section 6).
The
zygote's command line holds a unique marker, so every child's /proc/PID/cmdline does too:
that is how leftovers are found (not by the script's path, which other test runs may be
using at the same moment).

Each child's output lines are stamped with CLOCK_MONOTONIC (shared by every process on the
machine), so "kill to error" is the survivor's error line minus the moment of the SIGKILL.
The figures are printed as `FAULTS {json}` (pytest -s); docs/deployment.md quotes them.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import secrets
import select
import signal
import statistics
import subprocess
import sys
import time

import pytest

from crypten_lite.mpc.launcher import free_ports

SCRIPTS = pathlib.Path(__file__).resolve().parent / "scripts"
VICTIM = SCRIPTS / "victim.py"
ARITH = SCRIPTS / "arith.py"
ROUNDS = int(os.environ.get("FAULT_ROUNDS", "20"))
# CRYPTEN_LITE_TIMEOUT of every session here. A dead peer is seen at once (its stream ends);
# the timeout only bounds a survivor that missed the death, which then reports the timeout
# error (counted as wrong). Large, so that no correct wait ever reaches it under load.
TIMEOUT = 60.0
HANG = TIMEOUT + 60.0  # hang guard: a survivor still running this long after the kill is hung

ZYGOTE = r'''
import io, json, os, select, sys, threading, time, traceback
import torch  # the slow import, done once; grpc is imported by each child after the fork
# The first operation on meta tensors (the dealer's shape inference) imports torch._dynamo.
torch.empty(2, device="meta") * torch.empty(2, device="meta")
assert "grpc" not in sys.modules and threading.active_count() == 1

class Stamped(io.TextIOBase):
    """Each line written goes out as 'MONOTONIC_TIME line' (unbuffered)."""
    def __init__(self, fd):
        self.fd, self.pending = fd, ""
    def writable(self):
        return True
    def write(self, text):
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            os.write(self.fd, f"{time.monotonic():.6f} {line}\n".encode())
        return len(text)
    def flush(self):
        pass

def child(request):
    fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    sys.stdout = sys.stderr = Stamped(1)
    os.environ.clear()
    os.environ.update(request["env"])
    try:
        import crypten_lite.cli
        code = crypten_lite.cli.main(request["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.exit(code)  # a normal exit: atexit hooks close the session, as in a real process

def serve():
    print(json.dumps({"event": "ready", "pid": os.getpid()}), flush=True)
    buffer = b""
    while True:
        readable, _, _ = select.select([0], [], [], 0.01)
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            print(json.dumps({"event": "exit", "pid": pid,
                              "code": os.waitstatus_to_exitcode(status),
                              "time": time.monotonic()}), flush=True)
        if not readable:
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            return
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                child(request)
            print(json.dumps({"event": "started", "id": request["id"], "pid": pid}), flush=True)

serve()
'''


class Zygote:
    """Forks party and dealer processes on request; reports their pids and exit codes."""

    def __init__(self, folder: pathlib.Path):
        self.marker = f"cl-faults-{secrets.token_hex(4)}"
        self.folder = folder
        script = folder / "zygote.py"
        script.write_text(ZYGOTE)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CRYPTEN_LITE_")}
        # The marker in argv shows in every forked child's /proc/PID/cmdline.
        # Unbuffered: select() must see every event line still unread (a buffered reader
        # could hold lines that select() no longer reports).
        self.proc = subprocess.Popen([sys.executable, str(script), self.marker], bufsize=0,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                     cwd=SCRIPTS.parents[2])
        self.exits: dict[int, tuple[int, float]] = {}
        self.spawned: list[int] = []
        self.count = 0
        assert self._event(timeout=120)["event"] == "ready"

    def _event(self, timeout: float) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError("the zygote did not answer")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the zygote exited")
        event = json.loads(line)
        if event["event"] == "exit":
            self.exits[event["pid"]] = (event["code"], event["time"])
        return event

    def spawn(self, name: str, argv: list[str], env: dict[str, str]) -> tuple[int, pathlib.Path]:
        """Start `crypten-lite ARGV` with `env`; (pid, log file)."""
        self.count += 1
        log = self.folder / f"{self.count:03d}-{name}.log"
        base = {k: v for k, v in os.environ.items() if not k.startswith("CRYPTEN_LITE_")}
        request = {"id": self.count, "argv": argv, "env": {**base, **env}, "log": str(log)}
        data = memoryview((json.dumps(request) + "\n").encode())
        while data:  # a raw pipe may take a large write in parts
            data = data[self.proc.stdin.write(data):]
        while True:
            event = self._event(timeout=30)
            if event["event"] == "started" and event["id"] == self.count:
                self.spawned.append(event["pid"])
                return event["pid"], log

    def wait(self, pids: list[int], timeout: float) -> dict[int, tuple[int, float]]:
        """{pid: (exit code, monotonic exit time)} of those that exited within `timeout`."""
        deadline = time.monotonic() + timeout
        while any(p not in self.exits for p in pids) and time.monotonic() < deadline:
            try:
                self._event(timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                break
        return {p: self.exits[p] for p in pids if p in self.exits}

    def close(self) -> list[int]:
        """Wait for every child (20 s), kill those still running; returns their pids."""
        self.wait(self.spawned, timeout=20)
        stuck = [p for p in self.spawned if p not in self.exits]
        for pid in stuck:
            os.kill(pid, signal.SIGKILL)
        self.wait(stuck, timeout=10)
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return stuck


def leftovers(marker: str, exclude: set[int] = frozenset()) -> list[int]:
    """Pids whose command line holds `marker` (a /proc scan, no psutil)."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry.name))
    return found


def lines(log: pathlib.Path) -> list[tuple[float, str]]:
    out = []
    try:
        text = log.read_text()
    except FileNotFoundError:  # the child has not opened its log yet
        return []
    for raw in text.splitlines():
        stamp, _, text = raw.partition(" ")
        try:
            out.append((float(stamp), text))
        except ValueError:
            out.append((0.0, raw))
    return out


def wait_for_line(log: pathlib.Path, text: str, timeout: float) -> float | None:
    deadline = time.monotonic() + timeout
    while True:
        for stamp, line in lines(log):
            if text in line:
                return stamp
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.005)


def session_env(ports: list[int], session: str, timeout: float = TIMEOUT) -> tuple[list[dict], dict]:
    """Environments of 2 parties and the dealer on fixed loopback ports."""
    common = {"CRYPTEN_LITE_WORLD_SIZE": "2",
              "CRYPTEN_LITE_PARTIES": f"127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}",
              "CRYPTEN_LITE_DEALER": f"127.0.0.1:{ports[2]}", "CRYPTEN_LITE_PROVIDER": "dealer",
              "CRYPTEN_LITE_SESSION": session, "CRYPTEN_LITE_TIMEOUT": str(timeout),
              "PYTHONUNBUFFERED": "1"}
    return [dict(common, CRYPTEN_LITE_RANK=str(r)) for r in range(2)], common


@pytest.fixture(scope="module")
def zygote(tmp_path_factory):
    z = Zygote(tmp_path_factory.mktemp("faults"))
    yield z
    assert z.close() == [], "processes still running 20 s after their test"
    assert leftovers(z.marker) == [], "processes left behind after the zygote exited"


@pytest.fixture(scope="module")
def ports():
    return free_ports(3)


def run_session(zygote: Zygote, ports: list[int], session: str, script: pathlib.Path,
                args: list[str], order: list[tuple[str, float]], timeout: float = TIMEOUT):
    """Start the dealer and both parties in `order` ((name, delay before it) pairs)."""
    party_envs, dealer_env = session_env(ports, session, timeout)
    pids, logs = {}, {}
    for name, delay in order:
        time.sleep(delay)
        if name == "dealer":
            pids[name], logs[name] = zygote.spawn(name, ["dealer"], dealer_env)
        else:
            rank = int(name[-1])
            pids[name], logs[name] = zygote.spawn(name, ["party", str(script), *args],
                                                  party_envs[rank])
    return pids, logs


def stop_dealer(zygote: Zygote, pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    if pid not in zygote.wait([pid], timeout=10):
        os.kill(pid, signal.SIGKILL)
        zygote.wait([pid], timeout=10)


LANES = 3  # sets of ports used in turn: a round's processes wind down during the next ones


@pytest.fixture(scope="module")
def lanes():
    return [free_ports(3) for _ in range(LANES)]


class Round:
    """One session of the kill loop: its processes, who died, when."""

    def __init__(self, index: int, pids: dict[str, int], logs: dict[str, pathlib.Path], dead: int):
        self.index, self.pids, self.logs, self.dead = index, pids, logs, dead
        self.survivor = 1 - dead
        self.killed_at = 0.0


def finish_round(zygote: Zygote, r: Round) -> dict:
    """Wait for a round's processes; its outcome (hang, wrong error, kill to error)."""
    party = [r.pids["party0"], r.pids["party1"]]
    exits = zygote.wait(party, timeout=max(0.0, r.killed_at + HANG - time.monotonic()))
    hung = party[r.survivor] not in exits
    if hung:
        os.kill(party[r.survivor], signal.SIGKILL)
        zygote.wait(party, timeout=10)
    if r.pids["dealer"] not in zygote.wait([r.pids["dealer"]], timeout=10):
        os.kill(r.pids["dealer"], signal.SIGKILL)
        zygote.wait([r.pids["dealer"]], timeout=10)
    assert exits.get(party[r.dead], (None,))[0] == -signal.SIGKILL, r.logs[f"party{r.dead}"].read_text()
    text = r.logs[f"party{r.survivor}"].read_text()
    error = wait_for_line(r.logs[f"party{r.survivor}"], "CommunicationError after", 0.0)
    line = next((t for _, t in lines(r.logs[f"party{r.survivor}"]) if "CommunicationError after" in t), "")
    outcome = {"hung": hung, "wrong": None, "seconds": None}
    if not hung:
        # The error names the dead party and is not the timeout (the survivor saw the death).
        if (error is None or f"party {r.dead}" not in line.split(": ", 1)[-1] or "CRYPTEN_LITE_TIMEOUT" in line
                or exits[party[r.survivor]][0] != 3):
            outcome["wrong"] = text[-2000:]
        else:
            outcome["seconds"] = error - r.killed_at
    return outcome


@pytest.mark.slow
def test_kill_a_party_mid_protocol_repeatedly(zygote, lanes):
    """SIGKILL party 0 or party 1 (in turn) in the middle of multiplications, ROUNDS times.

    The parties multiply in an endless loop (victim.py loop), so every kill lands inside the
    protocol whatever the machine's load: the random delay after both are warm only varies
    where. Each round is a new session on the same ports as LANES rounds before (sets of
    ports used in turn let a round's survivor and dealer wind down while the next rounds run)."""
    rng = random.Random(11)
    order = [("dealer", 0.0), ("party0", 0.0), ("party1", 0.0)]
    outcomes, pending = [], {}
    start = time.monotonic()
    for i in range(ROUNDS):
        lane = i % LANES
        if lane in pending:  # the previous round on these ports must be over
            outcomes.append(finish_round(zygote, pending.pop(lane)))
        pids, logs = run_session(zygote, lanes[lane], f"faults-{zygote.marker}-{i}", VICTIM,
                                 ["loop"], order)
        r = Round(i, pids, logs, dead=i % 4 // 2)  # rank 0 twice, then rank 1 twice...
        for rank in range(2):
            assert wait_for_line(logs[f"party{rank}"], "warm", 300) is not None, \
                logs[f"party{rank}"].read_text()
        time.sleep(rng.uniform(0.0, 0.2))  # somewhere in the endless multiplications
        r.killed_at = time.monotonic()
        os.kill(pids[f"party{r.dead}"], signal.SIGKILL)
        # The survivor reports the error, then winds down while the next round starts.
        wait_for_line(logs[f"party{r.survivor}"], "CommunicationError after", HANG)
        os.kill(pids["dealer"], signal.SIGTERM)
        pending[lane] = r
    for lane in sorted(pending):
        outcomes.append(finish_round(zygote, pending.pop(lane)))
    elapsed = time.monotonic() - start
    assert leftovers(zygote.marker, exclude={zygote.proc.pid}) == []
    hangs = sum(o["hung"] for o in outcomes)
    wrong = [o["wrong"] for o in outcomes if o["wrong"]]
    times = [o["seconds"] for o in outcomes if o["seconds"] is not None]
    assert hangs == 0
    assert wrong == [], wrong
    assert len(times) == ROUNDS
    figures = {"rounds": ROUNDS, "mid_protocol": len(times), "hangs": hangs, "leftovers": 0,
               "kill_to_error_ms": {"min": round(1000 * min(times), 1),
                                    "median": round(1000 * statistics.median(times), 1),
                                    "max": round(1000 * max(times), 1)},
               "timeout_s": TIMEOUT, "loop_s": round(elapsed, 1)}
    print("FAULTS " + json.dumps(figures), flush=True)


@pytest.mark.parametrize("order", [
    [("party1", 0.0), ("party0", 3.0), ("dealer", 0.0)],
    [("dealer", 0.0), ("party0", 0.0), ("party1", 3.0)],
    [("party0", 0.0), ("party1", 2.0), ("dealer", 2.0)],
], ids=["party1-then-party0-and-dealer", "party1-last", "dealer-last"])
def test_peers_started_seconds_apart_connect(zygote, order):
    pids, logs = run_session(zygote, free_ports(3), f"order-{zygote.marker}-{secrets.token_hex(2)}",
                             ARITH, [], order)
    parties = [pids["party0"], pids["party1"]]
    exits = zygote.wait(parties, timeout=HANG)
    os.kill(pids["dealer"], signal.SIGTERM)  # reaped (or found stuck) when the module ends
    for rank in range(2):
        text = logs[f"party{rank}"].read_text()
        assert exits.get(parties[rank], (None,))[0] == 0, text
        assert "result [4.5, -10.0, 0.0]" in text


def test_new_session_on_the_same_ports_after_a_crash(zygote, ports):
    order = [("dealer", 0.0), ("party0", 0.0), ("party1", 0.0)]
    pids, logs = run_session(zygote, ports, f"crash-{zygote.marker}", VICTIM, ["1"], order)
    exits = zygote.wait([pids["party0"], pids["party1"]], timeout=HANG + 30)
    stop_dealer(zygote, pids["dealer"])
    assert exits[pids["party1"]][0] == -signal.SIGKILL
    assert exits[pids["party0"]][0] == 3, logs["party0"].read_text()
    # Same ports, a new session, started at once: it binds and computes.
    pids, logs = run_session(zygote, ports, f"after-{zygote.marker}", ARITH, [], order)
    exits = zygote.wait([pids["party0"], pids["party1"]], timeout=HANG)
    stop_dealer(zygote, pids["dealer"])
    for rank in range(2):
        text = logs[f"party{rank}"].read_text()
        assert exits[pids[f"party{rank}"]][0] == 0 and "result [4.5, -10.0, 0.0]" in text, text
