"""What every DAG's tasks share: no automatic retries unless a DAG says so, a bound on each task, and a page when a
task fails, times out or is killed (`TaskFailureNotifier`, each task's `on_failure_callback`)."""

from __future__ import annotations

import logging
from datetime import timedelta

from airflow.sdk import BaseNotifier, Context

from onceflow.control import alerts, notifiers, orchestration
from onceflow.control.alerts import Alert, Severity, Status
from onceflow.rules import clock, names

log = logging.getLogger(__name__)


def default_args(execution_timeout: timedelta, app_id: str | None = None, **more) -> dict:
    """A DAG's `default_args`: retries 0 (each DAG's own logic decides what is safe to repeat), `execution_timeout`,
    and the failure page, for app instance `app_id` (None: the environment's own)."""
    return {
        "owner": "onceflow",
        "retries": 0,
        "execution_timeout": execution_timeout,
        "on_failure_callback": [TaskFailureNotifier(app_id)],
    } | more


def dag_args(app_id: str, kind: str, doc: str | None, tag: str, max_active_runs: int = 1) -> dict:
    """What every DAG of an app instance declares (dags/onceflow_<kind>.py): its id `<app_id>_<kind>`, its tags, its
    docs naming the instance, one run at a time (unless said), no catch-up of missed intervals."""
    return {
        "dag_id": names.dag_id(app_id, kind),
        "catchup": False,
        "max_active_runs": max_active_runs,
        "doc_md": (doc or "").replace("{app_id}", app_id),
        "tags": ["onceflow", app_id, tag],
    }


class TaskFailureNotifier(BaseNotifier):
    """A DAG's `on_failure_callback`: a task that failed, timed out or was killed pages through the configured
    channels, and is recorded on the alerts topic (the console shows it). One-off: a later success does not
    resolve it; the next failure pages again."""

    def __init__(self, app_id: str | None = None):
        super().__init__()
        self.app_id = app_id  # whose channels page, and which app the alert names

    def notify(self, context: Context) -> None:
        s = orchestration.settings(app_id=self.app_id)
        ti = context.get("ti") or context.get("task_instance")
        dag_id, task_id = getattr(ti, "dag_id", "?"), getattr(ti, "task_id", "?")
        run_id = getattr(ti, "run_id", "?")
        error = context.get("exception")
        alert = Alert(
            key=f"task:{dag_id}:{task_id}",
            status=Status.FIRING,
            severity=Severity.CRITICAL,
            summary=f"task {task_id} of {dag_id} failed (run {run_id}): {str(error)[:300] or 'no error given'}",
            action=f"read the task's log in the Airflow UI ({dag_id} > {run_id} > {task_id}); docs/troubleshooting.md",
            app=s.app_id,
            source="airflow",
            ts_ms=clock.now_ms(),
            details={"dag_id": dag_id, "task_id": task_id, "run_id": run_id, "try": getattr(ti, "try_number", None)},
            one_off=True,
        )
        for n in notifiers.channel_notifiers(s, alert):  # first: a page must not wait on Kafka
            try:
                notifiers.send(n, context)
            except Exception as e:  # one broken channel must not hide the failure from the others
                log.error("notifier %s failed for %s: %s", type(n).__name__, alert.key, e)
        try:
            alerts.AlertSink(s).publish([alert])
        except Exception as e:  # the broker may be what failed the task
            log.error("the failure of %s.%s could not be recorded on the alerts topic: %s", dag_id, task_id, e)
