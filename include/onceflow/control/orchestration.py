"""What the DAGs call: settings resolved from Airflow connections, the Spark provider's submit command,
the alert sink with the configured notifiers. DAG files stay thin; every decision lives in the library."""

from __future__ import annotations

import logging
import os

from onceflow import config
from onceflow.control import alerts
from onceflow.rules import names
from onceflow.runtime import launcher

log = logging.getLogger(__name__)


def instances() -> dict[str, str]:
    """The app instances this control plane runs DAGs for, app id -> app (ONCEFLOW_APPS; config.instances)."""
    return config.instances(config.load(), env=os.environ)


def instance_settings(app_id: str | None = None) -> config.Settings:
    """The settings of instance `app_id` from the environment alone (what a DAG file reads at parse time: no
    connection lookups there); None: the environment's own instance."""
    if app_id is None:
        return config.load()
    return config.load_instance(app_id, instances().get(app_id, app_id))


def settings(kafka_conn_id: str | None = None, role: str = "control", app_id: str | None = None) -> config.Settings:
    """onceflow settings of app instance `app_id` (None: the environment's own) with the Kafka endpoint, and on a
    secured cluster the credentials of `role`, taken from Airflow connections: `kafka_conn_id` (default
    ONCEFLOW_KAFKA_CONN_ID) for the endpoint, and the role's own connection (onceflow.rules.names.connection_id:
    `<kafka_conn_id>_<role>` for the environment's instance; another instance's principals are its own,
    `<kafka_conn_id>_<app_id>[_<role>]`). A connection that does not exist leaves the environment's settings
    standing, except that another instance never runs with the environment's instance's principal."""
    s = instance_settings(app_id)
    base = kafka_conn_id or s.kafka_conn_id
    own = _own(s)
    conn = _connection(base)
    if conn is None:
        log.info("no Airflow connection %s; using ONCEFLOW_BOOTSTRAP_SERVERS=%s", base, s.bootstrap_servers)
    else:  # the endpoint; its principal is the control plane's of the environment's instance only
        s = _with_connection(s, conn, credentials=own)
    return with_database_role(s, role) if own and role == "control" else for_role(s, role, base)


def with_database_role(s: config.Settings, role: str) -> config.Settings:
    """A table-sink app's settings with the database role its Kafka `role` uses (names.DB_PURPOSE_OF_ROLE), from the
    connection `onceflow_postgres_<app_id>_<purpose>` (host, port, login, password; its schema field: the database)
    when there is one. A Kafka sink's, or a role without a database purpose, are returned as they are."""
    purpose = names.DB_PURPOSE_OF_ROLE.get(role)
    if s.sink_kind != "postgres":
        return s
    if purpose is None:  # no database role: none carried over from the settings it was made from
        return s.replace(postgres_password="") if s.postgres_password else s
    conn = _connection(names.db_connection_id(s.app_id, purpose))
    if conn is None:
        return s
    changes: dict = {"postgres_user": conn.login or s.database_user, "postgres_password": conn.password or ""}
    if conn.host:
        changes["postgres_host"] = conn.host
    if conn.port:
        changes["postgres_port"] = int(conn.port)
    if conn.schema:
        changes["postgres_database"] = conn.schema
    return s.replace(**changes)


def for_role(s: config.Settings, role: str, kafka_conn_id: str | None = None) -> config.Settings:
    """`s` with the credentials of `role` of its instance from that role's connection, when there is one; on a
    secured cluster another instance than the environment's must have its own (a clear error otherwise)."""
    own = _own(s)
    conn_id = names.connection_id(kafka_conn_id or s.kafka_conn_id, s.app_id, role, own)
    conn = _connection(conn_id)
    if conn is not None:
        s = _with_connection(s, conn)
    elif not own and s.secured:
        raise config.ConfigError(
            f"app instance {s.app_id}: no Airflow connection {conn_id} with the Kafka credentials of "
            f"{names.username(s.app_id, role)} (its {role} principal); create it (login, password), or the "
            f"instance would run as another instance's principal"
        )
    return with_database_role(s, role)


def _own(s: config.Settings) -> bool:
    """Is `s` the instance of the environment (ONCEFLOW_APP_ID), whose credentials the environment may carry?"""
    return s.app_id == config.load().app_id


def _connection(conn_id: str):
    from airflow.sdk import BaseHook

    try:
        return BaseHook.get_connection(conn_id)
    except Exception:  # no such connection
        return None


def _with_connection(s: config.Settings, conn, credentials: bool = True) -> config.Settings:
    """A Kafka connection's endpoint and security: `bootstrap.servers`, `security.protocol`, `sasl.mechanism`,
    `ssl.ca.location` in its extra (librdkafka's names, as the Kafka provider keeps them); the principal in its
    login and password (the password field, which Airflow masks in logs and the UI); `credentials=False`: the
    endpoint only."""
    extra = conn.extra_dejson
    changes: dict = {}
    servers = extra.get("bootstrap.servers") or (f"{conn.host}:{conn.port}" if conn.host else None)
    if servers:
        changes["bootstrap_servers"] = servers
    if extra.get("security.protocol"):
        changes["kafka_security_protocol"] = str(extra["security.protocol"]).upper()
    if extra.get("sasl.mechanism"):
        changes["kafka_sasl_mechanism"] = extra["sasl.mechanism"]
    if extra.get("ssl.ca.location"):
        changes["kafka_ca_file"] = extra["ssl.ca.location"]
    if not credentials:
        return s.replace(**changes) if changes else s
    if conn.login:
        changes["kafka_username"] = conn.login
    password = conn.password or extra.get("sasl.password")
    if password:
        changes["kafka_password"] = password
    return s.replace(**changes) if changes else s


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

    s = for_role(s, "job")  # a restart by the health check runs as the job's principal, not the control plane's
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
