"""Read back what the platform committed (ledger, group offsets, sink, DLQ, source) and check I1-I4.

The reading is plain Kafka consumption with `isolation.level=read_committed`; the deciding is in
`onceflow.rules.invariants` and, for an app that declares its own audit, in the app (ip_count's:
onceflow_apps.ip_count_audit). Used by `onceflow audit` and the tests; the reconciliation recounts with Spark.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import cast

from confluent_kafka import KafkaException

from onceflow import wire
from onceflow.app import registry
from onceflow.config import Settings
from onceflow.database import client as database_client
from onceflow.kafka import clients as kafka_clients
from onceflow.kafka import reading as kafka_reading
from onceflow.protocol import ledger_reader
from onceflow.protocol.ledger_reader import LedgerNotVisible
from onceflow.rules import invariants
from onceflow.rules.ledger import (
    Committed,
    LedgerEntry,
    QuarantineRange,
    QuarantineRecord,
    RestoreRecord,
    committed_from_ledger,
    parse_record,
)
from onceflow.rules.sources import SourcePartition, of_topic


def ledger_records(settings: Settings, app: str | None = None) -> list[LedgerEntry | RestoreRecord | QuarantineRecord]:
    """Every committed ledger record of the app, oldest first: batch entries, restore and quarantine records."""
    key = (app or settings.app_id).encode()
    # onceflow's ledger records always carry a value
    return [
        parse_record(cast(bytes, m.value))
        for m in kafka_reading.read_topic(settings, settings.ledger_topic)
        if m.key == key
    ]


def ledger_entries(settings: Settings, app: str | None = None, kind: str = wire.LEDGER_STREAM) -> list[LedgerEntry]:
    """The app's committed ledger entries of `kind`, oldest first: a table sink's stream batches from its ledger
    table, everything else from the ledger topic."""
    if settings.sink_kind == "postgres" and kind == wire.LEDGER_STREAM and app in (None, settings.app_id):
        with database_client.connect(settings, "audit") as conn:
            return database_client.ledger_entries(conn, settings)
    return [e for e in ledger_records(settings, app) if isinstance(e, LedgerEntry) and e.kind == kind]


def restore_records(settings: Settings, app: str | None = None) -> list[RestoreRecord]:
    return [e for e in ledger_records(settings, app) if isinstance(e, RestoreRecord)]


def quarantined(recs: Iterable) -> list[QuarantineRange]:
    return [r for q in recs if isinstance(q, QuarantineRecord) for r in q.ranges]


def committed_position(
    settings: Settings, partitions: Iterable[SourcePartition], group: str | None = None
) -> Committed:
    """The group's committed offsets on the source with the batch their metadata names (`group`: another of the
    app's groups than the job's, e.g. the reconciliation chain's)."""
    return Committed.from_partitions(kafka_reading.group_offsets(settings, partitions, group=group))


def committed_offsets(
    settings: Settings, partitions: Iterable[SourcePartition], group: str | None = None
) -> dict[SourcePartition, int]:
    return committed_position(settings, partitions, group).offsets


def committed_on_source(settings: Settings, partitions: Iterable[int]) -> dict[int, int]:
    """The job's committed offsets on its (main) source topic, by partition: for tools that feed it (bench, chaos)."""
    topic = settings.source_topic
    return of_topic(topic, committed_offsets(settings, [SourcePartition(topic, p) for p in partitions]))


def consumed_position(settings: Settings, partitions: Iterable[SourcePartition]) -> Committed:
    """How far the job has consumed: its group's committed position, or, when the group holds nothing, the
    ledger's newest batch (a table sink: its ledger table's newest row, always). Kafka deletes a group's offsets
    `offsets.retention.minutes` (7 days by default) after its last commit, so an idle week would read as "nothing
    consumed": the whole topic as lag, a stalled job, a savepoint of "another history" (protocol review N-4). The
    ledger is kept forever and says the same: each batch's end offsets were committed with its record, in one
    transaction."""
    parts = list(partitions)
    if settings.sink_kind == "postgres":
        # a table sink's ledger is its table, read first: the group only caches it, written after each commit, so
        # a crash between the two leaves the group a batch behind (a restore planned from it would catch up to the
        # wrong batch)
        with database_client.connect(settings, "audit") as conn:
            newest = database_client.newest_entry(conn, settings)
    else:
        got = committed_position(settings, parts)
        if got.offsets:
            return got
        c = kafka_clients.read_committed_consumer(settings)
        try:
            newest = ledger_reader.newest_entry(c, settings)
        finally:
            c.close()
    if newest is None:
        return Committed(offsets={}, batch=None)  # nothing committed anywhere: nothing consumed, truly
    return Committed(offsets={p: o for p, o in newest.end.items() if p in parts}, batch=newest.batch)


@dataclass
class Snapshot:
    """A consistent cut of a running job's history: everything up to one committed batch. The group's position
    is read first, then the ledger up to that batch (waiting, bounded, until its record is visible: a
    transaction's markers reach the ledger a moment after the offsets); sink and DLQ records of later batches
    are left out by their batch header. Reading the ledger first would let a batch committed in between look
    like a gap (I1) or like foreign records (I3)."""

    committed: Committed
    entries: list[LedgerEntry]  # the app's stream batches up to `batch`
    records: list = field(default_factory=list)  # every ledger record of the app (restore, quarantine, ...)

    @property
    def batch(self) -> int | None:
        return self.entries[-1].batch if self.entries else None

    def includes(self, headers: dict) -> bool:
        """Is a sink or DLQ record (by its onceflow.batch header) inside the cut? Foreign records stay in."""
        b = headers.get(wire.H_BATCH)
        return b is None or self.batch is None or int(b) <= self.batch


