"""Reading Kafka, bounded: committed offsets, a partition's range, a topic to its end, watermarks and offsets by
time, as a read_committed consumer sees them. Generic: nothing here knows what the records mean."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import OffsetSpec

from onceflow.config import Settings
from onceflow.kafka import surfaces
from onceflow.kafka.clients import read_committed_consumer
from onceflow.rules.sources import SourcePartition, on_topic

# How long a lookup waits for a partition that is between leaders. A killed leader's partitions move once its
# session times out (6-9 s), and a request already sent to it waits out its own timeout (LOOKUP_TIMEOUT_S) first.
LEADER_WAIT_S = 45.0
LOOKUP_TIMEOUT_S = 15.0
LEADER_MOVING = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._TRANSPORT,
    # the client's leader epoch and the broker's disagree (a broker restarted, a leader moved): asked again once the
    # client has refreshed its metadata
    KafkaError.FENCED_LEADER_EPOCH,
    KafkaError.UNKNOWN_LEADER_EPOCH,
}
STALE_EPOCH = {KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH}


def committed(consumer: surfaces.Consumer, tps: list, timeout_s: float = 60.0) -> list:
    """consumer.committed(), retried while the group coordinator is moving, loading or has an open
    transactional commit pending (read_committed asks for stable offsets)."""

    retriable = {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.UNSTABLE_OFFSET_COMMIT,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError.REQUEST_TIMED_OUT,
    }
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return consumer.committed(tps, timeout=min(30.0, max(1.0, deadline - time.monotonic())))
        except KafkaException as e:
            if e.args[0].code() not in retriable or time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def group_offsets(
    settings: Settings,
    partitions: Iterable[SourcePartition],
    *,
    group: str | None = None,
    consumer: surfaces.Consumer | None = None,
) -> list[tuple[SourcePartition, int | None, str]]:
    """What a group (default the job's) has committed on source `partitions`: (source partition, offset or None,
    its metadata). The one reader of a group's position: the job's, the reconciliation chain's, a backfill's (each
    keeps its protocol state in the offsets' metadata). `consumer`: a consumer of the group to ask instead (left
    open)."""
    c = consumer or read_committed_consumer(settings, group_id=group or settings.group_id)
    try:
        got = committed(c, [TopicPartition(sp.topic, sp.partition) for sp in sorted(partitions)])
    finally:
        if consumer is None:
            c.close()
    return [
        (SourcePartition(tp.topic, tp.partition), tp.offset if tp.offset >= 0 else None, tp.metadata or "")
        for tp in got
    ]


def consume_to_end(consumer: surfaces.Consumer, partitions: list, timeout_s: float = 120.0):
    """Yield the records of the assigned `partitions` (TopicPartitions with start offsets) until each reaches
    its end (the LSO under read_committed). Needs `enable.partition.eof`."""

    consumer.assign(partitions)
    pending = {(tp.topic, tp.partition) for tp in partitions}
    deadline = time.monotonic() + timeout_s
    while pending:
        if time.monotonic() > deadline:
            raise TimeoutError(
                "reading did not reach the end of "
                + ", ".join(f"{t}[{p}]" for t, p in sorted(pending))
                + f" in {timeout_s:.0f}s"
            )
        msg = consumer.poll(1.0)
        if msg is None:
            continue
        err = msg.error()
        if err:
            if err.code() == KafkaError._PARTITION_EOF:
                pending.discard((msg.topic(), msg.partition()))
                continue
            raise KafkaException(err)
        yield msg


def read_range(consumer: surfaces.Consumer, topic: str, partition: int, start: int, end: int, timeout_s: float = 30.0):
    """Yield the committed records of [start, end) of one partition (fewer when aborted data sits inside)."""

    if end <= start:
        return
    consumer.assign([TopicPartition(topic, partition, start)])
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                # read_committed skips aborted records and markers: done once the position passes `end - 1`.
                pos = consumer.position([TopicPartition(topic, partition)])[0].offset
                if pos >= end:
                    return
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    return
                raise KafkaException(msg.error())
            off = msg.offset()
            if off is None or off >= end:  # a record always has its offset; none would be no record of the range
                return
            yield msg
            if off >= end - 1:
                return
        raise TimeoutError(f"reading {topic}[{partition}] [{start}, {end}) did not finish in {timeout_s}s")
    finally:
        consumer.unassign()


def low_offset(admin: surfaces.Admin, tp) -> int:
    """The earliest offset still kept of one partition."""
    from confluent_kafka.admin import OffsetSpec

    return admin.list_offsets({tp: OffsetSpec.earliest()}, request_timeout=15)[tp].result(15).offset


def watermarks(settings: Settings, topic: str) -> dict[int, tuple[int, int]] | None:
    """Per partition, (low, high) of `topic` as a read_committed consumer sees them; None if there is no such
    topic."""

    c = read_committed_consumer(settings)
    try:
        md = c.list_topics(topic, timeout=10).topics.get(topic)
        if md is not None and md.error is not None and md.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            raise KafkaException(md.error)  # not allowed to see it is not "no such topic"
        if md is None or md.error is not None:
            return None
        return {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
            for p in sorted(md.partitions)
        }
    finally:
        c.close()


def source_watermarks(settings: Settings) -> dict[SourcePartition, tuple[int, int]] | None:
    """(low, high) of every partition of every source topic of the app (Settings.sources); None if one of them does
    not exist."""
    out: dict[SourcePartition, tuple[int, int]] = {}
    for topic in settings.source_topic_list:
        wm = watermarks(settings, topic)
        if wm is None:
            return None
        out.update(on_topic(topic, wm))
    return out


def offsets_at(settings: Settings, topic: str, ts_ms: int, ends: dict[int, int]) -> dict[int, int]:
    """Per partition of `ends`, the first offset whose timestamp is at or after `ts_ms`; `ends[p]` where no
    record is that recent."""

    c = read_committed_consumer(settings)
    try:
        got = c.offsets_for_times([TopicPartition(topic, p, max(ts_ms, 0)) for p in sorted(ends)], timeout=10)
        return {tp.partition: tp.offset if tp.offset >= 0 else ends[tp.partition] for tp in got}
    finally:
        c.close()


class RenewableAdmin:
    """An admin client held for many lookups (one connection, not one per lookup) that a lookup replaces with a new
    one when it answers with a stale leader epoch: librdkafka asks again with the epoch it cached (librdkafka #4620),
    so a held client answered FENCED_LEADER_EPOCH for all of LEADER_WAIT_S after a leader kill (cluster chaos seed 1,
    2026-11-29: 212 s to the next commit); a new client's metadata holds the new epoch."""

    def __init__(self, make: Callable[[], surfaces.Admin], client: surfaces.Admin | None = None):
        self._make = make
        self.client = client if client is not None else make()

    def renew(self) -> None:
        self.client = self._make()

    def list_offsets(
        self, topic_partition_offsets: dict[TopicPartition, OffsetSpec], **kwargs: Any
    ) -> Mapping[TopicPartition, Any]:
        return self.client.list_offsets(topic_partition_offsets, **kwargs)


def latest_offsets(admin: surfaces.Admin, tps: list, read_committed: bool = True) -> dict[tuple[str, int], int]:
    """The end of each partition: the last stable offset under read_committed, else the high watermark."""

    isolation = IsolationLevel.READ_COMMITTED if read_committed else IsolationLevel.READ_UNCOMMITTED
    deadline = time.monotonic() + LEADER_WAIT_S
    while True:
        futs = admin.list_offsets(
            {tp: OffsetSpec.latest() for tp in tps}, isolation_level=isolation, request_timeout=LOOKUP_TIMEOUT_S
        )
        try:
            return {(tp.topic, tp.partition): fut.result(LOOKUP_TIMEOUT_S).offset for tp, fut in futs.items()}
        except (KafkaException, TimeoutError) as e:
            # A partition between leaders (a new topic, a broker restart), or no answer from a leader that died with
            # the request (cluster chaos seed 4711: the job failed its batch on it, a restart in a broker's outage):
            # ask again, the lookup finds the new leader; bounded.
            moving = isinstance(e, TimeoutError) or e.args[0].code() in LEADER_MOVING
            if not moving or time.monotonic() >= deadline:
                raise
            if isinstance(admin, RenewableAdmin) and isinstance(e, KafkaException) and e.args[0].code() in STALE_EPOCH:
                admin.renew()
            time.sleep(0.2)


@dataclass(frozen=True)
class Msg:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict
    timestamp_ms: int = 0


def read_topic(
    settings: Settings,
    topic: str,
    isolation: str = "read_committed",
    timeout_s: float = 120.0,
    since_ms: int | None = None,
) -> list[Msg]:
    """Every visible record of a topic, from the beginning (or from the first record at or after `since_ms`)
    to the end (the LSO under read_committed)."""
    extra: dict[str, Any] = {"isolation.level": isolation, "enable.partition.eof": True, "fetch.max.bytes": 52428800}
    c = read_committed_consumer(settings, **extra)
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        if md.error is not None:
            raise KafkaException(md.error)
        start = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(md.partitions)]
        if since_ms is not None:
            start = [
                TopicPartition(topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_END)
                for tp in c.offsets_for_times(
                    [TopicPartition(topic, tp.partition, since_ms) for tp in start], timeout=10
                )
            ]
        return [_to_msg(m) for m in consume_to_end(c, start, timeout_s)]
    finally:
        c.close()


