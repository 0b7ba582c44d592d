"""
### {app_id}_txn_watch

Every `ONCEFLOW_TXN_WATCH_INTERVAL_S` (default 60 s): alert on (a) `transaction_timeout` events of the job (a transaction the coordinator aborted;
the job replays the batch), (b) near-timeout warnings (a transaction past 80% of its timeout), and (c) hanging
transactions on the sink, DLQ, ledger and backfill topics: the last stable offset held below the high watermark for longer than
the transaction timeout, with the open transaction's age from its first record. Each alert names the
partition, the age, the transactional id or app, and what to do.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, dag, task

from onceflow.control import orchestration, task_defaults, txnwatch


def build(app_id: str) -> DAG:
    """The txn_watch DAG of app instance `app_id` (ONCEFLOW_APPS; onceflow.control.orchestration.instances)."""
    s = orchestration.instance_settings(app_id)  # at parse time: the environment only, no connections
    defaults = task_defaults.default_args(timedelta(minutes=10), app_id, retries=1, retry_delay=timedelta(seconds=15))

    @dag(
        **task_defaults.dag_args(app_id, "txn_watch", __doc__, "transactions"),
        schedule=timedelta(seconds=s.txn_watch_interval_s),
        default_args=defaults,
    )
    def dag_of_app():
        @task
        def watch() -> dict:
            s = orchestration.settings(app_id=app_id)
            result = txnwatch.watch(s, orchestration.alert_sink(s))
            print(f"{app_id} transaction watch: {result}")
            return result.as_dict()

        watch()

    return dag_of_app()


for _app_id in orchestration.instances():
    build(_app_id)
