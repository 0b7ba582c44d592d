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
from onceflow.rules import clock, json_records
from onceflow.runtime import launcher, preflight, procs, standby, supervisor
from onceflow.runtime.job_view import JobView, StandbyView
from onceflow.runtime.run_files import Desired, Exited, JobStatus
from onceflow.wire import OnceflowError


class JobControlError(OnceflowError):
    pass


def desired_file(settings: Settings):
    return settings.run_dir / f"{settings.app_id}.desired.json"


def desired_state(settings: Settings) -> wire.Intent | None:
    """What the operator asked for last: RUNNING after a start, STOPPED after a stop; None if never."""
    d = Desired.read(desired_file(settings))
    return d.state if d else None


def _set_desired(settings: Settings, state: wire.Intent) -> None:
    Desired(state=state, ts_ms=clock.now_ms()).write(desired_file(settings))


def status(settings: Settings) -> JobView:
    sup = procs.read_pidfile(supervisor.supervisor_pidfile(settings))
    job = procs.read_pidfile(supervisor.job_pidfile(settings))
    st = JobStatus.read(settings.status_file)
    now = clock.now_ms()
    last = st.last_commit_ms if st else None
    # Until the new driver writes its own status (after spark-submit, preflight and the lock), the file is the
    # previous process's: its start and its running batch are not this launch's, or health would judge a job
    # that is still starting by how long ago its predecessor began.
    launched_ms = int(float(job.get("started", 0)) * 1000) if job else 0
    fresh = st if job and st and st.started_ms >= launched_ms else None
    started = (fresh.started_ms if fresh else launched_ms) if job else None
    exited = None
    if not job:
        exited = Exited.read(supervisor.exit_file(settings))
        if exited is None and st and st.exit_code is not None:
            exited = Exited(st.exit_code, (st.error or "")[:200])
    state: str
    if job:
        state = fresh.state if fresh else wire.JobState.STARTING
    else:
        state = wire.JobState.STOPPED if not st else f"{st.state} (not running)"
    return JobView(
        app=settings.app_id,
        running=job is not None,
        state=state,
        supervisor_pid=sup["pid"] if sup else None,
        job_pid=job["pid"] if job else None,
        host=fresh.host if fresh else None,
        restarts=job.get("restarts", 0) if job else None,
        desired_state=desired_state(settings),
        started_ms=started,
        last_batch=st.last_batch if st else None,
        last_commit_ms=last,
        last_commit_age_s=round((now - last) / 1000, 1) if last else None,
        committed_batches=st.committed_batches if st else None,
        replays_skipped=st.replays_skipped if st else None,
        close_out_batches=st.close_out_batches if st else 0,
        idle_collections=st.idle_collections if st else 0,
        running_batch=fresh.running_batch if fresh else None,
        batch_started_ms=fresh.batch_started_ms if fresh and fresh.running_batch is not None else None,
        watermark_ms=st.watermark_ms if st else None,
        end_offsets=st.end_offsets if st else None,
        last_txn_ms=st.last_txn_ms if st else None,
        last_timings=st.last_timings if st else None,
        progress=st.progress if st else None,
        error=st.error if st else None,
        last_exit=exited,
        standby=_standby_status(settings),
        checkpoint=settings.checkpoint,
        bootstrap_servers=settings.bootstrap_servers,
        transactional_id=settings.transactional_id,
        status_file=str(settings.status_file),
        log=str(supervisor.job_log(settings)),
    )


def _standby_status(settings: Settings) -> StandbyView | None:
    """The warm standby driver, if one runs: its launch pid and whether its session is up."""
    sb = procs.read_pidfile(standby.pidfile(settings))
    if not sb:
        return None
    ready = standby.ready(settings, sb["pid"])
    return StandbyView(sb["pid"], bool(ready), ready.ready_ms if ready else None)


def live_elsewhere(settings: Settings, within_s: float | None = None) -> dict | None:
    """A batch committed recently by a driver that is not the one running here: another live instance."""
    if status(settings).running:
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
    if st.running:
        return f"the job (pid {st.job_pid})"
    if st.supervisor_pid:
        return f"its supervisor (pid {st.supervisor_pid}), which would relaunch the job"
    sb = procs.read_pidfile(standby.pidfile(settings))
    if sb:
        return f"a standby driver (pid {sb['pid']}), which would take over"
    return None


def start(settings: Settings, argv=None) -> dict:
    """Preflight, then launch the supervisor detached. Refuses if an instance already runs here.
    `argv`: the spark-submit command line to run (default: onceflow.runtime.launcher.submit_argv)."""
    preflight.check_job(settings)
    launcher.session_jars(settings)  # resolve (first time: Maven, javac) here, where an error is seen, not in the child
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
        return json_records.from_json(cls, d)

    def check(self) -> dict | None:
        """The status once the job committed after `after_ms` (with `or_idle`: or reports that its query runs
        with no input waiting, as a job that restarts on a drained source does); None until then; raises at once
        if its supervisor has given up."""
        st = JobStatus.read(Path(self.status_file))
        if st and (st.last_commit_ms or 0) > self.after_ms:
            return st.as_json()
        idle = st is not None and (st.last_idle_ms or 0) > self.after_ms and st.started_ms > self.after_ms
        if st is not None and self.or_idle and idle:
            return st.as_json()
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
        st = JobStatus.read(settings.status_file)
        ok = st is not None and st.started_ms > after_ms and st.state == wire.JobState.RUNNING
        return st.as_json() if st and ok and procs.read_pidfile(supervisor.job_pidfile(settings)) else None

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
