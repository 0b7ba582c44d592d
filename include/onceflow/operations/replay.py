"""The proof for any app: its own plan replayed over exactly the source ranges the ledger says were committed, batch
by batch, and compared key by key with what read_committed consumers of its sink and DLQ see (the rules, and why
the replay sees what the job saw: onceflow.rules.replay).

1. Stage: one Spark batch read of the source (read_committed, as the job reads it) over the replayed batches'
   ranges, each record tagged with its ledger batch, written as one Parquet file per batch (an empty one for a
   batch that read no visible record) in ledger order.
2. Replay: the platform's plan of the app (onceflow.spark.app_plan, the job's own) on a file stream of those files,
   one file per micro-batch, Spark's empty-batch runs off (a batch without records is an empty file); each
   micro-batch's output is kept with its batch id.
3. Compare: per batch, the multiset of (kind, key, value, reason) against the sink's and the DLQ's records that
   carry the batch's header; the ledger's counts and watermarks against the replay's.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from onceflow import wire
from onceflow.app import MAIN_OUTPUT, App
from onceflow.config import Settings
from onceflow.kafka import reading as kafka_reading
from onceflow.operations import audit, committed_reads, recon_chain
from onceflow.rules import reconciliation as rr
from onceflow.rules import replay as rp
from onceflow.rules.ledger import LedgerEntry, QuarantineRange
from onceflow.rules.reconciliation import Check
from onceflow.spark import app_plan, differences, kafka_source

log = logging.getLogger(__name__)
# Logical plan nodes that keep state across micro-batches (a join is counted too: a stream-stream join keeps state;
# a stream-static one does not, but replaying it from the first batch costs time only).
STATEFUL_NODES = (
    "Aggregate",
    "Deduplicate",
    "DeduplicateWithinWatermark",
    "FlatMapGroupsWithState",
    "FlatMapGroupsInPandasWithState",
    "TransformWithState",
    "TransformWithStateInPandas",
    "Join",
)
RUN_TIMEOUT_S = 3600
CAP = differences.CAP
COMPARED = ["batch", "kind", "output", "key", "sha", "reason"]  # output: a result's (App.outputs)


def is_stateful(frame: DataFrame) -> bool:
    """Does the streaming plan keep state from one micro-batch to the next?"""
    found: list[str] = []
    plan = frame._jdf.queryExecution().analyzed()
    stack = [plan]
    while stack:
        node = stack.pop()
        found.append(node.nodeName())
        children = node.children()
        stack.extend(children.apply(i) for i in range(children.size()))
    return any(n in STATEFUL_NODES for n in found)


def check(
    spark: SparkSession,
    settings: Settings,
    app: App,
    history: list[LedgerEntry],
    selected: list[LedgerEntry],
    quarantine: Sequence[QuarantineRange] = (),
    keep: Path | None = None,
) -> Check:
    """The replay proof of the stream batches `selected` (given the app's whole committed `history`).

    keep: where the replay's state stays between runs (the scheduled chain's, which proves batch after batch): a
    run replays only the batches after those replayed there already, so each source record is read once; None: a
    fresh replay, removed afterwards."""
    spark.conf.set("spark.sql.session.timeZone", "UTC")  # as the job's session (onceflow.runtime.launcher)
    lock = _lock(keep) if keep is not None else None
    if lock is None:  # no kept replay, or another run holds it: a fresh one of this run's own
        keep = None
    work = keep or recon_chain.home(settings) / "replay" / uuid.uuid4().hex[:12]
    try:
        (work / "in").mkdir(parents=True, exist_ok=True)
        frame = app_plan.output(app.transform, _file_stream(spark, work / "in"), settings, quarantine)
        try:
            p = rp.plan(history, selected, is_stateful(frame))
        except rp.Unprovable as e:
            return rp.unprovable(str(e))
        state = _resumable(work, p, history)
        todo = rp.Plan([e for e in p.batches if e.batch > state["through"]], p.compared)
        took = {"stage_s": 0.0, "replay_s": 0.0}
        if todo.batches:
            marks = kafka_reading.source_watermarks(settings) or {}
            gone = rp.source_gone(todo, {q: lo for q, (lo, _) in marks.items()})
            if gone is not None:
                return rp.unprovable(gone)
            t0 = time.monotonic()
            staged = _stage(spark, settings, todo, work / "staged")
            t1 = time.monotonic()
            _replay(spark, frame, settings.app_id, p.start, todo, staged, work, state)
            took = {"stage_s": t1 - t0, "replay_s": time.monotonic() - t1}
            state["through"] = todo.batches[-1].batch
            state["digest"] = _digest(history, p.start, state["through"])
        t2 = time.monotonic()
        watermarks = {int(k): v for k, v in state["marks"].items()}
        out = _compare(spark, settings, p, work / "out", selected, history, watermarks)
        out.figures.update({k: round(v, 1) for k, v in took.items()})
        out.figures["compare_s"] = round(time.monotonic() - t2, 1)
        out.figures["replayed_now"] = len(todo.batches)
        log.info("replay of %d batches (%d new): %s", len(p.batches), len(todo.batches), out.figures)
        _prune(work, state, selected[0].batch - p.start)
        return out
    finally:
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)
        if lock is not None:
            os.close(lock)  # releases the lock


STATE = "state.json"


def _lock(keep: Path) -> int | None:
    """An exclusive lock on the kept replay (a manual run from the CLI beside the DAG's); None when it is held."""
    keep.mkdir(parents=True, exist_ok=True)
    fd = os.open(keep.parent / f".{keep.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        log.info("the kept replay %s is in use: this run replays in a directory of its own", keep)
        return None
    return fd


def _digest(history: list[LedgerEntry], start: int, through: int) -> str:
    """What the replayed batches read, as a fingerprint: a replay kept for another history is not resumed."""
    rows = [[e.batch, sorted(e.ranges.items())] for e in history if start <= e.batch <= through]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def _resumable(work: Path, p: rp.Plan, history: list[LedgerEntry]) -> dict:
    """The kept replay's state when this plan can go on from it (same start, the same batches read, the compared
    batches' outputs still kept); otherwise a new, empty one (the directory is cleared)."""
    try:
        state = json.loads((work / STATE).read_text())
        if (
            state["start"] == p.start
            and state["kept_from"] <= p.compared[0] - p.start
            and state["digest"] == _digest(history, p.start, state["through"])
            and (work / "checkpoint").is_dir()
        ):
            return state
    except (OSError, ValueError, KeyError):
        pass
    shutil.rmtree(work, ignore_errors=True)
    (work / "in").mkdir(parents=True)
    # The file source takes files in modification-time order: each batch's file gets its place after `t0`.
    return {
        "start": p.start,
        "through": p.start - 1,
        "digest": "",
        "kept_from": 0,
        "t0": time.time() - 10**6,
        "marks": {},
    }


def _prune(work: Path, state: dict, keep_from: int) -> None:
    """Keep the outputs from replay batch `keep_from` on (a failed chain run is retried from its first batch) and
    save the state."""
    for d in (work / "out").glob("b=*"):
        if int(d.name[2:]) < keep_from:
            shutil.rmtree(d, ignore_errors=True)
    state["kept_from"] = max(state["kept_from"], keep_from)
    state["marks"] = {k: v for k, v in state["marks"].items() if int(k) >= keep_from}
    (work / STATE).write_text(json.dumps(state))


def _file_stream(spark: SparkSession, inp: Path) -> DataFrame:
    """The staged batches as a stream with the Kafka source's columns: one file per micro-batch, in the order of the
    files' times."""
    return (
        spark.readStream.schema(app_plan.SOURCE_SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .option("maxFileAge", "36500d")  # the files' times are places in line, not ages
        .parquet(str(inp))
    )


def _stage(spark: SparkSession, settings: Settings, p: rp.Plan, where: Path) -> dict[int, Path]:
    """Step 1: the replayed batches' source records, one Parquet file per batch that has any (by ledger batch)."""
    ranges = rr.source_ranges(p.batches)
    raw = kafka_source.read_ranges(
        spark,
        settings,
        {q: s for q, (s, _) in ranges.items()},
        {q: e for q, (_, e) in ranges.items()},
    ).select(*app_plan.SOURCE_COLUMNS)
    bounds = [(e.batch, q.topic, q.partition, s, end) for e in p.batches for q, (s, end) in e.ranges.items() if end > s]
    if not bounds:
        return {}
    table = spark.createDataFrame(bounds, "ledger_batch long, t string, p int, s long, e long")
    tagged = raw.join(
        F.broadcast(table),
        (raw["topic"] == table["t"])
        & (raw["partition"] == table["p"])
        & (raw["offset"] >= table["s"])
        & (raw["offset"] < table["e"]),
    ).select(*app_plan.SOURCE_COLUMNS, "ledger_batch")
    # one task per batch, so one file per batch, records in the order the source read gives them
    tagged.repartition("ledger_batch").sortWithinPartitions(
        "ledger_batch", "topic", "partition", "offset"
    ).write.partitionBy("ledger_batch").parquet(str(where))
    out: dict[int, Path] = {}
    for d in where.glob("ledger_batch=*"):
        files = sorted(d.glob("*.parquet"))
        if len(files) != 1:
            raise rp.Unprovable(f"staging wrote {len(files)} files for batch {d.name}, not one")
        out[int(d.name.split("=", 1)[1])] = files[0]
    return out


def _replay(
    spark: SparkSession,
    frame: DataFrame,
    app_id: str,
    start: int,
    todo: rp.Plan,
    staged: dict[int, Path],
    work: Path,
    state: dict,
) -> None:
    """Step 2: the app's plan over the staged files of `todo` (`frame`, its output on _file_stream), one file per
    micro-batch, in one query run that goes on from the kept checkpoint (replay batch i is ledger batch start + i);
    records each replay batch's watermark (from the replay's own offset log) in `state`."""
    inp, ckpt, out = work / "in", work / "checkpoint", work / "out"
    empty = work / "empty"
    if not empty.exists():
        spark.createDataFrame([], app_plan.SOURCE_SCHEMA).coalesce(1).write.parquet(str(empty))
    empty_file = next(empty.glob("*.parquet"))
    for e in todo.batches:
        i = e.batch - start
        dst = inp / f"{i:012d}.parquet"
        shutil.copyfile(staged.get(e.batch, empty_file), dst)
        at = state["t0"] + i / 1000  # millisecond steps: the file source's clock resolution
        os.utime(dst, (at, at))
    confs = {
        "spark.sql.streaming.noDataMicroBatches.enabled": "false",
        # One partition for the replay's shuffles and state (a kept replay keeps what its checkpoint began with): a
        # batch's result does not depend on how its keys are partitioned, and each micro-batch costs less (measured:
        # 0.62-0.69 s instead of 0.74-0.80 s per batch of ip_count, local[2], 60 batches).
        "spark.sql.shuffle.partitions": "1",
        # every batch of this run keeps its offsets file until its watermark is read below
        "spark.sql.streaming.minBatchesToRetain": str(len(todo.batches) + 100),
    }
    previous: dict[str, str | None] = {k: spark.conf.get(k, None) for k in confs}
    for k, v in confs.items():
        spark.conf.set(k, v)

    def keep(df: DataFrame, batch_id: int) -> None:
        df.write.mode("overwrite").parquet(str(out / f"b={batch_id}"))

    try:
        q = (
            frame.writeStream.foreachBatch(keep)
            .option("checkpointLocation", str(ckpt))
            .trigger(availableNow=True)
            .queryName(f"onceflow_replay_{app_id}")
            .start()
        )
        if not q.awaitTermination(RUN_TIMEOUT_S):
            q.stop()
            raise rp.Unprovable(f"the replay of {len(todo.batches)} batches did not end in {RUN_TIMEOUT_S} s")
        if q.exception() is not None:
            raise rp.Unprovable(f"the replay failed: {q.exception()}")
    finally:
        for k, was in previous.items():
            if was is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, was)
    for e in todo.batches:
        i = e.batch - start
        f = ckpt / "offsets" / str(i)
        lines = [ln for ln in f.read_text().splitlines() if ln.strip()] if f.exists() else []
        meta = json.loads(lines[1]) if len(lines) > 1 else {}
        if "batchWatermarkMs" in meta:
            state["marks"][str(i)] = int(meta["batchWatermarkMs"])
    for f in inp.glob("*.parquet"):  # replayed: the checkpoint's state holds what they contributed
        f.unlink()
    shutil.rmtree(work / "staged", ignore_errors=True)


def _compare(
    spark: SparkSession,
    settings: Settings,
    p: rp.Plan,
    out: Path,
    selected: list[LedgerEntry],
    history: list[LedgerEntry],
    watermarks: dict[int, int],
) -> Check:
    """Step 3: the replay's output of the compared batches against the sink's and the DLQ's committed records."""
    first, last = p.compared
    index = spark.createDataFrame([(i, e.batch) for i, e in enumerate(p.batches)], "b int, batch long")
    replayed = spark.read.parquet(str(out)).join(F.broadcast(index), "b").where(F.col("batch").between(first, last))
    expected = replayed.select(
        "batch",
        F.col("kind"),
        F.when(F.col("kind") == wire.KIND_RESULT, F.coalesce(F.col("output"), F.lit(MAIN_OUTPUT))).alias("output"),
        F.col("key").cast("string").alias("key"),
        F.sha2(F.col("value"), 256).alias("sha"),
        F.col("reason"),
    )
    produced = expected  # every row the replay's batches wrote, for the ledger's counts
    if settings.sink_kind == "postgres":
        expected, committed = _table_sides(spark, settings, expected, first, last)
    else:
        committed = _topic_side(spark, settings, selected, history)
    e = expected.groupBy(*COMPARED).agg(F.count(F.lit(1)).alias("replayed"))
    c = committed.groupBy(*COMPARED).agg(F.count(F.lit(1)).alias("committed"))
    j = (
        e.join(c, [e[k].eqNullSafe(c[k]) for k in COMPARED], "full_outer")
        .select(
            *[F.coalesce(e[k], c[k]).alias(k) for k in COMPARED],
            F.coalesce(e["replayed"], F.lit(0)).alias("replayed"),
            F.coalesce(c["committed"], F.lit(0)).alias("committed"),
        )
        .cache()
    )
    cols = ["batch", "kind", "output", "key", "replayed", "committed"]
    rows, totals = differences.listed(
        j,
        {
            "missing": (F.col("replayed") > F.col("committed"), cols),
            "extra": (F.col("committed") > F.col("replayed"), cols),
        },
        F.sum(F.when(F.col("kind") == wire.KIND_RESULT, F.col("replayed"))).alias("results"),
        F.sum(F.when(F.col("kind") == wire.KIND_DLQ, F.col("replayed"))).alias("dlq"),
        F.sum(F.when(F.col("kind") == wire.KIND_RESULT, F.col("committed"))).alias("committed_results"),
        F.sum(F.when(F.col("kind") == wire.KIND_DLQ, F.col("committed"))).alias("committed_dlq"),
    )
    per_batch = {
        r["batch"]: (int(r["results"]), int(r["dlq"]))
        for r in produced.groupBy("batch")
        .agg(
            F.sum((F.col("kind") == wire.KIND_RESULT).cast("long")).alias("results"),
            F.sum((F.col("kind") == wire.KIND_DLQ).cast("long")).alias("dlq"),
        )
        .collect()
    }
    j.unpersist()
    diffs = (
        rp.watermark_differences(p, watermarks)
        + rp.ledger_differences(p, per_batch)
        + rp.differences(rows["missing"], rows["extra"])
    )
    figures: dict[str, int | float] = {
        k: int(totals[k] or 0) for k in ("results", "dlq", "committed_results", "committed_dlq")
    }
    return rp.check(p, figures, diffs, CAP)


def _topic_side(spark: SparkSession, settings: Settings, selected: list[LedgerEntry], history: list[LedgerEntry]):
    """What the compared batches committed to the sink and DLQ topics (read_committed), as the compared columns."""
    dlq = committed_reads.bounded(spark, settings, settings.dlq_topic, selected, history)
    ours = (F.col("app").isNull()) | (F.col("app") == settings.app_id)
    results = [
        committed_reads.bounded(spark, settings, topic, selected, history)
        .where(ours)
        .select(
            "batch",
            F.lit(wire.KIND_RESULT).alias("kind"),
            F.lit(name).alias("output"),
            F.col("key").cast("string").alias("key"),
            F.sha2(F.col("value"), 256).alias("sha"),
            F.lit(None).cast("string").alias("reason"),
        )
        for name, topic in settings.outputs.items()
    ]
    return functools.reduce(DataFrame.unionByName, results).unionByName(
        dlq.where(ours).select(
            "batch",
            F.lit(wire.KIND_DLQ).alias("kind"),
            F.lit(None).cast("string").alias("output"),
            F.col("key").cast("string").alias("key"),
            F.sha2(F.col("value"), 256).alias("sha"),
            committed_reads.header(wire.H_REASON).alias("reason"),
        )
    )


def _table_sides(spark: SparkSession, settings: Settings, expected: DataFrame, first: int, last: int):
    """A PostgreSQL sink holds one row per key, its latest value: the replay's results are compared as the latest
    version of each key, leaving out keys a batch after the compared ones wrote again (proven with that batch); DLQ
    rows are compared as they are. Both tables are read in one database transaction (audit.table_snapshot)."""
    _, rows = audit.table_snapshot(settings)
    results = spark.createDataFrame(rows.results, "key string, value string, batch long")
    dlq = spark.createDataFrame(
        [(r[2], bytes(r[3]) if r[3] is not None else None, r[4], r[5]) for r in rows.dlq],
        "key string, value binary, reason string, batch long",
    )
    rewritten = spark.createDataFrame([(k,) for k, _, b in rows.results if b > last], "key string")
    latest = Window.partitionBy("key").orderBy(F.col("batch").desc())
    exp_results = (
        expected.where(F.col("kind") == wire.KIND_RESULT)
        .withColumn("_n", F.row_number().over(latest))
        .where(F.col("_n") == 1)
        .drop("_n")
        .join(rewritten, "key", "left_anti")
    )
    exp = exp_results.select(*COMPARED).unionByName(expected.where(F.col("kind") != wire.KIND_RESULT).select(*COMPARED))
    committed = (
        results.where(F.col("batch").between(first, last))
        .select(
            "batch",
            F.lit(wire.KIND_RESULT).alias("kind"),
            F.lit(MAIN_OUTPUT).alias("output"),  # (an app with named outputs cannot have this sink: Settings)
            "key",
            F.sha2(F.col("value"), 256).alias("sha"),
            F.lit(None).cast("string").alias("reason"),
        )
        .unionByName(
            dlq.where(F.col("batch").between(first, last)).select(
                "batch",
                F.lit(wire.KIND_DLQ).alias("kind"),
                F.lit(None).cast("string").alias("output"),
                "key",
                F.sha2(F.col("value"), 256).alias("sha"),
                "reason",
            )
        )
    )
    return exp, committed
