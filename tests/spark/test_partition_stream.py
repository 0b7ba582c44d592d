"""onceflow.spark.partition_stream against local Spark: every row once, in partition order, empty partitions and
an early stop included; its memory bound is shown by the cluster test's two-million-window batch."""

from onceflow.spark import partition_stream


def computed_at_ms():
    """When each row is computed, read from the JVM's clock in the executor (a Python UDF would need pyarrow in the
    workers' interpreter); each row sleeps a little first, so a partition computed later is seen later."""
    from pyspark.sql import functions as F

    return F.expr(
        "length(reflect('java.lang.Thread', 'sleep', cast(20 as bigint))) * 0 "
        "+ cast(reflect('java.lang.System', 'currentTimeMillis') as bigint)"
    )


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


def test_a_materialised_frame_is_computed_before_it_is_streamed(spark):
    """The exactly-once writer opens its transaction inside `materialised`: every partition must be computed by
    then (the driver's first-row trick left all but the first partition, and the whole DLQ branch, to run inside
    the transaction, review N-5); streaming afterwards reads what was stored and computes nothing again."""
    import time

    df = spark.range(0, 12, 1, 6).select("id", computed_at_ms().alias("at_ms"))
    with partition_stream.materialised(df) as stored:
        opened_ms = time.time() * 1000  # where the transaction begins
        got = list(partition_stream.Stored(stored, tuple))
    assert stored.count == 12 and sorted(i for i, _ in got) == list(range(12))
    assert max(at for _, at in got) < opened_ms, "a partition was computed after the transaction opened"


def test_stored_rows_read_twice_are_the_same_rows_not_computed_again(spark):
    """The writer's second attempt after an unknown outcome iterates the batch's rows again
    (onceflow.protocol.exactly_once): they come from the stored partitions, so a row's compute time is the same in
    both reads (computed again, it would be later: each row sleeps first)."""
    df = spark.range(0, 12, 1, 6).select("id", computed_at_ms().alias("at_ms"))
    with partition_stream.materialised(df) as m:
        stored = partition_stream.Stored(m, lambda t: {"id": t[0], "at_ms": t[1]})
        first = list(stored)
        second = list(stored)
    assert len(first) == 12 and first == second


def _jobs_started(spark) -> int:
    return spark.sparkContext._jsc.sc().dagScheduler().nextJobId()  # the id the next job will get


def _tasks(spark, first_job: int) -> int:
    """The tasks of the jobs started since `first_job` (the status tracker keeps finished jobs' stages)."""
    tracker = spark.sparkContext.statusTracker()
    jobs = [tracker.getJobInfo(j) for j in range(first_job, _jobs_started(spark))]
    return sum(tracker.getStageInfo(s).numTasks for job in jobs for s in job.stageIds)


def test_a_small_stored_output_comes_in_one_task_a_large_one_per_partition_an_empty_one_in_none(spark, monkeypatch):
    """A job per partition, or a task per partition, costs the scheduler and each task (which deserialises the
    batch's plan) more than a quiet batch's few rows: up to WHOLE_ROWS the writer's rows come in one Spark job of
    one task, read from the stored partitions; above it a partition at a time (the driver's memory stays flat).
    The count that stores them is one job of a task per partition, with no second stage merging the counts."""
    df = spark.range(0, 40, 1, 8).select("id", computed_at_ms().alias("at_ms"))
    before = _jobs_started(spark)
    with partition_stream.materialised(df) as stored:
        counted, count_tasks = _jobs_started(spark) - before, _tasks(spark, before)
        before = _jobs_started(spark)
        small = list(partition_stream.Stored(stored, tuple))
        one, one_task = _jobs_started(spark) - before, _tasks(spark, before)
        monkeypatch.setattr(partition_stream, "WHOLE_ROWS", stored.count - 1)
        before = _jobs_started(spark)
        large = list(partition_stream.Stored(stored, tuple))
        per_partition = _jobs_started(spark) - before
    assert [i for i, _ in small] == list(range(40)) and stored.count == 40
    assert small == large, "the stored rows were computed again (a row's compute time moved)"
    assert (counted, count_tasks) == (1, 8), "the count ran more than one stage of a task per partition"
    assert (one, one_task, per_partition) == (1, 1, 8)
    empty = spark.range(0, 0, 1, 4)
    with partition_stream.materialised(empty) as stored:
        before = _jobs_started(spark)
        assert stored.count == 0 and list(partition_stream.Stored(stored, tuple)) == []
        assert _jobs_started(spark) == before


def test_a_frame_planned_before_it_is_materialised_is_still_read_from_its_stored_partitions(spark):
    """The count and the reads use a plan made after the frame was cached: a frame whose own plan was made before
    (explained, executed once) is not computed again by them."""
    df = spark.range(0, 12, 1, 6).select("id", computed_at_ms().alias("at_ms"))
    df._jdf.queryExecution().executedPlan()  # planned before the cache exists: its own plan computes
    with partition_stream.materialised(df) as m:
        first = list(partition_stream.Stored(m, tuple))
        second = list(partition_stream.Stored(m, tuple))
    assert len(first) == 12 and first == second


def test_a_collected_frame_is_computed_in_one_job_before_it_returns_and_read_again_without_compute(spark):
    """A small output (the exactly-once writer's bound) comes whole, in one Spark job of a task per partition (no
    store, no second job reading it back): computed before the transaction opens, as a stored one is, and the same
    rows on a second read (the writer's second attempt), not computed again."""
    import time

    df = spark.range(0, 12, 1, 6).select("id", computed_at_ms().alias("at_ms"))
    before = _jobs_started(spark)
    out = partition_stream.collected(df, tuple)
    opened_ms = time.time() * 1000  # where the transaction begins
    first, second = list(out), list(out)
    assert (_jobs_started(spark) - before, _tasks(spark, before)) == (1, 6)
    assert first == second == [tuple(r) for r in first] and [i for i, _ in first] == list(range(12))
    assert max(at for _, at in first) < opened_ms, "a partition was computed after the transaction opened"
    assert list(partition_stream.collected(spark.range(0, 0, 1, 3), tuple)) == []
