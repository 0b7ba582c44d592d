"""What every sink of the exactly-once protocol does around its one transaction per batch (docs/design.md, section 3):
decide first, write at most once, and settle a transaction whose outcome is unknown by deciding again from what is
committed. The Kafka sink (onceflow.protocol.exactly_once) and the PostgreSQL sink (onceflow.protocol.database_sink)
supply the transaction, the reads and the recovery; the sequence is this one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from onceflow import wire
from onceflow.faults import Injector
from onceflow.kafka import events as ev
from onceflow.rules import sources
from onceflow.rules.ledger import BatchPlan, Committed, Decision, LedgerEntry, decide
from onceflow.wire import OnceflowError


class OutRecord(NamedTuple):
    """One row of a batch's output, as foreachBatch collects it from the query. A named tuple, made for every row a
    batch writes: a frozen dataclass's constructor cost 4 times as much (docs/performance.md, "The driver's loop")."""

    kind: str  # wire.KIND_RESULT or wire.KIND_DLQ
    key: str
    value: bytes | None
    src_partition: int | None = None
    src_offset: int | None = None
    src_timestamp_ms: int | None = None
    reason: str | None = None
    src_size: int | None = None  # the original value's size (DLQ)
    src_sha256: str | None = None  # set when the DLQ copy holds less than the original value
    output: str | None = None  # a result's named output (App.outputs); None: the sink topic
    src_topic: str | None = None  # a DLQ record's source topic (an app may read several)


@dataclass(frozen=True)
class BatchOutcome:
    batch: int
    decision: Decision
    outputs: int = 0
    dlq: int = 0
    txn_ms: float = 0.0


class BatchNotCommitted(OnceflowError):
    """The batch's commit had an unknown outcome and turned out not to have landed, and its streamed output cannot
    be read again: fail the query, and the replay after the restart writes it."""


class UndeliverableRecord(OnceflowError):
    """A record the sink refuses every time (fault `undeliverable`, standing in for a permanent delivery error): its
    batch can never commit until the operator quarantines the source record (onceflow.operations.quarantine)."""


class UnknownOutput(OnceflowError):
    """A result names an output its app does not declare (App.outputs): the app's bug, which no replay mends, so the
    job stops (a misconfiguration) rather than be restarted into it."""

    exit_code = wire.EXIT_CONFIG


