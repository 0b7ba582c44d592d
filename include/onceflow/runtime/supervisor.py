"""Restarts a crashed job: fixed delay, bounded attempts (Flink's classic fixed-delay restart strategy).

Attempts count consecutive failures: a run that committed at least one batch resets the count, so a
long-lived job is not retired by crashes spread over weeks. Exit codes the job uses for conditions a restart
cannot fix (misconfiguration, fenced by a newer instance, divergent history) end supervision at once.

With `standby` on, a second launch waits warm next to the active one (onceflow.runtime.standby). A lost driver
process (killed by a signal) is replaced by the standby at once; a failure the driver reported keeps the fixed
delay, then the standby takes over. A new standby is launched once the new
active driver has committed (or after STANDBY_RELAUNCH_S), so it does not compete with the takeover for CPU.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
import time

from onceflow import wire
from onceflow.config import Settings
from onceflow.kafka import events as ev
from onceflow.rules import clock
from onceflow.runtime import launcher, procs, standby
from onceflow.runtime.run_files import Exited, JobStatus

log = logging.getLogger(__name__)
JOB_MARKER = str(launcher.JOB_SCRIPT)
ARGV_ENV = "ONCEFLOW_SUBMIT_ARGV"  # a JSON list: the spark-submit command built by the deployer
STANDBY_RELAUNCH_S = 60.0  # a new standby at the latest this long after a takeover (or the first start)
POLL_S = 0.1


def job_pidfile(settings: Settings):
    return settings.run_dir / f"{settings.app_id}.job.pid"


def supervisor_pidfile(settings: Settings):
    return settings.run_dir / f"{settings.app_id}.supervisor.pid"


def job_log(settings: Settings):
    return settings.log_dir / f"{settings.app_id}.log"


def exit_file(settings: Settings):
    """Why supervision ended (exit code and reason): health pages instead of restarting what a restart cannot fix."""
    return settings.run_dir / f"{settings.app_id}.exit.json"


def _ended(settings: Settings, rc: int, reason: str) -> int:
    Exited(exit_code=rc, reason=reason, ts_ms=clock.now_ms()).write(exit_file(settings))
    return rc


def driver_pid(settings: Settings, launcher_pid: int) -> int | None:
    """The Python driver of the launch `launcher_pid` (spark-submit's JVM runs it as a child, in its process
    group), from the pid the job writes into its status file."""
    st = JobStatus.read(settings.status_file)
    pid = st.pid if st else None
    try:
        if pid and procs.pid_alive(pid) and os.getpgid(pid) == os.getpgid(launcher_pid):
            return int(pid)
    except ProcessLookupError:
        pass
    return None


def _committed_since(settings: Settings, since_ms: int) -> bool:
    st = JobStatus.read(settings.status_file)
    return bool(st and (st.last_commit_ms or 0) >= since_ms)


def driver_lost(rc: int) -> bool:
    """The launch died by a signal (kill -9, the OOM killer): Popen reports the JVM's as a negative code, the JVM
    the Python driver's as 128 + the signal. Any other code is a failure the driver or its JVM reported (an
    error, the JVM's own OutOfMemoryError exit): it keeps the fixed restart delay."""
    return rc < 0 or rc > 128


def restart_delay(settings: Settings, rc: int, standby_ready: bool) -> float:
    """No delay only when a lost driver has a standby whose session is up: a standby still warming up would make the
    takeover wait for its warm-up anyway, so the fixed delay stands (protocol review N-8)."""
    return 0.0 if standby_ready and driver_lost(rc) else settings.restart_delay_s


def ends_for_good(rc: int, relaunched: bool) -> bool:
    """Whether the launch's exit code ends the job (wire.NO_RESTART). One exception: "another instance holds the
    lock" from a launch this supervisor made after a failure (a relaunch, a takeover). The instance holding it is
    then most likely the dead launch's own Python driver outliving its JVM for a few seconds; a new try after the
    restart delay finds the lock free (bounded by the restart attempts like any other failure)."""
    if rc == wire.EXIT_LOCKED and relaunched:
        return False
    return rc in wire.NO_RESTART


