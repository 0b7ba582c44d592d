"""The test session's processes: every process a session starts carries its token (PYTEST_ONCEFLOW_SESSION, set
by tests.conftest) in its environment, so the session can find, name and stop whatever it left running."""

from __future__ import annotations

import os
import signal

from onceflow.runtime import procs

SESSION_ENV = "PYTEST_ONCEFLOW_SESSION"
free_port = procs.free_port


def end_on_sigterm() -> None:
    """`timeout N pytest` and CI runners end a run with SIGTERM, which kills pytest where it stands: the broker,
    Airflow, its PostgreSQL and the jobs the fixtures started would keep running. Taken as Ctrl-C instead (a
    KeyboardInterrupt in the main thread), pytest stops the run and tears its fixtures down."""

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, interrupt)


def session_processes() -> list[tuple[int, str]]:
    """Live processes (not this one) whose environment carries this session's token."""
    token = f"{SESSION_ENV}={os.environ[SESSION_ENV]}".encode()
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
