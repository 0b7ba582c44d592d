"""Airflow fixtures: a real metadata DB (SQLite, migrated once), DagBag, and a local webhook receiver."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from onceflow_dev.webhook_receiver import Receiver


@pytest.fixture(scope="session")
def airflow_db():
    out = subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]


@pytest.fixture(scope="session")
def dagbag(airflow_db):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag()


@pytest.fixture
def webhook():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def airflow_app(app, monkeypatch, webhook, airflow_db):
    """An app whose settings and connections the DAGs see: ONCEFLOW_* and AIRFLOW_CONN_* in the environment."""

    def make(**overrides):
        s = app(alert_channels="webhook", **overrides)
        for k, v in s.as_env().items():
            monkeypatch.setenv(k, v)
        monkeypatch.setenv(
            "AIRFLOW_CONN_ONCEFLOW_KAFKA",
            json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": s.bootstrap_servers}}),
        )
        monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": s.master}))
        monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_WEBHOOK", json.dumps(webhook.connection()))
        return s

    return make
