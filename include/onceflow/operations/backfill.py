"""Backfill: recompute the app's results over a source range with a Spark batch job and write them exactly once.

What `<app>_backfill` and `onceflow backfill` run. The range is on the app's source topics, each position keyed by
its source partition. The parameters are validated (onceflow.rules.backfill) before anything is written; then, per
chunk, one Kafka transaction of the backfill's own transactional id (`onceflow.<app>.backfill.<id>`, never the live
job's) carries the chunk's records, a ledger record (kind "backfill") and the offsets of the backfill's group on
every source partition of the range, with metadata {"chunk": i, "spec": <hash>}. A re-run or a resumed run reads
that metadata and starts after the last committed chunk, so no chunk is written twice; a run with the same id but
different parameters is refused.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import TopicPartition
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from onceflow import wire
from onceflow.config import Settings
from onceflow.faults import Injector
from onceflow.kafka import clients as kafka_clients
from onceflow.kafka import events as ev
from onceflow.kafka import reading as kafka_reading
from onceflow.kafka.transactional import TransactionalWriter
from onceflow.rules import backfill as br
from onceflow.rules import clock, names
from onceflow.rules.ledger import LedgerEntry
from onceflow.rules.progress import report as say
from onceflow.rules.progress import step
from onceflow.rules.reconciliation import to_ms
from onceflow.rules.sources import SourcePartition, keyed_from_json, on_topic
from onceflow.runtime import launcher, procs
from onceflow.spark import app_plan, kafka_source, partition_stream

log = logging.getLogger(__name__)

ID_PATTERN = br.ID_RE.pattern  # the DAG's Param checks the id in the form, before any run


def transactional_id(settings: Settings, backfill_id: str) -> str:
    return names.backfill_transactional_id(settings.app_id, backfill_id)


def group_id(settings: Settings, backfill_id: str) -> str:
    return names.backfill_group(settings.app_id, backfill_id)


def registry(settings: Settings) -> Path:
    return settings.run_dir / "backfills"


# ---------------------------------------------------------------------------- checks (no writes)
def topic_facts(settings: Settings, topic: str) -> br.TopicFacts:
    wm = kafka_reading.watermarks(settings, topic)
    if wm is None:
        return br.TopicFacts(False)
    return br.TopicFacts(True, {p: lo for p, (lo, _) in wm.items()}, {p: hi for p, (_, hi) in wm.items()})


def source_facts(settings: Settings, spec: br.Spec) -> dict[str, br.TopicFacts]:
    return {topic: topic_facts(settings, topic) for topic in spec.source_topics}


def source_ends(facts: dict[str, br.TopicFacts]) -> dict[SourcePartition, int]:
    """The end of every partition of the source topics."""
    return {sp: hi for topic, f in facts.items() for sp, hi in on_topic(topic, f.high).items()}


def running(settings: Settings) -> list[dict]:
    """Backfills of this app running now (on this machine), from their registry files."""
    out = []
    for f in sorted(registry(settings).glob("*.json")):
        try:
            d = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        pid = int(d.get("pid") or 0)
        if d.get("host") == socket.gethostname() and pid > 0 and procs.pid_alive(pid):
            out.append(d)
    return out


def validate(settings: Settings, spec: br.Spec) -> br.Spec:
    """Every check that can refuse the backfill; returns the spec with its time range resolved to offsets (the
    first run's resolution, when this backfill id has committed chunks already)."""
    br.check_params(
        spec,
        {
            **{topic: f"output {name}" for name, topic in settings.outputs.items()},
            settings.sink_topic: "sink",
            settings.dlq_topic: "DLQ",
            settings.ledger_topic: "ledger",
            **{topic: "source" for topic in settings.source_topic_list},
            settings.job_events_topic: "events",
        },
        resolved=spec.by_time and bool(spec.start),
    )
    source, target = source_facts(settings, spec), topic_facts(settings, spec.target_topic)
    found = all(f.exists for f in source.values())
    p = progress(settings, spec, source_ends(source)) if found else Progress()
    if spec.by_time and not spec.start and found:
        if p.starts:  # resumed: the range is what the first run resolved, whatever came into the source since
            start, end = p.starts, p.ends
        else:
            assert spec.since_ms is not None and spec.until_ms is not None  # check_params: a time range has both
            start, end = {}, {}
            for topic, f in source.items():  # each source topic's offsets at those times
                start |= on_topic(topic, kafka_reading.offsets_at(settings, topic, spec.since_ms, f.high))
                end |= on_topic(topic, kafka_reading.offsets_at(settings, topic, spec.until_ms, f.high))
        spec = dataclasses.replace(spec, start=start, end=end)
    br.check_against(spec, source, target)
    for other in running(settings):
        if other["id"] == spec.id:
            raise br.BackfillError(f"backfill {spec.id} is already running (pid {other['pid']})")
        try:  # its range, on its source topics
            o_start = keyed_from_json(other["start"], other["source"])
            o_end = keyed_from_json(other["end"], other["source"])
        except (KeyError, TypeError, ValueError):
            continue  # not a registry file this version writes: its run cannot be compared
        if br.overlaps(spec.start, spec.end, o_start, o_end):
            raise br.BackfillError(
                f"the range overlaps backfill {other['id']}, running now (pid {other['pid']}): "
                f"wait for it, or choose a range that does not overlap"
            )
    if p.spec is not None and p.spec != spec.spec_hash():
        raise br.BackfillError(
            f"backfill id {spec.id} was run before with other parameters (spec {p.spec}, "
            f"now {spec.spec_hash()}): use a new id"
        )
    return spec


@dataclass(frozen=True)
class Progress:
    """What a backfill's group has committed: the last chunk, the spec, and the range it resolved to."""

    chunk: int | None = None
    spec: str | None = None
    starts: dict[SourcePartition, int] = field(default_factory=dict)
    ends: dict[SourcePartition, int] = field(default_factory=dict)


def read_progress(
    settings: Settings, partitions: Iterable[SourcePartition], *, group: str | None = None, consumer=None
) -> Progress:
    """The progress a backfill's group (`group`, or `consumer`'s) holds in its offsets' metadata, on the source
    partitions of its range (each keeps the range's start there, and its end as the committed offset)."""
    got = kafka_reading.group_offsets(settings, partitions, group=group, consumer=consumer)
    metas = {sp: (off, json.loads(meta)) for sp, off, meta in got if off is not None and meta}
    if not metas:
        return Progress()
    first = metas[min(metas)][1]
    return Progress(
        int(first["chunk"]),
        first.get("spec"),
        {p: int(m["start"]) for p, (_, m) in metas.items() if "start" in m},
        {p: off for p, (off, m) in metas.items() if "start" in m},
    )


def progress(settings: Settings, spec: br.Spec, ends: dict[SourcePartition, int]) -> Progress:
    """The last chunk this backfill committed (None: none), from its group's offset metadata, or from the ledger
    when the group holds nothing. `ends`: every partition of the source topics (a time range not resolved yet may
    have committed on any of them)."""
    got = read_progress(settings, spec.start or ends, group=group_id(settings, spec.id))
    return got if got.chunk is not None else ledger_progress(settings, spec.id)


def ledger_progress(settings: Settings, backfill_id: str) -> Progress:
    """The same facts from the ledger's backfill records, which are kept forever: Kafka deletes the group's offsets
    `offsets.retention.minutes` after its last commit, and a resume that trusted only them would start at chunk 0
    and write every committed chunk again, with its "same id, other parameters" guard gone (protocol review N-2).
    Each chunk's record was committed in the same transaction as the group's offsets, so the two agree."""
    from onceflow.operations import audit

    mine = [
        e
        for e in audit.ledger_records(settings)
        if isinstance(e, LedgerEntry) and e.kind == wire.LEDGER_BACKFILL and e.backfill_id == backfill_id
    ]
    if not mine:
        return Progress()
    last = max(mine, key=lambda e: e.batch)
    return Progress(
        last.batch,
        last.spec_hash,
        {sp: a for sp, (a, _) in last.ranges.items()},
        {sp: b for sp, (_, b) in last.ranges.items()},
    )


# ---------------------------------------------------------------------------- the computation
def windows(spark: SparkSession, settings: Settings, spec: br.Spec) -> DataFrame:
    """The app's own plan (its declaration, as the job runs it) as a batch over the range: every result it computes
    from those records (a batch has no watermark, so every window of the range, with all its records), in chunk
    order: by key, then value, which is deterministic for a fixed range (for ip_count: window start, then IP)."""
    raw = kafka_source.read_ranges(spark, settings, spec.start, spec.end)
    # the rules the spec was validated with, not whatever the settings say now
    as_spec = settings.replace(
        window_s=spec.window_s,
        max_event_ahead_s=(spec.max_event_ahead_ms if spec.max_event_ahead_ms is not None else 10**15) / 1000,
    )
    out = app_plan.output(settings.declared_app().transform, raw.select(*app_plan.SOURCE_COLUMNS), as_spec)
    # every output's results go to the target topic, a named output's with its name (header onceflow.output)
    return (
        out.where(F.col("kind") == wire.KIND_RESULT).select("key", "value", "output").orderBy("key", "value", "output")
    )


# ---------------------------------------------------------------------------- the run
def run(spark: SparkSession, settings: Settings, spec: br.Spec, bus: ev.EventBus | None = None) -> dict:
    """Fence first, then read progress: an older run of the same id is fenced before this run decides where to
    start, and every chunk checks that the one before it is the group's last committed chunk."""
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spec = validate(settings, spec)
    bus = bus or ev.EventBus(settings)
    injector = Injector(
        settings.fault,
        settings.run_dir / "faults" / f"{settings.app_id}.backfill.{spec.id}",
        on_fire=lambda f: bus.emit(wire.FAULT_INJECTED, logging.WARNING, flush=True, fault=f.name, backfill=spec.id),
    )
    injector.hit("stall_before_fence", 0)  # validation read the progress; nothing of it is trusted past here
    writer = None if spec.dry_run else ChunkWriter(settings, spec)  # init_transactions fences older runs
    try:
        return _run(spark, settings, spec, writer, injector, bus)
    finally:
        if writer is not None:
            writer.close()


def _run(spark, settings: Settings, spec: br.Spec, writer: ChunkWriter | None, injector: Injector, bus) -> dict:
    done = progress(settings, spec, spec.end)
    if done.starts and (done.starts, done.ends) != (spec.start, spec.end):
        raise br.BackfillError(
            f"backfill {spec.id}: another run committed chunks of the range {spec.positions(done.starts)} -> "
            f"{spec.positions(done.ends)}, not {spec.positions(spec.start)} -> {spec.positions(spec.end)}; run it "
            f"again to resume that range"
        )
    first = br.first_chunk_to_write(done.chunk)
    out = windows(spark, settings, spec).cache()
    total = out.count()
    n = br.chunks(total, spec.chunk_size)
    report = {
        "id": spec.id,
        "spec": spec.spec_hash(),
        "source": spec.source_field,
        "target": spec.target_topic,
        "start": spec.positions(spec.start),
        "end": spec.positions(spec.end),
        "records_in_range": sum(spec.end[p] - spec.start[p] for p in spec.start),
        "windows": total,
        "chunks": n,
        "already_committed_chunks": first,
        "dry_run": spec.dry_run,
    }
    if spec.dry_run:
        report["would_write_chunks"] = max(0, n - first)
        report["would_write_records"] = max(0, total - first * spec.chunk_size)
        report["sample"] = [r["key"] for r in out.limit(5).collect()]
        out.unpersist()
        return report
    assert writer is not None  # None only for a dry run, which returned above
    if first >= n:
        report |= {"written_chunks": 0, "written_records": 0, "status": "complete (nothing left to write)"}
        out.unpersist()
        return report

    reg = registry(settings) / f"{spec.id}.json"
    reg.parent.mkdir(parents=True, exist_ok=True)
    reg.write_text(
        json.dumps(
            {
                "id": spec.id,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "source": spec.source_field,
                "start": spec.positions(spec.start),
                "end": spec.positions(spec.end),
                "started_ms": clock.now_ms(),
            }
        )
    )
    bus.emit(wire.BACKFILL_STARTED, flush=True, id=spec.id, chunks=n, from_chunk=first, windows=total, pid=os.getpid())
    injector.hit("stall_before_chunks", 0)
    written = records = 0
    started = time.monotonic()

    def wrote(chunk: int, n_rows: int) -> None:
        bus.emit(wire.BACKFILL_CHUNK, id=spec.id, chunk=chunk, records=n_rows)
        say(step(f"backfill {spec.id}", chunk + 1, n, "chunk", records, time.monotonic() - started, first))

    say(f"backfill {spec.id}: {total} windows in {n} chunks, from chunk {first}")
    try:
        chunk, rows = first, []
        # a partition at a time, in order, as Arrow batches
        for i, (key, value, output) in enumerate(partition_stream.tuples(out.select("key", "value", "output"))):
            if i < first * spec.chunk_size:
                continue
            rows.append((key, value, output))
            if len(rows) == spec.chunk_size:
                writer.write(chunk, rows, injector)
                written, records = written + 1, records + len(rows)
                wrote(chunk, len(rows))
                chunk, rows = chunk + 1, []
        if rows:
            writer.write(chunk, rows, injector)
            written, records = written + 1, records + len(rows)
            wrote(chunk, len(rows))
    finally:
        reg.unlink(missing_ok=True)
        out.unpersist()
    bus.emit(wire.BACKFILL_DONE, flush=True, id=spec.id, written_chunks=written, written_records=records)
    return report | {"written_chunks": written, "written_records": records, "status": "complete"}


class ChunkWriter:
    """One transaction per chunk: records + ledger record + the group's offsets carrying the chunk number."""

    def __init__(self, settings: Settings, spec: br.Spec):
        self.s, self.spec = settings, spec
        self.tid = transactional_id(settings, spec.id)
        # init_transactions fences an older run of the same backfill
        self.writer = TransactionalWriter(
            lambda: kafka_clients.transactional_producer(settings, self.tid, **{"linger.ms": 5}),
            self.tid,
            settings.transaction_timeout_ms,
            commit_timeout_s=settings.commit_timeout_s,
        )
        self.group = kafka_clients.read_committed_consumer(settings, group_id=group_id(settings, spec.id))

    def write(self, chunk: int, rows: list[tuple[str, bytes, str | None]], injector: Injector) -> None:
        done = read_progress(self.s, self.spec.end, consumer=self.group).chunk
        if done is None and chunk > 0:  # the group's offsets expired: its first new commit restores them
            done = ledger_progress(self.s, self.spec.id).chunk
        br.check_next_chunk(chunk, done, self.spec.id)
        started = time.monotonic()
        headers = [
            (wire.H_APP, self.s.app_id.encode()),
            (wire.H_BACKFILL, self.spec.id.encode()),
            (wire.H_CHUNK, str(chunk).encode()),
        ]
        w = self.writer
        # a TxnError leaves the chunk aborted, or its producer replaced (an unknown outcome: a re-run settles it)
        with w.transaction():
            for key, value, output in rows:
                named = [(wire.H_OUTPUT, output.encode())] if output is not None else []
                w.produce(self.spec.target_topic, key.encode(), value, headers + named)
            if injector.faults:  # tests: the crash then leaves the chunk's records in the open transaction
                w.flush(30)
            injector.hit("crash_in_chunk", chunk)
            entry = LedgerEntry(
                app=self.s.app_id,
                batch=chunk,
                ranges={sp: (self.spec.start[sp], self.spec.end[sp]) for sp in self.spec.start},
                watermark_ms=0,
                batch_ts_ms=0,
                outputs=len(rows),
                dlq=0,
                txn_ms=round((time.monotonic() - started) * 1000, 3),
                commit_time_ms=clock.now_ms(),
                transactional_id=self.tid,
                kind=wire.LEDGER_BACKFILL,
                backfill_id=self.spec.id,
                spec_hash=self.spec.spec_hash(),
                rules=self.spec.rules,
                max_event_ahead_ms=self.spec.max_event_ahead_ms,
            )
            w.produce(self.s.ledger_topic, self.s.app_id.encode(), entry.to_json(), headers)
            h = self.spec.spec_hash()
            w.send_offsets(
                [
                    TopicPartition(sp.topic, sp.partition, end, br.chunk_metadata(chunk, h, self.spec.start[sp]))
                    for sp, end in sorted(self.spec.end.items())
                ],
                self.group.consumer_group_metadata(),
            )
        injector.hit("crash_after_chunk", chunk)

    def close(self) -> None:
        try:
            self.group.close()
        finally:
            self.writer.close()


def spec_from(
    settings: Settings,
    backfill_id: str,
    start=None,
    end=None,
    since=None,
    until=None,
    target: str | None = None,
    chunk_size: int = 5000,
    dry_run: bool = False,
) -> br.Spec:
    """A Spec from CLI or DAG parameters (offsets as JSON objects, times as ISO-8601 or epoch ms)."""
    try:
        since_ms, until_ms = to_ms(since), to_ms(until)
    except ValueError as e:
        raise br.BackfillError(str(e)) from None
    topics = tuple(sorted(settings.source_topic_list))
    return br.Spec(
        id=backfill_id,
        source_topics=topics,
        target_topic=target or settings.backfill_topic,
        chunk_size=int(chunk_size),
        start=br.parse_offsets(start, topics),
        end=br.parse_offsets(end, topics),
        since_ms=since_ms,
        until_ms=until_ms,
        dry_run=bool(dry_run),
        window_s=settings.window_s,
        rules=settings.declared_app().rules_version,
        max_event_ahead_ms=settings.max_event_ahead_ms,
    )


SCRIPT = launcher.BACKFILL_SCRIPT


def log_file(settings: Settings) -> Path:
    return settings.log_dir / f"{settings.app_id}.backfill.log"


def submit(settings: Settings, argv: list[str], out: Path, timeout_s: float = 6 * 3600.0) -> dict:
    """Start onceflow/entrypoints/backfill.py through `argv` (spark-submit) detached; its handle (onceflow.runtime.batch_jobs), for
    the DAG to wait on in the triggerer."""
    from onceflow.runtime import batch_jobs

    return batch_jobs.start(settings, "backfill", argv, out, log_file(settings), timeout_s).as_dict()


def submitted(settings: Settings, argv: list[str], out: Path, timeout_s: float = 6 * 3600.0) -> dict:
    """Run onceflow/entrypoints/backfill.py through `argv` (spark-submit) here, relaying its progress, and read its report back."""
    from onceflow.runtime import batch_jobs

    return batch_jobs.run(settings, "backfill", argv, out, log_file(settings), timeout_s)
