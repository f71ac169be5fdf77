"""`crypten-lite bench`'s transport rows are compared with raw_tcp_16MB, the wire's limit,
measured in the same run (crypten_lite/bench.py)."""

from __future__ import annotations

from crypten_lite import bench


def test_transport_brings_the_raw_tcp_row_along():
    assert bench._with_the_wire(["mul_1M", "transport_16MB", "lenet_b1"]) == \
        ["mul_1M", "transport_16MB", "raw_tcp_16MB", "lenet_b1"]
    assert bench._with_the_wire(["raw_tcp_16MB", "transport_16MB"]) == ["raw_tcp_16MB", "transport_16MB"]
    assert bench._with_the_wire(["mul_1M"]) == ["mul_1M"]
    assert "raw_tcp_16MB" in bench.WORKLOADS and "raw_tcp_16MB" in bench.TRANSPORT_ROWS


def test_each_transport_row_gets_its_rate_and_its_ratio_to_raw_tcp():
    rows = [{"workload": "transport_16MB", "mb_per_s": 500.0}, {"workload": "raw_tcp_16MB", "mb_per_s": 2000.0},
            {"workload": "mul_1M", "seconds_median": 0.1}, {"workload": "lt_1M", "error": "failed"}]
    bench._against_the_wire(rows)
    assert rows[0]["gb_per_s"] == 0.5 and rows[0]["times_raw_tcp"] == 4.0
    assert rows[1]["gb_per_s"] == 2.0 and rows[1]["times_raw_tcp"] == 1.0
    assert "gb_per_s" not in rows[2] and "gb_per_s" not in rows[3]
    alone = [{"workload": "transport_16MB", "mb_per_s": 500.0}]  # raw TCP failed or not run
    bench._against_the_wire(alone)
    assert alone[0]["gb_per_s"] == 0.5 and "times_raw_tcp" not in alone[0]


def test_small_ops_bring_their_limits_along():
    assert bench._with_the_wire(["mul_4", "lenet_b1"]) == ["mul_4", "reveal_4", "raw_tcp_rtt", "lenet_b1"]
    assert bench._with_the_wire(["reveal_4"]) == ["reveal_4", "raw_tcp_rtt"]
    assert bench._with_the_wire(["raw_tcp_rtt", "reveal_4"]) == ["raw_tcp_rtt", "reveal_4"]
    assert set(bench.LATENCY_ROWS) <= set(bench.WORKLOADS)


def test_small_ops_get_their_ratio_to_their_limit():
    rows = [{"workload": "mul_4", "seconds_median": 0.003}, {"workload": "reveal_4", "seconds_median": 0.001},
            {"workload": "raw_tcp_rtt", "seconds_median": 0.0002}]
    bench._against_the_wire(rows)
    assert abs(rows[0]["times_reveal_4"] - 3.0) < 1e-9 and abs(rows[1]["times_raw_tcp_rtt"] - 5.0) < 1e-9
    assert "times_raw_tcp_rtt" not in rows[0] and "times_reveal_4" not in rows[2]
    alone = [{"workload": "mul_4", "seconds_median": 0.003}]
    bench._against_the_wire(alone)
    assert "times_reveal_4" not in alone[0]
