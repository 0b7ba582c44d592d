"""The exactly-once sink through every branch, on onceflow.testing's in-memory cluster (no broker): one
transaction per batch, replays written once, divergence refused, fencing, the coordinator's timeout, a commit
whose outcome is unknown, an undeliverable DLQ copy, lost group offsets. The real-broker suites
(tests/integration/test_exactly_once.py) prove the same claims under kill -9; these pin the branches."""

import pytest
from confluent_kafka import KafkaError

from onceflow import config, wire
from onceflow.faults import Injector
from onceflow.kafka import transactional as tw
from onceflow.protocol.batch_sink import BatchNotCommitted, OutRecord, UndeliverableRecord
from onceflow.protocol.exactly_once import ExactlyOnceSink
from onceflow.rules.ledger import BatchPlan, Decision, DivergentHistory
from onceflow.rules.sources import SourcePartition, on_topic
from onceflow.testing.kafka import FakeCluster, FakeSinkReads, Landed, Slow, kafka_error

S = config.load(env={})
P0 = SourcePartition(S.source_topic, 0)  # the one source partition these batches read


def sink(cluster, scripts=(), faults=None, settings=S):
    return ExactlyOnceSink(
        settings,
        cluster.bus(settings),
        faults,
        producer_factory=cluster.producer_factory(settings.transactional_id, scripts),
        reads=FakeSinkReads(cluster, settings),
    )


def plan(batch, start, end, **kw):
    return BatchPlan(batch, on_topic(S.source_topic, {0: start}), on_topic(S.source_topic, {0: end}), **kw)


ROWS = [
    OutRecord(wire.KIND_RESULT, "2026-11-17T00:00:00.000Z|10.0.0.1", b"3"),
    OutRecord(
        wire.KIND_DLQ,
        "0:7",
        b"garbage",
        src_partition=0,
        src_offset=7,
        reason="unparseable",
        src_topic=S.source_topic,
    ),
]


def visible(cluster, topic):
    return [(r.key, r.value) for r in cluster.topic(topic)]


def test_a_batch_is_its_results_its_dlq_copies_its_ledger_record_and_its_offsets_in_one_transaction():
    c = FakeCluster()
    out = sink(c).write_batch(plan(0, 0, 10), ROWS)
    assert (out.decision, out.outputs, out.dlq) == (Decision.WRITE, 1, 1)
    assert visible(c, S.sink_topic) == [(ROWS[0].key.encode(), b"3")]
    assert visible(c, S.dlq_topic) == [(b"0:7", b"garbage")]
    [ledger] = FakeSinkReads(c, S)._entries()
    assert (ledger.batch, ledger.ranges, ledger.outputs, ledger.dlq) == (0, {P0: (0, 10)}, 1, 1)
    assert FakeSinkReads(c, S).committed([P0]).offsets == {P0: 10} and FakeSinkReads(c, S).committed([P0]).batch == 0
    dlq_headers = dict(c.topic(S.dlq_topic)[0].headers)
    assert dlq_headers[wire.H_SOURCE_OFFSET] == b"7" and dlq_headers[wire.H_BATCH] == b"0"
    assert dlq_headers[wire.H_SOURCE_TOPIC] == S.source_topic.encode()
    assert [m for _, m in c.calls if "transaction" in m] == [
        "init_transactions",
        "begin_transaction",
        "send_offsets_to_transaction",
        "commit_transaction",
    ]
    assert [(e["batch"], e["end_offsets"]) for e in c.events(S, wire.BATCH_COMMITTED)] == [(0, {"0": 10})]


def test_a_replay_of_a_committed_batch_writes_nothing_and_the_next_batch_follows_it():
    c = FakeCluster()
    sink(c).write_batch(plan(0, 0, 10), ROWS)
    again = sink(c)  # a restart: a new producer fences the old one
    assert again.write_batch(plan(0, 0, 10), ROWS).decision is Decision.SKIP
    assert len(c.topic(S.sink_topic)) == 1 and len(c.topic(S.ledger_topic)) == 1
    assert [e["decision"] for e in c.events(S, wire.BATCH_REPLAY_SKIPPED)] == ["skip"]
    assert [e["ranges"] for e in c.events(S, wire.BATCH_REPLAY_SKIPPED)] == [{"0": [0, 10]}]  # one topic: by partition
    assert again.write_batch(plan(1, 10, 20), ROWS[:1]).decision is Decision.WRITE
    assert len(c.topic(S.sink_topic)) == 2


