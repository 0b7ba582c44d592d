"""A chaos run asks a job that commits nothing for its threads' stacks (onceflow_dev.stall_stacks): when, how often,
and never of a process that is not a job driver (SIGUSR1's default action ends a process)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from onceflow.rules import clock
from onceflow.runtime import procs, supervisor
from onceflow_dev import stall_stacks


def test_due_after_a_quiet_stall_and_not_again_within_the_interval():
    assert not stall_stacks.due(now_ms=44_000, quiet_since_ms=0, last_sent_ms=0, stall_s=45, every_s=20)
    assert stall_stacks.due(now_ms=45_000, quiet_since_ms=0, last_sent_ms=0, stall_s=45, every_s=20)
    assert not stall_stacks.due(now_ms=60_000, quiet_since_ms=0, last_sent_ms=45_000, stall_s=45, every_s=20)
    assert stall_stacks.due(now_ms=65_000, quiet_since_ms=0, last_sent_ms=45_000, stall_s=45, every_s=20)
    # a commit since: quiet again only from it
    assert not stall_stacks.due(now_ms=65_000, quiet_since_ms=50_000, last_sent_ms=0, stall_s=45, every_s=20)


def _watching(monkeypatch, s, pid: int, quiet_s: float) -> stall_stacks.StallStacks:
    """A watcher of `driver`'s process (tests/unit/conftest.py), whose status says it started `quiet_s` ago."""
    status = SimpleNamespace(pid=pid, started_ms=clock.now_ms() - int(quiet_s * 1000), last_commit_ms=None)
    monkeypatch.setattr(stall_stacks.JobStatus, "read", lambda _path: status)
    return stall_stacks.StallStacks(s, stall_s=45, every_s=20, poll_s=0.05)


def _stacks_in_log(s) -> bool:
    return "most recent call first" in supervisor.job_log(s).read_text()


def test_a_quiet_driver_is_asked_once_per_interval_and_runs_on(monkeypatch, driver):
    s, start = driver
    p = start(is_driver=True)
    watch = _watching(monkeypatch, s, p.pid, quiet_s=50)
    watch.start()
    procs.wait_until(lambda: _stacks_in_log(s), 20, what="the driver's stacks")
    time.sleep(0.5)  # ten more polls: the interval (20 s) holds the next ask back
    sent = watch.stop()
    assert [pid for _, pid in sent] == [p.pid]
    assert p.poll() is None  # it runs on


def test_a_process_that_is_not_a_job_driver_is_never_signalled(monkeypatch, driver):
    s, start = driver
    p = start(is_driver=False)  # SIGUSR1 would end it
    watch = _watching(monkeypatch, s, p.pid, quiet_s=50)
    watch.start()
    time.sleep(0.5)
    assert watch.stop() == []
    assert p.poll() is None


def test_a_job_that_commits_is_left_alone(monkeypatch, driver):
    s, start = driver
    p = start(is_driver=True)
    watch = _watching(monkeypatch, s, p.pid, quiet_s=10)
    watch.start()
    time.sleep(0.5)
    assert watch.stop() == []
    assert not _stacks_in_log(s)
