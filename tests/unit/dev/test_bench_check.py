"""`make bench`'s correctness check (onceflow_dev.bench_check): the recount of a backlog, the certain/uncertain split
of late records, and the comparison of a sink against it. Pure, no broker."""

import datetime
import json
from contextlib import contextmanager

import pytest

from onceflow_apps.access_log import rules as R
from onceflow_dev import bench, bench_flink
from onceflow_dev import bench_check as B

T0_MS = 1795298400000  # 2026-11-21T22:00:00Z, a window start
W = 5


def rec(ts_ms: int, ip: str) -> bytes:
    return json.dumps({"ts": ts_ms, "ip": ip}).encode()


def key(ts_ms: int, ip: str) -> str:
    return R.sink_key(R.window_start_us(ts_ms * 1000, W), ip)


def sink_record(ts_ms: int, ip: str, count: int) -> tuple[bytes, bytes]:
    k = key(ts_ms, ip)
    return k.encode(), B.sink_value(k, count, W)


def backlog() -> B.Expected:
    """Two partitions; partition 0 holds a record 40 s behind its newest (late); both end with a tail at +60 s."""
    c = B.ExpectedCounts(window_s=W, watermark_s=5, max_ahead_ms=None)
    c.add(0, rec(T0_MS + 1000, "10.0.0.1"), None)
    c.add(1, rec(T0_MS + 2000, "10.0.0.1"), None)
    c.add(0, rec(T0_MS + 46_000, "10.0.0.2"), None)  # window [45, 50)
    c.add(0, rec(T0_MS + 6_000, "10.0.0.2"), None)  # 40 s behind partition 0's newest: may be dropped
    c.add(0, rec(T0_MS + 3_000, "10.0.0.1"), None)  # also late, into a window with certain records
    c.add(1, b"not a log line", None)
    c.add(1, rec(T0_MS + 44_000, "10.0.0.3"), None)  # out of order by < the delay: certain
    c.add(0, rec(T0_MS + 60_000, "10.0.0.9"), None)  # tails: the windows of +60 s never close
    c.add(1, rec(T0_MS + 60_000, "10.0.0.9"), None)
    return c.result()


def test_recount_splits_certain_and_late():
    e = backlog()
    assert (e.records, e.malformed, e.uncertain_records) == (9, 1, 2)
    assert e.keys[key(T0_MS, "10.0.0.1")][:2] == [2, 1]
    assert e.keys[key(T0_MS + 6_000, "10.0.0.2")][:2] == [0, 1]
    assert e.keys[key(T0_MS + 44_000, "10.0.0.3")][:2] == [1, 0]
    assert e.must_close_us == (T0_MS + 55_000) * 1000
    assert e.must_keys() == {key(T0_MS, "10.0.0.1"), key(T0_MS + 46_000, "10.0.0.2"), key(T0_MS + 44_000, "10.0.0.3")}


def good_sink(late: bool) -> list[tuple[bytes, bytes]]:
    out = [sink_record(T0_MS + 46_000, "10.0.0.2", 1), sink_record(T0_MS + 44_000, "10.0.0.3", 1)]
    if late:  # an engine whose watermark had not passed the late records yet (Spark in one big batch)
        return out + [sink_record(T0_MS, "10.0.0.1", 3), sink_record(T0_MS + 6_000, "10.0.0.2", 1)]
    return out + [sink_record(T0_MS, "10.0.0.1", 2)]


def test_either_late_handling_is_correct():
    e = backlog()
    for late, counted in ((False, 0), (True, 2)):
        r = B.compare(e, good_sink(late), W, dlq_records=1)
        assert r["verdict"] == "ok", r
        assert r["late_counted"] == counted and r["keys_compared"] == 3


