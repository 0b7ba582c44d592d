"""The transactional writer through every error branch, with a scripted fake producer (no broker), the way
flink-connector-kafka's KafkaCommitterTest drives its committer with a mock producer."""

import pytest
from confluent_kafka import KafkaError

from onceflow import wire
from onceflow.kafka import transactional as t
from onceflow.testing.kafka import ScriptedProducer, kafka_error

kerr = kafka_error
FakeProducer = ScriptedProducer  # on no cluster: calls are recorded, nothing is kept


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def writer(scripts, timeout_ms=60_000, clock=None, fail_delivery=None, events=None):
    """scripts: one script per producer the writer will create, in order."""
    calls, made = [], []

    def make():
        p = FakeProducer(f"p{len(made)}", calls, scripts[len(made)] if len(made) < len(scripts) else {}, fail_delivery)
        made.append(p)
        return p

    w = t.TransactionalWriter(
        make,
        wire.H_APP,
        timeout_ms,
        clock=clock or Clock(),
        sleep=lambda s: None,
        on_event=(lambda k, d: events.append(k)) if events is not None else None,
    )
    return w, calls, made


def one_batch(w, key=b"k"):
    w.begin()
    w.produce("sink", key, b"v")
    w.send_offsets([], object())
    w.commit()


def test_happy_path_calls_in_order():
    w, calls, _ = writer([{}])
    one_batch(w)
    assert [m for _, m in calls] == [
        "init_transactions",
        "begin_transaction",
        "produce",
        "send_offsets_to_transaction",
        "commit_transaction",
    ]
    assert w.elapsed_ms is None


def test_backpressure_on_produce_polls_and_retries():
    w, calls, _ = writer([{"produce": [BufferError(), BufferError(), None]}])
    w.begin()
    w.produce("sink", b"k", b"v")
    assert [m for _, m in calls][2:] == ["produce", "poll", "produce", "poll", "produce"]


def test_an_abortable_produce_error_aborts():
    w, calls, _ = writer([{"produce": [kerr(KafkaError._STATE, abortable=True)]}])
    w.begin()
    with pytest.raises(t.Aborted):
        w.produce("sink", b"k", b"v")
    assert calls[-1] == ("p0", "abort_transaction")
    one_batch(w)  # the writer goes on with the same producer


def test_a_failed_delivery_is_named_when_the_commit_fails():
    w, calls, _ = writer(
        [{"commit_transaction": [kerr(KafkaError.MSG_SIZE_TOO_LARGE, abortable=True)]}], fail_delivery=b"big"
    )
    with pytest.raises(t.Aborted, match=r"record key b'big' to topic sink .*Message size too large"):
        one_batch(w, key=b"big")
    assert calls[-1] == ("p0", "abort_transaction")


def test_a_retriable_commit_error_is_retried():
    w, calls, _ = writer([{"commit_transaction": [kerr(KafkaError.COORDINATOR_NOT_AVAILABLE, retriable=True), None]}])
    one_batch(w)
    assert [m for _, m in calls].count("commit_transaction") == 2 and "abort_transaction" not in [m for _, m in calls]


def test_a_commit_retried_until_its_deadline_is_an_unknown_outcome_not_an_abort():
    """A retriable commit error past commit_timeout_s: the commit may still land, so the producer is replaced
    (never aborted and reused: the next transaction could absorb the late commit)."""
    clock = Clock()
    busy = kerr(KafkaError.COORDINATOR_NOT_AVAILABLE, retriable=True)

    class Late(FakeProducer):
        def commit_transaction(self, timeout):
            clock.now += 70.0  # each try waits out its time
            super().commit_transaction(timeout)

    calls, made = [], []

    def make():
        p = Late(f"p{len(made)}", calls, {"commit_transaction": [busy, busy]} if not made else {})
        made.append(p)
        return p

    w = t.TransactionalWriter(make, wire.H_APP, 60_000, clock=clock, sleep=lambda s: None, commit_timeout_s=120)
    with pytest.raises(t.OutcomeUnknown):
        one_batch(w)
    assert "abort_transaction" not in [m for _, m in calls]
    assert w.producer is made[1] and ("p1", "init_transactions") in calls


