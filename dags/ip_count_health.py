"""
### ip_count_health

Every `ONCEFLOW_HEALTH_INTERVAL_S` (default 120 s): is the `ip_count` job alive, is it making progress (a committed batch recently while input
waits), how is its lag per partition (Burrow's OK/WARN/STALL/STOP rules over the last runs), is its checkpoint
fresh. A dead or stalled job is restarted, at most `ONCEFLOW_HEALTH_RESTART_ATTEMPTS` times per window, then
the check stops trying and pages. Alerts are deduplicated while a problem lasts and resolved when it ends.
The status is in this task's log, its XCom, `var/run/ip_count.health.json` and the `onceflow_health` topic.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import dag, task

from onceflow import config
from onceflow.control import health, orchestration, task_defaults

DEFAULT_ARGS = task_defaults.default_args(timedelta(minutes=10), retries=1, retry_delay=timedelta(seconds=20))


@dag(
    dag_id="ip_count_health",
    schedule=timedelta(seconds=config.load().health_interval_s),
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    default_args=DEFAULT_ARGS,
    tags=["onceflow", "ip_count", "health"],
)
def ip_count_health():
    @task
    def check() -> dict:
        s = orchestration.settings()
        rec = health.check(s, orchestration.alert_sink(s), start_fn=orchestration.start_job)
        summary = {
            "status": rec.status,
            "running": rec.running,
            "last_commit_age_s": rec.last_commit_age_s,
            "total_lag": rec.total_lag,
            "lag": {p: (v["lag"], v["status"]) for p, v in rec.partitions.items()},
            "checkpoint_age_s": rec.checkpoint_age_s,
            "problems": rec.problems,
            "action": rec.action,
        }
        print(f"ip_count health: {summary}")
        if rec.action == health.Action.GAVE_UP:
            raise RuntimeError(f"the job is down and restarts are exhausted: {rec.problems}")
        if rec.action == health.Action.RESTART_FAILED:
            raise RuntimeError(f"restarting the job failed (it is retried on the next runs): {rec.restart_error}")
        return summary

    check()


ip_count_health()