def test_wrong_outputs_are_named():
    e = backlog()
    wrong = [
        sink_record(T0_MS, "10.0.0.1", 4),  # more than certain + uncertain
        sink_record(T0_MS + 44_000, "10.0.0.3", 1),
        sink_record(T0_MS + 44_000, "10.0.0.3", 1),  # a duplicate
        sink_record(T0_MS + 60_000, "10.0.0.9", 2),  # a window whose watermark never came
        (key(T0_MS + 46_000, "10.0.0.2").encode(), b'{"window_start": "x", "count": 1}'),  # not the sink's format
    ]
    r = B.compare(e, wrong, W, dlq_records=0)
    assert (r["wrong_count"], r["duplicates"], r["extra"], r["badly_formatted"]) == (1, 1, 1, 1)
    assert r["verdict"] == "WRONG: 2 keys differ, 1 duplicates, 1 badly formatted, DLQ 0 of 1"
    r = B.compare(e, good_sink(False)[1:], W)
    assert r["missing"] == 1 and r["verdict"] == "WRONG: 1 keys differ"


def test_sink_value_is_the_spark_jobs_json():
    k = R.sink_key(T0_MS * 1000, "2001:db8::1")
    assert B.sink_value(k, 7, W) == (
        b'{"window_start":"2026-11-21T22:00:00.000Z","window_end":"2026-11-21T22:00:05.000Z",'
        b'"ip":"2001:db8::1","count":7}'
    )


def test_flink_parallelism_follows_the_local_master():
    assert bench_flink.parallelism("local[2]") == 2
    assert bench_flink.parallelism("local") == 1
    assert bench_flink.parallelism("local[3,2]") == 3
    # on the loopback cluster: the job's cores on the standalone master, which Flink's one JVM matches
    assert bench_flink.parallelism("spark://127.0.0.1:7077", cores_max=2) == 2
    with pytest.raises(ValueError, match="set cores_max"):
        bench_flink.parallelism("spark://127.0.0.1:7077")


def test_recovery_is_reported_as_median_and_worst_of_its_runs():
    from onceflow_dev.bench import recovery_summary

    runs = [
        {"pre_crash_lag": 100, "to_next_commit_s": 2.4, "to_lag_recovered_s": 3.0, "restart_delay_s": 2.0},
        {"pre_crash_lag": 300, "to_next_commit_s": 8.1, "to_lag_recovered_s": 12.9, "restart_delay_s": 2.0},
        {"pre_crash_lag": 200, "to_next_commit_s": 5.3, "to_lag_recovered_s": 6.2, "restart_delay_s": 2.0},
    ]
    got = recovery_summary(runs)
    assert (got["to_next_commit_s"], got["to_next_commit_s_max"]) == (5.3, 8.1)
    assert (got["to_lag_recovered_s"], got["to_lag_recovered_s_max"]) == (6.2, 12.9)
    assert got["pre_crash_lag"] == 300 and got["runs"] == runs


def test_the_benchs_table_has_a_row_per_app_and_reads_only_what_each_check_reports():
    """ip_networks' check reports no late records (nothing of a stateless app is late): the table must not ask."""
    from onceflow_dev import bench

    row = {"records_per_s": 20_000, "peak_rss_mb": 900, "cpu_s": 100.0}
    r = {
        "spec": {"trigger_s": 5.0},
        "settings": {"flink_checkpoint_ms": {}},
        "throughput": {"eos": row, "eos_ip_networks": row | {"records_per_s": 30_000}, "alo": row, "ceiling": row},
        "latency": {"eos": {"p50_ms": 1500, "p95_ms": 2000, "p99_ms": 2500}},
        "correctness": {
            "eos": {"verdict": "exact", "late_counted": 3, "late_records": 5},
            "eos_ip_networks": {"verdict": "exact", "sink_records": 9, "dlq_records": 1, "records": 10},
        },
        "ratios": {"eos_vs_alo_throughput": 1.0, "eos_vs_ceiling_throughput": 1.0, "eos_p99_in_trigger_intervals": 0.5},
        "recovery": {},
    }
    text = bench.table(r)
    assert "onceflow exactly-once, ip_networks (stateless)  30,000" in text
    assert "late records counted by onceflow exactly-once: 3 of 5" in text and "ip_networks / ip_count" in text


