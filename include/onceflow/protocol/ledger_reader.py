"""Reading the app's own records back from the ledger: bounded, and never mistaking "not visible yet" for "absent".

The ledger is one partition shared by the job, restores, quarantines and backfills. A read_committed consumer
sees records only up to the last stable offset (LSO): another producer's open transaction (a backfill chunk in
flight) holds the LSO back, and committed records written after it are invisible until that transaction ends.
A replay that looked for its own committed record then would not find it and stop with a false divergent
history. So every lookup first waits (bounded) until the LSO has reached the high watermark seen when it
began; if it does not in time, it fails as transient (`LedgerNotVisible`: the job restarts and looks again),
never as "absent".

Scans go newest first and stop as soon as the answer is certain: the app's stream records are appended in batch
order, so once a record of an earlier batch is seen, the one looked for is not further back.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from confluent_kafka import TopicPartition

from onceflow import wire
from onceflow.config import Settings
from onceflow.kafka import clients as kafka_clients
from onceflow.kafka import reading as kafka_reading
from onceflow.kafka.surfaces import Admin, Consumer
from onceflow.rules.ledger import DivergentHistory, LedgerEntry, parse_record
from onceflow.wire import OnceflowError

CHUNK = 1000  # records read per step backwards
MAX_SCAN = 1_000_000  # records read per lookup at most


class LedgerNotVisible(OnceflowError):
    """An open transaction of another producer hides the ledger's newest records for longer than allowed."""


class LedgerScanLimit(DivergentHistory):
    """The app's record is not within the scan's bound: like a divergent history, nothing a restart fixes; the job
    stops for good (exit 4) and health pages."""


def stable_end(settings: Settings, wait_s: float | None = None, admin: Admin | None = None) -> tuple[int, int]:
    """(low, end) of the ledger once everything written before this call is visible to read_committed. `admin`: a
    client to reuse (the job's sink holds one: a new client per lookup is a new connection, on a secured cluster a
    TLS handshake and a SCRAM exchange, on the path of every replay's decision)."""
    wait_s = settings.ledger_wait_s if wait_s is None else wait_s
    admin = admin or kafka_clients.admin(settings)
    tp = TopicPartition(settings.ledger_topic, 0)
    target = kafka_reading.latest_offsets(admin, [tp], read_committed=False)[(tp.topic, 0)]
    deadline = time.monotonic() + wait_s
    while True:
        lso = kafka_reading.latest_offsets(admin, [tp], read_committed=True)[(tp.topic, 0)]
        if lso >= target:
            break
        if time.monotonic() >= deadline:
            raise LedgerNotVisible(
                f"the ledger {settings.ledger_topic} has an open transaction at offset {lso} (high watermark "
                f"{target}) for more than {wait_s:.0f} s: its committed records after it are not visible yet. "
                f"The transaction watch names the producer; a backfill's transaction ends by itself "
                f"(ONCEFLOW_LEDGER_WAIT_S bounds this wait)"
            )
        time.sleep(0.2)
    low = kafka_reading.low_offset(admin, tp)
    return low, target


def _app_entries(consumer: Consumer, settings: Settings, start: int, end: int) -> list[LedgerEntry]:
    key = settings.app_id.encode()
    out: list[LedgerEntry] = []
    for msg in kafka_reading.read_range(consumer, settings.ledger_topic, 0, start, end):
        if msg.key() == key:
            rec = parse_record(msg.value())
            if isinstance(rec, LedgerEntry) and rec.kind == wire.LEDGER_STREAM:
                out.append(rec)
    return out


def _scan_back(
    consumer: Consumer,
    settings: Settings,
    stop: Callable[[list[LedgerEntry]], tuple[LedgerEntry | None, bool]],
    admin: Admin | None = None,
) -> LedgerEntry | None:
    """Newest chunk first; `stop(entries_of_chunk)` returns (found, done)."""
    low, end = stable_end(settings, admin=admin)
    scanned = 0
    while end > low and scanned < MAX_SCAN:
        start = max(low, end - CHUNK)
        found, done = stop(_app_entries(consumer, settings, start, end))
        if done:
            return found
        scanned += end - start
        end = start
    if end > low:
        raise LedgerScanLimit(
            f"no record of app {settings.app_id} within the newest {MAX_SCAN} records of the ledger "
            f"{settings.ledger_topic}: the app's history cannot be proven within the scan's bound, so the job stops "
            f"instead of guessing (a restart would not find more). Check the ledger's retention and whether other "
            f"writers flood it (`onceflow show ledger`)"
        )
    return None


def find_entry(consumer: Consumer, settings: Settings, batch: int, admin: Admin | None = None) -> LedgerEntry | None:
    """The committed stream record of ledger batch `batch` of this app, or None when it is not in the ledger."""

    def stop(entries: list[LedgerEntry]) -> tuple[LedgerEntry | None, bool]:
        for e in reversed(entries):
            if e.batch == batch:
                return e, True
            if e.batch < batch:
                return None, True
        return None, False

    return _scan_back(consumer, settings, stop, admin)


def newest_entry(consumer: Consumer, settings: Settings, admin: Admin | None = None) -> LedgerEntry | None:
    """The app's newest committed stream record (None: the app has committed nothing)."""
    return _scan_back(consumer, settings, lambda entries: (entries[-1], True) if entries else (None, False), admin)
