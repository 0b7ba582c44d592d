"""What a savepoint is, as pure rules: which checkpoint files belong to a cut at batch N, whether a state store
can be recovered from a file set, the manifest, compatibility, and the restore decision. No I/O here; the
copying and the Kafka reads are in onceflow.operations.savepoints.

A savepoint at Spark batch N holds `metadata`, `sources/`, `offsets/` and `commits/` up to N, and the state store
files up to version N+1 (batch N commits state version N+1). Restoring it behind the sink (the sink committed
ledger batches after it) is exact because the restored job re-reads the committed range in ONE catch-up batch
that writes nothing (onceflow.rules.ledger.Decision.CATCH_UP); see `plan_restore` and docs/savepoints.md.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from onceflow.rules import json_records, sources
from onceflow.rules.checkpoint import Epoch
from onceflow.rules.ledger import Committed, LedgerEntry, RestoreRecord
from onceflow.rules.sources import SourcePartition
from onceflow.wire import OnceflowError

MANIFEST = "_manifest.json"
DATA_DIR = "checkpoint"
FORMAT = 1

# offsets/N, commits/N and their Hadoop checksum files .N.crc
_LOG_FILE = re.compile(r"^\.?(\d+)(\.crc)?$")
# state store files: HDFS provider <v>.delta / <v>.snapshot, RocksDB <v>[_<id>].zip / <v>[_<id>].changelog
_STATE_FILE = re.compile(r"^\.?(\d+)(?:_[^.]+)?\.(delta|snapshot|zip|changelog)(\.crc)?$")
_FULL, _INCREMENT = {"snapshot", "zip"}, {"delta", "changelog"}


class SavepointError(OnceflowError):
    """A savepoint cannot be taken, verified or restored; the message says why and what to do."""


# ---------------------------------------------------------------------------- savepoint ids
# What onceflow.operations.savepoints.new_id generates: sp-<UTC YYYYMMDD>T<HHMMSS><millis>Z-b<ledger batch>. Ids come
# from operators (CLI, DAG Params, the console) and are joined to a storage path, so nothing else is accepted.
# `$(?!\n)`, not `$`: Python's `$` also matches before a trailing newline (jsonschema validates Params with
# re.search); the lookahead keeps the pattern valid ECMA regex for the Airflow UI.
_ID_BODY = r"sp-[0-9]{8}T[0-9]{9}Z-b[0-9]{1,19}"
SAVEPOINT_ID_PATTERN = rf"^{_ID_BODY}$(?!\n)"
# where a caller also accepts `latest` (the newest complete savepoint)
SAVEPOINT_REF_PATTERN = rf"^(?:latest|{_ID_BODY})$(?!\n)"
LATEST = "latest"
ID_MAX_LEN = 64  # longer than any id the pattern allows; checked first so a huge input is not echoed back
_ID_RE = re.compile(SAVEPOINT_ID_PATTERN, re.ASCII)
_ID_FORM = "sp-<YYYYMMDD>T<HHMMSSmmm>Z-b<ledger batch>, e.g. sp-20261122T010000000Z-b5 (`onceflow savepoint list`)"


class SavepointIdError(SavepointError, ValueError):
    """Not a savepoint id onceflow generates (or `latest` where that is accepted)."""


def check_id(sp_id: object, allow_latest: bool = False) -> str:
    """`sp_id` if it is a savepoint id exactly as onceflow generates them (or `latest`, if allowed); else raise
    SavepointIdError. No path separators, `..`, schemes, whitespace or control characters can get through."""
    if isinstance(sp_id, str) and allow_latest and sp_id == LATEST:
        return sp_id
    if isinstance(sp_id, str) and len(sp_id) <= ID_MAX_LEN and _ID_RE.fullmatch(sp_id):
        return sp_id
    shown = repr(sp_id) if not isinstance(sp_id, str) or len(sp_id) <= ID_MAX_LEN else f"{sp_id[:ID_MAX_LEN]!r}..."
    raise SavepointIdError(
        f"invalid savepoint id {shown}: a savepoint id is {_ID_FORM}" + (", or 'latest'" if allow_latest else "")
    )


def _norm_uri(uri: str) -> str:
    scheme, sep, path = uri.partition("://") if "://" in uri else ("", "", uri)
    return f"{scheme}{sep}{posixpath.normpath(path) if path else ''}"


def savepoint_uri(root: str, sp_id: str) -> str:
    """The URI of savepoint `sp_id` under the savepoints root `root`, after checking the id; and (whatever the
    pattern allows) only if it normalises to a direct child of the root."""
    sp_id = check_id(sp_id)
    root = root.rstrip("/")
    uri = f"{root}/{sp_id}"
    parent, _, name = _norm_uri(uri).rpartition("/")
    if name != sp_id or parent != _norm_uri(root):
        raise SavepointIdError(f"savepoint id {sp_id!r} does not name a directory directly under {root}")
    return uri


# ---------------------------------------------------------------------------- which files
def in_cut(rel: str, batch: int) -> bool:
    """Does checkpoint file `rel` (relative, '/'-separated) belong to a savepoint at Spark batch `batch`?"""
    parts = rel.split("/")
    name = parts[-1]
    if name.endswith(".tmp") or any(p.startswith("_temporary") for p in parts):
        return False  # Hadoop's in-flight files: renamed into place when complete
    if parts[0] in ("offsets", "commits") and len(parts) == 2:
        m = _LOG_FILE.match(name)
        return m is not None and int(m.group(1)) <= batch
    if parts[0] == "state":
        m = _STATE_FILE.match(name)
        if m:
            return int(m.group(1)) <= batch + 1
    return True


def log_batches(files: Iterable[str], log: str) -> list[int]:
    """The batch ids present in `offsets/` or `commits/`."""
    out = []
    for rel in files:
        parts = rel.split("/")
        if len(parts) == 2 and parts[0] == log and parts[1].isdigit():
            out.append(int(parts[1]))
    return sorted(out)


def state_problems(files: Iterable[str], version: int, partitions: int) -> list[str]:
    """Can every state store partition be loaded at `version` from these files? For each operator directory
    `state/<op>`, every partition 0..partitions-1 needs its newest full copy (snapshot / zip) at or below the
    version and every increment (delta / changelog) after it, up to the version."""
    by_part: dict[tuple[str, str], dict[int, set[str]]] = {}
    for rel in files:
        parts = rel.split("/")
        if len(parts) != 4 or parts[0] != "state" or not parts[2].isdigit() or parts[3].startswith("."):
            continue
        m = _STATE_FILE.match(parts[3])
        if m:
            by_part.setdefault((parts[1], parts[2]), {}).setdefault(int(m.group(1)), set()).add(m.group(2))
    ops = sorted({op for rel in files for op in [_state_op(rel)] if op is not None})
    problems = []
    for op in ops:
        for part in range(partitions):
            have = by_part.get((op, str(part)), {})
            if version == 0:
                continue
            full = max((v for v, kinds in have.items() if v <= version and kinds & _FULL), default=0)
            missing = [v for v in range(full + 1, version + 1) if not have.get(v, set()) & _INCREMENT]
            if missing:
                problems.append(
                    f"state/{op}/{part}: no increment for state version(s) {_ranges(missing)} "
                    f"(needed to load version {version} from "
                    f"{'the snapshot of version ' + str(full) if full else 'the beginning'})"
                )
    return problems


def _state_op(rel: str) -> str | None:
    parts = rel.split("/")
    return parts[1] if len(parts) >= 3 and parts[0] == "state" and parts[1].isdigit() else None


def _ranges(vs: Sequence[int]) -> str:
    out, start, prev = [], vs[0], vs[0]
    for v in list(vs[1:]) + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        out.append(f"{start}" if start == prev else f"{start}..{prev}")
        if v is not None:
            start = prev = v
    return ", ".join(out)


def cut_problems(files: Iterable[str], batch: int, partitions: int) -> list[str]:
    """Is this file set a self-contained checkpoint at Spark batch `batch`?"""
    files = set(files)
    problems = [f"{rel} is missing" for rel in ("metadata", f"offsets/{batch}", f"commits/{batch}") if rel not in files]
    later = [b for b in log_batches(files, "offsets") + log_batches(files, "commits") if b > batch]
    if later:
        problems.append(f"batches after {batch} are present ({sorted(set(later))})")
    return problems + state_problems(files, batch + 1, partitions)


# ---------------------------------------------------------------------------- the manifest
@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    sha256: str


# a manifest's fields keyed by source partition, written beside its `source_topic` (onceflow.rules.sources)
POSITION_FIELDS = ("end_offsets", "group_offsets", "group_metadata")


@dataclass(frozen=True)
class Manifest:
    id: str
    app: str
    created_ms: int
    mode: str  # "running" (taken while the job ran) or "stop" (stop-with-savepoint)
    checkpoint: str  # where it was copied from
    spark_batch: int
    ledger_batch: int
    epoch: int
    end_offsets: dict[SourcePartition, int]  # the source end offsets of the batch (from offsets/N)
    watermark_ms: int
    batch_ts_ms: int
    group_offsets: dict[SourcePartition, int]  # the group's committed offsets when it was taken
    group_metadata: dict[SourcePartition, str]
    ledger_entry: dict[str, Any]  # the ledger record of ledger_batch, as committed
    spark_version: str
    state_store_provider: str
    shuffle_partitions: int
    job_config_hash: str
    files: tuple[FileEntry, ...]
    total_size: int
    format: int = FORMAT

    def to_json(self) -> str:
        d = asdict(self)
        for k in POSITION_FIELDS:
            d[k] = sources.keyed_to_json(getattr(self, k), lambda v: v)
        # the topic(s) the positions are on (onceflow.rules.sources); a manifest of before has the ledger record's
        d["source_topic"] = sources.topic_field(self.end_offsets)
        return json.dumps(d, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        d = json.loads(text)
        if d.get("format") != FORMAT:
            raise SavepointError(
                f"unknown savepoint manifest format {d.get('format')!r} (this onceflow reads format {FORMAT})"
            )
        topic = d.get("source_topic") or (d.get("ledger_entry") or {}).get("topic")
        try:
            keyed = {k: sources.keyed_from_json(d.get(k) or {}, topic) for k in POSITION_FIELDS}
        except sources.BadPositions as e:
            raise SavepointError(f"savepoint manifest: {e}") from None
        m = json_records.from_json(cls, d | dict.fromkeys(POSITION_FIELDS, {}))
        return dataclasses.replace(
            m,
            end_offsets=keyed["end_offsets"],
            group_offsets=keyed["group_offsets"],
            group_metadata=keyed["group_metadata"],
        )


def file_problems(manifest: Manifest, found: Mapping[str, tuple[int, str | None]]) -> list[str]:
    """Compare the files found (path -> (size, sha256 or None when unreadable)) with the manifest."""
    problems = []
    for f in manifest.files:
        got = found.get(f.path)
        if got is None:
            problems.append(f"{f.path} is missing")
        elif got[0] != f.size:
            problems.append(f"{f.path} has {got[0]} bytes, the manifest says {f.size}")
        elif got[1] != f.sha256:
            problems.append(f"{f.path} is corrupt (sha256 {str(got[1])[:12]}..., the manifest says {f.sha256[:12]}...)")
    extra = sorted(set(found) - {f.path for f in manifest.files})
    if extra:
        problems.append(f"files not in the manifest: {extra[:5]}{' ...' if len(extra) > 5 else ''}")
    return problems


# ---------------------------------------------------------------------------- compatibility
@dataclass(frozen=True)
class Runtime:
    """What the job would run with now."""

    app: str
    spark_version: str
    state_store_provider: str
    job_config_hash: str
    shuffle_partitions: int
    max_event_ahead_ms: int | None = None  # the skew rule the job would classify records with
    rules_version: int | None = None  # the parse rules' version the job would classify records with


def incompatibilities(m: Manifest, rt: Runtime) -> list[str]:
    out = []
    if m.app != rt.app:
        out.append(f"it belongs to app {m.app!r}, not {rt.app!r}")
    if m.spark_version != rt.spark_version:
        out.append(
            f"it was taken with Spark {m.spark_version} and this is Spark {rt.spark_version}: Spark "
            f"does not promise that state written by one version loads in another"
        )
    if m.state_store_provider != rt.state_store_provider:
        out.append(
            f"its state store provider is {m.state_store_provider.rsplit('.', 1)[-1]}, the job is "
            f"configured with {rt.state_store_provider.rsplit('.', 1)[-1]} "
            f"(ONCEFLOW_STATE_STORE_PROVIDER): state files of one cannot be read by the other"
        )
    if m.job_config_hash != rt.job_config_hash:
        out.append(
            f"the query changed incompatibly since it was taken (job config hash {m.job_config_hash} "
            f"!= {rt.job_config_hash}: topics, window or watermark differ); its state means something "
            f"else now"
        )
    return out


# ---------------------------------------------------------------------------- restore
_NOT_THEIR_STATE = "the rebuilt state would not be the one their results came from."


def _differs(recorded: frozenset[int | None], now: int | None) -> list[int]:
    """The values batches recorded (those that recorded one), when they are not all the job's value now."""
    known = {v for v in recorded if v is not None}
    return sorted(known) if now is not None and known and known != {now} else []


