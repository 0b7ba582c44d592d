"""Transaction watch: timeout events from the job, near-timeout warnings, and hanging transactions.

A hanging transaction holds a partition's last stable offset (LSO, what read_committed consumers can reach)
below its high watermark: every read_committed consumer of that partition is stuck behind it. The open
transaction's age is read from its first record (the record at the LSO). `hanging()` and `event_conditions()`
are pure; `open_transactions()` and `new_events()` do the reading.
"""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import TopicPartition

from onceflow import wire
from onceflow.config import Settings
from onceflow.control import alerts
from onceflow.kafka import clients as kafka_clients
from onceflow.kafka import events as ev
from onceflow.kafka import reading as kafka_reading
from onceflow.protocol.exactly_once import timeout_advice
from onceflow.rules import clock, names


@dataclass(frozen=True)
class OpenTxn:
    topic: str
    partition: int
    lso: int
    high_watermark: int
    first_ts_ms: int | None
    app: str | None  # from the record's onceflow.app header, when a onceflow producer wrote it
    batch: str | None
    backfill: str | None = None  # from the onceflow.backfill header: a backfill's chunk


def open_transactions(settings: Settings, topics: list[str]) -> list[OpenTxn]:
    admin = kafka_clients.admin(settings)
    md = admin.list_topics(timeout=10).topics
    tps = [TopicPartition(t, p) for t in topics if t in md for p in sorted(md[t].partitions)]
    found = kafka_reading.unsettled(admin, tps)
    if not found:
        return []
    out = []
    reader = kafka_clients.read_committed_consumer(settings, **{"isolation.level": "read_uncommitted"})
    try:
        for key, (stable, high) in sorted(found.items()):
            first = kafka_reading.record_at(reader, key[0], key[1], stable)
            headers = dict(first.headers() or []) if first is not None else {}
            out.append(
                OpenTxn(
                    key[0],
                    key[1],
                    stable,
                    high,
                    first.timestamp()[1] if first is not None else None,
                    headers.get(wire.H_APP, b"").decode() or None,
                    headers.get(wire.H_BATCH, b"").decode() or None,
                    headers.get(wire.H_BACKFILL, b"").decode() or None,
                )
            )
    finally:
        reader.close()
    return out


def hanging(txns: list[OpenTxn], now_ms: int, timeout_ms: int) -> list[alerts.Condition]:
    """Open transactions older than the transaction timeout: the coordinator should have aborted them."""
    out = []
    for t in txns:
        if t.first_ts_ms is None:
            continue
        age = now_ms - t.first_ts_ms
        if age <= timeout_ms:
            continue
        if t.backfill:
            txn_id = names.backfill_transactional_id(t.app or "?", t.backfill)
            who = f"backfill {t.backfill} of app {t.app} (transactional.id {txn_id})"
        elif t.app:
            who = f"app {t.app} (transactional.id {names.transactional_id(t.app)}, batch {t.batch})"
        else:
            who = "a producer that is not onceflow (no onceflow.app header)"
        out.append(
            alerts.Condition(
                key=f"txn_watch:hanging:{t.topic}:{t.partition}",
                severity=alerts.Severity.CRITICAL,
                summary=f"hanging transaction on {t.topic}[{t.partition}]: open for {age / 1000:.0f} s "
                f"(timeout {timeout_ms / 1000:.0f} s) by {who}; read_committed consumers are stuck at "
                f"offset {t.lso} (high watermark {t.high_watermark})",
                action=f"if that producer is gone for good, abort the transaction: kafka-transactions.sh "
                f"--bootstrap-server <brokers> abort --topic {t.topic} --partition {t.partition} "
                f"--start-offset {t.lso}; if it is onceflow, restart the job or re-run the backfill (its "
                f"init_transactions aborts it)",
                details={
                    "topic": t.topic,
                    "partition": t.partition,
                    "age_ms": age,
                    "lso": t.lso,
                    "high_watermark": t.high_watermark,
                    "app": t.app,
                    "batch": t.batch,
                },
            )
        )
    return out


TIMEOUT_PREFIX = "txn_watch:event:timeout:"


def replayed(timeout: dict, events: list[dict]) -> bool:
    """Has the job committed the timed-out batch (or a later one) since the timeout? Then the alert resolves."""
    return any(
        e["type"] == wire.BATCH_COMMITTED
        and e.get("app") == timeout.get("app")
        and int(e.get("batch", -1)) >= int(timeout.get("batch", 0))
        and int(e.get("ts_ms", 0)) > int(timeout.get("ts_ms", 0))
        for e in events
    )


