"""An in-memory Kafka for unit tests: transactions, group offsets, fencing, and producers that fail on script.

    cluster = FakeCluster()
    sink = ExactlyOnceSink(settings, bus=cluster.bus(settings), producer_factory=cluster.producer_factory(tid),
                           reads=FakeSinkReads(cluster, settings))

`script` maps a producer method to the outcomes of its calls, in order: None (the call succeeds), an exception
(raised, nothing applied), `Slow(seconds, exception)` (the call takes that long first) or `Landed(exception)` (a
commit that is applied and then reported failed, as a commit that timed out after the broker had it). Every call is recorded in `calls` as (producer name, method).

`ScriptedConsumer` and `ScriptedAdmin` read the same cluster as read_committed clients do (what a committed
transaction wrote, up to an open transaction's first offset, `FakeCluster.hold`), with the same scripts. The three
are typed against onceflow.kafka.surfaces, the surfaces the platform calls on the real clients.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec

from onceflow import wire
from onceflow.config import Settings
from onceflow.kafka import events as ev
from onceflow.kafka import surfaces
from onceflow.rules.ledger import Committed, LedgerEntry, parse_record
from onceflow.rules.sources import SourcePartition


def kafka_error(code: int, fatal: bool = False, retriable: bool = False, abortable: bool = False) -> KafkaException:
    """A KafkaException as librdkafka raises it, with its flags."""
    return KafkaException(
        KafkaError(code, f"scripted {code}", fatal=fatal, retriable=retriable, txn_requires_abort=abortable)
    )


@dataclass(frozen=True)
class Landed:
    """A scripted commit outcome: the commit is applied, then `error` is raised (its outcome looked unknown)."""

    error: BaseException


@dataclass(frozen=True)
class Slow:
    """A scripted outcome: the call takes `seconds`, then raises `error` (if any): a transaction that runs into
    its timeout."""

    seconds: float
    error: BaseException | None = None


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple = ()


class Delivered:
    """The message object a delivery callback gets."""

    def __init__(self, r: Record):
        self._r = r

    def topic(self) -> str:
        return self._r.topic

    def key(self) -> bytes | None:
        return self._r.key

    def partition(self) -> int:
        return self._r.partition

    def offset(self) -> int:
        return self._r.offset


@dataclass
class FakeCluster:
    """What is committed: records per topic (partition 0 unless given), group offsets with their metadata, and the
    newest producer epoch per transactional id."""

    records: dict[str, list[Record]] = field(default_factory=dict)
    groups: dict[str, dict[tuple[str, int], tuple[int, str | None]]] = field(default_factory=dict)
    epochs: dict[str, int] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    # (topic, partition) -> the first offset of another producer's open transaction: read_committed readers see
    # nothing from there on (the last stable offset), the high watermark runs on
    hold: dict[tuple[str, int], int] = field(default_factory=dict)
    partitions: dict[str, int] = field(default_factory=dict)  # a topic's partitions (default: those written, or 1)

    def topic(self, name: str) -> list[Record]:
        return self.records.get(name, [])

    def partition(self, topic: str, partition: int) -> list[Record]:
        return [r for r in self.topic(topic) if r.partition == partition]

    def high_watermark(self, topic: str, partition: int) -> int:
        return len(self.partition(topic, partition))

    def stable_offset(self, topic: str, partition: int) -> int:
        """The last stable offset: the end of what read_committed sees."""
        return min(self.high_watermark(topic, partition), self.hold.get((topic, partition), 1 << 62))

    def append(self, topic: str, key: bytes | None, value: bytes | None, headers=None, partition: int = 0) -> Record:
        log = self.records.setdefault(topic, [])
        r = Record(topic, partition, self.high_watermark(topic, partition), key, value, tuple(headers or ()))
        log.append(r)
        return r

    def producer_factory(
        self, transactional_id: str, scripts: Iterable[dict[str, list[Any]]] = (), fail_delivery: bytes | None = None
    ) -> Callable[[], surfaces.Producer]:
        """Makes the producers a writer asks for, in order: the n-th gets the n-th script (later ones none)."""
        queue = list(scripts)
        made: list[ScriptedProducer] = []

        def make() -> ScriptedProducer:
            p = ScriptedProducer(
                f"p{len(made)}", self.calls, queue.pop(0) if queue else {}, fail_delivery, self, transactional_id
            )
            made.append(p)
            return p

        return make

    def bus(self, settings: Settings) -> ev.EventBus:
        """An event bus whose events land on the cluster's events topic (read them with `events`)."""
        return ev.EventBus(settings, producer=ScriptedProducer("bus", [], {}, None, self, None))

    def events(self, settings: Settings, type_: str | None = None) -> list[dict]:
        out = [json.loads(r.value or b"{}") for r in self.topic(settings.events_topic)]
        return [e for e in out if type_ is None or e["type"] == type_]


