"""Pure control-plane logic: Burrow lag rules, alert deduplication, hanging transactions, health assessment."""

import dataclasses
import logging

from onceflow import config, wire
from onceflow.control import alerts, health, txnwatch
from onceflow.rules import lag
from onceflow.rules.lag import Sample
from onceflow.runtime.run_files import JobStatus


def samples(pairs, t0=0, step=60_000, commit_ts=None):
    return [Sample(t0 + i * step, c, e, commit_ts) for i, (c, e) in enumerate(pairs)]


def test_burrow_rules():
    assert lag.evaluate(samples([(10, 10), (20, 30), (30, 50)])) == lag.Level.OK  # lag was zero in the window
    assert lag.evaluate(samples([(10, 20), (20, 40), (30, 70)])) == lag.Level.WARN  # moving, lag grows
    assert lag.evaluate(samples([(10, 20), (20, 25), (30, 32)])) == lag.Level.OK  # moving, lag shrinks
    assert lag.evaluate(samples([(10, 20), (10, 25), (10, 30)])) == lag.Level.STALL  # stuck with lag
    assert lag.evaluate(samples([(10, 20), (10, 25), (10, 30)], commit_ts=-(10**9))) == lag.Level.STOP
    assert lag.evaluate(samples([(10, 20), (5, 25), (12, 30)])) == lag.Level.REWIND
    assert lag.evaluate(samples([(10, 20), (10, 25)])) == lag.Level.OK  # too few samples to judge
    # a restart starts a new window, and falling behind is judged from the run's first commit on: the growth while
    # the job was down, starting and committing its first batch is the restart's
    restarted = samples([(10, 20), (20, 40), (20, 70), (20, 90), (60, 140), (90, 175)])
    assert lag.evaluate(restarted) == lag.Level.WARN
    run = restarted[2].ts_ms
    assert lag.evaluate(restarted, since_ms=run) == lag.Level.OK
    behind = restarted + samples([(120, 210)], t0=restarted[-1].ts_ms + 60_000)
    assert lag.evaluate(behind, since_ms=run) == lag.Level.WARN  # three samples since its first commit, growing
    assert lag.evaluate(restarted[:4], since_ms=run) == lag.Level.OK  # two samples of this run: too few
    stuck = restarted[:4] + samples([(20, 99)], t0=10**6)
    assert lag.evaluate(stuck, since_ms=run) == lag.Level.STALL  # committed once, then stuck
    # a run that has not committed since its start (a slow start under load, longer than two health intervals) is
    # not a stalled consumer: health's progress rule judges it against its own threshold
    assert lag.evaluate(stuck, since_ms=run, run_committed=False) == lag.Level.OK
    assert lag.evaluate(samples([(10, 20), (5, 25), (12, 30)]), since_ms=0, run_committed=False) == lag.Level.REWIND
    assert lag.evaluate(restarted, since_ms=restarted[-1].ts_ms + 1) == lag.Level.OK  # nothing in this run yet
    assert lag.evaluate(samples([(10, 20), (5, 25), (12, 30)]), since_ms=10**9) == lag.Level.REWIND  # across runs too
    assert lag.trend(samples([(0, 5), (0, 9)])) is lag.Trend.GROWING
    assert lag.worst([lag.Level.OK, lag.Level.WARN, lag.Level.STALL]) == lag.Level.STALL


def test_lag_that_grows_within_the_commit_cycle_is_not_falling_behind():
    """The running-Airflow test saw a WARN on every partition after a restart (lags 153, 150, ...; 200 records/s in
    all, a 5 s trigger): three health samples taken at random points of the job's 5 s commit cycle grew by chance.
    Lag within what two trigger intervals bring is the cycle's; beyond it, growth is falling behind."""
    step = 30_000  # health every 30 s; 50 records/s on this partition: 1,500 between samples
    keeping_up = samples([(1_460, 1_500), (2_910, 3_000), (4_347, 4_500)], step=step)  # lag 40, 90, 153
    assert lag.evaluate(keeping_up) == lag.Level.WARN  # the rule without the cycle: growth by chance
    assert lag.cycle(keeping_up, noise_s=10.0) == 500.0
    assert lag.evaluate(keeping_up, noise_s=10.0) == lag.Level.OK
    behind = samples([(1_000, 1_500), (2_300, 3_000), (3_600, 4_500)], step=step)  # lag 500, 700, 900
    assert lag.evaluate(behind, noise_s=10.0) == lag.Level.WARN
    assert health.lag_noise_s(config.load(env={}, trigger_interval_s=5.0)) == 10.0


