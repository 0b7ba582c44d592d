"""What the operator console reads, bounded, and what it shows when Kafka is down.

Every read is bounded: the one-partition topics (ledger, events, alerts, health, reconciliation) are read from
their end backwards a page at a time (onceflow.kafka.reading.read_tail), never whole. Each section's last good
answer is kept (in memory and in `var/run/<app>.console.json`, so a restarted API server has it too): when the
broker does not answer, the section comes back with that last known state, its age, and the error.
"""

from __future__ import annotations

import json
import logging
import math
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from onceflow import wire
from onceflow.config import Settings
from onceflow.control import txnwatch
from onceflow.control.console import views
from onceflow.kafka import events as ev
from onceflow.kafka import reading
from onceflow.operations import backfill as backfills
from onceflow.operations import recon_chain, savepoints
from onceflow.rules import clock
from onceflow.rules.ledger import LedgerEntry, MalformedRecord, parse_record
from onceflow.runtime import jobctl, preflight
from onceflow.wire import OnceflowError

log = logging.getLogger(__name__)
PAGE_SCAN = 20_000  # records scanned at most for one page of one topic
CHART_POINTS = 300  # batches and health runs a chart shows


class KafkaDown(OnceflowError):
    """The broker does not answer: the console shows the last known state."""


def _cache_file(settings: Settings) -> Path:
    return settings.run_dir / f"{settings.app_id}.console.json"


class Cache:
    """The last good answer of each section, with when it was read: at most `max_entries` (the least recently used
    go first: every distinct filter of the batches page is a key), written to disk at most every `persist_s`
    seconds (the copy a restarted api-server starts from), not on every request."""

    def __init__(self, settings: Settings, max_entries: int = 64, persist_s: float = 30.0):
        self.path = _cache_file(settings)
        self.lock = threading.Lock()
        self.max_entries = max_entries
        self.persist_s = persist_s
        self.written_at = 0.0  # time.monotonic() of the last write
        self.data: OrderedDict[str, Any] = OrderedDict()
        try:
            loaded = json.loads(self.path.read_text())
        except (OSError, ValueError):
            loaded = {}
        if isinstance(loaded, dict):  # only entries of the shape put() writes (the file may be from any version)
            ok = [(k, v) for k, v in loaded.items() if isinstance(v, dict) and isinstance(v.get("ts_ms"), int)]
            self.data.update(ok[-max_entries:])

    def put(self, key: str, value: Any) -> None:
        with self.lock:
            self.data[key] = {"ts_ms": clock.now_ms(), "value": value}
            self.data.move_to_end(key)
            while len(self.data) > self.max_entries:
                self.data.popitem(last=False)
            if time.monotonic() - self.written_at >= self.persist_s:
                self.written_at = time.monotonic()
                self._write()

    def _write(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data, default=str))
            tmp.replace(self.path)
        except OSError as e:  # a read-only var dir: the memory copy still serves
            log.info("console cache not written: %s", e)

    def get(self, key: str) -> dict[str, Any] | None:
        with self.lock:
            hit = self.data.get(key)
            if hit is not None:
                self.data.move_to_end(key)
            return hit


def broker_answers(settings: Settings, timeout_s: float = 1.5) -> bool:
    """A quick TCP check first, so a page never waits on a client's retries when the broker is down."""
    return preflight.any_broker_listens(settings, timeout_s) is None


def section(
    cache: Cache, key: str, settings: Settings, read: Callable[[], Any], needs_kafka: bool = True
) -> dict[str, Any]:
    """`read()` now, or the last known state with why it is not current."""
    try:
        if needs_kafka and not broker_answers(settings):
            raise KafkaDown(f"the Kafka broker at {settings.bootstrap_servers} does not answer")
        value = _finite(read())
    except Exception as e:  # whatever failed, the operator sees the last known state and why
        last = cache.get(key)
        log.warning("console section %s: %s", key, e)
        return {
            "ok": False,
            "error": str(e)[:500],
            "stale": last is not None,
            "as_of_ms": last["ts_ms"] if last else None,
            "data": last["value"] if last else None,
        }
    cache.put(key, value)
    return {"ok": True, "error": None, "stale": False, "as_of_ms": clock.now_ms(), "data": value}


def _finite(value: Any) -> Any:
    """`value` with every NaN or Infinity (JSON records may hold them; Python's json reads them) replaced by None:
    the answer is strict JSON, which the API server cannot otherwise send (and the cache would keep)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


# ---------------------------------------------------------------------------- the readers


def _json(m: reading.Msg) -> dict[str, Any] | None:
    """A record's JSON object, or None (not JSON, or not an object)."""
    try:
        d = json.loads(m.value) if m.value is not None else None
    except ValueError:
        return None
    return d if isinstance(d, dict) else None


def _app_key(settings: Settings) -> Callable[[reading.Msg], bool]:
    key = settings.app_id.encode()
    return lambda m: m.key == key


def events(settings: Settings, types: tuple[str, ...], want: int = 200) -> list[dict[str, Any]]:
    """The app's newest `want` events of `types`, the job's facts from its own events topic only (bounded)."""
    return ev.read(settings, types, tail=want)


