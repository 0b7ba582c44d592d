"""The ledger: one record per committed batch, and the pure logic that checks it.

A ledger record (topic `ip_count_ledger`, key = app id) is written inside the batch's Kafka transaction, so it
is visible exactly when the batch's outputs are. Nothing in this module does I/O: the replay decision and the
coverage checks are plain functions over plain data, tested without a broker.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any

from onceflow import wire
from onceflow.rules import sources
from onceflow.rules.sources import SourcePartition, fmt_ranges
from onceflow.wire import OnceflowError

Offsets = Mapping[SourcePartition, int]  # source partition -> offset
Ranges = dict[SourcePartition, tuple[int, int]]  # source partition -> [start, end)


class DivergentHistory(OnceflowError):
    """What Spark's checkpoint says and what the sink has committed disagree. Never skipped silently."""


@dataclass(frozen=True)
class BatchPlan:
    """What Spark planned for batch N (from the checkpoint's offsets/N and its predecessor).

    `batch` is the ledger's batch id, the one the sink commits under. It equals Spark's batch id until a
    savepoint is restored behind the sink: from then on Spark's ids run behind the ledger's by a fixed shift
    (the epoch of the restore, see onceflow.rules.checkpoint.Epoch). `catch_up_from` is set on the one batch after
    such a restore that re-reads the already-committed ledger batches catch_up_from..batch in one go. Ranges are
    keyed by source partition (topic and partition): an app may read several topics.
    """

    batch: int
    start: dict[SourcePartition, int]
    end: dict[SourcePartition, int]
    watermark_ms: int = 0
    batch_ts_ms: int = 0
    spark_batch: int | None = None  # Spark's id, when it differs from `batch`
    epoch: int = 0
    catch_up_from: int | None = None

    def __post_init__(self) -> None:
        if set(self.start) != set(self.end):
            raise ValueError(
                f"batch {self.batch}: start partitions {sorted(map(str, self.start))} != end {sorted(map(str, self.end))}"
            )
        for p in self.start:
            if self.end[p] < self.start[p]:
                raise ValueError(f"batch {self.batch}: {p} ends at {self.end[p]} before its start {self.start[p]}")

    @property
    def ranges(self) -> Ranges:
        return {p: (self.start[p], self.end[p]) for p in sorted(self.start)}

    @property
    def topics(self) -> list[str]:
        return sources.topics_of(self.start)

    @property
    def records(self) -> int:
        return sum(self.end[p] - self.start[p] for p in self.start)