def cond(key, one_off=False):
    return alerts.Condition(key, alerts.Severity.CRITICAL, f"summary {key}", "do something", one_off=one_off)


def test_alerts_fire_once_while_a_condition_persists_and_resolve_once():
    state = {}
    first = alerts.transitions([cond("h:down")], state, "app", "health", "h:")
    assert [(a.key, a.status) for a in first] == [("h:down", alerts.Status.FIRING)]
    state = alerts.fold_state(first)
    assert alerts.transitions([cond("h:down")], state, "app", "health", "h:") == []
    resolved = alerts.transitions([], state, "app", "health", "h:")
    assert [(a.key, a.status) for a in resolved] == [("h:down", alerts.Status.RESOLVED)]
    state = alerts.fold_state(first + resolved)
    assert alerts.transitions([], state, "app", "health", "h:") == []
    again = alerts.transitions([cond("h:down")], state, "app", "health", "h:")
    assert [a.status for a in again] == [alerts.Status.FIRING]


def test_a_check_resolves_only_its_own_conditions():
    state = {"h:down": alerts.Status.FIRING, "t:hanging:x": alerts.Status.FIRING}
    out = alerts.transitions([], state, "app", "txn_watch", "t:")
    assert [(a.key, a.status) for a in out] == [("t:hanging:x", alerts.Status.RESOLVED)]


def test_the_same_condition_twice_in_one_evaluation_is_one_alert():
    out = alerts.transitions([cond("t:event:1", one_off=True), cond("t:event:1", one_off=True)], {}, "a", "t", "t:")
    assert len(out) == 1


def test_one_off_alerts_fire_once_and_never_resolve():
    first = alerts.transitions([cond("t:event:1", one_off=True)], {}, "app", "t", "t:")
    state = alerts.fold_state(first)
    assert state == {"t:event:1": alerts.ONCE}
    assert alerts.transitions([cond("t:event:1", one_off=True)], state, "app", "t", "t:") == []
    assert alerts.transitions([], state, "app", "t", "t:") == []


def test_alert_json_roundtrip_and_text():
    a = alerts.transitions([cond("k")], {}, "app", "src", "k")[0]
    assert alerts.Alert.from_json(a.to_json()) == a
    assert "What to do: do something" in a.text()


def test_hanging_transactions_are_those_older_than_the_timeout():
    mine = txnwatch.OpenTxn("sink", 1, 40, 45, first_ts_ms=1_000, app="ip_count", batch="7")
    fresh = txnwatch.OpenTxn("sink", 2, 10, 12, first_ts_ms=60_000, app="ip_count", batch="8")
    out = txnwatch.hanging([mine, fresh], now_ms=62_000, timeout_ms=60_000)
    assert len(out) == 1 and out[0].key == "txn_watch:hanging:sink:1"
    assert out[0].details["age_ms"] == 61_000 and "onceflow.ip_count" in out[0].summary
    assert "--start-offset 40" in out[0].action


def test_timeout_event_absorbs_its_near_timeout_warning():
    base = {"app": "a", "host": "h", "pid": 1, "transactional_id": "onceflow.a", "timeout_ms": 6000}
    evs = [
        dict(base, type=wire.TRANSACTION_NEAR_TIMEOUT, batch=3, txn_ms=4900, committed=False),
        dict(base, type=wire.TRANSACTION_TIMEOUT, batch=3, elapsed_ms=6100, action="raise it"),
        dict(base, type=wire.TRANSACTION_NEAR_TIMEOUT, batch=5, txn_ms=5000, committed=True),
    ]
    out = txnwatch.event_conditions(evs)
    assert [c.key.split(":")[2] for c in out] == ["timeout", "near_timeout"]
    assert not out[0].one_off and out[1].one_off and out[0].severity == alerts.Severity.CRITICAL
    # the timeout stays open until the job commits that batch (or a later one) after it
    timeout = dict(evs[1], ts_ms=5_000)
    commit = dict(base, type=wire.BATCH_COMMITTED)
    assert not txnwatch.replayed(timeout, [dict(commit, batch=3, ts_ms=4_000)])  # before the timeout
    assert not txnwatch.replayed(timeout, [dict(commit, batch=2, ts_ms=6_000)])  # an earlier batch
    assert txnwatch.replayed(timeout, [dict(commit, batch=3, ts_ms=6_000)])


