"""Kafka as a Spark batch source: exactly the offsets [start, end) of one or more topics' partitions, as a DataFrame
(with headers)."""

from __future__ import annotations

import json

from pyspark.sql import DataFrame, SparkSession

from onceflow.config import Settings
from onceflow.rules import names, sources
from onceflow.rules.sources import SourcePartition


def kafka_options(settings: Settings) -> dict[str, str]:
    """Options every Spark Kafka reader of the platform sets: the cluster's security (the password inside the JAAS
    setting, which Spark redacts) and consumer groups named under the reader prefix its ACLs allow."""
    return {"groupIdPrefix": names.spark_group_prefix(settings.app_id)} | {
        f"kafka.{k}": v for k, v in settings.kafka_java_security().items()
    }


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
