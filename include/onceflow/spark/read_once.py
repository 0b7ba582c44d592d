"""Both branches of an event-time app (its windowed results and its rejects) from one read of the source per
micro-batch.

A transformation's results and rejects are two branches of one plan, each derived from the parsed source. Spark
reuses no scan: each branch reads the batch's records from Kafka and parses them again (measured on ip_count, the
second read and parse were about a third of the job's CPU). Spark does reuse a shuffle that appears twice in a
plan, so `branches` puts one behind the parse and both branches read from it. Two things would make the branches'
shuffles differ, and both are held off here:
- the optimizer pushes each branch's filter below a shuffle and into the parse: the branches split on the event
  time column (null exactly for the rejects), and a filter on the watermark's own column stays above the
  watermark, which sits above the shuffle;
- it prunes each branch's unused columns below a shuffle: every column but the event time and the shuffle's keys
  travels in one struct, which both branches use, and nested fields are not pruned through a watermark.

Rows whose event time is set carry only the result columns through the shuffle, not the record's value. In a
stream the rejects, few, are read by one task from every partition of the shared shuffle: a task per partition
deserialised the batch's whole plan for a handful of rows (docs/performance.md, "One task for the rejects"). A
backlog of mostly rejects (a producer gone wrong) has that one task read them all.
`tests/spark/test_access_log_parsing.py` checks the plan (one parse, the shuffle reused), so a Spark upgrade that
changes either rule shows up as a failing test, not as a slower job.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

_PACKED = "_once"


class Branches(NamedTuple):
    good: DataFrame  # the event time (watermarked) and the result columns, of the rows that have an event time
    rejects: DataFrame  # the reject columns of the rows that have none


def branches(
    parsed: DataFrame,
    *,
    event_time: str,
    delay: str,
    good: Sequence[str],
    rejects: Sequence[str],
    partitions: int,
    keys: Sequence[str] = ("partition", "offset"),
) -> Branches:
    """Split `parsed` (one row per source record, `event_time` null exactly for the records it rejects) into its
    watermarked good rows and its rejects, reading and parsing the source once per batch.

    delay: the watermark's delay (`withWatermark`'s, e.g. "5 seconds"); partitions: the shuffle's partitions
    (the job's shuffle partitions); keys: deterministic columns to hash the shuffle by (the source position: a
    replayed batch lands in the same partitions). A filter the app adds to `good` later that does not use the event
    time is pushed below the shuffle again: the plan is still correct, it reads twice."""
    reject = F.when(F.col(event_time).isNull(), F.struct(*rejects))
    once = parsed.select(
        event_time, *keys, F.struct(F.struct(*good).alias("good"), reject.alias("reject")).alias(_PACKED)
    )
    if parsed.isStreaming:  # a batch plan drops the watermark, and with it the filters' place: no shuffle to share
        once = once.repartition(partitions, *keys)
    once = once.withWatermark(event_time, delay)
    rejected = once.where(F.col(event_time).isNull()).select(f"{_PACKED}.reject.*")
    if parsed.isStreaming:
        rejected = rejected.coalesce(1)  # few rows, one task (above)
    return Branches(
        good=once.where(F.col(event_time).isNotNull()).select(event_time, f"{_PACKED}.good.*"), rejects=rejected
    )
