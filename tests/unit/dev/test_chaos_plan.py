"""The chaos runs' fault plan and liveness figures (onceflow_dev.chaos_plan), without a broker."""

import time

from onceflow_dev import chaos_plan as cp
from onceflow_dev.chaos_plan import Bounds, Injected, Step


def _overlaps(steps: list[Step], settle_s: float) -> list[tuple[Step, Step]]:
    broker = [s for s in steps if s.kind in cp.BROKER_FAULTS and not s.deliberate_overlap]
    return [(a, b) for a, b in zip(broker, broker[1:], strict=False) if b.at < a.at + a.duration + settle_s]


def test_no_seed_plans_two_broker_faults_at_once():
    """The seed decides when faults land, never whether the cluster can stay writable: seed 4711 put a leader kill
    inside the 120 s outage (two of three nodes down, min ISR 2: no commit possible)."""
    for seed in range(200):
        steps = cp.cluster_plan(seed, 600, 5, 3, 2, 2, 120.0, settle_s=30.0)
        assert not _overlaps(steps, 30.0), seed
        kinds = [s.kind for s in steps]
        assert (kinds.count("kill_job"), kinds.count("kill_leader"), kinds.count("kill_coordinator")) == (5, 3, 2)
        assert kinds.count("kill_worker") == 2 and kinds.count("broker_down") == 1
        assert not any(s.note for s in steps)
    one = cp.single_node_plan(4711, 600, 20, 3, 3)
    assert not _overlaps(one, 15.0) and len(one) == 26


def test_the_double_fault_is_a_step_of_its_own_and_says_so():
    steps = cp.cluster_plan(4711, 600, 5, 3, 2, 2, 120.0, double_fault=True)
    outage = next(s for s in steps if s.kind == "broker_down")
    double = [s for s in steps if s.deliberate_overlap]
    assert len(double) == 1 and double[0].kind == "kill_leader"
    assert outage.at < double[0].at < outage.at + outage.duration  # inside the outage, on purpose
    assert "two of three are down" in double[0].note and "resume once a node is back" in double[0].note
    assert not _overlaps(steps, 30.0)  # every other broker fault still one at a time


def test_serialise_moves_a_broker_fault_past_the_previous_ones_return():
    got = cp.serialise([Step(100, "broker_down", 120), Step(150, "kill_leader", 5), Step(160, "kill_job")], 30)
    assert [(s.at, s.kind) for s in got] == [(100, "broker_down"), (160, "kill_job"), (250, "kill_leader")]


def test_liveness_figures_per_fault_and_per_kind():
    s = 1000  # ms
    lag = [(t * s, n) for t, n in [(0, 100), (10, 100), (11, 900), (20, 2000), (40, 500), (45, 120), (60, 90)]]
    commits = [5 * s, 9 * s, 31 * s, 50 * s]
    job = Injected("kill_job", 10 * s, 10 * s)
    pause = Injected("pause_driver", 46 * s, 48 * s, from_end=True)
    out = cp.liveness([job, pause], commits, lag, Bounds(commit_s=30, lag_s=40), lag_slack=50)
    first, second = out["faults"]
    assert (first["to_commit_s"], first["lag_before"], first["to_lag_s"]) == (21.0, 100, 35.0)
    # the pause is measured from its end: the next commit 2 s later, the lag already back
    assert (second["measured_from"], second["to_commit_s"], second["lag_before"], second["to_lag_s"]) == (
        "end",
        2.0,
        120,
        12.0,
    )
    assert out["violations"] == []
    assert out["by_kind"]["kill_job"] == {
        "n": 1,
        "to_commit_median_s": 21.0,
        "to_commit_worst_s": 21.0,
        "to_lag_median_s": 35.0,
        "to_lag_worst_s": 35.0,
    }


