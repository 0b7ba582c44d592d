"""The onceflow streaming job: IP request counts per 5 s window, Kafka to Kafka, exactly once.

Launched by `onceflow job run|start` through spark-submit (see onceflow.launcher). Settings come from the
environment (onceflow.config). Exit codes tell the supervisor what to do:
0 stopped on request, 2 misconfiguration, 3 fenced by a newer instance, 4 divergent history, 5 another instance
of the app holds its lock on this machine (no restart for these); anything else is a crash, restarted with a
fixed delay.
"""
from __future__ import annotations

import fcntl
import logging
import os
import signal
import sys
import threading
import time

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQueryListener

from onceflow import config
from onceflow.kafka import events as ev
from onceflow.rules import pacing
from onceflow.runtime import preflight
from onceflow.spark import batch_stats, ip_count_plan as ip_count
from onceflow.rules import checkpoint
from onceflow.storage.checkpoint import HadoopFS
from onceflow.protocol.exactly_once import ExactlyOnceSink, OutRecord, TransactionConfigError, ZombieFenced
from onceflow.faults import Injector
from onceflow.rules.ledger import Decision, DivergentHistory
from onceflow import wire

log = logging.getLogger("onceflow.job")


class StopRequested(RuntimeError):
    """Raised in foreachBatch when a stop was requested before the batch began: the batch is not written and
    Spark does not commit it (it is replayed by the next run)."""


class InstanceLocked(RuntimeError):
    """Another driver of the app runs on this machine: not a misconfiguration, and nothing a restart fixes."""


class InstanceLock:
    """At most one driver per app on this machine; the kernel releases the lock when the process dies."""

    held: list["InstanceLock"] = []  # referenced for the life of the process

    @classmethod
    def acquire(cls, settings: config.Settings) -> "InstanceLock":
        lock = cls(settings)
        cls.held.append(lock)
        return lock

    def __init__(self, settings: config.Settings):
        settings.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = settings.run_dir / f"{settings.app_id}.lock"
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 64, 0).decode(errors="replace").strip()
            raise InstanceLocked(
                f"another instance of app {settings.app_id} is running (pid {holder or '?'}, lock "
                f"{self.path}); stop it first with `onceflow job stop`") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(os.getpid()).encode(), 0)


class Status:
    """The job's status file: merged from batch commits and Spark's progress reports."""

    def __init__(self, settings: config.Settings):
        self.s = settings
        self.lock = threading.Lock()
        self.data = {"app": settings.app_id, "pid": os.getpid(), "state": "starting",
                     "started_ms": int(time.time() * 1000), "checkpoint": settings.checkpoint,
                     "bootstrap_servers": settings.bootstrap_servers, "transactional_id": settings.transactional_id,
                     "group_id": settings.group_id, "committed_batches": 0, "replays_skipped": 0}
        self.flush()

    def update(self, **fields) -> None:
        with self.lock:
            self.data.update(fields)
            self.flush()

    def flush(self) -> None:
        ev.write_status(self.s.status_file, self.data)


class ProgressListener(StreamingQueryListener):
    """Spark's progress of each batch, as an event and in the status file, with the ledger batch and the decision
    the batch had (Spark's ids repeat after a restore; reconciliation charges late rows by ledger batch, and a
    catch-up batch's rows belong to no ledger batch)."""

    def __init__(self, bus: ev.EventBus, status: Status, batches: dict):
        self.bus, self.status, self.batches = bus, status, batches

    def onQueryStarted(self, event):
        pass

    def onQueryProgress(self, event):
        p = event.progress
        dropped = sum(op.numRowsDroppedByWatermark for op in p.stateOperators)
        fields = {"batch": p.batchId, "input_rows": p.numInputRows,
                  "input_rows_per_s": round(p.inputRowsPerSecond or 0, 1),
                  "processed_rows_per_s": round(p.processedRowsPerSecond or 0, 1),
                  "duration_ms": dict(p.durationMs), "watermark": p.eventTime.get("watermark"),
                  "rows_dropped_by_watermark": dropped,
                  "state_rows": sum(op.numRowsTotal for op in p.stateOperators),
                  "state_rows_updated": sum(op.numRowsUpdated for op in p.stateOperators),
                  **self.batches.pop(p.batchId, {}),
                  "source_end_offsets": p.sources[0].endOffset if p.sources else None,
                  "source_latest_offsets": p.sources[0].latestOffset if p.sources else None}
        self.status.update(progress=fields, last_progress_ms=int(time.time() * 1000))
        if p.numInputRows or dropped:
            self.bus.emit(wire.PROGRESS, logging.DEBUG, **fields)

    def onQueryIdle(self, event):
        now = int(time.time() * 1000)
        self.status.update(last_progress_ms=now, last_idle_ms=now)

    def onQueryTerminated(self, event):
        pass


