"""An in-memory Kafka for unit tests: transactions, group offsets, fencing, and producers that fail on script.

    cluster = FakeCluster()
    sink = ExactlyOnceSink(settings, bus=cluster.bus(settings), producer_factory=cluster.producer_factory(tid),
                           reads=FakeSinkReads(cluster, settings))

`script` maps a producer method to the outcomes of its calls, in order: None (the call succeeds), an exception
(raised, nothing applied), `Slow(seconds, exception)` (the call takes that long first) or `Landed(exception)` (a
commit that is applied and then reported failed, as a commit that timed out after the broker had it). Every call is recorded in `calls` as (producer name, method).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from onceflow import wire
from onceflow.config import Settings
from onceflow.kafka import events as ev
from onceflow.rules.ledger import Committed, LedgerEntry, parse_record


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

    def topic(self, name: str) -> list[Record]:
        return self.records.get(name, [])

    def append(self, topic: str, key: bytes | None, value: bytes | None, headers=None, partition: int = 0) -> Record:
        log = self.records.setdefault(topic, [])
        r = Record(topic, partition, len(log), key, value, tuple(headers or ()))
        log.append(r)
        return r

    def producer_factory(
        self, transactional_id: str, scripts: Iterable[dict[str, list[Any]]] = (), fail_delivery: bytes | None = None
    ) -> Callable[[], ScriptedProducer]:
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
        self.calls.append((self.name, method))
        outcomes = self.script.get(method)
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

    def _fenced(self) -> bool:
        c, tid = self.cluster, self.transactional_id
        return c is not None and tid is not None and c.epochs.get(tid, 0) != self.epoch

    def init_transactions(self, timeout: float) -> None:
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

    def poll(self, timeout: float) -> int:
        self.calls.append((self.name, "poll"))
        return 0

    def flush(self, timeout: float) -> int:
        return 0

    def send_offsets_to_transaction(self, offsets, metadata, timeout) -> None:
        self._call("send_offsets_to_transaction")
        self.offsets = (str(metadata), list(offsets))

    def commit_transaction(self, timeout: float) -> None:
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

    def abort_transaction(self, timeout: float) -> None:
        self.pending, self.offsets = [], None
        self._call("abort_transaction")

    def purge(self, **kw: Any) -> None:
        self.calls.append((self.name, "purge"))

    def close(self) -> None:
        self.calls.append((self.name, "close"))


class FakeSinkReads:
    """onceflow.protocol.sink_reads.SinkReads over a FakeCluster: the app's group offsets and ledger records."""

    def __init__(self, cluster: FakeCluster, settings: Settings):
        self.cluster, self.s = cluster, settings

    def committed(self, partitions: Iterable[int]) -> Committed:
        offs = self.cluster.groups.get(self.s.group_id, {})
        return Committed.from_partitions(
            (p, *offs.get((self.s.source_topic, p), (None, None))) for p in sorted(partitions)
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

    def close(self) -> None:
        pass
