"""The streaming driver: the Spark query, and the loop that writes each micro-batch exactly once.

`onceflow/entrypoints/stream.py` (what spark-submit runs) calls `main()`. The driver checks everything before it starts
(preflight, the app's lock on this machine, the transactional producer, which fences the previous instance),
builds the query (the declared app's, onceflow.spark.app_plan), and hands each batch to the protocol
(onceflow.protocol.exactly_once) inside `foreachBatch`: decide, collect the batch's output, write it in one
transaction, record the batch in the status file, then wait for the next batch's turn (close-out pacing). A stop
(SIGTERM) lands on a batch boundary: never inside a transaction, nor between a Kafka commit and Spark's
`commits/N`. The decisions (status, pacing, exit codes) are pure, in onceflow.runtime.driver_state; the exit code
tells the supervisor what to do (onceflow.wire.NO_RESTART).
"""

from __future__ import annotations

import faulthandler
import fcntl
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from pyspark.sql import SparkSession

from onceflow import config, logs, wire
from onceflow.faults import Injector
from onceflow.kafka import events as ev
from onceflow.kafka import reading as kafka_reading
from onceflow.protocol.sinks import open_sink
from onceflow.rules import checkpoint, clock, sources
from onceflow.runtime import preflight, standby
from onceflow.runtime.batch_writer import BatchWriter, Status
from onceflow.runtime.driver_state import (
    InstanceLocked,
    failure_exit_code,
    progress_fields,
    startup_exit_code,
)
from onceflow.spark import app_plan, driver_heap, partition_stream
from onceflow.spark.progress import JsonProgressListener
from onceflow.storage.checkpoint import HadoopFS

log = logging.getLogger("onceflow.job")


class InstanceLock:
    """At most one driver per app on this machine; the kernel releases the lock when the process dies."""

    held: list[InstanceLock] = []  # referenced for the life of the process

    @classmethod
    def acquire(cls, settings: config.Settings, wait_s: float = 0.0) -> InstanceLock:
        lock = cls(settings, wait_s)
        cls.held.append(lock)
        return lock

    def __init__(self, settings: config.Settings, wait_s: float = 0.0):
        settings.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = settings.run_dir / f"{settings.app_id}.lock"
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
            holder = os.pread(self.fd, 64, 0).decode(errors="replace").strip()
            raise InstanceLocked(
                f"another instance of app {settings.app_id} is running (pid {holder or '?'}, lock "
                f"{self.path}); stop it first with `onceflow job stop`"
            ) from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(os.getpid()).encode(), 0)


class ProgressListener(JsonProgressListener):
    """Spark's progress of each batch, as an event and in the status file (onceflow.runtime.driver_state)."""

    def __init__(self, bus: ev.EventBus, status: Status, batches: dict):
        self.bus, self.status, self.batches = bus, status, batches

    def on_progress(self, progress: dict) -> None:
        fields = progress_fields(progress, self.batches.pop(progress["batchId"], {}))
        self.status.update(progress=fields, last_progress_ms=clock.now_ms())
        if fields["input_rows"] or fields["rows_dropped_by_watermark"]:
            self.bus.emit(wire.PROGRESS, logging.DEBUG, **fields)

    def on_idle(self) -> None:
        now = clock.now_ms()
        self.status.update(last_progress_ms=now, last_idle_ms=now)


def build_session(settings: config.Settings) -> SparkSession:
    return (
        SparkSession.builder.appName(f"onceflow-{settings.app_id}")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )


def _refused(bus: ev.EventBus, stage: str, e: BaseException) -> int:
    code = startup_exit_code(e)
    log.error("%s: %s", stage, e)
    bus.emit(wire.JOB_FAILED, logging.ERROR, flush=code != wire.EXIT_FAILED, stage=stage, error=str(e))
    if code != wire.EXIT_FAILED:
        print(f"onceflow: {e}", file=sys.stderr)
    return code