def test_a_committed_batch_planned_again_with_another_range_is_divergent_history():
    c = FakeCluster()
    sink(c).write_batch(plan(0, 0, 10), ROWS)
    with pytest.raises(DivergentHistory):
        sink(c).write_batch(plan(0, 0, 12), ROWS)
    with pytest.raises(DivergentHistory):  # a gap: batch 1 must start where batch 0 ended
        sink(c).write_batch(plan(1, 11, 20), ROWS)
    assert len(c.topic(S.sink_topic)) == 1 and c.events(S, wire.DIVERGENT_HISTORY)


def test_an_older_instance_is_fenced_and_its_transaction_never_shows():
    c = FakeCluster()
    old = sink(c)
    sink(c)  # a newer instance of the app initialises the same transactional id
    with pytest.raises(tw.Fenced):
        old.write_batch(plan(0, 0, 10), ROWS)
    assert c.topic(S.sink_topic) == [] and FakeSinkReads(c, S).committed([P0]).offsets == {}
    assert c.events(S, wire.FENCED)


def test_a_transaction_the_coordinator_aborted_is_a_timeout_with_advice_and_nothing_visible():
    c = FakeCluster()
    # the coordinator's abort bumps the epoch: the commit, at the timeout, looks fenced
    timed_out = Slow(0.06, kafka_error(KafkaError._FENCED, fatal=True))
    s = sink(c, [{"commit_transaction": [timed_out]}], settings=S.replace(transaction_timeout_ms=50))
    with pytest.raises(tw.CoordinatorTimedOut, match="aborted by the coordinator after"):
        s.write_batch(plan(0, 0, 10), ROWS)
    assert c.topic(S.sink_topic) == [] and c.topic(S.ledger_topic) == []
    [event] = c.events(S, wire.TRANSACTION_TIMEOUT)
    assert "raise ONCEFLOW_TRANSACTION_TIMEOUT_MS" in event["action"]


def test_a_timeouts_advice_names_the_elapsed_time_its_event_reports(monkeypatch):
    """CI, 2026-11-27: the advice said 12,131 ms, the event 12,132 (two readings of the clock). The sink's clock
    here moves half a second per reading, so two readings can never agree."""
    import time as real_time

    from onceflow.protocol import exactly_once

    readings = iter(range(1_000_000))

    class Clock:
        @staticmethod
        def monotonic() -> float:
            return real_time.monotonic() + 0.5 * next(readings)

    monkeypatch.setattr(exactly_once, "time", Clock)
    c = FakeCluster()
    timed_out = Slow(0.06, kafka_error(KafkaError._FENCED, fatal=True))
    s = sink(c, [{"commit_transaction": [timed_out]}], settings=S.replace(transaction_timeout_ms=50))
    with pytest.raises(tw.CoordinatorTimedOut):
        s.write_batch(plan(0, 0, 10), ROWS)
    [event] = c.events(S, wire.TRANSACTION_TIMEOUT)
    assert f"above the {event['elapsed_ms']} ms this one took" in event["action"], event


def test_a_commit_whose_outcome_is_unknown_but_landed_is_reported_committed_once():
    c = FakeCluster()
    unknown = kafka_error(KafkaError._TIMED_OUT, retriable=True)
    out = sink(c, [{"commit_transaction": [Landed(unknown)]}]).write_batch(plan(0, 0, 10), ROWS)
    assert (out.decision, out.outputs, out.dlq) == (Decision.WRITE, 1, 1)
    assert len(c.topic(S.sink_topic)) == 1  # written once, not again by a second attempt
    [committed] = c.events(S, wire.BATCH_COMMITTED)
    assert committed["settled_after_unknown_outcome"] is True
    assert c.events(S, wire.TRANSACTION_OUTCOME_UNKNOWN)


def test_a_commit_whose_outcome_is_unknown_and_did_not_land_is_written_again_from_rows_it_can_reread():
    c = FakeCluster()
    unknown = kafka_error(KafkaError._TIMED_OUT, retriable=True)
    out = sink(c, [{"commit_transaction": [unknown]}]).write_batch(plan(0, 0, 10), ROWS)
    assert out.decision is Decision.WRITE and len(c.topic(S.sink_topic)) == 1