def snapshot(settings: Settings, wait_s: float = 30.0) -> Snapshot:
    if settings.sink_kind == "postgres":  # the ledger table alone: one query is a consistent cut
        return _table_cut(ledger_entries(settings), settings)
    committed = committed_position(settings, source_partitions(settings))
    deadline = time.monotonic() + wait_s
    while True:
        recs = ledger_records(settings)
        entries = sorted(
            (e for e in recs if isinstance(e, LedgerEntry) and e.kind == wire.LEDGER_STREAM), key=lambda e: e.batch
        )
        if committed.batch is None or any(e.batch == committed.batch for e in entries):
            break
        if time.monotonic() >= deadline:
            # Never check a cut without its last batch: the missing record would read as a gap (I1).
            raise LedgerNotVisible(
                f"the group {settings.group_id} has committed batch {committed.batch}, but its ledger record is not "
                f"visible in {settings.ledger_topic} after {wait_s:.0f} s (an open transaction holds the ledger "
                f"back, or the record is missing): try again; if it persists, `onceflow show ledger` and the "
                f"transaction watch tell which"
            )
        time.sleep(0.5)
    if committed.batch is not None:
        entries = [e for e in entries if e.batch <= committed.batch]
    return Snapshot(committed, entries, recs)


@dataclass
class TableContents:
    """A table sink's committed results and DLQ rows, from the same cut as its Snapshot."""

    results: list[tuple[str, str, int]]  # key, value, batch
    dlq: list[tuple]  # src_partition, src_offset, key, value, reason, batch, src_topic


def table_snapshot(settings: Settings) -> tuple[Snapshot, TableContents]:
    """A PostgreSQL sink's cut: its ledger rows, results and DLQ rows read in one database transaction (consistent
    by the database's snapshot, no waiting); the restore and quarantine records are the Kafka ledger's, where the
    operator's actions write them."""
    entries, results, dlq = database_client.snapshot(settings)
    return _table_cut(entries, settings), TableContents(results, dlq)


def _table_cut(entries: list[LedgerEntry], settings: Settings) -> Snapshot:
    """A table sink's Snapshot from its ledger rows, with the Kafka ledger's restore and quarantine records."""
    stream = sorted((e for e in entries if e.kind == wire.LEDGER_STREAM), key=lambda e: e.batch)
    committed = committed_from_ledger(stream[-1]) if stream else Committed({}, None)
    others = [r for r in ledger_records(settings) if not isinstance(r, LedgerEntry)]
    return Snapshot(committed, stream, [*stream, *others])


def dlq_provenance(msgs: Iterable[kafka_reading.Msg]) -> list[tuple[SourcePartition, int]]:
    """Each DLQ record's source record: (its source partition, its offset), from its provenance headers."""
    return [
        (
            SourcePartition(
                bytes(m.headers.get(wire.H_SOURCE_TOPIC) or b"").decode(), int(m.headers[wire.H_SOURCE_PARTITION])
            ),
            int(m.headers[wire.H_SOURCE_OFFSET]),
        )
        for m in msgs
    ]


def source_partitions(settings: Settings, admin=None) -> list[SourcePartition]:
    """Every partition of every source topic of the app, as the broker has them now (`admin`: a client to ask)."""
    admin = admin or kafka_clients.admin(settings)
    out = []
    for topic in settings.source_topic_list:
        md = admin.list_topics(topic, timeout=10).topics[topic]
        if md.error is not None:
            raise KafkaException(md.error)
        out += [SourcePartition(topic, p) for p in sorted(md.partitions)]
    return out


def audit(settings: Settings) -> invariants.Report:
    """Check the live job's committed history against the source as it is on the broker, on a consistent snapshot
    (everything up to one committed batch), so a running job gives the same verdict as a stopped one: the app's own
    key-by-key audit where it declares one (App.audit: ip_count's recounts its windows), else what holds for any
    app (I1 and the ledger's accounting of every sink and DLQ record: invariants.check_accounting)."""
    if settings.sink_kind == "postgres":  # one row per key: its latest value (the table's rows are the records)
        snap, rows = table_snapshot(settings)
        sink = [invariants.SinkRecord(k, v.encode(), 0, i) for i, (k, v, _) in enumerate(rows.results)]
        dlq = [(SourcePartition(str(r[6]), int(r[0])), int(r[1])) for r in rows.dlq]
    else:
        snap = snapshot(settings)
        # onceflow's sink records always carry a key and a value
        sink = [
            invariants.SinkRecord(cast(bytes, m.key).decode(), cast(bytes, m.value), m.partition, m.offset)
            for topic in settings.sink_topics  # every output's topic
            for m in kafka_reading.read_topic(settings, topic)
            if snap.includes(m.headers)
        ]
        dlq = dlq_provenance(
            m for m in kafka_reading.read_topic(settings, settings.dlq_topic) if snap.includes(m.headers)
        )
    app = settings.declared_app()
    if app.audit is not None:
        rep = registry.load(app.audit)(settings, snap, sink, dlq)
    else:
        rep = invariants.check_accounting(snap.entries, snap.committed.offsets, sink, dlq)
    rep.snapshot_batch = snap.batch
    return rep
