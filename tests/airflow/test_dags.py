"""The control plane DAGs: import cleanly, and do their job against a real broker, Spark and Airflow DB.

What an operator sees of them in a running Airflow (scheduled health, transaction watch, rotation and reconciliation;
a killed job brought back; a transaction held past its timeout alerted once and resolved; a second deploy start
refused; triggers through the REST API) is tested there, in test_running_airflow.py; here, with `dag.test()`, the
paths that need a fault injected between two runs: a foreign producer's hanging transaction, a savepoint that cannot
be written, a restore of an older savepoint, a ledger with a gap. (Backfills through the DAG, refused and good, are
triggered in the running Airflow.)"""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Producer

from onceflow import wire
from onceflow.kafka import clients as kafka_clients
from onceflow.kafka import reading as kafka_reading
from onceflow.runtime import jobctl, procs
from tests.support import dags
from tests.support.harness import assert_exact, copy_topic, events, produce, wait_drained


def _run(s, kind, **conf):
    """A run of the test's app instance's DAG of that kind, built with the environment the test set."""
    dr = dags.build(kind, s.app_id).test(run_conf=conf or None)
    return dr.state, {ti.task_id: ti.state for ti in dr.get_task_instances()}


@pytest.mark.integration
def test_hanging_transaction_is_detected_with_its_age(airflow_app, webhook):
    s = airflow_app(transaction_timeout_ms=3000)
    rogue = Producer(
        {**kafka_clients.base(s), "transactional.id": f"rogue-{s.app_id}", "transaction.timeout.ms": 120_000}
    )
    rogue.init_transactions(30)
    rogue.begin_transaction()
    rogue.produce(s.sink_topic, key=b"k", value=b"v", partition=2)
    rogue.flush(10)
    opened = time.time()
    procs.wait_until(lambda: time.time() - opened > 4, 10, what="the transaction to age")
    assert _run(s, "txn_watch")[0] == "success"
    hang = webhook.alerts("txn_watch:hanging:")
    assert len(hang) == 1
    a = hang[0]
    assert a["key"] == f"txn_watch:hanging:{s.sink_topic}:2" and a["status"] == "firing"
    assert a["details"]["partition"] == 2 and a["details"]["age_ms"] >= 3000
    assert "not onceflow" in a["summary"] and "kafka-transactions.sh" in a["action"]
    assert _run(s, "txn_watch")[0] == "success"  # still hanging: no second alert
    assert len(webhook.alerts("txn_watch:hanging:")) == 1
    rogue.abort_transaction(30)
    assert _run(s, "txn_watch")[0] == "success"
    assert [x["status"] for x in webhook.alerts("txn_watch:hanging:")] == ["firing", "resolved"]
    assert not events(s, wire.TRANSACTION_TIMEOUT)


