"""The parsing rules of `onceflow.records`, expressed with Spark SQL built-ins (no Python UDF per record).

`classify(df)` takes the Kafka source columns (value, topic, partition, offset, timestamp) and adds
`ts` (event time, timestamp) and `ip` (validated, lower-cased) for good records, or `reason` for malformed ones.
"""
from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from . import records as R


def _full(col: Column, pattern: str) -> Column:
    # Java regex: `$` would also match before a final line terminator, `\z` does not.
    return col.rlike(pattern.removesuffix("$") + r"\z")


def _ts_from_epoch_or_iso(raw: Column) -> Column:
    epoch = F.when(_full(raw, R.EPOCH_MS_RE), F.timestamp_millis(raw.cast("bigint")))
    iso = F.when(_full(raw, R.ISO_TS_RE), F.try_to_timestamp(raw))
    return F.coalesce(epoch, iso)


def _valid_ip(raw: Column) -> Column:
    low = F.lower(raw)
    return F.when(_full(low, R.IP_RE), low)


LINE_RE = R.COMBINED_RE.removesuffix("$") + r"\z"
JSON_SCHEMA = "ts STRING, ip STRING, _corrupt STRING"
JSON_OPTIONS = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt", "allowSingleQuotes": "false"}


def classify(df: DataFrame) -> DataFrame:
    """Adds `ts`, `ip` (both null unless the record is good) and `reason` (null when it is good).

    Built in stages, one column per expensive step (JSON parse, line regex, timestamp rule, IP rule), each
    referenced more than once by the next stage: Spark then keeps the stages apart instead of inlining a step
    into every place that uses it (inside CASE branches it would be evaluated once per occurrence; inlined, the
    parse ran about ten times per record)."""
    text, is_json, js = F.col("_text"), F.col("_is_json"), F.col("_js")
    staged = (df.withColumn("_text", F.trim(F.col("value").cast("string")))
                .withColumn("_is_json", F.coalesce(F.col("_text").startswith("{"), F.lit(False)))
                .withColumn("_js", F.when(is_json, F.from_json(text, JSON_SCHEMA, JSON_OPTIONS)))
                .withColumn("_line_ip", F.when(~is_json, F.regexp_extract(text, LINE_RE, 1)))
                .withColumn("_line_ts", F.when(~is_json, F.regexp_extract(text, LINE_RE, 2))))
    raw_ts = F.when(is_json, js["ts"]).otherwise(F.col("_line_ts"))
    staged = (staged.withColumn("_ts", F.when(is_json, _ts_from_epoch_or_iso(raw_ts))
                                       .otherwise(F.try_to_timestamp(raw_ts, F.lit(R.COMBINED_TS_FORMAT))))
                    .withColumn("_ip", _valid_ip(F.when(is_json, js["ip"]).otherwise(F.col("_line_ip")))))
    json_ok = is_json & text.endswith("}") & js.isNotNull() & js["_corrupt"].isNull()
    line_ok = ~is_json & (F.col("_line_ts") != "")
    ts_ms = F.unix_millis(F.col("_ts"))
    size = F.length(F.col("value"))
    reason = (
        F.when(F.col("value").isNull() | (size == 0), R.REASON_EMPTY)
        .when(size > R.MAX_RECORD_BYTES, R.REASON_TOO_LARGE)
        .when(~F.is_valid_utf8(F.col("value").cast("string")), R.REASON_NOT_UTF8)
        .when(is_json & ~json_ok, R.REASON_BAD_JSON)
        .when(~is_json & ~line_ok, R.REASON_UNRECOGNIZED)
        .when(F.col("_ts").isNull(), R.REASON_BAD_TS)
        .when((ts_ms < R.MIN_TS_MS) | (ts_ms >= R.MAX_TS_MS), R.REASON_TS_RANGE)
        .when(F.col("_ip").isNull(), R.REASON_BAD_IP)
    )
    good = F.col("reason").isNull()
    return (staged.withColumn("reason", reason)
                  .withColumn("ts", F.when(good, F.col("_ts")))
                  .withColumn("ip", F.when(good, F.col("_ip")))
                  .drop("_text", "_is_json", "_js", "_line_ip", "_line_ts", "_ts", "_ip"))
