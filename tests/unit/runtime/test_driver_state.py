"""The streaming driver's decisions without Spark or a broker: the status a batch leaves, when the next batch
starts, what Spark's progress report becomes, and the exit code each way of ending gets (what the supervisor
then does)."""

import pytest

from onceflow import config, wire
from onceflow.kafka import transactional as tw
from onceflow.rules.ledger import BatchPlan, Decision, DivergentHistory
from onceflow.rules.sources import on_topic
from onceflow.runtime import preflight, supervisor
from onceflow.runtime.driver_state import (
    InstanceLocked,
    collect_while_idle,
    failure_exit_code,
    initial_status,
    output_rows_bound,
    pace_after,
    progress_fields,
    startup_exit_code,
    status_after_batch,
)


def plan(batch=7, wm=20_000, ts=30_000):
    return BatchPlan(
        batch=batch,
        start=on_topic("src", {0: 10}),
        end=on_topic("src", {0: 20}),
        watermark_ms=wm,
        batch_ts_ms=ts,
        spark_batch=batch,
    )


def test_a_written_batch_counts_and_a_replay_is_skipped():
    s = config.load(env={}, app_id="a")
    st = initial_status(s, pid=42, now_ms=1000)
    assert st.state == "starting" and st.committed_batches == 0 and st.pid == 42
    w = status_after_batch(st, plan(), 7, Decision.WRITE, 5, 1, 12.34, {"txn_ms": 12}, 2000)
    assert w["committed_batches"] == 1 and w["last_batch"] == 7 and w["running_batch"] is None
    assert (w["last_outputs"], w["last_dlq"], w["last_txn_ms"], w["watermark_ms"]) == (5, 1, 12.3, 20_000)
    assert w["end_offsets"] == {"0": 20}  # the status file's JSON: one source topic, keyed by partition
    skipped = status_after_batch(st.updated(**w), plan(8), 8, Decision.SKIP, 0, 0, 0.0, {}, 3000)
    assert skipped["replays_skipped"] == 1 and "committed_batches" not in skipped and skipped["last_batch"] == 8
    assert status_after_batch(st, plan(9), 9, Decision.CATCH_UP, 0, 0, 0.0, {}, 4000)["replays_skipped"] == 1


def test_pacing_after_a_batch():
    s = config.load(env={}, app_id="a", trigger_interval_s=5, window_s=5, watermark_s=5)
    # a replay or a catch-up is followed at once; so is everything with close-out batches off
    assert pace_after(s, plan(), Decision.SKIP, None, 31_000).delay_s == 0
    assert pace_after(s.replace(close_out_batches=False), plan(), Decision.WRITE, 99_000, 31_000).delay_s == 0
    # the batch's newest event moves the watermark past a window end: the close-out batch runs at once
    closing = pace_after(s, plan(wm=20_000, ts=30_000), Decision.WRITE, 36_000, 31_000)
    assert closing.closes_windows and closing.delay_s == 0
    # nothing closes: the next batch waits for the trigger's next multiple, never longer than one interval
    waiting = pace_after(s, plan(wm=20_000, ts=30_500), Decision.WRITE, 21_000, 31_000)
    assert not waiting.closes_windows and 0 < waiting.delay_s <= 5
    # planned at 30.5 s, it is 31 s: the next batch at 35 s plus the settings' margin
    assert waiting.delay_s == 4.15 and s.trigger_margin_ms == 150
    no_margin = s.replace(trigger_margin_ms=0)
    assert pace_after(no_margin, plan(wm=20_000, ts=30_500), Decision.WRITE, 21_000, 31_000).delay_s == 4