@dataclass(frozen=True)
class RestoreFacts:
    """What the world looks like when a restore is asked for (read by onceflow.operations.savepoints)."""

    committed: Committed
    ledger_at_savepoint: LedgerEntry | None  # the ledger's record of the savepoint's batch, now
    ledger_at_sink: LedgerEntry | None  # the ledger's record of the group's committed batch
    newer: tuple[str, ...]  # ids of valid savepoints taken after this one
    source_low: dict[SourcePartition, int]  # the earliest offset still in the source, per source partition
    last_epoch: int
    now_ms: int
    # the skew rules batches after the savepoint were classified with
    catch_up_skews: frozenset[int | None] = frozenset()
    # ... and the parse rules' versions
    catch_up_rules: frozenset[int | None] = frozenset()


@dataclass(frozen=True)
class CatchUp:
    spark_batch: int
    ledger_from: int
    ledger_to: int
    start: dict[SourcePartition, int]
    end: dict[SourcePartition, int]
    watermark_ms: int
    batch_ts_ms: int

    @property
    def records(self) -> int:
        return sum(self.end[p] - self.start.get(p, 0) for p in self.end)


@dataclass(frozen=True)
class RestorePlan:
    manifest: Manifest
    epoch: Epoch
    catch_up: CatchUp | None
    rewind: bool
    record: RestoreRecord
    notes: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        c = self.catch_up
        return {
            "savepoint": self.manifest.id,
            "savepoint_batch": self.manifest.ledger_batch,
            "spark_batch": self.manifest.spark_batch,
            "sink_batch": self.record.sink_batch,
            "rewind": self.rewind,
            "epoch": self.epoch.epoch,
            "ledger_shift": self.epoch.ledger_shift,
            "catch_up": None
            if c is None
            else {
                "spark_batch": c.spark_batch,
                "ledger_batches": [c.ledger_from, c.ledger_to],
                "records": c.records,
                "start": sources.keyed_to_json(c.start, int),
                "end": sources.keyed_to_json(c.end, int),
            },
            "notes": self.notes,
        }


