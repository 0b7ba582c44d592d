"""Which sink an app's job writes (Settings.sink_kind): its Kafka topics or a PostgreSQL table. Both run the same
protocol (onceflow.protocol.batch_sink: decide, then one transaction per batch with its ledger record)."""

from __future__ import annotations

from onceflow.config import Settings
from onceflow.faults import Injector
from onceflow.kafka import events as ev
from onceflow.kafka.transactional import TransactionalWriter
from onceflow.protocol import ledger_writes
from onceflow.protocol.batch_sink import BatchSink
from onceflow.protocol.exactly_once import ExactlyOnceSink


def open_sink(settings: Settings, bus: ev.EventBus, faults: Injector | None = None) -> BatchSink:
    """The app's sink, connected; opening it fences the app's previous driver."""
    if settings.sink_kind == "postgres":
        from onceflow.protocol.database_sink import DatabaseSink  # psycopg only where a database is the sink

        return DatabaseSink(settings, bus, faults)
    return ExactlyOnceSink(settings, bus, faults)


def operator_writer(settings: Settings, action: str) -> TransactionalWriter:
    """The writer of an operator's ledger record (`action`: a restore, a quarantine), opened after every driver of
    the app, here or elsewhere, is fenced: by the app's transactional id (creating the writer does it) and, for a
    table sink, whose drivers write no Kafka transaction, by its writer row's next generation as well."""
    writer = ledger_writes.app_writer(settings)
    if settings.sink_kind == "postgres":
        from onceflow.protocol.database_sink import fence

        try:
            fence(settings, holder=f"{settings.app_id}:{action}")
        except BaseException:
            writer.close()
            raise
    return writer
