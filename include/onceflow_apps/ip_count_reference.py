"""ip_count's reference recount (App.reference of onceflow_apps.ip_count): an independent second check of its results,
written apart from its plan, beside the platform's replay proof (onceflow.operations.reconcile runs both).

Its reference parser, window counts, late rows and the carry-in of windows still open before the range (I2, I3, the
DLQ), and its Great Expectations suite: one pass over the range's source records (a Spark batch read of exactly the
ledger's offsets), plus bounded reads of the sink and the DLQ. Every comparison is a Spark join or aggregation; only
capped lists of differences reach the driver. The rules (late rows, window emission, the carry-in) are in
onceflow.rules.reconciliation.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from onceflow import wire
from onceflow.config import Settings
from onceflow.kafka import events as ev
from onceflow.operations import committed_reads, recon_chain
from onceflow.rules import progress
from onceflow.rules import reconciliation as rr
from onceflow.rules.ledger import LedgerEntry, QuarantineRange
from onceflow.spark import differences, kafka_source
from onceflow_apps import ip_count_expectations
from onceflow_apps.access_log import parsing
from onceflow_apps.access_log.rules import RULES_VERSION
from onceflow_apps.ip_count_plan import ISO_MS

log = logging.getLogger(__name__)
SINK_SCHEMA = "window_start STRING, window_end STRING, ip STRING, count DOUBLE"


# ---------------------------------------------------------------------------- the source pass
def classified_source(
    spark: SparkSession,
    settings: Settings,
    selected: list[LedgerEntry],
    all_entries: list[LedgerEntry],
    quarantine: Sequence[QuarantineRange] = (),
) -> DataFrame:
    """The range's source records with their batch, late-row watermark, window and classification."""
    ranges = rr.source_ranges(selected)
    raw = kafka_source.read_ranges(
        spark,
        settings,
        {p: s for p, (s, _) in ranges.items()},
        {p: e for p, (_, e) in ranges.items()},
    ).select("value", "topic", "partition", "offset", "timestamp")
    rows = rr.batch_rows(selected, all_entries)
    table = spark.createDataFrame(
        [(r.topic, r.partition, r.start, r.end, r.batch, r.late_wm_ms, r.max_ahead_ms) for r in rows],
        "t string, p int, s long, e long, batch long, late_wm_ms long, max_ahead_ms long",
    )
    # each record is classified with the rules of the batch that read it (its skew limit, the quarantine)
    with_batch = raw.join(
        F.broadcast(table),
        (raw["topic"] == table["t"])
        & (raw["partition"] == table["p"])
        & (raw["offset"] >= table["s"])
        & (raw["offset"] < table["e"]),
        "inner",
    )
    joined = parsing.classify(with_batch, F.col("max_ahead_ms"), quarantine)
    w_ms = settings.window_s * 1000
    ts_ms = F.unix_millis("ts")
    start = (F.floor(ts_ms / w_ms) * w_ms).cast("long")
    return joined.select(
        "partition",
        "offset",
        "ip",
        "reason",
        "batch",
        "late_wm_ms",
        F.when(F.col("reason").isNull(), start).alias("window_start_ms"),
    ).withColumn("late", F.col("reason").isNull() & (F.col("window_start_ms") + w_ms <= F.col("late_wm_ms")))


def contributions(src: DataFrame) -> DataFrame:
    """Per (window, ip): the records of the range that count (valid, not late)."""
    return (
        src.where(F.col("reason").isNull() & ~F.col("late"))
        .groupBy("window_start_ms", "ip")
        .agg(F.count(F.lit(1)).alias("n"))
    )


def with_emission(spark, keys: DataFrame, entries: list[LedgerEntry], window_s: int) -> DataFrame:
    """Adds `emit_batch`: the ledger batch in which each window is final (null: not yet)."""
    emission = rr.Emission(entries)
    w_ms = window_s * 1000
    ends = [r[0] for r in keys.select("window_start_ms").distinct().collect()]
    emap = spark.createDataFrame([(s, emission.batch(s + w_ms)) for s in ends], "window_start_ms long, emit_batch long")
    return keys.join(F.broadcast(emap), "window_start_ms", "left")