def _entry(m: reading.Msg) -> LedgerEntry | None:
    """The ledger batch entry of a record, or None: another kind, or a record that is not what the platform writes
    (logged and left out; the page shows only typed, checked fields)."""
    if m.value is None:
        return None
    try:
        rec = parse_record(m.value)
    except (MalformedRecord, TypeError) as e:
        log.warning("console: ledger record at offset %s left out: %s", m.offset, e)
        return None
    return rec if isinstance(rec, LedgerEntry) else None


def ledger_page(settings: Settings, size: int, before: int | None) -> tuple[list[LedgerEntry], int | None]:
    """One page of the app's stream batches, newest first: `size` records back from offset `before` (a table sink:
    its ledger table, below batch `before`)."""
    if settings.sink_kind == "postgres":
        from onceflow.database import client

        return client.ledger_page(settings, size, before)

    def ours(m: reading.Msg) -> bool:
        if m.key != settings.app_id.encode():
            return False
        rec = _entry(m)
        return rec is not None and rec.kind == wire.LEDGER_STREAM

    msgs, next_before = reading.read_tail(
        settings, settings.ledger_topic, ours, want=size, max_scan=PAGE_SCAN, before=before
    )
    return [e for e in map(_entry, msgs) if e is not None], next_before


def read_now(settings: Settings) -> dict[str, Any]:
    st = jobctl.status(settings).as_dict()
    st["host"] = st.get("host") or socket.gethostname()  # the job's pid files are this machine's
    health = _health(settings)
    open_txns = [
        t.__dict__
        for t in txnwatch.open_transactions(
            settings, [*settings.sink_topics, settings.dlq_topic, settings.ledger_topic]
        )
    ]
    return views.now_view(settings, st, health, open_txns, clock.now_ms())


def _health(settings: Settings) -> dict[str, Any] | None:
    msgs, _ = reading.read_tail(settings, settings.health_topic, _app_key(settings), want=1, max_scan=PAGE_SCAN)
    return _json(msgs[-1]) if msgs else None


def read_batches(settings: Settings, size: int, before: int | None, filters: dict[str, Any]) -> dict[str, Any]:
    entries, next_before = ledger_page(settings, size, before)
    late = views.late_by_batch(events(settings, (wire.PROGRESS,), want=size * 3))
    rows = views.filter_rows(views.batch_rows(entries, late), **filters)
    return {"rows": rows, "next_before": next_before, "page_size": size}


def read_charts(settings: Settings) -> dict[str, Any]:
    entries, _ = ledger_page(settings, CHART_POINTS, None)
    hmsgs, _ = reading.read_tail(
        settings, settings.health_topic, _app_key(settings), want=CHART_POINTS, max_scan=PAGE_SCAN
    )
    health = [h for h in (_json(m) for m in hmsgs) if h]
    return views.series(entries, health)


def read_transactions(settings: Settings) -> dict[str, Any]:
    topics = [
        *settings.sink_topics,
        settings.dlq_topic,
        settings.ledger_topic,
        settings.backfill_topic,
        settings.reconciliation_topic,
    ]
    open_txns = [t.__dict__ for t in txnwatch.open_transactions(settings, topics)]
    evs = events(settings, views.TXN_EVENTS, want=200)
    return {
        "incidents": views.transaction_incidents(settings, evs, open_txns, clock.now_ms()),
        "watched_topics": topics,
    }


def read_alerts(settings: Settings, want: int = 300) -> dict[str, Any]:
    msgs, _ = reading.read_tail(settings, settings.alerts_topic, _app_key(settings), want=want, max_scan=PAGE_SCAN)
    return views.alert_view([a for a in (_json(m) for m in msgs) if a])


def read_savepoints(settings: Settings) -> dict[str, Any]:
    return {"savepoints": views.savepoint_rows(savepoints.list_all(settings)), "uri": settings.savepoints}


def read_proofs(settings: Settings) -> dict[str, Any]:
    chain = views.chain_view(recon_chain.status(settings, jobctl.status(settings).last_batch))
    results = recon_chain.recent_results(settings, limit=500)
    return {"chain": chain, "runs": views.reconciliation_runs(results)[:50]}


def read_backfills(settings: Settings) -> dict[str, Any]:
    def theirs(m: reading.Msg) -> bool:
        return m.key == settings.app_id.encode() and b'"backfill"' in (m.value or b"")

    msgs, _ = reading.read_tail(settings, settings.ledger_topic, theirs, want=2000, max_scan=PAGE_SCAN * 5)
    entries = [e for e in map(_entry, msgs) if e is not None]
    evs = events(settings, (wire.BACKFILL_STARTED, wire.BACKFILL_DONE), want=500)
    return {
        "backfills": views.backfill_view(entries, backfills.running(settings), evs),
        "topic": settings.backfill_topic,
        "sources": sorted(settings.source_topic_list),  # the form's example offsets name them when there are several
    }


def data_docs_root(settings: Settings) -> Path:
    """Where the reconciliation's GX Data Docs site is (served by the console)."""
    return recon_chain.home(settings) / "gx" / "gx" / "uncommitted" / "data_docs" / "local_site"
