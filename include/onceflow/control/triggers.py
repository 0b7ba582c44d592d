"""Deferrable waits: what a DAG task waits for runs in Airflow's triggerer, not in a worker slot.

- `BatchJobTrigger`: a detached batch job (a backfill, a recount: onceflow.runtime.batch_jobs) until it ends; its
  progress lines go to the task's log as they come (the triggerer's lines for a task are part of its log).
- `FirstCommitTrigger`: the streaming job, after a launch, until it commits a batch (or runs with nothing to read),
  failing at once if its supervisor gave up.

Each fires one event, `{"status": Fired, ...}` (its value: events are serialised); the operator (onceflow.control.operators)
resumes on it. The checks are plain file reads, run in a thread so the triggerer's event loop never blocks.

No event fires before `not_before` (the deferral plus SETTLE_S). Airflow 3.3 fails a deferred task whose trigger fires
before the scheduler has taken in the executor's event for the worker that deferred: the resumed attempt is running
by then, and the stale "success" of the deferring worker reads as a state changed from outside (apache/airflow#72716,
open). In the running-Airflow test a scheduled recount with nothing new ended 2 s after its task deferred, the
deferring worker's exit was taken in 6 s after the deferral, and the run failed. Every wait here is for a job of
minutes, so holding a quick answer for SETTLE_S costs little."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from enum import StrEnum
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from onceflow.runtime import batch_jobs

POLL_S = 5.0
SETTLE_S = 20.0  # no event before this long after the deferral (see above)


class Fired(StrEnum):
    """The `status` of a trigger's one event."""

    DONE = "done"
    FAILED = "failed"
    TIMEOUT = "timeout"


class _OneEvent(BaseTrigger):
    """A trigger that fires one event, its `_watch()`'s answer, and not before `not_before` (see above)."""

    not_before: float = 0.0

    async def run(self) -> AsyncIterator[TriggerEvent]:
        event = await self._watch()
        await asyncio.sleep(max(0.0, self.not_before - time.time()))
        yield TriggerEvent(event)

    async def _watch(self) -> dict[str, Any]:
        raise NotImplementedError


class BatchJobTrigger(_OneEvent):
    def __init__(self, handle: dict, offset: int = 0, poll_s: float = POLL_S, not_before: float = 0.0):
        super().__init__()
        self.handle, self.offset, self.poll_s, self.not_before = handle, offset, poll_s, not_before

    def serialize(self) -> tuple[str, dict[str, Any]]:
        kwargs = {"handle": self.handle, "offset": self.offset, "poll_s": self.poll_s, "not_before": self.not_before}
        return (f"{__name__}.BatchJobTrigger", kwargs)

    async def _watch(self) -> dict[str, Any]:
        h = batch_jobs.Handle.from_dict(self.handle)
        self.log.info("waiting for the %s job in the triggerer (log %s)", h.what, h.log_file)
        while True:
            p = await asyncio.to_thread(batch_jobs.poll, h, self.offset)
            self.offset = p.offset
            for line in p.lines:
                self.log.info("%s", line)
            if p.finished:
                return {"status": (Fired.DONE if p.rc == 0 else Fired.FAILED).value, "rc": p.rc, "handle": self.handle}
            if time.time() > h.deadline:
                await asyncio.to_thread(batch_jobs.stop, h)
                return {"status": Fired.TIMEOUT.value, "rc": None, "handle": self.handle}
            await asyncio.sleep(self.poll_s)


class FirstCommitTrigger(_OneEvent):
    def __init__(self, launched: dict, poll_s: float = 1.0, not_before: float = 0.0):
        super().__init__()
        self.launched, self.poll_s, self.not_before = launched, poll_s, not_before

    def serialize(self) -> tuple[str, dict[str, Any]]:
        kwargs = {"launched": self.launched, "poll_s": self.poll_s, "not_before": self.not_before}
        return (f"{__name__}.FirstCommitTrigger", kwargs)

    async def _watch(self) -> dict[str, Any]:
        from onceflow.runtime import jobctl

        w = jobctl.CommitWait.from_dict(self.launched["wait"])
        self.log.info("waiting for app %s's first committed batch in the triggerer", w.app_id)
        while True:
            try:
                st = await asyncio.to_thread(w.check)
            except jobctl.JobControlError as e:
                return {"status": Fired.FAILED.value, "error": str(e)}
            if st is not None:
                return {"status": Fired.DONE.value, "status_file": st}
            if time.time() > w.deadline:
                return {"status": Fired.TIMEOUT.value, "error": f"no committed batch of {w.app_id} by the deadline"}
            await asyncio.sleep(self.poll_s)
