"""Detached batch jobs (onceflow.runtime.batch_jobs), their progress lines (onceflow.rules.progress) and the
deferrable waits on them (onceflow.control.triggers and operators): with real child processes, no Spark, no
Airflow scheduler. The running-Airflow suite runs the same waits in a real triggerer."""

import asyncio
import json
import os
import re
import sys
import time

import pytest

from onceflow import config
from onceflow.rules import progress
from onceflow.runtime import batch_jobs, procs

# A stand-in for spark-submit: noise, progress lines in between, a result file, an exit code.
CHILD = """
import json, os, sys, time
out, code, steps, pause = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
for i in range(steps):
    print(f"25/11/25 10:00:0{i} INFO SparkContext: noise {i}", file=sys.stderr, flush=True)
    print(f"2025 INFO onceflow.progress {MARKER}step {i + 1} of {steps}", file=sys.stderr, flush=True)
    time.sleep(pause)
if code == 0:
    open(out, "w").write(json.dumps({"steps": steps, "nice": os.nice(0)}))
sys.exit(code)
""".replace("{MARKER}", progress.MARKER)


@pytest.fixture
def s(tmp_path):
    return config.load(env={}, var_dir=tmp_path)


def argv(tmp_path, code=0, steps=3, pause=0.05):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    return [sys.executable, str(script), str(tmp_path / "out.json"), str(code), str(steps), str(pause)]


def test_a_progress_step_says_k_of_n_the_rate_and_the_time_left():
    assert progress.step("backfill b", 3, 10, "chunk", 15000, 6.0) == (
        "backfill b: chunk 3 of 10, 15000 records, 2500 records/s, ETA 14 s"
    )
    # resumed at chunk 5: the time left comes from this run's pace, not from chunks it never wrote
    assert progress.step("backfill b", 6, 10, "chunk", 100, 2.0, start=5).endswith("ETA 8 s")
    assert progress.step("backfill b", 10, 10, "chunk", 100, 200.0).endswith("done in 3 min 20 s")
    assert "ETA" not in progress.step("backfill b", 0, 10, "chunk", 0, 0.0)


def test_progress_lines_are_found_in_noise_and_only_whole():
    text = f"noise\nINFO onceflow.progress {progress.MARKER}chunk 1 of 2\nmore {progress.MARKER} chunk 2 of 2 \n"
    assert progress.extract(text) == ["chunk 1 of 2", "chunk 2 of 2"]


def test_a_job_runs_detached_and_its_progress_and_result_come_back(s, tmp_path):
    seen: list[str] = []
    out = batch_jobs.run(s, "test", argv(tmp_path), tmp_path / "out.json", tmp_path / "job.log", 60, seen.append, 0.05)
    # below the streaming job's priority: a recount may wait for the CPU, the stream should not
    assert out == {"steps": 3, "nice": min(19, os.nice(0) + s.batch_job_nice)} and s.batch_job_nice == 10
    assert seen == ["step 1 of 3", "step 2 of 3", "step 3 of 3"]
    assert "noise 0" in (tmp_path / "job.log").read_text()  # the log stays whole; only progress is relayed
    assert list(batch_jobs.registry(s).iterdir()) == []  # nothing left registered


def test_a_failed_job_raises_with_the_end_of_its_log(s, tmp_path):
    with pytest.raises(batch_jobs.BatchJobError, match=r"exited with 3(.|\n)*step 2 of 2"):
        batch_jobs.run(s, "test", argv(tmp_path, code=3, steps=2), tmp_path / "out.json", tmp_path / "j.log", 60)


def test_a_job_past_its_deadline_is_stopped_with_its_whole_group(s, tmp_path):
    t0 = time.monotonic()
    with pytest.raises(batch_jobs.BatchJobError, match="deadline"):
        batch_jobs.run(s, "test", argv(tmp_path, steps=100, pause=1), tmp_path / "out.json", tmp_path / "j.log", 1.5)
    assert time.monotonic() - t0 < 30
    assert not [p for p in procs._live_stats() if str(tmp_path / "child.py") in procs.cmdline(p)]


def test_the_exit_code_outlives_the_launcher_and_a_killed_job_reads_as_stopped(s, tmp_path):
    h = batch_jobs.start(s, "test", argv(tmp_path, steps=100, pause=1), tmp_path / "out.json", tmp_path / "j.log", 60)
    h = batch_jobs.Handle.from_dict(json.loads(json.dumps(h.as_dict())))  # what a DAG hands on through XCom
    p = batch_jobs.poll(h, 0)
    assert not p.finished and p.rc is None
    procs.stop_process(int(procs.read_pidfile(batch_jobs.Path(h.pidfile))["pid"]), 10)
    p = procs.wait_until(lambda: (lambda q: q if q.finished else None)(batch_jobs.poll(h, 0)), 10, what="the end")
    assert p.rc is None
    with pytest.raises(batch_jobs.BatchJobError, match="stopped before it finished"):
        batch_jobs.outcome(h, p.rc)


def _events(trigger) -> list:
    async def collect():
        return [e async for e in trigger.run()]

    return asyncio.run(asyncio.wait_for(collect(), 60))


