"""Checkpoint and savepoint rotation (what `ip_count_checkpoint_rotation` runs, and `onceflow savepoint rotate`).

Three steps, each usable alone: take a savepoint and verify it (a stopped job's checkpoint is saved as it is);
apply the retention rules (onceflow.rules.retention) to savepoints and to checkpoints a restore moved aside; report the
checkpoint's size, file count, oldest retained batch and growth since the previous report. Alerts: a savepoint
that fails or does not verify (critical), a checkpoint above `ONCEFLOW_CHECKPOINT_SIZE_ALERT_BYTES` (warning);
each resolves by itself when a later run is fine.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import Any

from onceflow.config import Settings
from onceflow.control import alerts
from onceflow.kafka import events as ev
from onceflow.operations import savepoints
from onceflow.rules import clock, json_records
from onceflow.rules.savepoints import SavepointError
from onceflow.storage.store import Store

log = logging.getLogger(__name__)
STATS_FILE = "_rotation.json"


class Action(StrEnum):
    """The rotation DAG's `action` parameter."""

    ROTATE = "rotate"  # savepoint + verify + retention + report
    VERIFY = "verify"  # one savepoint


class Result(StrEnum):
    """A savepoint step's `status`."""

    OK = "ok"
    SKIPPED = "skipped"  # nothing committed yet to save
    FAILED = "failed"  # taken or verified wrong: alerted, and the run fails after its report


@dataclass(frozen=True)
class SavepointStep:
    """The savepoint step's result: a savepoint taken and verified by a rotation (or skipped, or failed), or one
    savepoint verified (`action` verify: its verification's fields in `verification`)."""

    status: Result
    action: Action = Action.ROTATE
    id: str | None = None
    batch: int | None = None
    mode: str | None = None
    size_bytes: int | None = None
    files: int | None = None
    compatible: bool | None = None
    incompatibilities: tuple[str, ...] = ()
    why: str | None = None  # skipped: why
    error: str | None = None  # failed: what
    verification: dict[str, Any] | None = None
    alerts: tuple[str, ...] = ()

    @property
    def failed(self) -> bool:
        return self.status == Result.FAILED

    def as_dict(self) -> dict[str, Any]:
        """JSON (a DAG task's XCom); `from_dict` reads it back in the next task."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SavepointStep:
        return json_records.from_json(cls, d)


@dataclass(frozen=True)
class Retained:
    """The retention step's result: the savepoints kept and deleted (with why), the replaced checkpoints deleted."""

    kept: tuple[str, ...]
    deleted: tuple[dict[str, str], ...]
    replaced_checkpoints_deleted: tuple[str, ...]
    keep: int
    max_age_s: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _raise(sink: alerts.AlertSink | None, conditions: list, prefix: str) -> list[str]:
    if sink is None:
        return []
    return [f"{a.key}:{a.status}" for a in sink.raise_and_resolve(conditions, source="rotation", scope_prefix=prefix)]


def verify_savepoint(settings: Settings, sp_id: str | None) -> SavepointStep:
    """Verify one savepoint (its verdict is kept beside it); a damaged one is reported "failed" like a failed
    savepoint, so the run fails after its report."""
    if not sp_id:
        raise SavepointError("action=verify needs savepoint_id (`onceflow savepoint list` shows the ids)")
    # by the id asked for (or "latest"), never by the id a manifest claims: verify checks the two agree
    v = savepoints.verify(settings, sp_id)
    out = SavepointStep(
        Result.OK if v.ok else Result.FAILED,
        Action.VERIFY,
        id=v.id,
        compatible=v.compatible,
        incompatibilities=tuple(v.incompatibilities),
        verification=v.as_dict(),
    )
    return out if v.ok else replace(out, error=f"savepoint {v.id} did not verify: {'; '.join(v.problems)}")


