"""Backfill, the pure part: the parameters, their validation (all before any write), and the chunking.

A backfill recomputes the 5 s windows over a source range with a Spark batch job and writes them exactly once
to a target topic (by default `ip_count_backfill`, not the live sink), in chunks: chunk i is the output rows
[i*chunk_size, (i+1)*chunk_size) in (window_start, ip) order, which is deterministic for a fixed source range.
Each chunk is one Kafka transaction of the backfill's own transactional id, carrying its records, a ledger
record (kind "backfill") and the backfill group's offsets with metadata {"chunk": i}; so a re-run or a resumed
run asks the group how far it got and never writes a chunk twice.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from onceflow.wire import OnceflowError

# No '.': an id is the last part of the backfill's group and transactional id (onceflow.rules.names), and '.'
# separates those parts.
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


class BackfillError(OnceflowError, ValueError):
    """Bad parameters, refused before anything is written; the message says what to change."""


@dataclass(frozen=True)
class Spec:
    id: str
    source_topic: str
    target_topic: str
    chunk_size: int
    start: dict[int, int] = field(default_factory=dict)  # per partition, inclusive
    end: dict[int, int] = field(default_factory=dict)  # per partition, exclusive
    since_ms: int | None = None  # or a time range (Kafka record timestamps): start and
    until_ms: int | None = None  # end then hold its resolution to offsets
    dry_run: bool = False
    window_s: int = 5
    rules: int = 1  # the app's rules version (App.rules_version)
    max_event_ahead_ms: int | None = None

    @property
    def by_time(self) -> bool:
        return self.since_ms is not None or self.until_ms is not None

    def spec_hash(self) -> str:
        """The backfill's identity: what its output depends on. A time range is identified by its times, not by
        the offsets they resolve to (those are fixed by the first run and reused when it resumes, however much
        the source has grown since)."""
        rng = (
            {"since": self.since_ms, "until": self.until_ms}
            if self.by_time
            else {
                "start": {str(p): o for p, o in sorted(self.start.items())},
                "end": {str(p): o for p, o in sorted(self.end.items())},
            }
        )
        blob = json.dumps(
            {
                "source": self.source_topic,
                "target": self.target_topic,
                "chunk": self.chunk_size,
                "window_s": self.window_s,
                "rules": self.rules,
                "ahead": self.max_event_ahead_ms,
                **rng,
            },
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TopicFacts:
    exists: bool
    low: dict[int, int] = field(default_factory=dict)  # earliest offset still kept, per partition
    high: dict[int, int] = field(default_factory=dict)  # end of the log, per partition


def parse_offsets(text: str | dict[Any, Any] | None) -> dict[int, int]:
    """`{"0": 100, "1": 250}` (JSON or dict) -> {0: 100, 1: 250}."""
    if text in (None, "", {}):
        return {}
    d = json.loads(text) if isinstance(text, str) else text
    try:
        return {int(p): int(o) for p, o in d.items()}
    except (AttributeError, TypeError, ValueError):
        raise BackfillError(f'offsets must map partitions to offsets, e.g. {{"0": 100}}; got {text!r}') from None


def check_params(spec: Spec, protected_topics: dict[str, str], resolved: bool = False) -> None:
    """What can be said from the parameters alone (`resolved`: a time range already carries its offsets)."""
    if not ID_RE.match(spec.id):
        raise BackfillError(f"backfill id {spec.id!r}: use 1-64 letters, digits, '_', '-'")
    if spec.chunk_size < 1:
        raise BackfillError(f"chunk size must be >= 1, got {spec.chunk_size}")
    by_offsets = bool(spec.start or spec.end)
    by_time = spec.by_time
    if not (by_offsets or by_time) or (by_offsets and by_time and not resolved):
        raise BackfillError("give the source range either by offsets (start and end) or by time (since and until)")
    if by_offsets and set(spec.start) != set(spec.end):
        raise BackfillError(f"start and end name different partitions: {sorted(spec.start)} vs {sorted(spec.end)}")
    if by_time and (spec.since_ms is None or spec.until_ms is None):
        raise BackfillError("a time range needs both since and until")
    if by_time and spec.until_ms is not None and spec.since_ms is not None and spec.until_ms <= spec.since_ms:
        raise BackfillError(f"the end of the time range ({spec.until_ms}) is not after its start ({spec.since_ms})")
    for p in spec.start:
        if spec.end[p] < spec.start[p]:
            raise BackfillError(f"partition {p}: end {spec.end[p]} is before start {spec.start[p]}")
    if spec.target_topic in protected_topics:
        raise BackfillError(
            f"the target {spec.target_topic} is the live job's {protected_topics[spec.target_topic]} "
            f"topic: a backfill writes to its own topic (docs/backfill.md says how consumers merge)"
        )


def check_against(spec: Spec, source: TopicFacts, target: TopicFacts) -> None:
    """What needs the cluster: both topics exist, the range is inside the source's retention."""
    if not source.exists:
        raise BackfillError(f"unknown source topic {spec.source_topic}")
    if not target.exists:
        raise BackfillError(
            f"unknown target topic {spec.target_topic}: create it (`onceflow stack topics` creates the default one)"
        )
    for p in sorted(spec.start):
        if p not in source.high:
            raise BackfillError(f"the source topic has no partition {p}")
        if spec.start[p] < source.low[p]:
            raise BackfillError(
                f"partition {p}: offset {spec.start[p]} is no longer in the source (retention kept "
                f"{source.low[p]} onwards)"
            )
        if spec.end[p] > source.high[p]:
            raise BackfillError(f"partition {p}: end {spec.end[p]} is beyond the end of the source ({source.high[p]})")


def overlaps(a_start: dict[int, int], a_end: dict[int, int], b_start: dict[int, int], b_end: dict[int, int]) -> bool:
    return any(
        p in b_start
        and a_start[p] < b_end[p]
        and b_start[p] < a_end[p]
        and a_end[p] > a_start[p]
        and b_end[p] > b_start[p]
        for p in a_start
    )


def chunks(total: int, size: int) -> int:
    return (total + size - 1) // size


def first_chunk_to_write(committed_chunk: int | None) -> int:
    return 0 if committed_chunk is None else committed_chunk + 1


def chunk_metadata(chunk: int, spec_hash: str, start: int) -> str:
    """The backfill group's offset metadata of one partition: the last chunk committed, the spec, and where the
    range starts on that partition (the committed offset is its end), so a time range resumes on its first
    resolution."""
    return json.dumps({"chunk": chunk, "spec": spec_hash, "start": start}, separators=(",", ":"))


def check_next_chunk(chunk: int, committed_chunk: int | None, backfill_id: str) -> None:
    """Before each chunk: the group's last committed chunk must be the one before it, else another run of the
    same backfill wrote in between (it fenced this run's producer, or this run fenced it)."""
    if (committed_chunk if committed_chunk is not None else -1) != chunk - 1:
        raise BackfillError(
            f"backfill {backfill_id}: another run committed chunk {committed_chunk} while this run was "
            f"about to write chunk {chunk}; this run stops without writing (the other run, or a "
            f"re-run, finishes the backfill)"
        )
