"""ip_count: requests per IP in 5 s event-time windows, exactly once (the seed workload; docs/design.md).

Source records are JSON, CSV or combined access-log lines (onceflow_apps.access_log); each closed window of each IP becomes
one result, key `<window start>|<ip>`, value `{"window_start", "window_end", "ip", "count"}`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onceflow.app import App, Context, Results
from onceflow_apps import access_log

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def transform(raw: DataFrame, ctx: Context) -> Results:
    from onceflow_apps import ip_count_plan  # Spark only where the plan is built, not where the app is read

    return ip_count_plan.transform(raw, ctx)


app = App(
    name="ip_count",
    transform=transform,
    description="requests per IP in tumbling event-time windows",
    reference="onceflow_apps.ip_count_reference:recount",  # its recount, written apart from its plan
    audit="onceflow_apps.ip_count_audit:check",  # its windows recounted without Spark (onceflow audit)
    settings={"window_s": 5, "watermark_s": 5, "source_partitions": 4, "sink_partitions": 4},
    reasons=access_log.REASONS,
    rules_version=access_log.rules.RULES_VERSION,
    java=access_log.JAVA,  # the compiled parse (onceflow_apps.access_log.parsing)
)
