"""Savepoints of the streaming job: create (while it runs, or stop-with-savepoint), list, verify, restore, delete,
prune, and the checkpoint's own size report.

Files go through fsspec, so the checkpoint and the savepoints can live on any Hadoop-compatible store (file://,
hdfs://, s3://, ...) with configuration only. Layout of one savepoint:

    <ONCEFLOW_SAVEPOINT_URI>/sp-<UTC time>-b<ledger batch>/checkpoint/...   the copied checkpoint files
    <ONCEFLOW_SAVEPOINT_URI>/sp-<UTC time>-b<ledger batch>/_manifest.json   written last: the savepoint exists

What may be copied and restored, and how a restore stays exact, is decided in onceflow.rules.savepoints.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from onceflow import wire
from onceflow.config import Settings
from onceflow.kafka import clients as kafka_clients
from onceflow.kafka import events as ev
from onceflow.kafka import reading as kafka_reading
from onceflow.protocol import ledger_reader, ledger_writes, sinks
from onceflow.rules import clock, retention
from onceflow.rules.checkpoint import (
    EPOCH_FILE,
    QUARANTINE_FILE,
    Epoch,
    parse_offsets_file,
    render_offsets_file,
    render_quarantine,
)
from onceflow.rules.ledger import Committed, RestoreRecord
from onceflow.rules.savepoints import (
    DATA_DIR,
    MANIFEST,
    FileEntry,
    Manifest,
    RestoreFacts,
    RestorePlan,
    Runtime,
    SavepointError,
    SavepointIdError,
    check_id,
    cut_problems,
    file_problems,
    in_cut,
    incompatibilities,
    log_batches,
    plan_restore,
    savepoint_uri,
)
from onceflow.rules.sources import SourcePartition
from onceflow.runtime import jobctl
from onceflow.storage.store import Store

log = logging.getLogger(__name__)
VERIFICATION = "_verification.json"  # beside the manifest: the last verification's verdict


# ---------------------------------------------------------------------------- files
def _savepoint(settings: Settings, sp_id: str) -> Store:
    """The directory of savepoint `sp_id`: the id is checked (check_id) before it is joined to any path, and the
    joined location must be a direct child of the savepoints root, also as fsspec resolves it."""
    sp = Store(savepoint_uri(settings.savepoints, sp_id))
    root = Store(settings.savepoints)
    parent, _, name = sp.root.rpartition("/")
    if name != sp_id or parent != root.root:
        raise SavepointIdError(
            f"savepoint {sp_id!r} does not resolve to a directory directly under {settings.savepoints}"
        )
    return sp


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def new_id(ledger_batch: int, now_ms: int) -> str:
    t = datetime.fromtimestamp(now_ms / 1000, tz=UTC)
    return f"sp-{t:%Y%m%dT%H%M%S}{now_ms % 1000:03d}Z-b{ledger_batch}"


def created_ms_of(sp_id: str) -> int:
    """The creation time is in the id, so an incomplete savepoint (no manifest) still has an age."""
    try:
        stamp = sp_id.split("-")[1]
        t = datetime.strptime(stamp[:15], "%Y%m%dT%H%M%S").replace(tzinfo=UTC)
        return int(t.timestamp() * 1000) + int(stamp[15:18])
    except (IndexError, ValueError):
        return 0


def runtime(settings: Settings) -> Runtime:
    import pyspark

    return Runtime(
        app=settings.app_id,
        spark_version=pyspark.__version__,
        state_store_provider=settings.state_store_provider,
        job_config_hash=settings.job_config_hash(),
        shuffle_partitions=settings.shuffle_partitions,
        max_event_ahead_ms=settings.max_event_ahead_ms,
        rules_version=settings.declared_app().rules_version,
    )


# ---------------------------------------------------------------------------- Kafka facts
def _sink_position(settings: Settings, partitions) -> tuple[Committed, dict[SourcePartition, str]]:
    """Where the sink stands: the job's group (its offsets and their metadata), or, for a table sink, the ledger
    table's newest row (its group is a cache written after each commit, a batch behind after a crash between)."""
    if settings.sink_kind == "postgres":
        from onceflow.operations import audit

        return audit.consumed_position(settings, partitions), {}
    items = kafka_reading.group_offsets(settings, partitions)
    return Committed.from_partitions(items), {p: m for p, off, m in items if off is not None}


