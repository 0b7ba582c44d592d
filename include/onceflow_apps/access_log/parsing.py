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


def _let(value: Column, body) -> Column:
    """`body(v)` with `value` evaluated once: a lambda variable, which Spark never inlines (a plain column would be
    copied into every place that uses it)."""
    return F.element_at(F.transform(F.array(value), body), 1)


_V4_AT_END = r"^(.*):(" + R.IPV4 + r")\z"


def _embedded_v4_as_hex(low: Column) -> Column:
    """An IPv6 spelling ending in a dotted IPv4 (`::ffff:1.2.3.4`), with those 32 bits as two hex groups; the
    text as it is without a dot; null when the dotted part is not an IPv4 address."""

    def joined(v4: Column) -> Column:
        o = F.split(v4, r"\.")

        def group(a: int, b: int) -> Column:
            return F.lower(F.hex(o[a].cast("int") * 256 + o[b].cast("int")))

        head = low.substr(F.lit(1), F.length(low) - F.length(v4))  # up to and with the last ':'
        return F.when(v4 != "", F.concat(head, group(0, 1), F.lit(":"), group(2, 3)))

    return F.when(~low.contains("."), low).otherwise(_let(F.regexp_extract(low, _V4_AT_END, 2), joined))


def _ipv6_groups(s6: Column) -> Column:
    """The eight 16-bit groups of an IPv6 text (`::` expanded) as integers; null when it is not one."""
    empty = F.array().cast("array<string>")

    def expanded(halves: Column) -> Column:
        left = F.when(halves[0] == "", empty).otherwise(F.split(halves[0], ":"))
        right = F.when(halves[1] == "", empty).otherwise(F.split(halves[1], ":"))
        return _let(
            F.size(left) + F.size(right),
            lambda n: F.when(n <= 7, F.concat(left, F.array_repeat(F.lit("0"), 8 - n), right)),
        )

    def checked(groups: Column) -> Column:
        valid = (F.size(groups) == 8) & F.forall(groups, lambda g: g.rlike(r"^[0-9a-f]{1,4}\z"))
        return F.when(valid, F.transform(groups, lambda g: F.conv(g, 16, 10).cast("int")))

    groups = _let(
        F.split(s6, "::"), lambda h: F.when(F.size(h) == 1, F.split(s6, ":")).when(F.size(h) == 2, expanded(h))
    )
    return F.when(s6.rlike(r"^[0-9a-f:]+\z"), _let(groups, checked))


def _render_ipv6(groups: Column) -> Column:
    """RFC 5952 text of eight groups (the same rule as records.canonical_ip)."""
    return _let(groups, _render)


def _render(v: Column) -> Column:
    def step(acc: Column, i: Column) -> Column:  # the longest run of zero groups, the first of equal ones
        run = F.when(F.element_at(v, i + 1) == 0, acc["run"] + 1).otherwise(F.lit(0))
        better = run > acc["len"]
        return F.struct(
            F.when(better, i - run + 1).otherwise(acc["best"]).alias("best"),
            F.when(better, run).otherwise(acc["len"]).alias("len"),
            run.alias("run"),
        )

    def text(zeros: Column) -> Column:
        best, length = zeros["best"], zeros["len"]
        hexes = F.transform(v, lambda x: F.lower(F.hex(x)))
        compressed = F.concat(
            F.array_join(F.slice(hexes, F.lit(1), best), ":"),
            F.lit("::"),
            F.array_join(F.slice(hexes, best + length + 1, 8 - best - length), ":"),
        )
        mapped = (F.slice(v, 1, 5) == F.array(*[F.lit(0)] * 5)) & (v[5] == 0xFFFF)
        dotted = F.concat_ws(".", F.shiftright(v[6], 8), v[6] % 256, F.shiftright(v[7], 8), v[7] % 256)
        return (
            F.when(mapped, F.concat(F.lit("::ffff:"), dotted))
            .when(length < 2, F.array_join(hexes, ":"))
            .otherwise(compressed)
        )

    start = F.struct(F.lit(0).alias("best"), F.lit(0).alias("len"), F.lit(0).alias("run"))
    return _let(F.aggregate(F.sequence(F.lit(0), F.lit(7)), start, step), text)


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
    text, is_json, js, line_ok = F.col("_text"), F.col("_is_json"), F.col("_js"), F.col("_line_ok")
    # A line that matches: its IP is its first field, its time the 26 characters inside the `[...]` after the
    # third space (the fields before it hold no space); one match of the line's regex, not one per group.
    staged = (
        df.withColumn("_text", F.trim(F.col("value").cast("string")))
        .withColumn("_is_json", F.coalesce(F.col("_text").startswith("{"), F.lit(False)))
        .withColumn("_js", F.when(is_json, F.from_json(text, JSON_SCHEMA, JSON_OPTIONS)))
        .withColumn("_line_ok", ~is_json & F.coalesce(text.rlike(LINE_RE), F.lit(False)))
        .withColumn("_line_ip", F.when(line_ok, F.substring_index(text, " ", 1)))
        .withColumn("_line_ts", F.when(line_ok, text.substr(F.length(F.substring_index(text, " ", 3)) + 3, F.lit(26))))
    )
    raw_ts = F.when(is_json, js["ts"]).otherwise(F.col("_line_ts"))
    # The IP's canonical text (records.canonical_ip): IPv4 as it is, IPv6 already in canonical form as it is, any
    # other IPv6 spelling through its eight groups, each step a column of its own so that Spark evaluates it once.
    low = F.col("_ipl")
    staged = (
        staged.withColumn(
            "_ts",
            F.when(is_json, _ts_from_epoch_or_iso(raw_ts)).otherwise(
                F.try_to_timestamp(raw_ts, F.lit(R.COMBINED_TS_FORMAT))
            ),
        )
        .withColumn("_ipl", F.lower(F.when(is_json, js["ip"]).otherwise(F.col("_line_ip"))))
        .withColumn(
            "_ip",
            F.when(_full(low, "^" + R.IPV4), low)
            .when(_full(low, R.CANONICAL_IPV6), low)
            .when(
                low.contains(":"),
                _let(
                    _embedded_v4_as_hex(low),
                    lambda s6: _let(_ipv6_groups(s6), lambda g6: F.when(g6.isNotNull(), _render_ipv6(g6))),
                ),
            ),
        )
    )
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
        .drop("_text", "_is_json", "_js", "_line_ok", "_line_ip", "_line_ts", "_ts", "_ipl", "_ip")
    )
