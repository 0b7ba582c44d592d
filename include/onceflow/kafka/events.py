"""Operational events and the job's status file.

Events are JSON: {"type", "app", "ts_ms", "host", "pid", ...}, keyed by the app id. They go out on an idempotent,
non-transactional producer so that they are visible even when the batch transaction they describe is aborted.

Two topics: the job's own facts (wire.JOB_EVENTS: commits, progress, transactions, lifecycle) on the app's job
events topic (`Settings.job_events_topic`), which only the job's principal may write; everyone else's events
(savepoints, restores, quarantines, backfills) on the shared `Settings.events_topic`. `read` is the one reader:
it takes each type from the topic it lives on only, so a record of a job type on the shared topic (written by a
backfill's or the control plane's principal, or another app's job) is never taken for the job's.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections.abc import Iterable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition

from onceflow import wire
from onceflow.config import Settings
from onceflow.kafka import clients as kafka_clients
from onceflow.kafka import reading
from onceflow.rules import clock

log = logging.getLogger("onceflow.events")

# The event types are part of the wire contract: onceflow.wire.


class EventBus:
    """Publishes one role's events on its topic: `EventBus.for_job` in the streaming job's processes (the job
    events topic), `EventBus(settings)` everywhere else (the shared events topic)."""

    def __init__(self, settings: Settings, producer=None, topic: str | None = None):
        self.settings = settings
        self.topic = topic or settings.events_topic
        self._producer = producer if producer is not None else kafka_clients.idempotent_producer(settings)
        self._host = socket.gethostname()
        self._lock = threading.Lock()

    def emit(self, type_: str, level: int = logging.INFO, flush: bool = False, **fields: Any) -> dict:
        event = {
            "type": type_,
            "app": self.settings.app_id,
            "ts_ms": clock.now_ms(),
            "host": self._host,
            "pid": os.getpid(),
            **fields,
        }
        log.log(level, "%s %s", type_, json.dumps(fields, default=str, sort_keys=True))
        with self._lock:
            try:
                self._producer.produce(
                    self.topic,
                    key=self.settings.app_id.encode(),
                    value=json.dumps(event, default=str).encode(),
                )
                self._producer.poll(0)
                if flush:
                    self._producer.flush(10)
            except Exception as e:  # events are best effort; the data path never fails because of them
                log.warning("could not publish event %s: %s", type_, e)
        return event

    @classmethod
    def for_job(cls, settings: Settings, producer=None) -> EventBus:
        """The bus of the streaming job's driver and supervisor: the job's own facts, on the job events topic."""
        return cls(settings, producer, topic=settings.job_events_topic)

    def close(self) -> None:
        self._producer.flush(10)
        self._producer.close()


def topics(settings: Settings) -> tuple[str, str]:
    """The app's two events topics: the job's own, the shared one."""
    return settings.job_events_topic, settings.events_topic


def _lives_on(settings: Settings, topic: str, type_: Any) -> bool:
    """Whether events of `type_` are trusted from `topic`: the job's facts from the job events topic only."""
    if topic == settings.job_events_topic:
        return type_ in wire.JOB_EVENTS or type_ in wire.ANY_ROLE_EVENTS
    return type_ not in wire.JOB_EVENTS


# The numeric fields of events: whoever reads an event may compute with them (a batch id compared, a duration
# formatted). Records come from Kafka, untrusted: a value of another type is dropped from the event when read.
NUMERIC_FIELDS = (
    "ts_ms",
    "batch",
    "ledger_batch",
    "pid",
    "elapsed_ms",
    "timeout_ms",
    "txn_ms",
    "fraction",
    "chunks",
    "rows_dropped_by_watermark",
)


def _typed(e: dict) -> bool:
    """Drop the numeric fields of `e` that are not numbers (in place); False when its type or time is unusable."""
    for k in NUMERIC_FIELDS:
        v = e.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
            del e[k]
    for k in ("host", "error", "why"):
        if e.get(k) is not None and not isinstance(e[k], str):
            e[k] = str(e[k])
    return isinstance(e.get("type"), str) and isinstance(e.get("ts_ms"), int)


def read(
    settings: Settings,
    types: Iterable[str] | None = None,
    *,
    since_ms: int | None = None,
    tail: int | None = None,
    group: str | None = None,
    any_app: bool = False,
    timeout_s: float = 120.0,
) -> list[dict]:
    """The app's events of `types` (None: every type), parsed, oldest first (merged by `ts_ms`), each type read
    from the topic it lives on only (a job fact from the job events topic, whoever else wrote one elsewhere). Records
    that are not JSON events, or not keyed by the app (`any_app`: any app's), are skipped.

    How much: every visible record (from `since_ms` if given); `tail`: the newest `tail` events only, each topic
    read backwards a page at a time (bounded: reading.read_tail); `group`: only the records this consumer group has
    not read yet, whose position it then commits (a watch that remembers what it has seen)."""
    wanted = None if types is None else frozenset(types)
    key = settings.app_id.encode()
    out: list[dict] = []
    for topic in topics(settings):
        if wanted is not None and not any(_lives_on(settings, topic, t) for t in wanted):
            continue  # none of the types lives there: the topic is not read (nor need the reader's rights on it)

        def parse(m: reading.Msg, topic: str = topic) -> dict | None:
            if m.value is None or (not any_app and m.key != key):
                return None
            try:
                e = json.loads(m.value)
            except ValueError:
                return None
            if not isinstance(e, dict) or (not any_app and e.get("app") != settings.app_id) or not _typed(e):
                return None
            t = e.get("type")
            if (wanted is not None and t not in wanted) or not _lives_on(settings, topic, t):
                return None
            return e

        if tail is not None:
            msgs, _ = reading.read_tail(settings, topic, lambda m: parse(m) is not None, want=tail)
        elif group is not None:
            msgs = _unseen(settings, topic, group, timeout_s)
        else:
            msgs = reading.read_topic(settings, topic, since_ms=since_ms, timeout_s=timeout_s)
        out += [e for e in map(parse, msgs) if e is not None]
    out.sort(key=lambda e: e.get("ts_ms") or 0)  # stable: each topic's own order is kept among equal times
    return out[-tail:] if tail is not None and tail > 0 else out


def _unseen(settings: Settings, topic: str, group: str, timeout_s: float) -> list[reading.Msg]:
    """The records of `topic` past `group`'s committed position (from the start if it has none); commits the new
    position."""
    c = kafka_clients.read_committed_consumer(settings, group_id=group, **{"enable.partition.eof": True})
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        if md.error is not None:
            raise KafkaException(md.error)
        committed = reading.committed(c, [TopicPartition(topic, p) for p in sorted(md.partitions)])
        start = [
            TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING)
            for tp in committed
        ]
        out, last = [], {}
        for m in reading.consume_to_end(c, start, timeout_s):
            last[m.partition()] = m.offset() + 1
            out.append(reading.Msg(m.partition(), m.offset(), m.key(), m.value(), {}, m.timestamp()[1]))
        if last:
            c.commit(offsets=[TopicPartition(topic, p, o) for p, o in last.items()], asynchronous=False)
        return out
    finally:
        c.close()
