"""The streaming driver's decisions, pure: what a batch's outcome does to the job's status, when the next batch
starts, what Spark's progress report says, and which exit code an error ends the job with (what the supervisor
then does: onceflow.wire.NO_RESTART). onceflow.runtime.driver does the I/O around them; tests drive these without
Spark or a broker."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from onceflow import wire
from onceflow.config import ConfigError, Settings
from onceflow.database.schema import SchemaError
from onceflow.kafka import transactional as tw
from onceflow.rules import pacing, sources
from onceflow.rules.ledger import BatchPlan, Decision, DivergentHistory
from onceflow.runtime import preflight
from onceflow.runtime.run_files import JobStatus
from onceflow.wire import OnceflowError


class StopRequested(OnceflowError):
    """Raised in foreachBatch when a stop was requested before the batch began: the batch is not written and
    Spark does not commit it (it is replayed by the next run)."""


class InstanceLocked(wire.OnceflowError):
    """Another driver of the app runs on this machine: not a misconfiguration, and nothing a restart fixes."""


def initial_status(settings: Settings, pid: int, now_ms: int, host: str = "") -> JobStatus:
    return JobStatus(
        app=settings.app_id,
        host=host,
        pid=pid,
        state=wire.JobState.STARTING,
        started_ms=now_ms,
        checkpoint=settings.checkpoint,
        bootstrap_servers=settings.bootstrap_servers,
        transactional_id=settings.transactional_id,
        group_id=settings.group_id,
    )


def status_after_batch(
    status: JobStatus,
    plan: BatchPlan,
    spark_batch: int,
    decision: Decision,
    outputs: int,
    dlq: int,
    txn_ms: float,
    timings: dict[str, Any],
    now_ms: int,
) -> dict[str, Any]:
    """The status fields a finished batch changes: a written batch counts as committed (with its figures and
    watermark); a replay or catch-up counts as skipped."""
    out: dict[str, Any] = {
        "state": wire.JobState.RUNNING,
        "last_batch": plan.batch,
        "spark_batch": spark_batch,
        "last_commit_ms": now_ms,
        "running_batch": None,
    }
    if decision is Decision.WRITE:
        return out | {
            "last_txn_ms": round(txn_ms, 1),
            "last_outputs": outputs,
            "last_dlq": dlq,
            "watermark_ms": plan.watermark_ms,
            "end_offsets": sources.keyed_to_json(plan.end, int),
            "last_timings": timings,
            "committed_batches": status.committed_batches + 1,
        }
    return out | {"replays_skipped": status.replays_skipped + 1}


@dataclass(frozen=True)
class Pace:
    delay_s: float  # how long to wait before Spark plans the next batch
    closes_windows: bool  # the batch moved the watermark past a window end: the next one emits it
    chasing_ms: int | None = None  # the closing event the next batch is planned early for (pacing.chase_at_ms)


def pace_after(
    settings: Settings,
    plan: BatchPlan,
    decision: Decision,
    max_event_ms: int | None,
    now_ms: int,
    chased_ms: int | None = None,
    records_per_s: float | None = None,
) -> Pace:
    """When the next batch starts (onceflow.rules.pacing): replays and catch-up at once; a written batch that
    closes windows at once (the close-out batch emits them); a batch whose window's closing event is on its way
    once more soon after, unless that closing event (`chased_ms`, the last Pace's `chasing_ms`) was chased already;
    otherwise at the next multiple of the trigger, plus its margin, or a lead batch before it when the input until
    then is large (`records_per_s`: the rate the batch saw)."""
    if not settings.close_out_batches or decision is not Decision.WRITE:
        return Pace(0.0, False)
    timing = pacing.BatchTiming(plan.batch_ts_ms, plan.watermark_ms, max_event_ms)
    trigger_ms, wm_ms, w_ms = (
        int(settings.trigger_interval_s * 1000),
        settings.watermark_s * 1000,
        settings.window_s * 1000,
    )
    margin_ms = settings.trigger_margin_ms
    closing = pacing.closing_event_ms(timing, wm_ms, w_ms)
    chase = closing != chased_ms and pacing.chase_at_ms(timing, trigger_ms, wm_ms, w_ms, margin_ms) is not None
    return Pace(
        pacing.delay_before_next_s(
            timing,
            now_ms,
            trigger_ms,
            wm_ms,
            w_ms,
            margin_ms=margin_ms,
            chase=chase,
            lead=pacing.Lead(settings.lead_batch_ms, settings.lead_batch_min_records, records_per_s),
        ),
        pacing.closes_windows(timing, wm_ms, w_ms),
        closing if chase else None,
    )


def output_rows_bound(batch: int, spans: dict[int, int], reported: tuple[int, int] | None, outputs: int) -> int | None:
    """At most how many rows Spark batch `batch`'s output has, from what is known before it runs, or None when that is
    not known. `spans`: the source offsets each Spark batch's range spans (at least the records it read; read_committed
    skips transaction markers), by Spark batch id; `reported`: (batch id, state rows) of Spark's last progress report,
    which comes after its batch, asynchronously; `outputs`: the app's named outputs.

    A stateful operator in append mode emits rows of its state only (a record already behind the watermark is dropped
    as late, not emitted), and the state grows by at most one row per record read, so the results are at most the
    reported state plus every record read since; a stateless transform emits at most one result per output for each
    record it reads; and a record read is at most one DLQ record. A batch between the report and this one whose span
    is not known (read before this driver started) leaves the bound unknown."""
    if reported is None:
        return None
    since, state_rows = reported
    read_since = range(since + 1, batch + 1)
    if any(b not in spans for b in read_since):
        return None
    return state_rows + sum(spans[b] for b in read_since) + (outputs + 1) * spans[batch]


# A full collection of the driver's heap takes 0.1-0.4 s on this size of heap: only a wait this long holds one whole
IDLE_COLLECT_MIN_WAIT_S = 1.0


def collect_while_idle(old_used: int, old_committed: int, wait_s: float, at: float) -> bool:
    """Should the job ask its driver JVM for a full collection now, `wait_s` before its next batch
    (onceflow.spark.driver_heap)? When the wait holds one and the old generation holds at least `at`
    (Settings.gc_while_idle_at) of its committed size: the JVM would soon take it itself, inside a batch."""
    return at > 0 and wait_s >= IDLE_COLLECT_MIN_WAIT_S and old_committed > 0 and old_used >= at * old_committed


def progress_fields(p: dict[str, Any], batch_info: dict[str, Any]) -> dict[str, Any]:
    """Spark's progress report of a batch (its JSON, onceflow.spark.progress), with the ledger batch and the decision
    the batch had: Spark's ids repeat after a restore, reconciliation charges late rows by ledger batch, and a
    catch-up batch's rows belong to no ledger batch. Spark leaves a rate out of the JSON when it is not a number."""
    ops = p.get("stateOperators") or []
    sources = p.get("sources") or []
    return {
        "batch": p["batchId"],
        "input_rows": p.get("numInputRows", 0),
        "input_rows_per_s": round(p.get("inputRowsPerSecond") or 0, 1),
        "processed_rows_per_s": round(p.get("processedRowsPerSecond") or 0, 1),
        "duration_ms": dict(p.get("durationMs") or {}),
        "watermark": (p.get("eventTime") or {}).get("watermark"),
        "rows_dropped_by_watermark": sum(op.get("numRowsDroppedByWatermark", 0) for op in ops),
        "state_rows": sum(op.get("numRowsTotal", 0) for op in ops),
        "state_rows_updated": sum(op.get("numRowsUpdated", 0) for op in ops),
        **batch_info,
        "source_end_offsets": _offsets_text(sources[0].get("endOffset")) if sources else None,
        "source_latest_offsets": _offsets_text(sources[0].get("latestOffset")) if sources else None,
    }


