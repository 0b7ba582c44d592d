"""Reconciliation, the pure part: which batches a run covers, the facts each record needs (its batch and the
watermark that decides whether it is late), when each window is emitted, and the verdict of each check.

A run reconciles the committed ledger batches [a, b] (a range of batch ids, or the batches committed within a
data interval). Spark's rules, for one stateful operator, decide everything from the ledger alone:
- a valid record read in batch j is late iff its window ends at or before the watermark of batch j-1;
- a window is emitted, final, in the first batch whose own watermark reaches its end (`emission_batch`).
So a sink key emitted in [a, b] counts the non-late records of its window read before it was emitted: those in
[a, b] (this run's pass over the source) plus those read before a, still open after a-1 (the carry-in, the
previous run's carry-out). Consecutive runs chain, so each run reads only its own range once.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from onceflow.rules import clock, json_records, sources
from onceflow.rules.ledger import CoverageReport, LedgerEntry, Ranges
from onceflow.wire import OnceflowError


class Status(StrEnum):
    """One check's verdict."""

    PASS = "pass"
    FAIL = "fail"
    WARN = "warn"
    SKIP = "skip"


class Mode(StrEnum):
    MANUAL = "manual"  # a range asked for
    CHAIN = "chain"  # the scheduled, gap-free chain


class Verdict(StrEnum):
    """A run's verdict."""

    OK = "ok"
    FAILED = "failed"
    NOTHING_NEW = "nothing new"  # a chain run with no batch committed since the last proven one


class ReconcileError(OnceflowError, ValueError):
    """Bad parameters or an impossible range; raised before anything runs."""


def to_ms(v: Any) -> int | None:
    """A time given as epoch ms, ISO-8601 or a datetime, in epoch ms (None stays None)."""
    if v is None or v == "":
        return None
    if hasattr(v, "timestamp"):
        return int(v.timestamp() * 1000)
    try:
        return int(v) if str(v).isdigit() else clock.parse_iso_ms(str(v))
    except ValueError:
        raise ReconcileError(f"{v!r} is not a time: use ISO-8601 (2026-11-22T10:00:00Z) or epoch ms") from None


@dataclass(frozen=True)
class BatchRow:
    """One ledger batch on one source partition: which offsets it read, and its late-row watermark."""

    topic: str
    partition: int
    start: int
    end: int
    batch: int
    late_wm_ms: int
    max_ahead_ms: int | None = None  # the batch's event-time skew rule (None: none, as in older batches)


def select_batches(
    entries: Sequence[LedgerEntry],
    first: int | None = None,
    last: int | None = None,
    since_ms: int | None = None,
    until_ms: int | None = None,
) -> list[LedgerEntry]:
    """The stream batches of the run: by batch id ([first, last]) or by commit time ([since_ms, until_ms))."""
    if first is not None and last is not None and last < first:
        raise ReconcileError(f"the last batch {last} is before the first {first}")
    if since_ms is not None and until_ms is not None and until_ms <= since_ms:
        raise ReconcileError("the end of the interval is not after its start")
    out = []
    for e in sorted(entries, key=lambda e: e.batch):
        if first is not None and e.batch < first or last is not None and e.batch > last:
            continue
        if (
            since_ms is not None
            and e.commit_time_ms < since_ms
            or until_ms is not None
            and e.commit_time_ms >= until_ms
        ):
            continue
        out.append(e)
    return out


def batch_rows(selected: Sequence[LedgerEntry], all_entries: Sequence[LedgerEntry]) -> list[BatchRow]:
    wm = {e.batch: e.watermark_ms for e in all_entries}
    return [
        BatchRow(p.topic, p.partition, s, end, e.batch, wm.get(e.batch - 1, 0), e.max_event_ahead_ms)
        for e in selected
        for p, (s, end) in sorted(e.ranges.items())
        if end > s
    ]


def source_ranges(selected: Sequence[LedgerEntry]) -> Ranges:
    """Per source partition, the offsets the run reads: from the first selected batch's start to the last one's
    end."""
    out: Ranges = {}
    for e in selected:
        for p, (s, end) in e.ranges.items():
            lo, hi = out.get(p, (s, end))
            out[p] = (min(lo, s), max(hi, end))
    return {p: r for p, r in sorted(out.items()) if r[1] > r[0]}