def test_the_steady_state_begins_once_the_lag_stayed_low_for_the_hold():
    from onceflow_dev.bench import steady_since

    # a cold start's backlog, caught up at t=30 s; held low from there
    lags = [(t * 1000, lag) for t, lag in [(10, 90_000), (20, 40_000), (30, 5_000), (40, 9_000), (44, 2_000)]]
    assert steady_since(lags, bound=10_000, hold_ms=15_000) is None  # low for 14 s only
    assert steady_since([*lags, (45_000, 3_000)], bound=10_000, hold_ms=15_000) == 30_000
    # one sample over the bound starts the hold again
    assert steady_since([*lags, (45_000, 30_000), (50_000, 1_000)], bound=10_000, hold_ms=15_000) is None
    assert steady_since([], bound=10_000, hold_ms=0) is None


def test_a_contender_committing_on_a_checkpoint_counts_as_caught_up_by_its_own_interval(tmp_path):
    from onceflow import config
    from onceflow_dev import bench

    s = config.Settings(var_dir=tmp_path, trigger_interval_s=2.0)
    flink, eos = bench.Flink(s, checkpoint_ms=5000), bench.ExactlyOnce(s)
    assert (flink.commit_interval_s(), eos.commit_interval_s()) == (5.0, 2.0)
    # Flink's lag at 1,000 records/s: its position moves on a checkpoint every 5 s, so the lag saws up to ~6,000
    saw = [(t * 1000, 1_000 * (t % 5) + 1_500) for t in range(0, 30)]
    assert bench.steady_since(saw, bench.steady_lag_bound(1_000, flink.commit_interval_s()), 5_000) == 0
    # held to a 2 s trigger's bound it never counted as caught up (the short bench's Flink row, before)
    assert bench.steady_since(saw, bench.steady_lag_bound(1_000, eos.commit_interval_s()), 5_000) is None


def test_window_latencies_count_the_windows_measured():
    from onceflow import config
    from onceflow_dev.bench import window_latencies

    s = config.load(env={}, window_s=5, watermark_s=5)
    base = 1_795_000_000_000

    def iso(ms: int) -> str:  # as the sink's window_end
        return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat()

    seen = [(base + 5_000 * k + 5_000 + 1_200, iso(base + 5_000 * k)) for k in range(1, 9) for _ in range(3)]
    got = window_latencies(seen, s, first_ms=base + 10_000, end_ms=base + 40_000)
    assert got["windows"] == 6 and got["results"] == 18 and got["p50_ms"] == 1_200


def test_a_stateless_apps_results_are_due_at_their_records_event_time_on_every_output():
    """ip_networks: one result per record, due when the record was stamped (no window, no watermark to wait for)."""
    from onceflow import config
    from onceflow_dev.bench import window_latencies
    from onceflow_dev.stamper import anchor

    s = config.load(env={}, app="ip_networks")
    base = 1_795_000_000_000

    def iso(ms: int) -> str:  # as ip_networks' `ts`
        return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"

    assert anchor({"ts": iso(base), "ip": "9.9.9.9"}) == iso(base)
    seen = [(base + 1_000 * k + 700, iso(base + 1_000 * k)) for k in range(40)]
    got = window_latencies(seen, s, first_ms=base + 10_000, end_ms=base + 29_000)
    assert got["results"] == 20 and got["p50_ms"] == got["max_ms"] == 700 and "windows" not in got


def test_the_benchs_settings_take_another_app_with_its_declared_settings():
    from onceflow import config
    from onceflow_dev import bench

    net = {"app": "ip_networks"}
    s = bench._settings(
        config.load(env={}), "bench_ip_networks", "bench.source", bench.BenchSpec(), **net, **config.app_defaults(net)
    )
    assert (s.app, s.app_id, s.sink_topic, s.close_out_batches) == (
        "ip_networks",
        "bench_ip_networks",
        "bench_ip_networks.sink",
        False,
    )


