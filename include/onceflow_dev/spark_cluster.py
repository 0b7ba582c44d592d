"""A Spark standalone cluster for the embedded stack: a master and N workers from the pyspark distribution, each
worker running its own executor JVM, on loopback. The streaming job, the reconciliation recount and backfills are
submitted to it in client mode (their driver runs where they are launched) by the same launch spec as in local
mode, with `ONCEFLOW_MASTER=spark://host:port`. The checkpoint is a local path every worker reaches (they share
this machine); on a real cluster it is HDFS or S3A (docs/cluster.md)."""

from __future__ import annotations

import ipaddress
import logging
from pathlib import Path
from urllib.parse import urlparse

from onceflow.config import Settings
from onceflow.runtime import launcher, procs
from onceflow.wire import OnceflowError

log = logging.getLogger(__name__)
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


class SparkClusterError(OnceflowError):
    pass


def home(settings: Settings) -> Path:
    return settings.var_dir / "spark"


def master_address(settings: Settings) -> tuple[str, int]:
    u = urlparse(settings.master)
    if u.scheme != "spark" or not u.hostname or not u.port:
        raise SparkClusterError(
            f"ONCEFLOW_MASTER={settings.master!r} is not a standalone master (spark://host:port): set it, e.g. "
            f"spark://127.0.0.1:7077, to run the embedded Spark cluster"
        )
    return u.hostname, u.port


def _spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


def _pidfile(settings: Settings, name: str) -> Path:
    return home(settings) / f"{name}.pid"


def _spawn(settings: Settings, name: str, args: list[str]) -> int:
    # the master and the workers never talk to Kafka: the job's principal reaches executors with the plan
    env = launcher.submit_env(settings.without_kafka_credentials()) | {
        "SPARK_LOG_DIR": str(home(settings) / "logs"),
        "SPARK_NO_DAEMONIZE": "1",
        # The master's REST submission server (on by default in Spark 4, port 6066 on every interface without
        # SPARK_LOCAL_IP) accepts unauthenticated submissions, and onceflow submits in client mode: off.
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
    }
    # --host binds the RPC endpoints; the web UIs (master, workers) bind SPARK_LOCAL_IP, or every interface without
    # it. The embedded stack's listen address (loopback unless ONCEFLOW_LISTEN_HOST opens it) for all of them; the
    # executors a worker starts inherit it.
    if not ipaddress.ip_address(settings.listen_host).is_unspecified:
        env["SPARK_LOCAL_IP"] = settings.listen_host
    else:
        env.pop("SPARK_LOCAL_IP", None)
    proc = procs.spawn_detached([_spark_class(), *args], home(settings) / f"{name}.log", env=env)
    procs.write_pidfile(_pidfile(settings, name), proc.pid, args[0])
    return proc.pid


def start(settings: Settings, workers: int, worker_memory: str = "4g", cores: int = 2, timeout: float = 120.0) -> dict:
    """The master, then `workers` workers with `cores` cores each (more than this machine has, as a cluster's
    slots: the streaming job takes ONCEFLOW_CORES_MAX of them, the recount and backfills the rest); returns once
    every worker has registered."""
    host, port = master_address(settings)
    home(settings).mkdir(parents=True, exist_ok=True)
    if not procs.read_pidfile(_pidfile(settings, "master")):
        ui = procs.free_port()
        # the UI binds the listen address (_spawn), or every interface: reachable at the master's host then
        ui_host = host if ipaddress.ip_address(settings.listen_host).is_unspecified else settings.listen_host
        (home(settings) / "master.ui").write_text(f"{ui_host} {ui}")
        (home(settings) / "master.url").write_text(settings.master)
        _spawn(settings, "master", [MASTER_CLASS, "--host", host, "--port", str(port), "--webui-port", str(ui)])
    for i in range(1, workers + 1):
        name = f"worker-{i}"
        if procs.read_pidfile(_pidfile(settings, name)):
            continue
        _spawn(
            settings,
            name,
            [
                WORKER_CLASS,
                settings.master,
                "--host",
                host,
                "--cores",
                str(cores),
                "--memory",
                worker_memory,
                "--work-dir",
                str(home(settings) / name),
                "--webui-port",
                str(procs.free_port()),
            ],
        )
    procs.wait_until(
        lambda: len(registered(settings)) >= workers,
        timeout,
        interval=1,
        what=f"{workers} Spark workers to register with {settings.master}",
    )
    return status(settings)


def registered(settings: Settings) -> list[str]:
    """The workers the master reports ALIVE (its web UI's JSON)."""
    import json
    import urllib.request

    try:
        host, ui = (home(settings) / "master.ui").read_text().split()  # written at start: any settings find it
        with urllib.request.urlopen(f"http://{host}:{int(ui)}/json/", timeout=5) as r:
            return [w["id"] for w in json.loads(r.read()).get("workers", []) if w.get("state") == "ALIVE"]
    except (OSError, ValueError):
        return []


def started(settings: Settings) -> bool:
    return home(settings).exists() and any(home(settings).glob("*.pid"))


def status(settings: Settings) -> dict:
    running: dict[str, int | None] = {}
    for f in sorted(home(settings).glob("*.pid")) if home(settings).exists() else []:
        info = procs.read_pidfile(f)
        running[f.stem] = info["pid"] if info else None
    url = home(settings) / "master.url"
    master = url.read_text() if url.exists() else settings.master
    return {"master": master, "processes": running, "alive_workers": len(registered(settings))}


def kill_worker(settings: Settings, i: int) -> int | None:
    """kill -9 worker i and its executor (chaos: executor loss in the middle of a batch)."""
    import signal

    info = procs.read_pidfile(_pidfile(settings, f"worker-{i}"))
    if not info:
        return None
    procs.signal_group(int(info["pid"]), signal.SIGKILL)
    return int(info["pid"])


def stop(settings: Settings, timeout: float = 30.0) -> bool:
    """Workers first, then the master."""
    stopped = False
    for f in sorted(home(settings).glob("worker-*.pid"), reverse=True) + [_pidfile(settings, "master")]:
        info = procs.read_pidfile(f)
        if info:
            procs.stop_process(int(info["pid"]), timeout)
            stopped = True
        f.unlink(missing_ok=True)
    return stopped