def test_a_streamed_batch_whose_commit_did_not_land_fails_the_query_for_spark_to_replay():
    c = FakeCluster()
    unknown = kafka_error(KafkaError._TIMED_OUT, retriable=True)
    with pytest.raises(BatchNotCommitted):
        sink(c, [{"commit_transaction": [unknown]}]).write_batch(plan(0, 0, 10), iter(ROWS))
    assert c.topic(S.sink_topic) == []


class Rereadable:
    """Rows that can be iterated again, as the driver's are (onceflow.spark.partition_stream.Stored): not a
    one-shot iterator, not a list."""

    def __init__(self, rows):
        self.rows, self.reads = rows, 0

    def __iter__(self):
        self.reads += 1
        return iter(list(self.rows))


def test_a_send_offsets_that_hangs_is_given_up_and_the_batch_written_again_by_the_same_sink(tmp_path):
    """librdkafka #5456 (the cluster chaos runs' leader kills): send_offsets_to_transaction blocks past its
    timeout. Past the timeout and its grace the writer replaces its producer (fencing the wedged one, whose
    transaction is aborted), and the batch, decided again, is written from its rows read a second time, in the same
    process: before, it failed the query, and the job's restart and the batch's recompute cost a minute or more."""
    c = FakeCluster()
    quick = S.replace(send_offsets_timeout_s=0.1)  # given up 0.2 s after the call began
    faults = Injector("hang_send_offsets@0:1.5", tmp_path)
    rows = Rereadable(ROWS)
    out = sink(c, faults=faults, settings=quick).write_batch(plan(0, 0, 10), rows)
    assert (out.decision, out.outputs, out.dlq) == (Decision.WRITE, 1, 1) and rows.reads == 2
    assert visible(c, S.sink_topic) == [(ROWS[0].key.encode(), b"3")] and len(c.topic(S.ledger_topic)) == 1
    [unknown] = c.events(quick, wire.TRANSACTION_OUTCOME_UNKNOWN)
    assert unknown["batch"] == 0 and "has not returned" in unknown["error"], unknown
    assert [e["batch"] for e in c.events(quick, wire.BATCH_COMMITTED)] == [0]
    # a one-shot iterator cannot be read again: the query fails, and Spark replays the batch after the restart
    c2 = FakeCluster()
    with pytest.raises(BatchNotCommitted, match="send_offsets hung"):
        sink(c2, faults=Injector("hang_send_offsets@0:1.5", tmp_path / "2"), settings=quick).write_batch(
            plan(0, 0, 10), iter(ROWS)
        )
    assert c2.topic(S.sink_topic) == []


def test_an_undeliverable_dlq_copy_aborts_the_batch_and_names_the_record(tmp_path):
    c = FakeCluster()
    faults = Injector("undeliverable@0:7", tmp_path)
    with pytest.raises(UndeliverableRecord, match=r"offset 7"):
        sink(c, faults=faults).write_batch(plan(0, 0, 10), ROWS)
    assert c.topic(S.sink_topic) == [] and c.topic(S.ledger_topic) == []
    assert ("p0", "abort_transaction") in c.calls


def test_an_abortable_produce_error_aborts_and_nothing_is_visible():
    c = FakeCluster()
    s = sink(c, [{"produce": [None, kafka_error(KafkaError.UNKNOWN)]}])
    with pytest.raises(tw.Aborted):
        s.write_batch(plan(0, 0, 10), ROWS)
    assert c.topic(S.sink_topic) == [] and FakeSinkReads(c, S).committed([P0]).offsets == {}


def test_lost_group_offsets_are_decided_from_the_ledger():
    c = FakeCluster()
    sink(c).write_batch(plan(0, 0, 10), ROWS)
    c.groups.clear()  # Kafka's offsets.retention.minutes expired the group
    s = sink(c)
    assert s.decide(plan(0, 0, 10)) is Decision.SKIP  # the ledger says batch 0 is committed with this range
    assert s.decide(plan(1, 10, 20)) is Decision.WRITE
    assert c.events(S, wire.GROUP_OFFSETS_LOST)
    s.write_batch(plan(1, 10, 20), ROWS[:1])
    assert FakeSinkReads(c, S).committed([P0]).offsets == {P0: 20}  # the next commit restores the group's offsets