@pytest.mark.parametrize("method", ["commit_transaction", "abort_transaction"])
def test_a_commit_or_abort_that_times_out_replaces_the_producer_before_anything_else(method):
    events = []
    script = (
        {"commit_transaction": [kerr(KafkaError._TIMED_OUT, retriable=True)]}
        if method == "commit_transaction"
        else {"produce": [kerr(KafkaError._STATE, abortable=True)], "abort_transaction": [kerr(KafkaError._TIMED_OUT)]}
    )
    w, calls, made = writer([script, {}], events=events)
    with pytest.raises(t.OutcomeUnknown if method == "commit_transaction" else t.Aborted):
        one_batch(w)
    assert w.producer is made[1]
    # the new producer is initialised before the old one is closed, and before anything else happens
    after = calls[calls.index(("p0", method)) + 1 :]
    assert after[0] == ("p1", "init_transactions") and ("p0", "close") in after
    assert events == ["producer_replaced"]
    one_batch(w)
    assert all(
        name == "p1" for name, m in calls[calls.index(("p1", "init_transactions")) :] if m != "close" and m != "purge"
    )


def test_a_fenced_producer_is_never_aborted_nor_initialised_again():
    w, calls, made = writer([{"commit_transaction": [kerr(KafkaError.PRODUCER_FENCED, fatal=True)]}])
    with pytest.raises(t.Fenced):
        one_batch(w)
    assert "abort_transaction" not in [m for _, m in calls] and len(made) == 1
    with pytest.raises(t.Fenced):
        w.begin()


def test_fatal_is_not_fenced():
    w, calls, made = writer(
        [{"send_offsets_to_transaction": [kerr(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, fatal=True)]}]
    )
    with pytest.raises(t.FatalProducerError):
        one_batch(w)
    with pytest.raises(t.FatalProducerError):
        w.begin()
    assert len(made) == 1


def test_an_epoch_error_late_in_the_transaction_is_the_coordinators_timeout():
    clock = Clock()
    w, calls, _ = writer(
        [{"commit_transaction": [kerr(KafkaError.INVALID_PRODUCER_EPOCH, abortable=True)]}],
        timeout_ms=6000,
        clock=clock,
    )
    w.begin()
    w.produce("sink", b"k", b"v")
    clock.now += 5.8  # 97 % of the timeout
    with pytest.raises(t.CoordinatorTimedOut):
        w.commit()
    w2, _, _ = writer(
        [{"commit_transaction": [kerr(KafkaError.INVALID_PRODUCER_EPOCH, fatal=True)]}], timeout_ms=6000, clock=Clock()
    )
    with pytest.raises(t.Fenced):  # early: another producer bumped the epoch
        one_batch(w2)


def test_init_errors():
    # the broker's refusal names the value it refused and the setting to change (the sink raises it as it is)
    with pytest.raises(t.TxnConfigError, match="refused transaction.timeout.ms=60000: .* lower ONCEFLOW_TRANSACTION_"):
        writer([{"init_transactions": [kerr(KafkaError.INVALID_TRANSACTION_TIMEOUT, fatal=True)]}])
    w, calls, _ = writer([{"init_transactions": [kerr(KafkaError._TIMED_OUT, retriable=True), None]}])
    assert [m for _, m in calls] == ["init_transactions", "init_transactions"]
    with pytest.raises(t.Fenced, match="fenced by a newer instance"):
        writer([{"init_transactions": [kerr(KafkaError._FENCED, fatal=True)]}])