def test_a_bench_run_picks_its_rows_and_onceflows_own_always_runs():
    from onceflow_dev.bench import CONTENDERS, BenchSpec

    every = BenchSpec(flink=True, postgres=True, contenders=frozenset())
    assert [k for k in CONTENDERS if every.runs(k)] == list(CONTENDERS)
    short = BenchSpec(flink=True, postgres=True, contenders=frozenset({"alo", "flink"}))
    assert [k for k in CONTENDERS if short.runs(k)] == ["eos", "alo", "flink"]
    # the flags still leave their rows out when the list names them
    off = BenchSpec(flink=False, postgres=False, contenders=frozenset({"flink", "eos_postgres"}))
    assert [k for k in CONTENDERS if off.runs(k)] == ["eos"]
    with pytest.raises(ValueError, match="unknown bench contender 'flnk'"):
        short.runs("flnk")


def test_the_ratios_of_a_run_without_some_rows_are_none_and_the_table_says_so():
    from onceflow_dev import bench

    row = {"records_per_s": 20_000, "peak_rss_mb": 900, "cpu_s": 100.0}
    r = {
        "spec": {"trigger_s": 5.0},
        "settings": {"flink_checkpoint_ms": {}},
        "throughput": {"eos": row, "eos_postgres": row | {"records_per_s": 10_000}},
        "latency": {"eos": {"p99_ms": 2500}},
        "correctness": {"eos": {"verdict": "ok"}, "eos_postgres": {"verdict": "ok"}},
        "recovery": {},
    }
    r["ratios"] = bench.ratios(r, 5.0)
    assert r["ratios"]["eos_vs_alo_throughput"] is None and r["ratios"]["eos_vs_ceiling_throughput"] is None
    assert r["ratios"]["postgres_vs_kafka_sink_throughput"] == 0.5
    assert r["ratios"]["eos_p99_in_trigger_intervals"] == 0.5
    text = bench.table(r)
    assert "exactly-once / at-least-once throughput: -" in text
    assert "PostgreSQL sink / Kafka sink throughput (onceflow): 0.5" in text


def test_the_loaded_row_reports_its_latency_in_trigger_intervals_and_states_its_load():
    """eos_loaded: a latency row only (no throughput line of its own), its p99 in trigger intervals, and the load
    beside it said with the figure: the second job's app, rate, share of a core and whether it kept up."""
    from onceflow_dev import bench

    row = {"records_per_s": 20_000, "peak_rss_mb": 900, "cpu_s": 100.0}
    load = {
        "app": "ip_count",
        "rate": 5000,
        "margin_ms": 2500,
        "cpu_s": 60.0,
        "cores": 0.5,
        "lag_at_end": 10,
        "kept_up": True,
    }
    r = {
        "spec": {"trigger_s": 5.0},
        "settings": {"flink_checkpoint_ms": {}},
        "throughput": {"eos": row},
        "latency": {"eos": {"p99_ms": 2500}, "eos_loaded": {"p50_ms": 3000, "p99_ms": 7500, "load": load}},
        "correctness": {"eos": {"verdict": "ok"}},
        "recovery": {},
    }
    r["ratios"] = bench.ratios(r, 5.0)
    assert r["ratios"]["eos_loaded_p99_in_trigger_intervals"] == 1.5
    text = bench.table(r)
    assert (
        "beside a second job (ip_count at 5,000 records/s, paced 2500 ms after the trigger, 0.5 of a core, kept up): "
        "p50 3000 ms, p99 7500 ms, 1.5" in text
    )
    assert not [ln for ln in text.splitlines() if ln.startswith(bench.NAMES["eos_loaded"])]  # no throughput row
    r["latency"].pop("eos_loaded")
    assert bench.ratios(r, 5.0)["eos_loaded_p99_in_trigger_intervals"] is None
    assert "second job" not in bench.table(r | {"ratios": bench.ratios(r, 5.0)})
    # in every full run; with BENCH_CONTENDERS, only when named
    assert bench.BenchSpec(contenders=frozenset()).runs("eos_loaded")
    assert not bench.BenchSpec(contenders=frozenset({"alo"})).runs("eos_loaded")
    # the load's batches half an interval after the measured job's, unless BENCH_LOAD_MARGIN_MS says otherwise
    assert bench.BenchSpec(trigger_s=5.0, load_margin_ms=-1).load_margin() == 2500
    assert bench.BenchSpec(trigger_s=2.0, load_margin_ms=-1).load_margin() == 1000
    assert bench.BenchSpec(trigger_s=5.0, load_margin_ms=300).load_margin() == 300