def coverage(selected: Sequence[LedgerEntry]) -> dict[str, Any]:
    """What a run proves, for its record: the batches, their commit times, the source offsets they read."""
    if not selected:
        return {"batches": None, "count": 0, "commit_time_ms": None, "source_offsets": {}}
    return {
        "batches": [selected[0].batch, selected[-1].batch],
        "count": len(selected),
        "commit_time_ms": [selected[0].commit_time_ms, selected[-1].commit_time_ms],
        # beside its topic field, as the ledger writes ranges (onceflow.rules.sources)
        "source_topic": sources.topic_field(source_ranges(selected)),
        "source_offsets": sources.keyed_to_json(source_ranges(selected), list),
    }


# ---------------------------------------------------------------------------- the scheduled chain
@dataclass(frozen=True)
class ChainPosition:
    """How far the scheduled chain has proven the ledger: the last batch a successful chain run proved (None:
    nothing yet), with the run that proved it. Kept as the chain group's committed offsets on the source (the end
    of that batch's ranges) and their metadata, committed in one transaction with the run's result record, so the
    position moves if and only if the proof is recorded."""

    batch: int | None = None
    run_id: str | None = None
    ts_ms: int | None = None


def chain_metadata(batch: int, run_id: str, ts_ms: int) -> str:
    import json

    return json.dumps({"batch": batch, "run": run_id, "ts_ms": ts_ms}, separators=(",", ":"))


def chain_position(metadatas: Iterable[str | None]) -> ChainPosition:
    """The chain's position from its group's offset metadata (one per source partition; all name one batch)."""
    import json

    seen = set()
    for m in metadatas:
        if not m:
            continue
        try:
            d = json.loads(m)
            seen.add((int(d["batch"]), d.get("run"), d.get("ts_ms")))
        except (ValueError, KeyError, TypeError):
            raise ReconcileError(
                f"the reconciliation chain's group has offset metadata onceflow did not write: {m!r}"
            ) from None
    if not seen:
        return ChainPosition()
    if len({b for b, _, _ in seen}) > 1:
        raise ReconcileError(
            f"the reconciliation chain's group names several batches {sorted(seen)}: it was "
            f"written outside the chain; reset it (kafka-consumer-groups --delete)"
        )
    b, run, ts = seen.pop()
    return ChainPosition(b, run, ts)


def rules_check(selected: Sequence[LedgerEntry], current: int, chain: bool) -> Check | None:
    """Batches classified with other parse rules than this code's (each ledger entry records its version) cannot be
    judged by a recount under this code's rules: it would report differences that are not there (protocol review
    N-10). A manual run says so and judges nothing (SKIP); the chain must not move past them, so it FAILs (and
    pages) with the same words."""
    other = sorted({e.rules for e in selected if e.rules is not None and e.rules != current})
    if not other:
        return None
    batches = [e.batch for e in selected if e.rules in other]
    return Check(
        "rules",
        Status.FAIL if chain else Status.SKIP,
        f"batches {batches[0]}..{batches[-1]} were classified with parse rules version {other}; this code "
        f"classifies with version {current} and cannot judge them: reconcile them with the code that wrote them",
    )


def chain_range(proven: int | None, entries: Sequence[LedgerEntry], max_batches: int) -> tuple[int, int] | None:
    """The next slice of the chain: from the batch after the last proven one up to the newest committed batch in
    the cut, at most `max_batches` batches (the rest is the next run's); None when nothing new was committed."""
    todo = [e.batch for e in sorted(entries, key=lambda e: e.batch) if proven is None or e.batch > proven]
    if not todo:
        return None
    first = todo[0]
    if proven is not None and first != proven + 1:
        raise ReconcileError(
            f"the chain proved batch {proven}, but the ledger's next batch is {first}: batches "
            f"{proven + 1}..{first - 1} are missing from the ledger (run `onceflow audit`)"
        )
    return first, todo[min(len(todo), max_batches) - 1]


