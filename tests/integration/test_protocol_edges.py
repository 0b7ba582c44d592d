"""The protocol's edges, each reproduced against the real broker (and, where it takes a crash, a real kill -9):
a client clock a year ahead, records near the size limit and poison records, lost group offsets, a ledger record
hidden behind another producer's open transaction, a commit whose outcome is unknown."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from confluent_kafka import Producer

from onceflow import wire
from onceflow.control import alerts, health
from onceflow.kafka import clients as kafka_clients
from onceflow.kafka import events as ev
from onceflow.kafka import reading as kafka_reading
from onceflow.operations import audit, quarantine
from onceflow.protocol.batch_sink import OutRecord
from onceflow.protocol.exactly_once import ExactlyOnceSink
from onceflow.protocol.hanging import HangingTransaction
from onceflow.rules.ledger import BatchPlan, Decision
from onceflow.rules.sources import on_topic
from onceflow.runtime import jobctl, procs
from onceflow.storage.store import Store
from onceflow_apps.access_log import rules as records
from onceflow_dev import broker
from onceflow_dev.generator import KIND_MALFORMED, KIND_OK, Sent
from tests.support.harness import assert_exact, end_offsets, events, produce, wait_drained, wait_event

pytestmark = pytest.mark.integration


def test_a_clock_a_year_ahead_is_quarantined_and_everything_late_is_reported(app, tmp_path, spark):
    s = app(max_offsets_per_trigger=5000)
    # A producer whose clock runs 30 minutes ahead stamps its records and their event times alike (review N-1): on a
    # CreateTime source the skew rule passed them and the watermark jumped past every honest record. The platform's
    # source is stamped by the broker (LogAppendTime), so they are judged against the broker's clock.
    ahead_ms = int(time.time() * 1000) + 30 * 60_000
    p = Producer(kafka_clients.base(s))
    offsets: list = []
    for part in range(s.source_partitions):
        p.produce(
            s.source_topic,
            value=json.dumps({"ts": ahead_ms, "ip": f"198.51.100.{part + 1}"}).encode(),
            partition=part,
            timestamp=ahead_ms,
            on_delivery=lambda err, msg: offsets.append((err, msg.partition(), msg.offset())),
        )
    assert p.flush(30) == 0 and all(err is None for err, _, _ in offsets)
    clock_ahead = [
        Sent(part, KIND_MALFORMED, None, None, records.REASON_TS_AHEAD, off, s.source_topic) for _, part, off in offsets
    ]
    sent = clock_ahead + produce(
        s,
        tmp_path / "a.csv",
        count=12_000,
        event_rate=2000,
        distinct_ips=300,
        future_fraction=0.01,
        late_fraction=0.01,
        malformed_fraction=0.01,
        seed=81,
        tail_s=30,
    )
    ahead = [r for r in sent if r.reason == records.REASON_TS_AHEAD]
    assert len(ahead) > 50 + len(clock_ahead)
    jobctl.start(s)
    wait_drained(s, sent)
    sink = alerts.AlertSink(s)
    assert health.check(s, sink).late_fraction < s.late_fraction_threshold  # (also: the window starts here)
    # every future record is in the DLQ with its own reason, and the watermark followed the honest clocks
    rep = assert_exact(s, sent)
    assert rep.late < 0.05 * len(sent)
    honest_max_ms = max(r.ts_us for r in sent if r.ts_us is not None) // 1000
    assert max(e.watermark_ms for e in audit.ledger_entries(s)) <= honest_max_ms
    reasons = [m.headers[wire.H_REASON] for m in kafka_reading.read_topic(s, s.dlq_topic)]
    assert reasons.count(records.REASON_TS_AHEAD.encode()) == len(ahead)  # a year ahead, and the clock 30 min ahead

    # A producer whose clock is 10 minutes behind: everything it sends is late. Health says so, and so does I2.
    behind = produce(
        s,
        tmp_path / "b.csv",
        count=3000,
        event_rate=2000,
        distinct_ips=300,
        late_fraction=0,
        malformed_fraction=0,
        out_of_order_fraction=0,
        seed=82,
        start_ms=honest_max_ms - 600_000,
    )
    wait_drained(s, sent + behind)
    rec = health.check(s, sink)
    assert rec.late_fraction is not None and rec.late_fraction > s.late_fraction_threshold, rec
    assert f"health:{s.app_id}:late" in {a.key for a in sink.history() if a.status == alerts.Status.FIRING}
    first_late = max(e.batch for e in audit.ledger_entries(s) if e.end == end_offsets(sent)) + 1
    from onceflow.operations import reconcile

    res = reconcile.run(spark, s, first=first_late, last=audit.ledger_entries(s)[-1].batch, with_gx=False)
    i2 = res.check("I2_accounting")
    assert i2.status == "fail" and [d["kind"] for d in i2.differences] == ["late_fraction"], i2
    assert i2.figures["late"] == len(behind)
    assert jobctl.stop(s)


def test_oversized_and_poison_records_never_stop_the_job(app, tmp_path):
    """A record near the broker's size limit reaches the DLQ capped (size and hash in headers); a record whose DLQ
    copy the broker refuses every time stops the job until the operator quarantines it, then the job goes on,
    and both are accounted for exactly once."""
    s = app(max_offsets_per_trigger=3000, restart_attempts=1)
    first = produce(s, tmp_path / "a.csv", count=4000, event_rate=2000, distinct_ips=200, seed=83)
    big = b"x" * 999_800  # + the DLQ provenance: over the producer's 1,000,000-byte record limit if copied whole
    p = Producer({**kafka_clients.base(s), "message.max.bytes": 2_000_000, "compression.type": "none"})
    got: dict = {}
    poison_value = b"not json, not a log line: a poison record"
    for part, value in ((1, big), (2, poison_value)):
        p.produce(
            s.source_topic,
            value=value,
            partition=part,
            on_delivery=lambda err, msg: got.update({msg.partition(): (err, msg.offset())}),
        )
    assert p.flush(30) == 0 and all(err is None for err, _ in got.values())
    big_off, poison_off = got[1][1], got[2][1]
    extra = [
        Sent(1, KIND_MALFORMED, None, None, records.REASON_TOO_LARGE, big_off, s.source_topic),
        Sent(2, KIND_MALFORMED, None, None, records.REASON_QUARANTINED, poison_off, s.source_topic),
    ]
    # One address, many spellings (RFC 5952): the running job counts each under one canonical key.
    ts_ms = max(r.ts_us for r in first if r.ts_us is not None) // 1000
    spellings = {
        "2001:DB8::1": "2001:db8::1",
        "2001:db8:0:0::1": "2001:db8::1",
        "2001:0db8::0:1": "2001:db8::1",
        "::FFFF:1.2.3.4": "::ffff:1.2.3.4",
        "::ffff:1.2.3.4": "::ffff:1.2.3.4",
    }
    for spelled in spellings:
        p.produce(
            s.source_topic,
            value=json.dumps({"ts": ts_ms, "ip": spelled}).encode(),
            partition=3,
            on_delivery=lambda err, msg: got.setdefault("spelled", []).append((err, msg.offset())),
        )
    assert p.flush(30) == 0 and all(err is None for err, _ in got["spelled"])
    extra += [
        Sent(3, KIND_OK, ts_ms * 1000, canonical, None, off, s.source_topic)
        for (_, off), canonical in zip(got["spelled"], spellings.values())
    ]
    poisoned = s.replace(fault=f"undeliverable@2:{poison_off}")
    jobctl.start(poisoned)
    gave_up = wait_event(s, wire.SUPERVISOR_GAVE_UP, timeout=240)
    assert gave_up[-1]["reason"] == "restart attempts exhausted"
    committed = audit.committed_on_source(s, [2]).get(2, 0)
    assert committed <= poison_off  # the batch holding the poison record never committed

    # The operator's way out: quarantine the offset (audited in the ledger), start again.
    with pytest.raises(quarantine.QuarantineError, match="committed already"):
        quarantine.add(s, 0, 0, 1, "a committed record cannot be quarantined")
    rec = quarantine.add(s, 2, poison_off, poison_off + 1, "its DLQ copy is refused by the broker", by="test")
    assert [r.ranges for r in quarantine.records(s)] == [rec.ranges]
    jobctl.start(poisoned)
    second = produce(
        s,
        tmp_path / "b.csv",
        count=2000,
        event_rate=2000,
        distinct_ips=200,
        seed=84,
        start_ms=1_795_000_010_000,
        tail_s=30,
    )
    sent = first + extra + second
    wait_drained(s, sent)
    assert_exact(s, sent)
    dlq = {
        (int(m.headers[wire.H_SOURCE_PARTITION]), int(m.headers[wire.H_SOURCE_OFFSET])): m
        for m in kafka_reading.read_topic(s, s.dlq_topic)
    }
    capped = dlq[(1, big_off)]
    assert len(capped.value) == s.dlq_max_value_bytes and capped.headers[wire.H_TRUNCATED] == b"true"
    assert int(capped.headers[wire.H_ORIGINAL_SIZE]) == len(big)
    import hashlib

    assert capped.headers[wire.H_ORIGINAL_SHA256].decode() == hashlib.sha256(big).hexdigest()
    keys = {json.loads(m.value)["ip"] for m in kafka_reading.read_topic(s, s.sink_topic)}
    assert {"2001:db8::1", "::ffff:1.2.3.4"} <= keys and not keys & {"2001:DB8::1", "2001:db8:0:0::1", "::FFFF:1.2.3.4"}
    held = dlq[(2, poison_off)]
    assert held.value is None and held.headers[wire.H_REASON] == records.REASON_QUARANTINED.encode()
    assert held.headers[wire.H_ORIGINAL_SHA256].decode() == hashlib.sha256(poison_value).hexdigest()
    assert jobctl.stop(s)


def test_lost_group_offsets_do_not_turn_a_replay_into_a_second_write(app, tmp_path):
    """kill -9 after batch 2's Kafka commit (before Spark's commits/2), the group's offsets deleted while the job is
    down: the replay of batch 2 is decided from the ledger and skipped.

    The job's first start finds what an earlier start killed while Spark wrote offsets/0 leaves (its hidden
    temporary file), which Spark alone refuses for good (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY)."""
    s = app(max_offsets_per_trigger=2000, fault="crash_after_commit@2", restart_attempts=0)
    sent = produce(s, tmp_path / "a.csv", count=10_000, event_rate=2000, distinct_ips=300, seed=85, tail_s=30)
    checkpoint = Store(s.checkpoint)
    debris = ["offsets/.0.2c4e-killed.tmp", "offsets/..0.2c4e-killed.tmp.crc"]
    for rel in debris:
        checkpoint.write(rel, b'v1\n{"batchWatermarkMs":0')  # cut short by the kill
    jobctl.start(s)
    wait_event(s, wire.SUPERVISOR_GAVE_UP, timeout=240)
    assert audit.committed_position(s, end_offsets(sent)).batch == 2
    admin = kafka_clients.admin(s)
    admin.delete_consumer_groups([s.group_id], request_timeout=30)[s.group_id].result(30)
    assert audit.committed_offsets(s, end_offsets(sent)) == {}
    jobctl.start(s)
    wait_drained(s, sent)
    assert_exact(s, sent)
    lost = events(s, wire.GROUP_OFFSETS_LOST)
    assert lost and lost[0]["ledger_batch"] == 2
    assert [e["batch"] for e in events(s, wire.BATCH_REPLAY_SKIPPED)] == [2]
    assert not any(checkpoint.exists(rel) for rel in debris)
    assert jobctl.stop(s)


def _plan(s, batch, start, end):
    return BatchPlan(batch=batch, start=on_topic(s.source_topic, {0: start}), end=on_topic(s.source_topic, {0: end}))


def _rows(batch, n):
    return [OutRecord(wire.KIND_RESULT, f"k{batch}-{i}", b'{"x":1}') for i in range(n)]


def test_a_ledger_record_behind_another_producers_open_transaction_is_waited_for(app):
    """A backfill chunk (here: a stand-in producer) holds the ledger's last stable offset back; the job's own
    record of batch 1, committed after it, is invisible for a while. The replay waits for it instead of calling it
    absent (a false divergent history, exit 4, never restarted); the transaction watch names the open one."""
    s = app(transaction_timeout_ms=5000)
    bus = ev.EventBus(s)
    first = ExactlyOnceSink(s, bus)
    assert first.write_batch(_plan(s, 0, 0, 10), _rows(0, 10)).decision is Decision.WRITE
    other = Producer(
        {
            **kafka_clients.base(s),
            "transactional.id": f"{s.transactional_id}.backfill.x",
            "transaction.timeout.ms": 120_000,
        }
    )
    other.init_transactions(30)
    other.begin_transaction()
    other.produce(
        s.ledger_topic, key=b"other", value=b"{}", headers=[(wire.H_APP, s.app_id.encode()), (wire.H_BACKFILL, b"x")]
    )
    assert other.flush(10) == 0
    assert first.write_batch(_plan(s, 1, 10, 20), _rows(1, 10)).decision is Decision.WRITE
    first.close()
    opened = time.time()

    def end_it():
        procs.wait_until(lambda: time.time() - opened > 6, 20, what="the open transaction to age")
        from onceflow.control import txnwatch

        found["hanging"] = txnwatch.hanging(
            txnwatch.open_transactions(s, [s.ledger_topic]), int(time.time() * 1000), s.transaction_timeout_ms
        )
        other.abort_transaction(30)

    found: dict = {}
    t = threading.Thread(target=end_it)
    t.start()
    replay = ExactlyOnceSink(s, bus)  # a restarted driver replays batch 1
    assert replay.decide(_plan(s, 1, 10, 20)) is Decision.SKIP
    t.join(30)
    assert time.time() - opened > 6  # it waited for the record instead of deciding without it
    [hang] = found["hanging"]
    assert hang.details["topic"] == s.ledger_topic and f"backfill x of app {s.app_id}" in hang.summary
    assert not events(s, wire.DIVERGENT_HISTORY)
    replay.close()
    bus.close()


def test_a_transaction_left_open_stops_the_writer_until_the_operator_aborts_it(app):
    """A transaction of the job's that the broker does not settle (chaos seed 4: a one-replica broker restarted while
    its partitions had no leader dropped an aborted transaction's markers; here a stand-in producer holds one open
    on a sink partition and the ledger, its ledger record the job's own) would be closed by the next COMMIT of its
    producer id and shown. The writer refuses before its first write and names the command that aborts it; the
    operator runs each command it names (Kafka's own TransactionsCommand, bin/kafka-transactions.sh), and the next
    writer commits, with none of the open records visible."""
    s = app(ledger_wait_s=3.0)
    stray = Producer(
        {**kafka_clients.base(s), "transactional.id": f"{s.transactional_id}.stray", "transaction.timeout.ms": 120_000}
    )
    stray.init_transactions(30)
    stray.begin_transaction()
    for _ in range(3):
        stray.produce(s.sink_topic, key=b"stray", value=b"{}", partition=1)
    job_headers = [(wire.H_APP, s.app_id.encode()), (wire.H_BATCH, b"0")]
    stray.produce(s.ledger_topic, key=s.app_id.encode(), value=b"{}", headers=job_headers)
    assert stray.flush(10) == 0
    bus = ev.EventBus(s)
    sink = ExactlyOnceSink(s, bus)
    started = time.monotonic()
    with pytest.raises(HangingTransaction) as refused:
        sink.write_batch(_plan(s, 0, 0, 10), _rows(0, 10))
    assert time.monotonic() - started >= 3.0  # markers on their way were waited for first
    sink.close()
    assert refused.value.exit_code == wire.ExitCode.HANGING
    commands = [c.split() for c in re.findall(r"kafka-transactions\.sh (.+?)(?:;|$)", str(refused.value))]
    aborted = sorted((c[c.index("--topic") + 1], c[c.index("--partition") + 1]) for c in commands)
    assert aborted == sorted([(s.ledger_topic, "0"), (s.sink_topic, "1")]), str(refused.value)
    for args in commands:
        # the embedded stack has no bin/kafka-transactions.sh: the same tool is `onceflow-dev kafka transactions`
        done = subprocess.run(
            [sys.executable, "-m", "onceflow_dev.cli", "kafka", "transactions", *args],
            env={**os.environ, **s.as_env()},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    sink = ExactlyOnceSink(s, bus)
    outcome = sink.write_batch(_plan(s, 0, 0, 10), _rows(0, 10))
    sink.close()
    assert outcome.decision is Decision.WRITE
    [first] = wait_event(s, wire.TRANSACTION_HANGING)
    assert first["partitions"] == {
        f"{s.ledger_topic}[0]": {"stable": 0, "high": 1},
        f"{s.sink_topic}[1]": {"stable": 0, "high": 3},
    }, first
    seen = kafka_reading.read_topic(s, s.sink_topic)
    assert sorted(m.key for m in seen) == sorted(f"k0-{i}".encode() for i in range(10))
    assert [e.batch for e in audit.ledger_entries(s)] == [0]
    stray.close()
    bus.close()


# the replaced producer's close says its commit is still in flight: that is the point of the test
@pytest.mark.filterwarnings("ignore:Producer abort_transaction failed during close")
def test_a_commit_that_times_out_is_settled_before_anything_else_is_written(app, tmp_path):
    """The broker freezes (SIGSTOP) while batch 0 commits: the commit times out on the client, its outcome unknown
    (the frozen coordinator may still apply it). The writer discards that producer and initialises a new one with
    the same transactional id, which waits until the old commit has settled; the batch is then decided again from
    what is committed, and written once in all."""
    from onceflow.faults import Injector

    s = app(commit_timeout_s=3)
    bus = ev.EventBus(s)
    marker_dir = tmp_path / "faults"
    sink = ExactlyOnceSink(s, bus, Injector("stall_in_txn@0:3", marker_dir))
    old = sink.writer.producer
    pid = procs.read_pidfile(broker.paths(s).pidfile)["pid"]
    froze: dict = {}

    def freeze_during_commit():
        marker = marker_dir / "fault.stall_in_txn.0.fired"
        procs.wait_until(marker.exists, 60, interval=0.05, what="batch 0 to hold its transaction")
        fired = marker.stat().st_mtime
        procs.wait_until(lambda: time.time() > fired + 2.5, 10, interval=0.05, what="the end of the hold")
        os.kill(pid, signal.SIGSTOP)  # the commit request reaches a frozen coordinator
        froze["at"] = time.time()
        try:  # until the client's commit deadline (the hold, then ONCEFLOW_COMMIT_TIMEOUT_S) has passed
            procs.wait_until(
                lambda: time.time() > fired + 3 + s.commit_timeout_s + 2, 20, interval=0.1, what="the commit's deadline"
            )
        finally:
            os.kill(pid, signal.SIGCONT)

    t = threading.Thread(target=freeze_during_commit)
    t.start()
    try:
        out = sink.write_batch(_plan(s, 0, 0, 10), _rows(0, 10))
    finally:
        t.join(60)
        os.kill(pid, signal.SIGCONT)
    assert "at" in froze
    assert sink.writer.producer is not old  # never used again after its commit timed out
    unknown = events(s, wire.TRANSACTION_OUTCOME_UNKNOWN)
    assert len(unknown) == 1 and unknown[0]["batch"] == 0
    assert len(events(s, "producer_replaced")) == 1
    assert out.decision in (Decision.WRITE, Decision.SKIP)
    assert sink.write_batch(_plan(s, 1, 10, 20), _rows(1, 10)).decision is Decision.WRITE
    keys = sorted(m.key for m in kafka_reading.read_topic(s, s.sink_topic))
    assert keys == sorted(f"k{b}-{i}".encode() for b in (0, 1) for i in range(10))
    assert [e.batch for e in audit.ledger_entries(s)] == [0, 1]
    sink.close()
    bus.close()
