"""docker-compose.yaml (not startable here: no Docker engine) checked against onceflow's configuration: the secured
three-node cluster `onceflow-dev stack up --brokers 3 --secured` runs, the Airflow connections of each role; and
(issue 24) that every password and key is a Docker secret file read at start (never in the file, an environment
variable or a command line), ports are published on loopback, Spark's RPC is authenticated and encrypted, services
restart, the volumes are prepared for their writers' users and the console sees the job's pid. The docker/ scripts
run here with stand-ins for the images' tools and stand-in secret files."""

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest
import yaml

from onceflow import config
from onceflow.kafka import acls, topics
from onceflow.rules import names

ROOT = Path(__file__).resolve().parents[3]
BROKERS = ("kafka-1", "kafka-2", "kafka-3")
AIRFLOW_SERVICES = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer")
# a compose interpolation: ${VAR}, ${VAR:?message}, ${VAR?message}, ${VAR:-default}, ${VAR-default}
REF = re.compile(r"\$\{(?P<var>[A-Za-z_][A-Za-z0-9_]*)(?P<op>:?[?-][^}]*)?\}")


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((ROOT / "docker-compose.yaml").read_text())


def env_of(svc) -> dict:
    """A service's environment as the container gets it: compose's "$$" escape is a "$" there."""
    return {k: str(v).replace("$$", "$") for k, v in (svc.get("environment") or {}).items()}


def mounts(svc) -> dict[str, str]:
    """volume (or bind-mounted path) -> where the container sees it."""
    return {v.split(":")[0]: v.split(":")[1] for v in svc.get("volumes", [])}


def onceflow_env(compose) -> dict:
    return {
        k: v for k, v in env_of(compose["services"]["airflow-scheduler"]).items() if k.startswith(config.ENV_PREFIX)
    }


@pytest.fixture
def embedded(compose, tmp_path, monkeypatch):
    """The settings of the compose file's Airflow containers, as an embedded stack under tmp_path would run them:
    its secret store (onceflow_dev.credentials) is made there; the keystore's password is what onceflow_dev.tls
    would keep next to a keystore it has not made (no keytool run here)."""
    from onceflow_dev import tls

    monkeypatch.setattr(tls, "store_password", lambda s: "embedded-store-password")
    s = config.load(env=onceflow_env(compose), var_dir=tmp_path)
    assert s.secured and s.brokers == 3
    return s


def test_services_and_health_checks(compose):
    svcs = compose["services"]
    expected = {
        "kafka-certs",
        *BROKERS,
        *(f"{b}-format" for b in BROKERS),
        "spark-master",
        "spark-worker-1",
        "spark-worker-2",
        "postgres",
        "airflow-init",
        *AIRFLOW_SERVICES,
    }
    assert expected <= set(svcs)
    # one-shots: what another service waits on to have completed; every other service has a health check
    one_shots = {
        dep
        for svc in svcs.values()
        for dep, cond in (svc.get("depends_on") or {}).items()
        if cond.get("condition") == "service_completed_successfully"
    }
    assert one_shots == {"volumes-init", "kafka-certs", "airflow-init", *(f"{b}-format" for b in BROKERS)}
    for name, svc in svcs.items():
        if name in one_shots:
            assert svc.get("restart") == "no", f"{name} is a one-shot: it must not be restarted"
        else:
            assert "healthcheck" in svc, f"{name} has no health check"
    assert svcs["airflow-apiserver"]["command"] == "api-server"
    assert any(p.endswith(":8080:8080") for p in svcs["airflow-apiserver"]["ports"])
    assert "postgresql" in env_of(svcs["airflow-scheduler"])["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_CMD"]


def test_kafka_is_three_kraft_brokers_with_replication_three(compose):
    svcs = compose["services"]
    voters = set()
    for i in (1, 2, 3):
        env = env_of(svcs[f"kafka-{i}"])
        assert env["KAFKA_NODE_ID"] == str(i) and "controller" in env["KAFKA_PROCESS_ROLES"]
        assert env["KAFKA_DEFAULT_REPLICATION_FACTOR"] == "3" and env["KAFKA_MIN_INSYNC_REPLICAS"] == "2"
        assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "3"
        assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "2"
        assert env["KAFKA_ADVERTISED_LISTENERS"] == f"SASL_SSL://kafka-{i}:9092"
        voters.add(env["KAFKA_CONTROLLER_QUORUM_VOTERS"])
    assert voters == {"1@kafka-1:9093,2@kafka-2:9093,3@kafka-3:9093"}


def test_onceflow_settings_match_the_topology(compose):
    svcs = compose["services"]
    airflow_env = env_of(svcs["airflow-scheduler"])
    of_env = onceflow_env(compose)
    s = config.load(env=of_env)  # every name is a real setting and every value validates
    unknown = {k for k in of_env if k[len(config.ENV_PREFIX) :].lower() not in config.Settings.__dataclass_fields__}
    assert not unknown
    brokers = {f"kafka-{i}:9092" for i in (1, 2, 3)}
    assert set(s.bootstrap_servers.split(",")) == brokers
    assert s.replication_factor == 3 and s.min_insync_replicas == 2
    kafka_env = env_of(svcs["kafka-1"])
    assert s.broker_transaction_max_timeout_ms == int(kafka_env["KAFKA_TRANSACTION_MAX_TIMEOUT_MS"])
    assert s.transaction_timeout_ms <= s.broker_transaction_max_timeout_ms
    for spec in topics.specs(s):
        assert spec.config["min.insync.replicas"] == "2"
    assert s.master == "spark://spark-master:7077" and "spark-master" in svcs
    # secured: the clients' protocol and mechanism are the brokers'
    assert s.secured and s.kafka_sasl_mechanism == kafka_env["KAFKA_SASL_ENABLED_MECHANISMS"]
    assert kafka_env["KAFKA_LISTENERS"].split(",")[0].split("://")[0] == s.kafka_security_protocol
    conn = json.loads(airflow_env["AIRFLOW_CONN_ONCEFLOW_KAFKA"])
    assert set(conn["extra"]["bootstrap.servers"].split(",")) == brokers
    for name in AIRFLOW_SERVICES:
        assert env_of(svcs[name]) == airflow_env, f"{name} must share the same configuration"


# --- the brokers: the server properties the apache/kafka image makes of the KAFKA_* variables ---

SECRETS = PurePosixPath("/etc/kafka/secrets")  # where the image's `configure` looks for TLS files
# The image's launcher variables (kafka.docker.KafkaDockerWrapper's ExcludeServerPropsEnv): not server properties.
LAUNCHER_ENV = {
    "KAFKA_VERSION",
    "KAFKA_HEAP_OPTS",
    "KAFKA_LOG4J_OPTS",
    "KAFKA_OPTS",
    "KAFKA_JMX_OPTS",
    "KAFKA_JVM_PERFORMANCE_OPTS",
    "KAFKA_GC_LOG_OPTS",
    "KAFKA_LOG4J_ROOT_LOGLEVEL",
    "KAFKA_LOG4J_LOGGERS",
    "KAFKA_TOOLS_LOG4J_LOGLEVEL",
    "KAFKA_JMX_HOSTNAME",
}
# Inputs of the image's `configure` (it derives ssl.keystore.location and both passwords from them); its wrapper
# writes them out as properties too, which Kafka does not know and ignores.
IMAGE_INPUTS = {"ssl.keystore.filename", "ssl.keystore.credentials", "ssl.key.credentials"}