def test_a_timeout_and_its_replay_between_two_watch_runs_give_one_alert_and_its_resolution(monkeypatch):
    """Through the watch itself, with the alert record in memory: fire, keep while not replayed, resolve once."""
    s = config.load(env={}, app_id="a")
    base = {"app": "a", "host": "h", "pid": 1, "transactional_id": "onceflow.a", "timeout_ms": 6000}

    class Sink(alerts.AlertSink):
        def __init__(self):
            super().__init__(s)
            self.record: list = []

        def history(self):
            return list(self.record)

        def publish(self, found):
            self.record += found
            return list(found)

    runs = [
        [dict(base, type=wire.TRANSACTION_TIMEOUT, batch=3, elapsed_ms=6100, ts_ms=5_000)],
        [dict(base, type=wire.BATCH_COMMITTED, batch=2, ts_ms=6_000)],
        [dict(base, type=wire.BATCH_COMMITTED, batch=3, ts_ms=7_000)],
        [
            dict(base, type=wire.TRANSACTION_TIMEOUT, batch=9, elapsed_ms=6100, ts_ms=8_000, pid=2),
            dict(base, type=wire.BATCH_COMMITTED, batch=9, ts_ms=9_000, pid=3),
        ],
        [],
    ]
    monkeypatch.setattr(txnwatch, "open_transactions", lambda settings, topics: [])
    sink = Sink()
    for evs in runs:
        monkeypatch.setattr(txnwatch, "new_events", lambda settings, types, evs=evs: evs)
        txnwatch.watch(s, sink, now_ms=10_000)
    assert [(a.key.split(":")[-1], a.status) for a in sink.record] == [
        ("3", alerts.Status.FIRING),
        ("3", alerts.Status.RESOLVED),
        ("9", alerts.Status.FIRING),
        ("9", alerts.Status.RESOLVED),
    ]


def record(**kw):
    base = dict(
        app="a",
        ts_ms=1_000_000,
        running=True,
        job_pid=1,
        last_commit_age_s=5.0,
        partitions={},
        total_lag=0,
        checkpoint_age_s=5.0,
        desired="running",
        progress_age_s=5.0,
    )
    return health.HealthRecord(**(base | kw))


def test_health_assessment():
    s = config.load(env={}, app_id="a")
    assert health.assess(record(), s) == []
    down = health.assess(rec := record(running=False, job_pid=None), s)
    assert [c.key for c in down] == ["health:a:down"] and rec.status == health.State.FAILING
    stopped = health.assess(rec := record(running=False, job_pid=None, desired="stopped", total_lag=50), s)
    assert stopped == [] and rec.status == health.State.STOPPED  # stopped on purpose: not restarted, not alerted
    assert health.assess(record(running=False, job_pid=None, desired=None), s) == []  # never deployed
    stalled = health.assess(record(total_lag=500, progress_age_s=999.0), s)
    assert [c.key for c in stalled] == ["health:a:stalled"]
    idle = health.assess(record(total_lag=0, progress_age_s=9999.0, checkpoint_age_s=9999.0), s)
    assert idle == []  # no input waiting: an idle job is healthy
    warn = health.assess(rec := record(partitions={"0": {"status": lag.Level.WARN, "lag": 9, "trend": "growing"}}), s)
    assert [c.severity for c in warn] == [alerts.Severity.WARNING] and rec.status == health.State.DEGRADED