def _offsets_text(offsets: Any) -> str | None:
    """A source's offsets as Spark prints them (its JSON, compact)."""
    if offsets is None or isinstance(offsets, str):
        return offsets
    return json.dumps(offsets, separators=(",", ":"))


def failure_exit_code(err: BaseException | None) -> int:
    """The exit code of a query that failed: fencing and divergent history end the job for good; anything else is a
    crash the supervisor restarts (the batch is replayed), unless the error names its own exit code."""
    if isinstance(err, wire.OnceflowError) and err.exit_code is not None:
        return err.exit_code
    if isinstance(err, wire.Fenced):
        return wire.EXIT_FENCED
    if isinstance(err, DivergentHistory):
        return wire.EXIT_DIVERGENT
    return wire.EXIT_FAILED


def startup_exit_code(err: BaseException) -> int:
    """The exit code of an error before the query runs: another instance here, a misconfiguration (the message
    says what to change), a broker that is not there yet (transient: the supervisor tries again), or fenced."""
    if isinstance(err, InstanceLocked):
        return wire.EXIT_LOCKED
    if isinstance(err, preflight.BrokerUnreachable):
        return wire.EXIT_FAILED
    if isinstance(err, (preflight.PreflightError, ConfigError, tw.TxnConfigError, SchemaError)):
        return wire.EXIT_CONFIG
    if isinstance(err, wire.Fenced):
        return wire.EXIT_FENCED
    return wire.EXIT_FAILED