def test_a_closing_event_on_its_way_is_chased_once_per_window():
    s = config.load(env={}, app_id="a", trigger_interval_s=5, window_s=5, watermark_s=5, trigger_margin_ms=300)
    # planned at 35.3 s, the newest event at 34.8 s: the event at 35 s that closes the window ending at 30 s is late
    first = pace_after(s, plan(wm=25_000, ts=35_300), Decision.WRITE, 34_800, 35_400)
    assert not first.closes_windows and first.chasing_ms == 35_000
    assert first.delay_s == 0.4  # planned for 35 s + its 500 ms lag + the margin, 35.8 s; it is 35.4 s
    # the batch planned then still finds it short: the cadence again, at 40.3 s
    again = pace_after(s, plan(wm=25_000, ts=35_800), Decision.WRITE, 34_950, 35_900, chased_ms=first.chasing_ms)
    assert again.chasing_ms is None and again.delay_s == 4.4


def test_a_lead_batch_before_a_boundary_batch_that_would_hold_much():
    s = config.load(env={}, app_id="a", trigger_interval_s=5, window_s=5, watermark_s=5)
    assert (s.lead_batch_ms, s.lead_batch_min_records, s.trigger_margin_ms) == (700, 10_000, 150)
    # a close-out batch planned at 30.6 s, its newest event at 30.58 s: the boundary batch at 35.15 s reads the event
    # at 35 s that closes the next window; at 5,000 records/s a lead batch at 34.45 s takes 19,250 records off it
    busy = pace_after(s, plan(wm=25_100, ts=30_600), Decision.WRITE, 30_580, 30_900, records_per_s=5_000)
    assert busy.delay_s == 3.55 and not busy.closes_windows
    # at 200 records/s it would take 770: the cadence alone; so with lead batches off, or the rate unknown
    assert pace_after(s, plan(wm=25_100, ts=30_600), Decision.WRITE, 30_580, 30_900, records_per_s=200).delay_s == 4.25
    off = s.replace(lead_batch_ms=0)
    assert (
        pace_after(off, plan(wm=25_100, ts=30_600), Decision.WRITE, 30_580, 30_900, records_per_s=5_000).delay_s == 4.25
    )
    assert pace_after(s, plan(wm=25_100, ts=30_600), Decision.WRITE, 30_580, 30_900).delay_s == 4.25


def test_the_output_bound_before_a_batch_runs():
    spans = {7: 100, 8: 40}  # records read by Spark batches 7 and 8; the report is batch 6's
    assert output_rows_bound(8, spans, (6, 1_000), outputs=1) == 1_000 + 140 + 2 * 40
    assert output_rows_bound(8, spans, (6, 0), outputs=2) == 140 + 3 * 40  # stateless, two outputs
    assert output_rows_bound(8, spans, (7, 1_000), outputs=1) == 1_000 + 40 + 2 * 40
    assert output_rows_bound(8, spans, None, outputs=1) is None  # no report yet
    assert output_rows_bound(8, spans, (5, 1_000), outputs=1) is None  # batch 6 read before this driver: unknown


def test_progress_fields_carry_the_ledger_batch_and_decision():
    op = {"numRowsDroppedByWatermark": 3, "numRowsTotal": 100, "numRowsUpdated": 7}
    p = {  # Spark's JSON of a progress report; a rate that is not a number is left out (processedRowsPerSecond)
        "batchId": 12,
        "numInputRows": 500,
        "inputRowsPerSecond": 250.04,
        "durationMs": {"triggerExecution": 900},
        "eventTime": {"watermark": "2026-11-22T10:00:00.000Z"},
        "stateOperators": [op, op],
        "sources": [{"endOffset": {"src": {"0": 20}}, "latestOffset": {"src": {"0": 25}}}],
    }
    f = progress_fields(p, {"ledger_batch": 15, "decision": "write", "epoch": 1})
    assert (f["batch"], f["ledger_batch"], f["decision"], f["epoch"]) == (12, 15, "write", 1)
    assert f["rows_dropped_by_watermark"] == 6 and f["state_rows"] == 200 and f["processed_rows_per_s"] == 0
    assert f["input_rows_per_s"] == 250.0 and f["source_latest_offsets"] == '{"src":{"0":25}}'
    assert f["watermark"] == "2026-11-22T10:00:00.000Z" and f["duration_ms"] == {"triggerExecution": 900}


