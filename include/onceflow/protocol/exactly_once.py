"""The exactly-once protocol (docs/design.md, section 3): one Kafka transaction per Spark micro-batch. The sequence
around it (decide, write at most once, settle an unknown outcome) is onceflow.protocol.batch_sink's, shared with the
PostgreSQL sink (onceflow.protocol.database_sink).

Spark writes `offsets/N` (the planned range) before batch N runs and `commits/N` after foreachBatch returns.
Between the two, `ExactlyOnceSink.write_batch` does, in ONE transaction of a producer whose transactional.id
is stable per app:

    1. the batch's results          -> sink topic   (headers onceflow.app, onceflow.batch), or the topic of the
                                                       named output a result names (App.outputs)
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
(onceflow.rules.checkpoint.Epoch).

Fencing: `init_transactions()` at start aborts whatever the previous incarnation left open and bumps the
producer epoch, so a zombie instance of the same app can no longer commit (it gets fenced and stops).
A hanging transaction: before a new producer's first decision the sink checks that none of its own is still open
on its partitions (a broker that skipped an aborted transaction's markers), and stops rather than commit over one
(onceflow.protocol.hanging).
Timeouts: each transaction is timed; at `near_timeout_fraction` of transaction.timeout.ms a warning event is
emitted while it is still open; if the coordinator aborted it (timeout), the commit fails, a
`transaction_timeout` event is emitted and the query fails, so Spark replays the batch after the restart:
no loss, unlike a Flink pre-committed transaction that times out.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import TopicPartition

from onceflow import wire
from onceflow.app import MAIN_OUTPUT
from onceflow.config import Settings
from onceflow.faults import Injector
from onceflow.kafka import clients as kafka_clients
from onceflow.kafka import events as ev
from onceflow.kafka import transactional as tw
from onceflow.kafka.surfaces import Producer
from onceflow.protocol import hanging
from onceflow.protocol.batch_sink import BatchOutcome, BatchSink, OutRecord, UndeliverableRecord, UnknownOutput
from onceflow.protocol.sink_reads import KafkaSinkReads, SinkReads
from onceflow.rules import clock
from onceflow.rules.ledger import BatchPlan, Committed, Decision, LedgerEntry, offset_metadata
from onceflow.rules.sources import SourcePartition

log = logging.getLogger(__name__)
H_APP, H_BATCH = wire.H_APP, wire.H_BATCH  # headers of every record the job writes


class ExactlyOnceSink(BatchSink):
    unknown_outcome = (tw.OutcomeUnknown,)

    def __init__(
        self,
        settings: Settings,
        bus: ev.EventBus,
        faults: Injector | None = None,
        init_timeout_s: float = 60.0,
        *,
        producer_factory: Callable[[], Producer] | None = None,
        reads: SinkReads | None = None,
    ):
        """Connects to the broker unless given its seams: `producer_factory` makes the transactional producer (again
        after an unknown outcome), `reads` answers what is committed (onceflow.testing has both, scripted)."""
        self.s = settings
        self.bus = bus
        self.faults = faults
        self.timeout_ms = settings.transaction_timeout_ms
        self.rules_version = settings.declared_app().rules_version  # carried by each ledger record
        self.topics = settings.outputs  # output name -> topic (onceflow.app.MAIN_OUTPUT: the sink topic)
        self._batch: int | None = None  # the batch whose transaction is open, for events
        self._warned = False  # the near-timeout warning of the open transaction went out
        self._settle_first = True  # check for a hanging transaction before the next write (a new producer, a failure)

        def make_producer() -> Any:
            return kafka_clients.transactional_producer(
                settings,
                settings.transactional_id,
                **{
                    "partitioner": "murmur2_random",
                    "linger.ms": settings.producer_linger_ms,
                    "batch.num.messages": settings.producer_batch_messages,
                },
            )

        # init_transactions fences the previous incarnation and aborts its open transaction, if any. The writer's
        # errors (onceflow.kafka.transactional: fenced, a configuration the broker refuses) are raised as they are.
        self.writer = tw.TransactionalWriter(
            producer_factory or make_producer,
            settings.transactional_id,
            self.timeout_ms,
            init_timeout_s=init_timeout_s,
            commit_timeout_s=settings.commit_timeout_s,
            on_event=self._writer_event,
            on_call=self._on_producer_call,
        )
        self.reads: SinkReads = reads if reads is not None else KafkaSinkReads(settings)

    # ------------------------------------------------------------------ what is committed
    def committed(self, partitions: Iterable[SourcePartition]) -> Committed:
        return self.reads.committed(partitions)

    def ledger_entry(self, batch: int) -> LedgerEntry | None:
        return self.reads.entry(batch)

    # ------------------------------------------------------------------ the protocol
    def decide(self, plan: BatchPlan) -> Decision:
        """WRITE, SKIP (a replay of a committed batch) or CATCH_UP (re-reading committed batches after a
        restore); anything that fits none of them raises DivergentHistory."""
        self._settle(plan.batch)  # before the ledger is read: a hanging record of the job's would hold it back
        committed = self.committed(plan.end)
        entry = self.ledger_entry(plan.batch) if committed.batch == plan.batch else None
        newest = None
        if committed.batch is None and not committed.offsets:
            # No committed offsets at all: a fresh app, or the group's offsets were deleted or expired. The
            # ledger is the truth; the group is a cache of it.
            newest = self.reads.newest()
            if newest is not None:
                self.bus.emit(
                    wire.GROUP_OFFSETS_LOST,
                    logging.WARNING,
                    flush=True,
                    batch=plan.batch,
                    group=self.s.group_id,
                    ledger_batch=newest.batch,
                    action="decided from the ledger; the next commit restores the group's offsets",
                )
        return self._decided(plan, committed, entry, newest)

    def _outcome_text(self, error: BaseException) -> str:
        phase = getattr(error, "phase", None)
        return "the commit" if phase == "commit" else f"the transaction ({phase} hung)"

    def _recover(self, error: BaseException) -> dict[str, Any]:
        # the writer has replaced its producer already: the new one waited for the pending outcome
        return {
            "transactional_id": self.s.transactional_id,
            "action": "the producer was replaced; the batch is decided again from what is committed",
        }

    def _write(self, plan: BatchPlan, rows: Iterable[OutRecord]) -> BatchOutcome:
        self._settle(plan.batch)
        self._fault("crash_before_produce", plan.batch)
        self._batch, self._warned = plan.batch, False
        started = time.monotonic()
        warn = threading.Timer(
            self.timeout_ms * self.s.near_timeout_fraction / 1000.0, self._near_timeout, args=(plan.batch, started)
        )
        warn.daemon = True
        done = False
        try:
            with self.writer.transaction():  # commits when the body returns; aborts when it raises
                warn.start()
                outputs = dlq = 0
                per_topic = dict.fromkeys(self.topics.values(), 0)
                headers = [(wire.H_APP, self.s.app_id.encode()), (wire.H_BATCH, str(plan.batch).encode())]
                for r in rows:
                    if r.kind == wire.KIND_RESULT:
                        topic = self._topic(r.output)
                        self.writer.produce(topic, r.key.encode(), r.value, headers)
                        per_topic[topic] += 1
                        outputs += 1
                    else:
                        if (
                            self.faults is not None
                            and r.value is not None
                            and self.faults.undeliverable(r.src_partition, r.src_offset)
                        ):
                            raise UndeliverableRecord(
                                f"the broker refuses the DLQ copy of {r.src_topic}[{r.src_partition}] "
                                f"offset {r.src_offset} (injected fault): the batch cannot commit; "
                                f"quarantine the record (onceflow quarantine add)"
                            )
                        self.writer.produce(self.s.dlq_topic, r.key.encode(), r.value, headers + dlq_headers(r))
                        dlq += 1
                self._fault("crash_after_produce", plan.batch)
                txn_ms = (time.monotonic() - started) * 1000
                entry = LedgerEntry.for_plan(
                    self.s.app_id,
                    plan,
                    outputs,
                    dlq,
                    txn_ms,
                    clock.now_ms(),
                    self.s.transactional_id,
                    self.rules_version,
                    self.s.max_event_ahead_ms,
                    per_topic if len(per_topic) > 1 else None,
                )
                self.writer.produce(self.s.ledger_topic, self.s.app_id.encode(), entry.to_json(), headers)
                offsets = [
                    TopicPartition(sp.topic, sp.partition, off, offset_metadata(plan.batch, plan.epoch))
                    for sp, off in sorted(plan.end.items())
                ]
                self.writer.send_offsets(offsets, self.reads.group_metadata(), self.s.send_offsets_timeout_s)
                self._fault("stall_in_txn", plan.batch)
        except tw.Fenced as e:
            self.bus.emit(
                wire.FENCED,
                logging.ERROR,
                flush=True,
                transactional_id=self.s.transactional_id,
                error=str(e),
                action="another instance of this app took over; this one stops",
            )
            raise
        except tw.CoordinatorTimedOut as e:
            elapsed_ms = (time.monotonic() - started) * 1000
            advice = timeout_advice(elapsed_ms)
            self._timed_out(plan, elapsed_ms, self.timeout_ms, str(e), advice, transactional_id=self.s.transactional_id)
            raise
        else:
            done = True
        finally:
            warn.cancel()
            self._settle_first = self._settle_first or not done  # a failed transaction: its markers must land first
        txn_ms = (time.monotonic() - started) * 1000
        self._committed(plan, outputs, dlq, txn_ms)
        if txn_ms >= self.timeout_ms * self.s.near_timeout_fraction and not self._warned:
            self.bus.emit(
                wire.TRANSACTION_NEAR_TIMEOUT,
                logging.WARNING,
                batch=plan.batch,
                txn_ms=round(txn_ms),
                timeout_ms=self.timeout_ms,
                committed=True,
                transactional_id=self.s.transactional_id,
                fraction=self.s.near_timeout_fraction,
            )
        self._fault("crash_after_commit", plan.batch)
        self._fault("raise_after_commit", plan.batch)
        return BatchOutcome(plan.batch, Decision.WRITE, outputs, dlq, txn_ms)

    # ------------------------------------------------------------------ helpers
    def _topic(self, output: str | None) -> str:
        """The topic of a result's output; a name the app does not declare fails the batch (its transaction aborts,
        nothing of it is visible) and says what to change."""
        try:
            return self.topics[output or MAIN_OUTPUT]
        except KeyError:
            raise UnknownOutput(
                f"app {self.s.app}: a result names output {output!r}, which the app does not declare; its outputs: "
                f"{sorted(self.topics)}. Declare it in App.outputs or fix the transform's `output` column"
            ) from None

    def _writer_event(self, type_: str, fields: dict[str, Any]) -> None:
        if type_ == wire.PRODUCER_REPLACED:
            self._settle_first = True
        self.bus.emit(type_, logging.WARNING, flush=True, **fields)

    def _settle(self, batch: int) -> None:
        if self._settle_first:
            self._settled(batch)
            self._settle_first = False

    def _settled(self, batch: int) -> None:
        """Before a new producer's (or a failed transaction's successor's) first decision: no transaction of this job
        open on its sink's and its DLQ's partitions, which only it writes, nor on its ledger, which backfills,
        restores and quarantines share (there one counts when its first record is the job's own). Waits out markers
        on their way, within `ledger_wait_s`; then stops rather than commit over a transaction the broker will never
        settle (onceflow.protocol.hanging). No false alarm for an outage: a producer's init_transactions returns only
        once every earlier transaction of its id is complete, its markers written with acks=all or skipped."""
        ledger = (self.s.ledger_topic, 0)
        sinks = [(t, p) for t in self.topics.values() for p in range(self.s.sink_partitions)]
        parts = sinks + [(self.s.dlq_topic, 0), ledger]
        owners: dict[int, bool] = {}  # the ledger's last stable offset -> whether the job opened it
        deadline = time.monotonic() + self.s.ledger_wait_s
        while True:
            found = self.reads.unsettled(parts)
            if ledger in found:
                lso = found[ledger][0]
                if lso not in owners:
                    owners[lso] = hanging.opened_by_job(self.reads.opened_by(*ledger, lso), self.s.app_id)
                if not owners[lso]:
                    del found[ledger]
            if not found or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        if not found:
            return
        commands = hanging.abort_commands(self.s.bootstrap_servers, found, secured=self.s.secured)
        self.bus.emit(
            wire.TRANSACTION_HANGING,
            logging.ERROR,
            flush=True,
            batch=batch,
            partitions={f"{t}[{q}]": {"stable": s, "high": h} for (t, q), (s, h) in sorted(found.items())},
            action=f"abort {'it' if len(found) == 1 else 'each'} ({'; '.join(commands)}), then start the job",
        )
        raise hanging.refusal(found, commands, self.s.ledger_wait_s, batch)

    def _near_timeout(self, batch: int, started: float) -> None:
        self._warned = True
        age = (time.monotonic() - started) * 1000
        self.bus.emit(
            wire.TRANSACTION_NEAR_TIMEOUT,
            logging.WARNING,
            batch=batch,
            txn_ms=round(age),
            timeout_ms=self.timeout_ms,
            committed=False,
            transactional_id=self.s.transactional_id,
            fraction=self.s.near_timeout_fraction,
            action="the transaction is still open; it will be aborted at the timeout and replayed",
        )

    def _on_producer_call(self, phase: str) -> None:
        if phase == "send_offsets" and self._batch is not None:
            self._fault("hang_send_offsets", self._batch)

    def close(self) -> None:
        self.reads.close()
        self.writer.close()


def timeout_advice(elapsed_ms: float | None = None) -> str:
    """What to do about a transaction the coordinator aborted. The batch is replayed with the range Spark planned
    for it, so only a longer timeout gets it through: a smaller ONCEFLOW_MAX_OFFSETS_PER_TRIGGER sizes batches not
    yet planned, never this one."""
    above = f" above the {elapsed_ms:.0f} ms this one took" if elapsed_ms is not None else ""
    return (
        f"the batch is replayed with the same range after the restart and times out again until the timeout covers "
        f"it: raise ONCEFLOW_TRANSACTION_TIMEOUT_MS{above} (at most the broker's transaction.max.timeout.ms) and "
        f"restart the job"
    )


def dlq_headers(r: OutRecord) -> list[tuple[str, bytes]]:
    """Provenance of a DLQ record (Kafka Connect style); a copy that holds less than the original value (capped,
    or quarantined) says so, with the original's size and sha256."""
    out = [
        (wire.H_SOURCE_TOPIC, (r.src_topic or "").encode()),
        (wire.H_SOURCE_PARTITION, str(r.src_partition).encode()),
        (wire.H_SOURCE_OFFSET, str(r.src_offset).encode()),
        (wire.H_SOURCE_TIMESTAMP, str(r.src_timestamp_ms).encode()),
        (wire.H_REASON, (r.reason or "").encode()),
        (wire.H_ORIGINAL_SIZE, str(r.src_size if r.src_size is not None else -1).encode()),
    ]
    if r.src_sha256 is not None:
        out += [(wire.H_ORIGINAL_SHA256, r.src_sha256.encode()), (wire.H_TRUNCATED, b"true")]
    return out
