"""The parsing rules of `onceflow_apps.access_log.rules` in a Spark plan: one compiled function per record.

`classify(df)` takes the Kafka source columns (value, topic, partition, offset, timestamp) and adds `ts` (event time,
timestamp) and `ip` (validated, canonical) for good records, or `reason` for malformed ones.

What a record's bytes say is decided by the rules compiled in Java (java/rules/dev/onceflow/accesslog/Rules.java,
called through the Spark function java/spark/.../ParseRecord.java; App.java puts them on every session's class path):
one call per record, which Spark cannot inline, copy into a filter or evaluate twice. Measured against the same rules
in Spark SQL built-ins (a JSON reader, a regex per line, Spark's timestamp parser, the IPv6 rule as lambdas Spark
interprets row by row): the job drained make bench's backlog 1.25 times as fast with a sixth less CPU, and a batch's
plan is a fraction of the size every task deserialises (docs/performance.md, "The parse in compiled code"). The
two rules that need more than the bytes, an operator's quarantine and the event time's limit ahead of its Kafka
timestamp, stay Spark expressions here: both vary by batch in a recount.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from onceflow.spark import jvm_functions
from onceflow_apps.access_log import rules as R

FUNCTION = "onceflow_access_log_parse"  # the session's name of the compiled rules


# what the compiled rules say of a record's bytes: ts_us and ip for a good record, reason for a malformed one
RESULT = StructType(
    [StructField("ts_us", LongType()), StructField("ip", StringType()), StructField("reason", StringType())]
)


def register(spark: SparkSession) -> str:
    """The compiled rules as the function FUNCTION of `spark`'s session, registered again, identically, on every call
    (a plan is built once per process). The regular expressions and limits come from rules.py, the one place they are
    stated."""
    rules = jvm_functions.java_class(spark, "dev.onceflow.accesslog.Rules")(
        R.COMBINED_RE, R.EPOCH_MS_RE, R.ISO_TS_RE, R.IPV4, R.MIN_TS_MS, R.MAX_TS_MS, R.MAX_RECORD_BYTES, -1
    )
    function = jvm_functions.java_class(spark, "dev.onceflow.accesslog.spark.ParseRecord")(rules)
    return jvm_functions.register(spark, FUNCTION, function, RESULT)


def quarantined(ranges: Sequence) -> Column:
    """True for the source records an operator quarantined (`ranges`: objects with partition, start, end and
    topic, None for the app's one source topic)."""
    hit = F.lit(False)
    for r in ranges:
        at = (F.col("partition") == r.partition) & (F.col("offset") >= r.start) & (F.col("offset") < r.end)
        hit = hit | (at if getattr(r, "topic", None) is None else at & (F.col("topic") == r.topic))
    return hit


def classify(df: DataFrame, max_ahead_ms: int | Column | None = None, quarantine: Sequence = ()) -> DataFrame:
    """Adds `ts`, `ip` (both null unless the record is good) and `reason` (null when it is good), as rules.parse
    decides.

    `max_ahead_ms` (a number, or a column when it varies by batch): an event time more than this after the
    record's Kafka `timestamp` is `timestamp_ahead`. `quarantine`: offset ranges an operator quarantined."""
    parsed = F.col("_parsed")
    staged = df.withColumn("_parsed", F.call_function(register(df.sparkSession), F.col("value")))
    ts = F.timestamp_micros(parsed["ts_us"])
    if max_ahead_ms is None:
        is_ahead = F.lit(False)
    else:
        limit = max_ahead_ms if isinstance(max_ahead_ms, Column) else F.lit(int(max_ahead_ms))
        is_ahead = F.coalesce(F.unix_millis(ts) > F.unix_millis(F.col("timestamp")) + limit, F.lit(False))
    reason = (
        F.when(quarantined(quarantine), R.REASON_QUARANTINED)
        .when(parsed["reason"].isNotNull(), parsed["reason"])
        .when(is_ahead, R.REASON_TS_AHEAD)
    )
    good = F.col("reason").isNull()
    return (
        staged.withColumn("reason", reason)
        .withColumn("ts", F.when(good, ts))
        .withColumn("ip", F.when(good, parsed["ip"]))
        .drop("_parsed")
    )