def sink_key(window_start_ms, ip):
    return F.concat(F.date_format(F.timestamp_millis(window_start_ms), ISO_MS), F.lit("|"), ip)


# ---------------------------------------------------------------------------- carry between runs
def carry_path(settings: Settings, batch: int) -> Path:
    return recon_chain.home(settings) / "carry" / f"b{batch}.parquet"


def carry_in(
    spark: SparkSession,
    settings: Settings,
    entries: list[LedgerEntry],
    a: int,
    quarantine: Sequence[QuarantineRange] = (),
) -> DataFrame:
    """Windows still open after batch a-1, with the counts of the records read before a: the previous run's
    carry-out, or (none kept) one pass over the batches before a that can still count in them, done now and kept."""
    empty = spark.createDataFrame([], "window_start_ms long, ip string, n long")
    path = carry_path(settings, a - 1)
    if not path.exists():
        before = rr.carry_sources(entries, a, settings.window_s * 1000, settings.watermark_s * 1000)
        if not before:
            return empty
        log.info("no carry for batch %d: reading batches %d..%d once", a - 1, before[0].batch, a - 1)
        src = classified_source(spark, settings, before, entries, quarantine)
        keys = with_emission(spark, contributions(src), entries, settings.window_s)
        save_carry(
            settings,
            keys.where(F.col("emit_batch").isNull() | (F.col("emit_batch") > a - 1)).select(
                "window_start_ms", "ip", "n"
            ),
            a - 1,
        )
    return spark.read.parquet(str(path))


def save_carry(settings: Settings, df: DataFrame, batch: int, keep: tuple[int, ...] = ()) -> None:
    """Keep the carry-out of `batch`; prune all but the newest three, this one (a manual run far behind the newest
    writes an old one and reads it next) and those in `keep` (the carry-in this run used: a failed chain run is
    retried from it)."""
    import shutil

    path = carry_path(settings, batch)
    df.write.mode("overwrite").parquet(str(path))
    for old in sorted(path.parent.glob("b*.parquet"), key=lambda p: int(p.stem[1:]))[:-3]:
        if int(old.stem[1:]) not in keep + (batch,):
            shutil.rmtree(old, ignore_errors=True)


def recount(
    spark: SparkSession,
    settings: Settings,
    res: rr.Result,
    selected: list[LedgerEntry],
    entries: list[LedgerEntry],
    quarantine: Sequence[QuarantineRange],
    with_gx: bool,
    chain: bool,
) -> None:
    """The recount of `selected` (given the whole ledger `entries`): its checks added to `res`."""
    t0 = res.started_ms
    other_rules = rr.rules_check(selected, RULES_VERSION, chain)
    if other_rules is not None:
        res.checks.append(other_rules)
        return
    a, b = selected[0].batch, selected[-1].batch
    steps = 4 if with_gx else 3

    def stage(k: int, text: str) -> None:
        took = time.time() - t0 / 1000
        progress.report(f"reconciliation of batches {a}..{b}: step {k} of {steps} done ({text}), {took:.0f} s")

    src = classified_source(spark, settings, selected, entries, quarantine).cache()
    totals = src.agg(
        F.count(F.lit(1)).alias("total"),
        F.sum(F.col("reason").isNotNull().cast("long")).alias("malformed"),
        F.sum(F.col("late").cast("long")).alias("late"),
    ).first()
    stage(1, f"read {totals['total'] if totals else 0} source records of {len(selected)} batches")
    # Spark drops late rows after its partial aggregation and the shuffle's partial merge: what it counts in
    # numRowsDroppedByWatermark is one row per late (window, ip) of the batch.
    late_groups = {
        r["batch"]: r["n"]
        for r in src.where("late")
        .select("batch", "window_start_ms", "ip")
        .distinct()
        .groupBy("batch")
        .agg(F.count(F.lit(1)).alias("n"))
        .collect()
    }

    contrib = contributions(src).withColumn("from_range", F.col("n"))
    prior = carry_in(spark, settings, entries, a, quarantine).withColumn("from_range", F.lit(0).cast("long"))
    keys = (
        contrib.unionByName(prior)
        .groupBy("window_start_ms", "ip")
        .agg(F.sum("n").alias("n"), F.sum("from_range").alias("from_range"))
    )
    keys = with_emission(spark, keys, entries, settings.window_s).cache()
    save_carry(
        settings,
        keys.where(F.col("emit_batch").isNull() | (F.col("emit_batch") > b)).select("window_start_ms", "ip", "n"),
        b,
        keep=(a - 1,),
    )
    pending_row = keys.where(F.col("emit_batch").isNull() | (F.col("emit_batch") > b)).agg(F.sum("from_range")).first()
    assert pending_row is not None  # a global aggregation has one row
    pending = pending_row[0] or 0
    expected = keys.where(F.col("emit_batch").between(a, b)).select(
        sink_key(F.col("window_start_ms"), F.col("ip")).alias("key"),
        F.col("n").alias("expected"),
        "emit_batch",
        "from_range",
    )

    stage(2, "recounted every (window, ip)")
    sink_raw = committed_reads.bounded(spark, settings, settings.sink_topic, selected, entries).cache()
    sink = (
        sink_raw.select(
            F.col("key").cast("string").alias("key"),
            "batch",
            "partition",
            "offset",
            F.from_json(F.col("value").cast("string"), SINK_SCHEMA).alias("v"),
        ).select("key", "batch", "partition", "offset", "v.*")
    ).cache()
    dlq_check = _dlq(spark, settings, src, selected, entries)
    res.checks += _results(
        expected, sink, selected, totals, late_groups, pending, settings, dlq_check.figures["dlq_records"]
    )
    res.checks.append(dlq_check)
    stage(3, "I2 and I3: the sink against the recount, the DLQ")
    if with_gx:
        res.checks.append(_gx(sink, settings, res))  # everything the sink holds for the range, ours or not
        stage(4, "the Great Expectations suite")
    src.unpersist()
    keys.unpersist()
    sink.unpersist()
    sink_raw.unpersist()


