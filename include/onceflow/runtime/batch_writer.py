"""foreachBatch: each micro-batch of the streaming query, exactly once, and the job's status file.

`BatchWriter` is what Spark calls with each micro-batch: the batch's plan from the checkpoint, the protocol's
decision (onceflow.protocol), the batch's output computed and stored by Spark and then streamed into one transaction
(or, for a batch committed before, only run to advance Spark's state), the status file, and the pause before the
next batch (close-out pacing). Spark is reached through one seam, `BatchOutput` (`SparkOutput` in the job), so the
unit tests drive the writer with the protocol's fakes (onceflow.testing) and rows of their own.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from onceflow import config
from onceflow.protocol.batch_sink import BatchSink, OutRecord
from onceflow.rules import checkpoint, clock
from onceflow.rules.ledger import BatchPlan, Decision
from onceflow.runtime.driver_state import (
    IDLE_COLLECT_MIN_WAIT_S,
    StopRequested,
    collect_while_idle,
    initial_status,
    output_rows_bound,
    pace_after,
    status_after_batch,
)
from onceflow.spark import batch_stats, partition_stream

log = logging.getLogger("onceflow.job")
STOP_COMMIT_WAIT_S = 30.0  # a stop waits this long for Spark's commits/N of the last written batch


class Status:
    """The job's status file: merged from batch commits and Spark's progress reports."""

    def __init__(self, settings: config.Settings):
        self.s = settings
        self.lock = threading.Lock()
        self.record = initial_status(settings, os.getpid(), clock.now_ms(), socket.gethostname())
        self.flush()

    def update(self, **fields: Any) -> None:
        with self.lock:
            self.record = self.record.updated(**fields)
            self.flush()

    def flush(self) -> None:
        self.record.write(self.s.status_file)


class BatchOutput(Protocol):
    def stored(self, df: Any, collect: bool = False) -> Any:
        """A context manager: the batch's output computed and stored, as the rows to write (read again on a second
        attempt); released after. `collect`: the output is known to be small (driver_state.output_rows_bound): held
        whole by the driver instead."""
        ...

    def advance(self, df: Any) -> None:
        """Run a batch committed before only for Spark's state: its output is not needed."""
        ...


class SparkOutput:
    """The batch's output as Spark computes it: read, parse, shuffle and the DLQ branch first, then either stored in
    the executors and streamed to the driver a partition at a time, or, for an output known to be small, brought to
    the driver whole by the same Spark job; as Arrow batches both ways (onceflow.spark.partition_stream)."""

    @contextmanager
    def stored(self, df: Any, collect: bool = False) -> Iterator[Iterable[OutRecord]]:
        # not OutRecord._make: it takes the row as it is and fills no defaults (an output of fewer columns)
        if collect:
            yield partition_stream.collected(df, lambda r: OutRecord(*r))
            return
        with partition_stream.materialised(df) as stored:
            yield partition_stream.Stored(stored, lambda r: OutRecord(*r))

    def advance(self, df: Any) -> None:
        df.write.format("noop").mode("overwrite").save()


class DriverHeap(Protocol):
    """The driver JVM's old generation (onceflow.spark.driver_heap.DriverHeap in the job)."""

    def old_used(self) -> tuple[int, int]:
        """Its used and committed bytes."""
        ...

    def collect(self) -> None:
        """A full collection now."""
        ...