def test_a_commit_whose_event_a_kill_lost_counts_at_its_ledger_time():
    """Seed 1 on the cluster: batch 19 committed 80 s after a leader kill, and a job kill a second later lost its
    batch_committed event; the run took batch 20's, 147.6 s after, and failed the bound."""
    kill = Injected("kill_leader", 1_000, 9_000)
    events = {18: 500, 20: 148_600}  # batch 19's event never reached the topic
    ledger = {18: 400, 19: 71_000, 20: 148_000}
    commits = cp.commit_times(events, ledger)
    assert commits == [500, 71_000, 148_600]
    live = cp.liveness([kill], commits, [], Bounds(120.0, 300.0), lag_slack=0)
    assert live["faults"][0]["to_commit_s"] == 70.0 and not live["violations"]
    assert cp.commit_times({18: 500}, {}) == []  # an event without its ledger record is not a commit


def test_a_fault_never_followed_by_a_commit_or_a_lag_back_in_bound_fails_the_run():
    s = 1000
    lag = [(0, 10), (10 * s, 10), (20 * s, 5000), (200 * s, 5000)]
    out = cp.liveness([Injected("broker_down", 10 * s, 130 * s)], [1 * s], lag, Bounds(), lag_slack=100)
    assert out["faults"][0]["to_commit_s"] is None and out["faults"][0]["to_lag_s"] is None
    assert len(out["violations"]) == 2
    assert "no committed batch within 120 s" in out["violations"][0]
    late = cp.liveness([Injected("kill_job", 10 * s, 10 * s)], [200 * s], lag, Bounds(commit_s=120), lag_slack=0)
    assert "no committed batch within 120 s (got 190.0)" in late["violations"][0]


def test_a_wait_between_commits_that_no_fault_began_in_is_held_to_the_bound():
    """Seed 4711 on the cluster (2026-11-30): a coordinator kill's next commit came after 9.5 s, then the batch after
    it waited 71 s on a hung `send_offsets`; no figure showed it. Such a wait past the bound now fails the run, and
    the longest wait between commits is in the report either way."""
    s = 1000
    kill = Injected("kill_coordinator", 10 * s, 15 * s)
    ok = cp.liveness([kill], [5 * s, 19 * s, 90 * s, 95 * s], [], Bounds(commit_s=120), lag_slack=0)
    assert ok["faults"][0]["to_commit_s"] == 9.0 and not ok["violations"]
    assert ok["commit_gap"] == {"longest_s": 71.0, "from_ms": 19 * s, "faults_in_it": []}  # the node was back
    stalled = cp.liveness([kill], [5 * s, 19 * s, 160 * s], [], Bounds(commit_s=120), lag_slack=0)
    assert stalled["faults"][0]["to_commit_s"] == 9.0  # the fault's own figure is within its bound ...
    assert stalled["commit_gap"]["longest_s"] == 141.0
    assert len(stalled["violations"]) == 1  # ... the wait after it is not
    assert "no committed batch for 141.0 s from 19000, and no fault began in that time" in stalled["violations"][0]
    # a wait a fault began in is that fault's next commit, judged once (by its own figure), not twice
    late = cp.liveness([Injected("kill_job", 30 * s, 30 * s)], [5 * s, 19 * s, 160 * s], [], Bounds(), lag_slack=0)
    assert len(late["violations"]) == 1 and "kill_job at 30000: no committed batch" in late["violations"][0]
    # a pause that began before the commit and ended in the wait is judged from its end, by its own figure
    pause = Injected("pause_driver", 18 * s, 60 * s, from_end=True)
    assert not cp.liveness([pause], [5 * s, 19 * s, 160 * s], [], Bounds(), lag_slack=0)["violations"]


def test_a_missed_step_is_named_with_its_reason():
    out = cp.Outcome()
    out.miss(Step(61.23, "kill_coordinator", 5), "no transaction open within 60 s, 3 tries")
    out.injected.append(Injected("kill_job", 1, 2))
    assert out.missed == [{"at_s": 61.2, "kind": "kill_coordinator", "why": "no transaction open within 60 s, 3 tries"}]
    assert out.counts() == {"kill_job": 1}


