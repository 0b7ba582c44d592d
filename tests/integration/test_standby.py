"""A warm standby driver takes over a lost driver at once, keeps the fixed delay for a failure the driver reported,
and loses and duplicates nothing (onceflow.runtime.standby, onceflow.runtime.supervisor)."""

from __future__ import annotations

import threading

import pytest

from onceflow import wire
from onceflow.runtime import job_view, jobctl, procs, standby
from tests.support.harness import assert_exact, events, now_ms, produce, wait_drained


def _standby_ready(s) -> job_view.StandbyView:
    """The warm standby of a running job (not in a restart's delay, when the job has no live driver)."""

    def ready():
        st = jobctl.status(s)
        return st.running and st.state == "running" and st.standby and st.standby.ready and st.standby

    # 480 s: the standby is launched once the active driver commits and then warms a session of its own; on a slow
    # 2-core machine beside another module, after the injected failure's takeover, that took over 240 s in CI
    return procs.wait_until(ready, 480, interval=0.5, what="a running job with a warm standby")


@pytest.mark.long  # `make test-long`: an optional mode (standby=True); a lost driver's restart is make test's
def test_a_warm_standby_takes_over_and_loses_nothing(app, tmp_path):
    # raise_after_commit: a failure the driver reports (not a lost process): the fixed delay is kept
    s = app(standby=True, max_offsets_per_trigger=3000, restart_delay_s=4.0, fault="raise_after_commit@12")
    produced: dict = {}
    kills_done = threading.Event()

    def feed():
        produced["sent"] = produce(
            s,
            tmp_path / "m.csv",
            kills_done,  # input flows through the kill, however long a warm standby takes to come up under load
            count=1_000_000,
            rate=400,
            event_rate=400,
            distinct_ips=300,
            out_of_order_fraction=0.05,
            late_fraction=0.01,
            malformed_fraction=0.02,
            tail_s=30,
            seed=4,
        )

    jobctl.start(s)
    jobctl.wait_running(s, timeout=240)
    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        _kill_once(s)
    finally:
        kills_done.set()
    feeder.join(timeout=300)
    sent = produced["sent"]
    wait_drained(s, sent, timeout=420)
    assert_exact(s, sent)

    restarts = events(s, wire.SUPERVISOR_RESTART)
    lost = [e for e in restarts if e["lost"]]
    assert lost and lost[0]["standby"] and lost[0]["delay_s"] == 0
    reported = [e for e in restarts if not e["lost"]]
    assert [e["exit_code"] for e in reported] == [wire.EXIT_FAILED]  # the injected error after batch 12's commit
    assert reported[0]["delay_s"] == s.restart_delay_s
    started_after = [e for e in events(s, wire.JOB_STARTED) if e["ts_ms"] > reported[0]["ts_ms"]]
    assert started_after and started_after[0]["ts_ms"] - reported[0]["ts_ms"] >= s.restart_delay_s * 1000
    assert {e["fault"] for e in events(s, wire.FAULT_INJECTED)} == {"raise_after_commit@12"}

    # a standby whose supervisor is gone (the driver's machine lost the whole tree but the standby's own group)
    # exits without taking over; a stop's standby is stopped by its supervisor (the session's leak check)
    last = _standby_ready(s)
    jobctl.kill(s, with_supervisor=True)
    procs.wait_until(lambda: not procs.pid_alive(last.pid), 60, what="the orphaned standby to exit")
    assert not standby.go_file(s).exists() and jobctl.status(s).standby is None


def _kill_once(s) -> None:
    """kill -9 the active driver once a warm standby is ready; the standby takes over at once. (That a fresh standby
    comes up behind the new driver is the orphaned standby's step above: it waits for one.)"""
    jobctl.wait_for_commit(s, after_ms=now_ms(), timeout=180, or_idle=True)
    warm = _standby_ready(s)
    killed_at = now_ms()
    killed = jobctl.kill(s)  # kill -9 of the active launch's whole process group
    assert killed and killed != warm.pid
    # the standby's launch becomes the job; a fresh standby is launched once it has committed
    st = procs.wait_until(
        lambda: (x := jobctl.status(s)).job_pid == warm.pid and x.state == "running" and x,
        120,
        interval=0.2,
        what="the standby to take over",
    )
    assert st.standby is None or st.standby.pid != warm.pid
    # (with or_idle: a kill between batches after the input ended leaves no batch to replay)
    jobctl.wait_for_commit(s, after_ms=killed_at, timeout=120, or_idle=True)
