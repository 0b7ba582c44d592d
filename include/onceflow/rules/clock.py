"""The one wall clock and the one ISO-8601 reader. Every time onceflow writes (events, ledger and alert records,
status files) is epoch milliseconds; every time an operator gives (a backfill's range, a reconciliation's
interval, `--since`) is read here."""

from __future__ import annotations

import time
from datetime import datetime


def now_ms() -> int:
    """Wall-clock time in epoch milliseconds."""
    return int(time.time() * 1000)


def parse_iso_ms(text: str) -> int:
    """An ISO-8601 time (`2026-11-22T10:00:00Z`, or with an offset) in epoch milliseconds; ValueError otherwise."""
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)
