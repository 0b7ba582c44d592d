"""
### {app_id}_checkpoint_rotation

Every `ONCEFLOW_ROTATION_INTERVAL_MINUTES` (default 60): take a savepoint of the `{app_id}` job's checkpoint while
it runs and verify it (files, checksums, self-contained at its batch); keep the newest `ONCEFLOW_SAVEPOINT_KEEP`
(default 10) and none older than `ONCEFLOW_SAVEPOINT_MAX_AGE_S` (default 1 day) except the newest; report the
checkpoint's size, file count, oldest retained batch and growth since the last run. Alerts when a savepoint fails
and when the checkpoint grows past `ONCEFLOW_CHECKPOINT_SIZE_ALERT_BYTES`. Spark's own retention of offsets,
commits and state versions is `ONCEFLOW_MIN_BATCHES_TO_RETAIN` (spark.sql.streaming.minBatchesToRetain).
Restore a savepoint with `{app_id}_deploy` (action restore).

By hand (the operator console's buttons trigger these): `action=rotate` (the default: all of the above now) or
`action=verify` with `savepoint_id` (verify that savepoint only; its verdict is kept beside it).
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Param, dag, get_current_context, task

from onceflow.control import orchestration, rotation, task_defaults
from onceflow.rules.savepoints import SAVEPOINT_REF_PATTERN


def build(app_id: str) -> DAG:
    """The checkpoint_rotation DAG of app instance `app_id` (ONCEFLOW_APPS; onceflow.control.orchestration.instances)."""
    s = orchestration.instance_settings(app_id)  # at parse time: the environment only, no connections
    defaults = task_defaults.default_args(timedelta(minutes=30), app_id)

    @dag(
        **task_defaults.dag_args(app_id, "checkpoint_rotation", __doc__, "savepoints"),
        schedule=timedelta(minutes=s.rotation_interval_minutes),
        default_args=defaults,
        params={
            "action": Param(
                "rotate",
                type="string",
                enum=[a.value for a in rotation.Action],
                description="rotate: savepoint + verify + retention + report; verify: one savepoint",
            ),
            "savepoint_id": Param(
                None,
                type=["null", "string"],
                pattern=SAVEPOINT_REF_PATTERN,  # applies to strings only: null stays allowed for rotate
                description="verify: the savepoint to verify (an id sp-...Z-b<batch>, or `latest`)",
            ),
        },
    )
    def dag_of_app():
        @task
        def savepoint() -> dict:
            p = get_current_context()["params"]
            s = orchestration.settings(app_id=app_id)
            if p["action"] == rotation.Action.VERIFY:
                out = rotation.verify_savepoint(s, p["savepoint_id"])
            else:
                out = rotation.take_savepoint(s, orchestration.alert_sink(s))
            print(f"savepoint: {out}")
            return out.as_dict()

        @task
        def retention(taken: dict) -> dict:
            if rotation.SavepointStep.from_dict(taken).action == rotation.Action.VERIFY:
                return {"skipped": "a verification run keeps every savepoint"}
            out = rotation.apply_retention(orchestration.settings(app_id=app_id))
            print(f"retention: {out}")
            return out.as_dict()

        @task
        def report(taken: dict, kept: dict) -> dict:
            s = orchestration.settings(app_id=app_id)
            out = rotation.report_checkpoint(s, orchestration.alert_sink(s))
            print(f"checkpoint: {out}")
            step = rotation.SavepointStep.from_dict(taken)
            if step.failed:  # after retention and the report, so both still ran
                raise RuntimeError(f"the savepoint failed: {step.error}")
            return out

        taken = savepoint()
        report(taken, retention(taken))  # type: ignore[arg-type]  # TaskFlow: XComArgs are the dicts at run time

    return dag_of_app()


for _app_id in orchestration.instances():
    build(_app_id)
