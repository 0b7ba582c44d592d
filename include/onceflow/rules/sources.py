"""Source positions: which partition of which source topic, and how positions are written down.

An app reads one or more source topics (App.sources). Everything that records where the job stands in its source
(a batch's planned range, the ledger, the group's committed offsets, savepoints, restores, quarantines, the
reconciliation's ranges) keys it by `SourcePartition`, a topic and a partition.

On the wire (the ledger's JSON, savepoint manifests, restore records) a position map is written beside the topic
field it belongs to. For one topic it keeps the shape it always had: `"topic": "t"` and keys by partition
(`{"0": ...}`), so records of an app of one topic read the same, byte for byte, as before several were possible.
For several topics the field names them all (`"topic": "a,b"`, sorted) and the keys carry the topic
(`{"a:0": ..., "b:0": ...}`). Neither ',' nor ':' is a character of a Kafka topic name, so neither form is
ambiguous. Positions read back are checked: a key naming a topic not in the field, or a field that is no Kafka
topic name, is refused (`BadPositions`), as every record read from Kafka is untrusted input.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple, TypeVar

from onceflow.wire import OnceflowError

V = TypeVar("V")
W = TypeVar("W")

# Kafka's own rule for a topic name (at most 249 of these characters; "." and ".." alone are refused by Kafka).
KAFKA_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")
# A key of a position map in JSON: a partition number, or `topic:partition` (keyed_to_json).
POSITION_KEY = re.compile(rf"(?:{KAFKA_TOPIC.pattern}:)?[0-9]{{1,9}}")


class BadPositions(OnceflowError, ValueError):
    """Source positions that are not what the platform writes."""


class SourcePartition(NamedTuple):
    """One partition of one source topic. Orders by topic, then partition."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]"


def on_topic(topic: str, by_partition: Mapping[int, V]) -> dict[SourcePartition, V]:
    """A map by partition of one topic, keyed by source partition."""
    return {SourcePartition(topic, p): v for p, v in sorted(by_partition.items())}


def of_topic(topic: str, by_source: Mapping[SourcePartition, V]) -> dict[int, V]:
    """The part of a source-keyed map on one topic, by partition."""
    return {sp.partition: v for sp, v in sorted(by_source.items()) if sp.topic == topic}


def topics_of(keys: Iterable[SourcePartition]) -> list[str]:
    """The topics of these source partitions, sorted, each once."""
    return sorted({sp.topic for sp in keys})


def topic_field(keys: Iterable[SourcePartition], default: str = "") -> str:
    """The `topic` field written beside a position map: its one topic, or its topics sorted and joined by ','."""
    return ",".join(topics_of(keys)) or default


def position_keys(keys: Iterable[SourcePartition], topics: Iterable[str] = ()) -> dict[SourcePartition, str]:
    """Each source partition's key in a position map's JSON: its partition for one topic, `topic:partition` for
    several (those of the keys and `topics`: a map written beside a `topic` field naming more than its keys)."""
    keys = sorted(set(keys))
    several = len({*topics_of(keys), *topics}) > 1
    return {sp: (f"{sp.topic}:{sp.partition}" if several else str(sp.partition)) for sp in keys}


def position_value(sp: SourcePartition, keys: Iterable[SourcePartition]) -> int | str:
    """A source partition as a JSON value beside others (`keys`): its number for one topic, `topic:partition` for
    several."""
    return sp.partition if len(topics_of([sp, *keys])) == 1 else f"{sp.topic}:{sp.partition}"


def split_key(key: str) -> tuple[str | None, str]:
    """A position key's topic (None: a key by partition alone, of a map of one topic) and its partition part."""
    topic, sep, part = key.rpartition(":")
    return (topic if sep else None), part


def keyed_to_json(
    by_source: Mapping[SourcePartition, V], convert: Callable[[V], W], topics: Iterable[str] = ()
) -> dict[str, W]:
    """A position map's JSON object: keys by partition for one topic, `topic:partition` for several (of its keys
    and `topics`, as position_keys)."""
    keys = position_keys(by_source, topics)
    return {keys[sp]: convert(v) for sp, v in sorted(by_source.items())}


def topics_from_field(field: object) -> list[str]:
    """The topics named by a `topic` field read back (`t`, or `a,b`); BadPositions unless each is a topic name."""
    if not isinstance(field, str) or not field:
        raise BadPositions(f"expected a source topic name, got {field!r:.80}")
    names = field.split(",")
    for n in names:
        if not KAFKA_TOPIC.fullmatch(n) or n in (".", ".."):
            raise BadPositions(f"{n!r:.80} is not a Kafka topic name")
    return names


def keyed_from_json(raw: Mapping[str, V], field: object) -> dict[SourcePartition, V]:
    """A position map read back, beside its `topic` field (the caller converts and checks the values)."""
    names = topics_from_field(field)
    out: dict[SourcePartition, V] = {}
    for key, v in raw.items():
        named, part = split_key(key) if isinstance(key, str) else ("", "")
        if named is None:
            if len(names) != 1:
                raise BadPositions(f"position {key!r:.80} names no topic, but the record names {len(names)}")
            topic = names[0]
        elif named not in names:
            raise BadPositions(f"position {key!r:.80} is on a topic the record does not name ({field})")
        else:
            topic = named
        if not (part.isascii() and part.isdigit()):
            raise BadPositions(f"position {key!r:.80}: expected a partition number")
        out[SourcePartition(topic, int(part))] = v
    return out


def offsets_to_json(offsets: Mapping[SourcePartition, int]) -> dict[str, dict[str, int]]:
    """Positions in the form Spark's Kafka source reads and writes (`startingOffsets`, a checkpoint's offsets):
    `{"topic": {"partition": offset}}`."""
    out: dict[str, dict[str, int]] = {}
    for sp, off in sorted(offsets.items()):
        out.setdefault(sp.topic, {})[str(sp.partition)] = off
    return out


def offsets_from_json(raw: Mapping[str, Mapping[str, object]], topics: Iterable[str]) -> dict[SourcePartition, int]:
    """The positions of `topics` in Spark's form (`{"topic": {"partition": offset}}`); others are left out."""
    out: dict[SourcePartition, int] = {}
    for topic in topics:
        for p, off in (raw.get(topic) or {}).items():
            if not (isinstance(p, str) and p.isdigit()) or not isinstance(off, int) or isinstance(off, bool):
                raise BadPositions(f"offsets of {topic}: expected {{partition: offset}}, got {p!r:.40}: {off!r:.40}")
            out[SourcePartition(topic, int(p))] = off
    return out


def fmt_ranges(ranges: Mapping[SourcePartition, tuple[int, int]]) -> str:
    """`{t[0]: [s, e), ...}` for messages."""
    return "{" + ", ".join(f"{sp}: [{s}, {e})" for sp, (s, e) in sorted(ranges.items())) + "}"
