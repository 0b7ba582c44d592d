"""How a proof lists what differs between its two sides (a full outer join, `j`, of what was expected and what is
there): every kind of difference counted in full, with the check's figures, in one Spark job; the rows of a kind
(at most CAP) read only where there are some, so a clean range, the usual case, costs one job, not one per kind.
Used by the replay proof (onceflow.operations.replay) and by app checks (onceflow_apps.ip_count_reference)."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F

CAP = 100  # rows listed per kind of difference


def rows(df: DataFrame, cols: list[str]) -> list[dict]:
    """At most CAP rows of `df`, as dicts of `cols`."""
    return [{c: r[c] for c in cols} for r in df.limit(CAP).collect()]


def listed(j: DataFrame, kinds: dict[str, tuple[Column, list[str]]], *figures: Column) -> tuple[dict[str, list], Row]:
    """The rows of each kind (name: (condition, columns)) and one row holding each kind's full count under its name
    and `figures` over all of `j`. A null condition is no difference of that kind, as in a `where`."""
    row = j.agg(*[F.count(F.when(cond, True)).alias(k) for k, (cond, _) in kinds.items()], *figures).first()
    assert row is not None  # a global aggregation has one row
    return {k: rows(j.where(cond), cols) if row[k] else [] for k, (cond, cols) in kinds.items()}, row