@pytest.mark.integration
def test_rotation_and_savepoint_actions_of_the_deploy_dag(airflow_app, webhook, tmp_path, monkeypatch):
    from onceflow.operations import savepoints

    s = airflow_app(savepoint_keep=2, checkpoint_size_alert_bytes=1, max_offsets_per_trigger=3000)
    sent = produce(s, tmp_path / "a.csv", count=15_000, event_rate=2000, seed=41)
    jobctl.start(s)
    jobctl.wait_for_commit(s)
    # Three rotations while the job runs: each takes and verifies a savepoint, retention keeps the newest two,
    # and the oversized checkpoint alerts once (deduplicated while it lasts).
    taken = []
    for _ in range(3):
        state, tis = _run(s, "checkpoint_rotation")
        assert state == "success", tis
        taken.append(savepoints.list_all(s)[-1].id)
    assert [x.id for x in savepoints.list_all(s)] == taken[1:]
    assert all(savepoints.verify(s, i).ok for i in taken[1:])
    assert [a["status"] for a in webhook.alerts(f"rotation:{s.app_id}:checkpoint_size")] == ["firing"]

    # A savepoint that cannot be written fails the run and pages; the next good run resolves it.
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("ONCEFLOW_SAVEPOINT_URI", (blocker / "sp").as_uri())
    state, tis = _run(s, "checkpoint_rotation")
    assert state == "failed" and tis["savepoint"] == "success" and tis["report"] == "failed", tis
    monkeypatch.setenv("ONCEFLOW_SAVEPOINT_URI", s.savepoints)
    assert _run(s, "checkpoint_rotation")[0] == "success"
    assert [a["status"] for a in webhook.alerts(f"rotation:{s.app_id}:savepoint_failed")] == ["firing", "resolved"]

    # (upgrade, a stop-with-savepoint and a start, is triggered through the REST API in test_running_airflow)
    # restore: an older savepoint is refused in preflight (nothing stops) ...
    pid = jobctl.status(s).job_pid
    state, tis = _run(s, "deploy", action="restore", savepoint_id=taken[1])
    assert state == "failed" and tis["preflight"] == "failed" and jobctl.status(s).job_pid == pid
    # ... the newest restores, and the job continues exactly once.
    state, tis = _run(s, "deploy", action="restore", savepoint_id="latest", wait_timeout_s=240)
    assert state == "success", tis
    more = produce(s, tmp_path / "b.csv", count=5000, event_rate=2000, seed=42, start_ms=1_795_000_010_000, tail_s=30)
    wait_drained(s, sent + more)
    assert_exact(s, sent + more)
    assert jobctl.stop(s)


@pytest.mark.integration
def test_the_reconciliation_dag_submits_its_spark_job_and_pages_a_gap(airflow_app, webhook, tmp_path, monkeypatch):
    from onceflow.operations import audit

    s = airflow_app(max_offsets_per_trigger=4000)
    sent = produce(
        s,
        tmp_path / "a.csv",
        count=6_000,
        event_rate=1500,
        distinct_ips=300,
        late_fraction=0.02,
        malformed_fraction=0.02,
        tail_s=30,
        seed=71,
    )
    jobctl.start(s)
    wait_drained(s, sent)
    assert jobctl.stop(s)
    last = audit.ledger_entries(s)[-1].batch
    # A ledger with a batch missing: the run fails and pages with the exact gap. (Green scheduled and manual runs of
    # this DAG are the running Airflow's: test_running_airflow.py.)
    gone = audit.ledger_entries(s)[1]
    copy_topic(s, s.ledger_topic, s.ledger_topic + ".gap", keep=lambda m: json.loads(m.value).get("batch") != 1)
    monkeypatch.setenv("ONCEFLOW_LEDGER_TOPIC", s.ledger_topic + ".gap")
    state, tis = _run(s, "reconciliation", first_batch=0, last_batch=last)
    assert state == "failed", tis
    [alert] = webhook.alerts(f"reconcile:{s.app_id}:I1_coverage")
    gaps = {(d["partition"], d["start"], d["end"]) for d in alert["details"]["differences"] if d["kind"] == "gap"}
    assert gaps == {(p.partition, a, b) for p, (a, b) in gone.ranges.items() if b > a}
    # the run's every check recorded beside the chain, the failed one with its gap
    recorded = json.loads(kafka_reading.read_topic(s, s.reconciliation_topic)[-1].value)
    assert not recorded["ok"] and (recorded["first_batch"], recorded["last_batch"]) == (0, last)
    checks = {c["name"]: c["status"] for c in recorded["checks"]}
    assert set(checks) == {
        "I1_coverage",
        "I2_accounting",
        "I3_results",
        "I2_dlq",
        "I4_visibility",
        "gx_suite",
        "replay",  # the proof for any app (ip_count's recount is the checks above it)
    }
    assert checks["I1_coverage"] == "fail" and checks["gx_suite"] == "pass" and checks["replay"] == "warn", checks
    monkeypatch.setenv("ONCEFLOW_LEDGER_TOPIC", s.ledger_topic)
