"""Restarts a crashed job: fixed delay, bounded attempts (Flink's classic fixed-delay restart strategy).

Attempts count consecutive failures: a run that committed at least one batch resets the count, so a
long-lived job is not retired by crashes spread over weeks. Exit codes the job uses for conditions a restart
cannot fix (misconfiguration, fenced by a newer instance, divergent history) end supervision at once.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time

from onceflow import wire
from onceflow.config import Settings
from onceflow.kafka import events as ev
from onceflow.runtime import launcher, procs

log = logging.getLogger(__name__)
JOB_MARKER = str(launcher.JOB_SCRIPT)
ARGV_ENV = "ONCEFLOW_SUBMIT_ARGV"  # a JSON list: the spark-submit command built by the deployer


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
    ev.write_status(exit_file(settings), {"exit_code": rc, "reason": reason, "ts_ms": int(time.time() * 1000)})
    return rc


def driver_pid(settings: Settings, launcher_pid: int) -> int | None:
    """The Python driver of the launch `launcher_pid` (spark-submit's JVM runs it as a child, in its process
    group), from the pid the job writes into its status file."""
    pid = (ev.read_status(settings.status_file) or {}).get("pid")
    try:
        if pid and procs.pid_alive(pid) and os.getpgid(pid) == os.getpgid(launcher_pid):
            return int(pid)
    except ProcessLookupError:
        pass
    return None


def _committed_since(settings: Settings, since_ms: int) -> bool:
    st = ev.read_status(settings.status_file) or {}
    return int(st.get("last_commit_ms") or 0) >= since_ms


def supervise(settings: Settings, bus: ev.EventBus | None = None) -> int:
    bus = bus or ev.EventBus(settings)
    stopping = threading.Event()
    child: dict = {}

    def on_term(*_):
        stopping.set()
        if "proc" in child and child["proc"].poll() is None:
            drv = driver_pid(settings, child["proc"].pid)
            if drv:  # only the Python driver: it stops the query at a batch boundary, and the JVM exits after it
                os.kill(drv, signal.SIGTERM)
            else:  # no driver yet (still starting): the whole launch goes
                procs.signal_group(child["proc"].pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    env = launcher.submit_env(settings)
    argv = json.loads(os.environ[ARGV_ENV]) if os.environ.get(ARGV_ENV) else launcher.submit_argv(settings)
    failures = 0
    restarts = 0
    while True:
        started_ms = int(time.time() * 1000)
        proc = procs.spawn_detached(argv, job_log(settings), env=env)
        child["proc"] = proc
        procs.write_pidfile(job_pidfile(settings), proc.pid, JOB_MARKER, supervisor=os.getpid(), restarts=restarts)
        rc = proc.wait()
        if stopping.is_set():
            return _ended(settings, 0, "stopped")
        if rc in wire.NO_RESTART:
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
        bus.emit(
            wire.SUPERVISOR_RESTART,
            logging.WARNING,
            exit_code=rc,
            attempt=failures,
            max_attempts=settings.restart_attempts,
            delay_s=settings.restart_delay_s,
            restarts=restarts,
        )
        if stopping.wait(settings.restart_delay_s):
            return _ended(settings, 0, "stopped")