def warm_up(
    spark: SparkSession,
    settings: config.Settings,
    per_partition: int = 10_000,
    batches: int = 3,
    timeout_s: int = 180,
    cut_short: Callable[[], bool] = lambda: False,
) -> None:
    """Run the job's own streaming plan over the source's newest records into a throwaway checkpoint, its results
    streamed to the driver as the job streams them (partition_stream) and dropped. Everything the first batches
    after a takeover would pay for is paid here: the Kafka connector's classes, code generation of the parse and
    the stateful aggregation, the state store, the Arrow path to Python, and (over a few batches of tens of
    thousands of records) the JIT compilation of the hot loops. A batch query over a few hundred records left the
    first batch after a takeover as slow as a cold start's (make bench: 39,480 records in 8.8 s). It stops early
    when `cut_short()` says so: a standby told to take over while it warms takes over at once."""
    import json
    import shutil

    if cut_short():  # told while its session was being built
        return
    wm = kafka_reading.source_watermarks(settings) or {}
    start = {p: max(lo, hi - per_partition) for p, (lo, hi) in wm.items()}
    total = sum(hi - start[p] for p, (_, hi) in wm.items())
    if total <= 0:
        return
    where = settings.run_dir / f"warm-up-{settings.app_id}-{os.getpid()}"
    shutil.rmtree(where, ignore_errors=True)
    starting = json.dumps(sources.offsets_to_json(start))
    sized = settings.replace(max_offsets_per_trigger=max(1, total // batches))
    frame = app_plan.output(settings.declared_app().transform, app_plan.source(spark, sized, starting), settings)

    def drain(df, _batch_id: int) -> None:
        with partition_stream.materialised(df) as stored:
            for _ in partition_stream.Stored(stored, tuple):
                pass

    query = (
        frame.writeStream.foreachBatch(drain)
        .outputMode("append")
        .option("checkpointLocation", where.as_uri())
        .trigger(availableNow=True)
        .start()
    )
    try:
        ended = await_or_cut(query, timeout_s, cut_short)
        if ended == "cut":
            log.info("standby: told to take over while warming up; warm-up cut short")
        elif ended == "timeout":
            log.warning("standby: warm-up still running after %d s; stopped", timeout_s)
    finally:
        query.stop()
        shutil.rmtree(where, ignore_errors=True)


def await_or_cut(query, timeout_s: float, cut_short: Callable[[], bool], poll_s: float = 0.5) -> str:
    """Wait for a query to end: "done", "timeout", or "cut" (`cut_short()` said so first). A standby told to take
    over went on warming up until its warm-up ended: 28-37 s from a kill to its takeover (its session's start and
    its warm-up together) in the one-node chaos set of 2026-11-30, where a fresh launch started in 15 s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if query.awaitTermination(max(0.0, min(poll_s, deadline - time.monotonic()))):
            return "done"
        if cut_short():
            return "cut"
    return "timeout"


def warm_standby(settings: config.Settings) -> SparkSession | None:
    """A standby launch: its session built and warmed (executors up, a shuffle run once), then it waits for its
    turn. The session to start the job with, or None if it was never told to take over."""
    spark = build_session(settings)
    try:
        warm_up(spark, settings, cut_short=lambda: standby.told_to_go(settings))
    except Exception as e:  # a cold standby still takes over; only slower
        log.warning("standby: warm-up failed (%s)", e)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    log.info("standby: session up, waiting for the supervisor's word")
    if not standby.wait_for_turn(settings, stop):
        return None
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # from here on a driver like any other
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    return spark


def run(settings: config.Settings) -> int:
    bus = ev.EventBus.for_job(settings)
    spark = None
    if standby.is_standby():
        spark = warm_standby(settings)
        if spark is None:
            return wire.EXIT_OK
        log.info("standby: taking over")
    try:
        t_start = time.monotonic()
        app = settings.declared_app()
        info = preflight.check_job(settings)
        if info["source_timestamp_type"] != "LogAppendTime":
            log.warning(
                preflight.CREATE_TIME_ADVICE.format(
                    topic=info["source_create_time_topic"], servers=settings.bootstrap_servers
                )
            )
        t_preflight = time.monotonic()
        # a standby's predecessor has just died: the kernel releases its lock as it exits
        InstanceLock.acquire(settings, wait_s=10.0 if spark is not None else 0.0)
    except (InstanceLocked, preflight.PreflightError, config.ConfigError) as e:
        return _refused(bus, "lock" if isinstance(e, InstanceLocked) else "preflight", e)
    status = Status(settings)
    injector = Injector(
        settings.fault,
        settings.run_dir / "faults" / settings.app_id,
        on_fire=lambda f: bus.emit(wire.FAULT_INJECTED, logging.WARNING, flush=True, fault=f.name),
    )
    try:
        sink = open_sink(settings, bus, injector)  # fences the previous instance of the app
        t_producer = time.monotonic()
    except Exception as e:
        if startup_exit_code(e) == wire.EXIT_FAILED:
            raise
        return _refused(bus, "producer", e)
    spark = spark or build_session(settings)
    fs = HadoopFS(spark, settings.checkpoint)
    debris = checkpoint.first_start_debris({d: fs.list_names(d) for d in checkpoint.SPARK_LOG_DIRS})
    for rel in debris:  # else Spark would refuse this checkpoint for good
        fs.delete(rel)
    if debris:
        log.warning("removed what a start killed before its first batch left in the checkpoint: %s", debris)
    epoch = checkpoint.read_epoch(fs)  # how Spark's batch ids map to the ledger's since the last restore
    quarantine = checkpoint.read_quarantine(fs)  # source offsets an operator quarantined (records go to the DLQ)
    heap = driver_heap.DriverHeap.of(spark, settings.jvm_gc) if settings.gc_while_idle_at > 0 else None
    writer = BatchWriter(settings, sink, fs, epoch, status, heap=heap)
    spark.streams.addListener(ProgressListener(bus, status, writer.batches))
    frame = app_plan.output(app.transform, app_plan.source(spark, settings), settings, quarantine)
    try:
        app_plan.check_deterministic(app, frame)
    except config.ConfigError as e:
        sink.close()
        return _refused(bus, "preflight", e)
    writer.started_at = time.monotonic()
    query = (
        frame.writeStream.foreachBatch(writer)
        .outputMode("append")
        .option("checkpointLocation", settings.checkpoint)
        .option("asyncProgressTrackingEnabled", "false")
        # close-out batches: the job paces batches itself (onceflow.rules.pacing), Spark runs them back to back
        .trigger(processingTime="0 seconds" if settings.close_out_batches else f"{settings.trigger_interval_s} seconds")
        .queryName(f"onceflow_{settings.app_id}")
        .start()
    )
    writer.query = query
    t_query = time.monotonic()
    bus.emit(
        wire.JOB_STARTED,
        checkpoint=settings.checkpoint,
        checkpoint_fs=fs.implementation,
        transactional_id=settings.transactional_id,
        spark_version=spark.version,
        query_id=query.id,
        run_id=query.runId,
        epoch=epoch.epoch,
        quarantined=[vars(r) for r in quarantine],
        ledger_shift=epoch.ledger_shift,
        job_config_hash=settings.job_config_hash(),
        **info,
        # where a (re)start's time goes, up to the query's start (the first batch's: the "first batch" log line)
        startup_ms={
            "preflight": round((t_preflight - t_start) * 1000),
            "producer": round((t_producer - t_preflight) * 1000),
            "session_and_query": round((t_query - t_producer) * 1000),
        },
    )
    status.update(
        state=wire.JobState.RUNNING,
        query_id=query.id,
        run_id=query.runId,
        spark_version=spark.version,
        epoch=epoch.epoch,
        job_config_hash=settings.job_config_hash(),
    )

    signal.signal(signal.SIGTERM, lambda *_: writer.stop.set())
    signal.signal(signal.SIGINT, lambda *_: writer.stop.set())
    while query.isActive and not writer.stop.is_set():
        try:
            query.awaitTermination(1)
        except Exception:
            break
    # (a StopRequested ends the query but is never a failure: it is raised before a batch starts any work)
    if writer.stop.is_set() and not writer.failure:
        writer.stop_at_boundary(query)
        status.update(state=wire.JobState.STOPPED, stopped_ms=clock.now_ms())
        bus.emit(wire.JOB_STOPPED, flush=True, last_batch=status.record.last_batch)
        sink.close()
        return wire.EXIT_OK
    err = writer.failure[-1] if writer.failure else query.exception()
    code = failure_exit_code(err)
    log.error("the query failed: %s", str(err)[:2000])
    status.update(state=wire.JobState.FAILED, error=str(err)[:2000], exit_code=code)
    bus.emit(wire.JOB_FAILED, logging.ERROR, flush=True, error=str(err)[:2000], exit_code=code)
    return code


def main() -> None:
    logs.setup(os.environ.get("ONCEFLOW_LOG_LEVEL", "INFO"))
    # `kill -USR1 <the driver's pid>` writes every Python thread's stack to the job's log, the job running on: where
    # a job that commits nothing waits (docs/operations.md)
    faulthandler.register(wire.STACKS_SIGNAL, all_threads=True)
    try:
        settings = config.load()
    except config.ConfigError as e:
        print(f"onceflow: {e}", file=sys.stderr)
        sys.exit(wire.EXIT_CONFIG)
    code = run(settings)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # without waiting for the JVM gateway's non-daemon threads
