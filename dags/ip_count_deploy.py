"""
### ip_count_deploy

Start, stop, restart or upgrade the exactly-once `ip_count` streaming job.

* **start**: preflight (broker reachable, topics present, transaction timeouts consistent, checkpoint writable,
  no other live driver), then launch through the Spark provider (`spark_default`), detached under the
  onceflow supervisor. Green only once the job has committed a batch.
* **stop**: stop at a batch boundary.
* **restart** / **upgrade**: stop at a batch boundary, then start the (new) code from the same checkpoint.

The job keeps running after this DAG ends; `ip_count_health` supervises it.
"""
from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Param, dag, get_current_context, task

from onceflow import deploy, orchestration

DEFAULT_ARGS = {"owner": "onceflow", "retries": 0, "retry_delay": timedelta(seconds=30)}


@dag(dag_id="ip_count_deploy", schedule=None, catchup=False, max_active_runs=1, doc_md=__doc__,
     default_args=DEFAULT_ARGS, tags=["onceflow", "ip_count", "deploy"],
     params={"action": Param("start", type="string", enum=list(deploy.ACTIONS),
                             description="start | stop | restart | upgrade"),
             "wait_timeout_s": Param(300, type="integer", minimum=30, maximum=3600,
                                     description="how long to wait for the first committed batch")})
def ip_count_deploy():
    @task
    def preflight() -> dict:
        params = get_current_context()["params"]
        s = orchestration.settings()
        if params["action"] == "stop":
            return {"action": "stop"}
        return deploy.preflight_checks(s, allow_running=params["action"] != "start") | {"action": params["action"]}

    @task
    def stop(checked: dict) -> dict:
        if checked["action"] == "start":
            return {"skipped": True}
        return deploy.stop(orchestration.settings())

    @task
    def launch(stopped: dict) -> dict:
        params = get_current_context()["params"]
        if params["action"] == "stop":
            return {"launched": False}
        s = orchestration.settings()
        return deploy.start(s, orchestration.spark_submit_argv(s), wait_s=params["wait_timeout_s"])

    launch(stop(preflight()))


ip_count_deploy()
