"""The soak's verdicts, without a platform: which failed DAG runs an injected fault explains, and whether the
reconciliation chain proved every batch exactly once."""

from onceflow_dev import soak


def test_a_failed_run_is_explained_only_by_a_fault_it_overlaps():
    t0 = soak._ms("2026-11-23T00:00:00Z")
    faults = [
        soak.Injected("restart_broker", t0 + 100_000, t0 + 110_000),
        soak.Injected("kill_job", t0 + 500_000, t0 + 500_100),
    ]

    def iso(ms):
        return f"2026-11-23T00:{ms // 60_000:02d}:{(ms % 60_000) / 1000:06.3f}Z"

    during = {"start_date": iso(105_000), "end_date": iso(125_000), "run_after": iso(105_000)}
    just_after = {"start_date": iso(120_000), "end_date": iso(130_000), "run_after": iso(120_000)}
    long_after = {"start_date": iso(300_000), "end_date": iso(310_000), "run_after": iso(300_000)}
    assert soak.explained(during, faults, 0).kind == "restart_broker"
    assert soak.explained(just_after, faults, 0) is None
    assert soak.explained(just_after, faults, 30_000).kind == "restart_broker"  # within the grace
    assert soak.explained(long_after, faults, 30_000) is None


def test_the_chain_must_prove_every_batch_exactly_once():
    def r(a, b, ok=True):
        return {"mode": "chain", "first_batch": a, "last_batch": b, "ok": ok}

    good = [r(None, None), r(0, 3), r(4, 6, ok=False), r(4, 9), r(None, None)]
    assert soak.chain_coverage(good, 0, 9) | {} == {
        "runs": 2,
        "failed_runs": 1,
        "nothing_new_runs": 2,
        "batches_proven": 10,
        "twice": 0,
        "missing": 0,
        "ok": True,
    }
    twice = soak.chain_coverage([r(0, 3), r(3, 9)], 0, 9)
    assert not twice["ok"] and twice["twice"] == 1
    gap = soak.chain_coverage([r(0, 3), r(5, 9)], 0, 9)
    assert not gap["ok"] and gap["missing"] == 1
    assert not soak.chain_coverage([r(0, 3)], 0, 9)["ok"]  # the chain never reached the last batch


def test_the_fault_plan_is_seeded_and_inside_the_run():
    spec = soak.SoakSpec(seconds=1000, job_kills=4, broker_restarts=2, pauses=2, seed=7)
    p = soak.plan(spec)
    assert p == soak.plan(spec) and len(p) == 8
    assert all(0.1 * 1000 <= st.at <= 0.8 * 1000 for st in p) and [st.at for st in p] == sorted(st.at for st in p)


def test_the_soaks_faults_go_through_the_scenario_and_a_kill_without_a_running_job_is_a_miss(monkeypatch, tmp_path):
    import time

    from onceflow import config
    from onceflow_dev.chaos_plan import Step

    s = config.load(env={}, var_dir=tmp_path)
    calls: list[str] = []
    monkeypatch.setattr(soak.broker, "kill", lambda b: calls.append("kill broker"))
    monkeypatch.setattr(soak.broker, "start", lambda b: calls.append("start broker"))

    def not_running(*_a, **_k):
        raise TimeoutError("not running")

    monkeypatch.setattr(soak.jobctl, "wait_running", not_running)
    out = soak.SoakFaults(s, s, seed=1).run(
        [Step(0.0, "restart_broker", 0.05), Step(0.01, "kill_job"), Step(0.02, "pause_driver", 0.05)], time.monotonic()
    )
    assert calls == ["kill broker", "start broker"]
    assert [(f.kind, f.note) for f in out.injected] == [("restart_broker", "down 0 s")]
    assert [m["kind"] for m in out.missed] == ["kill_job", "pause_driver"]  # no job to kill, no driver pid to pause