def _results(expected, sink, selected, totals, late_groups, pending, settings, dlq_records) -> list[rr.Check]:
    per_key = sink.groupBy("key").agg(
        F.count(F.lit(1)).alias("times"),
        F.collect_set("batch").alias("batches"),
        F.first("count").alias("count"),
        F.min("batch").alias("batch"),
    )
    j = expected.join(per_key, "key", "full_outer").cache()
    times, exp = F.col("times"), F.col("expected")
    diffs, figs = differences.listed(
        j,
        {
            "duplicates": (times > 1, ["key", "times", "batches"]),
            "missing": (times.isNull(), ["key", "expected", "emit_batch"]),
            "wrong": (
                times.isNotNull() & exp.isNotNull() & (F.col("count") != exp),
                ["key", "expected", "count", "batch"],
            ),
            "unexpected": (exp.isNull(), ["key", "count", "batches"]),
            "misplaced": (
                (times == 1) & exp.isNotNull() & (F.col("batch") != F.col("emit_batch")),
                ["key", "batch", "emit_batch"],
            ),
        },
        F.count("expected").alias("expected_keys"),
        F.sum(F.when(exp.isNotNull(), F.col("count"))).alias("sink_counted"),
        F.sum(exp - F.col("from_range")).alias("carried_in"),
    )
    j.unpersist()
    # the sink's records of the range: ours (a batch header), and those no onceflow transaction wrote (none)
    headed = sink.agg(
        F.count(F.when(F.col("batch").isNotNull(), True)).alias("ours"),
        F.count(F.when(F.col("batch").isNull(), True)).alias("foreign"),
    ).first()
    assert headed is not None
    ledger_outputs = sum(e.outputs for e in selected)
    i3 = rr.results_check(figs["expected_keys"], headed["ours"], ledger_outputs=ledger_outputs, **diffs)
    i3.figures["foreign_records"] = headed["foreign"]
    counted_in_sink = int((figs["sink_counted"] or 0) - (figs["carried_in"] or 0))
    i2 = rr.accounting_check(
        totals["total"],
        counted_in_sink,
        int(totals["late"] or 0),
        dlq_records,
        int(pending),
        spark_dropped(settings, selected),
        late_groups,
        settings.late_fraction_threshold,
    )
    i2.figures["malformed_by_parser"] = int(totals["malformed"] or 0)
    return [i2, i3]