def _ledger_entry(settings: Settings, batch: int | None, wait_s: float = 15.0):
    """The ledger record of a batch known to be committed (a table sink's: its ledger table's row).
    commit_transaction() returns before the coordinator has written the commit markers into every partition, so a
    Kafka record committed a moment ago may not be readable yet: look again for a little while before calling it
    missing."""
    if batch is None:
        return None
    if settings.sink_kind == "postgres":  # a committed row is visible at once
        from onceflow.database import client as database_client

        with database_client.connect(settings, "savepoints") as conn:
            return database_client.ledger_entry(conn, settings, batch)
    c = kafka_clients.read_committed_consumer(settings)
    deadline = time.monotonic() + wait_s
    try:
        while True:
            found = ledger_reader.find_entry(c, settings, batch)
            if found is not None or time.monotonic() >= deadline:
                return found
            time.sleep(0.5)
    finally:
        c.close()


def _source_low(settings: Settings, partitions) -> dict[SourcePartition, int]:
    wm = kafka_reading.source_watermarks(settings) or {}
    return {p: wm[p][0] for p in partitions if p in wm}


# ---------------------------------------------------------------------------- create
def create(settings: Settings, stop: bool = False, bus: ev.EventBus | None = None) -> Manifest:
    """Copy the checkpoint up to its latest committed batch. While the job runs, Spark keeps writing: files
    of later batches are left out by name, and the copy is checked to be self-contained before it counts.
    With `stop`, the job is first stopped at a batch boundary (stop-with-savepoint): the savepoint is then the
    job's final state."""
    if stop:
        jobctl.stop(settings)
    mode = "stop" if stop else ("running" if jobctl.status(settings).running else "stopped")
    src = Store(settings.checkpoint)
    listing = src.files()
    committed = log_batches(listing, "commits")
    if not committed:
        raise SavepointError(f"the checkpoint {settings.checkpoint} has no committed batch yet: nothing to save")
    batch = committed[-1]
    offsets_text = src.read(f"offsets/{batch}").decode()
    meta, end = parse_offsets_file(offsets_text, settings.source_topic_list)
    partitions = int(meta.get("conf", {}).get("spark.sql.shuffle.partitions", settings.shuffle_partitions))
    provider = meta.get("conf", {}).get("spark.sql.streaming.stateStore.providerClass", settings.state_store_provider)
    epoch = Epoch.from_json(src.read(EPOCH_FILE).decode()) if EPOCH_FILE in listing else Epoch()
    ledger_batch = epoch.ledger_batch(batch)
    entry = _ledger_entry(settings, ledger_batch)
    if entry is None:
        raise SavepointError(
            f"the ledger has no record of batch {ledger_batch} (Spark batch {batch}), which the "
            f"checkpoint says is committed: run `onceflow audit` before taking a savepoint"
        )
    group, group_meta = _sink_position(settings, end)

    now_ms = clock.now_ms()
    sp_id = new_id(ledger_batch, now_ms)
    dest = _savepoint(settings, sp_id)
    files: list[FileEntry] = []
    try:
        for rel in sorted(r for r in listing if in_cut(r, batch)):
            try:
                data = src.read(rel)
            except FileNotFoundError:
                continue  # removed by Spark's own cleanup while we copied: cut_problems says if it mattered
            dest.write(f"{DATA_DIR}/{rel}", data)
            files.append(FileEntry(rel, len(data), _sha256(data)))
        problems = cut_problems([f.path for f in files], batch, partitions)
        if problems:
            raise SavepointError(
                f"the copy of batch {batch} is not self-contained (the checkpoint changed while "
                f"it was copied?): {'; '.join(problems)}; try again"
            )
        import pyspark

        m = Manifest(
            id=sp_id,
            app=settings.app_id,
            created_ms=now_ms,
            mode=mode,
            checkpoint=settings.checkpoint,
            spark_batch=batch,
            ledger_batch=ledger_batch,
            epoch=epoch.epoch,
            end_offsets=end,
            watermark_ms=int(meta.get("batchWatermarkMs", 0)),
            batch_ts_ms=int(meta.get("batchTimestampMs", 0)),
            group_offsets=group.offsets,
            group_metadata=group_meta,
            ledger_entry=json.loads(entry.to_json()),
            spark_version=pyspark.__version__,
            state_store_provider=provider,
            shuffle_partitions=partitions,
            job_config_hash=settings.job_config_hash(),
            files=tuple(files),
            total_size=sum(f.size for f in files),
        )
        dest.write_atomic(MANIFEST, m.to_json().encode())
    except BaseException:
        dest.rm()
        raise
    if bus is not None:
        bus.emit(
            wire.SAVEPOINT_CREATED,
            id=sp_id,
            batch=ledger_batch,
            spark_batch=batch,
            mode=mode,
            size=m.total_size,
            files=len(files),
        )
    log.info("savepoint %s: batch %s, %d files, %d bytes", sp_id, ledger_batch, len(files), m.total_size)
    return m


