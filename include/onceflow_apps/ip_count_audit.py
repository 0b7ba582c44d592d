"""ip_count's own audit (App.audit, for `onceflow audit`): every source record of the committed batches classified by
the reference parser (onceflow_apps.access_log.rules: no Spark), its window recounted under the batch's watermark, and each
window's count compared key by key with the sink (onceflow_apps.ip_count_invariants.check: I1-I4)."""

from __future__ import annotations

from collections.abc import Iterable

from onceflow.config import Settings
from onceflow.kafka import reading as kafka_reading
from onceflow.operations.audit import Snapshot, quarantined
from onceflow.rules import invariants
from onceflow.rules.ledger import LedgerEntry, QuarantineRange
from onceflow.rules.sources import SourcePartition
from onceflow_apps import ip_count_invariants
from onceflow_apps.access_log import rules as records


def source_records(
    settings: Settings, entries: Iterable[LedgerEntry] = (), quarantine: Iterable[QuarantineRange] = ()
) -> list[ip_count_invariants.SourceRecord]:
    """The source, classified by the reference parser (independent of Spark), each record with the rules of the
    batch that read it (`entries`; records of no batch with the current settings)."""
    index = invariants.BatchIndex(entries)
    q = list(quarantine)
    out = []
    topic = settings.source_topic  # ip_count reads one source topic
    for m in kafka_reading.read_topic(settings, topic):
        at = SourcePartition(topic, m.partition)
        e = index.find(at, m.offset)
        ahead = e.max_event_ahead_ms if e is not None else settings.max_event_ahead_ms
        held = any(r.covers(topic, m.partition, m.offset) for r in q)
        p = records.parse(m.value, m.timestamp_ms, ahead, held)
        out.append(ip_count_invariants.SourceRecord(at, m.offset, p.ts_us, p.ip, p.reason))
    return out


def check(
    settings: Settings, snap: Snapshot, sink: list[invariants.SinkRecord], dlq: list[tuple[SourcePartition, int]]
) -> invariants.Report:
    src = source_records(settings, snap.entries, quarantined(snap.records))
    return ip_count_invariants.check(snap.entries, snap.committed.offsets, src, sink, dlq, settings.window_s)
