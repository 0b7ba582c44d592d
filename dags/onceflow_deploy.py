"""
### {app_id}_deploy

Start, stop, restart, upgrade or restore the exactly-once `{app_id}` streaming job.

* **start**: preflight (broker reachable, topics present, transaction timeouts consistent, checkpoint writable,
  no other live driver), then launch through the Spark provider (`spark_default`), detached under the
  onceflow supervisor. Green only once the job has committed a batch: the wait for it (`first_commit`) runs in
  Airflow's triggerer, not in a worker slot.
* **stop**: stop at a batch boundary.
* **restart**: stop at a batch boundary, then start from the same checkpoint.
* **upgrade**: stop-with-savepoint (the job stops at a batch boundary and the savepoint is its final state),
  verify the savepoint, check the new configuration can continue from it, then start the new code and settings.
  Refused before anything stops if the query changed incompatibly (topics, window, watermark).
* **restore**: stop, replace the checkpoint with savepoint `savepoint_id` (`latest` for the newest), start. If the
  sink committed batches after the savepoint, the job re-reads them once to rebuild its state and writes none of
  them again. A savepoint older than the newest is a rewind: refused unless `allow_rewind`. See
  `docs/savepoints.md`; `onceflow savepoint list` shows the ids.

The job keeps running after this DAG ends; `{app_id}_health` supervises it.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Param, dag, get_current_context, task

from onceflow.control import deploy, orchestration, task_defaults
from onceflow.control.operators import WaitForFirstCommit
from onceflow.rules.savepoints import SAVEPOINT_REF_PATTERN


def build(app_id: str) -> DAG:
    """The deploy DAG of app instance `app_id` (ONCEFLOW_APPS; onceflow.control.orchestration.instances)."""
    defaults = task_defaults.default_args(timedelta(hours=2), app_id)  # a stop, a savepoint, up to an hour of wait

    @dag(
        **task_defaults.dag_args(app_id, "deploy", __doc__, "deploy"),
        schedule=None,
        default_args=defaults,
        params={
            "action": Param(
                "start",
                type="string",
                enum=list(deploy.ACTIONS),
                description="start | stop | restart | upgrade | restore",
            ),
            "savepoint_id": Param(
                "latest",
                type="string",
                pattern=SAVEPOINT_REF_PATTERN,
                description="restore: the savepoint to restore (`latest` = the newest; else an id sp-...Z-b<batch>)",
            ),
            "allow_rewind": Param(
                False, type="boolean", description="restore: allow a savepoint older than the newest (a rewind)"
            ),
            "wait_timeout_s": Param(
                300,
                type="integer",
                minimum=30,
                maximum=3600,
                description="how long to wait for the first committed batch",
            ),
        },
    )
    def dag_of_app():
        @task
        def preflight() -> dict:
            params = get_current_context()["params"]
            return deploy.preflight_for(
                orchestration.settings(app_id=app_id, role="job"),
                params["action"],
                params["savepoint_id"],
                params["allow_rewind"],
            )

        @task
        def stop(checked: dict) -> dict:
            if not deploy.Action(checked["action"]).stops_first:
                return {"skipped": True, "why": "start does not stop; upgrade and restore stop in the launch step"}
            return deploy.stop(orchestration.settings(app_id=app_id, role="job")).as_dict()

        @task
        def launch(stopped: dict) -> dict:
            params = get_current_context()["params"]
            s = orchestration.settings(app_id=app_id, role="job")
            action = deploy.Action(params["action"])
            if action == deploy.Action.STOP:
                return {"launched": False}
            argv, wait = orchestration.spark_submit_argv(s), params["wait_timeout_s"]
            if action == deploy.Action.UPGRADE:
                return deploy.upgrade(s, argv, wait_s=wait, wait=False).as_dict()
            if action == deploy.Action.RESTORE:
                launched = deploy.restore(
                    s, params["savepoint_id"], params["allow_rewind"], argv, wait_s=wait, wait=False
                )
                return launched.as_dict()
            return deploy.start(s, argv, wait_s=wait, wait=False).as_dict()

        launched = launch(stop(preflight()))  # type: ignore[arg-type]  # TaskFlow: each XComArg is a dict at run time
        WaitForFirstCommit(task_id="first_commit", launched=launched)

    return dag_of_app()


for _app_id in orchestration.instances():
    build(_app_id)
