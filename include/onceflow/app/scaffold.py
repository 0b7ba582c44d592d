"""`onceflow app new NAME`: a new app's package, ready to install, with a test that passes (docs/apps.md).

The app it declares counts the source's records per Kafka key in tumbling event-time windows of the records'
Kafka timestamps, and rejects records without a key: a stateful, windowed plan with a DLQ, the shape most teams
start from. Its test builds the plan in a local Spark session, as the platform does, and checks the results, the
rejects and the determinism check.
"""

from __future__ import annotations

from pathlib import Path

from onceflow.app.declaration import AppError, check_name

PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "0.1.0"
description = "{name}: an exactly-once stream on onceflow"
requires-python = ">=3.11"

# how onceflow finds the app (docs/apps.md, "Registering it")
[project.entry-points."onceflow.apps"]
{name} = "{name}.app:app"

[tool.setuptools.packages.find]
include = ["{name}*"]
"""

APP = '''\
"""{name}: records per Kafka key in 10 s windows of their Kafka timestamps, exactly once.

Deterministic, as onceflow's proofs need (docs/apps.md): event time comes from the records, no clock, no
randomness, no lookups of anything that changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onceflow.app import App, Context, Results

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def transform(raw: DataFrame, ctx: Context) -> Results:
    from pyspark.sql import functions as F  # Spark where the plan is built: the control plane reads this without it

    s = ctx.settings
    keyed = raw.where(F.col("key").isNotNull())
    counts = (
        keyed.withWatermark("timestamp", f"{{s.watermark_s}} seconds")
        .groupBy(F.window("timestamp", f"{{s.window_s}} seconds").alias("w"), F.col("key").cast("string").alias("k"))
        .count()
    )
    start = F.date_format("w.start", "yyyy-MM-dd'T'HH:mm:ss'Z'")
    rows = counts.select(
        F.concat(start, F.lit("|"), "k").alias("key"),
        F.to_json(F.struct(start.alias("window_start"), F.col("k").alias("key"), "count")).alias("value"),
    )
    rejects = raw.where(F.col("key").isNull()).select(
        "value", "topic", "partition", "offset", "timestamp", F.lit("no_key").alias("reason")
    )
    return Results(rows=rows, rejects=rejects)


app = App(
    name="{name}",
    transform=transform,
    description="records per Kafka key in 10 s windows",
    settings={{"window_s": 10, "watermark_s": 5, "source_partitions": 2, "sink_partitions": 2}},
    reasons={{"no_key": "a record without a Kafka key"}},
)
'''

TEST = '''\
"""{name}'s plan, built as the platform builds it, in a local Spark session: no broker needed."""

import datetime as dt

import pytest
from pyspark.sql import SparkSession

from onceflow import config
from onceflow.spark import app_plan


@pytest.fixture(scope="module")
def spark():
    s = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    s.conf.set("spark.sql.session.timeZone", "UTC")
    yield s
    s.stop()


def test_counts_per_key_and_window_and_rejects_records_without_a_key(spark):
    # the registry entry stands in for the installed entry point (both name {name}.app:app)
    settings = config.load(env={{"ONCEFLOW_APP_REGISTRY": "{name}={name}.app:app"}}, app="{name}")
    t = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    rows = [
        (b"a", b"x", "{name}_source", 0, 0, t, 0),
        (b"a", b"y", "{name}_source", 0, 1, t + dt.timedelta(seconds=3), 0),
        (b"b", b"z", "{name}_source", 1, 0, t + dt.timedelta(seconds=12), 0),
        (None, b"lost", "{name}_source", 1, 1, t, 0),
    ]
    raw = spark.createDataFrame(
        rows,
        "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, timestampType int",
    )
    app = settings.declared_app()
    frame = app_plan.output(app.transform, raw, settings)
    app_plan.check_deterministic(app, frame)  # what the platform checks before the job's first write
    out = frame.collect()
    results = sorted((r.key, r.value) for r in out if r.kind == "result")
    assert results == [
        ("2026-01-01T00:00:00Z|a", b'{{"window_start":"2026-01-01T00:00:00Z","key":"a","count":2}}'),
        ("2026-01-01T00:00:10Z|b", b'{{"window_start":"2026-01-01T00:00:10Z","key":"b","count":1}}'),
    ]
    assert [(r.reason, r.src_partition, r.src_offset) for r in out if r.kind == "dlq"] == [("no_key", 1, 1)]
'''

README = """\
# {name}

An exactly-once stream on onceflow: records per Kafka key in 10 s windows (`{name}/app.py`).

```bash
pip install -e .                        # registers the app (entry point onceflow.apps)
python -m pytest tests                  # its plan, in a local Spark session
onceflow app list                       # {name} is listed
onceflow --app {name} app validate      # its settings and plan, determinism included
onceflow --app {name} stack topics      # its topics: {name}_source, _sink, _dlq, _ledger, ...
onceflow --app {name} job start --wait 120
```
"""


def files(name: str) -> dict[str, str]:
    """The new app's files, path -> text."""
    check_name(name)
    return {
        "pyproject.toml": PYPROJECT.format(name=name),
        "README.md": README.format(name=name),
        f"{name}/__init__.py": f'"""{name}: an exactly-once stream on onceflow."""\n',
        f"{name}/app.py": APP.format(name=name),
        "tests/test_app.py": TEST.format(name=name),
    }


def write(name: str, where: Path) -> Path:
    """Write the new app's package under `where`/`name`; refused when that directory exists."""
    root = where / name
    if root.exists():
        raise AppError(f"{root} exists: choose another name or directory (nothing was written)")
    for rel, text in files(name).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root