def test_each_ledger_record_carries_the_version_of_its_apps_own_rules():
    """The version is the app's (App.rules_version), not the access-log parser's: restores and the reconciliation
    compare it batch by batch."""
    from tests.support.apps import REGISTRY

    versioned = config.load(env={"ONCEFLOW_APP": "versioned", "ONCEFLOW_APP_REGISTRY": REGISTRY})
    c = FakeCluster()
    sink(c, settings=versioned).write_batch(
        BatchPlan(0, on_topic(versioned.source_topic, {0: 0}), on_topic(versioned.source_topic, {0: 10})), ROWS
    )
    [ledger] = FakeSinkReads(c, versioned)._entries()
    assert ledger.rules == 7
    sink(c).write_batch(plan(0, 0, 10), ROWS)
    [ip_count] = FakeSinkReads(c, S)._entries()
    assert ip_count.rules == 2  # ip_count declares the access-log rules' version


def test_a_transaction_the_broker_left_open_stops_the_job_before_it_commits_over_it(monkeypatch):
    """A broker that restarts while a partition has no leader can drop an aborted transaction's markers ("likely
    deleted already and hence can be skipped"): its records stay open, and the next commit of the same producer id
    would close them as committed (make chaos-seeds, seed 4 on one node: 207 DLQ records and a ledger record shown
    twice). The sink checks the partitions only its job writes before a new producer's first write and stops."""
    from onceflow.protocol.hanging import HangingTransaction

    s = S.replace(ledger_wait_s=0.3)
    c = FakeCluster()
    sink(c, settings=s).write_batch(plan(0, 0, 10), ROWS)
    c.append(s.dlq_topic, b"0:8", b"from the aborted attempt")  # its ABORT marker never came
    c.hold[(s.dlq_topic, 0)] = 1
    with pytest.raises(HangingTransaction, match=r"open on ip_count_dlq\[0\] since offset 1 \(high watermark 2\)") as e:
        sink(c, settings=s).write_batch(plan(1, 10, 20), ROWS)
    assert e.value.exit_code == wire.ExitCode.HANGING and not e.value.exit_code.restart
    from onceflow.runtime.driver_state import failure_exit_code

    assert failure_exit_code(e.value) == wire.ExitCode.HANGING and wire.ExitCode.HANGING in wire.NO_RESTART
    assert "kafka-transactions.sh --bootstrap-server" in str(e.value) and "--start-offset 1" in str(e.value)
    assert len(FakeSinkReads(c, s)._entries()) == 1 and len(c.topic(s.sink_topic)) == 1  # nothing written over it
    [event] = c.events(s, wire.TRANSACTION_HANGING)
    assert event["partitions"] == {"ip_count_dlq[0]": {"stable": 1, "high": 2}}
    del c.hold[(s.dlq_topic, 0)]  # the operator aborted it
    assert sink(c, settings=s).write_batch(plan(1, 10, 20), ROWS).decision is Decision.WRITE


def test_on_the_shared_ledger_only_a_transaction_the_job_opened_stops_it():
    """The ledger is shared with backfills, restores and quarantines, whose transactions stay open while they
    compute: one of theirs holding the ledger's last stable offset is theirs to settle, and the job writes on. A
    transaction whose first record is the job's own ledger record of a batch (seed 4's second doubled record) is
    the job's, left hanging: it stops."""
    from onceflow.protocol.hanging import HangingTransaction

    s = S.replace(ledger_wait_s=0.3)
    c = FakeCluster()
    sink(c, settings=s).write_batch(plan(0, 0, 10), ROWS)
    backfill = [(wire.H_APP, s.app_id.encode()), (wire.H_BACKFILL, b"b-1")]
    c.append(s.ledger_topic, s.app_id.encode(), b"{}", backfill)  # a backfill's chunk, its transaction open
    c.hold[(s.ledger_topic, 0)] = 1
    assert sink(c, settings=s).write_batch(plan(1, 10, 20), ROWS).decision is Decision.WRITE
    assert not c.events(s, wire.TRANSACTION_HANGING)
    del c.hold[(s.ledger_topic, 0)]
    job = [(wire.H_APP, s.app_id.encode()), (wire.H_BATCH, b"2")]
    at = len(c.partition(s.ledger_topic, 0))
    c.append(s.ledger_topic, s.app_id.encode(), b"{}", job)  # the job's own record of batch 2: its markers dropped
    c.hold[(s.ledger_topic, 0)] = at
    with pytest.raises(HangingTransaction, match=rf"open on {s.ledger_topic}\[0\] since offset {at} "):
        sink(c, settings=s).write_batch(plan(2, 20, 30), ROWS)
    [event] = c.events(s, wire.TRANSACTION_HANGING)
    assert list(event["partitions"]) == [f"{s.ledger_topic}[0]"]


