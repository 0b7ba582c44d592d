"""Quarantine: the operator's way past a batch that can never commit (`onceflow quarantine add|list`).

A batch whose transaction fails for good on one source record (its output refused by the broker every time)
would be replayed from the same `offsets/N` after every restart: the job could never get past it. The operator
quarantines that record's offsets; from the next start, the job (and every reader that recounts: the reference
parser, reconciliation, the audit) classifies them as `quarantined`: they go to the DLQ with their provenance,
original size and sha256, but without the payload. I1-I4 hold: each quarantined record is accounted for once, in
the DLQ.

Rules, checked before anything is written: the job is stopped (and no start can begin: the app's start lock is
held); every driver of the app is fenced; the offsets exist in the source and are not yet committed (quarantining
a committed record would rewrite history). The quarantine is recorded in the checkpoint's
`onceflow/quarantine.json`, which the job reads at start (a restore rewrites that file from the ledger), and in the
ledger, in a transaction of the app's transactional id; a failed ledger commit puts the file back.
"""

from __future__ import annotations

import getpass
import json
import logging

from onceflow import wire
from onceflow.config import Settings
from onceflow.kafka import events as ev
from onceflow.kafka import reading as kafka_reading
from onceflow.operations import audit
from onceflow.protocol import ledger_writes, sinks
from onceflow.rules import clock
from onceflow.rules.checkpoint import QUARANTINE_FILE, render_quarantine
from onceflow.rules.ledger import QuarantineRange, QuarantineRecord
from onceflow.rules.sources import SourcePartition
from onceflow.runtime import jobctl
from onceflow.wire import OnceflowError

log = logging.getLogger(__name__)


class QuarantineError(OnceflowError, ValueError):
    """The quarantine is refused; nothing was written. The message says why."""


def current(settings: Settings) -> list[QuarantineRange]:
    """The ranges in force for the job (its checkpoint's copy)."""
    from onceflow.storage.store import Store

    store = Store(settings.checkpoint)
    if not store.exists(QUARANTINE_FILE):
        return []
    return [QuarantineRange(**r) for r in json.loads(store.read(QUARANTINE_FILE))]


def add(
    settings: Settings,
    partition: int,
    start: int,
    end: int,
    reason: str,
    by: str | None = None,
    topic: str | None = None,
) -> QuarantineRecord:
    """Quarantine source offsets [start, end) of `partition` of source `topic` (default the app's source topic). Under the app's start lock (no start here can slip
    in) and after fencing every driver of the app anywhere (the app's transactional id), so what is checked cannot
    change before it is written. The checkpoint's copy is written first and the ledger record committed second; if
    the commit fails the copy is put back: the job never runs with a quarantine the ledger does not record."""
    from onceflow.storage.store import Store

    if not reason.strip():
        raise QuarantineError("say why the records are quarantined (--reason): the ledger keeps it")
    if end <= start:
        raise QuarantineError(f"the range [{start}, {end}) is empty")
    topic = topic or settings.source_topic
    if topic not in settings.source_topic_list:
        raise QuarantineError(
            f"{topic} is not a source topic of app {settings.app_id} (its source topics: "
            f"{', '.join(settings.source_topic_list)})"
        )
    at = SourcePartition(topic, partition)
    with jobctl.start_lock(settings):
        running = jobctl.still_running(settings)
        if running:
            raise QuarantineError(
                f"app {settings.app_id} is running ({running}): stop it first (`onceflow job stop`); the job "
                f"reads the quarantine when it starts"
            )
        wm = kafka_reading.watermarks(settings, topic) or {}
        if partition not in wm:
            raise QuarantineError(f"the source topic {topic} has no partition {partition}")
        if end > wm[partition][1]:
            raise QuarantineError(f"{at} ends at offset {wm[partition][1]}; {end} is beyond it")
        writer = sinks.operator_writer(settings, "quarantine")  # fences any driver of the app, here or elsewhere
        try:
            snap = audit.snapshot(settings)  # after the fence: nothing can commit past it any more
            done = (
                snap.committed.offsets.get(at)
                if snap.committed.offsets
                else (snap.entries[-1].end.get(at) if snap.entries else None)
            )
            if done is not None and start < done:
                raise QuarantineError(
                    f"offsets of {at} below {done} are committed already: a "
                    f"quarantine applies only to records the job has not processed yet"
                )
            record = QuarantineRecord(
                app=settings.app_id,
                topic=topic,
                ranges=(QuarantineRange(partition, start, end, topic),),
                reason=reason.strip(),
                by=by or getpass.getuser(),
                ts_ms=clock.now_ms(),
            )
            store, before = Store(settings.checkpoint), current(settings)
            store.write(QUARANTINE_FILE, render_quarantine(before + list(record.ranges)).encode())
            try:
                ledger_writes.commit_record(writer, settings, record.to_json(), wire.LEDGER_QUARANTINE)
            except BaseException:
                store.write(QUARANTINE_FILE, render_quarantine(before).encode())
                raise
        finally:
            writer.close()
    ev.EventBus(settings).emit(
        wire.RECORDS_QUARANTINED,
        logging.WARNING,
        flush=True,
        topic=topic,
        partition=partition,
        start=start,
        end=end,
        reason=record.reason,
        by=record.by,
    )
    log.warning("quarantined %s [%d, %d): %s", at, start, end, record.reason)
    return record


def records(settings: Settings) -> list[QuarantineRecord]:
    return [r for r in audit.ledger_records(settings) if isinstance(r, QuarantineRecord)]