def build_session(settings: config.Settings) -> SparkSession:
    return (SparkSession.builder.appName(f"onceflow-{settings.app_id}")
            .config("spark.sql.session.timeZone", "UTC").getOrCreate())


def run(settings: config.Settings) -> int:
    bus = ev.EventBus(settings)
    try:
        info = preflight.check_job(settings)
        InstanceLock.acquire(settings)
    except InstanceLocked as e:
        log.error("%s", e)
        bus.emit(wire.JOB_FAILED, logging.ERROR, flush=True, stage="lock", error=str(e))
        print(f"onceflow: {e}", file=sys.stderr)
        return wire.EXIT_LOCKED
    except preflight.BrokerUnreachable as e:  # transient (a broker restart): the supervisor tries again
        log.error("preflight: %s", e)
        bus.emit(wire.JOB_FAILED, logging.ERROR, stage="preflight", error=str(e))
        return wire.EXIT_FAILED
    except (preflight.PreflightError, config.ConfigError) as e:
        log.error("preflight failed: %s", e)
        bus.emit(wire.JOB_FAILED, logging.ERROR, flush=True, stage="preflight", error=str(e))
        print(f"onceflow: {e}", file=sys.stderr)
        return wire.EXIT_CONFIG
    status = Status(settings)
    injector = Injector(settings.fault, settings.run_dir / "faults" / settings.app_id,
                        on_fire=lambda f: bus.emit(wire.FAULT_INJECTED, logging.WARNING, flush=True, fault=f.name))
    try:
        sink = ExactlyOnceSink(settings, bus, injector)
    except TransactionConfigError as e:
        print(f"onceflow: {e}", file=sys.stderr)
        return wire.EXIT_CONFIG
    except ZombieFenced as e:
        print(f"onceflow: {e}", file=sys.stderr)
        return wire.EXIT_FENCED
    spark = build_session(settings)
    fs = HadoopFS(spark, settings.checkpoint)
    epoch = checkpoint.read_epoch(fs)  # how Spark's batch ids map to the ledger's since the last restore
    quarantine = checkpoint.read_quarantine(fs)  # source offsets an operator quarantined (records go to the DLQ)
    batches: dict = {}  # Spark batch id -> its ledger batch and decision, for the progress listener
    batch_lock = threading.Lock()
    failure: list[BaseException] = []
    written: dict = {}  # the last Spark batch whose transaction this driver finished
    stop = threading.Event()
    running: dict = {}  # the query, for its batch statistics (onceflow.batch_stats)
    trigger_ms = int(settings.trigger_interval_s * 1000)

    def write(df, batch_id: int) -> None:
        # A stop holds the lock while it waits for Spark's commits/N of the last batch; a batch arriving then
        # must not wait on it (Spark's stop cannot interrupt a Python callback), nor start a transaction.
        while not batch_lock.acquire(timeout=0.1):
            if stop.is_set():
                raise StopRequested(f"stop requested before batch {batch_id}")
        delay_s = 0.0
        try:
            if stop.is_set():
                raise StopRequested(f"stop requested before batch {batch_id}")
            # health judges a long batch (a backlog, a catch-up after a restore) by when it began, not as a stall
            status.update(running_batch=batch_id, batch_started_ms=int(time.time() * 1000))
            try:
                t0 = time.monotonic()
                plan = checkpoint.batch_plan(fs, batch_id, settings.source_topic, epoch)
                decision = sink.decide(plan)
                batches[batch_id] = {"ledger_batch": plan.batch, "epoch": plan.epoch, "decision": decision.value}
                t1 = time.monotonic()
                if decision is Decision.WRITE:
                    rows = [OutRecord(*r) for r in df.collect()]
                else:  # committed already: run the batch only to advance Spark's state store
                    df.write.format("noop").mode("overwrite").save()
                    rows = []
                t2 = time.monotonic()
                outcome = sink.write_batch(plan, rows, decision)
                written["spark_batch"] = batch_id
                # where a batch's time goes, for tuning (status file and the DEBUG log)
                timings = {"decide_ms": round((t1 - t0) * 1000), "compute_ms": round((t2 - t1) * 1000),
                           "txn_ms": round((time.monotonic() - t2) * 1000)}
                log.debug("batch %s timings %s", plan.batch, timings)
            except BaseException as e:
                failure.append(e)
                raise
            now = int(time.time() * 1000)
            if outcome.decision is Decision.WRITE:
                status.update(state="running", last_batch=plan.batch, spark_batch=batch_id, last_commit_ms=now,
                              running_batch=None,
                              last_txn_ms=round(outcome.txn_ms, 1), last_outputs=outcome.outputs,
                              last_dlq=outcome.dlq, watermark_ms=plan.watermark_ms, end_offsets=plan.end,
                              last_timings=timings, committed_batches=status.data["committed_batches"] + 1)
            else:
                status.update(state="running", last_batch=plan.batch, spark_batch=batch_id, last_commit_ms=now,
                              running_batch=None, replays_skipped=status.data["replays_skipped"] + 1)
            # replays and catch-up are followed at once (pacing), so only a written batch needs its statistics
            if settings.close_out_batches and outcome.decision is Decision.WRITE:
                timing = pacing.BatchTiming(plan.batch_ts_ms, plan.watermark_ms,
                                            batch_stats.max_event_ms(running["query"]) if "query" in running
                                            else None)
                delay_s = pacing.delay_before_next_s(timing, now, trigger_ms, settings.watermark_s * 1000,
                                                     settings.window_s * 1000)
                if pacing.closes_windows(timing, settings.watermark_s * 1000, settings.window_s * 1000):
                    status.update(close_out_batches=status.data.get("close_out_batches", 0) + 1)
        finally:
            batch_lock.release()
        stop.wait(delay_s)  # the trigger cadence; a stop ends the wait at once

    listener = ProgressListener(bus, status, batches)
    spark.streams.addListener(listener)
    frame = ip_count.results_and_dlq(ip_count.source(spark, settings), settings, quarantine)
    query = (frame.writeStream.foreachBatch(write)
             .outputMode("append")
             .option("checkpointLocation", settings.checkpoint)
             .option("asyncProgressTrackingEnabled", "false")
             # close-out batches: the job paces batches itself (onceflow.pacing), Spark runs them back to back
             .trigger(processingTime="0 seconds" if settings.close_out_batches
                      else f"{settings.trigger_interval_s} seconds")
             .queryName(f"onceflow_{settings.app_id}")
             .start())
    running["query"] = query
    bus.emit(wire.JOB_STARTED, checkpoint=settings.checkpoint, transactional_id=settings.transactional_id,
             spark_version=spark.version, query_id=query.id, run_id=query.runId, epoch=epoch.epoch,
             quarantined=[vars(r) for r in quarantine],
             ledger_shift=epoch.ledger_shift, job_config_hash=settings.job_config_hash(), **info)
    status.update(state="running", query_id=query.id, run_id=query.runId, spark_version=spark.version,
                  epoch=epoch.epoch, job_config_hash=settings.job_config_hash())

    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while query.isActive and not stop.is_set():
        try:
            query.awaitTermination(1)
        except Exception:
            break
    # (a StopRequested ends the query but is never a failure: it is raised before a batch starts any work)
    if stop.is_set() and not failure:
        with batch_lock:  # never stop in the middle of a transaction ...
            # ... nor between a Kafka commit and Spark's commits/N: then the checkpoint and the sink stop at the
            # same batch, and a stop-with-savepoint is the job's final state.
            last = written.get("spark_batch")
            deadline = time.monotonic() + 30
            while last is not None and fs.read_text(f"commits/{last}") is None and time.monotonic() < deadline:
                time.sleep(0.05)
            try:
                query.stop()
            except Exception as e:  # the query ended on StopRequested already
                log.info("stopping the query: %s", e)
        status.update(state="stopped", stopped_ms=int(time.time() * 1000))
        bus.emit(wire.JOB_STOPPED, flush=True, last_batch=status.data.get("last_batch"))
        sink.close()
        return wire.EXIT_OK
    err = failure[-1] if failure else query.exception()
    code = (wire.EXIT_FENCED if isinstance(err, ZombieFenced) else
            wire.EXIT_DIVERGENT if isinstance(err, DivergentHistory) else wire.EXIT_FAILED)
    log.error("the query failed: %s", str(err)[:2000])
    status.update(state="failed", error=str(err)[:2000], exit_code=code)
    bus.emit(wire.JOB_FAILED, logging.ERROR, flush=True, error=str(err)[:2000], exit_code=code)
    return code


def main() -> None:
    logging.basicConfig(level=os.environ.get("ONCEFLOW_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        settings = config.load()
    except config.ConfigError as e:
        print(f"onceflow: {e}", file=sys.stderr)
        sys.exit(wire.EXIT_CONFIG)
    code = run(settings)
    sys.stdout.flush()
    sys.stderr.flush()
    # Exit without waiting for the JVM gateway's non-daemon threads.
    os._exit(code)


if __name__ == "__main__":
    main()
