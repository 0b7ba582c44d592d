"""Deferrable waits: what a DAG task waits for runs in Airflow's triggerer, not in a worker slot.

- `BatchJobTrigger`: a detached batch job (a backfill, a recount: onceflow.runtime.batch_jobs) until it ends; its
  progress lines go to the task's log as they come (the triggerer's lines for a task are part of its log).
- `FirstCommitTrigger`: the streaming job, after a launch, until it commits a batch (or runs with nothing to read),
  failing at once if its supervisor gave up.

Each fires one event, `{"status": Fired, ...}` (its value: events are serialised); the operator (onceflow.control.operators)
resumes on it. The checks are plain file reads, run in a thread so the triggerer's event loop never blocks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from enum import StrEnum
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from onceflow.runtime import batch_jobs

POLL_S = 5.0


class Fired(StrEnum):
    """The `status` of a trigger's one event."""

    DONE = "done"
    FAILED = "failed"
    TIMEOUT = "timeout"


class BatchJobTrigger(BaseTrigger):
    def __init__(self, handle: dict, offset: int = 0, poll_s: float = POLL_S):
        super().__init__()
        self.handle, self.offset, self.poll_s = handle, offset, poll_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{__name__}.BatchJobTrigger", {"handle": self.handle, "offset": self.offset, "poll_s": self.poll_s})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        h = batch_jobs.Handle.from_dict(self.handle)
        self.log.info("waiting for the %s job in the triggerer (log %s)", h.what, h.log_file)
        while True:
            p = await asyncio.to_thread(batch_jobs.poll, h, self.offset)
            self.offset = p.offset
            for line in p.lines:
                self.log.info("%s", line)
            if p.finished:
                yield TriggerEvent(
                    {"status": (Fired.DONE if p.rc == 0 else Fired.FAILED).value, "rc": p.rc, "handle": self.handle}
                )
                return
            if time.time() > h.deadline:
                await asyncio.to_thread(batch_jobs.stop, h)
                yield TriggerEvent({"status": Fired.TIMEOUT.value, "rc": None, "handle": self.handle})
                return
            await asyncio.sleep(self.poll_s)


class FirstCommitTrigger(BaseTrigger):
    def __init__(self, launched: dict, poll_s: float = 1.0):
        super().__init__()
        self.launched, self.poll_s = launched, poll_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{__name__}.FirstCommitTrigger", {"launched": self.launched, "poll_s": self.poll_s})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from onceflow.runtime import jobctl

        w = jobctl.CommitWait.from_dict(self.launched["wait"])
        self.log.info("waiting for app %s's first committed batch in the triggerer", w.app_id)
        while True:
            try:
                st = await asyncio.to_thread(w.check)
            except jobctl.JobControlError as e:
                yield TriggerEvent({"status": Fired.FAILED.value, "error": str(e)})
                return
            if st is not None:
                yield TriggerEvent({"status": Fired.DONE.value, "status_file": st})
                return
            if time.time() > w.deadline:
                yield TriggerEvent(
                    {"status": Fired.TIMEOUT.value, "error": f"no committed batch of {w.app_id} by the deadline"}
                )
                return
            await asyncio.sleep(self.poll_s)
