"""The embedded Airflow: `airflow standalone` with AIRFLOW_HOME under var/, the project's DAGs and plugins,
connections to the embedded Kafka and Spark, the control-plane DAGs unpaused and the deploy DAG triggered."""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from . import procs
from .config import REPO_ROOT, Settings

DEPLOY_DAG = "ip_count_deploy"
WATCH_DAGS = ("ip_count_health", "ip_count_txn_watch", "ip_count_checkpoint_rotation", "ip_count_reconciliation")
MANUAL_DAGS = ("ip_count_backfill",)
ALL_DAGS = (DEPLOY_DAG,) + WATCH_DAGS + MANUAL_DAGS
USER = "admin"


def home(s: Settings) -> Path:
    return s.var_dir / "airflow"


def pidfile(s: Settings) -> Path:
    return s.run_dir / "airflow.pid"


def env(s: Settings) -> dict[str, str]:
    h = home(s)
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, **s.as_env(),
            "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
            "AIRFLOW_HOME": str(h),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO_ROOT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__API__PORT": str(s.airflow_port),
            "AIRFLOW__API__BASE_URL": f"http://localhost:{s.airflow_port}",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(h / "passwords.json"),
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
            "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "30"}


def _airflow(s: Settings, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "airflow", *args], env=env(s), capture_output=True, text=True,
                         timeout=timeout)
    if check and out.returncode != 0:
        raise RuntimeError(f"airflow {' '.join(args)} failed:\n{out.stdout[-1500:]}\n{out.stderr[-1500:]}")
    return out


def password(s: Settings) -> str:
    f = home(s) / "passwords.json"
    if not f.exists():
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps({USER: secrets.token_urlsafe(12)}))
    return json.loads(f.read_text())[USER]


def _healthy(s: Settings) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{s.airflow_port}/api/v2/monitor/health", timeout=3) as r:
            return r.status == 200
    except OSError:
        return False


def up(s: Settings, trigger_deploy: bool = True, timeout: float = 300) -> dict:
    pw = password(s)
    if not procs.read_pidfile(pidfile(s)):
        _airflow(s, "db", "migrate", timeout=300)
        conns = {s.kafka_conn_id: {"conn_type": "kafka", "extra": {"bootstrap.servers": s.bootstrap_servers}},
                 s.spark_conn_id: {"conn_type": "spark", "host": "local[*]"}}
        for conn_id, spec in conns.items():
            _airflow(s, "connections", "delete", conn_id, check=False)
            _airflow(s, "connections", "add", conn_id, "--conn-json", json.dumps(spec))
        proc = procs.spawn_detached([sys.executable, "-m", "airflow", "standalone"], s.log_dir / "airflow.log",
                                    env=env(s))
        procs.write_pidfile(pidfile(s), proc.pid, "airflow")
    procs.wait_until(lambda: _healthy(s), timeout, interval=2, what=f"Airflow at port {s.airflow_port}")
    # The DAGs exist for the CLI once the dag-processor has parsed them.
    procs.wait_until(lambda: _airflow(s, "dags", "unpause", DEPLOY_DAG, check=False).returncode == 0, timeout,
                     interval=5, what=f"the DAG {DEPLOY_DAG} to be parsed")
    for dag_id in WATCH_DAGS + MANUAL_DAGS:  # manual DAGs too: a paused DAG's triggered runs would wait
        _airflow(s, "dags", "unpause", dag_id, check=False)
    if trigger_deploy:
        _airflow(s, "dags", "trigger", DEPLOY_DAG, "--conf", json.dumps({"action": "start"}))
    return {"url": f"http://localhost:{s.airflow_port}", "user": USER, "password": pw,
            "airflow_home": str(home(s)), "log": str(s.log_dir / "airflow.log")}


def down(s: Settings) -> bool:
    info = procs.read_pidfile(pidfile(s))
    if not info:
        return False
    procs.stop_process(info["pid"], 60)
    pidfile(s).unlink(missing_ok=True)
    return True


def wait_job_started(s: Settings, timeout: float = 420) -> dict:
    from . import jobctl

    def started():
        st = jobctl.status(s)
        return st if st["running"] and st.get("committed_batches") else None

    return procs.wait_until(started, timeout, interval=3, what="the deploy DAG to start the job")


__all__ = ["up", "down", "env", "wait_job_started", "time"]
