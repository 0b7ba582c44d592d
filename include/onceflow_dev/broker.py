"""The embedded Kafka: Apache Kafka in KRaft mode run from Maven jars, one node or a cluster.

Each node is a broker and a controller in one JVM (`ONCEFLOW_BROKERS`, default 1; 3 gives a controller quorum of
three). Node i listens on the ports `Settings.kafka_nodes()` gives it; every node is formatted with the same cluster
id and transactions v2. With more than one node the internal topics (offsets, transaction state) are replicated
three ways with `min.insync.replicas=2`, like the platform's own topics (onceflow.kafka.topics).
"""

from __future__ import annotations

import base64
import logging
import shutil
import signal
import socket
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from onceflow.config import REPO_ROOT, Settings
from onceflow.kafka import acls
from onceflow.runtime import jvm, procs
from onceflow.wire import OnceflowError
from onceflow_dev.private_files import write_private

DEV_POMS = REPO_ROOT / "jvm"  # the embedded stack's JVM sets (the Kafka broker; Flink's job for the bench)


def kafka_classpath(settings: Settings) -> str:
    """The Kafka broker's jars (and its tools': kafka-acls, the transactions command), resolved from Maven Central."""
    return str(jvm.resolve("kafka-broker", settings, DEV_POMS) / "*")


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


class BrokerError(OnceflowError):
    pass


# the features a node's storage is formatted with: transactions v2 (KIP-890's server-side defence)
FORMAT_FEATURES = ("transaction.version=2",)


@dataclass(frozen=True)
class Node:
    """One KRaft node (broker + controller) of the embedded stack, and where its files are."""

    id: int
    host: str
    port: int
    controller_port: int
    home: Path

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

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


def nodes(settings: Settings) -> list[Node]:
    """The nodes: one keeps its files in var/kafka (as it always did), several in var/kafka/node-<id>."""
    root = settings.var_dir / "kafka"
    out = settings.kafka_nodes()
    return [Node(i, h, p, c, root if len(out) == 1 else root / f"node-{i}") for i, h, p, c in out]


def node(settings: Settings, node_id: int = 1) -> Node:
    return next(n for n in nodes(settings) if n.id == node_id)


def paths(settings: Settings) -> Node:
    """The first node's files (the only node's, on a one-node stack)."""
    return nodes(settings)[0]


def server_properties(settings: Settings, n: Node, quorum: list[Node]) -> dict[str, str]:
    rf = str(min(3, len(quorum)))
    isr = str(min(2, len(quorum)))
    return (
        {
            "process.roles": "broker,controller",
            "node.id": str(n.id),
            "controller.quorum.voters": ",".join(f"{q.id}@{q.host}:{q.controller_port}" for q in quorum),
            "listeners": f"PLAINTEXT://{n.host}:{n.port},CONTROLLER://{n.host}:{n.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{n.host}:{n.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(n.data),
            "auto.create.topics.enable": "false",
            "num.partitions": "1",
            "default.replication.factor": rf,
            "min.insync.replicas": isr,
            "offsets.topic.replication.factor": rf,
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": isr,
            "transaction.state.log.num.partitions": "4",
            "group.initial.rebalance.delay.ms": "0",
            "transaction.max.timeout.ms": str(settings.broker_transaction_max_timeout_ms),
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": str(
                settings.broker_txn_abort_check_interval_ms
            ),
            "share.coordinator.state.topic.replication.factor": rf,
            "share.coordinator.state.topic.min.isr": isr,
            # a node that comes back catches up from the others; an out-of-sync replica is never made leader
            "unclean.leader.election.enable": "false",
        }
        | (secured_properties(settings, n) if settings.secured else {})
        | (
            {
                # a killed node is fenced (its partitions and coordinators move) after 6 s without a heartbeat, not
                # Kafka's 9 s: a transaction open at that moment survives the failover inside its timeout. Not on one
                # node: there is nowhere to fail over to, and a node paused for longer would fence itself on waking
                "broker.heartbeat.interval.ms": "1000",
                "broker.session.timeout.ms": "6000",
            }
            if len(quorum) > 1
            else {}
        )
    )


def secured_properties(settings: Settings, n: Node) -> dict[str, str]:
    """SASL_SSL for clients and between brokers (SCRAM, the stack's admin as the brokers' own user), TLS with client
    certificates on the controller listener (KRaft cannot use SCRAM there: the credentials live in the metadata it
    serves), and Kafka's StandardAuthorizer: nothing is allowed that no ACL allows (onceflow.kafka.acls)."""
    from onceflow_dev import credentials, tls

    admin_pw = credentials.ensure(settings)[acls.ADMIN]
    jaas = f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{acls.ADMIN}" password="{admin_pw}";'
    mech = settings.kafka_sasl_mechanism
    return {
        "listeners": f"SASL_SSL://{n.host}:{n.port},CONTROLLER://{n.host}:{n.controller_port}",
        "advertised.listeners": f"SASL_SSL://{n.host}:{n.port}",
        "inter.broker.listener.name": "SASL_SSL",
        "listener.security.protocol.map": "CONTROLLER:SSL,SASL_SSL:SASL_SSL",
        "sasl.enabled.mechanisms": mech,
        "sasl.mechanism.inter.broker.protocol": mech,
        f"listener.name.sasl_ssl.{mech.lower()}.sasl.jaas.config": jaas,
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(tls.keystore(settings)),
        "ssl.keystore.password": tls.store_password(settings),
        "ssl.key.password": tls.store_password(settings),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(tls.ca_pem(settings)),
        "listener.name.controller.ssl.client.auth": "required",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": f"User:{acls.ADMIN};{tls.BROKER_PRINCIPAL}",
        "allow.everyone.if.no.acl.found": "false",
    }