class ScriptedProducer:
    """confluent_kafka.Producer's calls the platform makes, on a FakeCluster (or on none: nothing is kept)."""

    def __init__(
        self,
        name: str,
        calls: list[tuple[str, str]],
        script: dict[str, list[Any]] | None = None,
        fail_delivery: bytes | None = None,
        cluster: FakeCluster | None = None,
        transactional_id: str | None = None,
    ):
        self.name, self.calls = name, calls
        self.script = {k: list(v) for k, v in (script or {}).items()}
        self.fail_delivery, self.cluster, self.transactional_id = fail_delivery, cluster, transactional_id
        self.epoch = 0
        self.pending: list[tuple[Any, str, bytes | None, bytes | None, Any, int]] = []
        self.offsets: tuple[str, list[Any]] | None = None

    def _call(self, method: str) -> Landed | None:
        return _scripted(self.name, self.calls, self.script, method)

    def _fenced(self) -> bool:
        c, tid = self.cluster, self.transactional_id
        return c is not None and tid is not None and c.epochs.get(tid, 0) != self.epoch

    def init_transactions(self, timeout: float = -1) -> None:
        self._call("init_transactions")
        if self.cluster is not None and self.transactional_id is not None:
            self.epoch = self.cluster.epochs.get(self.transactional_id, 0) + 1
            self.cluster.epochs[self.transactional_id] = self.epoch  # the older producer of the id is fenced

    def begin_transaction(self) -> None:
        self._call("begin_transaction")
        self.pending, self.offsets = [], None

    def produce(self, topic, key=None, value=None, headers=None, on_delivery=None, partition=None) -> None:
        self._call("produce")
        self.pending.append((on_delivery, topic, key, value, headers, partition or 0))
        if (
            self.cluster is not None and self.transactional_id is None
        ):  # not transactional (the event bus): kept at once
            self._apply()

    def poll(self, timeout: float = -1) -> int:
        self.calls.append((self.name, "poll"))
        return 0

    def flush(self, timeout: float = -1) -> int:
        return 0

    def send_offsets_to_transaction(self, offsets, metadata, timeout: float = -1) -> None:
        self._call("send_offsets_to_transaction")
        self.offsets = (str(metadata), list(offsets))

    def commit_transaction(self, timeout: float = -1) -> None:
        if self._fenced():
            self.pending, self.offsets = [], None
            raise kafka_error(KafkaError._FENCED, fatal=True)
        for cb, topic, key, _value, _headers, partition in self.pending:  # deliveries are reported on the flush
            err = (
                KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "Broker: Message size too large")
                if self.fail_delivery is not None and self.fail_delivery == key
                else None
            )
            if cb is not None:
                cb(err, Delivered(Record(topic, partition, -1, key, None)))
        landed = self._call("commit_transaction")
        self._apply()
        if landed is not None:
            raise landed.error

    def _apply(self) -> None:
        if self.cluster is not None:
            for _cb, topic, key, value, headers, partition in self.pending:
                self.cluster.append(topic, key, value, headers, partition)
            if self.offsets is not None:
                group, tps = self.offsets
                offs = self.cluster.groups.setdefault(group, {})
                for tp in tps:
                    offs[(tp.topic, tp.partition)] = (tp.offset, tp.metadata)
        self.pending, self.offsets = [], None

    def abort_transaction(self, timeout: float = -1) -> None:
        self.pending, self.offsets = [], None
        self._call("abort_transaction")

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        self.calls.append((self.name, "purge"))

    def close(self) -> None:
        self.calls.append((self.name, "close"))