def test_a_contender_has_drained_once_at_the_end_and_for_windows_after_a_batch_that_read_nothing():
    from onceflow_dev.bench import read_to_the_end

    end = {0: 10, 1: 20}
    assert not read_to_the_end({0: 10, 1: 19}, end, last_batch_read=False, closes=True)
    # at the end, but the last batch read data: the close-out that writes its closed windows has not run yet
    assert not read_to_the_end(end, end, last_batch_read=True, closes=True)
    assert read_to_the_end(end, end, last_batch_read=False, closes=True)
    assert read_to_the_end(end, end, last_batch_read=True, closes=False)  # a stateless app: nothing to close


def test_every_bench_records_its_workload_in_its_results_file(monkeypatch):
    """The profile's and the sweep's results files hold the workload; its set of rows once made json.dumps fail
    at the end of the run, after every figure was measured."""
    import json

    from onceflow_dev import bench

    monkeypatch.setenv("BENCH_CONTENDERS", "eos,flink")
    spec = bench.BenchSpec()
    assert json.loads(json.dumps(spec.as_json()))["contenders"] == ["eos", "flink"]


def test_two_bench_apps_never_share_a_topic_name_as_kafka_compares_them(tmp_path):
    """Kafka refuses a topic whose name equals another's with '.' and '_' taken for one character: the profile's
    apps `bench_profile` and `bench_profile_job` once collided (`bench_profile.job_events`)."""
    from onceflow import config
    from onceflow.rules.names import kafka_collision_key
    from onceflow_dev import bench

    base = config.load(env={}, var_dir=tmp_path)
    spec = bench.BenchSpec()
    names = []
    for app in ("bench_profile", "bench_profile_job", "x", "x_job", "x_job_events"):
        s = bench._settings(base, app, f"{app}.source", spec)
        names += [getattr(s, f) for f in config.Settings.__dataclass_fields__ if f.endswith("_topic")]
    folded = [kafka_collision_key(n) for n in set(names)]
    assert len(folded) == len(set(folded)), sorted(n for n in folded if folded.count(n) > 1)


def test_a_phase_that_fails_ends_the_bench_with_the_figures_of_the_phases_before_it(tmp_path, monkeypatch):
    @contextmanager
    def stack(spec, var):
        yield None, {0: 10}

    def contenders(base, end, spec, results):
        results["throughput"] = {"eos": {"records_per_s": 1000}}
        raise TimeoutError("a commit after the kill: not within 300 s")

    monkeypatch.setattr(bench, "bench_stack", stack)
    monkeypatch.setattr(bench, "run_contenders", contenders)
    monkeypatch.setattr(bench, "setup_logging", lambda: None)
    assert bench.main(tmp_path) == 1
    (out,) = tmp_path.glob("results-*.json")
    got = json.loads(out.read_text())
    assert got["throughput"] == {"eos": {"records_per_s": 1000}} and "spec" in got
    assert got["error"].startswith("TimeoutError: a commit after the kill")


