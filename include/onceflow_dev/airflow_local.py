"""The embedded Airflow: `airflow standalone` with AIRFLOW_HOME under var/, its metadata database on the embedded
PostgreSQL (onceflow_dev.postgres; ONCEFLOW_AIRFLOW_DB=sqlite for a file), the project's DAGs and plugins,
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

from onceflow.config import REPO_ROOT, Settings, instances
from onceflow.rules import names
from onceflow.runtime import procs
from onceflow_dev import postgres
from onceflow_dev.airflow_client import AirflowApiError, AirflowClient
from onceflow_dev.private_files import write_private

# Each app instance's DAGs are `<app_id>_<kind>` (dags/onceflow_*.py, one set per instance of ONCEFLOW_APPS).
WATCH_KINDS = ("health", "txn_watch", "checkpoint_rotation", "reconciliation")
MANUAL_KINDS = ("deploy", "backfill")


def dag_id(s: Settings, kind: str) -> str:
    """The DAG of kind `kind` of the settings' app instance."""
    return names.dag_id(s.app_id, kind)


def watch_dags(s: Settings) -> tuple[str, ...]:
    return tuple(dag_id(s, k) for k in WATCH_KINDS)


def all_dags(s: Settings) -> tuple[str, ...]:
    """Every DAG of every app instance the control plane runs (Settings.apps)."""
    return tuple(names.dag_id(app_id, k) for app_id in instances(s) for k in MANUAL_KINDS + WATCH_KINDS)


USER = "admin"


def home(s: Settings) -> Path:
    return s.var_dir / "airflow"


def pidfile(s: Settings) -> Path:
    return s.run_dir / "airflow.pid"


