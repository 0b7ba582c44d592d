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


def classify(df: DataFrame) -> DataFrame:
    text = F.col("_text")
    is_json = text.startswith("{")
    # JSON form: parse once into a struct; `ts` as a string keeps numbers as their literal text.
    js = F.from_json(text, "ts STRING, ip STRING, _corrupt STRING",
                     {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt", "allowSingleQuotes": "false"})
    json_ok = is_json & text.endswith("}") & js.isNotNull() & js["_corrupt"].isNull()
    line = F.regexp_extract(text, R.COMBINED_RE.removesuffix("$") + r"\z", 0)
    line_ok = ~is_json & (line != "")
    raw_ts = F.when(is_json, js["ts"]).otherwise(
        F.regexp_extract(text, R.COMBINED_RE.removesuffix("$") + r"\z", 2))
    raw_ip = F.when(is_json, js["ip"]).otherwise(
        F.regexp_extract(text, R.COMBINED_RE.removesuffix("$") + r"\z", 1))
    ts = F.when(is_json, _ts_from_epoch_or_iso(raw_ts)).otherwise(
        F.try_to_timestamp(raw_ts, F.lit(R.COMBINED_TS_FORMAT)))
    ts_ms = F.unix_millis(F.col("ts"))
    size = F.length(F.col("value"))
    reason = (
        F.when(F.col("value").isNull() | (size == 0), R.REASON_EMPTY)
        .when(size > R.MAX_RECORD_BYTES, R.REASON_TOO_LARGE)
        .when(~F.is_valid_utf8(F.col("value").cast("string")), R.REASON_NOT_UTF8)
        .when(is_json & ~json_ok, R.REASON_BAD_JSON)
        .when(~is_json & ~line_ok, R.REASON_UNRECOGNIZED)
        .when(F.col("ts").isNull(), R.REASON_BAD_TS)
        .when((ts_ms < R.MIN_TS_MS) | (ts_ms >= R.MAX_TS_MS), R.REASON_TS_RANGE)
        .when(F.col("ip").isNull(), R.REASON_BAD_IP)
    )
    return (df.withColumn("_text", F.trim(F.col("value").cast("string")))
              .withColumn("ts", ts)
              .withColumn("ip", _valid_ip(raw_ip))
              .withColumn("reason", reason)
              .drop("_text"))
