"""The ledger records of operator actions (a restore, a quarantine), written in a transaction of the app's own
transactional id: opening it fences every driver of the app that may still be alive somewhere, so nothing the
action checked can change under it, and the record is committed exactly once or not at all."""

from __future__ import annotations

from collections.abc import Callable

from onceflow import wire
from onceflow.config import Settings
from onceflow.kafka import clients as kafka_clients
from onceflow.kafka.transactional import OutcomeUnknown, TransactionalWriter


def app_writer(settings: Settings) -> TransactionalWriter:
    """A writer under the app's transactional id; creating it fences the app's drivers (init_transactions)."""
    return TransactionalWriter(
        lambda: kafka_clients.transactional_producer(settings, settings.transactional_id),
        settings.transactional_id,
        settings.transaction_timeout_ms,
        commit_timeout_s=settings.commit_timeout_s,
    )


def commit_record(
    writer: TransactionalWriter,
    settings: Settings,
    value: bytes,
    kind: str,
    landed: Callable[[Settings, bytes], bool] | None = None,
) -> None:
    """One ledger record (key: the app id) in its own transaction. Returns once it is committed; raises when it is
    not. A commit whose outcome is unknown is read back first (`landed`): the writer's replaced producer settled it
    either way, and a caller that undid a record which did commit (a quarantine, a restore) would leave the ledger
    saying what the checkpoint no longer holds."""
    landed = landed or record_landed
    try:
        with writer.transaction():
            writer.produce(
                settings.ledger_topic,
                settings.app_id.encode(),
                value,
                [(wire.H_APP, settings.app_id.encode()), (wire.H_KIND, kind.encode())],
            )
    except OutcomeUnknown:
        if landed(settings, value):
            return
        raise


def record_landed(settings: Settings, value: bytes) -> bool:
    """Is this exact record committed on the app's ledger (read_committed)?"""
    from onceflow.kafka import reading as kafka_reading

    key = settings.app_id.encode()
    return any(m.key == key and m.value == value for m in kafka_reading.read_topic(settings, settings.ledger_topic))
