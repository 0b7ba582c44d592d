"""onceflow.spark.partition_stream against local Spark: every row once, in partition order, empty partitions and
an early stop included; its memory bound is shown by the cluster test's two-million-window batch."""

from onceflow.spark import partition_stream


def test_every_row_once_in_partition_order(spark):
    from pyspark.sql import functions as F

    df = spark.range(0, 1000, 1, 7).where(F.col("id") % 3 != 0).select("id", (F.col("id") * 2).alias("double"))
    got = [tuple(r) for r in partition_stream.rows(df)]
    assert got == [tuple(r) for r in df.collect()]
    assert [r["double"] for r in partition_stream.rows(df)][:3] == [2, 4, 8]  # Rows, by name too


def test_empty_partitions_and_an_empty_frame(spark):
    df = spark.range(0, 3, 1, 8)  # five of eight partitions are empty
    assert [r.id for r in partition_stream.rows(df)] == [0, 1, 2]
    assert list(partition_stream.rows(df.limit(0))) == []


def test_a_consumer_that_stops_early_leaves_nothing_behind(spark):
    it = partition_stream.rows(spark.range(0, 100, 1, 10))
    assert [next(it).id for _ in range(15)] == list(range(15))
    it.close()  # the prefetched partition is awaited and dropped
    assert [r.id for r in partition_stream.rows(spark.range(0, 4, 1, 2))] == [0, 1, 2, 3]


def test_arrow_tuples_are_the_rows(spark):
    from pyspark.sql import functions as F

    df = spark.range(0, 5000, 1, 7).select(
        F.lit("result").alias("kind"),
        F.concat(F.lit("k"), F.col("id").cast("string")).alias("key"),
        F.when(F.col("id") % 5 == 0, F.lit(None).cast("binary")).otherwise(F.col("id").cast("string").cast("binary")),
        F.when(F.col("id") % 3 == 0, F.col("id").cast("int")).alias("src_partition"),
    )
    assert list(partition_stream.tuples(df)) == [tuple(r) for r in df.collect()]
    assert list(partition_stream.tuples(df.limit(0))) == []