@pytest.mark.parametrize(
    "code, flags, phase, elapsed, expected",
    [
        (KafkaError.INVALID_TRANSACTION_TIMEOUT, {"fatal": True}, "init", None, t.Outcome.CONFIG),
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, {}, "produce", 10, t.Outcome.CONFIG),
        (KafkaError._TIMED_OUT, {"retriable": True}, "commit", 10, t.Outcome.OUTCOME_UNKNOWN),
        (KafkaError._TIMED_OUT, {"retriable": True}, "abort", None, t.Outcome.OUTCOME_UNKNOWN),
        (KafkaError._TIMED_OUT, {"retriable": True}, "send_offsets", 10, t.Outcome.RETRIABLE),
        (KafkaError._FENCED, {"fatal": True}, "commit", 10, t.Outcome.FENCED),
        (KafkaError._FENCED, {"fatal": True}, "commit", 59_000, t.Outcome.COORDINATOR_TIMEOUT),
        (KafkaError.INVALID_PRODUCER_EPOCH, {"abortable": True}, "produce", 57_001, t.Outcome.COORDINATOR_TIMEOUT),
        (KafkaError._STATE, {"abortable": True}, "commit", 58_000, t.Outcome.COORDINATOR_TIMEOUT),
        (KafkaError._STATE, {"abortable": True}, "commit", 10, t.Outcome.ABORTABLE),
        (KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, {"fatal": True}, "produce", 10, t.Outcome.FATAL),
        (KafkaError.UNKNOWN, {}, "produce", 10, t.Outcome.ABORTABLE),
        (KafkaError.INVALID_TXN_STATE, {"fatal": True}, "commit", 10, t.Outcome.FATAL),  # a state error is not fencing
        (KafkaError.INVALID_TXN_STATE, {"abortable": True}, "produce", 10, t.Outcome.ABORTABLE),
        (KafkaError.UNKNOWN, {}, "init", None, t.Outcome.FATAL),
    ],
)
def test_classify(code, flags, phase, elapsed, expected):
    err = KafkaError(
        code,
        "x",
        fatal=flags.get("fatal", False),
        retriable=flags.get("retriable", False),
        txn_requires_abort=flags.get("abortable", False),
    )
    assert t.classify(err, phase=phase, elapsed_ms=elapsed, timeout_ms=60_000) == expected


def test_a_streamed_batch_is_not_read_twice_after_an_unknown_outcome():
    """The sink streams a batch's output from Spark once; if its commit's outcome was unknown and it did not land,
    the batch is replayed by Spark after a restart rather than asked for again (a list is written again in place)."""
    from onceflow.protocol import batch_sink as bs
    from onceflow.protocol import exactly_once as eo
    from onceflow.rules.ledger import BatchPlan, Decision
    from onceflow.rules.sources import on_topic

    class Bus:
        def emit(self, *a, **k):
            return {}

    sink = eo.ExactlyOnceSink.__new__(eo.ExactlyOnceSink)
    sink.bus, sink.s = Bus(), type("S", (), {"transactional_id": "onceflow.app"})()
    written = []

    def write(plan, rows):
        rows = list(rows)
        if not written:
            written.append(rows)
            raise t.OutcomeUnknown("commit timed out")
        written.append(rows)
        return bs.BatchOutcome(plan.batch, Decision.WRITE, len(rows))

    sink._write = write
    sink.decide = lambda plan: Decision.WRITE  # the commit did not land
    plan = BatchPlan(batch=3, start=on_topic("src", {0: 0}), end=on_topic("src", {0: 5}))
    rows = [bs.OutRecord(wire.KIND_RESULT, "k", b"v")]
    assert sink.write_batch(plan, rows, Decision.WRITE).outputs == 1 and written == [rows, rows]
    written.clear()
    with pytest.raises(bs.BatchNotCommitted, match="replays the batch"):
        sink.write_batch(plan, iter(rows), Decision.WRITE)
    assert written == [rows]  # asked for once


