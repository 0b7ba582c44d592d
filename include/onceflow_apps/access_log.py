"""What the shipped apps reject from the access-log records they share (onceflow.rules.records parses them), and why:
the DLQ's reasons, each explained (the console and docs show them)."""

from __future__ import annotations

from onceflow.rules import records

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