def event_conditions(events: list[dict]) -> list[alerts.Condition]:
    """One alert per timed-out transaction (open until the job commits that batch again: see `replayed`); a
    near-timeout warning of the same transaction folds into it (warnings are one-off: fire once, never resolve)."""

    def txn_key(e):
        return (e.get("app"), e.get("host"), e.get("pid"), e.get("batch"))

    timed_out = {txn_key(e) for e in events if e["type"] == wire.TRANSACTION_TIMEOUT}
    out = []
    for e in events:
        k = txn_key(e)
        ident = f"{e.get('app')}:{e.get('host')}:{e.get('pid')}:{e.get('batch')}"
        if e["type"] == wire.TRANSACTION_TIMEOUT:
            out.append(
                alerts.Condition(
                    key=f"{TIMEOUT_PREFIX}{ident}",
                    severity=alerts.Severity.CRITICAL,
                    summary=f"transaction of {e.get('transactional_id')} (batch {e.get('batch')}) was aborted by the "
                    f"coordinator after {e.get('elapsed_ms')} ms (timeout {e.get('timeout_ms')} ms); the job "
                    f"restarts and replays the batch",
                    action=e.get("action", timeout_advice()),
                    details=e,
                )
            )
        elif e["type"] == wire.TRANSACTION_NEAR_TIMEOUT and k not in timed_out:
            out.append(
                alerts.Condition(
                    key=f"txn_watch:event:near_timeout:{ident}",
                    severity=alerts.Severity.WARNING,
                    one_off=True,
                    summary=f"transaction of {e.get('transactional_id')} (batch {e.get('batch')}) was open "
                    f"{e.get('txn_ms')} ms, past {100 * e.get('fraction', 0.8):.0f}% of its {e.get('timeout_ms')} ms "
                    f"timeout",
                    action="watch batch durations (onceflow job status); lower ONCEFLOW_MAX_OFFSETS_PER_TRIGGER or "
                    "raise ONCEFLOW_TRANSACTION_TIMEOUT_MS if this repeats",
                    details=e,
                )
            )
    return out


def new_events(settings: Settings, types: set[str], timeout_s: float = 60.0) -> list[dict]:
    """The job's events of `types` not seen by the watch before (its consumer group remembers the position on the
    job events topic, where the job's transaction events are)."""
    return ev.read(settings, types, group=names.txn_watch_group(settings.app_id), timeout_s=timeout_s)


@dataclass(frozen=True)
class WatchResult:
    """What one run of the transaction watch found, and the alerts it sent (`key status` each)."""

    events: int  # the job's timeout, near-timeout and commit events new since the last run
    open_transactions: tuple[OpenTxn, ...]
    hanging: tuple[dict, ...]  # the details of each transaction held open past the timeout
    alerts: tuple[str, ...]

    def as_dict(self) -> dict:
        """The DAG task's return value (its XCom): JSON."""
        return {
            "events": self.events,
            "open_transactions": [t.__dict__ for t in self.open_transactions],
            "hanging": list(self.hanging),
            "alerts": list(self.alerts),
        }


def watch(settings: Settings, sink: alerts.AlertSink, now_ms: int | None = None) -> WatchResult:
    """One run of the transaction watch: what it found and the alerts it sent."""
    now_ms = now_ms or clock.now_ms()
    evs = new_events(settings, {wire.TRANSACTION_TIMEOUT, wire.TRANSACTION_NEAR_TIMEOUT, wire.BATCH_COMMITTED})
    # every topic the platform writes in transactions: the job's sink (every output's), DLQ and ledger (shared with
    # restores and backfills, whose open chunk would hide the job's own records), and the backfills' target
    txns = open_transactions(
        settings, [*settings.sink_topics, settings.dlq_topic, settings.ledger_topic, settings.backfill_topic]
    )
    hang = hanging(txns, now_ms, settings.transaction_timeout_ms)
    # Timeouts stay open until the job commits their batch again. First every new and still open one (new ones
    # fire), then only those not replayed yet (the others resolve): a timeout followed by its replay between two
    # runs of the watch still gives exactly one alert and its resolution.
    latest: dict[str, alerts.Alert] = {}
    for a in sink.history():
        latest[a.key] = a
    still = [
        alerts.Condition(k, a.severity, a.summary, a.action, a.details)
        for k, a in latest.items()
        if k.startswith(TIMEOUT_PREFIX) and a.status == alerts.Status.FIRING
    ]
    found = event_conditions(evs) + still
    sent = sink.raise_and_resolve(found, "txn_watch", scope_prefix="txn_watch:event:")
    unresolved = [c for c in found if c.one_off or not replayed(c.details, evs)]
    if len(unresolved) < len(found):
        sent += sink.raise_and_resolve(unresolved, "txn_watch", scope_prefix="txn_watch:event:")
    sent += sink.raise_and_resolve(hang, "txn_watch", scope_prefix="txn_watch:hanging:")
    return WatchResult(
        events=len(evs),
        open_transactions=tuple(txns),
        hanging=tuple(c.details for c in hang),
        alerts=tuple(a.key + " " + a.status for a in sent),
    )
