"""The workload as a Spark Structured Streaming plan: requests per IP in 5 s event-time windows.

Kafka source (read_committed) -> parse with SQL built-ins -> two branches, one query:
- good records: watermark 5 s, tumbling 5 s windows per IP, count; append mode emits each window once, final;
- malformed records: straight to the DLQ branch with their provenance.
The branches are unioned (each row tagged with `kind`) so that one foreachBatch call, and so one Kafka
transaction, carries both.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from onceflow import wire
from onceflow.config import Settings
from onceflow.rules import records as R
from onceflow.spark import parsing
from onceflow.spark.kafka_source import kafka_options

ISO_MS = "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"
OUTPUT_COLUMNS = [
    "kind",
    "key",
    "value",
    "src_partition",
    "src_offset",
    "src_timestamp_ms",
    "reason",
    "src_size",
    "src_sha256",
]


def source(spark: SparkSession, settings: Settings, starting: str | None = None) -> DataFrame:
    """The source topic as a stream; `starting`: Spark's JSON of start offsets instead of the setting (the
    standby's warm-up)."""
    return (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", settings.bootstrap_servers)
        .options(**kafka_options(settings))
        .option("subscribe", settings.source_topic)
        .option("startingOffsets", starting or settings.starting_offsets)
        .option("failOnDataLoss", "true")
        .option("kafka.isolation.level", "read_committed")
        .option("maxOffsetsPerTrigger", str(settings.max_offsets_per_trigger))
        .load()
    )


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


def dlq_value(reason: Column, value: Column, cap: int) -> tuple[Column, Column, Column]:
    """The DLQ copy of a record's value, its original size, and its sha256 when the copy holds less than the
    original: capped at `cap` bytes, so a record near the broker's size limit still fits with its headers, and
    nothing at all for a quarantined record (its payload is what cannot be delivered)."""
    size = F.length(value)
    withheld = reason == R.REASON_QUARANTINED
    short = withheld | (size > cap)
    copy = F.when(withheld, F.lit(None).cast("binary")).when(size > cap, F.substring(value, 1, cap)).otherwise(value)
    return copy, size, F.when(short, F.sha2(value, 256))


def results_and_dlq(raw: DataFrame, settings: Settings, quarantine: Sequence = ()) -> DataFrame:
    parsed = parsing.classify(
        raw.select("value", "topic", "partition", "offset", "timestamp"), settings.max_event_ahead_ms, quarantine
    )
    # Good records are exactly those with an event time. Filtering on it after the watermark keeps the filter
    # there: Spark would push a filter on `reason` below the parse and evaluate the parse twice per record.
    counts = (
        parsed.withWatermark("ts", f"{settings.watermark_s} seconds")
        .where(F.col("ts").isNotNull())
        .groupBy(F.window("ts", f"{settings.window_s} seconds").alias("w"), "ip")
        .count()
    )
    results = counts.select(
        F.lit(wire.KIND_RESULT).alias("kind"),
        *result_key_value(),
        F.lit(None).cast("int").alias("src_partition"),
        F.lit(None).cast("bigint").alias("src_offset"),
        F.lit(None).cast("bigint").alias("src_timestamp_ms"),
        F.lit(None).cast("string").alias("reason"),
        F.lit(None).cast("int").alias("src_size"),
        F.lit(None).cast("string").alias("src_sha256"),
    )
    copy, size, sha = dlq_value(F.col("reason"), F.col("value"), settings.dlq_max_value_bytes)
    dlq = parsed.where(F.col("reason").isNotNull()).select(
        F.lit(wire.KIND_DLQ).alias("kind"),
        F.concat_ws("|", F.col("topic"), F.col("partition").cast("string"), F.col("offset").cast("string")).alias(
            "key"
        ),
        copy.alias("value"),
        F.col("partition").alias("src_partition"),
        F.col("offset").alias("src_offset"),
        F.unix_millis(F.col("timestamp")).alias("src_timestamp_ms"),
        F.col("reason"),
        size.alias("src_size"),
        sha.alias("src_sha256"),
    )
    return results.unionByName(dlq)