def test_the_trigger_relays_progress_to_the_log_and_fires_once_when_the_job_ends(s, tmp_path, capsys):
    from onceflow.control.triggers import BatchJobTrigger

    h = batch_jobs.start(s, "test", argv(tmp_path), tmp_path / "out.json", tmp_path / "j.log", 60)
    trigger = BatchJobTrigger(h.as_dict(), poll_s=0.05)
    path, kwargs = trigger.serialize()
    assert path == "onceflow.control.triggers.BatchJobTrigger"
    json.dumps(kwargs)  # the triggerer stores it as JSON
    events = _events(BatchJobTrigger(**kwargs))
    assert [e.payload["status"] for e in events] == ["done"]
    # the trigger's log (structlog, as in the triggerer, which files it into the task's log)
    said = re.findall(r"\] (step \d of 3)", capsys.readouterr().out)
    assert said == ["step 1 of 3", "step 2 of 3", "step 3 of 3"]


def test_the_operator_defers_then_returns_the_result_or_fails_with_the_reason(s, tmp_path, monkeypatch):
    from airflow.sdk.exceptions import TaskDeferred

    from onceflow.control import triggers
    from onceflow.control.operators import WaitForBatchJob
    from onceflow.control.triggers import BatchJobTrigger

    monkeypatch.setattr(triggers, "SETTLE_S", 1.5)
    h = batch_jobs.start(s, "test", argv(tmp_path), tmp_path / "out.json", tmp_path / "j.log", 60)
    op = WaitForBatchJob(task_id="wait", handle=h.as_dict())
    deferred_at = time.time()
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({})
    assert isinstance(deferred.value.trigger, BatchJobTrigger)
    [event] = _events(deferred.value.trigger)
    # a job that ends at once is still answered no sooner than SETTLE_S after the deferral (Airflow's stale-event race)
    assert time.time() - deferred_at >= 1.5
    assert op.execute_complete({}, event.payload)["steps"] == 3

    h = batch_jobs.start(s, "test", argv(tmp_path, code=4), tmp_path / "out.json", tmp_path / "j2.log", 60)
    [event] = _events(BatchJobTrigger(h.as_dict(), poll_s=0.05))
    assert event.payload["status"] == "failed"
    with pytest.raises(batch_jobs.BatchJobError, match="exited with 4"):
        WaitForBatchJob(task_id="wait2", handle=h.as_dict()).execute_complete({}, event.payload)


def test_the_first_commit_wait_fires_on_a_commit_after_the_launch_or_on_a_supervisor_gone(s, tmp_path):
    from onceflow.control.operators import WaitForFirstCommit
    from onceflow.control.triggers import FirstCommitTrigger
    from onceflow.runtime import jobctl, supervisor
    from onceflow.runtime.run_files import JobStatus

    # a live process stands in for the supervisor: its pid file marks it as running
    sleeper = procs.spawn_detached([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "sleep.log")
    try:
        procs.write_pidfile(supervisor.supervisor_pidfile(s), sleeper.pid, "time.sleep(60)")
        now = int(time.time() * 1000)
        wait = jobctl.CommitWait.of(s, now, 30, or_idle=True)
        # before the launch
        JobStatus(app=s.app_id, pid=41, started_ms=now - 6000, last_commit_ms=now - 5000, last_batch=7).write(
            s.status_file
        )
        assert wait.check() is None
        JobStatus(app=s.app_id, pid=42, started_ms=now, last_commit_ms=now + 5, last_batch=8).write(s.status_file)
        [event] = _events(FirstCommitTrigger({"launched": True, "wait": wait.as_dict()}, poll_s=0.05))
        assert event.payload["status"] == "done"
        op = WaitForFirstCommit(task_id="w", launched={"launched": True, "wait": wait.as_dict(), "log": "l"})
        assert op.execute_complete({}, event.payload) == {
            "launched": True,
            "log": "l",
            "first_batch": 8,
            "driver_pid": 42,
        }
    finally:
        procs.stop_process(sleeper.pid, 5)
    JobStatus(app=s.app_id, pid=42, started_ms=0, last_commit_ms=0).write(s.status_file)
    [event] = _events(FirstCommitTrigger({"launched": True, "wait": wait.as_dict()}, poll_s=0.05))
    assert event.payload["status"] == "failed" and "not running" in event.payload["error"]
    assert WaitForFirstCommit(task_id="w2", launched={"launched": False}).execute({}) == {"launched": False}


def test_no_trigger_fires_before_its_not_before_even_when_its_answer_is_there_at_once(s, tmp_path):
    """Airflow 3.3 fails a deferred task whose trigger fires before the scheduler took in the deferring worker's exit
    (apache/airflow#72716): a job already done, a commit already there or a supervisor already gone waits until
    `not_before`; the event is the same."""
    from onceflow.control.triggers import BatchJobTrigger, FirstCommitTrigger
    from onceflow.runtime import jobctl

    h = batch_jobs.start(s, "test", argv(tmp_path), tmp_path / "out.json", tmp_path / "j.log", 60)
    procs.wait_until(lambda: batch_jobs.poll(h, 0).finished, 30, what="the job's end")
    start = time.time()
    [event] = _events(BatchJobTrigger(h.as_dict(), poll_s=0.05, not_before=start + 1.0))
    assert event.payload["status"] == "done" and time.time() - start >= 1.0
    path, kwargs = BatchJobTrigger(h.as_dict(), not_before=start + 1.0).serialize()
    assert kwargs["not_before"] == start + 1.0  # it survives the triggerer's storage

    wait = jobctl.CommitWait.of(s, int(start * 1000), 30, or_idle=True)  # no supervisor: fails at once, not sooner
    start = time.time()
    [event] = _events(FirstCommitTrigger({"launched": True, "wait": wait.as_dict()}, not_before=start + 1.0))
    assert event.payload["status"] == "failed" and time.time() - start >= 1.0
