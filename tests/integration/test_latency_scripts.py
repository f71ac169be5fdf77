"""The small-message latency scripts behind docs/ARCHITECTURE.md's "Small-message latency"
section still run and print what the section quotes (tiny runs: figures are not checked,
only that every pattern and every stage is measured and that nothing is left running)."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_grpc_floor_measures_each_pattern():
    patterns = ["tcp_exchange", "push_pair_exchange", "subscribe_pair_exchange"]
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "grpc_floor.py"), "--samples", "5",
                          "--only", ",".join(patterns)],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    rows = dict(re.findall(r"^(\w+)\s+median\s+([0-9.]+) us", out, re.M))
    assert set(rows) == {"tcp", *patterns}, out
    assert all(float(v) > 0 for v in rows.values()), out


def test_grpc_floor_refuses_an_unknown_pattern():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "grpc_floor.py"), "--only", "carrier_pigeon"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "carrier_pigeon" in done.stderr


def test_profile_reveal_times_every_stage():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "profile_reveal.py"), "--n", "5",
                          "--ops", "reveal"],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    row = json.loads(out.strip().splitlines()[-1])
    assert row["op"] == "reveal_4" and row["median_us"] > 0
    assert list(row["stage_us_median"]) == ["send", "queued", "dequeued", "accepted", "put", "woken", "done"]


def test_profile_lenet_splits_the_time():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "profile_lenet.py"), "--n", "1"],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    parties = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [p["rank"] for p in parties] == [0, 1]
    for p in parties:
        assert p["rounds"] == 28 and p["max_error"] < 1e-2   # LeNet's 27 rounds and the reveal
        assert 0 < p["main_thread_cpu_s"] <= p["process_cpu_s"] and p["offline_s"] > 0
        assert abs(sum(p["main_cpu_share"].values()) - 1) < 0.01
        assert "binary circuits (comparisons: MSB, max)" in p["main_cpu_share"]
        assert set(p["offline_parts_ms"]) == {"derive", "plans", "dealer"}
        assert all(v >= 0 for v in p["offline_parts_ms"].values())


def test_transport_cpu_measures_both_operations():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "transport_cpu.py"), "--reveals", "3",
                          "--exchanges", "1"], capture_output=True, text=True, timeout=600, check=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r["rank"] for r in rows] == [0, 1]
    for r in rows:
        assert r["exact"] and r["reveal_4_cpu_us"] > 0 and r["transport_16MB_cpu_ms"] > 0
        if sys.platform.startswith("linux"):  # each thread's share, from the scheduler's count
            for key in ("reveal_4_threads_us", "transport_16MB_threads_ms"):
                split = r[key]
                assert {"main", "grpc_handler"} <= set(split), split
                assert set(split) <= {"main", "grpc_handler", "grpc_channel", "grpc_event_engine",
                                      "grpc_server_queue", "other"}, split
                assert all(v >= 0 for v in split.values()) and split["main"] > 0
