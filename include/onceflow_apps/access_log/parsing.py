"""The parsing rules of `onceflow_apps.access_log.rules`, expressed with Spark SQL built-ins (no Python UDF per record).

`classify(df)` takes the Kafka source columns (value, topic, partition, offset, timestamp) and adds
`ts` (event time, timestamp) and `ip` (validated, canonical) for good records, or `reason` for malformed ones.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from onceflow_apps.access_log import rules as R


def _full(col: Column, pattern: str) -> Column:
    # Java regex: `$` would also match before a final line terminator, `\z` does not.
    return col.rlike(pattern.removesuffix("$") + r"\z")


def _ts_from_epoch_or_iso(raw: Column) -> Column:
    epoch = F.when(_full(raw, R.EPOCH_MS_RE), F.timestamp_millis(raw.cast("bigint")))
    iso = F.when(_full(raw, R.ISO_TS_RE), F.try_to_timestamp(raw))
    return F.coalesce(epoch, iso)


_V4 = R.IPV4 + r"\z"
_V4_AT_END = r"^(.*):(" + R.IPV4 + r")\z"
_EIGHT_GROUPS = r"^([0-9a-f]{1,4}:){7}[0-9a-f]{1,4}\z"


def _groups(text: Column) -> Column:
    """How many ':'-separated groups `text` (one side of a `::`) holds: none when it is empty."""
    return F.when(text == "", 0).otherwise(F.size(F.split(text, ":")))


def _ipv6_stages(df: DataFrame, low: Column, is_v4: Column) -> DataFrame:
    """Adds `_ip6`: the canonical text of `low` (lower-cased) when it is an IPv6 address, else null; the rule of
    rules.canonical_ip, in string functions Spark compiles: no lambda (Spark interprets higher-order functions
    row by row, and the eight groups through them cost about 30 us a record). Each stage is a column of its own,
    used more than once by the next, so that Spark evaluates it once."""
    six = ~is_v4 & low.contains(":")
    v4, hexed, x, s, padded = (F.col(c) for c in ("_v4tail", "_hexed", "_v6x", "_v6s", "_v6p"))
    # a dotted IPv4 ending the text: its 32 bits as two hex groups (null when the dotted part is no IPv4)
    df = df.withColumn("_v4tail", F.when(six & low.contains("."), F.regexp_extract(low, _V4_AT_END, 2)))
    df = df.withColumn("_octets", F.split(v4, r"\."))
    octets = F.col("_octets")
    o = [octets[i].cast("int") for i in range(4)]
    as_hex = F.concat(
        low.substr(F.lit(1), F.length(low) - F.length(v4)),
        F.format_string("%x:%x", o[0] * 256 + o[1], o[2] * 256 + o[3]),
    )
    df = df.withColumn(
        "_hexed",
        F.when(six & ~low.contains("."), low).when(six & (v4 != ""), as_hex),
    )
    # `::` expanded to the zero groups it stands for; a text with two `::` or more than seven groups beside one
    # is left as it is, and fails the check below
    df = df.withColumn("_halves", F.split(hexed, "::"))
    halves = F.col("_halves")
    left, right = halves[0], halves[1]
    df = df.withColumn("_missing", F.when(F.size(halves) == 2, 8 - _groups(left) - _groups(right)))
    missing = F.col("_missing")
    zeros = F.repeat(F.lit("0:"), missing).substr(F.lit(1), 2 * missing - 1)
    expanded = F.when(
        missing >= 1,
        F.concat_ws(":", F.when(left != "", left), zeros, F.when(right != "", right)),
    ).otherwise(hexed)
    df = df.withColumn("_v6x", expanded)
    # eight groups of one to four hex digits, each without its leading zeros
    df = df.withColumn("_v6s", F.when(x.rlike(_EIGHT_GROUPS), F.regexp_replace(x, "(^|:)0+([0-9a-f])", "$1$2")))
    df = df.withColumn("_v6p", F.concat(F.lit(":"), s, F.lit(":")))
    # RFC 5952: the longest run of two or more zero groups (the first of equally long ones) is written `::`; an
    # IPv4-mapped address keeps its last 32 bits dotted
    longest = F.lit(None).cast("int")
    for n in range(2, 9):
        longest = F.when(F.locate(":" + "0:" * n, padded) > 0, n).otherwise(longest)
    df = df.withColumn("_zrun", F.when(s.isNotNull(), longest))
    zrun = F.col("_zrun")
    df = df.withColumn("_zat", F.position(F.concat(F.lit(":"), F.repeat(F.lit("0:"), zrun)), padded))
    at, after = F.col("_zat"), F.col("_zat") + 2 * zrun + 1
    compressed = F.concat(padded.substr(F.lit(2), at - 2), F.lit("::"), padded.substr(after, F.length(padded) - after))
    mapped = s.startswith("0:0:0:0:0:ffff:")
    df = df.withColumn(
        "_g6", F.when(mapped, F.conv(F.substring_index(F.substring_index(s, ":", -2), ":", 1), 16, 10).cast("int"))
    )
    df = df.withColumn("_g7", F.when(mapped, F.conv(F.substring_index(s, ":", -1), 16, 10).cast("int")))
    g6, g7 = F.col("_g6"), F.col("_g7")
    dotted = F.format_string("%d.%d.%d.%d", F.shiftright(g6, 8), g6 % 256, F.shiftright(g7, 8), g7 % 256)
    rendered = F.when(g6.isNotNull(), F.concat(F.lit("::ffff:"), dotted)).when(zrun.isNotNull(), compressed)
    return df.withColumn("_ip6", rendered.otherwise(s))


LINE_RE = R.COMBINED_RE.removesuffix("$") + r"\z"
JSON_SCHEMA = "ts STRING, ip STRING, _corrupt STRING"
JSON_OPTIONS = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt", "allowSingleQuotes": "false"}


def quarantined(ranges: Sequence) -> Column:
    """True for the source records an operator quarantined (`ranges`: objects with partition, start, end and
    topic, None for the app's one source topic)."""
    hit = F.lit(False)
    for r in ranges:
        at = (F.col("partition") == r.partition) & (F.col("offset") >= r.start) & (F.col("offset") < r.end)
        hit = hit | (at if getattr(r, "topic", None) is None else at & (F.col("topic") == r.topic))
    return hit


def classify(df: DataFrame, max_ahead_ms: int | Column | None = None, quarantine: Sequence = ()) -> DataFrame:
    """Adds `ts`, `ip` (both null unless the record is good) and `reason` (null when it is good).

    `max_ahead_ms` (a number, or a column when it varies by batch): an event time more than this after the
    record's Kafka `timestamp` is `timestamp_ahead`. `quarantine`: offset ranges an operator quarantined.

    Built in stages, one column per expensive step (JSON parse, line regex, timestamp rule, IP rule), each
    referenced more than once by the next stage: Spark then keeps the stages apart instead of inlining a step
    into every place that uses it (inside CASE branches it would be evaluated once per occurrence; inlined, the
    parse ran about ten times per record)."""
    text, is_json, js = F.col("_text"), F.col("_is_json"), F.col("_js")
    staged = (
        df.withColumn("_text", F.trim(F.col("value").cast("string")))
        .withColumn("_is_json", F.coalesce(F.col("_text").startswith("{"), F.lit(False)))
        .withColumn("_js", F.when(is_json, F.from_json(text, JSON_SCHEMA, JSON_OPTIONS)))
        .withColumn("_line_ok", ~is_json & F.coalesce(text.rlike(LINE_RE), F.lit(False)))
    )
    # A line that matches: its IP is its first field, its time the 26 characters inside the `[...]` after the
    # third space (the fields before it hold no space); one match of the line's regex, not one per group.
    line_ok = F.col("_line_ok")
    staged = staged.withColumn("_line_ip", F.when(line_ok, F.substring_index(text, " ", 1))).withColumn(
        "_line_ts", F.when(line_ok, text.substr(F.length(F.substring_index(text, " ", 3)) + 3, F.lit(26)))
    )
    raw_ts = F.when(is_json, js["ts"]).otherwise(F.col("_line_ts"))
    # The IP's canonical text (records.canonical_ip): IPv4 as it is, IPv6 through its eight groups, each step a
    # column of its own so that Spark evaluates it once.
    low = F.col("_ipl")
    staged = staged.withColumn(
        "_ts",
        F.when(is_json, _ts_from_epoch_or_iso(raw_ts)).otherwise(
            F.try_to_timestamp(raw_ts, F.lit(R.COMBINED_TS_FORMAT))
        ),
    )
    staged = staged.withColumn("_ipl", F.lower(F.when(is_json, js["ip"]).otherwise(F.col("_line_ip"))))
    staged = staged.withColumn("_is_v4", F.coalesce(low.rlike("^" + _V4), F.lit(False)))
    staged = _ipv6_stages(staged, low, F.col("_is_v4"))
    staged = staged.withColumn("_ip", F.when(F.col("_is_v4"), low).otherwise(F.col("_ip6")))
    json_ok = is_json & text.endswith("}") & js.isNotNull() & js["_corrupt"].isNull()
    ts_ms = F.unix_millis(F.col("_ts"))
    size = F.length(F.col("value"))
    if max_ahead_ms is None:
        is_ahead = F.lit(False)
    else:
        limit = max_ahead_ms if isinstance(max_ahead_ms, Column) else F.lit(int(max_ahead_ms))
        is_ahead = F.coalesce(ts_ms > F.unix_millis(F.col("timestamp")) + limit, F.lit(False))
    reason = (
        F.when(quarantined(quarantine), R.REASON_QUARANTINED)
        .when(F.col("value").isNull() | (size == 0), R.REASON_EMPTY)
        .when(size > R.MAX_RECORD_BYTES, R.REASON_TOO_LARGE)
        .when(~F.is_valid_utf8(F.col("value").cast("string")), R.REASON_NOT_UTF8)
        .when(is_json & ~json_ok, R.REASON_BAD_JSON)
        .when(~is_json & ~line_ok, R.REASON_UNRECOGNIZED)
        .when(F.col("_ts").isNull(), R.REASON_BAD_TS)
        .when((ts_ms < R.MIN_TS_MS) | (ts_ms >= R.MAX_TS_MS), R.REASON_TS_RANGE)
        .when(F.col("_ip").isNull(), R.REASON_BAD_IP)
        .when(is_ahead, R.REASON_TS_AHEAD)
    )
    good = F.col("reason").isNull()
    return (
        staged.withColumn("reason", reason)
        .withColumn("ts", F.when(good, F.col("_ts")))
        .withColumn("ip", F.when(good, F.col("_ip")))
        .drop(*[c for c in staged.columns if c not in df.columns])
    )
