"""Load on `crypten-lite serve`: throughput and latency against concurrent clients, and a run
that kills a party mid-load and lets the service restart from its saved shares.

    python benchmarks/serve_load.py                       # LeNet, 64 clients; kill-and-restart
    python benchmarks/serve_load.py --models lenet,resnet18 --clients 1,8,16,64 --tls both \
        --out docs/serve_load.jsonl --plot docs/serve_latency.svg

It starts the local service (supervisor, dealer, parties) for each (model, TLS) setting and
drives it with N clients, each with its own token, its own connections and fresh shares for
every request (the torch-free client/, by default its AsyncClient: all N in one event loop,
so that the load generator costs the 2-core machine little; --driver threads: one thread and
one Client each), each predicting one sample at a time in a loop for --seconds. Every answer is checked against
torch's forward of the same input (`wrong` counts answers off by more than the fixed-point
tolerance). One JSON line per run: model, clients, tls, throughput (predictions/s), p50_ms,
p99_ms, answered, failed, wrong, and the service's batch statistics.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "client"))
from crypten_lite_client import AsyncClient, Client, ClientError  # noqa: E402

from crypten_lite.serve.server import build_model, token_digest  # noqa: E402

TOL = 2e-2
MAX_CLIENTS = 256


class Service:
    """The local form in its own process group (stopped, with every child, on exit)."""

    def __init__(self, model: str, tls: bool, max_batch: int, protocol: str = "additive",
                 compare_bits: int = 64, max_wait: float = 0.25):
        self.state = pathlib.Path(tempfile.mkdtemp(prefix="serve-load-"))
        # One token per client (each load-generating client authenticates as itself).
        self.tokens = [secrets.token_urlsafe(32) for _ in range(MAX_CLIENTS)]
        (self.state / "tokens.txt").write_text("".join(
            f"load{i}:{token_digest(t)}\n" for i, t in enumerate(self.tokens)))
        cmd = [sys.executable, "-m", "crypten_lite.cli", "serve", "--model", model,
               "--tokens", str(self.state / "tokens.txt"),
               "--state-dir", str(self.state), "--max-batch", str(max_batch),
               "--protocol", protocol, "--compare-bits", str(compare_bits),
               "--max-wait", str(max_wait)] + (["--tls"] if tls else [])
        env = {k: v for k, v in os.environ.items() if not k.startswith("CRYPTEN_LITE_")}
        self.log = open(self.state / "supervisor.log", "w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        end = time.monotonic() + 900
        while not (self.state / "client.json").exists():
            if self.proc.poll() is not None or time.monotonic() > end:
                raise SystemExit(f"serve did not start; see {self.state}")
            time.sleep(0.2)
        self.conn = json.loads((self.state / "client.json").read_text())
        with self.client() as c:
            c.wait_ready(900)

    def client(self, i: int = 0) -> Client:
        return Client(self.conn["endpoints"], self.tokens[i], tls=self.conn["ca"], timeout=120)

    def aio_client(self, i: int) -> AsyncClient:
        return AsyncClient(self.conn["endpoints"], self.tokens[i], tls=self.conn["ca"], timeout=120)

    def pids(self) -> dict:
        return json.loads((self.state / "pids.json").read_text())

    def cpu_seconds(self) -> dict:
        """CPU seconds (user + system) so far of each service process and of this load
        generator (Linux /proc; {} elsewhere): dealer, party0, party1, ..., loadgen."""
        try:
            pids = self.pids()
            tick = os.sysconf("SC_CLK_TCK")
            out = {}
            parties = pids["parties"]
            for pid in pids["all"]:
                name = f"party{parties.index(pid)}" if pid in parties else "dealer"
                fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
                out[name] = (int(fields[11]) + int(fields[12])) / tick
            t = os.times()
            out["loadgen"] = t.user + t.system
            out["epoch"] = pids["epoch"]  # a restart replaces the processes
            return out
        except (OSError, ValueError, KeyError, AttributeError):
            return {}

    def metrics(self) -> dict:
        with self.client() as c:
            return json.loads(c.wait_ready(900)[0].metrics_json)

    def stop(self) -> None:
        pids = self.pids().get("all", []) if (self.state / "pids.json").exists() else []
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        for pid in [self.proc.pid, *pids]:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.proc.wait()
        shutil.rmtree(self.state, ignore_errors=True)  # saved shares, logs


def drive(service: Service, model: str, clients: int, seconds: float, sample_shape, refs,
          until=None, driver: str = "aio") -> dict:
    """`clients` clients, each with its own token and its own shares, predicting one sample at
    a time in a loop for `seconds` (or until `until()` returns); statistics of the window.
    driver "aio": every client an AsyncClient in one event loop (a cheap load generator on a
    machine it shares with the service); "threads": one thread and one Client each."""
    xs, ys = refs
    lat, errors = [], []
    counts = {"answered": 0, "failed": 0, "wrong": 0}

    def record(out, y, dt, err) -> None:
        if err is not None:
            counts["failed"] += 1
            errors.append(f"{err.code}: {str(err)[:160]}")
        elif np.allclose(out, y, atol=TOL):
            counts["answered"] += 1
            lat.append(dt)
        else:
            counts["wrong"] += 1

    before = service.metrics()
    cpu_before = service.cpu_seconds()
    t0 = time.perf_counter()
    if driver == "aio":
        asyncio.run(_drive_aio(service, clients, seconds, refs, until, record))
    else:
        _drive_threads(service, clients, seconds, refs, until, record)
    elapsed = time.perf_counter() - t0
    cpu_after = service.cpu_seconds()
    after = service.metrics()
    lat.sort()
    pct = lambda p: round(1000 * lat[min(len(lat) - 1, len(lat) * p // 100)], 1) if lat else None  # noqa: E731
    batches = after["batches"] - before["batches"] if after["batches"] >= before["batches"] else after["batches"]
    answered_srv = after["answered"] - before["answered"] if after["answered"] >= before["answered"] else after["answered"]
    return {"model": model, "clients": clients, "driver": driver,
            "throughput": round(counts["answered"] / elapsed, 1),
            "p50_ms": pct(50), "p99_ms": pct(99), **counts, "seconds": round(elapsed, 1),
            "mean_batch": round(answered_srv / batches, 1) if batches else None,
            # CPU milliseconds per answered prediction, by process (where a request's time goes)
            "cpu_ms_per_prediction": {k: round(1000 * (cpu_after[k] - cpu_before.get(k, 0.0))
                                               / max(1, counts["answered"]), 2)
                                      for k in cpu_after if k in cpu_before and k != "epoch"}
            if cpu_after.get("epoch") == cpu_before.get("epoch") else {},
            "errors": sorted(set(errors)),
            # the machine's 1-minute load average at the end (the run itself adds about 2)
            "load_avg": round(os.getloadavg()[0], 1)}


async def _drive_aio(service: Service, clients: int, seconds: float, refs, until, record) -> None:
    xs, ys = refs
    stop = asyncio.Event()

    async def worker(i: int) -> None:
        async with service.aio_client(i) as c:
            k = i
            while not stop.is_set():
                x, y = xs[k % len(xs)], ys[k % len(xs)]
                k += clients
                t0 = time.perf_counter()
                try:
                    out = await c.predict(x[None], timeout=60)
                    record(out[0], y, time.perf_counter() - t0, None)
                except ClientError as e:
                    record(None, y, 0.0, e)

    tasks = [asyncio.ensure_future(worker(i)) for i in range(clients)]
    if until is not None:
        await asyncio.get_running_loop().run_in_executor(None, until)
    else:
        await asyncio.sleep(seconds)
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 180)


def _drive_threads(service: Service, clients: int, seconds: float, refs, until, record) -> None:
    xs, ys = refs
    lock = threading.Lock()
    stop = threading.Event()

    def worker(i: int) -> None:
        with service.client(i) as c:
            k = i
            while not stop.is_set():
                x, y = xs[k % len(xs)], ys[k % len(xs)]
                k += clients
                t0 = time.perf_counter()
                try:
                    out, err = c.predict(x[None], timeout=60)[0], None
                except ClientError as e:
                    out, err = None, e
                with lock:
                    record(out, y, time.perf_counter() - t0, err)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    if until is not None:
        until()
    else:
        time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(180)


def references(model: str, n: int = 32):
    m, shape = build_model(model)
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((n, *shape))
    with torch.no_grad():
        ys = m(torch.tensor(xs, dtype=torch.float32)).numpy()
    return shape, (xs, ys)


def kill_restart(service: Service, model: str, clients: int, seconds: float, refs, shape,
                 driver: str = "aio") -> dict:
    """Kill party 1 (SIGKILL) a third into the run; run until the restarted service has
    answered for another third."""
    state = {}

    def killer():
        time.sleep(seconds / 3)
        pid = service.pids()["parties"][1]
        state["killed_at"] = time.perf_counter()
        os.kill(pid, signal.SIGKILL)

    def until():
        end = time.monotonic() + 900
        while time.monotonic() < end:
            try:
                if service.pids()["epoch"] >= 1 and (service.state / "ready-party1").exists():
                    break
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.2)
        state["back_at"] = time.perf_counter()
        time.sleep(seconds / 3)

    threading.Thread(target=killer, daemon=True).start()
    row = drive(service, model, clients, seconds, shape, refs, until=until, driver=driver)
    row["run"] = "kill_restart"
    row["restart_s"] = round(state["back_at"] - state["killed_at"], 1) if "killed_at" in state else None
    return row


def plot(rows: list[dict], path: str) -> None:
    """A small SVG of p50/p99 latency against concurrent clients (no plotting library)."""
    series = {}
    for r in rows:
        if r.get("run") == "load" and r["p50_ms"] is not None:
            series.setdefault((r["model"], r.get("protocol", "additive"), r["tls"], _setup(r)),
                              []).append(r)
    W, H, L, B = 640, 400, 70, 50
    ymax = max((r["p99_ms"] for s in series.values() for r in s), default=1) * 1.1
    xs = sorted({r["clients"] for s in series.values() for r in s}) or [1]
    lx = lambda c: L + (W - L - 20) * (np.log2(c) / max(1, np.log2(max(xs))))  # noqa: E731
    ly = lambda v: H - B - (H - B - 20) * v / ymax  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<line x1="{L}" y1="{H-B}" x2="{W-20}" y2="{H-B}" stroke="black"/>',
           f'<line x1="{L}" y1="20" x2="{L}" y2="{H-B}" stroke="black"/>',
           f'<text x="{W/2}" y="{H-10}" text-anchor="middle">concurrent clients</text>',
           f'<text x="15" y="{H/2}" transform="rotate(-90 15 {H/2})" text-anchor="middle">latency (ms)</text>']
    for c in xs:
        out.append(f'<text x="{lx(c):.0f}" y="{H-B+16}" text-anchor="middle">{c}</text>')
    for k in range(5):
        v = ymax * k / 4
        out.append(f'<text x="{L-5}" y="{ly(v)+4:.0f}" text-anchor="end">{v:.0f}</text>')
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
    for i, ((model, protocol, tls, setup), rs) in enumerate(sorted(series.items())):
        rs = sorted(rs, key=lambda r: r["clients"])
        for key, dash in (("p50_ms", ""), ("p99_ms", ' stroke-dasharray="5,4"')):
            pts = " ".join(f"{lx(r['clients']):.1f},{ly(r[key]):.1f}" for r in rs)
            out.append(f'<polyline points="{pts}" fill="none" stroke="{colors[i % 6]}" stroke-width="2"{dash}/>')
            out += [f'<circle cx="{lx(r["clients"]):.1f}" cy="{ly(r[key]):.1f}" r="3" '
                    f'fill="{colors[i % 6]}"/>' for r in rs]
        out.append(f'<text x="{L+10}" y="{30+16*i}" fill="{colors[i % 6]}">{model} {protocol}'
                   f'{" TLS" if tls else ""} ({setup}): p50 solid, p99 dashed</text>')
    out.append("</svg>")
    pathlib.Path(path).write_text("\n".join(out) + "\n")


BEGIN, END = "<!-- serve-figures -->", "<!-- /serve-figures -->"


def _setup(r: dict) -> str:
    """How a row's service pooled and how its clients were driven (rows written before
    --compare-bits and --driver existed: all-pairs pooling, one thread per client)."""
    pooling = f"tree pools, {r['compare_bits']}-bit" if "compare_bits" in r else "all-pairs pools"
    return f"{pooling}, {r.get('driver', 'threads')} clients"


def table(rows: list[dict]) -> str:
    """The Markdown table of docs/serving.md (between BEGIN and END) from the JSON rows."""
    out = [BEGIN, "| run | model | protocol | setup | TLS | clients | predictions/s | p50 ms | p99 ms | "
                  "mean batch | answered | failed | wrong |", "| --- " * 13 + "|"]
    for r in rows:
        extra = f" (restart {r['restart_s']} s)" if r.get("run") == "kill_restart" else ""
        out.append(f"| {r.get('run', 'load')}{extra} | {r['model']} | {r.get('protocol', 'additive')} | "
                   f"{_setup(r)} | "
                   f"{'yes' if r['tls'] else 'no'} | {r['clients']} | {r['throughput']} | {r['p50_ms']} | "
                   f"{r['p99_ms']} | {r['mean_batch']} | {r['answered']} | {r['failed']} | {r['wrong']} |")
    return "\n".join(out + [END])


def write_doc(rows: list[dict], path: str) -> None:
    """Replace the figures between BEGIN and END in `path` (or the FIGURES_TABLE marker)."""
    text = pathlib.Path(path).read_text()
    if BEGIN in text:
        text = text[:text.index(BEGIN)] + table(rows) + text[text.index(END) + len(END):]
    else:
        text = text.replace("FIGURES_TABLE", table(rows))
    pathlib.Path(path).write_text(text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="lenet")
    p.add_argument("--clients", default="64", help="comma-separated client counts")
    p.add_argument("--tls", choices=("off", "on", "both"), default="off")
    p.add_argument("--seconds", type=float, default=20.0, help="measured seconds per run")
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--protocol", choices=("additive", "rss"), default="additive",
                   help="additive: 2 parties + dealer; rss: 3 parties, no dealer")
    p.add_argument("--compare-bits", type=int, choices=(32, 64), default=64,
                   help="the service's --compare-bits (default 64, the service's own default: "
                        "exact for every input; 32 is the opt-in that is exact only while the "
                        "pooled activations stay below 2^14, as LeNet's do on these inputs: every "
                        "answer is checked against torch either way)")
    p.add_argument("--max-wait", type=float, default=0.25, help="the service's --max-wait")
    p.add_argument("--driver", choices=("aio", "threads"), default="aio",
                   help="aio: every client an AsyncClient in one event loop (default); threads: "
                        "one thread and one Client per client")
    p.add_argument("--kill", choices=("yes", "no"), default="yes", help="add the kill-and-restart run")
    p.add_argument("--kill-clients", type=int, default=16)
    p.add_argument("--out", default="", help="append the JSON lines to this file too")
    p.add_argument("--plot", default="", help="SVG of latency against clients (from --out's rows)")
    p.add_argument("--doc", default="", help="rewrite the figures table of this Markdown file "
                                             "(docs/serving.md) from --out's rows")
    args = p.parse_args(argv)
    rows = []
    tls_modes = {"off": [False], "on": [True], "both": [False, True]}[args.tls]
    for model in args.models.split(","):
        shape, refs = references(model)
        for tls in tls_modes:
            service = Service(model, tls, args.max_batch, args.protocol, args.compare_bits,
                              args.max_wait)
            try:
                for n in [int(c) for c in args.clients.split(",")]:
                    row = {"run": "load", **drive(service, model, n, args.seconds, shape, refs, driver=args.driver),
                           "tls": tls,
                           "protocol": args.protocol,
                           "max_batch": args.max_batch, "compare_bits": args.compare_bits,
                           "cpus": os.cpu_count()}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
                if args.kill == "yes" and model == args.models.split(",")[0] and tls == tls_modes[0]:
                    row = {**kill_restart(service, model, args.kill_clients, args.seconds, refs, shape,
                                          args.driver),
                           "tls": tls, "protocol": args.protocol, "max_batch": args.max_batch,
                           "compare_bits": args.compare_bits, "cpus": os.cpu_count()}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
            finally:
                service.stop()
    if args.out:
        with open(args.out, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    if args.plot:
        allrows = [json.loads(line) for line in open(args.out)] if args.out else rows
        plot(allrows, args.plot)
    if args.doc:
        write_doc([json.loads(line) for line in open(args.out)] if args.out else rows, args.doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
