"""The short variant of `make bench`: the same run (its own broker, a backlog, every phase: throughput with each
row's output checked against the recount, latency after a measured catch-up, recovery after kill -9 with and
without a standby) on a small backlog, with every kind of contender: onceflow into Kafka and into PostgreSQL, the
stateless second app, Spark's at-least-once sink, the transactional loop and Flink (one checkpoint interval; the
second is the same code). It proves the bench still measures what it says and that every row's output is right;
the figures of so small a run, on a machine shared with the rest of the suite, are not performance figures and
nothing here asserts on them (docs/performance.md has a full run's)."""

import pytest

from onceflow_dev import bench

pytestmark = pytest.mark.integration

ROWS = ("eos", "eos_ip_networks", "eos_postgres", "alo", "ceiling", "flink")


def test_short_bench_runs_every_phase_and_every_rows_output_is_right(tmp_path):
    spec = bench.BenchSpec(
        records=30_000,
        ips=500,
        live_rate=1_000,
        live_s=15,
        steady_s=5,
        warmup_s=12,
        catchup_max_s=180,
        trigger_s=2.0,
        recovery_runs=1,
        flink=True,
        postgres=True,
        contenders=frozenset(ROWS),
    )
    r = bench.run(spec, tmp_path / "bench")

    tp, ok, lat = r["throughput"], r["correctness"], r["latency"]
    assert set(tp) == set(ROWS), tp
    records = tp["eos"]["records"]  # the backlog as the broker holds it (the generator adds a few tail records)
    assert records >= 30_000
    for key in ROWS:
        assert "error" not in tp[key], (key, tp[key])
        assert tp[key]["records"] == records and tp[key]["records_per_s"] > 0, (key, tp[key])
        # every row's sink (a table for eos_postgres) read back as its readers see it, against the recount
        assert ok[key]["verdict"] in ("ok", "exact"), (key, ok[key])
    assert ok["eos_ip_networks"]["sink_records"] + ok["eos_ip_networks"]["dlq_records"] == records
    assert ok["eos"]["dlq_records"] == ok["eos"]["malformed"] > 0  # the backlog has malformed records: all in the DLQ

    # latency: each streaming row caught up, then results of windows that ended in the steady state were stamped
    # (ip_networks, with no window: the results of the records stamped in it, read from both its outputs)
    assert set(lat) == {"eos", "eos_ip_networks", "eos_postgres", "alo", "flink"}, lat
    for key, got in lat.items():
        assert got["caught_up"] and got.get("windows", 1) >= 1 and 0 < got["p50_ms"] <= got["p99_ms"], (key, got)
        assert got["warmup"]["results"] >= 1, ("the warm-up's results are reported apart", key, got)
    assert lat["eos_ip_networks"]["results"] >= 1_000 and "windows" not in lat["eos_ip_networks"]

    # recovery: a kill -9 under live input, then a commit and the lag back, restarted and taken over by a standby
    assert set(r["recovery"]) == {"restart", "standby"}
    for how, got in r["recovery"].items():
        assert len(got["runs"]) == 1 and got["to_next_commit_s"] > 0, (how, got)
        assert got["to_lag_recovered_s"] >= 0, (how, got)

    ra = r["ratios"]
    for key in ("eos_vs_alo_throughput", "eos_vs_ceiling_throughput", "eos_vs_flink_throughput", "eos_vs_flink_p99"):
        assert ra[key] is not None and ra[key] > 0, ra
    assert ra["ip_networks_vs_ip_count_throughput"] > 0 and ra["postgres_vs_kafka_sink_throughput"] > 0, ra
    # Flink's checkpoints every 5 s, as long as a window: its p99 is also given over every phase they may take
    model = ra["flink_over_phases"]
    assert 0 <= model["p99_beyond_phase_ms"] < 5000 and 0 <= model["eos_below_share"] <= 1, model

    table = bench.table(r)
    assert "WRONG" not in table and "FAILED" not in table and "not checked" not in table, table
    for name in ("onceflow exactly-once into PostgreSQL", "Spark Kafka sink", "txn loop", "Flink KafkaSink", "phases"):
        assert name in table, table
