"""The Great Expectations (GX Core 1.x) suite on the sink's output of a reconciled range.

GX is used directly, on the Spark DataFrame of the range (so it scales with Spark), in a file context under
`<var>/reconciliation/<app>/gx`: the suite, the validation results and the Data Docs site are kept there. The
separate GX Airflow provider is not used (it pins numpy < 2 and is not Airflow 3 ready).

Expectations: the key is unique; counts are positive integers; windows are aligned to the window size and last
exactly that long (window_end = window_start + window); IPs are valid IPv4 or IPv6 (the parser's own rule); the
key is `window_start|ip`.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from onceflow_apps.access_log import rules as records

log = logging.getLogger(__name__)
SUITE = "onceflow_sink"


def prepare(sink: DataFrame, window_s: int) -> DataFrame:
    """Columns the expectations read, from the sink records (`key`, `window_start`, `window_end`, `ip`, `count`
    as parsed from the JSON value)."""
    w_ms = window_s * 1000
    start_ms = F.unix_millis(F.to_timestamp("window_start"))
    end_ms = F.unix_millis(F.to_timestamp("window_end"))
    count = F.col("count").cast("double")
    return sink.select(
        "key",
        "ip",
        count.alias("count"),
        (start_ms % w_ms).alias("start_offset_in_window_ms"),
        (end_ms - start_ms).alias("window_length_ms"),
        end_ms.alias("window_end_ms"),
        (start_ms + w_ms).alias("window_start_plus_window_ms"),
        F.concat_ws("|", "window_start", "ip").alias("expected_key"),
        F.col("ip").rlike(records.IP_RE.removesuffix("$") + r"\z").alias("ip_valid"),
        (count == F.floor(count)).alias("count_is_integer"),
    )


def suite(window_s: int):
    import great_expectations as gx
    import great_expectations.expectations as gxe

    s = gx.ExpectationSuite(name=SUITE)
    for e in (
        gxe.ExpectColumnValuesToBeUnique(column="key"),
        gxe.ExpectColumnValuesToNotBeNull(column="count"),
        gxe.ExpectColumnValuesToBeBetween(column="count", min_value=1, strict_min=False),
        gxe.ExpectColumnValuesToBeInSet(column="count_is_integer", value_set=[True]),
        gxe.ExpectColumnValuesToBeInSet(column="start_offset_in_window_ms", value_set=[0]),
        gxe.ExpectColumnValuesToBeInSet(column="window_length_ms", value_set=[window_s * 1000]),
        gxe.ExpectColumnPairValuesToBeEqual(column_A="window_end_ms", column_B="window_start_plus_window_ms"),
        gxe.ExpectColumnValuesToBeInSet(column="ip_valid", value_set=[True]),
        gxe.ExpectColumnPairValuesToBeEqual(column_A="key", column_B="expected_key"),
    ):
        s.add_expectation(e)
    return s


def validate(sink: DataFrame, window_s: int, root: Path, run_name: str) -> dict:
    """Run the suite on `sink`; keep the validation result and rebuild the Data Docs. Returns the summary:
    success, per-expectation results (with unexpected counts and examples) and the Data Docs index path."""
    import great_expectations as gx

    root.mkdir(parents=True, exist_ok=True)
    ctx = gx.get_context(mode="file", project_root_dir=str(root))
    # no progress bars on a terminal or in a task log: the run's own lines say what happens
    from great_expectations.data_context.types.base import ProgressBarsConfig

    ctx.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    ds = ctx.data_sources.add_or_update_spark(name="onceflow_spark")
    asset = next((a for a in ds.assets if a.name == "sink_range"), None) or ds.add_dataframe_asset(name="sink_range")
    batch_def = next(
        (b for b in asset.batch_definitions if b.name == "whole"), None
    ) or asset.add_batch_definition_whole_dataframe("whole")
    ctx.suites.add_or_update(suite(window_s))
    vd = ctx.validation_definitions.add_or_update(
        gx.ValidationDefinition(name="sink_range", data=batch_def, suite=ctx.suites.get(SUITE))
    )
    cp = ctx.checkpoints.add_or_update(
        gx.Checkpoint(
            name="reconciliation",
            validation_definitions=[vd],
            actions=[gx.checkpoint.UpdateDataDocsAction(name="data_docs")],
            result_format="SUMMARY",
        )
    )
    res = cp.run(batch_parameters={"dataframe": prepare(sink, window_s)}, run_id=gx.RunIdentifier(run_name=run_name))
    out = []
    for vr in res.run_results.values():
        for r in vr.results:
            cfg = r.expectation_config
            assert cfg is not None  # a checkpoint run's results always carry their expectation
            out.append(
                {
                    "expectation": cfg.type,
                    "column": cfg.kwargs.get("column") or f"{cfg.kwargs.get('column_A')}={cfg.kwargs.get('column_B')}",
                    "success": r.success,
                    "unexpected_count": (r.result or {}).get("unexpected_count"),
                    "examples": (r.result or {}).get("partial_unexpected_list", [])[:5],
                }
            )
    docs = ctx.get_docs_sites_urls()
    return {"success": bool(res.success), "expectations": out, "data_docs": docs[0]["site_url"] if docs else None}
