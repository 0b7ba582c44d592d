"""Spark's checkpoint, as data: the planned range and watermark of batch N from `offsets/N`, the initial offsets,
and onceflow's own files in it. Pure: files are read through `CheckpointFS` (onceflow.storage.checkpoint provides
the Hadoop FileSystem of a running driver, and plain files), so the rules are unit-tested on dicts.

Spark writes `offsets/N` before it runs batch N (the pre-commit record of the protocol) and `commits/N` after
foreachBatch returns.

onceflow keeps one file of its own in the checkpoint, `onceflow/epoch.json` (Spark ignores it): after a savepoint
is restored behind the sink, it maps Spark's batch ids to the ledger's (see `Epoch`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from onceflow.rules import json_records, sources
from onceflow.rules.ledger import BatchPlan, QuarantineRange
from onceflow.rules.sources import SourcePartition
from onceflow.wire import OnceflowError


class CheckpointError(OnceflowError):
    pass


class CheckpointFS(Protocol):
    def read_text(self, rel: str) -> str | None: ...


def parse_offsets_file(text: str, topics: list[str]) -> tuple[dict[str, Any], dict[SourcePartition, int]]:
    """`offsets/N`: line 1 `v1`, line 2 the batch metadata JSON, then one offsets JSON per source. The app's one
    Kafka source subscribes all its topics, so their offsets are on one line (`{"a": {"0": 5}, "b": {...}}`)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines or not lines[0].startswith("v"):
        raise CheckpointError(f"unrecognised offsets file (first line {lines[:1]})")
    meta = json.loads(lines[1]) if len(lines) > 1 else {}
    for ln in lines[2:]:
        if ln.strip() == "-":
            continue
        src = json.loads(ln)
        if any(t in src for t in topics):
            return meta, sources.offsets_from_json(src, topics)
    raise CheckpointError(f"no offsets for topic {','.join(topics)} in the offsets file")


def parse_initial_offsets(text: str, topics: list[str]) -> dict[SourcePartition, int]:
    """`sources/0/0`, the Kafka source's initial offsets (a leading NUL byte, `v1`, then JSON)."""
    body = text.lstrip("\x00")
    start = body.find("{")
    if start < 0:
        raise CheckpointError("unrecognised initial offsets file")
    return sources.offsets_from_json(json.loads(body[start:]), topics)


EPOCH_FILE = "onceflow/epoch.json"


@dataclass(frozen=True)
class Epoch:
    """How Spark's batch ids map to the ledger's since the last restore (epoch 0: they are equal).

    A restore of a savepoint taken at Spark batch S, when the sink has committed up to ledger batch M beyond
    it, makes Spark's next batch S+1 read the whole committed range in one go (the catch-up batch: state is
    rebuilt, nothing is written) and stand for ledger batch M; Spark batch n is ledger batch n + ledger_shift
    from then on.
    """

    epoch: int = 0
    ledger_shift: int = 0
    spark_batch_from: int = 0
    catch_up_spark_batch: int | None = None
    catch_up_from: int | None = None  # the first ledger batch the catch-up batch re-reads
    savepoint_id: str | None = None
    restored_ms: int = 0
    # The mapping of Spark batches before the restore (the savepoint's own batch, until the next commit): a
    # savepoint taken between a restore and its first commit is at that batch. None: the same as ledger_shift.
    prior_shift: int | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Epoch:
        return json_records.from_json(cls, json.loads(text))

    def ledger_batch(self, spark_batch: int) -> int:
        if spark_batch < self.spark_batch_from and self.prior_shift is not None:
            return spark_batch + self.prior_shift
        return spark_batch + self.ledger_shift


def read_epoch(fs: CheckpointFS) -> Epoch:
    text = fs.read_text(EPOCH_FILE)
    return Epoch.from_json(text) if text else Epoch()


# The job's copy of the quarantined source offsets (the ledger's quarantine records are the audited truth; a
# restore rewrites this file from them).
QUARANTINE_FILE = "onceflow/quarantine.json"