def _port_open(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def java() -> str:
    java = shutil.which("java")
    if not java:
        raise BrokerError("java is not on PATH: install OpenJDK 17 (apt-get install openjdk-17-jre-headless)")
    return java


def node_status(n: Node) -> dict:
    info = procs.read_pidfile(n.pidfile)
    return {
        "node_id": n.id,
        "address": n.address,
        "controller": f"{n.host}:{n.controller_port}",
        "running": info is not None,
        "pid": info["pid"] if info else None,
        "listening": _port_open(n.host, n.port),
        "home": str(n.home),
        "log": str(n.server_log),
    }


def status(settings: Settings) -> dict:
    """The stack's nodes; `running` when every node runs (one node's fields at the top level, as before)."""
    each = [node_status(n) for n in nodes(settings)]
    first = each[0]
    return {
        "running": all(x["running"] for x in each),
        "pid": first["pid"],
        "bootstrap_servers": settings.bootstrap_servers,
        "listening": first["listening"],
        "home": first["home"],
        "log": first["log"],
        "nodes": each,
    }


def _cluster_id(settings: Settings) -> str:
    """One id for every node of the cluster, made once and kept."""
    f = settings.var_dir / "kafka" / "cluster.id"
    if not f.exists():
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("="))
    return f.read_text().strip()


def start(settings: Settings, timeout: float = 120.0) -> dict:
    """Start every node that does not run yet; return once the cluster answers with all its brokers."""
    quorum = nodes(settings)
    launched: dict[int, subprocess.Popen] = {}
    for n in quorum:
        if not procs.read_pidfile(n.pidfile):
            launched[n.id] = _launch(settings, n, quorum)
    _wait_ready(settings, timeout, launched)
    log.info("kafka up at %s (%d node(s))", settings.bootstrap_servers, len(quorum))
    return status(settings)


def start_node(settings: Settings, node_id: int, wait: bool = True, timeout: float = 120.0) -> dict:
    """Start one node (after a kill: it recovers its logs and catches up from the others)."""
    quorum = nodes(settings)
    n = next(x for x in quorum if x.id == node_id)
    if procs.read_pidfile(n.pidfile):
        return node_status(n)
    proc = _launch(settings, n, quorum)
    if wait:
        try:
            _wait_ready(settings, timeout, {n.id: proc})
        except Exception:
            stop_node(settings, n.id)
            raise
    return node_status(n)


def _launch(settings: Settings, n: Node, quorum: list[Node]) -> subprocess.Popen:
    """Format the node's storage on its first start, then start its JVM (detached, with a pid file)."""
    for prt in (n.port, n.controller_port):
        if _port_open(n.host, prt):
            raise BrokerError(
                f"port {n.host}:{prt} is taken by another process: stop it, or set "
                f"ONCEFLOW_BOOTSTRAP_SERVERS / ONCEFLOW_CONTROLLER_PORT to free ports"
            )
    classpath = kafka_classpath(settings)
    n.home.mkdir(parents=True, exist_ok=True)
    if settings.secured:
        from onceflow_dev import tls

        tls.ensure(settings)
    # the secured stack's holds the brokers' own password
    write_private(n.properties, "".join(f"{k}={v}\n" for k, v in server_properties(settings, n, quorum).items()))
    n.log4j.write_text(LOG4J2.format(log=n.server_log, level="INFO"))
    java_bin = java()
    jvm_opts = [
        f"-Xmx{settings.broker_heap}",
        f"-Xms{settings.broker_heap}",
        "-XX:+UseG1GC",
        f"-Dlog4j2.configurationFile={n.log4j}",
        "-Djava.awt.headless=true",
    ]
    if not (n.data / "meta.properties").exists():
        # the tool's arguments in a 0600 argument file the JVM reads (`java @file`): on a secured stack they carry
        # the admin's password, which a command line would show to every local user
        args = n.properties.with_name("format.args")
        tool = ["kafka.tools.StorageTool", "format", f"--cluster-id={_cluster_id(settings)}", "-c", str(n.properties)]
        tool += [a for f in FORMAT_FEATURES for a in ("--feature", f)] + _scram_bootstrap(settings)
        write_private(args, "\n".join(_argfile_quote(a) for a in tool) + "\n")
        try:
            fmt = subprocess.run(
                [java_bin, *jvm_opts, "-cp", classpath, f"@{args}"], capture_output=True, text=True, timeout=120
            )
        finally:
            args.unlink(missing_ok=True)
        if fmt.returncode != 0:
            raise BrokerError(f"formatting the KRaft storage of node {n.id} failed:\n{fmt.stdout}\n{fmt.stderr}")
    proc = procs.spawn_detached([java_bin, *jvm_opts, "-cp", classpath, MAIN_CLASS, str(n.properties)], n.stdout)
    procs.write_pidfile(n.pidfile, proc.pid, MAIN_CLASS, bootstrap=n.address, node_id=n.id)
    return proc