@dataclass(frozen=True)
class LedgerEntry:
    app: str
    batch: int
    ranges: Ranges
    watermark_ms: int
    batch_ts_ms: int
    outputs: int
    dlq: int
    txn_ms: float
    commit_time_ms: int
    transactional_id: str
    kind: str = wire.LEDGER_STREAM  # the live job's batches; backfills write wire.LEDGER_BACKFILL
    spark_batch: int | None = None
    epoch: int = 0
    backfill_id: str | None = None  # kind "backfill": which backfill; `batch` is then the chunk number
    spec_hash: str | None = None  # kind "backfill": the parameters the chunk was computed from
    # The app's rules the batch was computed with (App.rules_version) and the event-time skew allowed over the record
    # timestamp (None: no such rule, as in batches written before it existed).
    rules: int | None = None
    max_event_ahead_ms: int | None = None
    # An app with named outputs (App.outputs): its results per topic, every output's topic named (`outputs` is their
    # sum). None: one output, the sink topic.
    outputs_by_topic: dict[str, int] | None = None

    def to_json(self) -> bytes:
        d = asdict(self)
        # The source topic(s) beside the ranges (onceflow.rules.sources: one topic keeps the shape of before).
        d["topic"] = sources.topic_field(self.ranges)
        d["ranges"] = sources.keyed_to_json(self.ranges, list)
        if self.outputs_by_topic is None:
            del d["outputs_by_topic"]  # the record of a one-output app keeps its shape
        return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> LedgerEntry:
        d = _object(raw)
        d["ranges"] = _ranges(d.get("ranges"), d.get("topic"), "ranges")
        per_topic = d.get("outputs_by_topic")
        if per_topic is not None:
            if not isinstance(per_topic, dict) or not all(
                isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
                for k, v in per_topic.items()
            ):
                raise MalformedRecord(
                    f"ledger record field outputs_by_topic: expected topic -> count, got {per_topic!r:.80}"
                )
            d["outputs_by_topic"] = dict(per_topic)
        return cls(**_typed(cls, {k: v for k, v in d.items() if k in _ENTRY_FIELDS}))

    @property
    def end(self) -> dict[SourcePartition, int]:
        return {p: e for p, (_, e) in self.ranges.items()}

    @property
    def start(self) -> dict[SourcePartition, int]:
        return {p: s for p, (s, _) in self.ranges.items()}

    @property
    def topics(self) -> list[str]:
        return sources.topics_of(self.ranges)

    @classmethod
    def for_plan(
        cls,
        app: str,
        plan: BatchPlan,
        outputs: int,
        dlq: int,
        txn_ms: float,
        commit_time_ms: int,
        transactional_id: str,
        rules: int | None = None,
        max_event_ahead_ms: int | None = None,
        outputs_by_topic: dict[str, int] | None = None,
    ) -> LedgerEntry:
        return cls(
            app=app,
            batch=plan.batch,
            ranges=plan.ranges,
            watermark_ms=plan.watermark_ms,
            batch_ts_ms=plan.batch_ts_ms,
            outputs=outputs,
            dlq=dlq,
            txn_ms=round(txn_ms, 3),
            commit_time_ms=commit_time_ms,
            transactional_id=transactional_id,
            spark_batch=plan.spark_batch,
            epoch=plan.epoch,
            rules=rules,
            max_event_ahead_ms=max_event_ahead_ms,
            outputs_by_topic=outputs_by_topic,
        )


@dataclass(frozen=True)
class RestoreRecord:
    """Written to the ledger when a savepoint is restored: which one, where the sink stood, what is skipped.

    `skipped` is the source range of the ledger batches `skipped_batches` (already committed after the
    savepoint): the restored job re-reads it to rebuild its state and writes none of its results again. A record
    written before source topics were named (no `topic` field) reads back with its ranges on topic "".
    """

    app: str
    epoch: int
    savepoint_id: str
    savepoint_batch: int  # the ledger batch the savepoint was taken at
    sink_batch: int | None  # the last ledger batch committed when it was restored
    rewind: bool  # an older savepoint than the newest, restored on explicit request
    skipped_batches: tuple[int, int] | None
    skipped: Ranges
    spark_batch_from: int  # Spark's first batch of the new epoch
    ledger_shift: int  # ledger batch = Spark batch + ledger_shift from then on
    restored_ms: int
    kind: str = wire.LEDGER_RESTORE

    def to_json(self) -> bytes:
        d = asdict(self)
        if self.skipped:
            d["topic"] = sources.topic_field(self.skipped)
        d["skipped"] = sources.keyed_to_json(self.skipped, list)
        return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> RestoreRecord:
        d = _object(raw)
        d["skipped"] = _ranges(d.get("skipped"), d.pop("topic", None), "skipped", legacy_topic="")
        if d.get("skipped_batches") is not None:
            pair = d["skipped_batches"]
            if not (isinstance(pair, list) and len(pair) == 2):
                raise MalformedRecord(f"ledger record field skipped_batches: expected [first, last], got {pair!r:.80}")
            d["skipped_batches"] = (_as_int(pair[0], "skipped_batches"), _as_int(pair[1], "skipped_batches"))
        return cls(**_typed(cls, d))


@dataclass(frozen=True)
class QuarantineRange:
    """Source offsets [start, end) of one partition whose records an operator quarantined: they go to the DLQ
    with reason `quarantined` and their provenance only (the way out of a batch that can never commit). `topic`:
    the source topic (None in what was written before an app could read several: its one source topic)."""

    partition: int
    start: int
    end: int
    topic: str | None = None

    def covers(self, topic: str, partition: int, offset: int) -> bool:
        return (
            (self.topic is None or self.topic == topic)
            and self.partition == partition
            and self.start <= offset < self.end
        )