def take_savepoint(settings: Settings, sink: alerts.AlertSink | None = None) -> SavepointStep:
    """Create and verify a savepoint; a failure is alerted and reported (status "failed"), not raised."""
    key = f"rotation:{settings.app_id}:savepoint_failed"
    conditions = []
    if savepoints.checkpoint_stats(settings)["latest_committed_batch"] is None:
        out = SavepointStep(Result.SKIPPED, why="the checkpoint has no committed batch yet")
    else:
        try:
            m = savepoints.create(settings, bus=ev.EventBus(settings))
            v = savepoints.verify(settings, m.id)
            if not v.ok:
                savepoints.delete(settings, m.id)
                raise SavepointError(f"savepoint {m.id} did not verify: {'; '.join(v.problems)}")
            out = SavepointStep(
                Result.OK,
                id=m.id,
                batch=m.ledger_batch,
                mode=m.mode,
                size_bytes=m.total_size,
                files=len(m.files),
                compatible=v.compatible,
                incompatibilities=tuple(v.incompatibilities),
            )
        except Exception as e:  # reported and alerted; the DAG task fails on it
            log.error("savepoint failed: %s", e)
            out = SavepointStep(Result.FAILED, error=str(e))
            conditions.append(
                alerts.Condition(
                    key,
                    alerts.Severity.CRITICAL,
                    f"taking a savepoint failed: {e}",
                    "read the rotation task's log; until a savepoint succeeds, the newest restore point ages",
                    {"error": str(e)[:2000]},
                )
            )
    return replace(out, alerts=tuple(_raise(sink, conditions, key)))


def apply_retention(settings: Settings, now_ms: int | None = None) -> Retained:
    now_ms = now_ms or clock.now_ms()
    plan = savepoints.prune(settings, now_ms)
    return Retained(
        kept=tuple(plan.keep),
        deleted=tuple({"id": i, "why": w} for i, w in plan.delete),
        replaced_checkpoints_deleted=tuple(savepoints.prune_replaced(settings, now_ms)),
        keep=settings.savepoint_keep,
        max_age_s=settings.savepoint_max_age_s,
    )


def report_checkpoint(settings: Settings, sink: alerts.AlertSink | None = None, now_ms: int | None = None) -> dict:
    now_ms = now_ms or clock.now_ms()
    key = f"rotation:{settings.app_id}:checkpoint_size"
    stats = savepoints.checkpoint_stats(settings)
    store = Store(settings.savepoints)
    try:
        prev = json.loads(store.read(STATS_FILE))
    except (OSError, ValueError):
        prev = None
    stats["growth_bytes"] = stats["size_bytes"] - prev["size_bytes"] if prev else None
    stats["growth_files"] = stats["files"] - prev["files"] if prev else None
    stats["previous_report_ms"] = prev.get("ts_ms") if prev else None
    try:
        store.write_atomic(STATS_FILE, json.dumps(stats | {"ts_ms": now_ms}).encode())
    except OSError as e:  # the report still stands; only the next growth figure is lost
        log.warning("cannot record the checkpoint report under %s: %s", settings.savepoints, e)
    conditions = []
    if stats["size_bytes"] > settings.checkpoint_size_alert_bytes:
        conditions.append(
            alerts.Condition(
                key,
                alerts.Severity.WARNING,
                f"the checkpoint holds {stats['size_bytes']} bytes in {stats['files']} files, above "
                f"{settings.checkpoint_size_alert_bytes} (growth since the last report: {stats['growth_bytes']})",
                "check ONCEFLOW_MIN_BATCHES_TO_RETAIN and the state size (open windows x IPs); raise "
                "ONCEFLOW_CHECKPOINT_SIZE_ALERT_BYTES if the growth is expected",
                {k: stats[k] for k in ("size_bytes", "files", "growth_bytes", "oldest_batch")},
            )
        )
    stats["alerts"] = _raise(sink, conditions, key)
    return stats


@dataclass(frozen=True)
class Rotation:
    """`onceflow savepoint rotate`: the three steps of one rotation."""

    app: str
    savepoint: SavepointStep
    retention: Retained
    checkpoint: dict[str, Any]  # report_checkpoint's figures

    @property
    def ok(self) -> bool:
        return not self.savepoint.failed

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"ok": self.ok}


def rotate(settings: Settings, sink: alerts.AlertSink | None = None) -> Rotation:
    return Rotation(
        app=settings.app_id,
        savepoint=take_savepoint(settings, sink),
        retention=apply_retention(settings),
        checkpoint=report_checkpoint(settings, sink),
    )
