"""The health check against a real job on the real broker: it leaves a long first batch alone (and the job's stacks
say where that batch waits), a restart it does never changes the operator's intent, also when the restart fails,
and a group whose offsets expired is not read as "nothing consumed"."""

import time

import pytest
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from onceflow.control import alerts, health
from onceflow.kafka import clients as kafka_clients
from onceflow.rules.sources import SourcePartition
from onceflow.runtime import jobctl, procs, stacks
from tests.support.harness import assert_exact, expire_group, produce, wait_drained

pytestmark = pytest.mark.integration


def _dlq_limit(s, value: str | None) -> None:
    op = AlterConfigOpType.SET if value is not None else AlterConfigOpType.DELETE
    res = ConfigResource(
        ResourceType.TOPIC,
        s.dlq_topic,
        incremental_configs=[ConfigEntry("max.message.bytes", value, incremental_operation=op)],
    )
    admin = kafka_clients.admin(s)  # held until the future resolves
    admin.incremental_alter_configs([res])[res].result(30)


def firing(sink) -> set[str]:
    return {k for k, v in sink.state().items() if v == alerts.Status.FIRING}


def test_health_leaves_a_long_first_batch_alone_and_a_failed_restart_keeps_the_intent(app, tmp_path):
    s = app(
        transaction_timeout_ms=60_000,
        fault="stall_in_txn@0:20",
        health_progress_threshold_s=5,
        health_batch_grace_s=120,
        max_offsets_per_trigger=3000,
    )
    sent = produce(s, tmp_path / "a.csv", count=8000, event_rate=2000, distinct_ips=300, seed=91, tail_s=30)
    sink = alerts.AlertSink(s)
    jobctl.start(s)
    # batch 0 holds its transaction open for 20 s; the job has no commit yet, and input waits
    st = procs.wait_until(
        lambda: (lambda st: st if st.running_batch == 0 else None)(jobctl.status(s)), 180, what="batch 0 to run"
    )
    procs.wait_until(lambda: time.time() * 1000 - st.batch_started_ms > 8000, 30, what="batch 0 to pass 5 s")
    # where it waits, as a stalled alert would say it: the batch's thread inside the held transaction
    got = stacks.dump(s, timeout_s=30)
    assert got and any(w.startswith("onceflow/faults.py:") for w in stacks.waiting_in(got.threads)), got
    rec = health.check(s, sink, start_fn=jobctl.start)
    assert rec.action == health.Action.NONE and rec.batch_running_s > s.health_progress_threshold_s, rec
    assert not firing(sink), sink.state()
    wait_drained(s, sent)

    # The driver's machine loses the whole process tree; a restart now fails for real (preflight refuses: the
    # DLQ topic's record limit was lowered below what a DLQ copy may need).
    jobctl.kill(s, with_supervisor=True)
    _dlq_limit(s, "1000")
    rec = health.check(s, sink, start_fn=jobctl.start)
    assert rec.action == health.Action.RESTART_FAILED and "max.message.bytes" in rec.restart_error, rec
    assert jobctl.desired_state(s) == "running"  # a restart by health never records a stop
    assert firing(sink) == {f"health:{s.app_id}:down", f"health:{s.app_id}:restart_failed"}
    # The operator fixes the topic; the next health run restarts the job (the budget allows it), and it finishes.
    _dlq_limit(s, None)
    rec = health.check(s, sink, start_fn=jobctl.start)
    assert rec.action == health.Action.RESTARTED and len(rec.restarts) == 2, rec
    jobctl.wait_running(s, after_ms=rec.ts_ms, timeout=180)
    more = produce(
        s,
        tmp_path / "b.csv",
        count=2000,
        event_rate=2000,
        distinct_ips=300,
        seed=92,
        start_ms=1_795_000_030_000,
        tail_s=30,
    )
    wait_drained(s, sent + more)
    assert_exact(s, sent + more)
    health.check(s, sink, start_fn=jobctl.start)
    assert not firing(sink) & {f"health:{s.app_id}:down", f"health:{s.app_id}:restart_failed"}, sink.state()
    assert jobctl.stop(s)

    # A week idle: Kafka deletes the group's offsets (offsets.retention.minutes; deleting the group stands in for
    # it). Health takes the position from the ledger and sees a drained job, not the whole topic as lag (N-4).
    from onceflow.operations import audit

    expire_group(s, s.group_id)
    parts = sorted(int(p) for p in health.collect(s, None).partitions)
    assert audit.committed_on_source(s, parts) == {}
    assert {p: v["lag"] for p, v in health.collect(s, None).partitions.items()} == {str(p): 0 for p in parts}
    at = [SourcePartition(s.source_topic, p) for p in parts]
    assert audit.consumed_position(s, at).batch == audit.ledger_entries(s)[-1].batch
