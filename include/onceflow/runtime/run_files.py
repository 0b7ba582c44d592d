"""The job's files under `run/`, each a typed record with one writer and one reader: what its driver reports (the
status file), what the operator asked for last (the desired state), why supervision ended (the exit record), and a
warm standby's word (ready, go). JSON, replaced atomically: a reader sees the old file or the new one, never half,
and a missing or unreadable file reads as None. Pid files are onceflow.runtime.procs'."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Self

from onceflow import wire


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomically replace `path` with `data` as JSON (a temporary file of this process, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, default=str, indent=1, sort_keys=True))
    tmp.replace(path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class _Record:
    """A run file's record: written whole, read back field by field (keys it does not know are ignored, so a file
    written by a newer or older onceflow still reads)."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Self:
        known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in d.items() if k in known})

    @classmethod
    def read(cls, path: Path) -> Self | None:
        d = read_json(path)
        if d is None:
            return None
        try:
            return cls.from_dict(d)
        except (TypeError, ValueError):  # a file of another shape: as good as none
            return None

    def as_json(self) -> dict[str, Any]:
        """The record as its file holds it: plain JSON values (a trigger's event payload, an XCom)."""
        return json.loads(json.dumps(asdict(self), default=str))  # type: ignore[call-overload]

    def write(self, path: Path) -> None:
        write_json(path, self.as_json())


@dataclass(frozen=True)
class JobStatus(_Record):
    """The driver's status file (`Settings.status_file`), rewritten on every change by the driver alone; read by
    `onceflow job status`, the supervisor, health and deploy."""

    app: str
    pid: int
    started_ms: int
    state: wire.JobState = wire.JobState.STARTING
    host: str = ""
    checkpoint: str = ""
    bootstrap_servers: str = ""
    transactional_id: str = ""
    group_id: str = ""
    committed_batches: int = 0
    replays_skipped: int = 0
    close_out_batches: int = 0
    idle_collections: int = 0  # full collections of the driver's heap between batches (Settings.gc_while_idle_at)
    # once the query runs
    query_id: str | None = None
    run_id: str | None = None
    spark_version: str | None = None
    epoch: int | None = None
    job_config_hash: str | None = None
    # the batch under way, and the last one finished
    running_batch: int | None = None
    batch_started_ms: int | None = None
    last_batch: int | None = None
    spark_batch: int | None = None
    last_commit_ms: int | None = None
    # the last batch written (a replay or a catch-up leaves them as they were)
    last_txn_ms: float | None = None
    last_outputs: int | None = None
    last_dlq: int | None = None
    watermark_ms: int | None = None
    # by partition, or `topic:partition` for several source topics (onceflow.rules.sources)
    end_offsets: dict[str, int] | None = None
    last_timings: dict[str, Any] | None = None
    # Spark's progress reports
    progress: dict[str, Any] | None = None
    last_progress_ms: int | None = None
    last_idle_ms: int | None = None
    # how it ended
    stopped_ms: int | None = None
    error: str | None = None
    exit_code: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", wire.JobState(self.state))
        if self.end_offsets is not None:
            object.__setattr__(self, "end_offsets", {str(p): int(o) for p, o in self.end_offsets.items()})

    def updated(self, **changes: Any) -> JobStatus:
        """This status with `changes` (a field it does not have is a TypeError: no key is written by mistake)."""
        return replace(self, **changes)


@dataclass(frozen=True)
class Desired(_Record):
    """What the operator asked for last (`onceflow job start|stop`, the deploy DAG): the health check restarts only
    a job meant to run."""

    state: wire.Intent
    ts_ms: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", wire.Intent(self.state))


@dataclass(frozen=True)
class Exited(_Record):
    """Why supervision ended: health pages instead of restarting what a restart cannot fix."""

    exit_code: int
    reason: str
    ts_ms: int = 0


@dataclass(frozen=True)
class StandbyReady(_Record):
    """A warm standby's session is up: its launch's process group and its driver's pid."""

    pgid: int
    pid: int
    ready_ms: int


@dataclass(frozen=True)
class StandbyGo(_Record):
    """The supervisor's word to the standby launched as process group `pgid`: take over."""

    pgid: int
    ts_ms: int