def file_content(path: PurePosixPath) -> str:
    return f"<content of {path}>"


def configured_env(env: dict) -> dict:
    """The image's `configure` (docker/resources/common-scripts/configure in apache/kafka): with an SSL listener the
    keystore is /etc/kafka/secrets/<KAFKA_SSL_KEYSTORE_FILENAME>, ssl.key.password and ssl.keystore.password the
    contents of the files KAFKA_SSL_KEY_CREDENTIALS and KAFKA_SSL_KEYSTORE_CREDENTIALS name (there); with a SASL
    listener it refuses to start without KAFKA_OPTS."""
    env = dict(env)
    advertised = env.get("KAFKA_ADVERTISED_LISTENERS", "")
    if "SSL://" in advertised:
        env["KAFKA_SSL_KEYSTORE_LOCATION"] = str(SECRETS / env["KAFKA_SSL_KEYSTORE_FILENAME"])
        env["KAFKA_SSL_KEY_PASSWORD"] = file_content(SECRETS / env["KAFKA_SSL_KEY_CREDENTIALS"])
        env["KAFKA_SSL_KEYSTORE_PASSWORD"] = file_content(SECRETS / env["KAFKA_SSL_KEYSTORE_CREDENTIALS"])
    if re.search(r"SASL_.*://", advertised):
        assert env.get("KAFKA_OPTS"), "the image exits on a SASL listener without KAFKA_OPTS"
    return env


def server_config(env: dict) -> dict:
    """kafka.docker.KafkaDockerWrapper: every KAFKA_* variable but the launcher's is the server property named by
    removing "KAFKA_", lower-casing, then "_" -> ".", "..." -> "-", ".." -> "_" (so "___" is "-", "__" is "_")."""
    return {
        k.replace("KAFKA_", "").lower().replace("_", ".").replace("...", "-").replace("..", "_"): v
        for k, v in env.items()
        if k.startswith("KAFKA_") and k not in LAUNCHER_ENV
    }


def kafka_properties(env: dict) -> dict:
    """The server.properties the apache/kafka image starts the broker with, for a container's environment."""
    return server_config(configured_env(env))


def test_the_images_property_names():
    assert kafka_properties(
        {
            "KAFKA_LISTENER_NAME_SASL__SSL_SCRAM___SHA___512_SASL_JAAS_CONFIG": "x",
            "KAFKA_NODE_ID": "1",
            "KAFKA_OPTS": "-Dy",
            "CLUSTER_ID": "z",
        }
    ) == {"listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": "x", "node.id": "1"}


JAAS = re.compile(r"(?P<module>[\w.]+)\s+(?P<flag>required|requisite|sufficient|optional)(?P<options>.*);\s*")


def jaas(value: str) -> tuple[str, str, dict[str, str]]:
    """A one-entry JAAS configuration: login module, flag, options."""
    m = JAAS.fullmatch(value)
    assert m, f"not a JAAS configuration: {value!r}"
    return m["module"], m["flag"], dict(re.findall(r'(\w+)="([^"]*)"', m["options"]))


# Settings the loopback stack picks for a small, fast machine and a production cluster keeps at Kafka's defaults.
EMBEDDED_ONLY = {
    "offsets.topic.num.partitions": "4 on loopback (fast start); Kafka's 50 in production",
    "transaction.state.log.num.partitions": "4 on loopback (fast start); Kafka's 50 in production",
}
# Where each node is: compared by structure, not by value (ports and paths differ by design).
PLACEMENT = {"node.id", "controller.quorum.voters", "listeners", "advertised.listeners", "log.dirs"}
# Secrets and the files holding them: the embedded stack's are under var/ and random, the compose file's in the
# brokers' secrets volume and from .env. Compared by structure below.
STORES = {"ssl.keystore.location", "ssl.truststore.location", "ssl.keystore.password", "ssl.key.password"}


def started_env(svc, tmp_path: Path, script: str = "kafka-run.sh") -> dict:
    """The environment the image's start gets in a broker's container: docker/<script> (which sources
    docker/kafka-admin.sh) run with the service's environment and its secrets (stand-ins under tmp_path), up to a
    stand-in start that writes its environment out."""
    assert svc["command"] == ["bash", mounts(svc)[f"./docker/{script}"]]
    assert PurePosixPath(mounts(svc)["./docker/kafka-admin.sh"]).parent == PurePosixPath(svc["command"][1]).parent
    env = with_secrets(env_of(svc), tmp_path)
    out = tmp_path / "started.json"
    start = tmp_path / "start"
    start.write_text(
        f'#!/usr/bin/env bash\nexec {sys.executable} -c "import json, os; print(json.dumps(dict(os.environ)))" >"$OUT"\n'
    )
    start.chmod(0o755)
    run(["bash", str(ROOT / "docker" / script)], {**env, "KAFKA_RUN": str(start), "OUT": str(out)})
    got = json.loads(out.read_text())
    return {k: v for k, v in got.items() if k in env or (k.startswith("KAFKA_") and k != "KAFKA_RUN")}