# ---------------------------------------------------------------------------- list, load, verify, delete
@dataclass(frozen=True)
class Listed:
    id: str
    created_ms: int
    complete: bool
    ledger_batch: int | None = None
    spark_batch: int | None = None
    mode: str | None = None
    total_size: int | None = None
    error: str | None = None
    verified: dict[str, Any] | None = None  # the last verification's verdict and time (None: never verified)

    def info(self) -> retention.SavepointInfo:
        return retention.SavepointInfo(self.id, self.created_ms, self.complete, self.ledger_batch)


def list_all(settings: Settings) -> list[Listed]:
    """Every savepoint directory of the app, oldest first; those without a (readable) manifest as incomplete."""
    root = Store(settings.savepoints)
    out = []
    for name in root.dirs():
        try:
            check_id(name)
        except SavepointIdError:
            continue  # not a name onceflow writes: not a savepoint (and never pruned)
        try:
            m = Manifest.from_json(root.read(f"{name}/{MANIFEST}"))
            out.append(
                Listed(
                    name,
                    m.created_ms,
                    True,
                    m.ledger_batch,
                    m.spark_batch,
                    m.mode,
                    m.total_size,
                    verified=last_verification(settings, name),
                )
            )
        except FileNotFoundError:
            out.append(Listed(name, created_ms_of(name), False, error="no manifest"))
        except (ValueError, TypeError, KeyError, SavepointError) as e:
            out.append(Listed(name, created_ms_of(name), False, error=f"unreadable manifest: {e}"))
    return sorted(out, key=lambda x: (x.created_ms, x.id))


def resolve(settings: Settings, sp_id: str) -> str:
    """The id of savepoint `sp_id`, or of the newest complete one for "latest"; any other input is refused."""
    if check_id(sp_id, allow_latest=True) != "latest":
        return sp_id
    done = [x for x in list_all(settings) if x.complete]
    if not done:
        raise SavepointError(f"app {settings.app_id} has no savepoint under {settings.savepoints}")
    return max(done, key=lambda x: (x.ledger_batch, x.created_ms)).id


