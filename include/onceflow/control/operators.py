"""Deferrable operators: a DAG's long waits hand themselves to the triggerer (onceflow.control.triggers), so no
worker slot is held while a backfill or a recount runs for an hour or a launched job warms up.

Each takes what its upstream TaskFlow task returned (an XComArg, resolved at run time) and returns the waited-for
result as its own XCom, so a downstream task reads it like any other task's return value."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator

from onceflow.control import triggers
from onceflow.control.deploy import DeployError
from onceflow.control.triggers import BatchJobTrigger, Fired, FirstCommitTrigger
from onceflow.runtime import batch_jobs


def _settle_until() -> float:
    """The earliest a trigger deferred now may fire (onceflow.control.triggers: Airflow's stale-event race)."""
    return time.time() + triggers.SETTLE_S


class WaitForBatchJob(BaseOperator):
    """Wait for the batch job whose `batch_jobs.Handle` (as a dict) the upstream task started; return its result.
    Its progress lines are in this task's log while it runs. Past the handle's deadline the job is stopped and the
    task fails."""

    template_fields: Sequence[str] = ("handle",)
    ui_color = "#e8f0ff"

    def __init__(self, *, handle: Any, poll_s: float = 5.0, **kwargs):
        super().__init__(**kwargs)
        self.handle, self.poll_s = handle, poll_s

    def execute(self, context) -> None:
        trigger = BatchJobTrigger(dict(self.handle), poll_s=self.poll_s, not_before=_settle_until())
        self.defer(trigger=trigger, method_name="execute_complete")

    def execute_complete(self, context, event: dict) -> dict:
        h = batch_jobs.Handle.from_dict(event["handle"])
        if event["status"] == Fired.TIMEOUT:
            raise batch_jobs.timed_out(h)
        result = batch_jobs.outcome(h, event["rc"])
        self.log.info("the %s job is done", h.what)
        return result


class WaitForFirstCommit(BaseOperator):
    """Wait until the job launched upstream has committed a batch (or runs with nothing to read). The upstream task
    returns `{"launched": False}` when it started nothing (a stop): then there is nothing to wait for."""

    template_fields: Sequence[str] = ("launched",)

    def __init__(self, *, launched: Any, **kwargs):
        super().__init__(**kwargs)
        self.launched = launched

    def execute(self, context) -> dict:
        info = dict(self.launched)
        if not info.get("launched", True) or "wait" not in info:
            self.log.info("nothing was launched: nothing to wait for")
            return info
        self.defer(
            trigger=FirstCommitTrigger(info, not_before=_settle_until()),
            method_name="execute_complete",
            timeout=timedelta(seconds=info["wait"]["deadline"] - info["wait"]["after_ms"] / 1000 + 60),
        )

    def execute_complete(self, context, event: dict) -> dict:
        if event["status"] != Fired.DONE:
            raise DeployError(f"the launched job did not commit: {event.get('error')}")
        info = dict(self.launched)
        info.pop("wait", None)
        st = event["status_file"]
        return info | {"first_batch": st.get("last_batch"), "driver_pid": st.get("pid")}