@pytest.mark.skipif(not shutil.which("bash"), reason="docker/kafka-run.sh is a bash script")
def test_each_broker_runs_what_the_embedded_cluster_nodes_run(compose, embedded, tmp_path):
    """`onceflow-dev stack up --brokers 3 --secured` writes each node's server.properties (onceflow_dev.broker); every
    setting there, for the same ONCEFLOW_* settings, is the compose file's, and the compose file sets nothing else."""
    from onceflow_dev import broker, credentials, tls

    s = embedded
    svcs = compose["services"]
    quorum = broker.nodes(s)
    assert [f"{n.host}:{n.port}" for n in quorum] == [f"kafka-{i}:9092" for i in (1, 2, 3)]
    jaas_key = f"listener.name.sasl_ssl.{s.kafka_sasl_mechanism.lower()}.sasl.jaas.config"
    admin_files = set()
    for n in quorum:
        svc = svcs[f"kafka-{n.id}"]
        want = broker.server_properties(s, n, quorum)
        got = kafka_properties(started_env(svc, tmp_path))
        by_structure = PLACEMENT | STORES | {jaas_key}
        differs = {
            k: (want.get(k), got.get(k))
            for k in set(want) | set(got)
            if k not in by_structure | set(EMBEDDED_ONLY) | IMAGE_INPUTS and want.get(k) != got.get(k)
        }
        assert not differs, f"kafka-{n.id} and the embedded node {n.id} differ: {differs}"
        assert set(EMBEDDED_ONLY) <= set(want) and not set(EMBEDDED_ONLY) & set(got)
        assert IMAGE_INPUTS <= set(got) and not IMAGE_INPUTS & set(want)
        assert by_structure <= set(want) and by_structure <= set(got)

        # placement
        assert got["node.id"] == want["node.id"]
        assert got["advertised.listeners"] == want["advertised.listeners"]

        def voters(v: str) -> list[str]:
            return [x.rsplit(":", 1)[0] for x in v.split(",")]  # id@host, without the controller port

        assert voters(got["controller.quorum.voters"]) == voters(want["controller.quorum.voters"])

        def names(v: str) -> list[str]:
            return sorted(x.split("://")[0] for x in v.split(","))

        assert names(got["listeners"]) == names(want["listeners"])
        assert mounts(svc)[f"kafka-{n.id}"] == got["log.dirs"]

        # the brokers' own login (inter-broker SCRAM): the same module, flag and user; the password from the
        # kafka_admin_password secret file (docker/kafka-admin.sh), never from the compose file
        (w_mod, w_flag, w_opts), (g_mod, g_flag, g_opts) = jaas(want[jaas_key]), jaas(got[jaas_key])
        assert (g_mod, g_flag) == (w_mod, w_flag)
        assert set(g_opts) == set(w_opts) == {"username", "password"}
        assert g_opts["username"] == w_opts["username"] == acls.ADMIN
        assert w_opts["password"] == credentials.ensure(s)[acls.ADMIN]
        assert g_opts["password"] == "kafka_admin_password-value", f"kafka-{n.id}: the admin's password file"
        assert "kafka_admin_password" in secrets_of(svc)
        admin_files.add(env_of(svc)["ADMIN_PASSWORD_FILE"])

        # the stores: the same files (by name) in the secrets volume, which this broker mounts read-only
        secrets_mount = mounts(svc)["kafka-secrets"]
        assert secrets_mount == str(SECRETS) and f"kafka-secrets:{SECRETS}:ro" in svc["volumes"]
        for k, embedded_file in (
            ("ssl.keystore.location", tls.keystore(s)),
            ("ssl.truststore.location", tls.ca_pem(s)),
        ):
            assert PurePosixPath(got[k]).name == Path(want[k]).name == embedded_file.name
            assert PurePosixPath(got[k]).parent == SECRETS
        # one password for the keystore and its key, as the embedded stack's: a file kafka-certs writes
        assert want["ssl.keystore.password"] == want["ssl.key.password"] == tls.store_password(s)
        assert got["ssl.keystore.password"] == got["ssl.key.password"]
        assert got["ssl.keystore.password"] == file_content(SECRETS / certs_files(compose)["credentials"])
    assert admin_files == {str(SECRETS_DIR / "kafka_admin_password")}


def certs_files(compose) -> dict[str, str]:
    """What the kafka-certs one-shot (docker/kafka-certs.sh) writes into the brokers' secrets volume: the keystore,
    the file holding its password (taken from KEYSTORE_PASSWORD), the CA certificate."""
    script = (ROOT / "docker" / "kafka-certs.sh").read_text()
    written = set(re.findall(r'"\$work/([\w.]+)"', script))
    installed = re.search(r"for f in ([\w. ]+); do", script)
    assert installed, "docker/kafka-certs.sh no longer installs its files in one loop: update certs_files()"
    assert set(installed[1].split()) <= written
    credentials = re.search(r'printf \'%s\' "\$KEYSTORE_PASSWORD" >"\$work/([\w.]+)"', script)
    assert credentials, "docker/kafka-certs.sh must write KEYSTORE_PASSWORD into the brokers' credentials file"
    assert re.search(r'cp "\$work/ca\.pem" "\$CA_DIR/ca\.pem', script), "the CA certificate goes to CA_DIR"
    return {"installed": installed[1].split(), "credentials": credentials[1], "ca": "ca.pem"}


def test_certificates_are_what_the_brokers_and_clients_use(compose, embedded):
    """kafka-certs makes the embedded stack's certificates (onceflow_dev.tls) for the containers' names: the brokers'
    identity on the controller listener is a super user, every name a client or broker dials is in the SAN, the
    keystore password comes from .env; the brokers' secrets go nowhere else, the clients get the CA alone."""
    from onceflow_dev import tls

    s = embedded
    svcs = compose["services"]
    certs = svcs["kafka-certs"]
    env = env_of(certs)
    files = certs_files(compose)
    broker_env = env_of(svcs["kafka-1"])
    assert env["BROKER_DNAME"] == tls.BROKER_DN
    assert f"User:{env['BROKER_DNAME']}" in broker_env["KAFKA_SUPER_USERS"].split(";")
    san = {x.split(":", 1)[1] for x in env["BROKER_SAN"].split(",") if x.startswith("dns:")}
    assert {host for host, _ in s.bootstrap_addresses} | {"localhost"} <= san  # localhost: the health check
    assert env["KEYSTORE_PASSWORD_FILE"] == str(SECRETS_DIR / "kafka_keystore_password")
    assert "kafka_keystore_password" in secrets_of(certs)
    script = (ROOT / "docker" / "kafka-certs.sh").read_text()
    assert 'KEYSTORE_PASSWORD=$(cat "$KEYSTORE_PASSWORD_FILE")' in script
    # written where the brokers look for them
    assert mounts(certs)["kafka-secrets"] == env["SECRETS_DIR"] == str(SECRETS)
    for name in (
        broker_env["KAFKA_SSL_KEYSTORE_FILENAME"],
        PurePosixPath(broker_env["KAFKA_SSL_TRUSTSTORE_LOCATION"]).name,
    ):
        assert name in files["installed"]
    assert (
        broker_env["KAFKA_SSL_KEYSTORE_CREDENTIALS"] == broker_env["KAFKA_SSL_KEY_CREDENTIALS"] == files["credentials"]
    )
    assert mounts(certs)["./docker/kafka-certs.sh"] in certs["command"]
    # the brokers' secrets: kafka-certs and the brokers only
    assert {name for name, svc in svcs.items() if "kafka-secrets" in mounts(svc)} == {"kafka-certs", *BROKERS}
    # the CA's certificate: where ONCEFLOW_KAFKA_CA_FILE says, for the driver (Airflow) and the executors (workers)
    ca_file = PurePosixPath(s.kafka_ca)
    assert ca_file.parent == PurePosixPath(mounts(certs)["kafka-ca"]) == PurePosixPath(env["CA_DIR"])
    assert ca_file.name == files["ca"]
    clients = ["airflow-init", *AIRFLOW_SERVICES, "spark-worker-1", "spark-worker-2"]
    for name in clients:
        svc = svcs[name]
        assert f"kafka-ca:{ca_file.parent}:ro" in svc["volumes"], f"{name} needs the CA at {ca_file}"
        assert svc["depends_on"]["kafka-certs"]["condition"] == "service_completed_successfully"


def storage_format_args(svc) -> list[str]:
    cmd = svc["command"]
    assert cmd[:2] == ["bash", mounts(svc)["./docker/kafka-format.sh"]]
    assert PurePosixPath(mounts(svc)["./docker/kafka-admin.sh"]).parent == PurePosixPath(cmd[1]).parent
    return cmd[2:]