def load(settings: Settings, sp_id: str) -> Manifest:
    """The manifest of savepoint `sp_id` ("latest": the newest). Its own `id` is what the file says: `verify`
    checks that it names this savepoint."""
    sp_id = resolve(settings, sp_id)
    sp = _savepoint(settings, sp_id)
    if not sp.exists():
        raise SavepointError(f"no savepoint {sp_id} under {settings.savepoints} (`onceflow savepoint list`)")
    try:
        return Manifest.from_json(sp.read(MANIFEST))
    except FileNotFoundError:
        raise SavepointError(
            f"savepoint {sp_id} has no manifest: it is incomplete (being written, or its "
            f"writer crashed) and cannot be used"
        ) from None
    except (ValueError, TypeError, KeyError) as e:
        raise SavepointError(f"the manifest of savepoint {sp_id} is unreadable: {e}") from None


@dataclass(frozen=True)
class Verification:
    id: str
    ok: bool  # the files are intact and self-contained
    compatible: bool  # ... and the job as configured now can restore it
    problems: list[str]
    incompatibilities: list[str]

    def as_dict(self) -> dict:
        return {
            "id": self.id,
            "ok": self.ok,
            "compatible": self.compatible,
            "problems": self.problems,
            "incompatibilities": self.incompatibilities,
        }


def verify(settings: Settings, sp_id: str) -> Verification:
    """Every file present with its size and checksum, nothing extra, the set self-contained at its batch, and
    (separately) whether this Spark and this job configuration can restore it. The manifest must name this
    savepoint: one copied from another savepoint (or edited) describes other files, so it is damage."""
    sp_id = resolve(settings, sp_id)
    m = load(settings, sp_id)
    sp = _savepoint(settings, sp_id)
    data = Store(f"{sp.uri}/{DATA_DIR}")
    found: dict[str, tuple[int, str | None]] = {}
    for rel, size in data.files().items():
        try:
            found[rel] = (size, _sha256(data.read(rel)))
        except OSError:
            found[rel] = (size, None)
    problems = file_problems(m, found) + cut_problems(found, m.spark_batch, m.shuffle_partitions)
    if m.id != sp_id:
        shown = repr(m.id) if len(str(m.id)) <= 80 else f"{str(m.id)[:80]!r}..."
        problems.insert(
            0, f"the manifest names savepoint {shown}, not {sp_id}: it was copied from another savepoint or edited"
        )
    inc = incompatibilities(m, runtime(settings))
    v = Verification(sp_id, not problems, not problems and not inc, problems, inc)
    # the verdict, beside the savepoint (not in its data): what `list` and the console show
    record = v.as_dict() | {"ts_ms": clock.now_ms()}
    sp.write(VERIFICATION, json.dumps(record).encode())
    return v


def last_verification(settings: Settings, sp_id: str) -> dict[str, Any] | None:
    """The verdict of the savepoint's last verification (None: never verified)."""
    sp = _savepoint(settings, sp_id)
    try:
        return cast(dict[str, Any], json.loads(sp.read(VERIFICATION)))
    except (FileNotFoundError, ValueError):
        return None


def delete(settings: Settings, sp_id: str, bus: ev.EventBus | None = None) -> None:
    """Delete one savepoint directory, named by its exact id (never "latest", never anything but a direct child
    of the savepoints root)."""
    sp = _savepoint(settings, sp_id)
    if not sp.exists() or not sp.fs.isdir(sp.root):
        raise SavepointError(f"no savepoint {sp_id} under {settings.savepoints}")
    sp.rm()
    if bus is not None:
        bus.emit(wire.SAVEPOINT_DELETED, id=sp_id)


def prune(settings: Settings, now_ms: int | None = None, dry_run: bool = False) -> retention.RetentionPlan:
    now_ms = now_ms or clock.now_ms()
    plan = retention.plan(
        [x.info() for x in list_all(settings)],
        now_ms,
        settings.savepoint_keep,
        settings.savepoint_max_age_s,
        settings.savepoint_incomplete_grace_s,
    )
    if not dry_run:
        for sp_id in plan.delete_ids:
            delete(settings, sp_id)
    return plan