class BatchSink:
    """The protocol's sequence; a sink implements decide, ledger_entry, _write and _recover."""

    bus: ev.EventBus
    faults: Injector | None
    # the errors of a transaction whose outcome is unknown (the sink's own); `_recover` readies the sink after one
    unknown_outcome: ClassVar[tuple[type[BaseException], ...]] = ()

    def decide(self, plan: BatchPlan) -> Decision:
        """WRITE, SKIP (a replay of a committed batch) or CATCH_UP (re-reading committed batches after a restore);
        anything that fits none of them raises DivergentHistory."""
        raise NotImplementedError

    def ledger_entry(self, batch: int) -> LedgerEntry | None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def _decided(
        self, plan: BatchPlan, committed: Committed, entry: LedgerEntry | None, newest: LedgerEntry | None = None
    ) -> Decision:
        """The replay decision (onceflow.rules.ledger.decide) from what the sink read; divergent history is reported
        before it stops the job."""
        try:
            return decide(plan, committed, entry, newest)
        except Exception as e:
            self.bus.emit(
                wire.DIVERGENT_HISTORY,
                logging.ERROR,
                flush=True,
                batch=plan.batch,
                spark_batch=plan.spark_batch,
                error=str(e),
            )
            raise

    def _write(self, plan: BatchPlan, rows: Iterable[OutRecord]) -> BatchOutcome:
        """Batch `plan` in one transaction, committed; raises one of `unknown_outcome` when the outcome is unknown."""
        raise NotImplementedError

    def _recover(self, error: BaseException) -> dict[str, Any]:
        """Ready the sink to read what is committed after `error` (a new producer, a new connection); the fields of
        the event that reports it."""
        raise NotImplementedError

    def _outcome_text(self, error: BaseException) -> str:
        """What had the unknown outcome, for the message of a batch that did not land."""
        return f"its transaction ({error})"

    def _after_commit(self, plan: BatchPlan) -> None:
        """What follows a commit found landed (the PostgreSQL sink caches its offsets in the group)."""

    def write_batch(self, plan: BatchPlan, rows: Iterable[OutRecord], decision: Decision | None = None) -> BatchOutcome:
        """Write batch `plan` with `rows` in one transaction, unless `decision` (decided now when not given) says it
        is committed already. `rows` is streamed into the transaction as it is iterated (the driver never holds the
        batch's output). A transaction whose outcome is unknown is settled by the sink (`_recover`), and the batch
        is decided again from what is committed: found committed, or written once more from `rows` iterated again
        (the driver's are read again from Spark's stored output, onceflow.spark.partition_stream.Stored); a one-shot
        iterator cannot be, so the query fails and Spark replays the batch after the restart."""
        decision = decision or self.decide(plan)
        for attempt in (1, 2):
            if decision is not Decision.WRITE:
                self.bus.emit(
                    wire.BATCH_REPLAY_SKIPPED,
                    batch=plan.batch,
                    spark_batch=plan.spark_batch,
                    ranges=sources.keyed_to_json(plan.ranges, list),
                    catch_up_from=plan.catch_up_from,
                    decision=decision.value,
                )
                return BatchOutcome(plan.batch, decision)
            try:
                return self._write(plan, rows)
            except self.unknown_outcome as e:
                if attempt == 2:
                    raise
                fields = self._recover(e)
                self.bus.emit(
                    wire.TRANSACTION_OUTCOME_UNKNOWN,
                    logging.WARNING,
                    flush=True,
                    batch=plan.batch,
                    error=str(e),
                    **fields,
                )
                decision = self.decide(plan)
                if decision is Decision.SKIP:  # the commit had landed: the batch was written, by this attempt
                    return self._landed(plan)
                if decision is Decision.WRITE and isinstance(rows, Iterator):
                    # The batch is not committed, and its rows were a one-shot iterator: the query fails; Spark
                    # replays the batch after the restart, and it is written then.
                    raise BatchNotCommitted(
                        f"{self._outcome_text(e)} of batch {plan.batch} had an unknown outcome and did not land: the "
                        f"job restarts and Spark replays the batch"
                    ) from e
        raise AssertionError("unreachable")

    def _committed(self, plan: BatchPlan, outputs: int, dlq: int, txn_ms: float, **extra: Any) -> None:
        self.bus.emit(
            wire.BATCH_COMMITTED,
            batch=plan.batch,
            spark_batch=plan.spark_batch,
            outputs=outputs,
            dlq=dlq,
            txn_ms=round(txn_ms, 1),
            records=plan.records,
            watermark_ms=plan.watermark_ms,
            end_offsets=sources.keyed_to_json(plan.end, int),
            **extra,
        )

    def _landed(self, plan: BatchPlan) -> BatchOutcome:
        """A commit whose outcome was unknown and that is found committed: the batch was written once, by this
        attempt, and is reported as every committed batch is (so the checks that follow commits, such as Spark's late
        count against the DLQ's, see it), with the counts the ledger recorded."""
        entry = self.ledger_entry(plan.batch)
        outputs, dlq, txn_ms = (entry.outputs, entry.dlq, entry.txn_ms) if entry is not None else (0, 0, 0.0)
        self._after_commit(plan)
        self._committed(plan, outputs, dlq, txn_ms, settled_after_unknown_outcome=True)
        return BatchOutcome(plan.batch, Decision.WRITE, outputs, dlq, txn_ms)

    def _timed_out(
        self, plan: BatchPlan, elapsed_ms: float, timeout_ms: int, error: str, action: str, **extra: Any
    ) -> None:
        """Report a transaction its transaction timeout ended (Kafka's coordinator, or the database's idle timeout),
        `elapsed_ms` after it began: the figure its advice names, measured once (two readings of the clock named
        12,131 ms in the advice and 12,132 in the event)."""
        self.bus.emit(
            wire.TRANSACTION_TIMEOUT,
            logging.ERROR,
            flush=True,
            batch=plan.batch,
            elapsed_ms=round(elapsed_ms),
            timeout_ms=timeout_ms,
            error=error,
            action=action,
            **extra,
        )

    def _fault(self, point: str, batch: int) -> None:
        if self.faults is not None:
            self.faults.hit(point, batch)
