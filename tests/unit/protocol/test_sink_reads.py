"""What the Kafka sink reads before it writes, through the real readers (onceflow.protocol.sink_reads.KafkaSinkReads,
onceflow.protocol.ledger_reader, onceflow.kafka.reading) on scripted clients (onceflow.testing.kafka: a consumer and an
admin client over the in-memory cluster the scripted producers commit to): the group's position, the ledger's
records found newest first and no further back than needed, another app's records passed over, an open
transaction that hides the ledger's end (waited for, then transient, never "absent"), the scan's bound, and the
lookups that ride out a moving leader or coordinator."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from onceflow import config, wire
from onceflow.kafka import reading
from onceflow.protocol import ledger_reader
from onceflow.protocol.batch_sink import OutRecord
from onceflow.protocol.exactly_once import ExactlyOnceSink
from onceflow.protocol.sink_reads import KafkaSinkReads
from onceflow.rules.ledger import BatchPlan, Decision, LedgerEntry
from onceflow.rules.sources import SourcePartition, on_topic
from onceflow.testing.kafka import FakeCluster, ScriptedAdmin, ScriptedConsumer, kafka_error

S = config.load(env={})
P0, P1 = SourcePartition(S.source_topic, 0), SourcePartition(S.source_topic, 1)
ROWS = [OutRecord(wire.KIND_RESULT, "k", b"v")]


def reads(c: FakeCluster, s: config.Settings = S, **scripts) -> KafkaSinkReads:
    return KafkaSinkReads(
        s,
        group=ScriptedConsumer(c, s.group_id, name="group"),
        ledger=ScriptedConsumer(c, name="ledger"),
        admin=ScriptedAdmin(c, scripts.get("admin")),
    )


def sink(c: FakeCluster, s: config.Settings = S) -> ExactlyOnceSink:
    return ExactlyOnceSink(s, c.bus(s), producer_factory=c.producer_factory(s.transactional_id), reads=reads(c, s))


def plan(batch: int, start: int, end: int) -> BatchPlan:
    return BatchPlan(batch, on_topic(S.source_topic, {0: start}), on_topic(S.source_topic, {0: end}))


def committed_batches(c: FakeCluster, n: int, s: config.Settings = S) -> None:
    for b in range(n):
        sink(c, s).write_batch(plan(b, 10 * b, 10 * (b + 1)), ROWS)


def test_the_sink_decides_through_the_real_readers_a_write_a_replay_and_lost_group_offsets():
    c = FakeCluster()
    assert sink(c).write_batch(plan(0, 0, 10), ROWS).decision is Decision.WRITE
    assert reads(c).committed([P0]).offsets == {P0: 10} and reads(c).committed([P0]).batch == 0
    assert sink(c).write_batch(plan(0, 0, 10), ROWS).decision is Decision.SKIP  # a replay: written once
    c.groups.clear()  # Kafka expired the group's offsets (offsets.retention.minutes)
    assert reads(c).newest().batch == 0
    assert sink(c).write_batch(plan(0, 0, 10), ROWS).decision is Decision.SKIP  # decided from the ledger
    assert len(c.topic(S.sink_topic)) == 1


def test_a_ledger_lookup_reads_newest_first_and_stops_at_an_earlier_batch(monkeypatch):
    monkeypatch.setattr(ledger_reader, "CHUNK", 2)
    c = FakeCluster()
    committed_batches(c, 8)
    r = reads(c)
    assigned = lambda: sum(1 for who, m in c.calls if who == "ledger" and m == "assign")
    assert r.entry(7).batch == 7 and assigned() == 1  # the newest chunk holds it
    before = assigned()
    assert r.entry(3).batch == 3 and assigned() - before == 3  # three chunks back, not the whole ledger
    before = assigned()
    assert r.entry(42) is None and assigned() - before == 1  # batch 7 is newer than 42 could be: absent at once
    assert r.newest().batch == 7


def chunks(c: FakeCluster, n: int, key: bytes = S.app_id.encode()) -> None:
    """`n` backfill chunk records on the app's ledger, as a backfill commits them (newer than any batch)."""
    for i in range(n):
        rec = LedgerEntry(S.app_id, i, {P0: (0, 1)}, 0, 0, 1, 0, 1.0, 0, "bf", kind=wire.LEDGER_BACKFILL)
        c.append(S.ledger_topic, key, rec.to_json())


def test_what_else_the_ledger_holds_is_passed_over():
    """The ledger is one partition shared by the job's batches, backfill chunks, restores and quarantines: a lookup
    takes the app's stream records only."""
    c = FakeCluster()
    committed_batches(c, 2)
    chunks(c, 5)  # newer, with higher numbers than any batch
    c.append(S.ledger_topic, b"not-this-app", b"{}")
    assert reads(c).newest().batch == 1 and reads(c).entry(3) is None and reads(c).entry(0).batch == 0


def test_an_open_transaction_hiding_the_ledgers_end_is_waited_for_then_transient_never_absent():
    c = FakeCluster()
    committed_batches(c, 3)
    s = S.replace(ledger_wait_s=0.3)
    c.hold[(s.ledger_topic, 0)] = 1  # a backfill's transaction opened at offset 1 holds the stable offset there
    with pytest.raises(ledger_reader.LedgerNotVisible, match="open transaction at offset 1 .high watermark 3"):
        reads(c, s).entry(2)
    del c.hold[(s.ledger_topic, 0)]  # it ended
    assert reads(c, s).entry(2).batch == 2


