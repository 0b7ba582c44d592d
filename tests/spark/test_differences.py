"""How the proofs list their differences (onceflow.spark.differences, the replay's and ip_count's reference checks'):
every kind counted in one pass with the check's figures, the rows of a kind capped, a kind with none listed empty."""

from pyspark.sql import functions as F

from onceflow.spark.differences import CAP, listed


def test_each_kind_is_counted_in_full_listed_up_to_the_cap_and_empty_where_there_is_none(spark):
    rows = [(f"dup{i}", 2, 1) for i in range(CAP + 20)] + [("lost", None, 3), ("fine", 1, 1), ("also", 1, 1)]
    j = spark.createDataFrame(rows, "key string, times long, expected long")
    times = F.col("times")
    diffs, figs = listed(
        j,
        {
            "duplicates": (times > 1, ["key", "times"]),
            "missing": (times.isNull(), ["key", "expected"]),
            "unexpected": (F.col("expected").isNull(), ["key"]),
        },
        F.count("expected").alias("expected_keys"),
        F.sum("times").alias("sink_records"),
    )
    assert figs["duplicates"] == CAP + 20 and len(diffs["duplicates"]) == CAP
    assert all(d["times"] == 2 and d["key"].startswith("dup") for d in diffs["duplicates"])
    # a null condition (times unknown) is no difference of that kind, as in a `where`
    assert diffs["missing"] == [{"key": "lost", "expected": 3}] and figs["missing"] == 1
    assert diffs["unexpected"] == [] and figs["unexpected"] == 0
    assert (figs["expected_keys"], figs["sink_records"]) == (len(rows), 2 * (CAP + 20) + 2)
