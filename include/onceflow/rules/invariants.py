"""What an audit decides for any app, as pure functions over plain data (no I/O): I1 (coverage) and the ledger's
accounting of every sink and DLQ record (docs/design.md, section 5), and the report an app's own key-by-key audit
fills in too (ip_count's I2 and I3: onceflow_apps.ip_count_invariants).

Inputs are what an auditor reads back: the ledger entries, the group's committed offsets, the committed sink
records and the DLQ records. `onceflow.operations.audit` does the reading; this module only decides.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from onceflow.rules.ledger import CoverageReport, LedgerEntry, check_coverage
from onceflow.rules.sources import SourcePartition


@dataclass(frozen=True)
class SinkRecord:
    key: str
    value: bytes
    partition: int = 0
    offset: int = 0


class BatchIndex:
    """Which committed batch holds (source partition, offset), and with which watermark."""

    def __init__(self, entries: Iterable[LedgerEntry]):
        self._starts: dict[SourcePartition, list[int]] = {}
        self._rows: dict[SourcePartition, list[tuple[int, int, LedgerEntry]]] = {}
        for e in sorted(entries, key=lambda e: e.batch):
            for p, (s, end) in e.ranges.items():
                if end > s:
                    self._rows.setdefault(p, []).append((s, end, e))
        for p, rows in self._rows.items():
            rows.sort(key=lambda r: r[0])
            self._starts[p] = [r[0] for r in rows]

    def find(self, partition: SourcePartition, offset: int) -> LedgerEntry | None:
        starts = self._starts.get(partition)
        if not starts:
            return None
        i = bisect_right(starts, offset) - 1
        if i < 0:
            return None
        s, end, e = self._rows[partition][i]
        return e if s <= offset < end else None


@dataclass
class Report:
    coverage: CoverageReport
    expected_keys: int = 0
    sink_records: int = 0
    duplicates: dict[str, int] = field(default_factory=dict)  # key -> times seen
    missing: dict[str, int] = field(default_factory=dict)  # key -> expected count
    unexpected: dict[str, int] = field(default_factory=dict)  # key -> count found
    wrong: dict[str, tuple[int, int]] = field(default_factory=dict)  # key -> (expected, found)
    malformed_values: list[str] = field(default_factory=list)
    dlq_missing: list[tuple[SourcePartition, int]] = field(default_factory=list)  # (partition, offset)
    dlq_unexpected: list[tuple[SourcePartition, int]] = field(default_factory=list)
    dlq_duplicates: list[tuple[SourcePartition, int]] = field(default_factory=list)
    ledger_outputs: int = 0
    ledger_dlq: int = 0
    late: int = 0
    pending: int = 0
    malformed: int = 0
    counted: int = 0
    snapshot_batch: int | None = None  # the last committed batch the check covers
    # accounting only (check_accounting: an app without its own audit): DLQ records seen, to equal ledger_dlq
    dlq_records: int | None = None

    @property
    def ok(self) -> bool:
        return (
            self.coverage.ok
            and not (
                self.duplicates
                or self.missing
                or self.unexpected
                or self.wrong
                or self.malformed_values
                or self.dlq_missing
                or self.dlq_unexpected
                or self.dlq_duplicates
            )
            and self.ledger_outputs == self.sink_records
            and (self.dlq_records is None or self.dlq_records == self.ledger_dlq)
        )

    def summary(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "snapshot_batch": self.snapshot_batch,
            "batches": self.coverage.batches,
            "coverage_issues": [i.detail for i in self.coverage.issues][:20],
            "sink_records": self.sink_records,
            "ledger_outputs": self.ledger_outputs,
            "expected_keys": self.expected_keys,
            "counted": self.counted,
            "late": self.late,
            "pending": self.pending,
            "malformed": self.malformed,
            "ledger_dlq": self.ledger_dlq,
            **({} if self.dlq_records is None else {"dlq_records": self.dlq_records}),
            "duplicates": dict(list(self.duplicates.items())[:20]),
            "missing": dict(list(self.missing.items())[:20]),
            "unexpected": dict(list(self.unexpected.items())[:20]),
            "wrong": dict(list(self.wrong.items())[:20]),
            "malformed_values": self.malformed_values[:5],
            "dlq_missing": self.dlq_missing[:20],
            "dlq_unexpected": self.dlq_unexpected[:20],
            "dlq_duplicates": self.dlq_duplicates[:20],
        }


def check_accounting(
    entries: Sequence[LedgerEntry],
    committed: Mapping[SourcePartition, int] | None,
    sink: Iterable[SinkRecord],
    dlq: Iterable[tuple[SourcePartition, int]],
    starting: Mapping[SourcePartition, int] | None = None,
) -> Report:
    """What holds for any app, without knowing what its results mean: I1 (coverage), one sink record for each
    output and one DLQ record for each reject the committed batches counted (a foreign or doubled record, or one
    lost, breaks the count), and each DLQ record once, naming a source record of a committed batch. Keys may
    repeat: what a result is, and so whether its key is unique, is the app's (its own `audit`, and the replay of
    its plan in the reconciliation)."""
    rep = Report(coverage=check_coverage(entries, committed, starting))
    rep.ledger_outputs = sum(e.outputs for e in entries)
    rep.ledger_dlq = sum(e.dlq for e in entries)
    rep.sink_records = sum(1 for _ in sink)
    index = BatchIndex(entries)
    seen = Counter(dlq)
    rep.dlq_records = sum(seen.values())
    rep.dlq_duplicates = sorted(k for k, n in seen.items() if n > 1)
    rep.dlq_unexpected = sorted(k for k in seen if index.find(*k) is None)
    return rep