def read_quarantine(fs: CheckpointFS) -> list[QuarantineRange]:
    text = fs.read_text(QUARANTINE_FILE)
    return [QuarantineRange(**r) for r in json.loads(text)] if text else []


def render_quarantine(ranges: Iterable[QuarantineRange]) -> str:
    return json.dumps(
        [
            {"partition": r.partition, "start": r.start, "end": r.end} | ({"topic": r.topic} if r.topic else {})
            for r in ranges
        ]
    )


def render_offsets_file(template: str, end: Mapping[SourcePartition, int], watermark_ms: int, batch_ts_ms: int) -> str:
    """An `offsets/N` file like `template` (the previous batch's, so Spark's conf entries carry over) with the
    given end offsets on the source line of their topics and the given batch watermark and timestamp."""
    lines = [ln for ln in template.splitlines() if ln.strip()]
    meta = json.loads(lines[1])
    meta["batchWatermarkMs"], meta["batchTimestampMs"] = int(watermark_ms), int(batch_ts_ms)
    out = [lines[0], json.dumps(meta, separators=(",", ":"))]
    topics = sources.topics_of(end)
    for ln in lines[2:]:
        if ln.strip() != "-" and any(t in json.loads(ln) for t in topics):
            ln = json.dumps(sources.offsets_to_json(end), separators=(",", ":"))
        out.append(ln)
    return "\n".join(out)


# Spark's own logs in a checkpoint: it plans batch N in offsets/N, keeps state under state/, closes N in commits/N.
SPARK_LOG_DIRS = ("offsets", "state", "commits")


def first_start_debris(listing: Mapping[str, Iterable[str]]) -> list[str]:
    """What a driver killed before its first batch was planned left behind, by directory of SPARK_LOG_DIRS.

    Spark writes `offsets/0` as a hidden temporary file (`.0.<uuid>.tmp`, and its `.crc`) renamed once complete. A
    kill -9 in between leaves the temporary file, and Spark (4.x) then refuses to start the query at all: it finds
    no planned batch and a checkpoint that is not empty. With no batch planned (no numbered file in offsets/),
    nothing was read, written or committed, and the hidden files there are that debris. Any other file is left
    for Spark to refuse (a checkpoint shared with another query)."""
    if any(name.isdigit() for name in listing.get("offsets", ())):
        return []
    return [f"{d}/{name}" for d in SPARK_LOG_DIRS for name in sorted(listing.get(d, ())) if name.startswith(".")]


def batch_plan(fs: CheckpointFS, batch: int, topics: list[str], epoch: Epoch = Epoch()) -> BatchPlan:
    """The plan of Spark batch `batch` over the app's source `topics`, under the ledger's batch id (`epoch` maps one
    to the other)."""
    cur = fs.read_text(f"offsets/{batch}")
    if cur is None:
        raise CheckpointError(f"offsets/{batch} is missing from the checkpoint")
    meta, end = parse_offsets_file(cur, topics)
    if batch > 0:
        prev = fs.read_text(f"offsets/{batch - 1}")
        if prev is None:
            raise CheckpointError(f"offsets/{batch - 1} is missing: cannot tell where batch {batch} starts")
        _, start = parse_offsets_file(prev, topics)
    else:
        init = fs.read_text("sources/0/0")
        if init is None:
            raise CheckpointError("sources/0/0 (the initial offsets) is missing from the checkpoint")
        start = parse_initial_offsets(init, topics)
    # A partition new in this batch starts at the offset Spark began reading it from (0 for a new partition).
    start = {p: start.get(p, 0) for p in end}
    catch_up = epoch.catch_up_from if batch == epoch.catch_up_spark_batch else None
    return BatchPlan(
        batch=epoch.ledger_batch(batch),
        start=start,
        end=end,
        watermark_ms=int(meta.get("batchWatermarkMs", 0)),
        batch_ts_ms=int(meta.get("batchTimestampMs", 0)),
        spark_batch=batch,
        epoch=epoch.epoch,
        catch_up_from=catch_up,
    )