def _scripted(name: str, calls: list[tuple[str, str]], script: dict[str, list[Any]], method: str) -> Landed | None:
    """A scripted client call, for every fake client: record it, then play its next scripted outcome, if any (None:
    it succeeds; an exception: raised; Slow: wait, then its error; Landed: returned, for the caller to apply)."""
    calls.append((name, method))
    outcomes = script.get(method)
    if outcomes:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Landed):
            return outcome
        if isinstance(outcome, Slow):
            time.sleep(outcome.seconds)
            outcome = outcome.error
        if outcome is not None:
            raise outcome
    return None


class FakeMessage:
    """A consumed record, or the end of a partition (`enable.partition.eof`), as confluent_kafka's Message."""

    def __init__(self, r: Record | None = None, eof: tuple[str, int, int] | None = None):
        self._r, self._eof = r, eof

    def topic(self) -> str | None:
        return self._r.topic if self._r else self._eof[0] if self._eof else None

    def partition(self) -> int | None:
        return self._r.partition if self._r else self._eof[1] if self._eof else None

    def offset(self) -> int | None:
        return self._r.offset if self._r else self._eof[2] if self._eof else None

    def key(self) -> bytes | None:
        return self._r.key if self._r else None

    def value(self) -> bytes | None:
        return self._r.value if self._r else None

    def headers(self) -> Any:
        return list(self._r.headers) if self._r and self._r.headers else None

    def timestamp(self) -> tuple[int, int]:
        return (1, 0)

    def error(self) -> Any:
        return KafkaError(KafkaError._PARTITION_EOF) if self._eof else None


@dataclass(frozen=True)
class _Partition:
    id: int
    leader: int = 1


@dataclass(frozen=True)
class _Topic:
    partitions: dict[int, _Partition]
    error: Any = None


@dataclass(frozen=True)
class _Metadata:
    topics: dict[str, _Topic]


class ScriptedConsumer:
    """A read_committed consumer of a FakeCluster, assigned partitions (it never subscribes); `group_id`'s committed
    offsets are the cluster's. `poll` returns at once: a record, the end of a partition (with `eof`), or None."""

    def __init__(
        self,
        cluster: FakeCluster,
        group_id: str | None = None,
        script: dict[str, list[Any]] | None = None,
        eof: bool = False,
        name: str = "consumer",
    ):
        self.cluster, self.group_id, self.eof, self.name = cluster, group_id, eof, name
        self.script = {k: list(v) for k, v in (script or {}).items()}
        self.positions: dict[tuple[str, int], int] = {}
        self._at_end: set[tuple[str, int]] = set()  # partitions whose end was reported at their position

    def assign(self, partitions: list[TopicPartition], /) -> None:
        _scripted(self.name, self.cluster.calls, self.script, "assign")
        self.positions, self._at_end = {}, set()
        for tp in partitions:
            end = self.cluster.stable_offset(tp.topic, tp.partition)
            start = 0 if tp.offset in (OFFSET_BEGINNING, -1001) else end if tp.offset == OFFSET_END else tp.offset
            self.positions[(tp.topic, tp.partition)] = start

    def unassign(self) -> None:
        self.positions, self._at_end = {}, set()

    def poll(self, timeout: float = -1) -> FakeMessage | None:
        _scripted(self.name, self.cluster.calls, self.script, "poll")
        for (topic, p), pos in self.positions.items():
            if pos < self.cluster.stable_offset(topic, p):
                self.positions[(topic, p)] = pos + 1
                self._at_end.discard((topic, p))
                return FakeMessage(self.cluster.partition(topic, p)[pos])
            if self.eof and (topic, p) not in self._at_end:
                self._at_end.add((topic, p))
                return FakeMessage(eof=(topic, p, pos))
        return None

    def position(self, partitions: list[TopicPartition], /) -> list[TopicPartition]:
        return [
            TopicPartition(tp.topic, tp.partition, self.positions.get((tp.topic, tp.partition), -1001))
            for tp in partitions
        ]

    def committed(self, partitions: list[TopicPartition], timeout: float = -1) -> list[TopicPartition]:
        _scripted(self.name, self.cluster.calls, self.script, "committed")
        offs = self.cluster.groups.get(self.group_id or "", {})
        out = []
        for tp in partitions:
            off, meta = offs.get((tp.topic, tp.partition), (-1001, None))
            got = TopicPartition(tp.topic, tp.partition, off)
            out.append(got if meta is None else TopicPartition(tp.topic, tp.partition, off, meta))
        return out

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int] | None:
        return 0, self.cluster.high_watermark(partition.topic, partition.partition)

    def offsets_for_times(self, partitions: list[TopicPartition], timeout: float = -1) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, -1) for tp in partitions]  # the fake's records carry no time

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> _Metadata:
        names = [topic] if topic is not None else sorted(set(self.cluster.records) | set(self.cluster.partitions))
        out = {}
        for name in names:
            n = self.cluster.partitions.get(name) or 1 + max((r.partition for r in self.cluster.topic(name)), default=0)
            out[name] = _Topic({p: _Partition(p) for p in range(n)})
        return _Metadata(out)

    def consumer_group_metadata(self) -> Any:
        return self.group_id

    def close(self) -> None:
        self.cluster.calls.append((self.name, "close"))