def test_a_job_that_just_started_or_runs_a_long_batch_is_not_stalled():
    s = config.load(env={}, app_id="a", health_progress_threshold_s=120, health_batch_grace_s=600)
    # progress is judged from the later of the last commit and the start: a job started 10 s ago is fine
    assert health.assess(record(total_lag=500, last_commit_age_s=None, progress_age_s=10.0), s) == []
    # a batch in progress (a catch-up after a restore) gets the grace on top of the threshold ...
    assert health.assess(record(total_lag=500, progress_age_s=500.0, batch_running_s=500.0), s) == []
    # ... and no more
    late = health.assess(record(total_lag=500, progress_age_s=800.0, batch_running_s=800.0), s)
    assert [c.key for c in late] == ["health:a:stalled"] and "batch running for 800.0 s" in late[0].summary


def test_a_job_that_ended_for_good_pages_and_is_not_restarted():
    s = config.load(env={}, app_id="a")
    for code, why in (
        (wire.EXIT_FENCED, "fenced"),
        (wire.EXIT_DIVERGENT, "divergent history"),
        (wire.EXIT_CONFIG, "misconfiguration"),
    ):
        rec = record(running=False, job_pid=None, last_exit={"exit_code": code, "reason": why})
        found = health.assess(rec, s)
        assert [c.key for c in found] == ["health:a:not_restartable"] and why in found[0].summary
        started = []
        assert health.remediate(rec, found, s, 1_000_000, started.append) == [] and started == []
    # a crash the supervisor gave up on (exit 1) is restarted
    rec = record(running=False, job_pid=None, last_exit={"exit_code": 1, "reason": "restart attempts exhausted"})
    assert [c.key for c in health.assess(rec, s)] == ["health:a:down"]


def test_everything_late_and_a_watermark_off_the_clock_alert():
    s = config.load(env={}, app_id="a", max_event_ahead_s=60, watermark_s=5)
    now = 1_800_000_000_000
    assert health.late_share(
        [
            {"decision": "write", "input_rows": 100, "rows_dropped_by_watermark": 90, "state_rows_updated": 10},
            {"decision": "catch_up", "input_rows": 100, "rows_dropped_by_watermark": 0, "state_rows_updated": 500},
        ]
    ) == (0.9, 1)
    assert health.late_share([{"input_rows": 5, "rows_dropped_by_watermark": 1, "state_rows_updated": 2}]) == (None, 1)
    late = health.assess(record(ts_ms=now, watermark_ms=now - 10_000, late_fraction=0.9, late_batches=4), s)
    assert [c.key for c in late] == ["health:a:late"] and "90%" in late[0].summary
    ahead = health.assess(record(ts_ms=now, watermark_ms=now + 365 * 86_400_000), s)
    assert [c.key for c in ahead] == ["health:a:watermark_ahead"]
    # what it advises can work: a restore inherits the jump (review N-1); a backfill or a new app id does not
    assert "backfill" in ahead[0].action and "new app id" in ahead[0].action
    assert "restore a savepoint" not in ahead[0].action
    assert health.assess(record(ts_ms=now, watermark_ms=now + 60_000), s) == []  # within the allowed skew
    behind = health.assess(record(ts_ms=now, watermark_ms=now - 2 * 3600_000), s)
    assert [c.key for c in behind] == ["health:a:event_time_lag"] and behind[0].severity == alerts.Severity.WARNING
    # a backlog explains an old watermark
    assert (
        health.assess(record(ts_ms=now, watermark_ms=now - 2 * 3600_000, total_lag=10**7, progress_age_s=1.0), s) == []
    )


