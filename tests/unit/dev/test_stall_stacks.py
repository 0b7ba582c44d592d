"""A chaos run asks a job that commits nothing for its threads' stacks (onceflow_dev.stall_stacks): when, how often,
and never of a process that is not a job driver (SIGUSR1's default action ends a process)."""

from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from onceflow.rules import clock
from onceflow.runtime import procs
from onceflow_dev import stall_stacks


def test_due_after_a_quiet_stall_and_not_again_within_the_interval():
    assert not stall_stacks.due(now_ms=44_000, quiet_since_ms=0, last_sent_ms=0, stall_s=45, every_s=20)
    assert stall_stacks.due(now_ms=45_000, quiet_since_ms=0, last_sent_ms=0, stall_s=45, every_s=20)
    assert not stall_stacks.due(now_ms=60_000, quiet_since_ms=0, last_sent_ms=45_000, stall_s=45, every_s=20)
    assert stall_stacks.due(now_ms=65_000, quiet_since_ms=0, last_sent_ms=45_000, stall_s=45, every_s=20)
    # a commit since: quiet again only from it
    assert not stall_stacks.due(now_ms=65_000, quiet_since_ms=50_000, last_sent_ms=0, stall_s=45, every_s=20)


@pytest.fixture
def child(tmp_path):
    """Start a process (`driver`: its command line is a job driver's, it writes its stacks on the signal)."""
    started = []

    def start(driver: bool) -> tuple[subprocess.Popen, object]:
        out = tmp_path / f"stacks-{len(started)}.txt"
        code = (
            "import faulthandler, sys, time\n"
            "from onceflow import wire\n"
            f"f = open({str(out)!r}, 'w')\n"
            "faulthandler.register(wire.STACKS_SIGNAL, file=f, all_threads=True)\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n"
        )
        script = tmp_path / ("entrypoints" if driver else "other") / "stream.py"
        script.parent.mkdir(exist_ok=True)
        script.write_text(code if driver else "import time\nprint('ready', flush=True)\ntime.sleep(60)\n")
        p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        started.append(p)
        return p, out

    yield start
    for p in started:
        p.kill()
        p.wait(10)


def _watching(monkeypatch, pid: int, quiet_s: float) -> stall_stacks.StallStacks:
    status = SimpleNamespace(pid=pid, started_ms=clock.now_ms() - int(quiet_s * 1000), last_commit_ms=None)
    monkeypatch.setattr(stall_stacks.JobStatus, "read", lambda _path: status)
    return stall_stacks.StallStacks(SimpleNamespace(status_file=None), stall_s=45, every_s=20, poll_s=0.05)


def test_a_quiet_driver_is_asked_once_per_interval_and_runs_on(monkeypatch, child):
    p, out = child(driver=True)
    watch = _watching(monkeypatch, p.pid, quiet_s=50)
    watch.start()
    procs.wait_until(lambda: "most recent call first" in out.read_text(), 20, what="the driver's stacks")
    time.sleep(0.5)  # ten more polls: the interval (20 s) holds the next ask back
    sent = watch.stop()
    assert [pid for _, pid in sent] == [p.pid]
    assert p.poll() is None  # it runs on


def test_a_process_that_is_not_a_job_driver_is_never_signalled(monkeypatch, child):
    p, _ = child(driver=False)  # SIGUSR1 would end it
    watch = _watching(monkeypatch, p.pid, quiet_s=50)
    watch.start()
    time.sleep(0.5)
    assert watch.stop() == []
    assert p.poll() is None


def test_a_job_that_commits_is_left_alone(monkeypatch, child):
    p, out = child(driver=True)
    watch = _watching(monkeypatch, p.pid, quiet_s=10)
    watch.start()
    time.sleep(0.5)
    assert watch.stop() == []
    assert out.read_text() == ""