# ---------------------------------------------------------------------------- restore
def restore_facts(settings: Settings, m: Manifest) -> RestoreFacts:
    from onceflow.operations import audit

    committed = audit.consumed_position(settings, m.end_offsets)  # the ledger's, when the group has expired
    after = committed.batch is not None and m.ledger_batch is not None and committed.batch > m.ledger_batch
    records = audit.ledger_records(settings)  # restore and quarantine records: on the ledger topic for every sink
    catch_up = [
        e
        for e in (audit.ledger_entries(settings) if after else [])  # a table sink's: its ledger table's rows
        if committed.batch is not None and m.ledger_batch < e.batch <= committed.batch
    ]
    return RestoreFacts(
        committed=committed,
        ledger_at_savepoint=_ledger_entry(settings, m.ledger_batch),
        ledger_at_sink=_ledger_entry(settings, committed.batch),
        newer=tuple(
            x.id
            for x in list_all(settings)
            if x.complete and x.ledger_batch is not None and x.ledger_batch > m.ledger_batch
        ),
        source_low=_source_low(settings, committed.offsets or m.end_offsets),
        last_epoch=max((r.epoch for r in records if isinstance(r, RestoreRecord)), default=0),
        now_ms=clock.now_ms(),
        catch_up_skews=frozenset(e.max_event_ahead_ms for e in catch_up),
        catch_up_rules=frozenset(e.rules for e in catch_up),
    )


def check_restore(settings: Settings, sp_id: str, allow_rewind: bool = False) -> RestorePlan:
    """Everything a restore checks before it changes anything (the job may still run: the deploy DAG checks
    before it stops the job, and the restore checks again once it is stopped)."""
    sp_id = resolve(settings, sp_id)
    m = load(settings, sp_id)
    v = verify(settings, sp_id)  # also: the manifest names this savepoint, so m.id is sp_id from here on
    if not v.ok:
        raise SavepointError(f"savepoint {sp_id} is damaged and cannot be restored: {'; '.join(v.problems)}")
    return plan_restore(m, runtime(settings), restore_facts(settings, m), allow_rewind)


def restore(
    settings: Settings, sp_id: str, allow_rewind: bool = False, dry_run: bool = False, bus: ev.EventBus | None = None
) -> RestorePlan:
    """Replace the job's checkpoint with savepoint `sp_id` ("latest" for the newest), so that the next start
    continues from it exactly once. The job must be stopped. Nothing is deleted: the replaced checkpoint is
    moved next to it (`<checkpoint>.replaced-<time>`). The restore is recorded in the ledger, in a transaction
    of the app's transactional id (which also fences any driver of the app that is still alive somewhere)."""
    check_id(sp_id, allow_latest=True)  # before anything is looked at or fenced
    with jobctl.start_lock(settings):  # no start here can slip in while the checkpoint is swapped
        return _restore(settings, sp_id, allow_rewind, dry_run, bus)


def _restore(settings: Settings, sp_id: str, allow_rewind: bool, dry_run: bool, bus: ev.EventBus | None) -> RestorePlan:
    running = jobctl.still_running(settings)
    if running:
        raise SavepointError(
            f"app {settings.app_id} is running ({running}): stop it first (`onceflow job stop`, or the "
            f"deploy DAG's restore action, which stops, restores and starts)"
        )
    other = jobctl.live_elsewhere(settings)
    if other is not None:
        raise SavepointError(
            f"a driver of app {settings.app_id} committed batch {other.get('batch')} recently "
            f"from {other.get('host')} pid {other.get('pid')}: stop it before restoring"
        )
    if dry_run:
        return check_restore(settings, sp_id, allow_rewind)

    from onceflow.operations import audit

    # Fence first: a zombie driver of the app can no longer commit, so the facts read next stay true.
    writer = sinks.operator_writer(settings, "restore")
    try:
        plan = check_restore(settings, sp_id, allow_rewind)
        m = plan.manifest
        moved = _swap_in(settings, m, plan, audit.quarantined(audit.ledger_records(settings)))
        try:
            ledger_writes.commit_record(writer, settings, plan.record.to_json(), wire.LEDGER_RESTORE)
        except BaseException:
            _swap_back(settings, moved)
            raise
    finally:
        writer.close()
    if bus is not None:
        bus.emit(wire.SAVEPOINT_RESTORED, logging.WARNING, flush=True, **plan.summary(), replaced_checkpoint=moved)
    log.warning("restored savepoint %s: %s", m.id, plan.summary())
    return plan


