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
    for m in kafka_reading.read_topic(settings, settings.source_topic):
        e = index.find(m.partition, m.offset)
        ahead = e.max_event_ahead_ms if e is not None else settings.max_event_ahead_ms
        held = any(r.partition == m.partition and r.start <= m.offset < r.end for r in q)
        p = records.parse(m.value, m.timestamp_ms, ahead, held)
        out.append(ip_count_invariants.SourceRecord(m.partition, m.offset, p.ts_us, p.ip, p.reason))
    return out


def check(
    settings: Settings, snap: Snapshot, sink: list[invariants.SinkRecord], dlq: list[tuple[int, int]]
) -> invariants.Report:
    src = source_records(settings, snap.entries, quarantined(snap.records))
    return ip_count_invariants.check(snap.entries, snap.committed.offsets, src, sink, dlq, settings.window_s)
