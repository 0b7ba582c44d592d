"""The test session's processes: every process a session starts carries its token (PYTEST_ONCEFLOW_SESSION, set
by tests.conftest) in its environment, so the session can find, name and stop whatever it left running. A run on
pytest-xdist's workers is several sessions, one per worker; every process of the run also carries the run's token
(PYTEST_ONCEFLOW_RUN, which the workers inherit from their controller), so the controller can stop what a worker
killed before its teardown left behind."""

from __future__ import annotations

import os
import signal
import time

import pytest

from onceflow.runtime import procs

SESSION_ENV = "PYTEST_ONCEFLOW_SESSION"
RUN_ENV = "PYTEST_ONCEFLOW_RUN"
free_port = procs.free_port


def end_on_sigterm() -> None:
    """`timeout N pytest` and CI runners end a run with SIGTERM, which kills pytest where it stands: the broker,
    Airflow, its PostgreSQL and the jobs the fixtures started would keep running. Taken as Ctrl-C instead (a
    KeyboardInterrupt in the main thread), pytest stops the run and tears its fixtures down."""

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, interrupt)


def pytest_unconfigure(config: pytest.Config) -> None:
    """In the run's controller (or a run without workers), once every session has ended: stop whatever still carries
    the run's token. A run ended by SIGTERM on pytest-xdist took its workers down before their fixtures' teardown,
    and left each worker's broker listening (found 2026-11-29); a worker's own session ends with its teardown and its
    leak check (tests.conftest.nothing_left_running), so after a run that was not cut short there is nothing here."""
    if not hasattr(config, "workerinput"):
        stop_run_processes()


def stop_run_processes(grace_s: float = 10.0) -> list[tuple[int, str]]:
    """SIGTERM to every live process of this run (a broker and PostgreSQL then stop cleanly), SIGKILL to any still
    alive `grace_s` later; the processes found."""
    left = session_processes(RUN_ENV)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid, _ in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while sig == signal.SIGTERM and session_processes(RUN_ENV) and time.monotonic() < deadline:
            time.sleep(0.2)
    return left


def session_processes(env: str = SESSION_ENV) -> list[tuple[int, str]]:
    """Live processes (not this one) whose environment carries this session's token (or the run's: RUN_ENV)."""
    token = f"{env}={os.environ[env]}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid() or not procs.pid_alive(int(entry)):
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if token not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:300]
        except OSError:
            continue
        out.append((pid, cmd))
    return out
