"""ip_count: requests per IP in 5 s event-time windows, exactly once (the seed workload; docs/design.md).

Source records are JSON, CSV or combined access-log lines (onceflow.rules.records); each closed window of each IP becomes
one result, key `<window start>|<ip>`, value `{"window_start", "window_end", "ip", "count"}`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onceflow.app import App, Context, Results
from onceflow.rules import records

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def transform(raw: DataFrame, ctx: Context) -> Results:
    from onceflow.spark import ip_count_plan  # Spark only where the plan is built, not where the app is read

    return ip_count_plan.transform(raw, ctx)


app = App(
    name="ip_count",
    transform=transform,
    description="requests per IP in tumbling event-time windows",
    settings={"window_s": 5, "watermark_s": 5, "source_partitions": 4, "sink_partitions": 4},
    reasons={
        records.REASON_EMPTY: "an empty record",
        records.REASON_TOO_LARGE: f"larger than {records.MAX_RECORD_BYTES} bytes",
        records.REASON_NOT_UTF8: "not UTF-8 text",
        records.REASON_BAD_JSON: "a JSON record without a valid ip and time",
        records.REASON_BAD_TS: "an event time that does not parse",
        records.REASON_TS_RANGE: "an event time before 1970 or from 2100 on",
        records.REASON_BAD_IP: "not an IPv4 or IPv6 address",
        records.REASON_UNRECOGNIZED: "neither JSON, CSV nor a combined access-log line",
        records.REASON_TS_AHEAD: "an event time more than max_event_ahead_s after its Kafka timestamp",
        records.REASON_QUARANTINED: "an operator quarantined its offset (onceflow quarantine)",
    },
)
