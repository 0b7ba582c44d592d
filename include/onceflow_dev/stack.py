"""The embedded stack: one command brings up Kafka (one node or a cluster) and the topics, and, asked, Spark's
standalone cluster and the PostgreSQL sink's server; another takes it down."""

from __future__ import annotations

import json
import os
from pathlib import Path

from onceflow import config
from onceflow.config import ENV_PREFIX, STACK_FILE, Settings
from onceflow.kafka import topics
from onceflow.runtime import launcher
from onceflow_dev import broker, postgres, spark_cluster

DEFAULT_SPARK_MASTER_PORT = 7077


def up(settings: Settings, spark_workers: int = 0, with_postgres: bool = False) -> dict:
    """Kafka and the topics; with spark_workers, a Spark standalone master at settings.master and its workers; with
    with_postgres, the PostgreSQL server (onceflow_dev.postgres) with each app instance's sink schema and roles. The
    topology is remembered under the var dir first (remember), so a later command, or `down`, finds all of it even if
    this one fails halfway."""
    if spark_workers:
        spark_cluster.master_address(settings)  # a clear error before anything starts
    remember(settings, spark_workers)
    prepare_jvm(settings)
    info = broker.start(settings)
    # every app instance of the control plane (ONCEFLOW_APPS): its topics, and on the secured stack its principals
    # and their ACLs, so each instance's DAGs and job find theirs
    every = instances(settings)
    info["topics_created"] = [t for inst in every for t in topics.ensure(provision(inst) if inst.secured else inst)]
    if spark_workers:
        spark_cluster.start(settings, workers=spark_workers)
    if with_postgres:
        for inst in every:
            postgres.provision_sink(inst)
        port = str((postgres.state(settings) or {})["port"])
        remember(settings, spark_workers, {ENV_PREFIX + "POSTGRES_PORT": port})
    return status(settings) | {"topics_created": info["topics_created"]}


def prepare_jvm(settings: Settings) -> None:
    """What a job's first start would otherwise do before its first batch, done now, once per machine: the Spark
    Kafka connector resolved and cached, the app's JVM functions compiled, and the class-data archive of Spark's
    classes built (ONCEFLOW_CLASS_DATA_SHARING; a minute or two; nothing where the setting or the launch does not use
    it)."""
    launcher.session_jars(settings)
    launcher.with_class_data(settings, launcher.local_fs_conf(settings, settings.checkpoint))


def instances(settings: Settings) -> list[Settings]:
    """The settings of every app instance of the control plane (config.instances), in ONCEFLOW_APPS' order."""
    env = {**os.environ, **settings.as_env()}  # the shell's per-instance variables (ONCEFLOW__<INSTANCE>__*) too
    return [
        settings if app_id == settings.app_id else config.load_instance(app_id, app, env=env)
        for app_id, app in config.instances(settings, env=env).items()
    ]


# What the stack was started with: the settings other commands must share with it (exports), and the brokers' own.
REMEMBERED = (
    "CONTROLLER_PORT",
    "LISTEN_HOST",
    "BROKER_HEAP",
    "BROKER_TXN_ABORT_CHECK_INTERVAL_MS",
    "BROKER_TRANSACTION_MAX_TIMEOUT_MS",
)


def remember(settings: Settings, spark_workers: int = 0, extra: dict[str, str] | None = None) -> Path:
    """Write the stack's topology to <var_dir>/stack.json (config.remembered_stack reads it); `extra`: more settings
    every command shares with it (the PostgreSQL server's port)."""
    env = settings.as_env()
    topology = exports(settings) | {ENV_PREFIX + k: env[ENV_PREFIX + k] for k in REMEMBERED} | (extra or {})
    if not spark_workers:
        topology.pop(ENV_PREFIX + "MASTER", None)  # no cluster of its own: the settings' master stays the shell's
    path = settings.var_dir / STACK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"settings": topology, "spark_workers": spark_workers}, indent=2, sort_keys=True))
    tmp.replace(path)
    return path


def forget(settings: Settings) -> None:
    (settings.var_dir / STACK_FILE).unlink(missing_ok=True)


def provision(settings: Settings) -> Settings:
    """On the secured stack: the app's principals (passwords in onceflow_dev.credentials) and their ACLs; returns
    the admin's settings, for what only the admin may do (create topics)."""
    from onceflow.kafka import acls, security
    from onceflow_dev import credentials

    admin = credentials.as_admin(settings)
    known = credentials.ensure(settings)
    security.provision(admin, settings, {r: known[acls.username(settings, r)] for r in acls.ROLES})
    return admin


def down(settings: Settings) -> dict:
    from onceflow.runtime import jobctl, procs
    from onceflow_dev import airflow_local, generator

    airflow_stopped = airflow_local.down(settings)
    gen = procs.read_pidfile(generator.pidfile(settings))
    if gen:
        procs.stop_process(gen["pid"], 10)
    stopped_job = jobctl.stop(settings)
    forget(settings)
    return {
        "airflow_stopped": airflow_stopped,
        "generator_stopped": bool(gen),
        "job_stopped": stopped_job,
        "spark_cluster_stopped": spark_cluster.stop(settings),
        "postgres_stopped": postgres.down(settings),  # after the jobs that write to it
        "broker_stopped": broker.stop(settings),
    }


def status(settings: Settings) -> dict:
    b = broker.status(settings)
    out = {
        "broker": b,
        "bootstrap_servers": settings.bootstrap_servers,
        "checkpoint": settings.checkpoint,
        "var_dir": str(settings.var_dir),
    }
    if any(n["running"] for n in b["nodes"]):
        from onceflow.kafka import cluster
        from onceflow_dev import credentials

        settings = credentials.as_admin(settings) if settings.secured else settings

        try:
            out["topic_problems"] = topics.check(settings)
            out["cluster"] = cluster.describe(settings)
        except Exception as e:  # a broker still starting answers late; report, don't fail
            out["topic_problems"] = [f"could not list topics: {e}"]
    if spark_cluster.started(settings):
        out["spark_cluster"] = spark_cluster.status(settings)
    if postgres.state(settings) is not None:
        info = postgres.state(settings) or {}
        out["postgres"] = {
            "running": postgres.running(settings),
            "port": info.get("port"),
            "roles": sorted(info.get("roles", {})),
        }
    return out


def exports(settings: Settings) -> dict[str, str]:
    """The settings other commands (the job, Airflow, the CLI) must share with this stack."""
    return {
        "ONCEFLOW_BROKERS": str(settings.brokers),
        "ONCEFLOW_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "ONCEFLOW_REPLICATION_FACTOR": str(settings.replication_factor),
        "ONCEFLOW_MIN_INSYNC_REPLICAS": str(settings.min_insync_replicas),
        "ONCEFLOW_MASTER": settings.master,
    } | (
        # the credentials are not printed: they are in the Airflow connections (or the operator's environment)
        {"ONCEFLOW_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "ONCEFLOW_KAFKA_CA_FILE": settings.kafka_ca}
        if settings.secured
        else {}
    )
