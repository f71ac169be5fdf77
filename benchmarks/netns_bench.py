"""Private workloads across network namespaces on rate-limited links (issue 7).

    sudo python benchmarks/netns_bench.py [--rates unlimited,100mbit,10mbit]
        [--workloads example,matmul_256,lenet_b1,logreg_sgd_step] [--images 16] [--out FILE]

For each rate, the dealer and two parties run in their own network namespaces on a private
LAN (tests/integration/netns.py: 10.77.0.0/24, every host's egress shaped by `tc ... tbf`),
with mutual TLS, exactly as a multi-host deployment would (CRYPTEN_LITE_* variables with
real addresses). Measured per rate:

* ``example``: examples/private_inference.py (a CNN on 8x8 digits, party 0's model, party 1's
  images), parsed from the `online: S s, R rounds, B MB sent by this party` line it prints
  (one run per rate: it trains party 0's model first);
* the named workloads of `crypten-lite bench` (crypten_lite/bench.py), run in one session
  after a warm-up, median of --repeat runs: online seconds, and the offline phase (the
  dealer's corrections fetched ahead) reported apart;
* the round-trip time between the parties' namespaces (TCP ping-pong, median of 200).

One JSON line per (rate, workload) on stdout (and --out): seconds (slowest party), rounds,
bytes sent per party, and the model `rounds x RTT + bytes / bandwidth` next to it. Latency
is only emulated where the kernel has sch_netem (`--delay 20ms`); elsewhere docs/deployment.md
extrapolates with the model. Needs root and iproute2.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO))

import netns  # noqa: E402

PARTY_PORT, DEALER_PORT = 50051, 50050
EXAMPLE = REPO / "examples" / "private_inference.py"
FALLBACK = REPO / "tests" / "integration" / "scripts" / "arith.py"
ONLINE = re.compile(r"online: ([\d.]+) s, (\d+) rounds, ([\d.]+) MB sent")

# Runs the named crypten_lite.bench workloads in one session; one JSON line each.
WORKLOAD_SCRIPT = """
import json, statistics, sys
import crypten_lite
from crypten_lite import bench
crypten_lite.init()
repeat = int(sys.argv[1])
for name in sys.argv[2:]:
    bench.WORKLOADS[name]()  # warm-up: imports, first dealer contact
    rows = [bench.WORKLOADS[name]() for _ in range(repeat)]
    row = dict(rows[-1], seconds=statistics.median(r["seconds"] for r in rows))
    print("ROW " + json.dumps({"workload": name, **row}), flush=True)
crypten_lite.uninit()
"""

PING_SERVER = """
import socket
s = socket.create_server(("0.0.0.0", 5001))
print("ready", flush=True)
conn, _ = s.accept()
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while (data := conn.recv(64)):
    conn.sendall(data)
"""
PING_CLIENT = """
import socket, statistics, sys, time
c = socket.create_connection((sys.argv[1], 5001), timeout=10)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for _ in range(200):
    t = time.perf_counter(); c.sendall(b"x"); c.recv(64); rtts.append(time.perf_counter() - t)
print(statistics.median(rtts))
"""


def rate_bits(rate: str) -> float | None:
    """Bits per second of a tc rate ("100mbit", "10mbit", "1gbit"); None for unlimited."""
    if rate == "unlimited":
        return None
    m = re.fullmatch(r"([\d.]+)([kmg]?)bit", rate)
    if not m:
        raise SystemExit(f"rate {rate!r}: use e.g. 100mbit, 10mbit or unlimited")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def add_delay(net: netns.Network, delay: str) -> None:
    """netem delay on every host (replaces tbf: netem's own `rate` keeps the limit)."""
    for host in net.hosts:
        ns = net.namespaces[host]
        argv = ["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", "eth0", "root",
                "netem", "delay", delay]
        if net.rate:
            argv += ["rate", net.rate]
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"cannot add a delay here (sch_netem missing?): {done.stderr.strip()}")