def test_markers_on_their_way_are_waited_for_and_a_failed_transaction_is_checked_again(monkeypatch):
    import threading
    import time

    s = S.replace(ledger_wait_s=5.0)
    c = FakeCluster()
    timed_out = Slow(0.06, kafka_error(KafkaError._FENCED, fatal=True))
    first = sink(c, [{"commit_transaction": [timed_out]}], settings=s.replace(transaction_timeout_ms=50))
    with pytest.raises(tw.CoordinatorTimedOut):
        first.write_batch(plan(0, 0, 10), ROWS)
    c.append(s.sink_topic, b"k", b"v")  # the aborted attempt's record, its marker late
    c.hold[(s.sink_topic, 0)] = len(c.topic(s.sink_topic)) - 1
    threading.Timer(0.4, lambda: c.hold.clear()).start()  # the marker lands
    again = sink(c, settings=s)
    t0 = time.monotonic()
    assert again.write_batch(plan(0, 0, 10), ROWS).decision is Decision.WRITE
    assert time.monotonic() - t0 >= 0.35  # the replay began only once the marker had landed
    assert len([m for _, m in c.calls if m == "begin_transaction"]) == 2  # the first attempt and the replay


NETWORKS = config.load(env={}, app="ip_networks")  # declares a named output, `unlisted`


def test_an_apps_named_outputs_go_to_their_own_topics_in_the_batchs_one_transaction_counted_per_topic():
    c = FakeCluster()
    rows = [
        OutRecord(wire.KIND_RESULT, "10.0.0.1", b"listed"),
        OutRecord(wire.KIND_RESULT, "192.0.2.9", b"unlisted", output="unlisted"),
        OutRecord(wire.KIND_RESULT, "::1", b"v6", output="unlisted"),
    ]
    out = sink(c, settings=NETWORKS).write_batch(
        BatchPlan(0, on_topic(NETWORKS.source_topic, {0: 0}), on_topic(NETWORKS.source_topic, {0: 3})), rows
    )
    unlisted = NETWORKS.outputs["unlisted"]
    assert unlisted == f"{NETWORKS.sink_topic}-unlisted"
    assert (out.outputs, visible(c, NETWORKS.sink_topic)) == (3, [(b"10.0.0.1", b"listed")])
    assert visible(c, unlisted) == [(b"192.0.2.9", b"unlisted"), (b"::1", b"v6")]
    [ledger] = FakeSinkReads(c, NETWORKS)._entries()
    assert ledger.outputs == 3 and ledger.outputs_by_topic == {NETWORKS.sink_topic: 1, unlisted: 2}
    assert [m for _, m in c.calls if "transaction" in m].count("commit_transaction") == 1


def test_a_one_output_apps_ledger_record_keeps_its_shape():
    c = FakeCluster()
    sink(c).write_batch(plan(0, 0, 10), ROWS)
    [record] = c.topic(S.ledger_topic)
    assert b"outputs_by_topic" not in record.value
    assert f'"topic":"{S.source_topic}"'.encode() in record.value and b'"ranges":{"0":[0,10]}' in record.value


def test_a_result_naming_an_output_the_app_does_not_declare_fails_its_batch_and_nothing_shows():
    from onceflow.protocol.batch_sink import UnknownOutput
    from onceflow.runtime.driver_state import failure_exit_code

    c = FakeCluster()
    rows = [OutRecord(wire.KIND_RESULT, "10.0.0.1", b"a"), OutRecord(wire.KIND_RESULT, "x", b"b", output="nope")]
    with pytest.raises(UnknownOutput, match="output 'nope'.*'main', 'unlisted'") as e:
        sink(c, settings=NETWORKS).write_batch(
            BatchPlan(0, on_topic(NETWORKS.source_topic, {0: 0}), on_topic(NETWORKS.source_topic, {0: 2})), rows
        )
    assert failure_exit_code(e.value) == wire.EXIT_CONFIG  # the app's bug: not restarted into it
    assert visible(c, NETWORKS.sink_topic) == [] and visible(c, NETWORKS.ledger_topic) == []
