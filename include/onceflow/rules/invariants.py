"""The invariants I1-I4 (docs/design.md, section 5), as pure functions over plain data (no I/O).

Inputs are what an auditor reads back: the ledger entries, the group's committed offsets, the source records
of the committed ranges (already classified: ts and ip, or a malformed reason), the committed sink records and
the DLQ records. `audit.py` does the reading; this module only decides.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from onceflow.rules import records
from onceflow.rules.ledger import CoverageReport, LedgerEntry, check_coverage


@dataclass(frozen=True)
class SourceRecord:
    partition: int
    offset: int
    ts_us: int | None
    ip: str | None
    reason: str | None = None


@dataclass(frozen=True)
class SinkRecord:
    key: str
    value: bytes
    partition: int = 0
    offset: int = 0


class BatchIndex:
    """Which committed batch holds (partition, offset), and with which watermark."""

    def __init__(self, entries: Iterable[LedgerEntry]):
        self._starts: dict[int, list[int]] = {}
        self._rows: dict[int, list[tuple[int, int, LedgerEntry]]] = {}
        for e in sorted(entries, key=lambda e: e.batch):
            for p, (s, end) in e.ranges.items():
                if end > s:
                    self._rows.setdefault(p, []).append((s, end, e))
        for p, rows in self._rows.items():
            rows.sort(key=lambda r: r[0])
            self._starts[p] = [r[0] for r in rows]

    def find(self, partition: int, offset: int) -> LedgerEntry | None:
        starts = self._starts.get(partition)
        if not starts:
            return None
        i = bisect_right(starts, offset) - 1
        if i < 0:
            return None
        s, end, e = self._rows[partition][i]
        return e if s <= offset < end else None


@dataclass
class Expected:
    counts: dict[str, int] = field(default_factory=dict)  # sink key -> count, for windows already final
    pending: int = 0  # valid records in windows the watermark has not closed yet
    late: int = 0  # dropped by the watermark (Spark's rule: window end <= batch watermark)
    malformed: set[tuple[int, int]] = field(default_factory=set)  # (partition, offset)
    uncommitted: int = 0  # records outside every committed range (not processed yet)


def expected(source: Iterable[SourceRecord], entries: Sequence[LedgerEntry], window_s: int) -> Expected:
    """What the sink must hold, recomputed from the source records and the ledger's batch watermarks.

    Spark's rules for one stateful operator: a record read in batch N is late (dropped) when its window ends
    at or before the watermark of batch N-1; a window is emitted, final, in the first batch whose own
    watermark reaches its end.
    """
    index = BatchIndex(entries)
    wm_by_batch = {e.batch: e.watermark_ms for e in entries}
    final_wm_us = max((e.watermark_ms for e in entries), default=0) * 1000
    w_us = window_s * 1_000_000
    out = Expected()
    counts: Counter[str] = Counter()
    for r in source:
        batch = index.find(r.partition, r.offset)
        if batch is None:
            out.uncommitted += 1
            continue
        if r.reason is not None:
            out.malformed.add((r.partition, r.offset))
            continue
        assert r.ts_us is not None and r.ip is not None  # a record without a reason is valid: both are set
        start = records.window_start_us(r.ts_us, window_s)
        if start + w_us <= wm_by_batch.get(batch.batch - 1, 0) * 1000:
            out.late += 1
        elif start + w_us <= final_wm_us:
            counts[records.sink_key(start, r.ip)] += 1
        else:
            out.pending += 1
    out.counts = dict(counts)
    return out


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
    dlq_missing: list[tuple[int, int]] = field(default_factory=list)  # (partition, offset)
    dlq_unexpected: list[tuple[int, int]] = field(default_factory=list)
    dlq_duplicates: list[tuple[int, int]] = field(default_factory=list)
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


def sink_value_errors(rec: SinkRecord, window_s: int) -> str | None:
    try:
        v = json.loads(rec.value)
    except (ValueError, TypeError):
        return f"{rec.key}: value is not JSON"
    if set(v) != {"window_start", "window_end", "ip", "count"}:
        return f"{rec.key}: unexpected fields {sorted(v)}"
    if rec.key != f"{v['window_start']}|{v['ip']}":
        return f"{rec.key}: key does not match the value ({v['window_start']}|{v['ip']})"
    if not isinstance(v["count"], int) or v["count"] <= 0:
        return f"{rec.key}: count {v['count']!r} is not a positive integer"
    return None


def check_accounting(
    entries: Sequence[LedgerEntry],
    committed: Mapping[int, int] | None,
    sink: Iterable[SinkRecord],
    dlq: Iterable[tuple[int, int]],
    starting: Mapping[int, int] | None = None,
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


def check(
    entries: Sequence[LedgerEntry],
    committed: Mapping[int, int] | None,
    source: Iterable[SourceRecord],
    sink: Iterable[SinkRecord],
    dlq: Iterable[tuple[int, int]],
    window_s: int,
    starting: Mapping[int, int] | None = None,
) -> Report:
    """I1 (coverage), I2 (every record counted, late or in the DLQ once), I3 (exact counts, one record per
    key) and the ledger's own accounting (sink records == sum of committed outputs, I4's visible face)."""
    rep = Report(coverage=check_coverage(entries, committed, starting))
    exp = expected(source, entries, window_s)
    rep.expected_keys, rep.late, rep.pending = len(exp.counts), exp.late, exp.pending
    rep.malformed, rep.counted = len(exp.malformed), sum(exp.counts.values())
    rep.ledger_outputs = sum(e.outputs for e in entries)
    rep.ledger_dlq = sum(e.dlq for e in entries)
    seen: Counter[str] = Counter()
    found: dict[str, int] = {}
    for rec in sink:
        rep.sink_records += 1
        seen[rec.key] += 1
        err = sink_value_errors(rec, window_s)
        if err:
            rep.malformed_values.append(err)
            continue
        found[rec.key] = json.loads(rec.value)["count"]
    rep.duplicates = {k: n for k, n in seen.items() if n > 1}
    for k, n in exp.counts.items():
        if k not in found:
            rep.missing[k] = n
        elif found[k] != n:
            rep.wrong[k] = (n, found[k])
    rep.unexpected = {k: n for k, n in found.items() if k not in exp.counts}
    dlq_seen = Counter(dlq)
    rep.dlq_duplicates = sorted(k for k, n in dlq_seen.items() if n > 1)
    rep.dlq_missing = sorted(exp.malformed - set(dlq_seen))
    rep.dlq_unexpected = sorted(set(dlq_seen) - exp.malformed)
    return rep
