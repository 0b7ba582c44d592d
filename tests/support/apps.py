"""Apps declared for tests, found through ONCEFLOW_APP_REGISTRY=name=tests.support.apps:<attribute>."""

from __future__ import annotations

from onceflow.app import App, Context, Results


def _upper(raw, ctx: Context) -> Results:
    """A stateless app: each record's value upper-cased, keyed by its source position; empty values rejected."""
    from pyspark.sql import functions as F

    good = raw.where(F.length("value") > 0)
    rows = good.select(
        F.concat_ws("|", F.col("partition").cast("string"), F.col("offset").cast("string")).alias("key"),
        F.upper(F.col("value").cast("string")).alias("value"),
    )
    rejects = raw.where(F.length("value") == 0).select(
        "value", "topic", "partition", "offset", "timestamp", F.lit("empty").alias("reason")
    )
    return Results(rows=rows, rejects=rejects)


def _lucky(raw, ctx: Context) -> Results:
    from pyspark.sql import functions as F

    return Results(rows=raw.select(F.col("offset").cast("string").alias("key"), F.rand().cast("string").alias("value")))


upper = App(
    name="upper",
    transform=_upper,
    description="values upper-cased (stateless)",
    settings={"window_s": 7, "source_partitions": 2},
    event_time=False,
)
lucky = App(name="lucky", transform=_lucky)  # rand(): Spark knows it is not deterministic
unsure = App(name="unsure", transform=_upper, deterministic=False)
greedy = App(name="greedy", transform=_upper, settings={"bootstrap_servers": "elsewhere:9092"})
versioned = App(name="versioned", transform=_upper, rules_version=7)  # its rules changed six times
not_an_app = object()


# The registry of these apps, and two broken entries (a module attribute that is not an App; an App under another name)
REGISTRY = (
    ",".join(f"{n}=tests.support.apps:{n}" for n in ("upper", "lucky", "unsure", "greedy", "versioned"))
    + ",ghost=tests.support.apps:not_an_app,wrongname=tests.support.apps:upper"
)