def _argfile_quote(arg: str) -> str:
    """One argument of a java @-file: quoted, with the file format's escapes."""
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _scram_bootstrap(settings: Settings) -> list[str]:
    """The admin's SCRAM credential, written into the metadata at format (KIP-900): the brokers authenticate to
    each other with it before any user could be created over the wire."""
    if not settings.secured:
        return []
    from onceflow_dev import credentials

    pw = credentials.ensure(settings)[acls.ADMIN]
    return ["--add-scram", f"{settings.kafka_sasl_mechanism}=[name={acls.ADMIN},password={pw}]"]


def _wait_ready(settings: Settings, timeout: float, launched: dict[int, subprocess.Popen] | None = None) -> None:
    """Until the cluster's metadata lists every running node (a one-node stack: its broker). A node launched here
    that exits fails at once; either failure quotes the nodes' last errors, so a CI log says why."""
    from onceflow.kafka import clients as kafka_clients

    admin = None
    quorum = nodes(settings)
    seen = "no node running"

    def ready() -> bool:
        nonlocal admin, seen
        for node_id, proc in (launched or {}).items():
            if proc.poll() is not None:
                n = node(settings, node_id)
                raise BrokerError(
                    f"node {node_id} exited with code {proc.returncode}; see {n.stdout} and {n.server_log}"
                    + _last_errors(quorum)
                )
        up = [n for n in quorum if procs.read_pidfile(n.pidfile)]
        closed = [n.address for n in up if not _port_open(n.host, n.port)]
        if not up or closed:  # quiet: librdkafka logs refused connects
            seen = f"nothing listens at {', '.join(closed)}" if up else "no node running"
            return False
        try:
            admin = admin or kafka_clients.admin(_as_admin(settings))
            md = admin.list_topics(timeout=2)
            seen = f"the metadata lists brokers {sorted(md.brokers)}"
            return {n.id for n in up} <= set(md.brokers)
        except Exception as e:
            seen = f"the admin client failed: {e}"
            return False

    try:
        procs.wait_until(ready, timeout, interval=0.5, what=f"Kafka at {settings.bootstrap_servers}")
    except TimeoutError as e:
        raise TimeoutError(f"{e}; last seen: {seen}{_last_errors(quorum)}") from None


def _last_errors(quorum: list[Node], lines: int = 8) -> str:
    """The last ERROR/FATAL lines (with the exception line after each) of every node's logs, for an error message."""
    out = []
    for n in quorum:
        for f in (n.server_log, n.stdout):
            try:
                text = f.read_text(errors="replace").splitlines()[-2000:]
            except OSError:
                continue
            picked = [
                line[:300]
                for i, line in enumerate(text)
                if " ERROR " in line
                or " FATAL " in line
                or (i and (" ERROR " in text[i - 1] or " FATAL " in text[i - 1]))
            ]
            if picked:
                out.append(f"\n{f}:\n  " + "\n  ".join(picked[-lines:]))
    return "".join(out)


def stop(settings: Settings, timeout: float = 60.0) -> bool:
    """Stop every node gracefully (controlled shutdown); True if any was running. All at once: stopped one after
    another, the last node of a quorum of three has no quorum left to grant its controlled shutdown and waits out
    the whole timeout."""
    from concurrent.futures import ThreadPoolExecutor

    ids = [n.id for n in nodes(settings)]
    with ThreadPoolExecutor(len(ids)) as pool:
        return any(list(pool.map(lambda i: stop_node(settings, i, timeout), ids)))


def stop_node(settings: Settings, node_id: int, timeout: float = 60.0) -> bool:
    n = node(settings, node_id)
    info = procs.read_pidfile(n.pidfile)
    if not info:
        n.pidfile.unlink(missing_ok=True)
        return False
    procs.stop_process(info["pid"], timeout)
    n.pidfile.unlink(missing_ok=True)
    return True


def kill(settings: Settings, node_id: int | None = None) -> bool:
    """kill -9 a node (default: every node); a later start recovers its logs."""
    done = False
    for n in nodes(settings):
        if node_id is not None and n.id != node_id:
            continue
        info = procs.read_pidfile(n.pidfile)
        if not info:
            continue
        pid = int(info["pid"])
        procs.signal_group(pid, signal.SIGKILL)

        def dead(pid: int = pid) -> bool:
            return not procs.pid_alive(pid)

        procs.wait_until(dead, 20, what=f"node {n.id} to die")
        done = True
    return done


def _as_admin(settings: Settings) -> Settings:
    """The stack talks to a secured cluster as its admin (a plain one needs no credentials)."""
    if not settings.secured:
        return settings
    from onceflow_dev import credentials

    return credentials.as_admin(settings)