class _Refused(wire.OnceflowError):
    def __init__(self, code):
        super().__init__("refused")
        self.exit_code = code


@pytest.mark.parametrize(
    "err, code",
    [
        (tw.Fenced("newer instance"), wire.EXIT_FENCED),
        (DivergentHistory("ranges differ"), wire.EXIT_DIVERGENT),
        (RuntimeError("a crash"), wire.EXIT_FAILED),
        (None, wire.EXIT_FAILED),
        (_Refused(wire.EXIT_CONFIG), wire.EXIT_CONFIG),  # an error that names its own code (a table sink's refusal)
        (_Refused(None), wire.EXIT_FAILED),
    ],
)
def test_how_a_failed_query_ends(err, code):
    assert failure_exit_code(err) == code


@pytest.mark.parametrize(
    "err, code",
    [
        (InstanceLocked("another instance"), wire.EXIT_LOCKED),
        (preflight.BrokerUnreachable("broker down"), wire.EXIT_FAILED),  # transient: the supervisor tries again
        (preflight.PreflightError("topic missing"), wire.EXIT_CONFIG),
        (config.ConfigError("bad setting"), wire.EXIT_CONFIG),
        (tw.TxnConfigError("timeout above the broker's"), wire.EXIT_CONFIG),
        (tw.Fenced("fenced at init"), wire.EXIT_FENCED),
    ],
)
def test_how_a_refused_start_ends(err, code):
    assert startup_exit_code(err) == code
    # and what the supervisor does with it: everything but a crash ends supervision
    assert (code in wire.NO_RESTART) == (code != wire.EXIT_FAILED)


@pytest.mark.parametrize(
    "rc, lost",
    [
        (-9, True),  # spark-submit's JVM killed (kill -9 of the launch's group)
        (137, True),  # the Python driver killed: its JVM exits with 128 + 9
        (wire.EXIT_FAILED, False),  # an error the driver reported
        (wire.JVM_OUT_OF_MEMORY, False),  # the JVM's own OutOfMemoryError exit
    ],
)
def test_which_ends_a_warm_standby_replaces_at_once(rc, lost):
    s = config.Settings(restart_delay_s=7.0, standby=True)
    assert supervisor.driver_lost(rc) is lost
    assert supervisor.restart_delay(s, rc, standby_ready=True) == (0.0 if lost else 7.0)
    # no standby, or one still warming up (its takeover waits for its session; its warm-up is cut short): the fixed
    # delay, always
    assert supervisor.restart_delay(s, rc, standby_ready=False) == 7.0


def test_no_exit_code_of_the_driver_is_one_the_jvm_or_a_signal_uses():
    codes = [wire.EXIT_OK, wire.EXIT_FAILED, wire.EXIT_CONFIG, wire.EXIT_DIVERGENT, wire.EXIT_LOCKED, wire.EXIT_FENCED]
    assert len(set(codes)) == len(codes)
    assert wire.JVM_OUT_OF_MEMORY not in codes and wire.JVM_OUT_OF_MEMORY not in wire.NO_RESTART
    assert all(0 <= c <= 128 and not supervisor.driver_lost(c) for c in codes)


def test_a_standby_needs_client_mode():
    with pytest.raises(config.ConfigError, match="STANDBY needs"):
        config.Settings(standby=True, master="k8s://https://k:6443", deploy_mode="cluster", k8s_image="i").validate()


def test_a_lock_refusal_after_a_relaunch_is_retried_and_only_then(tmp_path):
    # the predecessor's Python driver may outlive its JVM for seconds after a takeover or a relaunch (review N-8)
    assert not supervisor.ends_for_good(wire.EXIT_LOCKED, relaunched=True)
    assert supervisor.ends_for_good(wire.EXIT_LOCKED, relaunched=False)  # the first launch: a real second instance
    assert supervisor.ends_for_good(wire.EXIT_FENCED, relaunched=True)
    assert supervisor.ends_for_good(wire.EXIT_CONFIG, relaunched=True)
    assert not supervisor.ends_for_good(wire.EXIT_FAILED, relaunched=False)


