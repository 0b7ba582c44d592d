"""The exactly-once protocol (DESIGN.md section 3): one Kafka transaction per Spark micro-batch.

Spark writes `offsets/N` (the planned range) before batch N runs and `commits/N` after foreachBatch returns.
Between the two, `ExactlyOnceSink.write_batch` does, in ONE transaction of a producer whose transactional.id
is stable per app:

    1. the batch's results          -> sink topic   (headers onceflow.app, onceflow.batch)
    2. the batch's malformed input  -> DLQ topic    (original bytes + provenance headers)
    3. one ledger record            -> ledger topic (app, batch, ranges, watermark, counts, durations)
    4. send_offsets_to_transaction  -> the batch's end offsets for group onceflow.<app>, metadata {"batch": N}

and commits. Before opening the transaction it asks the group what is committed (`ledger.decide`):
- batch N-1 committed and its end == batch N's start      -> write batch N;
- batch N already committed with exactly this range        -> it is a replay (crash after the Kafka commit,
                                                              before Spark's commits/N): write nothing;
- the catch-up batch after a savepoint restore, and the    -> rebuild state only: write nothing (its results
  sink stands exactly at its end                              were committed before the restore);
- anything else                                            -> DivergentHistory: fail loudly.
Batch ids here are the ledger's: equal to Spark's until a restore behind the sink shifts them
(onceflow.checkpoint.Epoch).

Fencing: `init_transactions()` at start aborts whatever the previous incarnation left open and bumps the
producer epoch, so a zombie instance of the same app can no longer commit (it gets fenced and stops).
Timeouts: each transaction is timed; at `near_timeout_fraction` of transaction.timeout.ms a warning event is
emitted while it is still open; if the coordinator aborted it (timeout), the commit fails, a
`transaction_timeout` event is emitted and the query fails, so Spark replays the batch after the restart:
no loss, unlike a Flink pre-committed transaction that times out.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Iterable, Sequence

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from . import events as ev
from . import kafka_clients
from .config import Settings
from .faults import Injector
from .ledger import BatchPlan, Committed, Decision, LedgerEntry, decide, offset_metadata, parse_record

log = logging.getLogger(__name__)
KIND_RESULT = "result"
KIND_DLQ = "dlq"


class ZombieFenced(RuntimeError):
    """Another instance with the same transactional.id took over: this one must stop, not restart."""


class TransactionTimedOut(RuntimeError):
    """The coordinator aborted our transaction after transaction.timeout.ms: restart and replay the batch."""


@dataclass(frozen=True)
class OutRecord:
    """One row of a batch's output, as foreachBatch collects it from the query."""
    kind: str                       # KIND_RESULT or KIND_DLQ
    key: str
    value: bytes | None
    src_partition: int | None = None
    src_offset: int | None = None
    src_timestamp_ms: int | None = None
    reason: str | None = None


@dataclass(frozen=True)
class BatchOutcome:
    batch: int
    decision: Decision
    outputs: int = 0
    dlq: int = 0
    txn_ms: float = 0.0