@dataclass(frozen=True)
class QuarantineRecord:
    """Written to the ledger when an operator quarantines source offsets (`onceflow quarantine add`)."""

    app: str
    topic: str
    ranges: tuple[QuarantineRange, ...]
    reason: str
    by: str
    ts_ms: int
    kind: str = wire.LEDGER_QUARANTINE

    def to_json(self) -> bytes:
        d = asdict(self)
        # the record's own topic field names the ranges' topic: the shape of before
        d["ranges"] = [{"partition": r.partition, "start": r.start, "end": r.end} for r in self.ranges]
        return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> QuarantineRecord:
        d = _object(raw)
        if not isinstance(d.get("ranges"), list) or not all(isinstance(r, dict) for r in d["ranges"]):
            raise MalformedRecord("ledger record field ranges: expected a list of {partition, start, end}")
        topic = d.get("topic")
        try:
            sources.topics_from_field(topic)
        except sources.BadPositions as e:
            raise MalformedRecord(f"ledger record field topic: {e}") from None
        d["ranges"] = tuple(
            QuarantineRange(**_typed(QuarantineRange, {k: v for k, v in r.items() if k != "topic"}), topic=topic)
            for r in d["ranges"]
        )
        return cls(**_typed(cls, d))


_ENTRY_FIELDS = {f.name for f in fields(LedgerEntry)}


class MalformedRecord(OnceflowError, ValueError):
    """A ledger record that is not what the platform writes: not JSON, a field missing, or a field of the wrong
    type (a string where a number belongs). Records are read from Kafka: untrusted input, checked field by field."""


def _object(raw: bytes | str) -> dict[str, Any]:
    try:
        d = json.loads(raw)
    except ValueError as e:
        raise MalformedRecord(f"ledger record: not JSON ({e})") from None
    if not isinstance(d, dict):
        raise MalformedRecord(f"ledger record: expected a JSON object, got {type(d).__name__}")
    return d


def _as_int(v: object, name: str) -> int:
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    raise MalformedRecord(f"ledger record field {name}: expected an integer, got {v!r:.80}")


def _ranges(v: object, topic: object, name: str, legacy_topic: str | None = None) -> Ranges:
    """A record's ranges, beside its `topic` field (onceflow.rules.sources). `legacy_topic`: the topic of ranges in a
    record of a kind that named none before several source topics were possible."""
    if not isinstance(v, dict) or not all(isinstance(r, list) and len(r) == 2 for r in v.values()):
        raise MalformedRecord(f"ledger record field {name}: expected {{partition: [start, end]}}, got {v!r:.80}")
    if not v:
        return {}
    try:
        if topic is None and legacy_topic is not None:
            if not all(isinstance(p, str) and p.isascii() and p.isdigit() for p in v):
                raise MalformedRecord(
                    f"ledger record field {name}: expected {{partition: [start, end]}}, got {v!r:.80}"
                )
            keyed = {SourcePartition(legacy_topic, int(p)): r for p, r in v.items()}
        else:
            keyed = sources.keyed_from_json(v, topic)
    except sources.BadPositions as e:
        raise MalformedRecord(f"ledger record field {name}: {e}") from None
    return {p: (_as_int(r[0], name), _as_int(r[1], name)) for p, r in sorted(keyed.items())}


_SCALARS = {"int": int, "float": float, "str": str, "bool": bool}


