"""The access-log records the shipped apps read (NGINX combined log lines and JSON): their rules as data with a
reference parser in plain Python (`rules`), the same rules compiled in Java (`java/`, each app's JVM functions:
App.java) and applied in a Spark plan (`parsing`), and what is rejected and why: the DLQ's reasons, each explained
(the console and docs show them)."""

from __future__ import annotations

from pathlib import Path

from onceflow_apps.access_log import rules as records

# the Java rules (java/rules, which the Flink contender of make bench compiles too) and their Spark function
# (java/spark): App.java of every app that parses these records
JAVA = (Path(__file__).parent / "java",)

REASONS = {
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
}
