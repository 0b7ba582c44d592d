"""Start, stop, inspect and kill the streaming job (through its supervisor)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from onceflow import wire
from onceflow.config import Settings
from onceflow.kafka import events as ev
from onceflow.rules import clock
from onceflow.runtime import jvm, launcher, preflight, procs, standby, supervisor
from onceflow.wire import OnceflowError


class JobControlError(OnceflowError):
    pass


def desired_file(settings: Settings):
    return settings.run_dir / f"{settings.app_id}.desired.json"


def desired_state(settings: Settings) -> wire.Intent | None:
    """What the operator asked for last: RUNNING after a start, STOPPED after a stop; None if never."""
    st = ev.read_status(desired_file(settings))
    return wire.Intent(st["state"]) if st and st.get("state") else None


def _set_desired(settings: Settings, state: wire.Intent) -> None:
    ev.write_status(desired_file(settings), {"state": state, "ts_ms": clock.now_ms()})


def status(settings: Settings) -> dict:
    sup = procs.read_pidfile(supervisor.supervisor_pidfile(settings))
    job = procs.read_pidfile(supervisor.job_pidfile(settings))
    st = ev.read_status(settings.status_file) or {}
    now = clock.now_ms()
    last = st.get("last_commit_ms")
    # Until the new driver writes its own status (after spark-submit, preflight and the lock), the file is the
    # previous process's: its start and its running batch are not this launch's, or health would judge a job
    # that is still starting by how long ago its predecessor began.
    launched_ms = int(float(job.get("started", 0)) * 1000) if job else 0
    fresh = bool(job) and int(st.get("started_ms") or 0) >= launched_ms
    started = (st.get("started_ms") if fresh else launched_ms) if job else None
    batch_since = st.get("batch_started_ms") if fresh and st.get("running_batch") is not None else None
    exited = (
        None
        if job
        else (
            ev.read_status(supervisor.exit_file(settings))
            or (
                {"exit_code": st["exit_code"], "reason": st.get("error", "")[:200]}
                if st.get("exit_code") is not None
                else None
            )
        )
    )
    return {
        "app": settings.app_id,
        "supervisor_pid": sup["pid"] if sup else None,
        "job_pid": job["pid"] if job else None,
        "host": st.get("host") if fresh else None,  # where the driver runs
        "running": job is not None,
        "restarts": job.get("restarts", 0) if job else None,
        "state": (st.get("state") if fresh else wire.JobState.STARTING)
        if job
        else (wire.JobState.STOPPED if not st else f"{st.get('state')} (not running)"),
        "last_batch": st.get("last_batch"),
        "last_commit_age_s": round((now - last) / 1000, 1) if last else None,
        "committed_batches": st.get("committed_batches"),
        "replays_skipped": st.get("replays_skipped"),
        "watermark_ms": st.get("watermark_ms"),
        "end_offsets": st.get("end_offsets"),
        "last_txn_ms": st.get("last_txn_ms"),
        "last_timings": st.get("last_timings"),
        "close_out_batches": st.get("close_out_batches", 0),
        "progress": st.get("progress"),
        "checkpoint": settings.checkpoint,
        "bootstrap_servers": settings.bootstrap_servers,
        "transactional_id": settings.transactional_id,
        "status_file": str(settings.status_file),
        "log": str(supervisor.job_log(settings)),
        "error": st.get("error"),
        "desired_state": desired_state(settings),
        "started_ms": started,
        "last_commit_ms": last,
        "running_batch": st.get("running_batch") if fresh else None,
        "batch_started_ms": batch_since,
        "last_exit": exited,
        "standby": _standby_status(settings),
    }


def _standby_status(settings: Settings) -> dict | None:
    """The warm standby driver, if one runs: its launch pid and whether its session is up."""
    sb = procs.read_pidfile(standby.pidfile(settings))
    if not sb:
        return None
    ready = standby.ready(settings, sb["pid"])
    return {"pid": sb["pid"], "ready": bool(ready), "ready_ms": ready.get("ready_ms") if ready else None}


def live_elsewhere(settings: Settings, within_s: float | None = None) -> dict | None:
    """A batch committed recently by a driver that is not the one running here: another live instance."""
    if status(settings)["running"]:
        return None  # the recent commits are this machine's own driver
    within_s = within_s or max(60.0, 6 * settings.trigger_interval_s)
    now_ms = clock.now_ms()
    # the job's own events only: nobody but the job's principal can write one there
    for d in reversed(ev.read(settings, {wire.BATCH_COMMITTED}, since_ms=now_ms - int(within_s * 1000))):
        pid = int(d.get("pid") or 0)
        if d.get("host") == socket.gethostname() and not (pid > 0 and procs.pid_alive(pid)):
            continue  # a driver of this machine that has exited (stopped or killed): history
        if now_ms - d["ts_ms"] > within_s * 1000:
            return None
        return d
    return None


@contextlib.contextmanager
def start_lock(settings: Settings):
    """One start at a time per app on this machine: the check for a running instance, the launch and its pid
    file happen under this lock, so two concurrent starts cannot both launch (one pid file would be lost). Operator
    actions that must not overlap a start (a quarantine) hold it too."""
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(settings.run_dir / f"{settings.app_id}.start.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def still_running(settings: Settings) -> str | None:
    """What of the app still runs here, if anything: the job, its supervisor (which relaunches it after its restart
    delay), or a standby (which takes over). An action that changes the checkpoint under the job (a restore, a
    quarantine) needs all three stopped, and holds `start_lock` so that no start slips in while it works."""
    st = status(settings)
    if st["running"]:
        return f"the job (pid {st['job_pid']})"
    if st["supervisor_pid"]:
        return f"its supervisor (pid {st['supervisor_pid']}), which would relaunch the job"
    sb = procs.read_pidfile(standby.pidfile(settings))
    if sb:
        return f"a standby driver (pid {sb['pid']}), which would take over"
    return None


def start(settings: Settings, argv=None) -> dict:
    """Preflight, then launch the supervisor detached. Refuses if an instance already runs here.
    `argv`: the spark-submit command line to run (default: onceflow.runtime.launcher.submit_argv)."""
    preflight.check_job(settings)
    jvm.spark_kafka_jars(settings)  # resolve (first time: Maven) here, where an error is seen, not in the child
    env = launcher.submit_env(settings)
    if argv:
        env[supervisor.ARGV_ENV] = json.dumps(list(argv))
    with start_lock(settings):
        if procs.read_pidfile(supervisor.supervisor_pidfile(settings)) or procs.read_pidfile(
            supervisor.job_pidfile(settings)
        ):
            raise JobControlError(f"app {settings.app_id} is already running: `onceflow job status`")
        supervisor.exit_file(settings).unlink(missing_ok=True)
        proc = procs.spawn_detached(
            [sys.executable, "-m", "onceflow.cli", "job", "run"], supervisor.job_log(settings), env=env
        )
        procs.write_pidfile(supervisor.supervisor_pidfile(settings), proc.pid, "onceflow.cli")
        _set_desired(settings, wire.Intent.RUNNING)
    return {"supervisor_pid": proc.pid, "log": str(supervisor.job_log(settings))}


@dataclass(frozen=True)
class CommitWait:
    """What "the job has committed a batch after `after_ms`" is checked against: plain data, so the check can run
    anywhere the files are (the deploy DAG hands it to the triggerer: onceflow.control.triggers)."""

    app_id: str
    status_file: str
    supervisor_pidfile: str
    job_log: str
    after_ms: int
    or_idle: bool
    deadline: float  # wall-clock seconds

    @classmethod
    def of(cls, settings: Settings, after_ms: int, timeout: float, or_idle: bool = False) -> CommitWait:
        return cls(
            settings.app_id,
            str(settings.status_file),
            str(supervisor.supervisor_pidfile(settings)),
            str(supervisor.job_log(settings)),
            after_ms,
            or_idle,
            time.time() + timeout,
        )

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> CommitWait:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})

    def check(self) -> dict | None:
        """The status once the job committed after `after_ms` (with `or_idle`: or reports that its query runs
        with no input waiting, as a job that restarts on a drained source does); None until then; raises at once
        if its supervisor has given up."""
        st = ev.read_status(Path(self.status_file)) or {}
        if int(st.get("last_commit_ms") or 0) > self.after_ms:
            return st
        idle = int(st.get("last_idle_ms") or 0) > self.after_ms and int(st.get("started_ms") or 0) > self.after_ms
        if self.or_idle and idle:
            return st
        if not procs.read_pidfile(Path(self.supervisor_pidfile)):
            log = Path(self.job_log)
            tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
            raise JobControlError(f"the job of app {self.app_id} is not running (see {log}):\n" + "\n".join(tail))
        return None


def wait_for_commit(settings: Settings, after_ms: int = 0, timeout: float = 180.0, or_idle: bool = False) -> dict:
    """Until the job commits a batch after `after_ms` (CommitWait.check), here."""
    w = CommitWait.of(settings, after_ms, timeout, or_idle)
    return procs.wait_until(w.check, timeout, interval=0.5, what=f"a committed batch of {settings.app_id}")


def wait_running(settings: Settings, after_ms: int = 0, timeout: float = 180.0) -> dict:
    """Until a job process started after `after_ms` has its streaming query running."""

    def running():
        st = ev.read_status(settings.status_file) or {}
        ok = int(st.get("started_ms") or 0) > after_ms and st.get("state") == wire.JobState.RUNNING
        return st if ok and procs.read_pidfile(supervisor.job_pidfile(settings)) else None

    return procs.wait_until(running, timeout, interval=0.5, what=f"{settings.app_id}'s query to run")


def stop(settings: Settings, timeout: float = 90.0, record_intent: bool = True) -> bool:
    """Stop at a batch boundary (SIGTERM to the supervisor, which forwards it). True if something ran.
    An operator's stop records the intent (desired "stopped"): the health check then leaves the job alone. A
    restart by the health check passes `record_intent=False`: it never changes what the operator asked for."""
    if record_intent and desired_state(settings) is not None:
        _set_desired(settings, wire.Intent.STOPPED)
    sup = procs.read_pidfile(supervisor.supervisor_pidfile(settings))
    job = procs.read_pidfile(supervisor.job_pidfile(settings))
    if not sup and not job:
        return False
    if sup:
        procs.stop_process(sup["pid"], timeout)
    if job and procs.pid_alive(job["pid"]):
        procs.stop_process(job["pid"], timeout)
    sb = procs.read_pidfile(standby.pidfile(settings))  # its supervisor stops it; unless it was killed
    if sb:
        procs.stop_process(sb["pid"], timeout)
    supervisor.supervisor_pidfile(settings).unlink(missing_ok=True)
    supervisor.job_pidfile(settings).unlink(missing_ok=True)
    standby.clear(settings)
    return True


def kill(settings: Settings, with_supervisor: bool = False) -> int | None:
    """kill -9 the job's process group (driver JVM and Python); the supervisor restarts it. With
    `with_supervisor`, the supervisor dies first (as when the driver's machine loses the whole process tree):
    then only the health check can bring the job back."""
    job = procs.read_pidfile(supervisor.job_pidfile(settings))
    if with_supervisor:
        sup = procs.read_pidfile(supervisor.supervisor_pidfile(settings))
        if sup:
            procs.signal_group(sup["pid"], signal.SIGKILL)
            procs.wait_until(lambda: not procs.pid_alive(sup["pid"]), 20, what="the supervisor to die")
    if not job:
        return None
    procs.signal_group(job["pid"], signal.SIGKILL)
    procs.wait_until(lambda: not procs.pid_alive(job["pid"]), 30, what="the job to die")
    return job["pid"]