class Emission:
    """The first ledger batch whose watermark reaches a window's end (watermarks never go down)."""

    def __init__(self, entries: Iterable[LedgerEntry]):
        rows = sorted((e.batch, e.watermark_ms) for e in entries)
        self._batches = [b for b, _ in rows]
        self._wms: list[int] = []
        top = 0
        for _, w in rows:
            top = max(top, w)
            self._wms.append(top)

    def batch(self, window_end_ms: int) -> int | None:
        i = bisect.bisect_left(self._wms, window_end_ms)
        return self._batches[i] if i < len(self._batches) else None


def carry_sources(entries: Sequence[LedgerEntry], a: int, window_ms: int, delay_ms: int) -> list[LedgerEntry]:
    """The batches before `a` whose records can count in a window still open after batch a-1, the ones a carry-in
    must read when no carry file is kept (the first run, a lost var/).

    Spark's watermark is the highest event time it has seen, less the delay, so a record read in batch j has an
    event time at most the (running) watermark of the batch after j plus the delay, and its window ends at most one
    window later. A window is still open after a-1 only if its end is above a-1's watermark (`Emission`). Every
    batch before the first one that can reach such a window is skipped: the carry reads the last few batches, not
    the whole ledger, whose oldest source records retention may have deleted. Watermarks recorded before a change
    of the delay to a smaller one can make the bound too tight; a count then differs and the run fails, it never
    passes wrongly."""
    ordered = sorted(entries, key=lambda e: e.batch)
    top, running = 0, []
    for e in ordered:
        top = max(top, e.watermark_ms)
        running.append(top)
    before = [i for i, e in enumerate(ordered) if e.batch < a]
    if not before:
        return []
    open_above = running[before[-1]]
    for i in before:
        nxt = running[i + 1] if i + 1 < len(ordered) else None
        if nxt is None or nxt + delay_ms + window_ms > open_above:
            return ordered[i : before[-1] + 1]
    return []


@dataclass
class Check:
    name: str
    status: Status
    summary: str
    figures: dict[str, Any] = field(default_factory=dict)
    differences: list[dict[str, Any]] = field(default_factory=list)  # precise, capped by the caller


@dataclass
class Result:
    app: str
    run_id: str
    first_batch: int | None
    last_batch: int | None
    ranges: Ranges
    started_ms: int
    finished_ms: int = 0
    checks: list[Check] = field(default_factory=list)
    data_docs: str | None = None
    mode: Mode = Mode.MANUAL
    coverage: dict[str, Any] = field(default_factory=dict)  # batches, commit times and source offsets the run proved
    snapshot_batch: int | None = None  # the newest committed batch when the run began (its consistent cut)
    proven_before: int | None = None  # CHAIN: the chain's last proven batch when the run began

    @property
    def ok(self) -> bool:
        return all(c.status != Status.FAIL for c in self.checks)

    def as_dict(self) -> dict[str, Any]:
        """JSON all the way down: numbers stay numbers (Spark's Decimal and numpy's ints included)."""
        d: dict[str, Any] = _jsonable(asdict(self))
        d["ok"], d["verdict"] = self.ok, self.verdict
        d["ranges"] = sources.keyed_to_json(self.ranges, list)
        d["ranges_topic"] = sources.topic_field(self.ranges)  # what the ranges' keys are on (onceflow.rules.sources)
        return d

    @property
    def verdict(self) -> Verdict:
        if self.mode == Mode.CHAIN and self.first_batch is None and self.ok:
            return Verdict.NOTHING_NEW
        return Verdict.OK if self.ok else Verdict.FAILED

    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status == Status.FAIL]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Result:
        """From `as_dict()` (its `ok` and `verdict` are derived again, not read). A result written before its ranges
        named their topic reads back with them on topic "" (nothing reads a past run's ranges but to show them)."""
        raw, topic = d.get("ranges") or {}, d.get("ranges_topic")
        if raw and topic:
            keyed = sources.keyed_from_json(raw, topic)
        else:
            keyed = {sources.SourcePartition("", int(p)): r for p, r in raw.items() if str(p).isdigit()}
        return json_records.from_json(cls, {k: v for k, v in d.items() if k != "ranges"} | {"ranges": {}}).with_ranges(
            {p: (int(r[0]), int(r[1])) for p, r in keyed.items()}
        )

    def with_ranges(self, ranges: Ranges) -> Result:
        self.ranges = ranges
        return self

    def check(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)


