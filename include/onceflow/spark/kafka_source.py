"""Kafka as a Spark batch source: exactly the offsets [start, end) of one or more topics' partitions, as a DataFrame
(with headers)."""

from __future__ import annotations

import json

from pyspark.sql import DataFrame, SparkSession

from onceflow.config import Settings
from onceflow.rules import names, sources
from onceflow.rules.sources import SourcePartition

# How long the broker may hold a read's fetch that finds nothing. Spark never polls for records it has not planned,
# but its read task asks the partition's offset range after each poll, and a poll that drained the log has sent the
# consumer's next fetch ahead, at the log's end. A broker answers one request per connection at a time, so the
# lookup waits for that fetch: until the partition's next record arrives, or Kafka's default 500 ms. On a live feed
# 8 of 810 read tasks waited out the 500 ms and made the stream's slowest batches (docs/performance.md, "The slow
# batches that remain"). A held fetch that returns empty early costs one request: the consumer sends no other until
# a task polls again.
FETCH_MAX_WAIT_MS = 10


def kafka_options(settings: Settings) -> dict[str, str]:
    """Options every Spark Kafka reader of the platform sets: the cluster's security (the password inside the JAAS
    setting, which Spark redacts), consumer groups named under the reader prefix its ACLs allow, and a short hold on
    a fetch that finds nothing (FETCH_MAX_WAIT_MS)."""
    return {
        "groupIdPrefix": names.spark_group_prefix(settings.app_id),
        "kafka.fetch.max.wait.ms": str(FETCH_MAX_WAIT_MS),
    } | {f"kafka.{k}": v for k, v in settings.kafka_java_security().items()}


def read_range(
    spark: SparkSession,
    settings: Settings,
    topic: str,
    start: dict[int, int],
    end: dict[int, int],
    isolation: str = "read_committed",
) -> DataFrame:
    """Exactly the offsets [start, end) of `topic` as a batch DataFrame (with headers)."""
    return read_ranges(spark, settings, sources.on_topic(topic, start), sources.on_topic(topic, end), isolation)


def read_ranges(
    spark: SparkSession,
    settings: Settings,
    start: dict[SourcePartition, int],
    end: dict[SourcePartition, int],
    isolation: str = "read_committed",
) -> DataFrame:
    """Exactly the offsets [start, end) of each source partition (of one or more topics) as a batch DataFrame (with
    headers)."""
    parts = sorted(p for p in start if end.get(p, 0) > start[p])
    if not parts:
        return spark.createDataFrame(
            [],
            "key binary, value binary, topic string, partition int, offset long, "
            "timestamp timestamp, timestampType int, "
            "headers array<struct<key:string,value:binary>>",
        )
    assign: dict[str, list[int]] = {}
    for p in parts:
        assign.setdefault(p.topic, []).append(p.partition)
    return (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", settings.bootstrap_servers)
        .options(**kafka_options(settings))
        .option("assign", json.dumps(assign))
        .option("startingOffsets", json.dumps(sources.offsets_to_json({p: start[p] for p in parts})))
        .option("endingOffsets", json.dumps(sources.offsets_to_json({p: end[p] for p in parts})))
        .option("kafka.isolation.level", isolation)
        .option("includeHeaders", "true")
        .option("failOnDataLoss", "true")
        .load()
    )
