"""The Spark SQL parsing (what the job runs) agrees with the reference parser, record for record."""

import json
import random
from datetime import UTC

import pytest

from onceflow_apps.access_log import parsing
from onceflow_apps.access_log import rules as R
from tests.support.records import corpus


def test_spark_matches_reference_on_corpus(spark):
    values = corpus()
    rows = parsing.classify(spark.createDataFrame([(v,) for v in values], "value binary")).collect()
    mismatches = []
    for v, r in zip(values, rows):
        ref = R.parse(v)
        got_ts = None
        if r.reason is None:
            got_ts = (
                int(r.ts.replace(tzinfo=UTC).timestamp() * 1_000_000)
                if r.ts.tzinfo is None
                else int(r.ts.timestamp() * 1_000_000)
            )
        got = (r.reason, got_ts if r.reason is None else None, r.ip if r.reason is None else None)
        if got != (ref.reason, ref.ts_us, ref.ip):
            mismatches.append((v[:80], got, (ref.reason, ref.ts_us, ref.ip)))
    assert not mismatches, mismatches[:10]
    reasons = {R.parse(v).reason for v in values}
    assert {
        None,
        R.REASON_BAD_JSON,
        R.REASON_BAD_IP,
        R.REASON_BAD_TS,
        R.REASON_UNRECOGNIZED,
        R.REASON_EMPTY,
        R.REASON_NOT_UTF8,
        R.REASON_TOO_LARGE,
        R.REASON_TS_RANGE,
    } <= reasons


def test_text_is_utf_8_exactly_as_python_decodes_it(spark):
    """The compiled rules check UTF-8 with a validator of their own (Utf8.java): every byte sequence is not_utf8
    exactly when Python's decoder refuses it (overlong forms, encoded surrogates, past U+10FFFF, cut short)."""
    rng = random.Random(17)
    leads = [0x80, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF]
    seconds = [0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0]

    def sequence() -> bytes:  # a lead byte, a second byte at a boundary of some lead's range, 0-2 more
        rest = [rng.choice([0x80, 0xBF, 0x41, 0xC0]) for _ in range(rng.randrange(3))]
        return bytes([rng.choice(leads), rng.choice(seconds), *rest])

    values = [b"a" + b"".join(sequence() for _ in range(rng.choice([1, 1, 2]))) + b"z" for _ in range(6000)]
    values += [v[:-1] for v in values[:500]] + [bytes([lead]) for lead in leads]  # cut short at the end
    rows = parsing.classify(spark.createDataFrame([(v,) for v in values], "value binary")).select("reason").collect()

    def refused(v: bytes) -> bool:
        try:
            v.decode("utf-8")
        except UnicodeDecodeError:
            return True
        return False

    wrong = [(v, r.reason) for v, r in zip(values, rows) if (r.reason == R.REASON_NOT_UTF8) != refused(v)]
    assert not wrong, wrong[:10]
    bad = sum(map(refused, values))
    assert bad > 1000 and len(values) - bad > 200  # both kinds, many of each


@pytest.mark.parametrize("ts_ms", [1795298400000, 1795298404999, 1795298405000])
def test_spark_window_agrees_at_boundaries(spark, ts_ms):
    from pyspark.sql import functions as F

    df = spark.createDataFrame([(json.dumps({"ts": ts_ms, "ip": "1.1.1.1"}).encode(),)], "value binary")
    w = parsing.classify(df).select(F.window("ts", "5 seconds").start.alias("s")).first().s
    assert int(w.replace(tzinfo=UTC).timestamp() * 1000) * 1000 == R.window_start_us(ts_ms * 1000, 5)


def _rate_source(spark):
    from pyspark.sql import functions as F

    return (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 10)
        .load()
        .select(
            F.col("value").cast("string").cast("binary").alias("value"),
            F.lit("t").alias("topic"),
            F.lit(0).alias("partition"),
            F.col("value").alias("offset"),
            F.col("timestamp"),
        )
    )


