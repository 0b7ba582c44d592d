"""ip_count's invariants I2 and I3 (docs/design.md, section 5), as pure functions over plain data (no I/O): every
valid source record of the committed batches counted once in its window, late, or pending; every malformed one in the
DLQ once; each final window's count exact, one sink record per key. The platform's own part (I1, the ledger's
accounting) and the report are onceflow.rules.invariants; ip_count's audit (onceflow_apps.ip_count_audit) reads
the records and calls `check`."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from onceflow.rules.invariants import BatchIndex, Report, SinkRecord
from onceflow.rules.ledger import LedgerEntry, check_coverage
from onceflow.rules.sources import SourcePartition
from onceflow_apps.access_log import rules as records


@dataclass(frozen=True)
class SourceRecord:
    partition: SourcePartition  # the record's topic and partition
    offset: int
    ts_us: int | None
    ip: str | None
    reason: str | None = None


@dataclass
class Expected:
    counts: dict[str, int] = field(default_factory=dict)  # sink key -> count, for windows already final
    pending: int = 0  # valid records in windows the watermark has not closed yet
    late: int = 0  # dropped by the watermark (Spark's rule: window end <= batch watermark)
    malformed: set[tuple[SourcePartition, int]] = field(default_factory=set)  # (source partition, offset)
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


def check(
    entries: Sequence[LedgerEntry],
    committed: Mapping[SourcePartition, int] | None,
    source: Iterable[SourceRecord],
    sink: Iterable[SinkRecord],
    dlq: Iterable[tuple[SourcePartition, int]],
    window_s: int,
    starting: Mapping[SourcePartition, int] | None = None,
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
