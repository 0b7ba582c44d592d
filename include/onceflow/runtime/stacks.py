"""Where a running driver waits: its Python threads' stacks, asked for with wire.STACKS_SIGNAL.

The driver registers `faulthandler` for the signal (onceflow.runtime.driver): it writes every thread's stack to the
job's log and runs on. Only a live driver is signalled: the status file outlives its driver, whose pid may be
another process's by now, and the signal's default action ends a process that did not register for it. Used by
`onceflow job stacks`, by the health check before it restarts a stalled job, and by the chaos runs
(docs/operations.md, "Where a job that commits nothing waits")."""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from onceflow import wire
from onceflow.config import Settings
from onceflow.runtime import launcher, procs, supervisor
from onceflow.runtime.run_files import JobStatus

log = logging.getLogger("onceflow.runtime")

# a job driver's command line names its script; no other process is ever signalled
DRIVER_MARK = "/".join(launcher.JOB_SCRIPT.parts[-2:])
# faulthandler's lines: a thread's header, then one line per frame
_HEADER = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):$")
_FRAME = re.compile(r"^  (File \".*\", line (\d+|\?\?\?) in .*|<no Python frame>|\.\.\.)$")


def is_driver(pid: int) -> bool:
    """Whether a live process of this pid is a job driver."""
    return DRIVER_MARK in procs.cmdline(pid)


def driver_pid(settings: Settings) -> int | None:
    """The running driver's pid (its Python process: the status file's `pid`, not spark-submit's JVM)."""
    st = JobStatus.read(settings.status_file)
    return st.pid if st is not None and is_driver(st.pid) else None


def ask(pid: int) -> bool:
    """Send the signal to a driver's pid; False if it has gone meanwhile."""
    try:
        os.kill(pid, wire.STACKS_SIGNAL)
    except ProcessLookupError:
        return False
    return True


def parse(text: str) -> list[str]:
    """The thread stacks in a stretch of the job's log, one string per thread (other lines interleaved are left)."""
    threads: list[list[str]] = []
    inside = False
    for line in text.splitlines():
        if _HEADER.match(line):
            threads.append([line])
            inside = True
        elif inside and _FRAME.match(line):
            threads[-1].append(line)
        else:
            inside = False
    return ["\n".join(t) for t in threads]


_OWN_FRAME = re.compile(r"^  File \"(?:.*/)?(onceflow(?:_apps)?/[^\"]+)\", line (\S+) in (.+)$")


def waiting_in(threads: list[str]) -> list[str]:
    """Where each thread inside the platform's (or an app's) code waits: its innermost such frame, as
    `onceflow/kafka/transactional.py:317 in call`; threads that never enter it (py4j's, servers) are left out."""
    out = []
    for thread in threads:
        for line in thread.splitlines()[1:]:  # most recent call first: the first own frame is the innermost
            m = _OWN_FRAME.match(line)
            if m:
                out.append(f"{m[1]}:{m[2]} in {m[3]}")
                break
    return out


@dataclass(frozen=True)
class Stacks:
    pid: int  # the driver's
    log: Path  # where they were written
    threads: list[str]  # one stack per thread, as written


def dump(settings: Settings, timeout_s: float = 10.0) -> Stacks | None:
    """Ask the running driver for its stacks and return them as they appear in its log; None when no driver runs
    (or it ended before it wrote them). faulthandler writes them synchronously in its signal handler, so once a
    stack appears the others follow within the same moment: the read waits for the count to hold for two polls."""
    pid = driver_pid(settings)
    path = supervisor.job_log(settings)
    if pid is None:
        return None
    start = path.stat().st_size if path.exists() else 0
    if not ask(pid):
        return None
    deadline, seen = time.monotonic() + timeout_s, -1
    while time.monotonic() < deadline:
        time.sleep(0.2)
        with open(path, "rb") as f:
            f.seek(start)
            got = parse(f.read().decode(errors="replace"))
        if got and len(got) == seen:
            return Stacks(pid, path, got)
        seen = len(got)
    if seen > 0:
        return Stacks(pid, path, got)
    log.warning("the driver (pid %d) wrote no stacks to %s within %.0f s", pid, path, timeout_s)
    return None