def envs(net: netns.Network, tls_dir: str, session: str, timeout: float):
    parties = f"{net.ip('party0')}:{PARTY_PORT},{net.ip('party1')}:{PARTY_PORT}"
    common = {"CRYPTEN_LITE_WORLD_SIZE": "2", "CRYPTEN_LITE_PARTIES": parties,
              "CRYPTEN_LITE_DEALER": f"{net.ip('dealer')}:{DEALER_PORT}",
              "CRYPTEN_LITE_PROVIDER": "dealer", "CRYPTEN_LITE_TLS_DIR": tls_dir,
              "CRYPTEN_LITE_SESSION": session, "CRYPTEN_LITE_TIMEOUT": str(timeout)}
    base = {k: v for k, v in os.environ.items() if not k.startswith("CRYPTEN_LITE_")}
    base.update(PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return ([{**base, **common, "CRYPTEN_LITE_RANK": str(r)} for r in range(2)],
            {**base, **common})


def session(net: netns.Network, tls_dir: str, name: str, argv: list[str],
            timeout: float = 600) -> list[str]:
    """Run the dealer and `argv` as both parties; each party's output (raises on failure)."""
    party_envs, dealer_env = envs(net, tls_dir, name, timeout=300)
    dealer = net.run("dealer", [sys.executable, "-m", "crypten_lite.cli", "dealer"],
                     env=dealer_env, cwd=REPO, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
    procs = [net.run(f"party{r}", [sys.executable, *argv], env=party_envs[r], cwd=REPO,
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    outs = []
    try:
        for r, p in enumerate(procs):
            out, _ = p.communicate(timeout=timeout)
            if p.returncode != 0:
                raise RuntimeError(f"party {r} of {name} failed:\n{out[-3000:]}")
            outs.append(out)
    finally:
        for p in [*procs, dealer]:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return outs


def rtt(net: netns.Network) -> float:
    server = net.run("party1", [sys.executable, "-c", PING_SERVER], stdout=subprocess.PIPE, text=True)
    server.stdout.readline()
    out = subprocess.run(["ip", "netns", "exec", net.namespaces["party0"], sys.executable, "-c",
                          PING_CLIENT, net.ip("party1")], capture_output=True, text=True, timeout=60)
    server.kill()
    server.wait()
    return float(out.stdout.strip())


def model_seconds(rounds: int, bytes_max: float, rtt_s: float, bits: float | None,
                  compute_s: float) -> float:
    """compute + rounds x RTT + bytes / bandwidth (the busier direction)."""
    return compute_s + rounds * rtt_s + (bytes_max * 8 / bits if bits else 0.0)


def run_rate(rate: str, delay: str | None, workloads: list[str], images: int, tls_dir: str,
             script_dir: pathlib.Path, repeat: int = 3) -> list[dict]:
    rows = []
    with netns.Network(["dealer", "party0", "party1"],
                       rate=None if rate == "unlimited" else rate) as net:
        if delay:
            add_delay(net, delay)
        rtt_s = rtt(net)
        tag = f"{rate}-{delay or '0ms'}-{os.getpid()}"
        if "example" in workloads:
            script = EXAMPLE if EXAMPLE.exists() else FALLBACK
            args = [str(script)] + (["--images", str(images), "--no-verify"] if script == EXAMPLE else [])
            start = time.perf_counter()
            outs = session(net, tls_dir, f"example-{tag}", args)
            wall = time.perf_counter() - start
            stats = [ONLINE.search(out) for out in outs]
            if all(stats):
                rows.append({"workload": f"example:{script.stem}", "seconds": max(float(m.group(1)) for m in stats),
                             "rounds": int(stats[0].group(2)),
                             "bytes_sent_per_party": [round(float(m.group(3)) * 1e6) for m in stats],
                             "wall_s_with_startup": round(wall, 2)})
            else:
                rows.append({"workload": f"example:{script.stem}", "wall_s_with_startup": round(wall, 2),
                             "note": "the script prints no `online:` line"})
        names = [w for w in workloads if w != "example"]
        if names:
            script = script_dir / "workloads.py"
            script.write_text(WORKLOAD_SCRIPT)
            outs = session(net, tls_dir, f"bench-{tag}", [str(script), str(repeat), *names])
            per_party = [[json.loads(line[4:]) for line in out.splitlines() if line.startswith("ROW ")]
                         for out in outs]
            for row0, row1 in zip(*per_party):
                rows.append({"workload": row0["workload"], "seconds": max(row0["seconds"], row1["seconds"]),
                             "rounds": row0["rounds"],
                             "bytes_sent_per_party": [row0["bytes_sent"], row1["bytes_sent"]],
                             # online, plus the offline phase where crypten_lite.bench has one
                             "dealer_bytes": row0["dealer_bytes"] + row0.get("offline_dealer_bytes", 0),
                             "offline_seconds": max(row0.get("offline_seconds", 0.0),
                                                    row1.get("offline_seconds", 0.0))})
    for row in rows:
        row.update(rate=rate, delay=delay or "0ms", rtt_ms=round(rtt_s * 1000, 3))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="unlimited,100mbit,10mbit")
    parser.add_argument("--delay", default=None, help="netem delay per host, e.g. 10ms (needs sch_netem)")
    parser.add_argument("--workloads", default="example,matmul_256,lenet_b1,logreg_sgd_step")
    parser.add_argument("--images", type=int, default=16, help="images for the example")
    parser.add_argument("--repeat", type=int, default=3, help="median of this many runs (workloads)")
    parser.add_argument("--out", "--json", dest="out", default=None,
                        help="also append the JSON lines to this file, each with the commit, date, cores and "
                             "load it was measured at (docs/netns_bench.jsonl is what docs/deployment.md shows)")
    args = parser.parse_args(argv)
    ok, reason = netns.available()
    if not ok:
        print(f"netns_bench: {reason}", file=sys.stderr)
        return 2
    ok, reason = netns.rate_limit_available()
    if not ok:
        print(f"netns_bench: {reason}", file=sys.stderr)
        return 2
    from crypten_lite import certs

    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    rows: list[dict] = []
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip() or "unknown"
    measured = {"measured": "by this script", "repeat": args.repeat, "commit": commit,
                "date": time.strftime("%Y-%m-%d", time.gmtime()), "cpus": os.cpu_count(),
                "command": "sudo python benchmarks/netns_bench.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    with tempfile.TemporaryDirectory(prefix="netns-bench-") as tmp:
        tls_dir = pathlib.Path(tmp) / "certs"
        certs.generate(tls_dir, parties=2)
        for rate in [r.strip() for r in args.rates.split(",") if r.strip()]:
            rate_bits(rate)
            for row in run_rate(rate, args.delay, workloads, args.images, str(tls_dir),
                                pathlib.Path(tmp), args.repeat):
                row.update(measured, load_average_1min=round(os.getloadavg()[0], 1))
                rows.append(row)
                print(json.dumps(row), flush=True)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps(row) + "\n")
    # The model, calibrated on the unlimited run (its seconds = compute + rounds x RTT).
    base = {r["workload"]: r for r in rows if r["rate"] == "unlimited" and "seconds" in r}
    print(f"\n{'workload':26} {'rate':>9} {'s':>7} {'model s':>8} {'rounds':>6} {'MB/party':>9}",
          file=sys.stderr)
    for r in rows:
        if "seconds" not in r:
            continue
        b = base.get(r["workload"])
        predicted = ""
        if b is not None:
            compute = b["seconds"] - b["rounds"] * b["rtt_ms"] / 1000
            predicted = f"{model_seconds(r['rounds'], max(r['bytes_sent_per_party']), r['rtt_ms'] / 1000, rate_bits(r['rate']), compute):8.2f}"
        print(f"{r['workload']:26} {r['rate']:>9} {r['seconds']:7.2f} {predicted:>8} {r['rounds']:6d} "
              f"{max(r['bytes_sent_per_party']) / 1e6:9.3f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