def test_a_standby_counts_as_ready_only_once_its_session_is_up(tmp_path):
    import subprocess
    import sys

    from onceflow.runtime import standby
    from onceflow.runtime.run_files import StandbyReady

    s = config.Settings(var_dir=tmp_path, standby=True)
    launches = supervisor.Launches(s, [], {})
    assert not launches.standby_ready()  # none
    launches.standby = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert not launches.standby_ready()  # alive, still warming up
        standby.ready_file(s).parent.mkdir(parents=True, exist_ok=True)
        StandbyReady(pgid=launches.standby.pid + 1, pid=1, ready_ms=1).write(standby.ready_file(s))
        assert not launches.standby_ready()  # another launch's word
        StandbyReady(pgid=launches.standby.pid, pid=1, ready_ms=1).write(standby.ready_file(s))
        assert launches.standby_ready()
    finally:
        launches.standby.kill()
        launches.standby.wait()
    assert not launches.standby_ready()  # dead


class _Query:
    """A streaming query as warm_up waits on it: awaitTermination(t) is True once it has ended."""

    def __init__(self, ends_after: int | None):
        self.calls, self.ends_after = 0, ends_after

    def awaitTermination(self, timeout: float) -> bool:
        self.calls += 1
        return self.ends_after is not None and self.calls > self.ends_after


def test_a_standby_told_to_take_over_cuts_its_warm_up_short():
    """The one-node chaos set of 2026-11-30: a standby told to take over while it warmed up went on warming, and
    took over 28-37 s after the kill, where a fresh launch started in 15 s."""
    from onceflow.runtime import driver

    told = iter([False, False, True])
    never_ends = _Query(ends_after=None)
    assert driver.await_or_cut(never_ends, 60.0, lambda: next(told), poll_s=0.0) == "cut"
    assert never_ends.calls == 3
    assert driver.await_or_cut(_Query(ends_after=1), 60.0, lambda: False, poll_s=0.0) == "done"
    assert driver.await_or_cut(_Query(ends_after=None), 0.05, lambda: False, poll_s=0.01) == "timeout"


def test_the_word_to_take_over_is_seen_while_warming_and_left_for_the_wait(tmp_path, monkeypatch):
    import os
    import threading

    from onceflow.runtime import standby

    monkeypatch.setenv(standby.STANDBY_ENV, str(os.getpid()))
    s = config.Settings(var_dir=tmp_path)
    s.run_dir.mkdir(parents=True)
    assert not standby.told_to_go(s)
    standby.signal_go(s, os.getpgid(0) + 1)  # another launch's word
    assert not standby.told_to_go(s)
    standby.signal_go(s, os.getpgid(0))
    assert standby.told_to_go(s) and standby.told_to_go(s)  # not consumed: wait_for_turn consumes it
    assert standby.wait_for_turn(s, threading.Event())
    assert not standby.told_to_go(s)


@pytest.mark.parametrize(
    ("used", "committed", "wait_s", "at", "due"),
    [
        (700, 1000, 4.0, 0.7, True),  # at the threshold, a wait that holds a collection
        (699, 1000, 4.0, 0.7, False),  # below it: the JVM is far from its own
        (900, 1000, 0.9, 0.7, False),  # a wait too short: the next batch would wait for the collection
        (900, 1000, 4.0, 0.0, False),  # 0: the JVM alone decides
        (5, 0, 4.0, 0.7, False),  # nothing committed (a JVM that reports no size)
    ],
)
def test_the_driver_heap_is_collected_between_batches_only_when_due_and_the_wait_holds_it(
    used, committed, wait_s, at, due
):
    assert collect_while_idle(used, committed, wait_s, at) is due