def _to_msg(m: Any) -> Msg:
    return Msg(m.partition(), m.offset(), m.key(), m.value(), {k: v for k, v in (m.headers() or [])}, m.timestamp()[1])


def read_tail(
    settings: Settings,
    topic: str,
    keep: Callable[[Msg], bool] = lambda m: True,
    want: int = 100,
    max_scan: int = 20_000,
    step: int = 2_000,
    before: int | None = None,
) -> tuple[list[Msg], int | None]:
    """The newest `want` records of a one-partition topic that `keep` accepts, oldest first, read backwards in steps
    and never more than `max_scan` records (a page of the console: bounded whatever the topic's size). `before`: an
    offset to page back from (exclusive; default the end). Returns the records and the offset to page back from
    next (None: the start of the topic was reached)."""
    wm = watermarks(settings, topic)
    if not wm:
        return [], None
    low, high = wm[0]
    end = high if before is None else min(before, high)
    found: list[Msg] = []
    c = read_committed_consumer(settings)
    try:
        scanned = 0
        while end > low and len(found) < want and scanned < max_scan:
            start = max(low, end - step)
            chunk = [m for m in (_to_msg(x) for x in read_range(c, topic, 0, start, end)) if keep(m)]
            found = chunk + found
            scanned += end - start
            end = start
    finally:
        c.close()
    if len(found) > want:
        cut = len(found) - want
        end, found = found[cut - 1].offset + 1, found[cut:]
    return found, (end if end > low else None)


def unsettled(admin: surfaces.Admin, tps: list) -> dict[tuple[str, int], tuple[int, int]]:
    """The partitions with a transaction open (last stable offset below the high watermark), with (last stable
    offset, high watermark)."""
    if not tps:
        return {}
    stable = latest_offsets(admin, tps, read_committed=True)
    high = latest_offsets(admin, tps, read_committed=False)
    return {tp: (stable[tp], high[tp]) for tp in high if stable[tp] < high[tp]}


def record_at(consumer: surfaces.Consumer, topic: str, partition: int, offset: int, timeout_s: float = 10.0) -> Any:
    """The record at `offset` as `consumer` reads it (None if none comes within `timeout_s`): with read_uncommitted,
    the first record of the transaction that holds a partition's last stable offset back."""
    consumer.assign([TopicPartition(topic, partition, offset)])
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or (msg.error() and msg.error().code() == KafkaError._PARTITION_EOF):
                continue
            if msg.error():
                return None
            return msg
        return None
    finally:
        consumer.unassign()