class Launches:
    """The active launch and, with `standby` on, the warm one waiting to replace it."""

    def __init__(self, settings: Settings, argv: list[str], env: dict):
        self.s, self.argv, self.env = settings, argv, env
        self.active: subprocess.Popen | None = None
        self.standby: subprocess.Popen | None = None
        self.standby_due_ms = 0  # launch the next standby after the active one commits past this ...
        self.standby_deadline = 0.0  # ... or at this monotonic time

    def launch_active(self, restarts: int) -> None:
        self.active = procs.spawn_detached(self.argv, job_log(self.s), env=self.env)
        self._active_pidfile(restarts)
        self._standby_later()

    def standby_ready(self) -> bool:
        """A standby is alive and its session is up."""
        sb = self.standby
        return sb is not None and sb.poll() is None and standby.ready(self.s, sb.pid) is not None

    def take_over(self, restarts: int) -> bool:
        """Hand the job to the standby; False if there is none alive."""
        sb, self.standby = self.standby, None
        if sb is None or sb.poll() is not None:
            return False
        standby.signal_go(self.s, sb.pid)
        self.active = sb
        self._active_pidfile(restarts, takeover=True)
        standby.pidfile(self.s).unlink(missing_ok=True)
        self._standby_later()
        return True

    def tend_standby(self) -> None:
        """Launch a standby when one is due: the active driver has committed since it started, or it is late."""
        if not self.s.standby or (self.standby is not None and self.standby.poll() is None):
            return
        if self.standby is not None:  # it died on its own: a new one, not at once
            self.standby = None
            self._standby_later()
            return
        if not (_committed_since(self.s, self.standby_due_ms) or time.monotonic() >= self.standby_deadline):
            return
        env = {**self.env, standby.STANDBY_ENV: str(os.getpid())}
        self.standby = procs.spawn_detached(self.argv, job_log(self.s), env=env)
        procs.write_pidfile(standby.pidfile(self.s), self.standby.pid, JOB_MARKER, supervisor=os.getpid())

    def stop_standby(self) -> None:
        if self.standby is not None:
            procs.stop_process(self.standby.pid, 30)
            self.standby = None
        standby.clear(self.s)

    def _active_pidfile(self, restarts: int, takeover: bool = False) -> None:
        assert self.active is not None
        procs.write_pidfile(
            job_pidfile(self.s),
            self.active.pid,
            JOB_MARKER,
            supervisor=os.getpid(),
            restarts=restarts,
            takeover=takeover,
        )

    def _standby_later(self) -> None:
        self.standby_due_ms = clock.now_ms()
        self.standby_deadline = time.monotonic() + STANDBY_RELAUNCH_S


def supervise(settings: Settings, bus: ev.EventBus | None = None) -> int:
    bus = bus or ev.EventBus.for_job(settings)
    stopping = threading.Event()
    env = launcher.submit_env(settings)
    argv = json.loads(os.environ[ARGV_ENV]) if os.environ.get(ARGV_ENV) else launcher.submit_argv(settings)
    launches = Launches(settings, argv, env)

    def on_term(*_):
        stopping.set()
        proc = launches.active
        if proc is not None and proc.poll() is None:
            drv = driver_pid(settings, proc.pid)
            if drv:  # only the Python driver: it stops the query at a batch boundary, and the JVM exits after it
                os.kill(drv, signal.SIGTERM)
            else:  # no driver yet (still starting): the whole launch goes
                procs.signal_group(proc.pid, signal.SIGTERM)
        if launches.standby is not None and launches.standby.poll() is None:
            procs.signal_group(launches.standby.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    standby.clear(settings)
    failures = 0
    restarts = 0
    launches.launch_active(restarts)
    try:
        while True:
            started_ms = clock.now_ms()
            assert launches.active is not None
            while (rc := launches.active.poll()) is None:
                if not stopping.is_set():
                    launches.tend_standby()
                stopping.wait(POLL_S)
            if stopping.is_set():
                return _ended(settings, 0, "stopped")
            if ends_for_good(rc, relaunched=restarts > 0):
                if rc != 0:
                    bus.emit(
                        wire.SUPERVISOR_GAVE_UP,
                        logging.ERROR,
                        flush=True,
                        exit_code=rc,
                        reason=wire.NO_RESTART[rc],
                        log=str(job_log(settings)),
                    )
                return _ended(settings, rc, wire.NO_RESTART[rc])
            failures = 1 if _committed_since(settings, started_ms) else failures + 1
            if failures > settings.restart_attempts:
                bus.emit(
                    wire.SUPERVISOR_GAVE_UP,
                    logging.ERROR,
                    flush=True,
                    exit_code=rc,
                    attempts=failures - 1,
                    reason="restart attempts exhausted",
                    log=str(job_log(settings)),
                )
                return _ended(settings, rc, "restart attempts exhausted")
            restarts += 1
            warm = launches.standby_ready()
            delay = restart_delay(settings, rc, warm)
            bus.emit(
                wire.SUPERVISOR_RESTART,
                logging.WARNING,
                exit_code=rc,
                attempt=failures,
                max_attempts=settings.restart_attempts,
                delay_s=delay,
                restarts=restarts,
                standby=warm,
                lost=driver_lost(rc),
            )
            if delay and stopping.wait(delay):
                return _ended(settings, 0, "stopped")
            if not launches.take_over(restarts):
                launches.launch_active(restarts)
    finally:
        launches.stop_standby()
