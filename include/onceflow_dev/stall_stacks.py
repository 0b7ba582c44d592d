"""A chaos run's evidence of where a stalled job waits. While the running job has committed nothing for `stall_s`
(since its last commit, or its start), its driver is asked for its stacks every `every_s` (onceflow.runtime.stacks):
it writes every Python thread's stack to its log and runs on. Cluster seed 4711 (2026-11-30) spent 63 s after a replaced
producer in a wait its events did not name; the next such wait names its own line."""

from __future__ import annotations

import logging
import threading

from onceflow.rules import clock
from onceflow.runtime import stacks
from onceflow.runtime.run_files import JobStatus

log = logging.getLogger("onceflow_dev.chaos")


def due(now_ms: int, quiet_since_ms: int, last_sent_ms: int, stall_s: float, every_s: float) -> bool:
    """Whether to ask for the stacks now: quiet for `stall_s`, and `every_s` since the last ask."""
    return now_ms - quiet_since_ms >= stall_s * 1000 and now_ms - last_sent_ms >= every_s * 1000


class StallStacks(threading.Thread):
    """Runs beside a chaos run; `sent` holds when each signal went out (epoch ms, the driver's pid)."""

    def __init__(self, s, stall_s: float = 45.0, every_s: float = 20.0, poll_s: float = 2.0):
        super().__init__(daemon=True, name="stall-stacks")
        self.s, self.stall_s, self.every_s, self.poll_s = s, stall_s, every_s, poll_s
        self.stopping = threading.Event()
        self.sent: list[tuple[int, int]] = []

    def run(self) -> None:
        last_sent = 0
        while not self.stopping.wait(self.poll_s):
            # the driver's own status: its pid (the Python process, not spark-submit's JVM), its start, its last commit
            st = JobStatus.read(self.s.status_file)
            if st is None:  # none yet, or being rewritten: the next poll reads it
                continue
            quiet_since = max(st.last_commit_ms or 0, st.started_ms)
            now = clock.now_ms()
            if not due(now, quiet_since, last_sent, self.stall_s, self.every_s):
                continue
            # a running driver only: the file outlives its driver, whose pid may be another process's by now
            if not (stacks.is_driver(st.pid) and stacks.ask(st.pid)):
                continue
            last_sent = now
            self.sent.append((now, st.pid))
            log.info(
                "no commit for %.0f s: the job's stacks asked for (pid %d, its log)", (now - quiet_since) / 1000, st.pid
            )

    def stop(self) -> list[tuple[int, int]]:
        self.stopping.set()
        self.join(10)
        return self.sent