def test_the_streaming_plan_reads_and_parses_each_record_once(spark, tmp_path):
    """Spark inlines column aliases and pushes filters below projections; done naively that evaluated the parse
    about ten times per record (measured 3x slower). Spark reuses no scan either: each branch of the union
    (aggregation and DLQ) read and parsed the batch again. The job's plan must read the source and call the
    compiled rules once per record, the DLQ branch reading the aggregation branch's shuffle
    (onceflow.spark.read_once), with both filters kept above the watermark."""
    from onceflow import config
    from onceflow_apps import ip_count_plan as ip_count

    q = (
        ip_count.results_and_dlq(_rate_source(spark), config.load(env={}))
        .writeStream.foreachBatch(lambda df, _: df.count())
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(120)
    plan = q._jsq.streamingQuery().lastExecution().executedPlan().toString()
    assert plan.count("MicroBatchScan") == 1, plan
    assert plan.count("ReusedExchange") == 1, plan
    assert plan.count(f"{parsing.FUNCTION}(") == 1, plan
    above_watermarks = [part.rsplit("\n", 2)[-2] for part in plan.split("EventTimeWatermark")[:-1]]
    assert len(above_watermarks) == 2, plan
    assert any("Filter isnotnull(ts" in line for line in above_watermarks), plan
    assert any("Filter isnull(ts" in line for line in above_watermarks), plan


def test_the_rejects_of_a_batch_are_read_by_one_task(spark, tmp_path):
    """Every task of a micro-batch deserialises the batch's whole plan (its stateful operators' closures hold it),
    so a quiet batch's tasks cost more than its rows. The rejects, few, are read from every partition of the shared
    shuffle by one task: a batch's output has the state's partitions and one more, not those and the shared
    shuffle's."""
    from onceflow import config
    from onceflow_apps import ip_count_plan as ip_count

    seen: list[int] = []

    def batch(df, _batch_id):
        seen.append(df._jdf.queryExecution().toRdd().getNumPartitions())
        df.count()  # the batch runs (Spark refuses a batch whose state store was not committed)

    q = (
        ip_count.results_and_dlq(_rate_source(spark), config.load(env={}))
        .writeStream.foreachBatch(batch)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(120)
    state_partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    assert seen and set(seen) == {state_partitions + 1}, seen


def test_the_clock_and_quarantine_rules_agree_with_the_reference(spark):
    """An event time more than max_ahead_ms after the record's Kafka timestamp is `timestamp_ahead` (both ways of
    giving the limit: a number, or a per-batch column); an operator's quarantine wins over every other rule."""
    from datetime import datetime

    from pyspark.sql import functions as F

    from onceflow.rules.ledger import QuarantineRange

    rng = random.Random(5)
    rows = []
    for i, v in enumerate(corpus(n=300, seed=12)):
        ts = 1795298400000 + rng.randrange(-120_000, 10**7 + 120_000)
        rows.append((v, datetime.fromtimestamp(ts / 1000, tz=UTC), i % 3, i, ts))
    for i, ahead in enumerate((59_999, 60_000, 60_001, 365 * 86_400_000)):  # exactly at the limit and past it
        rows.append(
            (
                json.dumps({"ts": 1795298400000 + ahead, "ip": "1.2.3.4"}).encode(),
                datetime.fromtimestamp(1795298400000 / 1000, tz=UTC),
                0,
                10_000 + i,
                1795298400000,
            )
        )
    q = [QuarantineRange(1, 100, 110), QuarantineRange(2, 5, 6)]
    df = spark.createDataFrame(rows, "value binary, timestamp timestamp, partition int, offset long, rec_ms long")
    for limit in (60_000, F.lit(60_000).cast("long")):
        got = parsing.classify(df, limit, q).select("reason", "rec_ms", "partition", "offset").collect()
        mismatches = []
        for (v, _, part, off, rec_ms), r in zip(rows, got):
            held = any(x.partition == part and x.start <= off < x.end for x in q)
            ref = R.parse(v, rec_ms, 60_000, held)
            if r.reason != ref.reason:
                mismatches.append((v[:60], part, off, r.reason, ref.reason))
        assert not mismatches, mismatches[:10]
    reasons = [
        R.parse(v, ms, 60_000, any(x.partition == p and x.start <= o < x.end for x in q)).reason
        for v, _, p, o, ms in rows
    ]
    assert reasons[-4:] == [None, None, R.REASON_TS_AHEAD, R.REASON_TS_AHEAD]
    assert reasons.count(R.REASON_QUARANTINED) == 5 and reasons.count(R.REASON_TS_AHEAD) > 10


def test_spark_counts_every_ip_spelling_under_the_reference_key(spark):
    from tests.support.records import random_addresses, spellings

    rng, values = random_addresses(n=1500, seed=9)
    texts = [t for v in values for t in spellings(rng, v)]
    texts += [R.canonical_ip(t) for t in texts[::4]]  # the canonical text itself
    texts += [
        "2001:DB8:5::1",
        "2001:db8::1\n",
        "::ffff:102:304",
        "1.2.3.4",
        "01.2.3.4",
        "fe80::1%eth0",
        "1::2::3",
        ":::",
        "12345::1",
        "::1.2.3",
        "1.2.3.4::",
        "",
        None,
        "1:2:3:4:5:6:7:1.2.3.4",
        "::FFFF:1.2.3.4",
        "1:2:3:4:5:6:7::",
        "::2:3:4:5:6:7:8",
    ]
    rows = [(json.dumps({"ts": 1795298400000, "ip": t}).encode(),) for t in texts]
    got = parsing.classify(spark.createDataFrame(rows, "value binary")).select("ip", "reason").collect()
    mismatches = [(t, r.ip, R.canonical_ip(t)) for t, r in zip(texts, got) if r.ip != R.canonical_ip(t)]
    assert not mismatches, mismatches[:10]


def test_a_join_on_the_parse_s_window_plans_in_bounded_size(spark):
    """The reconciliation's carry-in (ip_count_reference.carry_in) groups the parsed source by window and joins the
    window key with a broadcast table (which batch emits each window). Spark's optimizer follows a join key down
    through every projection, inlining each alias (dynamic partition pruning's `trimAliases`), so a parse built as
    a chain of columns each used several times by the next grows that expression exponentially: an IPv6 rule
    written so (withdrawn, docs/performance.md) ran this plan's driver out of heap. The plan with the join must
    stay about the size of the parse's own. Optimized only: no job runs, no broker is asked."""
    from pyspark.sql import functions as F

    from onceflow import config, wire
    from onceflow.rules.ledger import LedgerEntry
    from onceflow.rules.sources import on_topic
    from onceflow_apps import ip_count_reference as ref

    settings = config.load(env={})
    entries = [LedgerEntry("ip_count", 0, on_topic("src", {0: (0, 10)}), 0, 0, 1, 0, 1.0, 0, wire.H_APP)]
    src = ref.classified_source(spark, settings, entries, entries)
    emission = spark.createDataFrame([(0, 1)], "window_start_ms long, emit_batch long")
    carry = (
        ref.contributions(src)
        .join(F.broadcast(emission), "window_start_ms", "left")
        .where(F.col("emit_batch").isNull() | (F.col("emit_batch") > 0))
    )

    def size(df):  # the optimized plan, no job run (nothing is read from Kafka)
        return len(df._jdf.queryExecution().optimizedPlan().toString())

    assert size(carry) < 2 * size(src), (size(carry), size(src))