class ExactlyOnceSink:
    def __init__(self, settings: Settings, bus: ev.EventBus, faults: Injector | None = None,
                 init_timeout_s: float = 60.0):
        self.s = settings
        self.bus = bus
        self.faults = faults
        self.timeout_ms = settings.transaction_timeout_ms
        self._batch: int | None = None  # the batch whose transaction is open, for events
        self._warned = False            # the near-timeout warning of the open transaction went out
        self.producer = kafka_clients.transactional_producer(
            settings, settings.transactional_id, **{"partitioner": "murmur2_random",
                                                     "linger.ms": settings.producer_linger_ms,
                                                     "batch.num.messages": settings.producer_batch_messages})
        # Fences the previous incarnation and aborts its open transaction, if any.
        try:
            self._call(lambda: self.producer.init_transactions(init_timeout_s), started=None)
        except BaseException:
            close_quietly(self.producer)
            raise
        # The group whose committed offsets are the job's position. It never subscribes: it only supplies
        # group metadata for send_offsets_to_transaction and reads the committed offsets back.
        self.group = kafka_clients.read_committed_consumer(settings, group_id=settings.group_id)
        self.ledger_reader = kafka_clients.read_committed_consumer(settings, group_id=f"{settings.group_id}.ledger")

    # ------------------------------------------------------------------ what is committed
    def committed(self, partitions: Iterable[int]) -> Committed:
        tps = [TopicPartition(self.s.source_topic, p) for p in sorted(partitions)]
        got = kafka_clients.committed(self.group, tps) if tps else []
        return Committed.from_partitions((tp.partition, tp.offset if tp.offset >= 0 else None,
                                          tp.metadata) for tp in got)

    def ledger_entry(self, batch: int) -> LedgerEntry | None:
        return find_ledger_entry(self.ledger_reader, self.s, batch)

    # ------------------------------------------------------------------ the protocol
    def decide(self, plan: BatchPlan) -> Decision:
        """WRITE, SKIP (a replay of a committed batch) or CATCH_UP (re-reading committed batches after a
        restore); anything that fits none of them raises DivergentHistory."""
        committed = self.committed(plan.end)
        entry = self.ledger_entry(plan.batch) if committed.batch == plan.batch else None
        try:
            return decide(plan, committed, entry)
        except Exception as e:
            self.bus.emit(ev.DIVERGENT_HISTORY, logging.ERROR, flush=True, batch=plan.batch,
                          spark_batch=plan.spark_batch, error=str(e))
            raise

    def write_batch(self, plan: BatchPlan, rows: Sequence[OutRecord], decision: Decision | None = None
                    ) -> BatchOutcome:
        """Write batch `plan` with `rows` in one transaction, unless `decision` (decided now when not given)
        says it is committed already."""
        decision = decision or self.decide(plan)
        if decision is not Decision.WRITE:
            self.bus.emit(ev.BATCH_REPLAY_SKIPPED, batch=plan.batch, spark_batch=plan.spark_batch,
                          ranges=plan.ranges, catch_up_from=plan.catch_up_from, decision=decision.value)
            return BatchOutcome(plan.batch, decision)

        self._fault("crash_before_produce", plan.batch)
        self._batch, self._warned = plan.batch, False
        started = time.monotonic()
        warn = threading.Timer(self.timeout_ms * self.s.near_timeout_fraction / 1000.0, self._near_timeout,
                               args=(plan.batch, started))
        warn.daemon = True
        self._call(self.producer.begin_transaction, started)
        warn.start()
        try:
            outputs = dlq = 0
            headers = [("onceflow.app", self.s.app_id.encode()), ("onceflow.batch", str(plan.batch).encode())]
            for r in rows:
                if r.kind == KIND_RESULT:
                    self._produce(self.s.sink_topic, r.key.encode(), r.value, headers, started)
                    outputs += 1
                else:
                    self._produce(self.s.dlq_topic, r.key.encode(), r.value, headers + [
                        ("onceflow.source.topic", plan.topic.encode()),
                        ("onceflow.source.partition", str(r.src_partition).encode()),
                        ("onceflow.source.offset", str(r.src_offset).encode()),
                        ("onceflow.source.timestamp", str(r.src_timestamp_ms).encode()),
                        ("onceflow.reason", (r.reason or "").encode())], started)
                    dlq += 1
            self._fault("crash_after_produce", plan.batch)
            txn_ms = (time.monotonic() - started) * 1000
            entry = LedgerEntry.for_plan(self.s.app_id, plan, outputs, dlq, txn_ms, int(time.time() * 1000),
                                         self.s.transactional_id)
            self._produce(self.s.ledger_topic, self.s.app_id.encode(), entry.to_json(), headers, started)
            offsets = [TopicPartition(plan.topic, p, off, offset_metadata(plan.batch, plan.epoch))
                       for p, off in sorted(plan.end.items())]
            self._call(lambda: self.producer.send_offsets_to_transaction(
                offsets, self.group.consumer_group_metadata(), 60), started)
            self._fault("stall_in_txn", plan.batch)
            self._call(lambda: self.producer.commit_transaction(120), started)
        except BaseException:
            warn.cancel()
            self._abort_quietly()
            raise
        warn.cancel()
        txn_ms = (time.monotonic() - started) * 1000
        self.bus.emit(ev.BATCH_COMMITTED, batch=plan.batch, spark_batch=plan.spark_batch, outputs=outputs, dlq=dlq, txn_ms=round(txn_ms, 1),
                      records=plan.records, watermark_ms=plan.watermark_ms, end_offsets=plan.end)
        if txn_ms >= self.timeout_ms * self.s.near_timeout_fraction and not self._warned:
            self.bus.emit(ev.TRANSACTION_NEAR_TIMEOUT, logging.WARNING, batch=plan.batch, txn_ms=round(txn_ms),
                          timeout_ms=self.timeout_ms, committed=True, transactional_id=self.s.transactional_id,
                          fraction=self.s.near_timeout_fraction)
        self._fault("crash_after_commit", plan.batch)
        return BatchOutcome(plan.batch, Decision.WRITE, outputs, dlq, txn_ms)

    # ------------------------------------------------------------------ helpers
    def _produce(self, topic: str, key: bytes, value: bytes | None, headers, started: float) -> None:
        while True:
            try:
                self.producer.produce(topic, key=key, value=value, headers=headers)
                return
            except BufferError:
                self.producer.poll(0.05)
            except KafkaException as e:
                self._raise_classified(e, started)

    def _call(self, fn, started: float | None):
        try:
            return fn()
        except KafkaException as e:
            self._raise_classified(e, started)

    def _raise_classified(self, e: KafkaException, started: float | None):
        err: KafkaError = e.args[0]
        code = err.code()
        fenced_codes = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH,
                        KafkaError.INVALID_TXN_STATE, KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
        elapsed_ms = (time.monotonic() - started) * 1000 if started is not None else 0.0
        if code in fenced_codes or err.fatal() or code == KafkaError.INVALID_TRANSACTION_TIMEOUT:
            if code == KafkaError.INVALID_TRANSACTION_TIMEOUT:
                raise TransactionConfigError(
                    f"the broker refused transaction.timeout.ms={self.timeout_ms}: it is above the broker's "
                    f"transaction.max.timeout.ms; lower ONCEFLOW_TRANSACTION_TIMEOUT_MS") from e
            if started is not None and elapsed_ms >= self.timeout_ms * 0.95:
                self.bus.emit(ev.TRANSACTION_TIMEOUT, logging.ERROR, flush=True, batch=self._batch,
                              elapsed_ms=round(elapsed_ms),
                              timeout_ms=self.timeout_ms, transactional_id=self.s.transactional_id,
                              error=str(err),
                              action="the batch is replayed after the restart; if this repeats, raise "
                                     "ONCEFLOW_TRANSACTION_TIMEOUT_MS or make batches smaller "
                                     "(ONCEFLOW_MAX_OFFSETS_PER_TRIGGER)")
                raise TransactionTimedOut(f"transaction aborted by the coordinator after {elapsed_ms:.0f} ms "
                                          f"(timeout {self.timeout_ms} ms): {err}") from e
            self.bus.emit(ev.FENCED, logging.ERROR, flush=True, transactional_id=self.s.transactional_id,
                          error=str(err), action="another instance of this app took over; this one stops")
            raise ZombieFenced(f"fenced by a newer instance of {self.s.transactional_id}: {err}") from e
        raise e

    def _near_timeout(self, batch: int, started: float) -> None:
        self._warned = True
        age = (time.monotonic() - started) * 1000
        self.bus.emit(ev.TRANSACTION_NEAR_TIMEOUT, logging.WARNING, batch=batch, txn_ms=round(age),
                      timeout_ms=self.timeout_ms, committed=False, transactional_id=self.s.transactional_id,
                      fraction=self.s.near_timeout_fraction, action="the transaction is still open; it will be aborted at the timeout and replayed")

    def _abort_quietly(self) -> None:
        try:
            self.producer.abort_transaction(30)
        except Exception as e:  # fenced or fatal: the coordinator aborts it for us
            log.info("abort_transaction: %s", e)

    def _fault(self, point: str, batch: int) -> None:
        if self.faults is not None:
            self.faults.hit(point, batch)

    def close(self) -> None:
        for c in (self.group, self.ledger_reader):
            try:
                c.close()
            except Exception:
                pass
        close_quietly(self.producer)


