"""A declared app's streaming plan as the job runs it: the platform's Kafka source, the app's transformation
(onceflow.app), and the one shape every batch's output takes on its way into the transaction.

Kafka source (read_committed) -> the app's transform -> its results and its rejects -> one DataFrame of
OUTPUT_COLUMNS, each row tagged with `kind` (a result, with the named output it goes to if any, or a DLQ record with
its provenance), so that one foreachBatch call, and so one Kafka transaction, carries both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from onceflow import wire
from onceflow.app import MAIN_OUTPUT, App, Context, Results
from onceflow.config import ConfigError, Settings
from onceflow.spark.kafka_source import kafka_options

# the Kafka source's columns, as a transformation gets them
SOURCE_COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
SOURCE_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, timestampType int"
)
# the protocol's OutRecord, in order (onceflow.protocol.exactly_once)
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
    "output",
    "src_topic",
]


# How the stream's source plans a batch when a broker dies. Spark's source looks up the partitions' end offsets with
# a Java admin client and, when a lookup fails, tries again with a new admin (`fetchOffset.numRetries`, a fresh
# metadata view each time). Kafka's default gives one lookup 60 s: a lookup sent while a dead node still led a
# partition waited all of it (cluster chaos seed 4711) though the controller had moved every leader within 6 s.
# 15 s a lookup (as onceflow.kafka.reading's own), asked up to 8 times, follows a moved leader within a lookup and
# still waits out an outage of about 2 minutes before the batch fails and the supervisor restarts the job.
SOURCE_LOOKUP_TIMEOUT_MS = 15_000
SOURCE_LOOKUP_ATTEMPTS = 8
SOURCE_LOOKUP_RETRY_MS = 1_000


def source_options(settings: Settings, starting: str | None = None) -> dict[str, str]:
    """The stream's Kafka source options (read_committed, paced by `max_offsets_per_trigger`, lookups bounded as
    above); `starting`: Spark's JSON of start offsets instead of the setting (the standby's warm-up)."""
    return {
        "kafka.bootstrap.servers": settings.bootstrap_servers,
        **kafka_options(settings),
        "subscribe": ",".join(settings.source_topic_list),
        "startingOffsets": starting or settings.starting_offsets,
        "failOnDataLoss": "true",
        "kafka.isolation.level": "read_committed",
        "maxOffsetsPerTrigger": str(settings.max_offsets_per_trigger),
        # the admin's own default (60 s) would override a shorter request timeout: both are set
        "kafka.default.api.timeout.ms": str(SOURCE_LOOKUP_TIMEOUT_MS),
        "kafka.request.timeout.ms": str(SOURCE_LOOKUP_TIMEOUT_MS),
        "fetchOffset.numRetries": str(SOURCE_LOOKUP_ATTEMPTS),
        "fetchOffset.retryIntervalMs": str(SOURCE_LOOKUP_RETRY_MS),
    }


def source(spark: SparkSession, settings: Settings, starting: str | None = None) -> DataFrame:
    """The source topic as a stream (source_options)."""
    return spark.readStream.format("kafka").options(**source_options(settings, starting)).load()


def empty_source(spark: SparkSession) -> DataFrame:
    """A source with the Kafka source's columns and no rows: an app's plan built without a broker."""
    return spark.createDataFrame([], SOURCE_SCHEMA)


def dlq_value(reason: Column, value: Column, cap: int) -> tuple[Column, Column, Column]:
    """The DLQ copy of a record's value, its original size, and its sha256 when the copy holds less than the
    original: capped at `cap` bytes, so a record near the broker's size limit still fits with its headers, and
    nothing at all for a quarantined record (its payload is what cannot be delivered)."""
    size = F.length(value)
    withheld = reason == wire.REASON_QUARANTINED
    short = withheld | (size > cap)
    copy = F.when(withheld, F.lit(None).cast("binary")).when(size > cap, F.substring(value, 1, cap)).otherwise(value)
    return copy, size, F.when(short, F.sha2(value, 256))


def output(
    transform: Callable[[DataFrame, Context], Results], raw: DataFrame, settings: Settings, quarantine: Sequence = ()
) -> DataFrame:
    """An app's output of `raw` (Spark's Kafka source columns) through its `transform` (App.transform) as
    OUTPUT_COLUMNS: its results, then its rejects as DLQ records with their provenance."""
    out = transform(raw, Context(settings, tuple(quarantine)))
    # a named output's rows carry its name (App.outputs); the sink's rows none
    named = [n for n in settings.outputs if n != MAIN_OUTPUT]
    routed = "output" in out.rows.columns
    if routed != bool(named):
        why = (
            f"it declares outputs {named} but its rows have no `output` column naming the one each goes to"
            if named
            else "its rows have an `output` column but it declares no outputs (App.outputs)"
        )
        raise ConfigError(f"app {settings.app}: {why}")
    output_name = F.col("output").cast("string") if routed else F.lit(None).cast("string")
    results = out.rows.select(
        F.lit(wire.KIND_RESULT).alias("kind"),
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("binary").alias("value"),
        F.lit(None).cast("int").alias("src_partition"),
        F.lit(None).cast("bigint").alias("src_offset"),
        F.lit(None).cast("bigint").alias("src_timestamp_ms"),
        F.lit(None).cast("string").alias("reason"),
        F.lit(None).cast("int").alias("src_size"),
        F.lit(None).cast("string").alias("src_sha256"),
        output_name.alias("output"),
        F.lit(None).cast("string").alias("src_topic"),
    )
    if out.rejects is None:
        return results
    copy, size, sha = dlq_value(F.col("reason"), F.col("value"), settings.dlq_max_value_bytes)
    dlq = out.rejects.select(
        F.lit(wire.KIND_DLQ).alias("kind"),
        F.concat_ws("|", F.col("topic"), F.col("partition").cast("string"), F.col("offset").cast("string")).alias(
            "key"
        ),
        copy.alias("value"),
        F.col("partition").alias("src_partition"),
        F.col("offset").alias("src_offset"),
        F.unix_millis(F.col("timestamp")).alias("src_timestamp_ms"),
        F.col("reason").cast("string").alias("reason"),
        size.alias("src_size"),
        sha.alias("src_sha256"),
        F.lit(None).cast("string").alias("output"),
        F.col("topic").cast("string").alias("src_topic"),
    )
    return results.unionByName(dlq)


def check_deterministic(app: App, frame: DataFrame) -> None:
    """Refuse an app whose results the proofs cannot hold to: declared non-deterministic, or whose plan Spark
    itself knows to be (rand(), uuid(), a non-deterministic UDF...). A replayed batch must write what its first
    attempt would have, and a recount must find it (onceflow.app.declaration)."""
    if not app.deterministic:
        raise ConfigError(
            f"app {app.name} is declared non-deterministic (App.deterministic=False): exactly-once replay and the "
            f"reconciliation need the same records to give the same results; make its transform deterministic"
        )
    if not frame._jdf.queryExecution().analyzed().deterministic():
        raise ConfigError(
            f"app {app.name}: its transform is not deterministic (Spark's plan holds a non-deterministic expression: "
            f"rand(), uuid(), monotonically_increasing_id(), a UDF marked non-deterministic...): exactly-once replay "
            f"and the reconciliation need the same records to give the same results"
        )