def _jsonable(v: Any) -> Any:
    """Plain JSON types: dicts with string keys, lists, str, int, float, bool, None."""
    import decimal

    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [_jsonable(x) for x in v]
    if isinstance(v, bool) or v is None or isinstance(v, (str, int, float)):
        return v
    if isinstance(v, decimal.Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    if hasattr(v, "item"):  # numpy scalars
        return v.item()
    if hasattr(v, "asDict"):  # a Spark Row
        return _jsonable(v.asDict(recursive=True))
    if hasattr(v, "isoformat"):
        return v.isoformat()
    return str(v)


def coverage_check(rep: CoverageReport, cap: int = 50) -> Check:
    figures = {"batches": rep.batches, "covered": sources.keyed_to_json(rep.covered, list)}
    if rep.ok:
        return Check(
            "I1_coverage",
            Status.PASS,
            f"{rep.batches} batches cover every partition contiguously, no gap, no "
            f"overlap, up to the group's committed offsets",
            figures,
        )
    diffs = [
        {
            "kind": i.kind,
            "partition": None if i.partition is None else sources.position_value(i.partition, rep.covered),
            "start": i.start,
            "end": i.end,
            "detail": i.detail,
        }
        for i in rep.issues[:cap]
    ]
    return Check(
        "I1_coverage",
        Status.FAIL,
        f"{len(rep.issues)} coverage issue(s): " + "; ".join(i.detail for i in rep.issues[:3]),
        figures,
        diffs,
    )


def accounting_check(
    total: int,
    counted_in_sink: int,
    late: int,
    malformed_in_dlq: int,
    pending: int,
    spark_dropped: dict[int, int] | None,
    late_groups: dict[int, int],
    late_threshold: float = 1.0,
) -> Check:
    """I2: every source record of the range is counted in a sink window, late, malformed (in the DLQ), or still
    pending in a window that is not final yet; each term measured on its own. A range where more than
    `late_threshold` of the valid records were late fails too: the books balance, but "everything is late" (a
    watermark run ahead of the input) is never a healthy history."""
    valid = total - malformed_in_dlq
    late_fraction = round(late / valid, 4) if valid > 0 else 0.0
    figures: dict[str, Any] = {
        "source_records": total,
        "counted_in_sink": counted_in_sink,
        "late": late,
        "malformed_in_dlq": malformed_in_dlq,
        "pending": pending,
        "late_fraction": late_fraction,
    }
    diffs: list[dict[str, Any]] = []
    if valid > 0 and late_fraction > late_threshold:
        diffs.append(
            {
                "kind": "late_fraction",
                "late": late,
                "valid": valid,
                "detail": f"{late} of the {valid} valid records ({100 * late_fraction:.0f}%) were late, above "
                f"{100 * late_threshold:.0f}%: the watermark ran ahead of the input",
            }
        )
    balance = counted_in_sink + late + malformed_in_dlq + pending - total
    if balance:
        diffs.append(
            {
                "kind": "unbalanced",
                "detail": f"counted {counted_in_sink} + late {late} + malformed "
                f"{malformed_in_dlq} + pending {pending} - source {total} = {balance}",
            }
        )
    if spark_dropped is not None:
        figures["late_groups_by_batch"] = {str(b): n for b, n in sorted(late_groups.items())}
        figures["spark_rows_dropped_by_watermark"] = {str(b): n for b, n in sorted(spark_dropped.items())}
        for b in sorted(set(late_groups) | set(spark_dropped)):
            if b in spark_dropped and late_groups.get(b, 0) != spark_dropped[b]:
                diffs.append(
                    {
                        "kind": "late_vs_spark",
                        "batch": b,
                        "expected": late_groups.get(b, 0),
                        "spark": spark_dropped[b],
                        "detail": f"batch {b}: the late rule gives {late_groups.get(b, 0)} dropped "
                        f"(window, ip) groups, Spark reported {spark_dropped[b]}",
                    }
                )
    if diffs:
        return Check("I2_accounting", Status.FAIL, diffs[0]["detail"], figures, diffs)
    return Check(
        "I2_accounting",
        Status.PASS,
        f"{total} source records = {counted_in_sink} counted + {late} late + "
        f"{malformed_in_dlq} malformed + {pending} pending",
        figures,
    )


def results_check(
    expected_keys: int,
    sink_records: int,
    duplicates: list[dict[str, Any]],
    missing: list[dict[str, Any]],
    wrong: list[dict[str, Any]],
    unexpected: list[dict[str, Any]],
    misplaced: list[dict[str, Any]],
    ledger_outputs: int,
) -> Check:
    figures = {
        "expected_keys": expected_keys,
        "sink_records": sink_records,
        "ledger_outputs": ledger_outputs,
        "duplicates": len(duplicates),
        "missing": len(missing),
        "wrong": len(wrong),
        "unexpected": len(unexpected),
        "misplaced": len(misplaced),
    }
    diffs = (
        [{"kind": "duplicate", **d} for d in duplicates]
        + [{"kind": "missing", **d} for d in missing]
        + [{"kind": "wrong_count", **d} for d in wrong]
        + [{"kind": "unexpected", **d} for d in unexpected]
        + [{"kind": "wrong_batch", **d} for d in misplaced]
    )
    if sink_records != ledger_outputs:
        diffs.append(
            {
                "kind": "ledger_outputs",
                "detail": f"the ledger says {ledger_outputs} results were committed "
                f"in these batches; the sink holds {sink_records}",
            }
        )
    if diffs:
        parts = [
            f"{n} {k}"
            for k, n in (
                ("duplicate key(s)", len(duplicates)),
                ("missing key(s)", len(missing)),
                ("wrong count(s)", len(wrong)),
                ("unexpected key(s)", len(unexpected)),
                ("key(s) in the wrong batch", len(misplaced)),
            )
            if n
        ]
        if sink_records != ledger_outputs:
            parts.append(f"{sink_records} sink records vs {ledger_outputs} in the ledger")
        return Check("I3_results", Status.FAIL, ", ".join(parts), figures, diffs)
    return Check("I3_results", Status.PASS, f"{expected_keys} keys, each once, each with the recounted value", figures)


def dlq_check(
    malformed: int,
    dlq_records: int,
    missing: list[dict[str, Any]],
    unexpected: list[dict[str, Any]],
    duplicates: list[dict[str, Any]],
    ledger_dlq: int,
) -> Check:
    figures = {"malformed": malformed, "dlq_records": dlq_records, "ledger_dlq": ledger_dlq}
    diffs = (
        [{"kind": "dlq_missing", **d} for d in missing]
        + [{"kind": "dlq_unexpected", **d} for d in unexpected]
        + [{"kind": "dlq_duplicate", **d} for d in duplicates]
    )
    if dlq_records != ledger_dlq:
        diffs.append(
            {"kind": "ledger_dlq", "detail": f"the ledger says {ledger_dlq} DLQ records; the DLQ holds {dlq_records}"}
        )
    if diffs:
        return Check(
            "I2_dlq",
            Status.FAIL,
            f"{len(missing)} malformed record(s) missing from the DLQ, {len(unexpected)} "
            f"unexpected, {len(duplicates)} duplicated",
            figures,
            diffs,
        )
    return Check("I2_dlq", Status.PASS, f"each of the {malformed} malformed records is in the DLQ once", figures)


def visibility_check(committed: int, uncommitted: int, committed_not_in_uncommitted: int, foreign: int) -> Check:
    figures = {
        "read_committed": committed,
        "read_uncommitted": uncommitted,
        "aborted_or_open": uncommitted - committed,
        "foreign_aborted_or_open": foreign,
    }
    if committed_not_in_uncommitted:
        return Check(
            "I4_visibility",
            Status.FAIL,
            f"{committed_not_in_uncommitted} record(s) visible to read_committed are not in the log at all",
            figures,
        )
    return Check(
        "I4_visibility",
        Status.PASS,
        f"read_committed sees {committed} records; the {uncommitted - committed} "
        f"more in read_uncommitted are aborted or open transactions",
        figures,
    )