def test_a_commit_of_unknown_outcome_that_landed_is_reported_as_a_committed_batch():
    """The commit timed out but had landed: decided again, the batch is committed. It was written once, by this
    attempt: reported as every committed batch is (batch_committed, with the ledger's counts), not as a replay."""
    from onceflow.protocol import batch_sink as bs
    from onceflow.protocol import exactly_once as eo
    from onceflow.rules.ledger import BatchPlan, Decision, LedgerEntry
    from onceflow.rules.sources import on_topic

    emitted = []

    class Bus:
        def emit(self, type_, *a, **k):
            emitted.append((type_, k))
            return {}

    sink = eo.ExactlyOnceSink.__new__(eo.ExactlyOnceSink)
    sink.bus, sink.s = Bus(), type("S", (), {"transactional_id": "onceflow.app"})()
    plan = BatchPlan(batch=3, start=on_topic("src", {0: 0}), end=on_topic("src", {0: 5}))
    attempts = []

    def write(plan, rows):
        attempts.append(list(rows))
        raise t.OutcomeUnknown("commit timed out", phase="commit")

    sink._write = write
    sink.decide = lambda plan: Decision.SKIP  # the group holds batch 3 and the ledger its record: it landed
    sink.ledger_entry = lambda n: LedgerEntry.for_plan("app", plan, 4, 1, 12.5, 0, "onceflow.app")
    out = sink.write_batch(plan, iter([bs.OutRecord(wire.KIND_RESULT, "k", b"v")]), Decision.WRITE)
    assert (out.decision, out.outputs, out.dlq) == (Decision.WRITE, 4, 1)
    assert len(attempts) == 1  # written once
    types = [e for e, _ in emitted]
    assert types == [wire.TRANSACTION_OUTCOME_UNKNOWN, wire.BATCH_COMMITTED], types
    committed = emitted[-1][1]
    assert committed["batch"] == 3 and committed["outputs"] == 4 and committed["settled_after_unknown_outcome"]


def test_send_offsets_that_hangs_past_its_timeout_replaces_the_wedged_producer():
    """librdkafka #5456: send_offsets_to_transaction can block for good once the group coordinator's broker died.
    The writer does not wait with it: past timeout + grace the producer is dropped (never closed: the call is still
    running inside it), a new one fences it, and the caller gets OutcomeUnknown to decide from what is committed."""
    import threading

    release = threading.Event()

    class Hanging(FakeProducer):
        def send_offsets_to_transaction(self, offsets, metadata, timeout):
            self._call("send_offsets_to_transaction")
            release.wait(30)  # ignores `timeout`, as librdkafka does

    calls, made, events = [], [], []

    def make():
        p = (Hanging if not made else FakeProducer)(f"p{len(made)}", calls)
        made.append(p)
        return p

    w = t.TransactionalWriter(
        make, wire.H_APP, 60_000, hang_grace_s=0.2, sleep=lambda s: None, on_event=lambda k, d: events.append(k)
    )
    try:
        w.begin()
        w.produce("sink", b"k", b"v")
        with pytest.raises(t.OutcomeUnknown, match="librdkafka #5456"):
            w.send_offsets([], object(), timeout_s=0.1)
        assert w.producer is made[1] and ("p1", "init_transactions") in calls
        assert ("p0", "close") not in calls and ("p0", "commit_transaction") not in calls
        assert events == ["producer_replaced"]
        one_batch(w)  # the new producer carries on
        assert calls[-1] == ("p1", "commit_transaction")
    finally:
        release.set()


def test_send_offsets_errors_still_classified_on_the_callers_thread():
    w, calls, _ = writer([{"send_offsets_to_transaction": [kerr(KafkaError._STATE, abortable=True)]}])
    w.begin()
    with pytest.raises(t.Aborted):
        w.send_offsets([], object())
    assert calls[-1] == ("p0", "abort_transaction")


