"""A single-node Apache Kafka broker in KRaft mode (broker + controller in one JVM), run from Maven jars."""

from __future__ import annotations

import base64
import logging
import shutil
import socket
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from onceflow.config import Settings
from onceflow.runtime import jvm, procs

log = logging.getLogger(__name__)
MAIN_CLASS = "kafka.Kafka"

LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = FILE
logger.coordinator.name = kafka.coordinator.transaction
logger.coordinator.level = info
"""


class BrokerError(RuntimeError):
    pass


@dataclass(frozen=True)
class BrokerPaths:
    home: Path

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def properties(self) -> Path:
        return self.home / "server.properties"

    @property
    def log4j(self) -> Path:
        return self.home / "log4j2.properties"

    @property
    def pidfile(self) -> Path:
        return self.home / "broker.pid"

    @property
    def stdout(self) -> Path:
        return self.home / "broker.out"

    @property
    def server_log(self) -> Path:
        return self.home / "server.log"


def paths(settings: Settings) -> BrokerPaths:
    return BrokerPaths(settings.var_dir / "kafka")


def server_properties(settings: Settings, data_dir: Path) -> dict[str, str]:
    host, port = settings.bootstrap_host_port
    ctl = f"{host}:{settings.controller_port}"
    return {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{ctl}",
        "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{ctl}",
        "advertised.listeners": f"PLAINTEXT://{host}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(data_dir),
        "auto.create.topics.enable": "false",
        "num.partitions": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "4",
        "group.initial.rebalance.delay.ms": "0",
        "transaction.max.timeout.ms": str(settings.broker_transaction_max_timeout_ms),
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": str(settings.broker_txn_abort_check_interval_ms),
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
    }


def _port_open(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def _java() -> str:
    java = shutil.which("java")
    if not java:
        raise BrokerError("java is not on PATH: install OpenJDK 17 (apt-get install openjdk-17-jre-headless)")
    return java


def status(settings: Settings) -> dict:
    p = paths(settings)
    info = procs.read_pidfile(p.pidfile)
    host, port = settings.bootstrap_host_port
    return {
        "running": info is not None,
        "pid": info["pid"] if info else None,
        "bootstrap_servers": settings.bootstrap_servers,
        "listening": _port_open(host, port),
        "home": str(p.home),
        "log": str(p.server_log),
    }


def start(settings: Settings, timeout: float = 90.0) -> dict:
    """Start the broker unless it already runs; return once it answers metadata requests."""
    p = paths(settings)
    if procs.read_pidfile(p.pidfile):
        _wait_ready(settings, timeout)
        return status(settings)
    host, port = settings.bootstrap_host_port
    for prt in (port, settings.controller_port):
        if _port_open(host, prt):
            raise BrokerError(
                f"port {host}:{prt} is taken by another process: stop it, or set "
                f"ONCEFLOW_BOOTSTRAP_SERVERS / ONCEFLOW_CONTROLLER_PORT to free ports"
            )
    classpath = jvm.kafka_classpath(settings)
    p.home.mkdir(parents=True, exist_ok=True)
    props = server_properties(settings, p.data)
    p.properties.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    p.log4j.write_text(LOG4J2.format(log=p.server_log, level="INFO"))
    java = _java()
    jvm_opts = [
        f"-Xmx{settings.broker_heap}",
        f"-Xms{settings.broker_heap}",
        "-XX:+UseG1GC",
        f"-Dlog4j2.configurationFile={p.log4j}",
        "-Djava.awt.headless=true",
    ]
    if not (p.data / "meta.properties").exists():
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        fmt = subprocess.run(
            [
                java,
                *jvm_opts,
                "-cp",
                classpath,
                "kafka.tools.StorageTool",
                "format",
                f"--cluster-id={cluster_id}",
                "-c",
                str(p.properties),
                "--feature",
                "transaction.version=2",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if fmt.returncode != 0:
            raise BrokerError(f"formatting the KRaft storage failed:\n{fmt.stdout}\n{fmt.stderr}")
    proc = procs.spawn_detached([java, *jvm_opts, "-cp", classpath, MAIN_CLASS, str(p.properties)], p.stdout)
    procs.write_pidfile(p.pidfile, proc.pid, MAIN_CLASS, bootstrap=settings.bootstrap_servers)
    try:
        _wait_ready(settings, timeout, proc)
    except Exception:
        stop(settings)
        raise
    log.info("kafka broker up at %s (pid %s)", settings.bootstrap_servers, proc.pid)
    return status(settings)


def _wait_ready(settings: Settings, timeout: float, proc: subprocess.Popen | None = None) -> None:
    from onceflow.kafka import clients as kafka_clients

    admin = None

    def ready() -> bool:
        nonlocal admin
        if proc is not None and proc.poll() is not None:
            raise BrokerError(
                f"the broker exited with code {proc.returncode}; see {paths(settings).stdout} "
                f"and {paths(settings).server_log}"
            )
        host, port = settings.bootstrap_host_port
        if not _port_open(host, port):  # quiet: librdkafka logs every refused connection
            return False
        try:
            admin = admin or kafka_clients.admin(settings)
            md = admin.list_topics(timeout=2)
            return len(md.brokers) > 0
        except Exception:
            return False

    procs.wait_until(ready, timeout, interval=0.5, what=f"the Kafka broker at {settings.bootstrap_servers}")


def stop(settings: Settings, timeout: float = 60.0) -> bool:
    """Stop gracefully (controlled shutdown); True if a broker was running."""
    p = paths(settings)
    info = procs.read_pidfile(p.pidfile)
    if not info:
        p.pidfile.unlink(missing_ok=True)
        return False
    procs.stop_process(info["pid"], timeout)
    p.pidfile.unlink(missing_ok=True)
    return True


def kill(settings: Settings) -> bool:
    """kill -9 the broker (chaos and tests); a later start() recovers its logs."""
    import signal

    info = procs.read_pidfile(paths(settings).pidfile)
    if not info:
        return False
    procs.signal_group(info["pid"], signal.SIGKILL)
    procs.wait_until(lambda: not procs.pid_alive(info["pid"]), 20, what="the broker to die")
    return True