def test_the_seeds_table_has_a_row_per_seed_and_fault_kind():
    from onceflow_dev import chaos_seeds

    live = cp.liveness(
        [Injected("kill_job", 10_000, 10_000), Injected("broker_down", 20_000, 140_000)],
        [15_000, 25_000],
        [(0, 5), (30_000, 5)],
        Bounds(),
        lag_slack=10,
    )
    rep = {"seed": 4711, "ok": True, "records": 600_004, "lost": 0, "duplicated": 0, "missed": [], "liveness": live}
    failed = rep | {"seed": 2, "ok": False, "missed": [{"kind": "kill_job"}]}
    checked = failed | {"dlq_complete": True, "invariants_ok": True}
    out = chaos_seeds.table("cluster", [rep, failed | {"failures": cp.failures(checked, {})}])
    rows = [line for line in out.splitlines() if line.startswith("| ")][1:]  # after the header
    assert rows[0].startswith("| 4711 | PASS | 600,004 | 0 | 0 | 0 | 10.0 | broker_down | 1 | 5.0 / 5.0 |")
    assert rows[1].startswith("| | | | | | | | kill_job | 1 | 5.0 / 5.0 |")
    assert rows[2].startswith("| 2 | FAIL |") and " | 1 | 10.0 | broker_down " in rows[2]
    assert out.rstrip().endswith("- seed 2 failed: 1 planned fault(s) not injected")  # why, under the table


def test_a_failed_run_says_why_in_words():
    """The table's columns count sink results only: seed 4 on one node (2026-11-27) failed with 0 lost and 0
    duplicated there, on 207 doubled DLQ records and a ledger record shown twice. Its report now says so, and a run
    whose job stopped for an operator names that stop, not only the liveness bound the stop then breaks."""
    live = cp.liveness([Injected("kill_job", 10_000, 10_000)], [15_000], [(0, 5), (20_000, 5)], Bounds(), lag_slack=10)
    clean = {"lost": 0, "duplicated": 0, "dlq_complete": True, "invariants_ok": True, "missed": [], "liveness": live}
    assert cp.failures(clean, {"the reconciliation failed": True}) == []
    seed4 = clean | {"dlq_complete": False, "invariants_ok": False}
    assert cp.failures(seed4, {"the reconciliation failed": False}) == [
        "the DLQ is not the malformed input once each (missing, unexpected or doubled records)",
        "an invariant failed (I1-I4 or the accounting: the audit)",
        "the reconciliation failed",
    ]
    stopped = clean | {"operator_stops": ["transaction_hanging"]}
    assert cp.failures(stopped, {}) == ["the job stopped for an operator (transaction_hanging)"]


def test_a_coordinator_kill_reads_the_events_again_when_a_broker_is_away(monkeypatch, tmp_path):
    """Seed 4711 on the cluster: a leader kill moved the events topic's leader while the coordinator step waited for
    its armed transaction; the read raised (_DESTROY_BROKER) and ended the whole run instead of reading again."""
    from confluent_kafka import KafkaError, KafkaException

    from onceflow import config, wire
    from onceflow_dev import chaos, chaos_cluster

    answers = [KafkaException(KafkaError(KafkaError._DESTROY_BROKER)), [{"ts_ms": 2**62, "event": wire.FAULT_INJECTED}]]

    def read(*_a, **_k):
        got = answers.pop(0)
        if isinstance(got, Exception):
            raise got
        return got

    monkeypatch.setattr(chaos.ev, "read", read)
    s = config.load(env={}, var_dir=tmp_path)
    runner = chaos_cluster.Runner(s, s, 0.0)
    assert runner._stalled_since(0) and not answers


def test_a_node_killed_seconds_ago_is_not_in_sync_while_its_isr_still_lists_it(monkeypatch, tmp_path):
    """Seed 4711 on the cluster: right after a coordinator kill the metadata still had three brokers and full ISR,
    so the next leader kill went ahead, onto the dead node, and was missed."""
    from types import SimpleNamespace as NS

    from onceflow import config
    from onceflow_dev import chaos_cluster

    s = config.load(env={}, var_dir=tmp_path, brokers=3)
    part = NS(isrs=[1, 2, 3], replicas=[1, 2, 3])
    md = NS(brokers={1: 0, 2: 0, 3: 0}, topics={"t": NS(error=None, partitions={0: part})})
    monkeypatch.setattr(chaos_cluster.kafka_clients, "admin", lambda _s: NS(list_topics=lambda timeout: md))
    assert not chaos_cluster.fully_in_sync(s)  # no node's process runs (no pid file under var/)
    monkeypatch.setattr(chaos_cluster.broker, "status", lambda _s: {"running": True})
    assert chaos_cluster.fully_in_sync(s)