def test_a_producer_fenced_between_batches_is_fenced_not_aborted():
    """Fenced while idle, librdkafka's produce() says only `_FATAL`; the transactional API names the cause. Found by
    the running-job fencing test: read as an abortable error, the fenced job was restarted and fenced back."""
    w, calls, made = writer(
        [
            {
                "produce": [kerr(KafkaError._FATAL)],
                "abort_transaction": [kerr(KafkaError._FENCED, fatal=True)],
            }
        ]
    )
    w.begin()
    with pytest.raises(t.Fenced):
        w.produce("sink", b"k", b"v")
    with pytest.raises(t.Fenced):  # dead for good: never aborted again, never re-initialised
        w.begin()
    assert [m for _, m in calls].count("init_transactions") == 1 and len(made) == 1


def test_a_fatal_produce_without_a_known_cause_is_fatal():
    w, _, _ = writer([{"produce": [kerr(KafkaError._FATAL)], "abort_transaction": [kerr(KafkaError._FATAL)]}])
    w.begin()
    with pytest.raises(t.FatalProducerError):
        w.produce("sink", b"k", b"v")


def test_the_transaction_block_commits_on_return_and_aborts_on_anything_else():
    w, calls, _ = writer([{}])
    with w.transaction():
        w.produce("sink", b"k", b"v")
    assert [m for _, m in calls][1:] == ["begin_transaction", "produce", "commit_transaction"]

    w, calls, _ = writer([{}])
    with pytest.raises(ZeroDivisionError):
        with w.transaction():
            w.produce("sink", b"k", b"v")
            raise ZeroDivisionError("a crash point, a bad record: the body raises")
    assert [m for _, m in calls][1:] == ["begin_transaction", "produce", "abort_transaction"]


def test_the_transaction_block_lets_a_settled_txn_error_pass_without_a_second_abort():
    # an abortable produce error: the writer aborted already; the block must not abort again
    w, calls, _ = writer([{"produce": [kerr(KafkaError._STATE, abortable=True)]}])
    with pytest.raises(t.Aborted):
        with w.transaction():
            w.produce("sink", b"k", b"v")
    assert [m for _, m in calls].count("abort_transaction") == 1
    # a commit that times out: the producer is replaced, nothing is aborted by the block
    w, calls, made = writer([{"commit_transaction": [kerr(KafkaError._TIMED_OUT, retriable=True)] * 50}, {}])
    with pytest.raises(t.OutcomeUnknown):
        with w.transaction():
            w.produce("sink", b"k", b"v")
    assert len(made) == 2 and "abort_transaction" not in [m for _, m in calls]


def test_each_writer_error_carries_the_outcome_it_was_raised_for():
    for outcome in t.Outcome:
        cls = t._CLASSES[outcome]
        # a retriable error that outlived its tries is raised as an abort inside a transaction
        assert cls.outcome == (t.Outcome.ABORTABLE if outcome == t.Outcome.RETRIABLE else outcome)
        assert issubclass(cls, t.TxnError)


def test_a_full_queue_is_waited_on_within_the_transaction_timeout_then_the_transaction_is_aborted():
    clock = Clock()
    w, calls, _ = writer([{"produce": [BufferError(), BufferError(), None]}], clock=clock)
    w.begin()
    w.produce("sink", b"k", b"v")  # two full-queue tries, then queued
    assert [m for _, m in calls].count("produce") == 3
    w.commit()

    stuck = [BufferError()] * 1000
    w, calls, _ = writer([{"produce": stuck}], timeout_ms=10_000, clock=clock)

    def advancing_poll(timeout, p=w.producer):
        clock.now += 1.0
        calls.append((p.name, "poll"))

    w.producer.poll = advancing_poll
    with pytest.raises(t.BufferStuck, match="could not queue a record to sink for 10 s"):
        with w.transaction():
            w.produce("sink", b"k", b"v")
    assert calls[-1] == ("p0", "abort_transaction") and [m for _, m in calls].count("produce") == 11
