"""Read back what the platform committed (ledger, group offsets, sink, DLQ, source) and check I1-I4.

The reading is plain Kafka consumption with `isolation.level=read_committed`; the deciding is in
`onceflow.invariants`. Used by the tests today and by the reconciliation later.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaException, TopicPartition

from . import invariants, kafka_clients, records
from .config import Settings
from .ledger import LedgerEntry, RestoreRecord, parse_record


@dataclass(frozen=True)
class Msg:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict
    timestamp_ms: int = 0


def read_topic(settings: Settings, topic: str, isolation: str = "read_committed",
               timeout_s: float = 120.0, since_ms: int | None = None) -> list[Msg]:
    """Every visible record of a topic, from the beginning (or from the first record at or after `since_ms`)
    to the end (the LSO under read_committed)."""
    c = kafka_clients.read_committed_consumer(settings, **{"isolation.level": isolation,
                                                           "enable.partition.eof": True,
                                                           "fetch.max.bytes": 52428800})
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        if md.error is not None:
            raise KafkaException(md.error)
        start = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(md.partitions)]
        if since_ms is not None:
            start = [TopicPartition(topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_END)
                     for tp in c.offsets_for_times([TopicPartition(topic, tp.partition, since_ms)
                                                    for tp in start], timeout=10)]
        return [Msg(m.partition(), m.offset(), m.key(), m.value(), {k: v for k, v in (m.headers() or [])},
                    m.timestamp()[1])
                for m in kafka_clients.consume_to_end(c, start, timeout_s)]
    finally:
        c.close()


def ledger_records(settings: Settings, app: str | None = None) -> list[LedgerEntry | RestoreRecord]:
    """Every committed ledger record of the app, oldest first: batch entries and restore records."""
    key = (app or settings.app_id).encode()
    return [parse_record(m.value) for m in read_topic(settings, settings.ledger_topic) if m.key == key]


def ledger_entries(settings: Settings, app: str | None = None, kind: str = "stream") -> list[LedgerEntry]:
    return [e for e in ledger_records(settings, app) if isinstance(e, LedgerEntry) and e.kind == kind]


def restore_records(settings: Settings, app: str | None = None) -> list[RestoreRecord]:
    return [e for e in ledger_records(settings, app) if isinstance(e, RestoreRecord)]


def committed_offsets(settings: Settings, partitions: Iterable[int]) -> dict[int, int]:
    c = kafka_clients.read_committed_consumer(settings, group_id=settings.group_id)
    try:
        got = kafka_clients.committed(c, [TopicPartition(settings.source_topic, p) for p in partitions])
        return {tp.partition: tp.offset for tp in got if tp.offset >= 0}
    finally:
        c.close()


def source_records(settings: Settings) -> list[invariants.SourceRecord]:
    """The source, classified by the reference parser (independent of Spark)."""
    out = []
    for m in read_topic(settings, settings.source_topic):
        p = records.parse(m.value)
        out.append(invariants.SourceRecord(m.partition, m.offset, p.ts_us, p.ip, p.reason))
    return out


def dlq_provenance(msgs: Iterable[Msg]) -> list[tuple[int, int]]:
    return [(int(m.headers["onceflow.source.partition"]), int(m.headers["onceflow.source.offset"]))
            for m in msgs]


def audit(settings: Settings, source: list[invariants.SourceRecord] | None = None) -> invariants.Report:
    """Check I1-I4 for the live job's committed history against the source as it is on the broker."""
    entries = ledger_entries(settings)
    parts = sorted({p for e in entries for p in e.ranges}) or list(range(settings.source_partitions))
    committed = committed_offsets(settings, parts)
    src = source if source is not None else source_records(settings)
    sink = [invariants.SinkRecord(m.key.decode(), m.value, m.partition, m.offset)
            for m in read_topic(settings, settings.sink_topic)]
    dlq = dlq_provenance(read_topic(settings, settings.dlq_topic))
    return invariants.check(entries, committed, src, sink, dlq, settings.window_s)