class _Done:
    """A finished admin request, as the future confluent_kafka returns."""

    def __init__(self, value: Any = None, error: BaseException | None = None):
        self.value, self.error = value, error

    def result(self, timeout: float | None = None) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


@dataclass(frozen=True)
class _Offset:
    offset: int


_EARLIEST = type(OffsetSpec.earliest())


class ScriptedAdmin:
    """An admin client's offset lookups on a FakeCluster: the earliest offset (0), the high watermark, and under
    read_committed the last stable offset. A scripted error fails the lookup's results, as a leader moving does."""

    def __init__(self, cluster: FakeCluster, script: dict[str, list[Any]] | None = None, name: str = "admin"):
        self.cluster, self.name = cluster, name
        self.script = {k: list(v) for k, v in (script or {}).items()}

    def list_offsets(
        self, topic_partition_offsets: dict[TopicPartition, OffsetSpec], **kwargs: Any
    ) -> dict[TopicPartition, _Done]:
        try:
            _scripted(self.name, self.cluster.calls, self.script, "list_offsets")
        except BaseException as e:
            return {tp: _Done(error=e) for tp in topic_partition_offsets}
        committed = kwargs.get("isolation_level") == IsolationLevel.READ_COMMITTED
        out = {}
        for tp, spec in topic_partition_offsets.items():
            if isinstance(spec, _EARLIEST):
                off = 0
            elif committed:
                off = self.cluster.stable_offset(tp.topic, tp.partition)
            else:
                off = self.cluster.high_watermark(tp.topic, tp.partition)
            out[tp] = _Done(_Offset(off))
        return out


def _conforms(cluster: FakeCluster) -> tuple[surfaces.Consumer, surfaces.Admin]:
    """The fakes are the surfaces the platform calls (mypy checks this)."""
    return ScriptedConsumer(cluster), ScriptedAdmin(cluster)


class FakeSinkReads:
    """onceflow.protocol.sink_reads.SinkReads over a FakeCluster: the app's group offsets and ledger records."""

    def __init__(self, cluster: FakeCluster, settings: Settings):
        self.cluster, self.s = cluster, settings

    def committed(self, partitions: Iterable[SourcePartition]) -> Committed:
        offs = self.cluster.groups.get(self.s.group_id, {})
        return Committed.from_partitions(
            (p, *offs.get((p.topic, p.partition), (None, None))) for p in sorted(partitions)
        )

    def _entries(self) -> list[LedgerEntry]:
        key = self.s.app_id.encode()
        out = []
        for r in self.cluster.topic(self.s.ledger_topic):
            rec = parse_record(r.value or b"")
            if r.key == key and isinstance(rec, LedgerEntry) and rec.kind == wire.LEDGER_STREAM:
                out.append(rec)
        return out

    def entry(self, batch: int) -> LedgerEntry | None:
        return next((e for e in reversed(self._entries()) if e.batch == batch), None)

    def newest(self) -> LedgerEntry | None:
        entries = self._entries()
        return entries[-1] if entries else None

    def group_metadata(self) -> Any:
        return self.s.group_id

    def unsettled(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
        c = self.cluster
        out = {(t, p): (c.stable_offset(t, p), c.high_watermark(t, p)) for t, p in partitions}
        return {tp: v for tp, v in out.items() if v[0] < v[1]}

    def opened_by(self, topic: str, partition: int, offset: int) -> dict[str, bytes]:
        at = [r for r in self.cluster.partition(topic, partition) if r.offset == offset]
        return dict(at[0].headers) if at else {}

    def close(self) -> None:
        pass
