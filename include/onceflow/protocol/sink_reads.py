"""What the exactly-once sink reads before it writes: the group's committed position and the app's ledger records.

`SinkReads` is the seam: `KafkaSinkReads` reads the real broker (read_committed); `onceflow.testing` has an
in-memory one over a scripted cluster, so the sink's protocol is unit-tested through every branch without a broker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from confluent_kafka import TopicPartition

from onceflow.config import Settings
from onceflow.kafka import clients as kafka_clients
from onceflow.kafka import reading as kafka_reading
from onceflow.kafka import surfaces
from onceflow.protocol import ledger_reader
from onceflow.rules import names
from onceflow.rules.ledger import Committed, LedgerEntry
from onceflow.rules.sources import SourcePartition


class SinkReads(Protocol):
    def committed(self, partitions: Iterable[SourcePartition]) -> Committed:
        """The group's committed offsets of the source partitions, with the batch their metadata names."""

    def entry(self, batch: int) -> LedgerEntry | None:
        """The app's committed stream record of ledger batch `batch` (None: not in the ledger)."""

    def newest(self) -> LedgerEntry | None:
        """The app's newest committed stream record (None: it has committed nothing)."""

    def group_metadata(self) -> Any:
        """The group's metadata for send_offsets_to_transaction."""

    def unsettled(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
        """The partitions whose last stable offset is below their high watermark (a transaction open there), with
        (last stable offset, high watermark)."""

    def opened_by(self, topic: str, partition: int, offset: int) -> dict[str, bytes]:
        """The headers of the record at `offset`, read uncommitted ({} if none): who opened the transaction that
        holds the partition's last stable offset there."""

    def close(self) -> None: ...


class KafkaSinkReads:
    """The group whose committed offsets are the job's position (it never subscribes: it supplies the group's
    metadata and reads the committed offsets back) and a read_committed reader of the ledger."""

    def __init__(
        self,
        settings: Settings,
        *,
        group: surfaces.Consumer | None = None,
        ledger: surfaces.Consumer | None = None,
        admin: surfaces.Admin | None = None,
        new_admin: Callable[[], surfaces.Admin] | None = None,
    ):
        """The clients are made from the settings unless given (onceflow.testing.kafka has scripted ones);
        `new_admin` makes the admin client, and a new one when the held one's metadata is stale."""
        self.s = settings
        self.group = group or kafka_clients.read_committed_consumer(settings, group_id=settings.group_id)
        self.ledger = ledger or kafka_clients.read_committed_consumer(
            settings, group_id=names.ledger_group(settings.app_id)
        )
        # the ledger's and the sink's offset lookups' admin client, held: one connection, not one per lookup
        self.admin = kafka_reading.RenewableAdmin(new_admin or (lambda: kafka_clients.admin(settings)), admin)

    def committed(self, partitions: Iterable[SourcePartition]) -> Committed:
        tps = [TopicPartition(sp.topic, sp.partition) for sp in sorted(partitions)]
        got = kafka_reading.committed(self.group, tps) if tps else []
        return Committed.from_partitions(
            (SourcePartition(tp.topic, tp.partition), tp.offset if tp.offset >= 0 else None, tp.metadata) for tp in got
        )

    def entry(self, batch: int) -> LedgerEntry | None:
        return ledger_reader.find_entry(self.ledger, self.s, batch, self.admin)

    def newest(self) -> LedgerEntry | None:
        return ledger_reader.newest_entry(self.ledger, self.s, self.admin)

    def group_metadata(self) -> Any:
        return self.group.consumer_group_metadata()

    def unsettled(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
        return kafka_reading.unsettled(self.admin, [TopicPartition(t, p) for t, p in partitions])

    def opened_by(self, topic: str, partition: int, offset: int) -> dict[str, bytes]:
        reader = kafka_clients.read_committed_consumer(self.s, **{"isolation.level": "read_uncommitted"})
        try:
            first = kafka_reading.record_at(reader, topic, partition, offset)
        finally:
            reader.close()
        return {k: v for k, v in (first.headers() or []) if v is not None} if first is not None else {}

    def close(self) -> None:
        for c in (self.group, self.ledger):
            try:
                c.close()
            except Exception:
                pass
