"""The records committed batches wrote, read back with Spark: a time-bounded read of a topic (the batches' commit
times, with slack), filtered by the batch header. The reconciliation's checks and the replay proof read the sink and
the DLQ this way."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from onceflow import wire
from onceflow.config import Settings
from onceflow.kafka import reading as kafka_reading
from onceflow.rules.ledger import LedgerEntry
from onceflow.rules.reconciliation import ReconcileError
from onceflow.spark import kafka_source

MARGIN_MS = 60_000  # clock slack when finding a batch's records in the sink and DLQ by time


def offsets_at(settings: Settings, topic: str, ts_ms: int | None) -> dict[int, int]:
    """Per partition, the first offset at or after `ts_ms` (the end of the log when there is none; the
    start when ts_ms is None)."""
    wm = kafka_reading.watermarks(settings, topic)
    if wm is None:
        raise ReconcileError(f"topic {topic} does not exist")
    if ts_ms is None:
        return {p: lo for p, (lo, _) in wm.items()}
    return kafka_reading.offsets_at(settings, topic, ts_ms, {p: hi for p, (_, hi) in wm.items()})


def header(name: str):
    """A record header's value as a string column (null when the record has none)."""
    return F.expr(f"cast(filter(headers, h -> h.key = '{name}')[0].value as string)")


def bounded(
    spark: SparkSession,
    settings: Settings,
    topic: str,
    selected: list[LedgerEntry],
    all_entries: list[LedgerEntry],
    isolation: str = "read_committed",
) -> DataFrame:
    """The records of `topic` written by the batches `selected`: a time-bounded read (their commit times, with
    slack), then filtered by the batch header; records with no onceflow batch header (written by something
    else) are kept with batch null."""
    by_batch = {e.batch: e for e in all_entries}
    a, b = selected[0].batch, selected[-1].batch
    before = by_batch.get(a - 1)
    t0 = (before.commit_time_ms - MARGIN_MS) if before else None
    start = offsets_at(settings, topic, t0)
    end = offsets_at(settings, topic, selected[-1].commit_time_ms + MARGIN_MS)
    df = kafka_source.read_range(spark, settings, topic, start, end, isolation)
    batch = header(wire.H_BATCH).cast("long")
    return (
        df.withColumn("batch", batch)
        .withColumn("app", header(wire.H_APP))
        .where(F.col("batch").isNull() | F.col("batch").between(a, b))
    )