def test_a_record_beyond_the_scans_bound_stops_the_job_rather_than_guessing(monkeypatch):
    monkeypatch.setattr(ledger_reader, "CHUNK", 2)
    monkeypatch.setattr(ledger_reader, "MAX_SCAN", 4)
    c = FakeCluster()
    committed_batches(c, 1)
    chunks(c, 6)  # six newer records that are not the app's batches
    with pytest.raises(ledger_reader.LedgerScanLimit, match="within the newest 4 records"):
        reads(c).newest()
    monkeypatch.setattr(ledger_reader, "MAX_SCAN", 8)
    assert reads(c).newest().batch == 0


def test_offset_lookups_ride_out_a_moving_leader_within_their_bound(monkeypatch):
    c = FakeCluster()
    committed_batches(c, 2)
    tp = TopicPartition(S.ledger_topic, 0)
    moving = kafka_error(KafkaError.NOT_LEADER_FOR_PARTITION, retriable=True)
    admin = ScriptedAdmin(c, {"list_offsets": [moving, moving]})
    assert reading.latest_offsets(admin, [tp]) == {(S.ledger_topic, 0): 2}
    monkeypatch.setattr(reading, "LEADER_WAIT_S", 0.3)
    stuck = ScriptedAdmin(c, {"list_offsets": [moving] * 1000})
    with pytest.raises(Exception, match="NOT_LEADER|scripted"):
        reading.latest_offsets(stuck, [tp])


def test_an_offset_lookup_with_a_stale_leader_epoch_is_asked_again():
    """The short chaos run (2026-11-28): the broker restarted with the job's admin client holding the old leader
    epoch; the lookup answered FENCED_LEADER_EPOCH, the job failed its batch on it and was restarted (46 s to the next
    commit), where a second lookup, after the client refreshed its metadata, finds the partition's new epoch."""
    c = FakeCluster()
    committed_batches(c, 2)
    tp = TopicPartition(S.ledger_topic, 0)
    for code in (KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH):
        stale = kafka_error(code, retriable=True)
        assert reading.latest_offsets(ScriptedAdmin(c, {"list_offsets": [stale]}), [tp]) == {(S.ledger_topic, 0): 2}


def test_an_offset_lookup_a_dead_leader_never_answered_is_asked_again_within_the_bound(monkeypatch):
    """Cluster chaos seed 4711: the leader died with the lookup in flight, its future timed out, and the job failed
    its batch on that (a restart in the middle of a broker's outage) instead of asking the new leader."""
    c = FakeCluster()
    committed_batches(c, 2)
    tp = TopicPartition(S.ledger_topic, 0)
    admin = ScriptedAdmin(c, {"list_offsets": [TimeoutError(), TimeoutError()]})
    assert reading.latest_offsets(admin, [tp]) == {(S.ledger_topic, 0): 2}
    assert reading.unsettled(ScriptedAdmin(c, {"list_offsets": [TimeoutError()]}), [tp]) == {}
    monkeypatch.setattr(reading, "LEADER_WAIT_S", 0.3)
    with pytest.raises(TimeoutError):
        reading.latest_offsets(ScriptedAdmin(c, {"list_offsets": [TimeoutError()] * 1000}), [tp])


def test_a_groups_position_is_read_while_its_coordinator_loads():
    c = FakeCluster()
    sink(c).write_batch(plan(0, 0, 10), ROWS)
    loading = kafka_error(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, retriable=True)
    group = ScriptedConsumer(c, S.group_id, {"committed": [loading, loading]})
    got = reading.group_offsets(S, [P0, P1], consumer=group)
    assert got[0][:2] == (P0, 10) and json.loads(got[0][2])["batch"] == 0 and got[1] == (P1, None, "")
    assert [m for who, m in c.calls if who == "consumer"].count("committed") == 3  # twice loading, then read


def test_partitions_with_a_transaction_open_are_named_with_their_stable_offset_and_high_watermark():
    c = FakeCluster()
    committed_batches(c, 2)
    c.append(S.dlq_topic, b"k", b"open")  # a transaction's record, its marker not written
    c.hold[(S.dlq_topic, 0)] = 0
    parts = [(S.sink_topic, 0), (S.dlq_topic, 0), (S.ledger_topic, 0)]
    assert reads(c).unsettled(parts) == {(S.dlq_topic, 0): (0, 1)}
    c.hold.clear()
    assert reads(c).unsettled(parts) == {}


def test_a_stale_leader_epoch_that_persists_is_asked_again_of_a_new_admin_client(monkeypatch):
    """Cluster chaos seed 1 (2026-11-29): after a leader kill the job's held admin client answered FENCED_LEADER_EPOCH
    for all of the lookup's 45 s (librdkafka asks again with the epoch it cached), the batch failed, and the next
    commit came 212 s after the kill. A new client's metadata holds the new epoch."""
    monkeypatch.setattr(reading, "LEADER_WAIT_S", 0.5)
    c = FakeCluster()
    committed_batches(c, 2)
    tp = TopicPartition(S.ledger_topic, 0)

    def stale_admin():
        return ScriptedAdmin(c, {"list_offsets": [kafka_error(KafkaError.FENCED_LEADER_EPOCH, retriable=True)] * 100})

    with pytest.raises(KafkaException):  # the held client alone never gets past it
        reading.latest_offsets(stale_admin(), [tp])
    made = []

    def new_admin():
        made.append(ScriptedAdmin(c))
        return made[-1]

    reads = KafkaSinkReads(
        S, group=ScriptedConsumer(c), ledger=ScriptedConsumer(c), admin=stale_admin(), new_admin=new_admin
    )
    assert reads.unsettled([(S.ledger_topic, 0)]) == {} and len(made) == 1 and reads.admin.client is made[0]