def test_remediation_is_bounded_and_never_changes_the_operators_intent(tmp_path):
    """No stub of jobctl: the real stop runs (nothing is running in this var dir), and the desired state the
    operator set must survive a restart by the health check, also one whose start fails."""
    from onceflow.runtime import jobctl

    s = config.load(env={}, app_id="a", var_dir=tmp_path, health_restart_attempts=2, health_restart_window_s=600)
    jobctl._set_desired(s, "running")
    started = []
    lagging = record(partitions={"0": {"status": lag.Level.WARN, "lag": 9, "trend": "growing"}})
    assert health.remediate(lagging, health.assess(lagging, s), s, 1_000_000, started.append) == []
    assert started == [] and lagging.action == "none"  # lag alone is alerted, not restarted

    def failing_start(_):
        raise RuntimeError("cannot reach the Kafka broker")

    rec = record(running=False, job_pid=None)
    found = health.assess(rec, s)
    paged = health.remediate(rec, found, s, 1_000_000, failing_start)
    assert [c.key for c in paged] == ["health:a:restart_failed"] and "cannot reach" in paged[0].summary
    assert rec.action == health.Action.RESTART_FAILED and rec.restarts == [1_000_000]
    assert jobctl.desired_state(s) == "running"  # the operator's intent is untouched
    assert health.remediate(rec, found, s, 1_100_000, started.append) == [] and rec.action == health.Action.RESTARTED
    assert jobctl.desired_state(s) == "running" and len(started) == 1
    paged = health.remediate(rec, found, s, 1_200_000, started.append)  # two attempts (one failed) used up
    assert [c.key for c in paged] == ["health:a:gave_up"] and len(started) == 1 and rec.action == health.Action.GAVE_UP
    # outside the window the budget is back
    assert health.remediate(rec, found, s, 1_000_000 + 700_000 + 600_000, started.append) == []
    assert len(started) == 2


def test_a_stalled_drivers_stacks_are_logged_before_the_health_check_restarts_it(driver, caplog):
    """A restart ends the wait a stalled job was in; the health run's log (and the job log) keep where it was."""
    s, start = driver
    p = start(is_driver=True)
    stalled = record(total_lag=500, progress_age_s=10_000.0, last_commit_age_s=10_000.0)
    found = health.assess(stalled, s)
    assert [c.key for c in found] == [f"health:{s.app_id}:stalled"] and "stacks" in found[0].action
    started = []
    with caplog.at_level(logging.WARNING, logger=health.log.name):
        assert health.remediate(stalled, found, s, 1_000_000, started.append) == []
    assert stalled.action == health.Action.RESTARTED and len(started) == 1
    assert stalled.stacks_logged_ms == 1_000_000 and stalled.waiting_in == []  # its one thread is outside onceflow
    assert f"pid {p.pid}" in caplog.text and "(most recent call first):" in caplog.text
    # the stalled alert says where the driver waited, when its stacks named a frame of onceflow's
    stalled.waiting_in = ["onceflow/kafka/transactional.py:317 in call"]
    [alert] = health.with_stacks(found, stalled, s)
    assert alert.details["waiting_in"] == stalled.waiting_in and alert.details["lag"] == 500
    # a job that is down has no driver to ask: restarted without
    caplog.clear()
    down = record(running=False, job_pid=None)
    assert health.remediate(down, health.assess(down, s), s, 2_000_000, started.append) == []
    assert down.stacks_logged_ms is None and "most recent call first" not in caplog.text and len(started) == 2


def test_a_relaunched_job_is_not_judged_by_its_predecessors_status(tmp_path):
    """Between a relaunch (new job pid file) and the new driver's first status write, the status file is the old
    process's: its start and its running batch must not count, or health would kill a job that is still starting.
    And a job that exited for good while its supervisor was gone (no exit file) is known by its status."""
    import subprocess
    import sys
    import time

    from onceflow.runtime import jobctl, procs, supervisor

    s = config.load(env={}, app_id="a", var_dir=tmp_path)
    old_start = int(time.time() * 1000) - 3600_000
    JobStatus(
        app="a",
        pid=1,
        state=wire.JobState.RUNNING,
        started_ms=old_start,
        running_batch=7,
        batch_started_ms=old_start + 1000,
        last_commit_ms=old_start + 500,
    ).write(s.status_file)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", supervisor.JOB_MARKER])
    try:
        procs.write_pidfile(supervisor.job_pidfile(s), proc.pid, supervisor.JOB_MARKER)
        st = jobctl.status(s)
        assert st.running and st.state == "starting"
        assert st.started_ms >= old_start + 3500_000, "the predecessor's start was taken for this launch's"
        assert st.running_batch is None and st.batch_started_ms is None
        # the new driver writes its own status: from then on it is the truth
        now = int(time.time() * 1000) + 1000
        JobStatus(
            app="a", pid=2, state=wire.JobState.RUNNING, started_ms=now, running_batch=0, batch_started_ms=now + 10
        ).write(s.status_file)
        st = jobctl.status(s)
        assert (st.state, st.started_ms, st.running_batch) == ("running", now, 0)
    finally:
        proc.kill()
        proc.wait()
    JobStatus(
        app="a", pid=2, state=wire.JobState.FAILED, started_ms=old_start, exit_code=wire.EXIT_FENCED, error="fenced"
    ).write(s.status_file)
    st = jobctl.status(s)
    assert not st.running and st.last_exit is not None and st.last_exit.exit_code == wire.EXIT_FENCED
    rec = record(running=False, job_pid=None, last_exit=st.last_exit.as_json())
    assert [c.key for c in health.assess(rec, s)] == ["health:a:not_restartable"]