def run_format(svc, tmp_path: Path) -> tuple[dict[str, str], list[str]]:
    """docker/kafka-format.sh run with the service's environment and secrets (stand-ins under tmp_path) and a
    stand-in kafka-storage.sh: the configuration it formats with, and the tool's arguments."""
    env = with_secrets(env_of(svc), tmp_path)
    out = tmp_path / "format"
    tool = tmp_path / "kafka-storage.sh"
    tool.write_text(
        '#!/usr/bin/env bash\nprintf "%s\\n" "$@" >"$OUT.args"\n'
        'while [[ $# -gt 0 ]]; do [[ $1 == --config ]] && cp "$2" "$OUT.properties"; shift; done\n'
    )
    tool.chmod(0o755)
    run(
        ["bash", str(ROOT / "docker" / "kafka-format.sh"), *storage_format_args(svc)],
        {**env, "STORAGE_TOOL": str(tool), "OUT": str(out)},
    )
    written = dict(line.split("=", 1) for line in Path(f"{out}.properties").read_text().splitlines())
    return written, Path(f"{out}.args").read_text().splitlines()


@pytest.mark.skipif(not shutil.which("bash"), reason="docker/kafka-format.sh is a bash script")
def test_each_node_is_formatted_with_the_admins_scram_credential(compose, embedded, tmp_path):
    """Before a node's first start its storage is formatted as the embedded stack formats it (broker._launch):
    the cluster's id, the node's configuration, its features, the admin's SCRAM credential (KIP-900), whose
    password the script reads from the same secret file as the brokers' login (never the compose file)."""
    from onceflow_dev import broker, credentials

    s = embedded
    svcs = compose["services"]
    (want_flag, want_scram) = broker._scram_bootstrap(s)
    want_mech, want_cfg = want_scram.split("=", 1)
    want_features = list(broker.FORMAT_FEATURES)
    cluster_ids = set()
    for b in BROKERS:
        fmt, node = svcs[f"{b}-format"], svcs[b]
        assert node["depends_on"][f"{b}-format"]["condition"] == "service_completed_successfully"
        assert env_of(fmt) == env_of(node), f"{b}-format must format with {b}'s own configuration"
        assert secrets_of(fmt) == {"kafka_admin_password"} <= secrets_of(node)
        assert mounts(fmt)[b] == mounts(node)[b] == env_of(node)["KAFKA_LOG_DIRS"]
        assert fmt["image"] == node["image"] and fmt["user"] == node["user"]
        assert not any(a == want_flag or "password" in a for a in storage_format_args(fmt)), "no credential here"
        _, args = run_format(fmt, tmp_path)
        assert "--ignore-formatted" in args  # a formatted node is left alone on every later `up`
        assert [args[i + 1] for i, a in enumerate(args) if a == "--feature"] == want_features
        scram = [args[i + 1] for i, a in enumerate(args) if a == want_flag]
        assert len(scram) == 1
        mech, cfg = scram[0].split("=", 1)
        assert mech == want_mech == s.kafka_sasl_mechanism

        def fields(c: str) -> dict[str, str]:
            assert c.startswith("[") and c.endswith("]")
            return dict(x.split("=", 1) for x in c[1:-1].split(","))

        got, want = fields(cfg), fields(want_cfg)
        assert set(got) == set(want) == {"name", "password"} and got["name"] == want["name"] == acls.ADMIN
        assert want["password"] == credentials.ensure(s)[acls.ADMIN]
        assert got["password"] == "kafka_admin_password-value", "the password the brokers log in with"
        cluster_ids.add(env_of(node)["CLUSTER_ID"])
    assert len(cluster_ids) == 1
    (cluster_id,) = cluster_ids
    assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16, "a cluster id is a base64 UUID (random-uuid)"


@pytest.mark.skipif(not shutil.which("bash"), reason="docker/kafka-format.sh is a bash script")
def test_the_format_script_formats_with_the_configuration_the_broker_gets(compose, tmp_path):
    """docker/kafka-format.sh (with a stand-in kafka-storage.sh) writes the node's KAFKA_* variables, the admin's
    login included, as the image's wrapper writes them for the broker started by docker/kafka-run.sh, hands its
    arguments on and adds the admin's credential."""
    svc = compose["services"]["kafka-2-format"]
    written, called = run_format(svc, tmp_path)
    env = env_of(svc)
    assert written == server_config(started_env(compose["services"]["kafka-2"], tmp_path))
    assert called[:3] == ["format", "--cluster-id", env["CLUSTER_ID"]] and called[3] == "--config"
    args = storage_format_args(svc)
    assert called[5 : 5 + len(args)] == args
    assert called[5 + len(args) :] == [
        "--add-scram",
        "SCRAM-SHA-512=[name=onceflow-admin,password=kafka_admin_password-value]",
    ]
    assert not Path(called[4]).exists(), "the configuration (it holds the admin's password) is removed"


@pytest.mark.skipif(not shutil.which("bash"), reason="docker/kafka-health.sh is a bash script")
def test_the_health_check_is_an_authenticated_tls_client(compose, embedded, tmp_path):
    """docker/kafka-health.sh: kafka-broker-api-versions.sh over SASL_SSL as the admin (the broker's own login,
    from the secret file), the certificate checked against the CA."""
    s = embedded
    svcs = compose["services"]
    for b in BROKERS:
        svc = svcs[b]
        env = env_of(svc)
        assert svc["healthcheck"]["test"] == ["CMD", "bash", mounts(svc)["./docker/kafka-health.sh"]]
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        tool = bin_dir / "kafka-broker-api-versions.sh"
        tool.write_text(
            '#!/usr/bin/env bash\nprintf "%s\\n" "$@" >"$OUT.args"\n'
            'while [[ $# -gt 0 ]]; do [[ $1 == --command-config ]] && cp "$2" "$OUT.properties"; shift; done\n'
        )
        tool.chmod(0o755)
        out = tmp_path / f"{b}.health"
        run(
            ["bash", str(ROOT / "docker" / "kafka-health.sh")],
            {**with_secrets(env, tmp_path), "KAFKA_BIN": str(bin_dir), "OUT": str(out)},
        )
        client = dict(line.split("=", 1) for line in Path(f"{out}.properties").read_text().splitlines())
        args = Path(f"{out}.args").read_text().splitlines()
        opts = dict(zip(args[::2], args[1::2]))
        assert not Path(opts["--command-config"]).exists(), "the client configuration (the password) is removed"
        host, port = opts["--bootstrap-server"].rsplit(":", 1)
        listener_port = {x.split("://")[0]: x.rsplit(":", 1)[1] for x in env["KAFKA_LISTENERS"].split(",")}
        assert host == "localhost" and port == listener_port[s.kafka_security_protocol]
        assert client["security.protocol"] == s.kafka_security_protocol == "SASL_SSL"
        assert client["sasl.mechanism"] == s.kafka_sasl_mechanism
        assert client["ssl.truststore.type"] == env["KAFKA_SSL_TRUSTSTORE_TYPE"]
        assert client["ssl.truststore.location"] == env["KAFKA_SSL_TRUSTSTORE_LOCATION"]
        # the broker's own login: the admin, with the password of the broker's secret file
        broker_login = started_env(svc, tmp_path)["KAFKA_LISTENER_NAME_SASL__SSL_SCRAM___SHA___512_SASL_JAAS_CONFIG"]
        assert client["sasl.jaas.config"] == broker_login and jaas(broker_login)[2]["username"] == acls.ADMIN