def _dlq(spark, settings, src, selected, entries) -> rr.Check:
    dlq = committed_reads.bounded(spark, settings, settings.dlq_topic, selected, entries).select(
        committed_reads.header(wire.H_SOURCE_PARTITION).cast("int").alias("partition"),
        committed_reads.header(wire.H_SOURCE_OFFSET).cast("long").alias("offset"),
        "batch",
        committed_reads.header(wire.H_REASON).alias("dlq_reason"),
    )
    got = dlq.groupBy("partition", "offset").agg(
        F.count(F.lit(1)).alias("times"), F.first("batch").alias("batch"), F.first("dlq_reason").alias("dlq_reason")
    )
    bad = src.where(F.col("reason").isNotNull()).select("partition", "offset", "reason", F.col("batch").alias("b"))
    j = bad.join(got, ["partition", "offset"], "full_outer").cache()
    diffs, figs = differences.listed(
        j,
        {
            "missing": (F.col("times").isNull(), ["partition", "offset", "reason", "b"]),
            "unexpected": (F.col("reason").isNull(), ["partition", "offset", "dlq_reason", "batch"]),
            "duplicates": (F.col("times") > 1, ["partition", "offset", "times"]),
        },
        F.count(F.when(F.col("reason").isNotNull(), True)).alias("malformed"),
        # every DLQ record of the range is in one group of `got` (those without source headers too: null keys
        # group together and match no source record), and each group in one row of the full outer join
        F.sum("times").alias("records"),
    )
    j.unpersist()
    return rr.dlq_check(figs["malformed"], int(figs["records"] or 0), ledger_dlq=sum(e.dlq for e in selected), **diffs)


def _gx(sink: DataFrame, settings: Settings, res: rr.Result) -> rr.Check:
    try:
        out = ip_count_expectations.validate(
            sink,
            settings.window_s,
            recon_chain.home(settings) / "gx",
            f"{res.run_id}-b{res.first_batch}-{res.last_batch}",
        )
    except Exception as e:  # GX itself failing is reported, not hidden
        log.exception("the GX suite did not run")
        return rr.Check("gx_suite", rr.Status.FAIL, f"the Great Expectations suite did not run: {e}")
    res.data_docs = out["data_docs"]
    failed = [x for x in out["expectations"] if not x["success"]]
    figures = {"expectations": len(out["expectations"]), "failed": len(failed), "data_docs": out["data_docs"]}
    if failed:
        return rr.Check(
            "gx_suite",
            rr.Status.FAIL,
            "; ".join(f"{x['expectation']}({x['column']}): {x['unexpected_count']} unexpected" for x in failed),
            figures,
            failed,
        )
    return rr.Check("gx_suite", rr.Status.PASS, f"all {len(out['expectations'])} expectations met", figures)


def spark_dropped(settings: Settings, selected: list[LedgerEntry]) -> dict[int, int] | None:
    """Spark's own numRowsDroppedByWatermark per ledger batch, from the job's progress events (None when the
    events are not there, e.g. retention removed them). A progress event names Spark's batch id and follows the
    batch's commit; after a restore, Spark's ids repeat, so an event belongs to the newest ledger batch with its
    Spark id committed before it."""
    by_spark: dict[int, list[LedgerEntry]] = {}
    for e in selected:
        by_spark.setdefault(e.spark_batch if e.spark_batch is not None else e.batch, []).append(e)
    since = selected[0].commit_time_ms - committed_reads.MARGIN_MS
    got: dict[int, int] = {}
    for d in ev.read(settings, {wire.PROGRESS}, since_ms=since):  # the job's own events topic only
        if "ledger_batch" in d:  # the job names the ledger batch and the decision (a catch-up writes nothing)
            if d.get("decision") == "write" and any(e.batch == d["ledger_batch"] for e in selected):
                got[d["ledger_batch"]] = int(d.get("rows_dropped_by_watermark") or 0)
            continue
        cands = [e for e in by_spark.get(d.get("batch", -1), []) if e.commit_time_ms <= d["ts_ms"]]
        if cands:
            lb = max(cands, key=lambda e: e.commit_time_ms).batch
            got[lb] = int(d.get("rows_dropped_by_watermark") or 0)  # the last report of a batch wins
    return got or None