class BatchWriter:
    """foreachBatch: one micro-batch, exactly once. A stop holds `lock` while it waits for Spark's commits/N of
    the last batch; a batch arriving then neither waits on it (Spark's stop cannot interrupt a Python callback)
    nor starts a transaction."""

    def __init__(
        self,
        settings: config.Settings,
        sink: BatchSink,
        fs: checkpoint.CheckpointFS,
        epoch: checkpoint.Epoch,
        status: Status,
        output: BatchOutput | None = None,
        heap: DriverHeap | None = None,
    ):
        """`output`: how a batch's output is computed and stored, and how a committed one only advances Spark's state
        (SparkOutput; unit tests hand in rows of their own); `heap`: the driver JVM's, collected while the job waits
        for its next batch (None: left to the JVM)."""
        self.s, self.sink, self.fs, self.epoch, self.status = settings, sink, fs, epoch, status
        self.output = output or SparkOutput()
        self.heap = heap
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.batches: dict = {}  # Spark batch id -> its ledger batch and decision (progress listener)
        self.failure: list[BaseException] = []
        self.last_written: int | None = None  # the last Spark batch whose transaction this driver finished
        self.query: Any = None  # the running query, for its batch statistics
        self.started_at = time.monotonic()  # set again when the query starts
        self.first_logged = False
        self.chased_ms: int | None = None  # the closing event the pacing last planned a batch early for
        self.planned_ms: int | None = None  # when Spark planned the last batch: the input rate is measured from it
        self.spans: dict[int, int] = {}  # Spark batch id -> the source offsets its range spans (output_rows_bound)

    def __call__(self, df, batch_id: int) -> None:
        while not self.lock.acquire(timeout=0.1):
            if self.stop.is_set():
                raise StopRequested(f"stop requested before batch {batch_id}")
        delay_s = 0.0
        try:
            if self.stop.is_set():
                raise StopRequested(f"stop requested before batch {batch_id}")
            delay_s = self._one(df, batch_id)
        finally:
            self.lock.release()
        delay_s -= self._collect_while_idle(batch_id, delay_s)
        self.stop.wait(max(0.0, delay_s))  # the trigger cadence; a stop ends the wait at once

    def _collect_while_idle(self, batch_id: int, wait_s: float) -> float:
        """The driver JVM's full collection in this wait, when it is due (driver_state.collect_while_idle) rather
        than in the next batches; the seconds it took. A heap that cannot be read or collected is left to the JVM."""
        # the wait's length checked before reading the heap too: a close-out batch's wait of 0 makes no py4j call
        if self.heap is None or wait_s < IDLE_COLLECT_MIN_WAIT_S or self.stop.is_set():
            return 0.0
        t0 = time.monotonic()
        try:
            used, committed = self.heap.old_used()
            if not collect_while_idle(used, committed, wait_s, self.s.gc_while_idle_at):
                return time.monotonic() - t0
            self.heap.collect()
            spent = time.monotonic() - t0
            after, _ = self.heap.old_used()
        except Exception as e:  # py4j gone with the JVM, or a JVM without the bean: the JVM collects alone
            log.warning("the driver's heap is left to the JVM from now on: %s", e)
            self.heap = None
            return time.monotonic() - t0
        log.debug(
            "batch %s: collected the driver's heap while idle, old generation %d -> %d of %d MB in %d ms",
            batch_id,
            used >> 20,
            after >> 20,
            committed >> 20,
            round(spent * 1000),
        )
        self.status.update(idle_collections=self.status.record.idle_collections + 1)
        return spent

    def _one(self, df, batch_id: int) -> float:
        # health judges a long batch (a backlog, a catch-up after a restore) by when it began, not as a stall
        self.status.update(running_batch=batch_id, batch_started_ms=clock.now_ms())
        try:
            t0 = time.monotonic()
            plan = checkpoint.batch_plan(self.fs, batch_id, self.s.source_topic_list, self.epoch)
            decision = self.sink.decide(plan)
            self.batches[batch_id] = {"ledger_batch": plan.batch, "epoch": plan.epoch, "decision": decision.value}
            t1 = time.monotonic()
            collect = False
            if decision is Decision.WRITE:
                # The batch's output is computed and stored by Spark first (read, parse, shuffle, the DLQ branch),
                # then streamed into the transaction a partition at a time: only producing runs inside it (a
                # timed-out batch is replayed with the same range, so compute inside it would time out again on
                # every replay), and the driver never holds the batch's whole output, however many windows close
                # in it (partition_stream, not toLocalIterator, which keeps every served partition in the driver
                # JVM), moved as Arrow batches (4 to 9 times the rows/s of pickled Rows, docs/performance.md).
                # An output known to be small is computed and brought to the driver whole in one Spark job
                # instead, before the transaction too (`collect`, partition_stream.collected).
                # Either can be read again: a second attempt after an unknown outcome writes it in this
                # process (partition_stream.Stored, Collected), not after a restart.
                collect = self._small_output(batch_id, plan)
                with self.output.stored(df, collect) as rows:
                    t2 = time.monotonic()
                    outcome = self.sink.write_batch(plan, rows, decision)
            else:  # committed already: run the batch only to advance Spark's state store
                self.output.advance(df)
                t2 = time.monotonic()
                outcome = self.sink.write_batch(plan, [], decision)
            self.last_written = batch_id
            # compute_ms: the batch computed and stored; txn_ms: producing it and committing
            timings = {
                "decide_ms": round((t1 - t0) * 1000),
                "compute_ms": round((t2 - t1) * 1000),
                "txn_ms": round((time.monotonic() - t2) * 1000),
            }
            if not self.first_logged:  # how a (re)start spends its time until the first commit
                self.first_logged = True
                log.info(
                    "first batch %s since the query's start: %d ms to the batch, %s",
                    plan.batch,
                    round((t0 - self.started_at) * 1000),
                    timings,
                )
            log.debug("batch %s timings %s%s", plan.batch, timings, " (collected)" if collect else "")
        except BaseException as e:
            self.failure.append(e)
            raise
        now = clock.now_ms()
        self.status.update(
            **status_after_batch(
                self.status.record,
                plan,
                batch_id,
                outcome.decision,
                outcome.outputs,
                outcome.dlq,
                outcome.txn_ms,
                timings,
                now,
            )
        )
        # replays and catch-up are followed at once, so only a written batch needs its event-time statistics
        max_event = (
            batch_stats.max_event_ms(self.query)
            if self.query is not None and self.s.close_out_batches and outcome.decision is Decision.WRITE
            else None
        )
        pace = pace_after(self.s, plan, outcome.decision, max_event, now, self.chased_ms, self._input_rate(plan))
        if pace.chasing_ms is not None:
            self.chased_ms = pace.chasing_ms
            log.debug(
                "batch %s: the closing event %s is on its way; the next batch in %.2f s",
                plan.batch,
                pace.chasing_ms,
                pace.delay_s,
            )
        if pace.closes_windows:
            self.status.update(close_out_batches=self.status.record.close_out_batches + 1)
        return pace.delay_s

    def _input_rate(self, plan: BatchPlan) -> float | None:
        """Records a second that arrived between Spark's planning of the last batch and of this one (each batch reads
        to the end of the source as planned), None for a driver's first batch."""
        since, self.planned_ms = self.planned_ms, plan.batch_ts_ms
        if since is None or plan.batch_ts_ms <= since:
            return None
        return plan.records * 1000 / (plan.batch_ts_ms - since)

    def _small_output(self, batch_id: int, plan: BatchPlan) -> bool:
        """Is the batch's output known to be at most `collect_max_rows` rows before it runs (output_rows_bound)?"""
        progress = self.status.record.progress or {}
        reported = (progress["batch"], progress.get("state_rows") or 0) if "batch" in progress else None
        if reported is not None:  # the batches before the report are counted in its state rows
            self.spans = {b: n for b, n in self.spans.items() if b > reported[0]}
        self.spans[batch_id] = plan.records
        bound = output_rows_bound(batch_id, self.spans, reported, len(self.s.outputs))
        return bound is not None and bound <= self.s.collect_max_rows

    def stop_at_boundary(self, query) -> None:
        """Never stop in the middle of a transaction, nor between a Kafka commit and Spark's commits/N: then the
        checkpoint and the sink stop at the same batch, and a stop-with-savepoint is the job's final state."""
        with self.lock:
            deadline = time.monotonic() + STOP_COMMIT_WAIT_S
            last = self.last_written
            while last is not None and self.fs.read_text(f"commits/{last}") is None and time.monotonic() < deadline:
                time.sleep(0.05)
            try:
                query.stop()
            except Exception as e:  # the query ended on StopRequested already
                log.info("stopping the query: %s", e)
