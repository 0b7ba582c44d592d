"""The one wall clock and the one ISO-8601 reader. Every time onceflow writes (events, ledger and alert records,
status files) is epoch milliseconds; every time an operator gives (a backfill's range, a reconciliation's
interval, `--since`) is read here."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def now_ms() -> int:
    """Wall-clock time in epoch milliseconds."""
    return int(time.time() * 1000)


def parse_iso_us(text: str) -> int:
    """An ISO-8601 time (`2026-11-22T10:00:00.123456Z`, or with an offset; without one it is UTC) in epoch
    microseconds, exactly (no float on the way); ValueError otherwise."""
    dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return ((dt if dt.tzinfo else dt.replace(tzinfo=UTC)) - EPOCH) // timedelta(microseconds=1)


def parse_iso_ms(text: str) -> int:
    """An ISO-8601 time in epoch milliseconds (parse_iso_us, truncated); ValueError otherwise."""
    return parse_iso_us(text) // 1000