def test_no_broker_fault_while_the_node_of_the_last_one_is_being_started_again(monkeypatch, tmp_path):
    """Seed 1 on the cluster: a coordinator kill's node was being started again (its process ran, its old session
    kept it in the ISR), the next leader kill passed fully_in_sync, killed that node and the restart failed. A broker
    fault waits until the node the last one stopped answers again."""
    import threading

    from onceflow import config
    from onceflow_dev import chaos_cluster, chaos_plan

    s = config.load(env={}, var_dir=tmp_path, brokers=3)
    killed: list[int] = []
    started = threading.Event()
    monkeypatch.setattr(chaos_cluster, "fully_in_sync", lambda _s: True)
    monkeypatch.setattr(chaos_cluster, "IN_SYNC_TIMEOUT_S", 1.0)
    monkeypatch.setattr(chaos_cluster.cluster, "describe", lambda _s: {"topics": {s.sink_topic: {"0": {"leader": 1}}}})
    monkeypatch.setattr(chaos_cluster.broker, "kill", lambda _s, node: killed.append(node) or True)
    monkeypatch.setattr(chaos_cluster.broker, "start_node", lambda _s, node: started.wait(5))
    # no job here: the engine's wait for a commit before a step is another test's (test_scenario.py)
    monkeypatch.setattr(chaos_cluster.chaos, "live_since", lambda _s: lambda _ms: None)
    runner = chaos_cluster.Runner(s, s, time.monotonic())
    coordinator = runner._node_down(chaos_plan.Step(0.0, "kill_coordinator", 3.0), 0, 1)
    assert runner.restarting == {1}  # the coordinator kill's node: its start again has not returned
    leader = chaos_plan.Step(0.0, "kill_leader", 0.0)
    runner.carry_out([leader])
    assert not killed and not runner.outcome.injected
    assert runner.outcome.missed and "not fully in sync" in runner.outcome.missed[0]["why"]
    started.set()
    assert coordinator.restart is not None
    coordinator.restart()  # returns once the node answers
    assert not runner.restarting
    runner.carry_out([leader])
    assert killed == [1] and [f.kind for f in runner.outcome.injected] == ["kill_leader"]
    assert not runner.restarting  # started again by the scenario after the step's duration


def test_faults_that_come_before_the_lag_is_back_are_judged_from_the_last_of_them():
    """Seed 1 on the cluster: job kills a minute apart, each restart about a minute long; the lag came back once
    they stopped, 491 s after the outage that began the run's faults, and that alone failed the run. The lag's
    recovery is judged from the last fault that began before it was back; a fault alone keeps its own bound."""
    s = 1000
    lag = [(0, 100), (10 * s, 100), (60 * s, 50_000), (200 * s, 90_000), (350 * s, 100), (500 * s, 100)]
    outage = Injected("broker_down", 10 * s, 130 * s)
    kill = Injected("kill_job", 100 * s, 100 * s)
    out = cp.liveness([outage, kill], [20 * s, 120 * s], lag, Bounds(lag_s=300), lag_slack=0)
    first = out["faults"][0]
    assert first["to_lag_s"] == 340.0 and first["lag_overlapped_by"] == 1 and first["lag_judged_from_last_s"] == 250.0
    assert not out["violations"], out["violations"]
    # the lag back only 350 s after the last fault: a violation, named as the burst's
    slow = [(0, 100), (10 * s, 100), (60 * s, 50_000), (200 * s, 90_000), (450 * s, 100)]
    out = cp.liveness([outage, kill], [20 * s, 120 * s], slow, Bounds(lag_s=300), lag_slack=0)
    assert any("of the last of 2 faults" in v for v in out["violations"]), out["violations"]
    # one fault alone: its own bound, as before
    alone = cp.liveness([outage], [20 * s], lag, Bounds(lag_s=300), lag_slack=0)
    assert alone["violations"] == ["broker_down at 10000: lag not back at 100 (+0) within 300 s"]


