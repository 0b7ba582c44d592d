"""Shared fixtures: one local Spark session and one real Kafka broker (KRaft) for the whole run.

Each integration test gets its own app id and topics on the shared broker, so tests stay independent while
the suite pays for one broker start. Everything started here is stopped at the end of the session.
"""
from __future__ import annotations

import gc
import os
import tempfile
import uuid
from pathlib import Path

# Airflow reads its home at import time: give the test session its own, before anything imports airflow.
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="onceflow-airflow-"))
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(Path(__file__).resolve().parents[1] / "dags")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"

import pytest

from onceflow import config
from onceflow.kafka import topics
from onceflow.runtime import jobctl, jvm, procs
from onceflow_dev import broker

free_port = procs.free_port  # tests import it from here


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    jars = ",".join(str(j) for j in jvm.spark_kafka_jars(config.load(env={})))  # for the batch jobs' Kafka reads
    s = (SparkSession.builder.master("local[2]").appName("onceflow-tests").config("spark.jars", jars)
         .config("spark.sql.session.timeZone", "UTC").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def kafka(tmp_path_factory):
    """A real single-node KRaft broker on free loopback ports, started once per test session."""
    var = tmp_path_factory.mktemp("var")
    base = config.load(env={}, var_dir=var, bootstrap_servers=f"127.0.0.1:{free_port()}",
                       controller_port=free_port(), broker_txn_abort_check_interval_ms=1000,
                       broker_transaction_max_timeout_ms=300_000, trigger_interval_s=1.0,
                       restart_delay_s=1.0, restart_attempts=5, transaction_timeout_ms=60_000)
    broker.start(base)
    jvm.spark_kafka_jars(base)  # resolve Spark's connector once, up front (Maven on a fresh machine)
    started: list[config.Settings] = []
    base_apps = {"apps": started}
    yield base, base_apps
    for s in started:
        try:
            jobctl.stop(s, timeout=30)
        except Exception:
            pass
    # Destroy clients still referenced from cycles while the broker is up, so none retries a dead port at exit.
    gc.collect()
    broker.stop(base)


@pytest.fixture
def app(kafka, request):
    """Settings for one test's own app: its own topics, checkpoint and transactional id on the shared broker."""
    base, reg = kafka
    name = request.node.name.replace("[", "_").replace("]", "").replace("-", "_")[:40] + "_" + uuid.uuid4().hex[:6]

    def make(**overrides) -> config.Settings:
        s = base.replace(app_id=name, source_topic=f"{name}.source", sink_topic=f"{name}.sink",
                         dlq_topic=f"{name}.dlq", ledger_topic=f"{name}.ledger", events_topic=f"{name}.events",
                         alerts_topic=f"{name}.alerts", health_topic=f"{name}.health",
                         reconciliation_topic=f"{name}.recon", backfill_topic=f"{name}.backfill",
                         **overrides)
        topics.ensure(s)
        reg["apps"].append(s)
        return s

    return make