def entrypoint_environment(env: dict) -> dict:
    """What docker/airflow-entrypoint.py hands the image's entrypoint for a container's environment."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("airflow_entrypoint", ROOT / "docker" / "airflow-entrypoint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.environment(env)


def test_each_app_instance_gets_its_own_principals_connections_and_the_dags_find_them(embedded, monkeypatch):
    """A control plane of two instances (ONCEFLOW_APPS): the embedded Airflow gets each instance's role connections,
    with that instance's principals and passwords, and the DAGs' settings of the second instance take them."""
    from onceflow.control import orchestration
    from onceflow_dev import airflow_local, credentials

    s = embedded.replace(apps="ip_count,nets=ip_count")
    conns = airflow_local.kafka_env(s)
    nets = s.replace(app_id="nets")
    for role in acls.ROLES:
        own = json.loads(conns[f"AIRFLOW_CONN_ONCEFLOW_KAFKA{'' if role == 'control' else '_' + role.upper()}"])
        other = json.loads(conns[f"AIRFLOW_CONN_ONCEFLOW_KAFKA_NETS{'' if role == 'control' else '_' + role.upper()}"])
        assert own["login"] == acls.username(s, role) and other["login"] == acls.username(nets, role)
        assert other["password"] == credentials.ensure(nets)[other["login"]] != own["password"]
    assert len(conns) == 2 * len(acls.ROLES)
    for k in [k for k in __import__("os").environ if k.startswith("ONCEFLOW_")]:
        monkeypatch.delenv(k)
    for k, v in {**s.as_env(), **conns}.items():
        monkeypatch.setenv(k, v)
    job = orchestration.settings(role="job", app_id="nets")
    assert (job.app_id, job.kafka_username) == ("nets", "onceflow.nets.job")
    assert job.kafka_password == credentials.ensure(nets)["onceflow.nets.job"]


def test_airflow_has_each_roles_connection_and_init_provisions_them(compose, embedded, tmp_path):
    """The Airflow containers get the connections `onceflow-dev airflow up` gives the embedded Airflow
    (onceflow_dev.airflow_local.kafka_env), each password from its role's secret file (filled in by
    docker/airflow-entrypoint.py); airflow-init creates each role's user with the password its connection carries,
    as the admin, whose credentials no long-running container holds."""
    from onceflow import cli
    from onceflow_dev import airflow_local, credentials

    s = embedded
    svcs = compose["services"]
    airflow_env = env_of(svcs["airflow-scheduler"])
    assert svcs["airflow-scheduler"]["entrypoint"][-2:] == [
        mounts(svcs["airflow-scheduler"])["./docker/airflow-entrypoint.py"],
        "/entrypoint",
    ]
    want = airflow_local.kafka_env(s)
    conns = {k: v for k, v in airflow_env.items() if k.startswith("AIRFLOW_CONN_ONCEFLOW_KAFKA")}
    assert set(conns) == set(want)
    started = entrypoint_environment(with_secrets(airflow_env, tmp_path))
    known = credentials.ensure(s)
    role_files = {}
    for key, spec in want.items():
        w, c, g = json.loads(spec), json.loads(conns[key]), json.loads(started[key])
        assert set(c) == {"conn_type", "login", "password_file", "extra"}
        assert set(g) == set(w) == {"conn_type", "login", "password", "extra"}
        assert {k: g[k] for k in ("conn_type", "login", "extra")} == {k: w[k] for k in ("conn_type", "login", "extra")}
        assert w["password"] == known[w["login"]]
        secret = SECRET_PATH.fullmatch(c["password_file"])[1]
        assert g["password"] == f"{secret}-value", f"{key}: the password from its secret file"
        role_files[w["login"]] = c["password_file"]
    assert set(role_files) == {acls.username(s, r) for r in acls.ROLES}
    assert len(set(role_files.values())) == len(acls.ROLES), "one password per role"
    assert airflow_env["ONCEFLOW_KAFKA_CA_FILE"] == s.kafka_ca

    init = svcs["airflow-init"]
    init_env = env_of(init)
    assert {k: v for k, v in init_env.items() if k in airflow_env} == airflow_env
    admin_file = env_of(svcs["kafka-1"])["ADMIN_PASSWORD_FILE"]
    assert init_env["ONCEFLOW_KAFKA_USERNAME"] == acls.ADMIN
    assert init_env["ONCEFLOW_KAFKA_PASSWORD_SECRET_FILE"] == admin_file
    for role in acls.ROLES:
        assert init_env[f"ONCEFLOW_KAFKA_{role.upper()}_PASSWORD_SECRET_FILE"] == role_files[acls.username(s, role)]
    init_started = entrypoint_environment(with_secrets(init_env, tmp_path))
    assert init_started["ONCEFLOW_KAFKA_PASSWORD"] == "kafka_admin_password-value"
    assert not any(k.endswith("_SECRET_FILE") and k.startswith("ONCEFLOW_") for k in init_started)
    assert config.load(env={k: v for k, v in init_started.items() if k.startswith(config.ENV_PREFIX)}).kafka_password
    steps = [x.strip() for x in init["command"][-1].split("&&")]
    assert steps[:3] == ["airflow db migrate", "onceflow stack provision", "onceflow stack topics"]
    for step in steps[1:]:
        cli.parser().parse_args(step.split()[1:])  # the CLI has the command

    # the PostgreSQL sink's roles: the connections `airflow up` gives on a stack started with --postgres, pointed at
    # the compose server, each password from its own secret file; airflow-init, as the server's superuser, creates
    # the database and both login roles with the passwords those connections carry
    pg = {k: json.loads(started[k]) for k in airflow_env if k.startswith("AIRFLOW_CONN_ONCEFLOW_POSTGRES")}
    assert set(pg) == {f"AIRFLOW_CONN_{names.db_connection_id(s.app_id, p).upper()}" for p in ("job", "reader")}
    role_files = {}
    for purpose in ("job", "reader"):
        c = pg[f"AIRFLOW_CONN_{names.db_connection_id(s.app_id, purpose).upper()}"]
        assert c == {
            "conn_type": "postgres",
            "host": airflow_env["ONCEFLOW_POSTGRES_HOST"],
            "port": 5432,
            "login": names.db_role(s.app_id, purpose),
            "password": f"postgres_sink_{purpose}_password-value",
            "schema": s.postgres_database,
        }
        role_files[purpose] = json.loads(airflow_env[f"AIRFLOW_CONN_{names.db_connection_id(s.app_id, purpose).upper()}"])[
            "password_file"
        ]  # fmt: skip
    provision = cli.parser().parse_args(steps[3].split()[1:])
    assert (provision.command, provision.action) == ("db", "provision")
    for purpose in ("job", "reader"):  # the passwords the connections carry, from the same secret files
        assert init_env[f"ONCEFLOW_POSTGRES_{purpose.upper()}_PASSWORD_SECRET_FILE"] == role_files[purpose]
        assert (
            init_started[f"ONCEFLOW_POSTGRES_{purpose.upper()}_PASSWORD"] == f"postgres_sink_{purpose}_password-value"
        )
    assert init_started["ONCEFLOW_POSTGRES_USER"] == "airflow"  # Airflow's database owner, a superuser in the image
    assert init_started["ONCEFLOW_POSTGRES_PASSWORD"] == "airflow_db_password-value"
    assert "ONCEFLOW_POSTGRES_PASSWORD" not in env_of(svcs["airflow-scheduler"])
    for name in AIRFLOW_SERVICES:
        env = env_of(svcs[name])
        assert not {
            k for k in env if k.startswith("ONCEFLOW_KAFKA_USERNAME") or k.startswith("ONCEFLOW_KAFKA_PASSWORD")
        }
        assert "kafka_admin_password" not in secrets_of(svcs[name]), f"{name} must not hold the admin's password"
        assert admin_file not in {v for v in env.values()}


def test_env_and_secrets_are_git_ignored(compose):
    """.env (ONCEFLOW_PUBLISH_HOST only) and the secrets' files are git-ignored; .env.example is not."""

    def ignored(path: str) -> bool:
        if shutil.which("git"):
            r = subprocess.run(
                ["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT, capture_output=True, timeout=30
            )
            if r.returncode in (0, 1):
                return r.returncode == 0
        patterns = [p.strip() for p in (ROOT / ".gitignore").read_text().splitlines()]
        return any(p in (path, f"/{path}") or path.startswith(p.strip("/") + "/") for p in patterns)

    assert ignored(".env") and not ignored(".env.example")
    for name, spec in compose["secrets"].items():
        assert ignored(str(PurePosixPath(spec["file"]))), f"the secret {name} would be committed"


def test_two_spark_workers_reach_the_checkpoint_the_driver_writes(compose):
    """`--spark-workers 2`; the executors write the checkpoint's state: every worker mounts the volume that holds
    it at the path the driver (in the Airflow containers) uses."""
    svcs = compose["services"]
    workers = sorted(n for n in svcs if n.startswith("spark-worker-"))
    assert workers == ["spark-worker-1", "spark-worker-2"]
    s = config.load(env=onceflow_env(compose))
    checkpoint_path = s.checkpoint.removeprefix("file://")
    driver_mounts = mounts(svcs["airflow-scheduler"])
    for name in workers:
        svc = svcs[name]
        assert s.master in svc["command"]
        worker_mounts = mounts(svc)
        shared = [vol for vol, path in worker_mounts.items() if driver_mounts.get(vol) == path]
        assert any(checkpoint_path.startswith(worker_mounts[vol]) for vol in shared), (
            f"{name} cannot reach {s.checkpoint}"
        )


# --- issue 24: what the platform publishes, where its secrets live, who writes the volumes ---

SECRETS_DIR = PurePosixPath("/run/secrets")  # where Docker mounts a service's `secrets:`
SECRET_PATH = re.compile(r"/run/secrets/([\w.-]+)")
ONE_SHOTS = {"volumes-init", "kafka-certs", "airflow-init", *(f"{b}-format" for b in BROKERS)}
# What each secret is: no password, key or token of the platform is anywhere else (environment, arguments, file).
SECRET_NAMES = {
    "kafka_admin_password",
    "kafka_job_password",
    "kafka_backfill_password",
    "kafka_control_password",
    "kafka_reconcile_password",
    "kafka_keystore_password",
    "airflow_db_password",
    "airflow_fernet_key",
    "airflow_api_secret_key",
    "airflow_jwt_secret",
    "postgres_sink_job_password",
    "postgres_sink_reader_password",
    "spark_auth_secret",
}


def interpolate(value: str, env: dict[str, str] | None = None) -> str:
    """Compose's interpolation of ${VAR}, ${VAR:-default}, ${VAR-default} (and $$), as an unset .env gives it."""
    env = env or {}

    def one(m: re.Match) -> str:
        var, op = m["var"], m["op"] or ""
        if op.startswith(":-"):
            return env.get(var) or op[2:]
        if op.startswith("-"):
            return env.get(var, op[1:])
        assert var in env, f"${{{var}}} has no default and .env does not set it"
        return env[var]

    return REF.sub(one, value.replace("$$", "\0")).replace("\0", "$")


def strings_of(node):
    if isinstance(node, dict):
        for v in node.values():
            yield from strings_of(v)
    elif isinstance(node, list):
        for v in node:
            yield from strings_of(v)
    elif node is not None:
        yield str(node)


def secrets_of(svc) -> set[str]:
    return {s if isinstance(s, str) else s["source"] for s in svc.get("secrets", [])}


def with_secrets(env: dict, tmp_path: Path) -> dict:
    """env with /run/secrets/<name> moved under tmp_path, where stand-in secrets are written: <name>-value."""
    d = tmp_path / "docker-secrets"
    d.mkdir(exist_ok=True)
    for name in SECRET_NAMES:
        (d / name).write_text(f"{name}-value\n")  # a trailing newline, as `echo` or an editor leaves one
    return {k: v.replace(str(SECRETS_DIR), str(d)) for k, v in env.items()}


def run(argv: list[str], env: dict) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, env={"PATH": os.environ["PATH"], **env}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{argv} exited {r.returncode}: {r.stderr}"
    return r


def test_every_port_is_published_on_loopback_unless_the_operator_opens_it(compose):
    """Item 1: no port is published on all interfaces by default; ONCEFLOW_PUBLISH_HOST (.env) may open them."""
    published = {}
    for name, svc in compose["services"].items():
        for p in svc.get("ports", []):
            assert isinstance(p, str), f"{name}: ports in the short form, host address first"
            published[(name, p)] = interpolate(p)
            opened = interpolate(p, {"ONCEFLOW_PUBLISH_HOST": "0.0.0.0"})
            assert opened.startswith("0.0.0.0:"), f"{name}: {p} is not opened by ONCEFLOW_PUBLISH_HOST"
    assert published, "nothing published: the operator could not reach Airflow"
    for (name, p), got in published.items():
        host, hport, cport = got.rsplit(":", 2)
        assert host == "127.0.0.1", f"{name} publishes {p} on {host or 'every interface'}"
    services = {name for name, _ in published}
    assert "airflow-apiserver" in services
    # the Spark master's RPC port: only the containers (the workers, the driver in the scheduler) dial it
    assert not any(p.endswith(":7077") for (name, p) in published), "7077 is for the containers only"


def spark_defaults(text: str) -> dict[str, str]:
    return dict(line.split(None, 1) for line in text.splitlines() if line.strip() and not line.startswith("#"))


@pytest.mark.skipif(not shutil.which("bash"), reason="docker/spark-run.sh is a bash script")
def test_spark_authenticates_and_encrypts_with_the_secret_file(compose, tmp_path):
    """Item 1: the master, the workers (and so their executors) and the driver (in the Airflow containers) turn on
    spark.authenticate and spark.network.crypto.enabled with one secret, read from the spark_auth_secret file at
    start. Spark standalone reads no spark.authenticate.secret.file (SecurityManager: "Secret keys provided via
    files is only allowed in Kubernetes mode"): the start scripts write it into a 0600 spark-defaults.conf, never
    into the environment or a command line."""
    svcs = compose["services"]
    spark = ["spark-master", "spark-worker-1", "spark-worker-2"]
    got = {}
    for name in spark:
        svc = svcs[name]
        assert "spark_auth_secret" in secrets_of(svc), f"{name} needs the Spark secret"
        env = with_secrets(env_of(svc), tmp_path)
        assert not any("spark.authenticate.secret" in v for v in env.values())
        home = tmp_path / name
        (home / "bin").mkdir(parents=True)
        tool = home / "bin" / "spark-class"
        tool.write_text('#!/usr/bin/env bash\numask >"$OUT.umask"\nprintf "%s\\n" "$@" >"$OUT.args"\nenv >"$OUT.env"\n')
        tool.chmod(0o755)
        env["SPARK_CONF_DIR"] = str(tmp_path / name / "conf")
        cmd = svc["command"]
        assert cmd[:2] == ["bash", mounts(svc)["./docker/spark-run.sh"]]
        out = tmp_path / f"{name}.out"
        run(
            ["bash", str(ROOT / "docker" / "spark-run.sh"), *cmd[2:]], {**env, "SPARK_HOME": str(home), "OUT": str(out)}
        )
        conf_file = Path(env["SPARK_CONF_DIR"]) / "spark-defaults.conf"
        assert conf_file.stat().st_mode & 0o077 == 0, "the secret's file is the container user's alone"
        got[name] = spark_defaults(conf_file.read_text())
        secret = "spark_auth_secret-value"
        assert secret not in Path(f"{out}.args").read_text() and secret not in Path(f"{out}.env").read_text()
        assert Path(f"{out}.args").read_text().split() == cmd[2:]
    # the driver: the Airflow containers' entrypoint writes the same file where spark-submit reads it
    for name in ("airflow-scheduler", "airflow-init"):
        svc = svcs[name]
        assert "spark_auth_secret" in secrets_of(svc)
        env = with_secrets(env_of(svc), tmp_path)
        env["SPARK_CONF_DIR"] = str(tmp_path / name / "conf")
        out = tmp_path / f"{name}.env.json"
        dump = f"import json, os; open({str(out)!r}, 'w').write(json.dumps(dict(os.environ)))"
        run([sys.executable, str(ROOT / "docker" / "airflow-entrypoint.py"), sys.executable, "-c", dump], env)
        got[name] = spark_defaults((Path(env["SPARK_CONF_DIR"]) / "spark-defaults.conf").read_text())
        assert "spark_auth_secret-value" not in out.read_text()
        assert json.loads(out.read_text())["SPARK_CONF_DIR"] == env["SPARK_CONF_DIR"]
    for name, conf in got.items():
        assert conf["spark.authenticate"] == "true", name
        assert conf["spark.network.crypto.enabled"] == "true", name
        assert conf["spark.authenticate.secret"] == "spark_auth_secret-value", name
    assert len({tuple(sorted(c.items())) for c in got.values()}) == 1, "one Spark configuration everywhere"


def test_secrets_are_files_never_environment_or_arguments(compose, tmp_path):
    """Item 2: every password and key is a Docker secret (a file under /run/secrets), none is in an environment
    variable, a command, a health check or a URL of the compose file; each service holds the secrets it names and
    the top-level ones are files in a git-ignored directory that docker/make-secrets.sh fills."""
    svcs = compose["services"]
    top = compose.get("secrets") or {}
    assert set(top) == SECRET_NAMES
    dirs = set()
    for name, spec in top.items():
        assert set(spec) == {"file"}, f"secret {name}: a file the operator makes"
        path = PurePosixPath(spec["file"])
        assert path.name == name
        dirs.add(str(path.parent))
    assert len(dirs) == 1
    (secret_dir,) = dirs
    for name, svc in svcs.items():
        env = env_of(svc)
        for k, v in env.items():
            if re.search(r"(PASSWORD|SECRET|SECRET_KEY|FERNET_KEY|JWT_SECRET)$", k):
                pytest.fail(f"{name}: {k} holds a secret in the environment")
            assert not re.search(r'password="[^"$]', v), f"{name}: {k} carries a JAAS password"
            # a URL's password: only a placeholder the secret file fills (printf's %s)
            assert not re.search(r"://[^:/@\s]+:(?!%s@)[^@\s]+@", v), f"{name}: {k} is a URL with a password"
            if k.startswith("AIRFLOW_CONN_"):
                spec = json.loads(v)
                assert "password" not in spec, f"{name}: {k} carries its password"
                if "password_file" in spec:
                    assert SECRET_PATH.fullmatch(spec["password_file"])
        for where in ("command", "entrypoint", "healthcheck"):
            for s in strings_of(svc.get(where)):
                assert "password=" not in s.lower() and "secret=" not in s.lower(), f"{name} {where}: {s}"
        named = {m for s in strings_of(svc) for m in SECRET_PATH.findall(s)}
        assert named <= secrets_of(svc), f"{name} reads {named - secrets_of(svc)} without mounting them"
        assert secrets_of(svc) <= SECRET_NAMES
    # compose's interpolation accepts every "$" (a bare one, as in "$(cat ...)", is an invalid template there)
    for s in strings_of(compose):
        assert not re.search(r"\$(?![{A-Za-z_])", s.replace("$$", "")), f"compose rejects a bare $ in {s!r}"
    # nothing but the published host is filled from .env; .env.example holds no value and no password
    text = (ROOT / "docker-compose.yaml").read_text()
    referenced = {m["var"] for m in REF.finditer(text) if text[m.start() - 1 : m.start()] != "$"}
    assert referenced == {"ONCEFLOW_PUBLISH_HOST"}
    example = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            k, _, v = line.partition("=")
            example[k.strip()] = v.strip()
    assert set(example) == referenced and not any(example.values())
    # the secrets' directory is git-ignored; docker/make-secrets.sh makes every secret, once
    assert PurePosixPath(secret_dir).parts[0] == "var", "secrets live under var/, which .gitignore ignores"
    assert "/var/" in (ROOT / ".gitignore").read_text().split()
    out = tmp_path / "made"
    run(["bash", str(ROOT / "docker" / "make-secrets.sh"), str(out)], {})
    made = {p.name: p.read_text() for p in out.iterdir()}
    assert set(made) == SECRET_NAMES
    assert all(re.fullmatch(r"[A-Za-z0-9_=-]{32,}\n?", v) for v in made.values()), "long, and safe in JAAS/URLs"
    assert len(set(made.values())) == len(made), "each secret its own value"
    assert out.stat().st_mode & 0o077 == 0, "the directory is the operator's alone"
    from cryptography.fernet import Fernet

    Fernet(made["airflow_fernet_key"].strip().encode())  # a valid Fernet key
    run(["bash", str(ROOT / "docker" / "make-secrets.sh"), str(out)], {})
    assert {p.name: p.read_text() for p in out.iterdir()} == made, "an existing secret is kept"


def test_airflow_keys_come_from_secret_files_and_are_the_same_everywhere(compose, tmp_path):
    """Item 3: the Fernet key, the API's secret key, the JWT signing key and the database's URL are read by Airflow
    itself from the secret files (AIRFLOW__<SECTION>__<KEY>_CMD, allowed for options Airflow marks sensitive),
    the same on every Airflow container; Airflow's own configuration parser resolves them."""
    svcs = compose["services"]
    names = ["airflow-init", *AIRFLOW_SERVICES]
    wanted = {
        ("core", "fernet_key"): "airflow_fernet_key",
        ("api", "secret_key"): "airflow_api_secret_key",
        ("api_auth", "jwt_secret"): "airflow_jwt_secret",
        ("database", "sql_alchemy_conn"): "airflow_db_password",
    }
    per_service = []
    for name in names:
        env = env_of(svcs[name])
        keys = {}
        for (section, key), secret in wanted.items():
            var = f"AIRFLOW__{section.upper()}__{key.upper()}"
            assert var not in env, f"{name}: {var} in the environment"
            assert var + "_CMD" in env, f"{name}: {var}_CMD missing"
            assert secret in SECRET_PATH.findall(env[var + "_CMD"]) and secret in secrets_of(svcs[name])
            keys[var + "_CMD"] = env[var + "_CMD"]
        per_service.append(keys)
    assert all(k == per_service[0] for k in per_service), "every Airflow container uses the same keys"
    env = with_secrets(per_service[0], tmp_path)
    probe = (
        "from airflow.configuration import conf\n"
        "import json\n"
        f"print(json.dumps({{f'{{s}}.{{k}}': conf.get(s, k) for s, k in {sorted(wanted)!r}}}))"
    )
    r = run(
        [sys.executable, "-c", probe],
        {**env, "AIRFLOW_HOME": str(tmp_path / "airflow_home"), "_AIRFLOW__AS_LIBRARY": "1"},
    )
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["core.fernet_key"] == "airflow_fernet_key-value"
    assert got["api.secret_key"] == "airflow_api_secret_key-value"
    assert got["api_auth.jwt_secret"] == "airflow_jwt_secret-value"
    assert (
        got["database.sql_alchemy_conn"]
        == "postgresql+psycopg2://airflow:airflow_db_password-value@postgres:5432/airflow"
    )
    pg = env_of(svcs["postgres"])
    assert "POSTGRES_PASSWORD" not in pg and pg["POSTGRES_PASSWORD_FILE"] == str(SECRETS_DIR / "airflow_db_password")


def test_long_running_services_restart_and_one_shots_do_not(compose):
    """Item 4: every long-running service comes back after a crash or a host reboot (not after `docker compose
    stop`); a one-shot never loops, and whatever needs it waits for it to have completed."""
    svcs = compose["services"]
    waited_on = {
        dep
        for svc in svcs.values()
        for dep, cond in (svc.get("depends_on") or {}).items()
        if cond.get("condition") == "service_completed_successfully"
    }
    assert waited_on == ONE_SHOTS
    for name, svc in svcs.items():
        if name in ONE_SHOTS:
            assert svc.get("restart") == "no", f"{name} is a one-shot"
        else:
            assert svc.get("restart") == "unless-stopped", f"{name} does not come back after a crash"


# The images' users (uid:gid), as docker-compose.yaml sets them explicitly.
AIRFLOW_UID = "50000:0"  # apache/airflow: airflow, uid 50000, group 0 (root)
SPARK_UID = "185:0"  # apache/spark: spark, uid 185, run with group 0 to share onceflow-var with Airflow
KAFKA_UID = "1000:0"  # apache/kafka: appuser, uid 1000; its data directory is appuser:root in the image


def test_every_volume_writer_runs_as_a_user_the_volume_is_prepared_for(compose):
    """Item 5: volumes-init (root, one-shot) gives each written volume to the uid:gid of the services that write
    it, group-writable (directories setgid) where two users share it; every writer runs as a declared user that the
    preparation covers, and waits for it; the writers' umask keeps new files group-writable."""
    svcs = compose["services"]
    init = svcs["volumes-init"]
    assert init.get("user") == "0:0" and init.get("restart") == "no"
    script = init["command"][-1]
    prepared = {}
    for m in re.finditer(r"chown -R (\d+):(\d+) ([^;&|]+)", script):
        prepared |= dict.fromkeys(m[3].split(), (m[1], m[2]))
    group_shared = {p for paths in re.findall(r"chmod -R g\+rwX ([^;&|]+)", script) for p in paths.split()}
    group_shared &= set(re.findall(r"find (\S+) -type d -exec chmod g\+s \{\} \+", script))
    at = {path: vol for vol, path in mounts(init).items()}
    for name, svc in svcs.items():
        if name in ONE_SHOTS - {f"{b}-format" for b in BROKERS} - {"airflow-init"} or name == "postgres":
            continue  # root one-shots (kafka-certs, volumes-init); postgres drops to its own user on its volume
        for vol, path in mounts(svc).items():
            if vol.startswith("./") or f"{vol}:{path}:ro" in svc["volumes"] or vol in ("kafka-secrets", "kafka-ca"):
                continue
            user = svc.get("user")
            assert user, f"{name} writes {vol} as an undeclared user"
            uid, gid = user.split(":")
            init_path = next((p for p, v in at.items() if v == vol), None)
            assert init_path in prepared, f"volumes-init does not prepare {vol} (written by {name})"
            owner = prepared[init_path]
            assert uid == owner[0] or (gid == owner[1] and init_path in group_shared), (
                f"{name} ({user}) cannot write {vol}, prepared for {':'.join(owner)}"
            )
            assert svc["depends_on"]["volumes-init"]["condition"] == "service_completed_successfully"
    assert svcs["airflow-scheduler"]["user"] == AIRFLOW_UID
    assert svcs["spark-worker-1"]["user"] == SPARK_UID and svcs["kafka-1"]["user"] == KAFKA_UID
    # the two users writing onceflow-var (the driver in Airflow, the executors in Spark) keep files group-writable
    assert "os.umask(0o002)" in (ROOT / "docker" / "airflow-entrypoint.py").read_text()
    assert "umask 002" in (ROOT / "docker" / "spark-run.sh").read_text()


def test_the_console_sees_the_pid_of_the_job_the_scheduler_launched(compose):
    """Item 6: the job's driver is a process of the scheduler's container (LocalExecutor tasks, client mode);
    `onceflow job status` and the console (an api-server plugin) judge its liveness from var/run's pid files.
    The api-server shares the scheduler's pid namespace and both mount var/ (onceflow-var) at the same path, so
    the pid in the file is the job's pid where it is read."""
    svcs = compose["services"]
    s = config.load(env=onceflow_env(compose))
    run_dir = str(s.run_dir)
    launcher = svcs["airflow-scheduler"]
    assert env_of(launcher)["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor", "tasks run in the scheduler's container"
    assert "pid" not in launcher
    inspector = svcs["airflow-apiserver"]
    assert inspector.get("pid") == "service:airflow-scheduler"
    for svc in (launcher, inspector):
        shared = [vol for vol, path in mounts(svc).items() if run_dir.startswith(path + "/")]
        assert shared == ["onceflow-var"], "var/run on the shared volume"
    assert mounts(launcher)["onceflow-var"] == mounts(inspector)["onceflow-var"]
    assert inspector.get("user") == launcher.get("user"), "same uid: kill(pid, 0) and /proc/<pid>/cmdline work"
    assert inspector["depends_on"]["airflow-scheduler"]["condition"] == "service_healthy"
