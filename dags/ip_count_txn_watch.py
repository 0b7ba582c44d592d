"""
### ip_count_txn_watch

Every `ONCEFLOW_TXN_WATCH_INTERVAL_S` (default 60 s): alert on (a) `transaction_timeout` events of the job (a transaction the coordinator aborted;
the job replays the batch), (b) near-timeout warnings (a transaction past 80% of its timeout), and (c) hanging
transactions on the sink, DLQ, ledger and backfill topics: the last stable offset held below the high watermark for longer than
the transaction timeout, with the open transaction's age from its first record. Each alert names the
partition, the age, the transactional id or app, and what to do.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import dag, task

from onceflow import config
from onceflow.control import orchestration, task_defaults, txnwatch

DEFAULT_ARGS = task_defaults.default_args(timedelta(minutes=10), retries=1, retry_delay=timedelta(seconds=15))


@dag(
    dag_id="ip_count_txn_watch",
    schedule=timedelta(seconds=config.load().txn_watch_interval_s),
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    default_args=DEFAULT_ARGS,
    tags=["onceflow", "ip_count", "transactions"],
)
def ip_count_txn_watch():
    @task
    def watch() -> dict:
        s = orchestration.settings()
        result = txnwatch.watch(s, orchestration.alert_sink(s))
        print(f"ip_count transaction watch: {result}")
        return result

    watch()


ip_count_txn_watch()