def _swap_in(settings: Settings, m: Manifest, plan: RestorePlan, quarantine=()) -> str | None:
    """Move the current checkpoint aside and put the savepoint's copy (plus onceflow's epoch file, the
    catch-up batch's offsets file and every quarantine the ledger records) in its place."""
    src = Store(f"{_savepoint(settings, m.id).uri}/{DATA_DIR}")  # checked before the checkpoint is moved
    ckpt = Store(settings.checkpoint)
    moved = None
    if ckpt.exists():
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        moved = f"{settings.checkpoint.rstrip('/')}.replaced-{stamp}"
        ckpt.fs.mv(ckpt.root, Store(moved).root, recursive=True)
    try:
        for rel in sorted(src.files()):
            ckpt.write(rel, src.read(rel))
        ckpt.write(EPOCH_FILE, plan.epoch.to_json().encode())
        ckpt.write(QUARANTINE_FILE, render_quarantine(quarantine).encode())
        c = plan.catch_up
        if c is not None:
            template = src.read(f"offsets/{m.spark_batch}").decode()
            ckpt.write(
                f"offsets/{c.spark_batch}",
                render_offsets_file(template, c.end, c.watermark_ms, c.batch_ts_ms).encode(),
            )
    except BaseException:
        _swap_back(settings, moved)
        raise
    return moved


def _swap_back(settings: Settings, moved: str | None) -> None:
    ckpt = Store(settings.checkpoint)
    ckpt.rm()
    if moved is not None:
        ckpt.fs.mv(Store(moved).root, ckpt.root, recursive=True)


# ---------------------------------------------------------------------------- the checkpoint itself
def checkpoint_stats(settings: Settings) -> dict:
    files = Store(settings.checkpoint).files()
    offsets, commits = log_batches(files, "offsets"), log_batches(files, "commits")
    return {
        "checkpoint": settings.checkpoint,
        "size_bytes": sum(files.values()),
        "files": len(files),
        "oldest_batch": offsets[0] if offsets else None,
        "latest_planned_batch": offsets[-1] if offsets else None,
        "latest_committed_batch": commits[-1] if commits else None,
        "min_batches_to_retain": settings.min_batches_to_retain,
    }


__all__ = [
    "create",
    "list_all",
    "load",
    "verify",
    "restore",
    "delete",
    "prune",
    "checkpoint_stats",
    "SavepointError",
    "RestoreRecord",
]


def replaced_checkpoints(settings: Settings) -> list[tuple[str, int]]:
    """Checkpoints a restore moved aside: (uri, moved at ms), oldest first."""
    base = settings.checkpoint.rstrip("/")
    parent, name = base.rsplit("/", 1)
    out = []
    for d in Store(parent).dirs():
        if d.startswith(f"{name}.replaced-"):
            try:
                t = datetime.strptime(d.rsplit("-", 1)[1], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
            except ValueError:
                continue
            out.append((f"{parent}/{d}", int(t.timestamp() * 1000)))
    return sorted(out, key=lambda x: x[1])


def prune_replaced(settings: Settings, now_ms: int | None = None) -> list[str]:
    """Replaced checkpoints are kept as long as savepoints are (max age), then deleted."""
    now_ms = now_ms or clock.now_ms()
    gone = []
    for uri, moved_ms in replaced_checkpoints(settings):
        if (now_ms - moved_ms) / 1000 > settings.savepoint_max_age_s:
            Store(uri).rm()
            gone.append(uri)
    return gone