def plan_restore(m: Manifest, rt: Runtime, facts: RestoreFacts, allow_rewind: bool = False) -> RestorePlan:
    """Decide whether savepoint `m` may be restored now and how, or raise SavepointError saying why not.

    - The sink stands at the savepoint's batch: Spark continues with the next batch, nothing to skip.
    - The sink is ahead (it committed ledger batches K+1..M after the savepoint at K): Spark's next batch reads
      [end(K), end(M)) in one go with the watermark of M. Its results are in the sink already, so it writes
      nothing; it rebuilds the state of the windows still open at M exactly (any window that closed by M was
      emitted by M; rows of windows still open were never late). Spark batch S+1 is ledger batch M from then
      on. The range must still be in the source topic.
    - Restoring a savepoint older than the newest one is a rewind: refused unless `allow_rewind`; done the same
      way, and recorded as such. Committed results are never written twice nor withdrawn.
    """
    problems = incompatibilities(m, rt)
    if problems:
        raise SavepointError(f"savepoint {m.id} cannot be restored: " + "; ".join(problems))
    c = facts.committed
    if c.foreign:
        raise SavepointError(f"the group {rt.app} has committed offsets onceflow did not write; refusing to restore")
    if c.batch is None:
        raise SavepointError(
            f"savepoint {m.id} is at ledger batch {m.ledger_batch} but the sink has no committed batch of app "
            f"{m.app}: the savepoint belongs to another history (other topics or a reset group)"
        )
    if c.batch < m.ledger_batch:
        raise SavepointError(
            f"savepoint {m.id} is at ledger batch {m.ledger_batch} but the sink has only committed batch "
            f"{c.batch}: the sink is behind the savepoint (was the group or ledger reset?)"
        )
    got = facts.ledger_at_savepoint
    want = LedgerEntry.from_json(json.dumps(m.ledger_entry))
    if got is None or got.ranges != want.ranges:
        raise SavepointError(
            f"the ledger's batch {m.ledger_batch} is {got.ranges if got else 'missing'} but savepoint {m.id} "
            f"recorded {want.ranges}: the savepoint belongs to another history"
        )
    rewind = bool(facts.newer)
    if rewind and not allow_rewind:
        raise SavepointError(
            f"savepoint {m.id} (ledger batch {m.ledger_batch}) is older than the newest savepoint "
            f"{facts.newer[-1]}: restoring it is a rewind. The job would rebuild its state from batch "
            f"{m.ledger_batch} and skip the committed batches {m.ledger_batch + 1}..{c.batch} (their results stay "
            f"as committed; nothing is recomputed into the sink). Ask for it explicitly with --allow-rewind "
            f"(DAG param allow_rewind)."
        )
    shift_old = m.ledger_batch - m.spark_batch
    nxt = m.spark_batch + 1
    epoch_no = max(facts.last_epoch, m.epoch) + 1
    notes: list[str] = []
    if c.batch == m.ledger_batch:
        if c.offsets != m.end_offsets:
            raise SavepointError(
                f"the sink is at batch {c.batch} like savepoint {m.id} but its committed offsets "
                f"{c.offsets} differ from the savepoint's {m.end_offsets}"
            )
        catch_up = None
        epoch = Epoch(
            epoch=epoch_no,
            ledger_shift=shift_old,
            spark_batch_from=nxt,
            savepoint_id=m.id,
            restored_ms=facts.now_ms,
            prior_shift=shift_old,
        )
        skipped: dict[SourcePartition, tuple[int, int]] = {}
        notes.append("the sink stands at the savepoint: the job continues with the next batch")
    else:
        sink = facts.ledger_at_sink
        if sink is None or sink.end != c.offsets:
            raise SavepointError(
                f"the group committed batch {c.batch} at {c.offsets} but the ledger's record of "
                f"it is {sink.ranges if sink else 'missing'}: the sink is inconsistent; run "
                f"`onceflow audit`"
            )
        start = {p: m.end_offsets.get(p, 0) for p in c.offsets}
        back = {p: (start[p], c.offsets[p]) for p in c.offsets if c.offsets[p] < start[p]}
        if back:
            raise SavepointError(f"the sink's offsets are behind the savepoint's on some partitions {back}")
        gone = {
            p: (start[p], facts.source_low[p])
            for p in start
            if start[p] < c.offsets[p] and facts.source_low.get(p, 0) > start[p]
        }
        if gone:
            raise SavepointError(
                f"restoring {m.id} needs to re-read the source from its end offsets, but retention has already "
                f"deleted part of that range (partition: (needed from, earliest left) {gone}); restore a newer "
                f"savepoint"
            )
        # The catch-up rebuilds state from committed batches with the job's classification now: the skew limit
        # and the parse rules each batch recorded must be the job's, or the state is not the one their results
        # came from.
        batches = f"the committed batches {m.ledger_batch + 1}..{c.batch}"
        skews = _differs(facts.catch_up_skews, rt.max_event_ahead_ms)
        if skews and rt.max_event_ahead_ms is not None:
            raise SavepointError(
                f"{batches} were classified with an event-time skew limit of {sorted(x // 1000 for x in skews)} s, "
                f"and the job would rebuild their state with {rt.max_event_ahead_ms // 1000} s "
                f"(ONCEFLOW_MAX_EVENT_AHEAD_S): {_NOT_THEIR_STATE} Restore with the setting those batches used; "
                f"change it afterwards (an upgrade applies it to new batches only)"
            )
        versions = _differs(facts.catch_up_rules, rt.rules_version)
        if versions:
            raise SavepointError(
                f"{batches} were classified with parse rules version {versions}, and this code classifies with "
                f"version {rt.rules_version}: {_NOT_THEIR_STATE} Restore with the code those batches ran (the "
                f"version that wrote them), then upgrade"
            )
        catch_up = CatchUp(
            spark_batch=nxt,
            ledger_from=m.ledger_batch + 1,
            ledger_to=c.batch,
            start=start,
            end=dict(c.offsets),
            watermark_ms=sink.watermark_ms,
            batch_ts_ms=sink.batch_ts_ms,
        )
        epoch = Epoch(
            epoch=epoch_no,
            ledger_shift=c.batch - nxt,
            spark_batch_from=nxt,
            catch_up_spark_batch=nxt,
            catch_up_from=m.ledger_batch + 1,
            savepoint_id=m.id,
            restored_ms=facts.now_ms,
            prior_shift=shift_old,
        )
        skipped = {p: (start[p], c.offsets[p]) for p in sorted(start)}
        notes.append(
            f"the sink is {c.batch - m.ledger_batch} batch(es) ahead: Spark batch {nxt} re-reads "
            f"{catch_up.records} records of ledger batches {m.ledger_batch + 1}..{c.batch} to rebuild "
            f"its state and writes nothing; Spark batch {nxt + 1} is ledger batch {c.batch + 1}"
        )
    record = RestoreRecord(
        app=m.app,
        epoch=epoch_no,
        savepoint_id=m.id,
        savepoint_batch=m.ledger_batch,
        sink_batch=c.batch,
        rewind=rewind,
        skipped_batches=(m.ledger_batch + 1, c.batch) if catch_up else None,
        skipped=skipped,
        spark_batch_from=nxt,
        ledger_shift=epoch.ledger_shift,
        restored_ms=facts.now_ms,
    )
    return RestorePlan(m, epoch, catch_up, rewind, record, notes)