@pytest.fixture
def bench_clock(monkeypatch):
    """The bench's clock, the test's own: time passes only in sleep. Returns [now_ms]."""
    from onceflow_dev import bench

    now = [1_000_000]
    monkeypatch.setattr(bench.clock, "now_ms", lambda: now[0])
    monkeypatch.setattr(bench.time, "sleep", lambda sec: now.__setitem__(0, now[0] + int(sec * 1000)))
    return now


def test_the_steady_state_logs_its_progress_and_the_lag_until_it_ends(tmp_path, caplog, bench_clock):
    from onceflow import config
    from onceflow_dev import bench

    now = bench_clock

    class Job:
        lags = iter([1_200, 48_000])

        def lag(self, s):
            return next(self.lags)

    caplog.set_level("INFO", logger="onceflow_dev.bench")
    began = now[0] - 15_000  # the steady state began with the 15 s hold that proved the catch-up
    bench.hold_steady(Job(), config.Settings(var_dir=tmp_path), began, began + 150_000, bound=50_000, every_s=60)
    assert now[0] == began + 150_000  # waited to the end, not a tick past it
    assert [r.getMessage() for r in caplog.records] == [
        "  steady state 75 of 150 s, lag 1200 records (bound 50000)",
        "  steady state 135 of 150 s, lag 48000 records (bound 50000)",
    ]  # none at the end: the figures follow


def test_the_warm_up_logs_as_warm_up_and_the_steady_state_counts_from_its_end(tmp_path, caplog, bench_clock):
    from onceflow import config
    from onceflow_dev import bench

    now = bench_clock

    class Job:
        def lag(self, s):
            return 900

    caplog.set_level("INFO", logger="onceflow_dev.bench")
    began = now[0] - 15_000
    first = began + 120_000  # a 120 s warm-up, then 100 s measured
    bench.hold_steady(
        Job(), config.Settings(var_dir=tmp_path), began, first + 100_000, bound=50_000, measured_from_ms=first
    )
    assert [r.getMessage() for r in caplog.records] == [
        "  warm-up 75 of 120 s, lag 900 records (bound 50000)",
        "  steady state 15 of 100 s, lag 900 records (bound 50000)",
        "  steady state 75 of 100 s, lag 900 records (bound 50000)",
    ]


FLINK_LOG = """\
21:55:14.996 INFO  CheckpointCoordinator - No checkpoint found during restore.
21:55:16.981 INFO  CheckpointCoordinator - Triggering checkpoint 1 (type=CheckpointType{name='Checkpoint', \
sharingFilesStrategy=FORWARD_BACKWARD}) @ 1796421316931 for job 33783e3938ad4ea634ccf502ebad4f5d.
21:55:17.277 INFO  CheckpointCoordinator - Completed checkpoint 1 for job 33783e3938ad4ea634ccf502ebad4f5d \
(1096527 bytes, checkpointDuration=321 ms, finalizationTime=25 ms).
21:55:21.938 INFO  CheckpointCoordinator - Triggering checkpoint 2 (type=CheckpointType{name='Checkpoint', \
sharingFilesStrategy=FORWARD_BACKWARD}) @ 1796421321935 for job 33783e3938ad4ea634ccf502ebad4f5d.
21:55:22.260 INFO  CheckpointCoordinator - Completed checkpoint 2 for job 33783e3938ad4ea634ccf502ebad4f5d \
(2193951 bytes, checkpointDuration=273 ms, finalizationTime=52 ms).
21:55:26.940 INFO  CheckpointCoordinator - Triggering checkpoint 3 (type=CheckpointType{name='Checkpoint', \
sharingFilesStrategy=FORWARD_BACKWARD}) @ 1796421326938 for job 33783e3938ad4ea634ccf502ebad4f5d.
21:55:27.310 INFO  CheckpointCoordinator - Completed checkpoint 3 for job 33783e3938ad4ea634ccf502ebad4f5d \
(2193951 bytes, checkpointDuration=350 ms, finalizationTime=20 ms).
"""


