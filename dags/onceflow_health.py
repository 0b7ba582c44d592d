"""
### {app_id}_health

Every `ONCEFLOW_HEALTH_INTERVAL_S` (default 120 s): is the `{app_id}` job alive, is it making progress (a committed batch recently while input
waits), how is its lag per partition (Burrow's OK/WARN/STALL/STOP rules over the last runs), is its checkpoint
fresh. A dead or stalled job is restarted, at most `ONCEFLOW_HEALTH_RESTART_ATTEMPTS` times per window, then
the check stops trying and pages. Alerts are deduplicated while a problem lasts and resolved when it ends.
The status is in this task's log, its XCom, `var/run/{app_id}.health.json` and the `onceflow_health` topic.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, dag, task

from onceflow.control import health, orchestration, task_defaults


def build(app_id: str) -> DAG:
    """The health DAG of app instance `app_id` (ONCEFLOW_APPS; onceflow.control.orchestration.instances)."""
    s = orchestration.instance_settings(app_id)  # at parse time: the environment only, no connections
    defaults = task_defaults.default_args(timedelta(minutes=10), app_id, retries=1, retry_delay=timedelta(seconds=20))

    @dag(
        **task_defaults.dag_args(app_id, "health", __doc__, "health"),
        schedule=timedelta(seconds=s.health_interval_s),
        default_args=defaults,
    )
    def dag_of_app():
        @task
        def check() -> dict:
            s = orchestration.settings(app_id=app_id)
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
            print(f"{app_id} health: {summary}")
            if rec.action == health.Action.GAVE_UP:
                raise RuntimeError(f"the job is down and restarts are exhausted: {rec.problems}")
            if rec.action == health.Action.RESTART_FAILED:
                raise RuntimeError(f"restarting the job failed (it is retried on the next runs): {rec.restart_error}")
            return summary

        check()

    return dag_of_app()


for _app_id in orchestration.instances():
    build(_app_id)