def test_a_fault_that_begins_before_the_next_commit_has_the_commit_judged_from_it():
    """The short chaos run in CI (2026-11-28): a job kill after batch 0, and the job's own planned stall held batch 1,
    the first after the restart, past its timeout: a second restart, and the commit 120.1 s after the kill failed the
    kill's 120 s bound. The wait is judged from the last fault that began before the commit; a fault alone keeps its
    own bound, and a wait too long after the last of them still fails, named as theirs."""
    s = 1000
    kill = Injected("kill_job", 10 * s, 10 * s)
    stall = Injected("stall_in_txn", 60 * s, 72 * s)
    out = cp.liveness([kill, stall], [130 * s], [], Bounds(commit_s=120), lag_slack=0)
    first = out["faults"][0]
    assert first["to_commit_s"] == 120.0 and first["commit_overlapped_by"] == 1
    assert first["commit_judged_from_last_s"] == 70.0 and not out["violations"], out["violations"]
    late = cp.liveness([kill, stall], [190 * s], [], Bounds(commit_s=120), lag_slack=0)
    assert late["violations"] == [
        "kill_job at 10000: no committed batch within 120 s of the last of 2 faults (got 180.0)",
        "stall_in_txn at 60000: no committed batch within 120 s (got 130.0)",
    ]
    alone = cp.liveness([kill], [140 * s], [], Bounds(commit_s=120), lag_slack=0)
    assert alone["violations"] == ["kill_job at 10000: no committed batch within 120 s (got 130.0)"]


def test_the_replays_differences_count_as_lost_and_duplicated_results():
    from onceflow_dev.chaos import replay_counts

    assert replay_counts([]) == (0, 0)
    diffs = [
        {"kind": "missing", "batch": 3, "record": "result", "key": "a", "replayed": 2, "committed": 0},
        {"kind": "different_value", "batch": 3, "record": "result", "key": "b"},
        {"kind": "duplicate", "batch": 4, "record": "result", "key": "c", "replayed": 1, "committed": 3},
        {"kind": "unexpected", "batch": None, "record": "result", "key": "d", "replayed": 0, "committed": 1},
        {"kind": "watermark", "batch": 5},  # not a record: neither lost nor duplicated
    ]
    assert replay_counts(diffs) == (3, 3)


def test_database_crashes_join_a_seeds_plan_without_moving_its_other_faults():
    """`make chaos` with CHAOS_SINK=postgres crashes the database too; the seed's kills, broker restarts and pauses
    stay where they were (its crashes are drawn after them), so a seed's two runs compare."""
    from onceflow_dev import chaos_plan

    plain = chaos_plan.single_node_plan(7, 600, 20, 3, 3)
    with_db = chaos_plan.single_node_plan(7, 600, 20, 3, 3, database_crashes=3)
    crashes = [st for st in with_db if st.kind == "crash_database"]
    assert len(crashes) == 3 and all(0.05 * 600 <= st.at <= 0.85 * 600 and 1 <= st.duration <= 6 for st in crashes)
    others = [st for st in with_db if st.kind != "crash_database"]
    assert [(st.at, st.kind) for st in others] == [(st.at, st.kind) for st in plain]


def test_a_held_transaction_cut_by_a_kill_owes_no_timeout_report():
    """A kill of the job inside a held transaction ends it with its driver: the run's verdict does not ask a timeout
    report of it; a kill before or after the hold does not count."""
    from onceflow_dev.chaos_plan import Injected, cut_short

    stalls = [Injected("stall_in_txn", 1000, 13_000), Injected("stall_in_txn", 50_000, 62_000)]
    assert cut_short(stalls + [Injected("kill_job", 1700, 1700)]) == 1
    assert cut_short(stalls + [Injected("kill_job", 13_000, 13_000), Injected("kill_job", 900, 900)]) == 0
    assert cut_short(stalls) == 0
