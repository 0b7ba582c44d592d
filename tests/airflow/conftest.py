"""Airflow fixtures: a real metadata DB (SQLite, migrated once), DagBag, and a local webhook receiver."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest


@pytest.fixture(scope="session")
def airflow_db():
    out = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]


@pytest.fixture(scope="session")
def dagbag(airflow_db):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag()


class Receiver:
    def __init__(self):
        self.received: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.received.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def alerts(self, prefix: str = "") -> list[dict]:
        return [r["alert"] for r in self.received if r["alert"]["key"].startswith(prefix)]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


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
        monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_KAFKA", json.dumps(
            {"conn_type": "kafka", "extra": {"bootstrap.servers": s.bootstrap_servers}}))
        monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": s.master}))
        monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_WEBHOOK", json.dumps(
            {"conn_type": "http", "host": "127.0.0.1", "port": webhook.port, "schema": "http",
             "extra": {"endpoint": "/alerts"}}))
        return s

    return make