def test_a_job_its_supervisor_is_restarting_is_not_down():
    """Between two runs of the job (a crash, the supervisor's fixed delay), health must not restart it too: its
    restart would stop the supervisor's. A supervisor that has not brought the job back within the threshold is."""
    s = config.load(env={}, app_id="a", health_progress_threshold_s=120)
    restarting = record(running=False, job_pid=None, supervised=True, progress_age_s=15.0, total_lag=500)
    assert health.assess(restarting, s) == [] and restarting.status == health.State.RESTARTING
    assert restarting.problems == ["the supervisor is restarting the job"]
    started = []
    assert health.remediate(restarting, [], s, 1_000_000, started.append) == [] and started == []
    too_long = record(running=False, job_pid=None, supervised=True, progress_age_s=500.0, total_lag=500)
    assert [c.key for c in health.assess(too_long, s)] == ["health:a:down"]


def test_job_status_is_one_typed_record_whose_json_keeps_the_cli_keys(tmp_path):
    """`onceflow job status --json` and the console print JobView.as_dict(): the keys they always printed."""
    import json

    from onceflow.runtime import jobctl, supervisor
    from onceflow.runtime.run_files import Exited

    s = config.load(env={}, app_id="a", var_dir=tmp_path)
    st = jobctl.status(s)
    assert (st.running, st.state, st.job_pid, st.last_exit, st.standby) == (
        False,
        wire.JobState.STOPPED,
        None,
        None,
        None,
    )
    Exited(exit_code=wire.EXIT_FENCED, reason="fenced", ts_ms=5).write(supervisor.exit_file(s))
    d = jobctl.status(s).as_dict()
    assert set(d) == {
        "app", "supervisor_pid", "job_pid", "host", "running", "restarts", "state", "last_batch", "last_commit_age_s",
        "committed_batches", "replays_skipped", "watermark_ms", "end_offsets", "last_txn_ms", "last_timings",
        "close_out_batches", "progress", "checkpoint", "bootstrap_servers", "transactional_id", "status_file", "log",
        "error", "desired_state", "started_ms", "last_commit_ms", "running_batch", "batch_started_ms", "last_exit",
        "standby", "idle_collections",
    }  # fmt: skip
    assert d["last_exit"] == {"exit_code": wire.EXIT_FENCED, "reason": "fenced", "ts_ms": 5}
    assert json.loads(json.dumps(d)) == d


def test_a_launch_is_a_typed_result_whose_xcom_has_the_fields_that_apply():
    from onceflow.control import deploy

    launched = deploy.Launch(supervisor_pid=7, log="/l", wait={"after_ms": 1, "deadline": 2.0})
    assert launched.as_dict() == {"launched": True, "supervisor_pid": 7, "log": "/l", "wait": launched.wait}
    upgraded = dataclasses.replace(launched, savepoint="sp-1", savepoint_batch=4)
    assert upgraded.as_dict()["savepoint"] == "sp-1" and "restore" not in upgraded.as_dict()
    assert deploy.Stopped(True, 12).as_dict() == {"stopped": True, "last_batch": 12}
