"""ip_count's transformation: requests per IP in 5 s event-time windows (declared in onceflow_apps.ip_count).

Parse with SQL built-ins (onceflow_apps.access_log.parsing) once per batch, then two branches of one plan
(onceflow.spark.read_once):
- good records: watermark 5 s, tumbling 5 s windows per IP, count; append mode emits each window once, final;
- malformed, quarantined and far-ahead records: the rejects, which the platform writes to the DLQ with their
  provenance (onceflow.spark.app_plan).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from onceflow.app import Context, Results
from onceflow.config import Settings
from onceflow.spark import app_plan, read_once
from onceflow_apps.access_log import parsing

ISO_MS = "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"


def result_key_value() -> list:
    """The sink's key and JSON value of a window count (columns `w` window struct, `ip`, `count`)."""
    ws = F.date_format(F.col("w.start"), ISO_MS)
    we = F.date_format(F.col("w.end"), ISO_MS)
    return [
        F.concat(ws, F.lit("|"), F.col("ip")).alias("key"),
        F.to_json(F.struct(ws.alias("window_start"), we.alias("window_end"), F.col("ip"), F.col("count")))
        .cast("binary")
        .alias("value"),
    ]


def transform(raw: DataFrame, ctx: Context) -> Results:
    """ip_count's transformation (its declaration: onceflow_apps.ip_count)."""
    settings = ctx.settings
    parsed = parsing.classify(
        raw.select("value", "topic", "partition", "offset", "timestamp"), settings.max_event_ahead_ms, ctx.quarantine
    )
    # Good records are exactly those with an event time: both branches come from one read and parse of the batch.
    split = read_once.branches(
        parsed,
        event_time="ts",
        delay=f"{settings.watermark_s} seconds",
        good=["ip"],
        rejects=["value", "topic", "partition", "offset", "timestamp", "reason"],
        partitions=settings.shuffle_partitions,
    )
    counts = split.good.groupBy(F.window("ts", f"{settings.window_s} seconds").alias("w"), "ip").count()
    return Results(rows=counts.select(*result_key_value()), rejects=split.rejects)


def results_and_dlq(raw: DataFrame, settings: Settings, quarantine: Sequence = ()) -> DataFrame:
    """ip_count's whole output as the job writes it (the benchmarks' and the tests' shortcut)."""
    return app_plan.output(transform, raw, settings, quarantine)
