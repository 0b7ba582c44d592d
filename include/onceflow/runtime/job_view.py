"""What `onceflow job status` reports of one app on this machine: its processes, its driver's last status and why
supervision ended, as one typed record (onceflow.runtime.jobctl.status builds it from the run files). Health, the
deploy steps, the console and the CLI read its fields; `as_dict()` is its JSON (the CLI's `--json`, the console)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from onceflow import wire
from onceflow.runtime.run_files import Exited


@dataclass(frozen=True)
class StandbyView:
    """A warm standby driver: its launch pid and whether its session is up."""

    pid: int
    ready: bool
    ready_ms: int | None = None


@dataclass(frozen=True)
class JobView:
    app: str
    running: bool  # a job process of this app runs here
    # JobState while it runs; stopped, or "<last state> (not running)", when it does not
    state: str
    supervisor_pid: int | None
    job_pid: int | None
    host: str | None  # where the driver runs (its own status; None until the new driver wrote it)
    restarts: int | None
    desired_state: wire.Intent | None  # what the operator asked for last
    started_ms: int | None  # this launch's start (the driver's, once it wrote its status)
    last_batch: int | None
    last_commit_ms: int | None
    last_commit_age_s: float | None
    committed_batches: int | None
    replays_skipped: int | None
    close_out_batches: int
    idle_collections: int
    running_batch: int | None
    batch_started_ms: int | None  # the running batch's start, this launch's only
    watermark_ms: int | None
    end_offsets: dict[str, int] | None  # of the source, after the last committed batch (onceflow.rules.sources' keys)
    last_txn_ms: float | None
    last_timings: dict[str, Any] | None
    progress: dict[str, Any] | None  # Spark's last progress report
    error: str | None
    # why the job is not running: the supervisor's exit record, or one made of the driver's last status (ts_ms 0)
    last_exit: Exited | None
    standby: StandbyView | None
    checkpoint: str
    bootstrap_servers: str
    transactional_id: str
    status_file: str
    log: str

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON values, the keys the CLI's `job status --json` has always printed."""
        return json.loads(json.dumps(asdict(self), default=str))