class TransactionConfigError(RuntimeError):
    pass


def close_quietly(producer) -> None:
    """Flush and close; a fenced or otherwise fatal producer has nothing left to deliver."""
    try:
        producer.flush(10)
        producer.close()
    except KafkaException as e:
        log.info("closing the transactional producer: %s", e)


def find_ledger_entry(consumer, settings: Settings, batch: int, scan_back: int = 1000) -> LedgerEntry | None:
    """The committed ledger record of stream batch `batch` of this app (scanning the ledger newest first)."""
    tp = TopicPartition(settings.ledger_topic, 0)
    low, high = consumer.get_watermark_offsets(tp, timeout=10, cached=False)
    end = high
    while end > low:
        start = max(low, end - scan_back)
        found = None
        for msg in read_range(consumer, settings.ledger_topic, 0, start, end):
            if msg.key() == settings.app_id.encode():
                e = parse_record(msg.value())
                if isinstance(e, LedgerEntry) and e.batch == batch and e.kind == "stream":
                    found = e
        if found is not None:
            return found
        end = start
    return None


def read_range(consumer, topic: str, partition: int, start: int, end: int, timeout_s: float = 30.0):
    """Yield the committed records of [start, end) of one partition (fewer when aborted data sits inside)."""
    if end <= start:
        return
    consumer.assign([TopicPartition(topic, partition, start)])
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                # read_committed skips aborted records and markers: done once the position passes `end - 1`.
                pos = consumer.position([TopicPartition(topic, partition)])[0].offset
                if pos >= end:
                    return
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    return
                raise KafkaException(msg.error())
            if msg.offset() >= end:
                return
            yield msg
            if msg.offset() >= end - 1:
                return
        raise TimeoutError(f"reading {topic}[{partition}] [{start}, {end}) did not finish in {timeout_s}s")
    finally:
        consumer.unassign()
