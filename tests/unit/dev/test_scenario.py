"""The fault engine of chaos and soak (onceflow_dev.scenario), with faults that only record what they were asked."""

import time

import pytest

from onceflow.rules import clock
from onceflow_dev import scenario
from onceflow_dev.chaos_plan import Step


class Recorder:
    def __init__(self):
        self.log: list[tuple[str, str]] = []

    def stop(self, st: Step) -> scenario.Began:
        self.log.append(("stop", st.kind))
        return scenario.Began(clock.now_ms(), restart=lambda: self.log.append(("start", st.kind)), from_end=True)

    def kill(self, st: Step) -> scenario.Began:
        self.log.append(("kill", st.kind))
        return scenario.Began(clock.now_ms(), note="job")

    def refuse(self, st: Step) -> scenario.Began:
        raise scenario.Missed("no running job to kill within 300 s")


def test_steps_run_in_time_order_and_a_step_that_cannot_be_injected_is_recorded_with_why():
    r = Recorder()
    faults = {"restart_broker": r.stop, "kill_job": r.kill, "pause_driver": r.refuse}
    steps = [Step(0.02, "kill_job"), Step(0.0, "restart_broker", 0.05), Step(0.03, "pause_driver", 1.0)]
    out = scenario.Scenario(faults, time.monotonic()).run(steps)
    # inline (no overlap): the broker is started again before the next step begins
    assert r.log == [("stop", "restart_broker"), ("start", "restart_broker"), ("kill", "kill_job")]
    assert [(f.kind, f.from_end, f.note) for f in out.injected] == [
        ("restart_broker", True, ""),
        ("kill_job", False, "job"),
    ]
    broker, kill = out.injected
    assert broker.end_ms - broker.start_ms >= 40 and kill.end_ms == kill.start_ms
    assert out.missed == [{"at_s": 0.0, "kind": "pause_driver", "why": "no running job to kill within 300 s"}]


def test_with_overlap_later_steps_begin_on_time_while_a_fault_is_still_down():
    r = Recorder()
    steps = [Step(0.0, "broker_down", 0.3), Step(0.05, "kill_leader", 0.05, note="deliberate double fault")]
    t0 = time.monotonic()
    out = scenario.Scenario({"broker_down": r.stop, "kill_leader": r.stop}, t0, overlap=True).run(steps)
    assert r.log[:2] == [("stop", "broker_down"), ("stop", "kill_leader")]  # the second inside the first
    assert sorted(r.log[2:]) == [("start", "broker_down"), ("start", "kill_leader")]
    assert time.monotonic() - t0 >= 0.3  # run() returns once every fault has ended
    assert {f.kind for f in out.injected} == {"broker_down", "kill_leader"} and not out.missed


def test_a_fault_whose_start_again_fails_is_a_miss_and_an_unknown_kind_fails_before_any_fault():
    def fails(st: Step) -> scenario.Began:
        def restart():
            raise RuntimeError("node 2 did not answer within 60 s")

        return scenario.Began(clock.now_ms(), restart=restart)

    out = scenario.Scenario({"kill_leader": fails}, time.monotonic()).run([Step(0.0, "kill_leader", 0.0)])
    assert not out.injected and "node 2 did not answer" in out.missed[0]["why"]

    r = Recorder()
    with pytest.raises(ValueError, match="kill_worker"):
        scenario.Scenario({"kill_job": r.kill}, time.monotonic()).run([Step(0.0, "kill_job"), Step(0.0, "kill_worker")])
    assert r.log == []


def test_before_runs_ahead_of_each_step_and_may_refuse_it():
    r = Recorder()

    def before(st: Step) -> None:
        r.log.append(("before", st.kind))
        if st.kind == "restart_broker":
            raise scenario.Missed("the cluster was not fully in sync within 180 s")

    steps = [Step(0.0, "kill_job"), Step(0.01, "restart_broker", 0.0)]
    out = scenario.Scenario({"kill_job": r.kill, "restart_broker": r.stop}, time.monotonic(), before=before).run(steps)
    assert r.log == [("before", "kill_job"), ("kill", "kill_job"), ("before", "restart_broker")]
    assert [f.kind for f in out.injected] == ["kill_job"] and "not fully in sync" in out.missed[0]["why"]


def test_with_live_each_step_waits_for_a_commit_since_the_previous_fault_began_and_a_deliberate_overlap_does_not():
    r = Recorder()
    waited: list[tuple[int, str]] = []
    began: list[int] = []

    def kill(st: Step) -> scenario.Began:
        b = r.kill(st)
        began.append(b.at_ms)  # the fault's own stamp: a second clock read may fall in the next millisecond
        return b

    def live(since_ms: int) -> None:
        waited.append((since_ms, r.log[-1][1] if r.log else None))
        if len(waited) == 3:
            raise scenario.Missed("no batch committed within 300 s since the previous fault began")

    steps = [
        Step(0.0, "kill_leader"),
        Step(0.0, "kill_worker"),  # drawn in the same second as the first: waits for a commit after it
        Step(0.01, "kill_job"),  # no commit came: a miss, and the wait after it still runs from the first fault
        Step(0.02, "kill_coordinator", note="deliberate double fault"),  # its point is to land inside: no wait
        Step(0.03, "broker_down"),
    ]
    faults = {k: kill for k in ("kill_leader", "kill_worker", "kill_job", "kill_coordinator", "broker_down")}
    engine_began = clock.now_ms()
    out = scenario.Scenario(faults, time.monotonic(), live=live).run(steps)
    assert [f.kind for f in out.injected] == ["kill_leader", "kill_worker", "kill_coordinator", "broker_down"]
    assert [m["kind"] for m in out.missed] == ["kill_job"] and "no batch committed" in out.missed[0]["why"]
    # the first step waits for a commit since the engine began (a job still on its first batch is not live); each
    # later one (but the deliberate overlap) for a commit since the fault before it began
    [(first, nothing), *rest] = waited
    assert engine_began <= first <= began[0] and nothing is None
    assert rest == [(began[0], "kill_leader"), (began[1], "kill_worker"), (began[2], "kill_coordinator")]