def _typed(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    """`d`'s values checked against `cls`'s declared field types: int, float (an int is accepted; NaN and Infinity
    are not), str, bool, each optional where declared `| None`; fields of other types (ranges) are converted by the
    caller. A missing field without a default, or an unknown one, fails in the constructor."""
    out = dict(d)
    for f in fields(cls):
        if f.name not in d:
            continue
        declared = str(f.type).replace(" ", "").split("|")
        optional = "None" in declared
        kinds = [_SCALARS[t] for t in declared if t in _SCALARS]
        if len(kinds) != len(declared) - optional:
            continue  # a compound type: converted by the caller
        v = d[f.name]
        if v is None and optional:
            continue
        ok = any(
            isinstance(v, k)
            and (k is bool or not isinstance(v, bool))
            or (k is float and isinstance(v, int) and not isinstance(v, bool))
            for k in kinds
        )
        if not ok:
            want = " or ".join(t for t in declared)
            raise MalformedRecord(f"ledger record field {f.name}: expected {want}, got {v!r:.80}")
        if isinstance(v, float) and not math.isfinite(v):  # JSON's NaN and Infinity: a number, but no measure
            raise MalformedRecord(f"ledger record field {f.name}: expected a finite number, got {v!r}")
    return out


def parse_record(raw: bytes | str) -> LedgerEntry | RestoreRecord | QuarantineRecord:
    """A ledger record of any kind: batch entries (stream, backfill), restore and quarantine records. Every field
    is checked against its type (MalformedRecord otherwise)."""
    kind = _object(raw).get("kind", wire.LEDGER_STREAM)
    if kind == wire.LEDGER_RESTORE:
        return RestoreRecord.from_json(raw)
    if kind == wire.LEDGER_QUARANTINE:
        return QuarantineRecord.from_json(raw)
    return LedgerEntry.from_json(raw)


@dataclass(frozen=True)
class Committed:
    """The consumer group's committed position, with the batch id carried in the offset metadata."""

    offsets: dict[SourcePartition, int]
    batch: int | None
    foreign: bool = False  # offsets exist that onceflow did not write (no batch metadata)

    @classmethod
    def from_partitions(cls, items: Iterable[tuple[SourcePartition, int | None, str | None]]) -> Committed:
        """items: (source partition, offset or None when nothing is committed, metadata)."""
        offsets: dict[SourcePartition, int] = {}
        batches: set[int] = set()
        foreign = False
        for p, off, meta in items:
            if off is None or off < 0:
                continue
            offsets[p] = off
            b = batch_from_metadata(meta)
            if b is None:
                foreign = True
            else:
                batches.add(b)
        if len(batches) > 1:
            # One transaction commits every partition with the same batch: anything else is not ours.
            raise DivergentHistory(f"committed offsets carry different batch ids {sorted(batches)}")
        return cls(offsets=offsets, batch=batches.pop() if batches else None, foreign=foreign)


def offset_metadata(batch: int, epoch: int = 0) -> str:
    return json.dumps({"batch": batch, "epoch": epoch} if epoch else {"batch": batch}, separators=(",", ":"))


def batch_from_metadata(meta: str | None) -> int | None:
    if not meta:
        return None
    try:
        b = json.loads(meta).get("batch")
    except (ValueError, AttributeError):
        return None
    return b if isinstance(b, int) else None


class Decision(Enum):
    WRITE = "write"  # batch N is not committed yet: write it
    SKIP = "skip"  # batch N was committed before a crash, with exactly this range: a replay, write nothing
    CATCH_UP = "catch_up"  # the first batch after a restore re-reads committed batches: rebuild state, write nothing


def committed_from_ledger(newest: LedgerEntry) -> Committed:
    """The position the group would hold after the app's newest ledger record: the group's offsets are a cache
    of the ledger (kept forever), which is the truth when the cache is lost."""
    return Committed(offsets=newest.end, batch=newest.batch)


def decide(
    plan: BatchPlan, committed: Committed, entry: LedgerEntry | None, newest: LedgerEntry | None = None
) -> Decision:
    """The replay decision of the protocol (onceflow.protocol.exactly_once), by batch id AND offset range.

    `entry` is the committed ledger record of batch `plan.batch`, if any. `newest` is the app's newest stream
    ledger record, needed only when the group has no committed offsets at all (deleted by a clean-up, expired):
    then the decision is taken from the ledger, never by writing blindly.
    """
    n = plan.batch
    if committed.foreign:
        raise DivergentHistory(
            f"batch {n}: the group has committed offsets without onceflow batch metadata; another consumer "
            f"committed into this group: use a different app id or reset the group"
        )
    if committed.batch is None and not committed.offsets and newest is not None:
        committed = committed_from_ledger(newest)
        entry = newest if newest.batch == n else None
    if plan.catch_up_from is not None:
        return _decide_catch_up(plan, committed, entry)
    if committed.batch is None:
        if committed.offsets:
            raise DivergentHistory(f"batch {n}: committed offsets without a batch id")
        if entry is not None:
            raise DivergentHistory(f"batch {n}: the ledger has batch {n} but the group has no committed offsets")
        # A restored checkpoint (epoch > 0) is no exception: its history was committed before the restore, so an
        # empty group and ledger mean the ledger was deleted or recreated, and writing would start a second history.
        if n != 0:
            restored = f" (restored, epoch {plan.epoch})" if plan.epoch else ""
            raise DivergentHistory(
                f"batch {n}: neither the group nor the ledger has any committed batch, but "
                f"Spark's checkpoint{restored} is at batch {n}: the ledger or the checkpoint belongs to "
                f"another history (was the ledger topic deleted or recreated?); restore a savepoint of this "
                f"history, or start the app under a new app id"
            )
        return Decision.WRITE
    if committed.batch == n:
        if entry is None:
            raise DivergentHistory(
                f"batch {n}: the group says batch {n} is committed but the ledger has no record of it"
            )
        if entry.ranges != plan.ranges:
            raise DivergentHistory(
                f"batch {n} was committed with ranges {fmt_ranges(entry.ranges)} but Spark now plans "
                f"{fmt_ranges(plan.ranges)}: the checkpoint and the sink disagree (was a checkpoint restored or "
                f"the source changed?)"
            )
        mismatch = {p: (committed.offsets.get(p), e) for p, e in plan.end.items() if committed.offsets.get(p) != e}
        if mismatch:
            raise DivergentHistory(
                f"batch {n} is committed but the group's offsets differ from its end: "
                f"{_fmt_pairs(mismatch)} (partition: (committed, planned end))"
            )
        return Decision.SKIP
    if committed.batch > n:
        raise DivergentHistory(
            f"batch {n}: the sink already committed batch {committed.batch}; Spark's checkpoint is behind the "
            f"sink (an older checkpoint or savepoint?). Refusing to write batch {n} again."
        )
    if committed.batch < n - 1:
        raise DivergentHistory(
            f"batch {n}: the last committed batch is {committed.batch}; batches {committed.batch + 1}..{n - 1} "
            f"were never written to the sink (the checkpoint ran ahead of it)"
        )
    # committed.batch == n - 1: the normal case. Its end must be exactly where batch n starts.
    mismatch = {
        p: (committed.offsets.get(p), s)
        for p, s in plan.start.items()
        if p in committed.offsets and committed.offsets[p] != s
    }
    if mismatch:
        raise DivergentHistory(
            f"batch {n} starts at {_fmt_pairs(plan.start)} but batch {n - 1} committed "
            f"{_fmt_pairs(committed.offsets)}: gap or overlap at {_fmt_pairs(mismatch)} (partition: (committed, start))"
        )
    return Decision.WRITE


def _decide_catch_up(plan: BatchPlan, committed: Committed, entry: LedgerEntry | None) -> Decision:
    """After a restore behind the sink, Spark's one batch covers the committed ledger batches
    catch_up_from..N. Their results are in the sink already: the batch only rebuilds state. The sink must
    still stand exactly where the restore found it, else something wrote to it since."""
    n, first = plan.batch, plan.catch_up_from
    if committed.batch != n:
        raise DivergentHistory(
            f"the restore expected the sink at batch {n} (catching up batches {first}..{n}) but it has "
            f"committed batch {committed.batch}: another driver wrote to the sink after the restore"
        )
    if entry is None or entry.end != plan.end:
        raise DivergentHistory(
            f"catching up batches {first}..{n}: the ledger record of batch {n} does not end at "
            f"{_fmt_pairs(plan.end)} ({fmt_ranges(entry.ranges) if entry else 'missing'})"
        )
    mismatch = {p: (committed.offsets.get(p), e) for p, e in plan.end.items() if committed.offsets.get(p) != e}
    if mismatch:
        raise DivergentHistory(
            f"catching up batches {first}..{n}: the group's offsets differ from their end: "
            f"{_fmt_pairs(mismatch)} (partition: (committed, planned end))"
        )
    return Decision.CATCH_UP


def _fmt_pairs(by_source: Mapping[SourcePartition, object]) -> str:
    return "{" + ", ".join(f"{p}: {v}" for p, v in sorted(by_source.items())) + "}"


# ---------------------------------------------------------------------------- coverage (invariant I1)
@dataclass(frozen=True)
class CoverageIssue:
    kind: str  # gap | overlap | batch_sequence | divergent_batch | not_at_committed
    partition: SourcePartition | None
    detail: str
    start: int | None = None
    end: int | None = None


@dataclass
class CoverageReport:
    issues: list[CoverageIssue] = field(default_factory=list)
    batches: int = 0
    covered: Ranges = field(default_factory=dict)  # source partition -> [first start, last end)

    @property
    def ok(self) -> bool:
        return not self.issues


def check_coverage(
    entries: Iterable[LedgerEntry], committed: Offsets | None = None, starting: Offsets | None = None
) -> CoverageReport:
    """I1: per partition, the committed ranges are contiguous and non-overlapping, from `starting` (when
    known) up to the group's `committed` offsets (when given). Entries may arrive in any order; a batch id
    recorded twice must carry identical ranges (a replay never writes twice, but a divergence might)."""
    report = CoverageReport()
    by_batch: dict[int, LedgerEntry] = {}
    for e in entries:
        prev = by_batch.get(e.batch)
        if prev is not None:
            kind = "divergent_batch" if prev.ranges != e.ranges else "batch_sequence"
            report.issues.append(
                CoverageIssue(
                    kind,
                    None,
                    f"batch {e.batch} is in the ledger twice ({fmt_ranges(prev.ranges)} and {fmt_ranges(e.ranges)})",
                )
            )
            continue
        by_batch[e.batch] = e
    ordered = [by_batch[b] for b in sorted(by_batch)]
    report.batches = len(ordered)
    for a, b in zip(ordered, ordered[1:]):
        if b.batch != a.batch + 1:
            report.issues.append(CoverageIssue("batch_sequence", None, f"batch ids jump from {a.batch} to {b.batch}"))
    cursor: dict[SourcePartition, int] = dict(starting or {})
    first: dict[SourcePartition, int] = {}
    for e in ordered:
        for p, (s, end) in sorted(e.ranges.items()):
            if p not in cursor:
                cursor[p] = s
            if s > cursor[p]:
                report.issues.append(
                    CoverageIssue(
                        "gap",
                        p,
                        f"offsets [{cursor[p]}, {s}) of {p} are in no committed batch (before batch {e.batch})",
                        cursor[p],
                        s,
                    )
                )
            elif s < cursor[p]:
                report.issues.append(
                    CoverageIssue(
                        "overlap",
                        p,
                        f"offsets [{s}, {cursor[p]}) of {p} are committed twice (batch {e.batch} again)",
                        s,
                        cursor[p],
                    )
                )
            first.setdefault(p, s)
            cursor[p] = max(cursor[p], end)
    if committed is not None:
        for p, off in sorted(committed.items()):
            if cursor.get(p) != off:
                report.issues.append(
                    CoverageIssue(
                        "not_at_committed",
                        p,
                        f"ledger ends at {cursor.get(p)} on {p} but the group committed {off}",
                        cursor.get(p),
                        off,
                    )
                )
    report.covered = {p: (first.get(p, c), c) for p, c in cursor.items()}
    return report