def test_flinks_checkpoint_phase_is_read_from_its_log_over_the_steady_state_only():
    checkpoint_phase = bench_flink.checkpoint_phase
    # checkpoint 1 was triggered before the steady state began: not counted
    got = checkpoint_phase(FLINK_LOG, 1796421320000, 1796421330000, 5000)
    assert got == {"checkpoints_measured": 2, "trigger_phase_ms": 1938, "checkpoint_ms": 370}
    assert checkpoint_phase(FLINK_LOG, 1796421316931, 1796421316931, 5000) == {
        "checkpoints_measured": 1,
        "trigger_phase_ms": 1931,
        "checkpoint_ms": 346,
    }
    assert checkpoint_phase("no checkpoints logged", 0, 2**62, 5000) == {}


def flink_row(p99_ms: int, phase_ms: int, interval_ms: int = 5000) -> dict:
    return {"p99_ms": p99_ms, "trigger_phase_ms": phase_ms, "checkpoint_interval_ms": interval_ms, "window_ms": 5000}


def test_onceflows_p99_is_set_against_flinks_over_every_phase_its_checkpoints_may_take():
    over = bench_flink.over_phases
    # 2026-12-06's one-node run: Flink's checkpoints 4,354 ms into each interval, its p99 4,502 ms
    got = over(2119, flink_row(4502, 4354))
    assert got == {
        "p99_beyond_phase_ms": 148,
        "p99_over_phases_ms": 2648,
        "eos_p99_over_it": 0.8,
        "eos_below_share": 0.61,
    }
    # the run before, checkpoints early (877 ms): the same model from the other side of the interval
    assert over(2055, flink_row(1048, 877))["p99_beyond_phase_ms"] == 171
    # a checkpoint triggered just before a window's due moment commits it past the interval's end: the lag wraps
    assert over(2000, flink_row(5200, 4950))["p99_beyond_phase_ms"] == 250
    assert over(2000, flink_row(5300, 100))["p99_beyond_phase_ms"] == 200
    # onceflow under Flink's best phase is below at every phase; over its worst, at none
    assert over(100, flink_row(4502, 4354))["eos_below_share"] == 1.0
    assert over(6000, flink_row(4502, 4354))["eos_below_share"] == 0.0


def test_the_phase_model_is_left_out_where_it_does_not_hold():
    over = bench_flink.over_phases
    assert over(2000, flink_row(590, 300, interval_ms=500)) == {}  # checkpoints more often than windows
    assert over(2000, {"p99_ms": 4502}) == {}  # no checkpoint phase read from its log
    assert over(2000, flink_row(0, 4354)) == {}  # no results


def test_the_table_shows_the_phase_model_beside_the_run_and_says_it_is_one():
    from onceflow_dev import bench

    row = {"records_per_s": 20_000, "peak_rss_mb": 900, "cpu_s": 100.0}
    flink = flink_row(4502, 4354) | {"checkpoint_ms": 151}
    r = {
        "spec": {"trigger_s": 5.0},
        "settings": {"flink_checkpoint_ms": {"flink": 5000}},
        "throughput": {"eos": row, "flink": row | {"records_per_s": 40_000}},
        "latency": {"eos": {"p99_ms": 2119}, "flink": flink},
        "correctness": {},
        "recovery": {},
    }
    r["ratios"] = bench.ratios(r, 5.0)
    assert r["ratios"]["eos_vs_flink_p99"] == 0.471
    assert r["ratios"]["flink_over_phases"]["eos_below_share"] == 0.61
    assert (
        "  over the phases its checkpoints may take (modelled on this run: its p99 = phase + 148 ms): its p99 2648 ms "
        "on average, onceflow's 0.8 of that, and below Flink's at 61% of the phases" in bench.table(r)
    )