def env(s: Settings, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Airflow's environment: the onceflow settings (so the DAGs and the job they start see them), its home, the
    project's DAGs and plugins, the simple auth manager's user; `extra` (connections as AIRFLOW_CONN_*, free
    ports for tests) last. Kafka credentials only in the connections (kafka_env): never the caller's own."""
    h = home(s)
    bin_dir = str(Path(sys.executable).parent)
    db = postgres.sql_alchemy_conn(s)  # None: Airflow's default, SQLite under its home
    return {
        **os.environ,
        **s.without_kafka_credentials().as_env(),
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "AIRFLOW_HOME": str(h),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO_ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        # the api-server (UI, REST and execution API) binds the embedded stack's listen address: loopback unless
        # ONCEFLOW_LISTEN_HOST opens it; the scheduler's and triggerer's log servers are not started
        # (onceflow_dev.airflow_standalone)
        "AIRFLOW__API__HOST": s.listen_host,
        "AIRFLOW__API__PORT": str(s.airflow_port),
        "AIRFLOW__API__BASE_URL": f"http://localhost:{s.airflow_port}",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(h / "passwords.json"),
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
        "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "30",
        # A task's calls to the api-server time out after 5 s by default and are retried; on a small machine beside
        # the job that is too short, and a retried XCom write fails the task with 409 (apache/airflow#69956).
        "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",
        **({"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db} if db else {}),
        **(extra or {}),
    }


def _airflow(
    s: Settings, *args: str, check: bool = True, timeout: float = 120, extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    out = subprocess.run(
        [sys.executable, "-m", "airflow", *args], env=env(s, extra), capture_output=True, text=True, timeout=timeout
    )
    if check and out.returncode != 0:
        raise RuntimeError(f"airflow {' '.join(args)} failed:\n{out.stdout[-1500:]}\n{out.stderr[-1500:]}")
    return out


def kafka_env(s: Settings) -> dict[str, str]:
    """On the secured stack, the Kafka connections as AIRFLOW_CONN_* variables (Airflow's environment secrets
    backend, read before its database): per app instance of the control plane (ONCEFLOW_APPS), one per role with
    that instance's principal: `onceflow_kafka` as the control plane's, `onceflow_kafka_<role>` for the job,
    backfills and the reconciliation of the environment's own instance, `onceflow_kafka_<app_id>[_<role>]` for
    another's (onceflow.rules.names.connection_id). Never on a command line. Every instance's principals and ACLs
    are made by `stack up` (or `onceflow --app NAME stack provision`), with the same passwords
    (onceflow_dev.credentials)."""
    if not s.secured:
        return {}
    from onceflow import config
    from onceflow.kafka import acls
    from onceflow.rules import names
    from onceflow_dev import credentials

    extra = {
        "bootstrap.servers": s.bootstrap_servers,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": s.kafka_sasl_mechanism,
        "ssl.ca.location": s.kafka_ca,
    }
    out = {}
    for app_id in config.instances(s):
        instance = s.replace(app_id=app_id)  # its principals' names and passwords only
        known = credentials.ensure(instance)
        for role in acls.ROLES:
            conn_id = names.connection_id(s.kafka_conn_id, app_id, role, own=app_id == s.app_id)
            user = acls.username(instance, role)
            spec = {"conn_type": "kafka", "login": user, "password": known[user], "extra": extra}
            out[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps(spec)
    return out


def database_env(s: Settings) -> dict[str, str]:
    """When the embedded PostgreSQL serves apps' sinks (`stack up --postgres`): each instance's job and reader roles
    as AIRFLOW_CONN_ONCEFLOW_POSTGRES_<APP_ID>_<PURPOSE> (type postgres), as the Kafka ones are given (kafka_env)."""
    if not postgres.serves_sinks(s):
        return {}
    from onceflow import config
    from onceflow.rules import names

    info = postgres.state(s) or {}
    out = {}
    for app_id in config.instances(s):
        for purpose in ("job", "reader"):
            role = names.db_role(app_id, purpose)
            if role not in info.get("roles", {}):
                continue
            spec = {
                "conn_type": "postgres",
                "host": "127.0.0.1",
                "port": info["port"],
                "login": role,
                "password": info["roles"][role],
                "schema": s.postgres_database,
            }
            out[f"AIRFLOW_CONN_{names.db_connection_id(app_id, purpose).upper()}"] = json.dumps(spec)
    return out


def password_file(s: Settings) -> Path:
    """The embedded Airflow's admin password (its simple auth manager's file): 0600, printed by nobody."""
    return home(s) / "passwords.json"


def password(s: Settings) -> str:
    f = password_file(s)
    if not f.exists():
        write_private(f, json.dumps({USER: secrets.token_urlsafe(12)}))
    return json.loads(f.read_text())[USER]


def local_url(s: Settings) -> str:
    """The api-server as this machine reaches it: at the address it binds (ONCEFLOW_LISTEN_HOST), or loopback when
    that is every interface."""
    import ipaddress

    addr = ipaddress.ip_address(s.listen_host)
    if addr.is_unspecified:
        return f"http://127.0.0.1:{s.airflow_port}"
    return f"http://[{addr}]:{s.airflow_port}" if addr.version == 6 else f"http://{addr}:{s.airflow_port}"


def _healthy(s: Settings) -> bool:
    try:
        with urllib.request.urlopen(f"{local_url(s)}/api/v2/monitor/health", timeout=3) as r:
            return r.status == 200
    except OSError:
        return False


def up(s: Settings, trigger_deploy: bool = True, timeout: float = 300, extra_env: dict[str, str] | None = None) -> dict:
    """Start Airflow as `make run` does: `airflow standalone` (api-server, scheduler, dag-processor, triggerer)
    with the connections to the embedded Kafka and Spark, every onceflow DAG unpaused, and (by default) the deploy
    DAG triggered to start the job."""
    pw = password(s)
    if s.airflow_db == "postgres":
        postgres.up(s)  # before anything reads env(s): it carries the connection string
    if not procs.read_pidfile(pidfile(s)):
        _airflow(s, "db", "migrate", timeout=300, extra=extra_env)
        conns = {
            s.kafka_conn_id: {"conn_type": "kafka", "extra_dejson": {"bootstrap.servers": s.bootstrap_servers}},
            s.spark_conn_id: {"conn_type": "spark", "host": "local[*]"},
        }
        if s.secured:  # the Kafka connections carry passwords: Airflow gets them in its environment (kafka_env)
            conns.pop(s.kafka_conn_id)
        # one `airflow` process for all of them (each takes seconds to start): no password in the file
        conn_file = home(s) / "connections.json"
        conn_file.parent.mkdir(parents=True, exist_ok=True)
        conn_file.write_text(json.dumps(conns, indent=1))
        out = _airflow(s, "connections", "import", "--overwrite", str(conn_file), extra=extra_env)
        missing = [c for c in conns if f"Imported connection {c}" not in out.stdout]
        if missing:  # the command reports a connection it could not import and still exits 0
            raise RuntimeError(f"airflow connections import did not import {missing}:\n{out.stdout[-1500:]}")
        proc = procs.spawn_detached(
            [sys.executable, "-m", "onceflow_dev.airflow_standalone"],  # `airflow standalone`, no log servers
            s.log_dir / "airflow.log",
            env=env(s, kafka_env(s) | database_env(s) | (extra_env or {})),
        )
        procs.write_pidfile(pidfile(s), proc.pid, "airflow")
    procs.wait_until(lambda: _healthy(s), timeout, interval=2, what=f"Airflow at port {s.airflow_port}")
    # The DAGs exist for the API once the dag-processor has parsed them.
    api = client(s)

    def parsed():
        try:
            return {d["dag_id"] for d in api.dags()} >= set(all_dags(s))
        except (OSError, AirflowApiError):
            return False

    procs.wait_until(parsed, timeout, interval=3, what="the onceflow DAGs to be parsed")
    for d in all_dags(s):  # manual DAGs too: a paused DAG's triggered runs would wait
        api.unpause(d)
    if trigger_deploy:
        api.trigger(dag_id(s, "deploy"), {"action": "start"}, note="make run: start the job")
    return {
        "url": f"http://localhost:{s.airflow_port}",
        "user": USER,
        "password": pw,  # for the caller; `onceflow-dev airflow up` prints where it is instead
        "password_file": str(password_file(s)),
        "airflow_home": str(home(s)),
        "log": str(s.log_dir / "airflow.log"),
    }


def client(s: Settings) -> AirflowClient:
    """A REST client of the embedded Airflow, logged in as its admin user."""
    return AirflowClient(local_url(s), USER, password(s))


def down(s: Settings) -> bool:
    """Stop Airflow (its whole process group), then the batch jobs its tasks had started, which run in process
    groups of their own."""
    from onceflow.runtime import batch_jobs

    info = procs.read_pidfile(pidfile(s))
    if info:
        procs.stop_process(info["pid"], 60)
        pidfile(s).unlink(missing_ok=True)
    batch_jobs.stop_all(s)
    if not postgres.serves_sinks(s):  # else the stack's own `down` stops it, after the jobs writing to it
        postgres.down(s)  # after Airflow: its processes hold connections to it
    return bool(info)


def wait_job_started(s: Settings, timeout: float = 420):
    from onceflow.runtime import jobctl

    def started():
        st = jobctl.status(s)
        return st if st.running and st.committed_batches else None

    return procs.wait_until(started, timeout, interval=3, what="the deploy DAG to start the job")


__all__ = ["up", "down", "env", "wait_job_started", "time"]
