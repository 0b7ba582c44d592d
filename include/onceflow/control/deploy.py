"""Deploying the streaming job: preflight, launch (detached), stop at a batch boundary, upgrade.

The deploy DAG calls these; so can scripts. A launch never blocks a worker: the job runs under its supervisor,
detached, and the health DAG watches it from then on.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from urllib.parse import urlparse

from onceflow.config import Settings
from onceflow.kafka import events as ev
from onceflow.rules import clock
from onceflow.runtime import jobctl, preflight
from onceflow.runtime.run_files import JobStatus
from onceflow.wire import OnceflowError


class Action(StrEnum):
    """The deploy DAG's `action` parameter."""

    START = "start"
    STOP = "stop"
    RESTART = "restart"  # stop, then start
    UPGRADE = "upgrade"  # stop with a savepoint, then start the new code from it
    RESTORE = "restore"  # stop, then start from a savepoint

    @property
    def stops_first(self) -> bool:
        """Stopped by the deploy's stop step (upgrade and restore stop inside their launch)."""
        return self in (Action.STOP, Action.RESTART)


ACTIONS = tuple(a.value for a in Action)


class DeployError(OnceflowError):
    pass


@dataclass(frozen=True)
class Stopped:
    """The deploy's stop step: whether something ran, and the last batch it had committed."""

    stopped: bool
    last_batch: int | None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Launch:
    """What a launch started: the job's supervisor, and either what to wait on (`wait`: a jobctl.CommitWait as data,
    for the triggerer) or, waited here, the job's pid and first committed batch. An upgrade adds the savepoint it
    stopped with; a restore, what it restored."""

    supervisor_pid: int
    log: str
    wait: dict[str, Any] | None = None
    job_pid: int | None = None
    first_batch: int | None = None
    savepoint: str | None = None
    savepoint_batch: int | None = None
    restore: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The launch step's XCom: the fields that apply (operators.WaitForFirstCommit reads `wait`)."""
        return {"launched": True} | {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def checkpoint_writable(settings: Settings) -> None:
    u = urlparse(settings.checkpoint)
    if u.scheme not in ("", "file"):
        return  # remote stores are checked by Spark itself at start
    path = u.path
    probe_dir = path if os.path.isdir(path) else os.path.dirname(path.rstrip("/"))
    probe = os.path.join(probe_dir, f".onceflow-write-probe-{os.getpid()}")
    try:
        os.makedirs(probe_dir, exist_ok=True)
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise DeployError(f"the checkpoint location {settings.checkpoint} is not writable: {e}") from None


def preflight_checks(settings: Settings, allow_running: bool = False) -> dict:
    """Broker reachable, topics present, timeouts consistent, checkpoint writable, no other live driver."""
    info = preflight.check_job(settings)
    checkpoint_writable(settings)
    st = jobctl.status(settings)
    if st.running and not allow_running:
        raise DeployError(
            f"app {settings.app_id} is already running (job pid {st.job_pid}); a second driver "
            f"is never started: use action=restart or upgrade"
        )
    other = jobctl.live_elsewhere(settings)
    if other is not None:
        raise DeployError(
            f"another driver of app {settings.app_id} committed batch {other.get('batch')} "
            f"{(clock.now_ms() - other['ts_ms']) / 1000:.0f} s ago from {other.get('host')} "
            f"pid {other.get('pid')}: stop it before starting one here"
        )
    return info | {"checkpoint": settings.checkpoint}


def preflight_for(settings: Settings, action: str, savepoint_id: str = "latest", allow_rewind: bool = False) -> dict:
    """The checks of one deploy action, all before anything is stopped or written."""
    if action not in ACTIONS:
        raise DeployError(f"unknown action {action!r}; one of {', '.join(ACTIONS)}")
    if action == Action.STOP:
        return {"action": action}
    info = preflight_checks(settings, allow_running=action != Action.START) | {"action": action}
    if action == Action.UPGRADE:
        if not jobctl.status(settings).running:
            raise DeployError(
                f"app {settings.app_id} is not running: upgrade stops a running job with a savepoint; use action=start"
            )
        info |= check_upgrade(settings)
    if action == Action.RESTORE:
        from onceflow.operations import savepoints

        info["restore"] = savepoints.check_restore(settings, savepoint_id, allow_rewind).summary()
    return info


def start(settings: Settings, argv: Sequence[str] | None = None, wait_s: float = 300.0, wait: bool = True) -> Launch:
    """Launch detached and return once the job has committed a batch, or runs with nothing to read. With
    `wait=False`, return at once with what to wait on (`wait`: a jobctl.CommitWait), for the deploy DAG, which
    waits in the triggerer (onceflow.control.operators.WaitForFirstCommit)."""
    t0 = clock.now_ms()
    started = jobctl.start(settings, argv=argv)
    launched = Launch(started["supervisor_pid"], started["log"])
    if not wait:
        return dataclasses.replace(launched, wait=jobctl.CommitWait.of(settings, t0, wait_s, or_idle=True).as_dict())
    st = jobctl.wait_for_commit(settings, after_ms=t0, timeout=wait_s, or_idle=True)
    return dataclasses.replace(launched, job_pid=jobctl.status(settings).job_pid, first_batch=st.get("last_batch"))


def stop(settings: Settings, timeout: float = 120.0) -> Stopped:
    before = jobctl.status(settings)
    return Stopped(jobctl.stop(settings, timeout=timeout), before.last_batch)


def check_upgrade(settings: Settings) -> dict:
    """Before anything stops: the new configuration must be able to continue from the running job's state."""
    st = JobStatus.read(settings.status_file)
    running_hash, new_hash = st.job_config_hash if st else None, settings.job_config_hash()
    if running_hash and running_hash != new_hash:
        raise DeployError(
            f"the new configuration changes the query incompatibly (job config hash {running_hash} -> {new_hash}: "
            f"topics, window or watermark): its state cannot continue from the running job's. Deploy it under a "
            f"new ONCEFLOW_APP_ID, or backfill"
        )
    return {"job_config_hash": new_hash}


def upgrade(settings: Settings, argv: Sequence[str] | None = None, wait_s: float = 300.0, wait: bool = True) -> Launch:
    """Stop-with-savepoint, then start the new code and settings from the same checkpoint. The savepoint is the
    point to go back to (action restore) if the new version misbehaves."""
    from onceflow.operations import savepoints

    check_upgrade(settings)
    m = savepoints.create(settings, stop=True, bus=ev.EventBus(settings))
    v = savepoints.verify(settings, m.id)
    if not v.compatible:
        raise DeployError(
            f"stop-with-savepoint {m.id} was taken but the new version cannot continue from it: "
            f"{'; '.join(v.problems + v.incompatibilities)}. The job is stopped; start the previous "
            f"version, or restore another savepoint"
        )
    return dataclasses.replace(start(settings, argv, wait_s, wait), savepoint=m.id, savepoint_batch=m.ledger_batch)


def restore(
    settings: Settings,
    sp_id: str,
    allow_rewind: bool = False,
    argv: Sequence[str] | None = None,
    wait_s: float = 300.0,
    wait: bool = True,
) -> Launch:
    """Stop (if running), restore savepoint `sp_id`, start, wait for a committed batch."""
    from onceflow.operations import savepoints

    savepoints.check_restore(settings, sp_id, allow_rewind)  # refuse before stopping anything
    jobctl.stop(settings)
    plan = savepoints.restore(settings, sp_id, allow_rewind=allow_rewind, bus=ev.EventBus(settings))
    return dataclasses.replace(start(settings, argv, wait_s, wait), restore=plan.summary())
