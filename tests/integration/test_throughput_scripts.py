"""The large-payload scripts behind docs/ARCHITECTURE.md's "Where a product's time goes"
section still run and measure what the section's generated tables show (tiny runs: figures
are not checked, only that every pattern and stage is measured, that the JSON the generator
reads has its fields, and that nothing is left running)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_grpc_throughput_measures_each_pattern(tmp_path):
    out = tmp_path / "throughput.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "grpc_floor.py"), "--throughput", "--repeat", "1",
                    "--chunk-mb", "4", "--streams", "1,2", "--json", str(out)],
                   capture_output=True, text=True, timeout=300, check=True)
    run = json.loads(out.read_text())
    rows = [(r["pattern"], r["streams"]) for r in run["patterns"]]
    assert rows == [("tcp", 1), ("grpc", 1), ("grpc", 2), ("grpc_nocopy", 1), ("grpc_nocopy", 2)], rows
    assert all(r["median_ms"] > 0 and r["cpu_ms"] >= 0 for r in run["patterns"])
    assert run["patterns"][0]["ratio_to_tcp"] == 1.0


def test_grpc_throughput_refuses_an_unknown_pattern():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "grpc_throughput.py"), "--patterns", "carrier_pigeon"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "carrier_pigeon" in done.stderr


def test_profile_mul_stages_times_every_stage(tmp_path):
    out = tmp_path / "mul_profile.json"
    # 300,000 elements: the opening is 4.8 MB, two chunks of the transport's 4 MiB
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "profile_mul_stages.py"), "--n", "300000",
                    "--products", "2", "--json", str(out)],
                   capture_output=True, text=True, timeout=600, check=True)
    run = json.loads(out.read_text())
    assert [p["rank"] for p in run["parties"]] == [0, 1]
    gen = _generator()
    for party in run["parties"]:
        assert party["products"] == 2 and party["chunks"] == 2, party
        assert set(gen.MUL_STAGES) <= set(party), set(gen.MUL_STAGES) - set(party)
        assert party["total"] > 0 and party["fill"] > 0 and party["sum"] > 0 and party["recombine"] > 0
    assert "| whole product |" in gen.architecture_mul_stages({}, {}, {"mul_profile": run})


def test_profile_mul_splits_cpu_by_thread():
    # 300,000 elements: a streamed opening (two chunks); one profiled product
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "profile_mul.py"), "--n", "300000",
                           "--profiled", "1"], capture_output=True, text=True, timeout=600, check=True)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [row["rank"] for row in rows] == [0, 1]
    for row in rows:
        split = row["cpu_threads_ms"]
        assert split["main"] > 0 and all(ms >= 0 for ms in split.values()), split
        assert {"grpc_channel", "grpc_handler"} <= set(split), split  # the transport's own threads
        assert row["cpu_ms_median"] > 0


def _generator():
    import importlib.util
    spec = importlib.util.spec_from_file_location("gen_doc_figures", ROOT / "scripts" / "gen_doc_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_transport_vs_tcp_reports_the_ratio(tmp_path):
    out = tmp_path / "rounds.jsonl"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "transport_vs_tcp.py"), "--rounds", "1",
                    "--repeat", "1", "--json", str(out)],
                   capture_output=True, text=True, timeout=600, check=True)
    summary = json.loads(out.read_text())
    (r,) = summary["rounds"]
    assert r["transport_ms"] > 0 and r["raw_tcp_ms"] > 0
    assert abs(r["times_raw_tcp"] - summary["times_raw_tcp_median"]) < 1e-9
