"""What the DAGs call: settings resolved from Airflow connections, the Spark provider's submit command,
the alert sink with the configured notifiers. DAG files stay thin; every decision lives in the library."""

from __future__ import annotations

import logging

from onceflow import config
from onceflow.control import alerts
from onceflow.runtime import launcher

log = logging.getLogger(__name__)


def settings(kafka_conn_id: str | None = None) -> config.Settings:
    """onceflow settings, with the Kafka endpoint taken from the Airflow connection when it exists."""
    from airflow.sdk import BaseHook

    s = config.load()
    conn_id = kafka_conn_id or s.kafka_conn_id
    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception:  # no such connection: the environment's settings stand
        log.info("no Airflow connection %s; using ONCEFLOW_BOOTSTRAP_SERVERS=%s", conn_id, s.bootstrap_servers)
        return s
    servers = conn.extra_dejson.get("bootstrap.servers") or (f"{conn.host}:{conn.port}" if conn.host else None)
    return s.replace(bootstrap_servers=servers) if servers else s


def spark_submit_argv(s: config.Settings) -> list[str]:
    """The job's spark-submit command, built by the Spark provider's hook from connection `spark_conn_id`
    (master, deploy mode, spark binary) plus onceflow's own Spark settings."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    spec = launcher.submit_spec(s)
    application = spec.pop("application")
    hook = SparkSubmitHook(conn_id=s.spark_conn_id, **spec)
    return hook._build_spark_submit_command(application)


def start_job(s: config.Settings) -> dict:
    """Launch the job detached with the Spark provider's command (used by deploy and by health restarts)."""
    from onceflow.runtime import jobctl

    return jobctl.start(s, argv=spark_submit_argv(s))


def alert_sink(s: config.Settings, context=None) -> alerts.AlertSink:
    from onceflow.control import notifiers

    return alerts.AlertSink(s, [notifiers.airflow_notify(s, context)] if s.alert_channels else [])


def batch_submit_argv(s: config.Settings, script, args: list[str]) -> list[str]:
    """A batch job's spark-submit command (reconciliation recount, backfill), built by the Spark provider's hook."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    spec = launcher.batch_spec(s, script.stem, script)
    application = spec.pop("application")
    hook = SparkSubmitHook(conn_id=s.spark_conn_id, application_args=list(args), **spec)
    return hook._build_spark_submit_command(application)
