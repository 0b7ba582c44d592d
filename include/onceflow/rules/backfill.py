"""Backfill, the pure part: the parameters, their validation (all before any write), and the chunking.

A backfill runs the app's plan as a Spark batch over a source range and writes its results exactly once to a
target topic (by default `<app>_backfill`, not the live sink), in chunks: chunk i is the output rows
[i*chunk_size, (i+1)*chunk_size) in (key, value) order, which is deterministic for a fixed source range. Each chunk
is one Kafka transaction of the backfill's own transactional id, carrying its records, a ledger record (kind
"backfill") and the backfill group's offsets with metadata {"chunk": i}; so a re-run or a resumed run asks the
group how far it got and never writes a chunk twice.

The range is on the app's source topics (App.sources), keyed by SourcePartition: for an app of one topic the
offsets are written by partition (`{"0": 100}`), as they always were; for several by `topic:partition`
(`{"a:0": 100, "b:0": 7}`), a time range resolving on every one of them.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from onceflow.rules import sources
from onceflow.rules.sources import SourcePartition
from onceflow.wire import OnceflowError

# No '.': an id is the last part of the backfill's group and transactional id (onceflow.rules.names), and '.'
# separates those parts.
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


class BackfillError(OnceflowError, ValueError):
    """Bad parameters, refused before anything is written; the message says what to change."""


@dataclass(frozen=True)
class Spec:
    id: str
    source_topics: tuple[str, ...]  # the app's source topics, sorted: what a time range reads, what offsets name
    target_topic: str
    chunk_size: int
    start: dict[SourcePartition, int] = field(default_factory=dict)  # inclusive
    end: dict[SourcePartition, int] = field(default_factory=dict)  # exclusive
    since_ms: int | None = None  # or a time range (Kafka record timestamps): start and
    until_ms: int | None = None  # end then hold its resolution to offsets
    dry_run: bool = False
    window_s: int = 5
    rules: int = 1  # the app's rules version (App.rules_version)
    max_event_ahead_ms: int | None = None

    @property
    def by_time(self) -> bool:
        return self.since_ms is not None or self.until_ms is not None

    @property
    def source_field(self) -> str:
        """The source topics as one field: `t`, or `a,b` (sources.topic_field)."""
        return ",".join(sorted(self.source_topics))

    def positions(self, by_source: Mapping[SourcePartition, Any]) -> dict[str, Any]:
        """A position map of this backfill as JSON: by partition for an app of one topic, `topic:partition` for
        several, however many of them the map covers."""
        return sources.keyed_to_json(by_source, lambda v: v, self.source_topics)

    def spec_hash(self) -> str:
        """The backfill's identity: what its output depends on. A time range is identified by its times, not by
        the offsets they resolve to (those are fixed by the first run and reused when it resumes, however much
        the source has grown since). For an app of one topic the same as before several were possible."""
        rng = (
            {"since": self.since_ms, "until": self.until_ms}
            if self.by_time
            else {"start": self.positions(self.start), "end": self.positions(self.end)}
        )
        blob = json.dumps(
            {
                "source": self.source_field,
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
        """JSON-safe (an XCom, spark-submit's --spec): positions as `positions` writes them; from_dict reads it."""
        return asdict(self) | {
            "source_topics": list(self.source_topics),
            "start": self.positions(self.start),
            "end": self.positions(self.end),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Spec:
        topics = tuple(sorted(d["source_topics"]))
        return cls(**(dict(d) | {"source_topics": topics} | {k: parse_offsets(d[k], topics) for k in ("start", "end")}))


@dataclass(frozen=True)
class TopicFacts:
    exists: bool
    low: dict[int, int] = field(default_factory=dict)  # earliest offset still kept, per partition
    high: dict[int, int] = field(default_factory=dict)  # end of the log, per partition


def parse_offsets(text: str | Mapping[Any, Any] | None, topics: Sequence[str]) -> dict[SourcePartition, int]:
    """`{"0": 100, "1": 250}` (JSON or dict) of an app of one source topic, or `{"a:0": 100, "b:0": 7}` of one of
    several (`topics`) -> offsets by source partition."""
    if text in (None, "", {}):
        return {}
    try:
        d = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        d = None
    if not isinstance(d, Mapping):
        raise BackfillError(f'offsets must map partitions to offsets, e.g. {{"0": 100}}; got {text!r:.120}')
    out: dict[SourcePartition, int] = {}
    for key, off in d.items():
        topic, part = sources.split_key(str(key))
        if topic is None:
            if len(topics) != 1:
                raise BackfillError(
                    f"the app reads {len(topics)} source topics ({', '.join(topics)}): name each position's topic, "
                    f'e.g. {{"{topics[0] if topics else "topic"}:0": 100}}; got {key!r:.40}'
                )
            topic = topics[0]
        elif topic not in topics:
            raise BackfillError(f"{key!r:.80}: {topic!r:.60} is not a source topic of the app ({', '.join(topics)})")
        try:
            if not (part.isascii() and part.isdigit()) or isinstance(off, bool):
                raise ValueError
            out[SourcePartition(topic, int(part))] = int(off)
        except (TypeError, ValueError):
            raise BackfillError(
                f'offsets must map partitions to offsets, e.g. {{"0": 100}}; got {key!r:.40}: {off!r:.40}'
            ) from None
    return out


def _where(sp: SourcePartition, spec: Spec) -> str:
    return f"partition {sp.partition}" if len(spec.source_topics) == 1 else f"{sp.topic} partition {sp.partition}"


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
        raise BackfillError(
            f"start and end name different partitions: {sorted(spec.positions(spec.start))} vs "
            f"{sorted(spec.positions(spec.end))}"
        )
    if by_time and (spec.since_ms is None or spec.until_ms is None):
        raise BackfillError("a time range needs both since and until")
    if by_time and spec.until_ms is not None and spec.since_ms is not None and spec.until_ms <= spec.since_ms:
        raise BackfillError(f"the end of the time range ({spec.until_ms}) is not after its start ({spec.since_ms})")
    for sp in sorted(spec.start):
        if spec.end[sp] < spec.start[sp]:
            raise BackfillError(f"{_where(sp, spec)}: end {spec.end[sp]} is before start {spec.start[sp]}")
    if spec.target_topic in protected_topics:
        raise BackfillError(
            f"the target {spec.target_topic} is the live job's {protected_topics[spec.target_topic]} "
            f"topic: a backfill writes to its own topic (docs/backfill.md says how consumers merge)"
        )


def check_against(spec: Spec, source: Mapping[str, TopicFacts], target: TopicFacts) -> None:
    """What needs the cluster: every source topic and the target exist, the range is inside the sources'
    retention. `source`: the facts of each of the app's source topics."""
    for topic in spec.source_topics:
        if not source.get(topic, TopicFacts(False)).exists:
            raise BackfillError(f"unknown source topic {topic}")
    if not target.exists:
        raise BackfillError(
            f"unknown target topic {spec.target_topic}: create it (`onceflow stack topics` creates the default one)"
        )
    for sp in sorted(spec.start):
        facts = source[sp.topic]
        if sp.partition not in facts.high:
            raise BackfillError(f"the source topic {sp.topic} has no partition {sp.partition}")
        if spec.start[sp] < facts.low[sp.partition]:
            raise BackfillError(
                f"{_where(sp, spec)}: offset {spec.start[sp]} is no longer in the source (retention kept "
                f"{facts.low[sp.partition]} onwards)"
            )
        if spec.end[sp] > facts.high[sp.partition]:
            raise BackfillError(
                f"{_where(sp, spec)}: end {spec.end[sp]} is beyond the end of the source ({facts.high[sp.partition]})"
            )


def overlaps(
    a_start: Mapping[SourcePartition, int],
    a_end: Mapping[SourcePartition, int],
    b_start: Mapping[SourcePartition, int],
    b_end: Mapping[SourcePartition, int],
) -> bool:
    """Whether two ranges share a record: on some source partition of both, non-empty and intersecting."""
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
