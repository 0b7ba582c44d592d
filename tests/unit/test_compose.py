"""docker-compose.yaml (not startable here: no Docker engine) checked against onceflow's configuration: the secured
three-node cluster `onceflow stack up --brokers 3 --secured` runs, the Airflow connections of each role, and that
no secret is written in the file (every password comes from the operator's git-ignored .env)."""

import base64
import inspect
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path, PurePosixPath

import pytest
import yaml

from onceflow import config
from onceflow.kafka import acls, topics

ROOT = Path(__file__).resolve().parents[2]
BROKERS = ("kafka-1", "kafka-2", "kafka-3")
AIRFLOW_SERVICES = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer")
# a compose interpolation: ${VAR}, ${VAR:?message}, ${VAR?message}, ${VAR:-default}, ${VAR-default}
REF = re.compile(r"\$\{(?P<var>[A-Za-z_][A-Za-z0-9_]*)(?P<op>:?[?-][^}]*)?\}")


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((ROOT / "docker-compose.yaml").read_text())


def env_of(svc) -> dict:
    return {k: str(v) for k, v in (svc.get("environment") or {}).items()}


def mounts(svc) -> dict[str, str]:
    """volume (or bind-mounted path) -> where the container sees it."""
    return {v.split(":")[0]: v.split(":")[1] for v in svc.get("volumes", [])}


def ref(value: str) -> str | None:
    """The variable a value is, when the whole value is one compose interpolation that fails while unset."""
    m = REF.fullmatch(value)
    return m["var"] if m and (m["op"] or "").startswith((":?", "?")) else None


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
    assert one_shots == {"kafka-certs", "airflow-init", *(f"{b}-format" for b in BROKERS)}
    for name, svc in svcs.items():
        if name in one_shots:
            assert svc.get("restart") == "no", f"{name} is a one-shot: it must not be restarted"
        else:
            assert "healthcheck" in svc, f"{name} has no health check"
    assert svcs["airflow-apiserver"]["command"] == "api-server" and "8080:8080" in svcs["airflow-apiserver"]["ports"]
    assert "postgresql" in env_of(svcs["airflow-scheduler"])["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]


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


def test_each_broker_runs_what_the_embedded_cluster_nodes_run(compose, embedded):
    """`onceflow stack up --brokers 3 --secured` writes each node's server.properties (onceflow_dev.broker); every
    setting there, for the same ONCEFLOW_* settings, is the compose file's, and the compose file sets nothing else."""
    from onceflow_dev import broker, credentials, tls

    s = embedded
    svcs = compose["services"]
    quorum = broker.nodes(s)
    assert [f"{n.host}:{n.port}" for n in quorum] == [f"kafka-{i}:9092" for i in (1, 2, 3)]
    jaas_key = f"listener.name.sasl_ssl.{s.kafka_sasl_mechanism.lower()}.sasl.jaas.config"
    admin_vars = set()
    for n in quorum:
        svc = svcs[f"kafka-{n.id}"]
        want = broker.server_properties(s, n, quorum)
        got = kafka_properties(env_of(svc))
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

        # the brokers' own login (inter-broker SCRAM): the same module, flag and user; the password from .env
        (w_mod, w_flag, w_opts), (g_mod, g_flag, g_opts) = jaas(want[jaas_key]), jaas(got[jaas_key])
        assert (g_mod, g_flag) == (w_mod, w_flag)
        assert set(g_opts) == set(w_opts) == {"username", "password"}
        assert g_opts["username"] == w_opts["username"] == acls.ADMIN
        assert w_opts["password"] == credentials.ensure(s)[acls.ADMIN]
        assert ref(g_opts["password"]), f"kafka-{n.id}: the admin's password must come from .env"
        admin_vars.add(ref(g_opts["password"]))

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
    assert len(admin_vars) == 1


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
    assert ref(env["KEYSTORE_PASSWORD"]), "the keystore password must come from .env"
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
    return cmd[2:]


def test_each_node_is_formatted_with_the_admins_scram_credential(compose, embedded):
    """Before a node's first start its storage is formatted as the embedded stack formats it (broker.start_node):
    the cluster's id, the node's configuration, its features, the admin's SCRAM credential (KIP-900)."""
    from onceflow_dev import broker, credentials

    s = embedded
    svcs = compose["services"]
    (want_flag, want_scram) = broker._scram_bootstrap(s)
    want_mech, want_cfg = want_scram.split("=", 1)
    want_features = re.findall(r'"--feature",\s*"([^"]+)"', inspect.getsource(broker.start_node))
    assert want_features, "onceflow_dev.broker.start_node formats with --feature ...: update this test"
    jaas_var = ref(
        jaas(env_of(svcs["kafka-1"])["KAFKA_LISTENER_NAME_SASL__SSL_SCRAM___SHA___512_SASL_JAAS_CONFIG"])[2]["password"]
    )
    cluster_ids = set()
    for b in BROKERS:
        fmt, node = svcs[f"{b}-format"], svcs[b]
        assert node["depends_on"][f"{b}-format"]["condition"] == "service_completed_successfully"
        assert env_of(fmt) == env_of(node), f"{b}-format must format with {b}'s own configuration"
        assert mounts(fmt)[b] == mounts(node)[b] == env_of(node)["KAFKA_LOG_DIRS"]
        assert fmt["image"] == node["image"]
        args = storage_format_args(fmt)
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
        assert ref(got["password"]) == jaas_var, "the admin's credential must be the password the brokers log in with"
        cluster_ids.add(env_of(node)["CLUSTER_ID"])
    assert len(cluster_ids) == 1
    (cluster_id,) = cluster_ids
    assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16, "a cluster id is a base64 UUID (random-uuid)"


@pytest.mark.skipif(not shutil.which("bash"), reason="docker/kafka-format.sh is a bash script")
def test_the_format_script_formats_with_the_configuration_the_broker_gets(compose, tmp_path):
    """docker/kafka-format.sh (with a stand-in kafka-storage.sh) writes the node's KAFKA_* variables as the image's
    wrapper writes them for the broker, and hands its arguments on."""
    svc = compose["services"]["kafka-2-format"]
    env = env_of(svc)
    out = tmp_path / "out"
    tool = tmp_path / "kafka-storage.sh"
    tool.write_text(
        '#!/usr/bin/env bash\nprintf "%s\\n" "$@" >"$OUT.args"\n'
        'while [[ $# -gt 0 ]]; do [[ $1 == --config ]] && cp "$2" "$OUT.properties"; shift; done\n'
    )
    tool.chmod(0o755)
    args = storage_format_args(svc)
    subprocess.run(
        ["bash", str(ROOT / "docker" / "kafka-format.sh"), *args],
        env={"PATH": os.environ["PATH"], **env, "STORAGE_TOOL": str(tool), "OUT": str(out)},
        check=True,
        capture_output=True,
        timeout=30,
    )
    written = dict(line.split("=", 1) for line in Path(f"{out}.properties").read_text().splitlines())
    assert written == server_config(env)
    called = Path(f"{out}.args").read_text().splitlines()
    assert called[:3] == ["format", "--cluster-id", env["CLUSTER_ID"]] and called[3] == "--config"
    assert called[5:] == args
    assert not Path(called[4]).exists(), "the configuration (it holds the admin's password) is removed"


def test_the_health_check_is_an_authenticated_tls_client(compose, embedded):
    """kafka-broker-api-versions.sh over SASL_SSL as the admin, the certificate checked against the CA."""
    s = embedded
    svcs = compose["services"]
    for b in BROKERS:
        svc = svcs[b]
        env = env_of(svc)
        kind, cmd = svc["healthcheck"]["test"]
        assert kind == "CMD-SHELL"
        tokens = shlex.split(cmd.replace("$$", "$"))  # compose's escape: the container's shell expands it
        start = tokens.index("printf") + 2
        end = next(i for i in range(start, len(tokens)) if tokens[i].startswith(">"))
        client = dict(t.split("=", 1) for t in tokens[start:end])
        target = tokens[end][1:]
        tool = tokens[end + 2]
        assert tool.endswith("kafka-broker-api-versions.sh")
        opts = dict(zip(tokens[end + 3 :: 2], tokens[end + 4 :: 2]))
        assert opts["--command-config"] == target
        host, port = opts["--bootstrap-server"].rsplit(":", 1)
        listener_port = {x.split("://")[0]: x.rsplit(":", 1)[1] for x in env["KAFKA_LISTENERS"].split(",")}
        assert host == "localhost" and port == listener_port[s.kafka_security_protocol]
        assert client["security.protocol"] == s.kafka_security_protocol == "SASL_SSL"
        assert client["sasl.mechanism"] == s.kafka_sasl_mechanism
        assert client["ssl.truststore.type"] == env["KAFKA_SSL_TRUSTSTORE_TYPE"]
        assert client["ssl.truststore.location"] == env["KAFKA_SSL_TRUSTSTORE_LOCATION"]
        # the broker's own login: the admin, whose password the container has
        var = client["sasl.jaas.config"].removeprefix("$")
        assert var in env and jaas(env[var])[2]["username"] == acls.ADMIN
        assert kafka_properties({var: "x"}) == {
            f"listener.name.sasl_ssl.{s.kafka_sasl_mechanism.lower()}.sasl.jaas.config": "x"
        }


def test_airflow_has_each_roles_connection_and_init_provisions_them(compose, embedded):
    """The Airflow containers get the connections `onceflow airflow up` gives the embedded Airflow
    (onceflow_dev.airflow_local.kafka_env), their passwords from .env; airflow-init creates each role's user with the
    password its connection carries, as the admin, whose credentials no long-running container holds."""
    from onceflow import cli
    from onceflow_dev import airflow_local, credentials

    s = embedded
    svcs = compose["services"]
    airflow_env = env_of(svcs["airflow-scheduler"])
    want = airflow_local.kafka_env(s)
    conns = {k: v for k, v in airflow_env.items() if k.startswith("AIRFLOW_CONN_ONCEFLOW_KAFKA")}
    assert set(conns) == set(want)
    known = credentials.ensure(s)
    role_vars = {}
    for key, spec in want.items():
        w, g = json.loads(spec), json.loads(conns[key])
        assert set(g) == set(w) == {"conn_type", "login", "password", "extra"}
        assert {k: g[k] for k in ("conn_type", "login", "extra")} == {k: w[k] for k in ("conn_type", "login", "extra")}
        assert w["password"] == known[w["login"]]
        assert ref(g["password"]), f"{key}: the password must come from .env"
        role_vars[w["login"]] = ref(g["password"])
    assert set(role_vars) == {acls.username(s, r) for r in acls.ROLES}
    assert len(set(role_vars.values())) == len(acls.ROLES), "one password per role"
    assert airflow_env["ONCEFLOW_KAFKA_CA_FILE"] == s.kafka_ca

    init = svcs["airflow-init"]
    init_env = env_of(init)
    assert {k: v for k, v in init_env.items() if k in airflow_env} == airflow_env
    jaas_password = jaas(env_of(svcs["kafka-1"])["KAFKA_LISTENER_NAME_SASL__SSL_SCRAM___SHA___512_SASL_JAAS_CONFIG"])[
        2
    ]["password"]
    assert init_env["ONCEFLOW_KAFKA_USERNAME"] == acls.ADMIN
    assert ref(init_env["ONCEFLOW_KAFKA_PASSWORD"]) == ref(jaas_password)
    for role in acls.ROLES:
        assert ref(init_env[f"ONCEFLOW_KAFKA_{role.upper()}_PASSWORD"]) == role_vars[acls.username(s, role)]
    steps = [x.strip() for x in init["command"][-1].split("&&")]
    assert steps == ["airflow db migrate", "onceflow stack provision", "onceflow stack topics"]
    for step in steps[1:]:
        cli.parser().parse_args(step.split()[1:])  # the CLI has the command
    for name in AIRFLOW_SERVICES:
        env = env_of(svcs[name])
        assert "ONCEFLOW_KAFKA_PASSWORD" not in env and "ONCEFLOW_KAFKA_USERNAME" not in env
        assert ref(jaas_password) not in {m["var"] for v in env.values() for m in REF.finditer(v)}


def test_no_secret_is_written_in_the_compose_file(compose):
    """Every password, in every form the file holds one (variables, JAAS, --add-scram, connections, URLs), is a
    compose interpolation that fails while unset; each such variable is in .env.example, which holds no value; .env,
    where an operator puts them, is git-ignored and .env.example is not."""
    found: dict[str, list[str]] = {"variable": [], "jaas": [], "scram": [], "connection": [], "url": []}

    def strings(node, key=""):
        if isinstance(node, dict):
            for k, v in node.items():
                yield from strings(v, str(k))
        elif isinstance(node, list):
            for v in node:
                yield from strings(v, key)
        elif node is not None:
            yield key, str(node)

    for key, value in strings(compose):
        if re.search(r"(PASSWORD|SECRET)$", key):
            found["variable"].append(value)
        found["jaas"] += re.findall(r'password="([^"]*)"', value)
        found["scram"] += re.findall(r"\[[^\]]*password=([^,\]\"]+)", value)
        found["url"] += re.findall(r"://[^:/@\s]+:(\$\{[^}]*\}|[^@\s]+)@", value)
        if key.startswith("AIRFLOW_CONN_"):
            spec = json.loads(value)
            if "password" in spec:
                found["connection"].append(spec["password"])
    assert all(found.values()), f"a form of password was not found at all: {found}"
    literal = {form: [v for v in values if not ref(v)] for form, values in found.items()}
    assert not any(literal.values()), f"passwords written in docker-compose.yaml: {literal}"

    text = (ROOT / "docker-compose.yaml").read_text()
    referenced = {m["var"] for m in REF.finditer(text) if text[m.start() - 1 : m.start()] != "$"}
    example = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            example[name.strip()] = value.strip()
    assert set(example) == referenced, "every variable docker-compose.yaml needs, and no other, is in .env.example"
    assert not any(example.values()), ".env.example holds no values: the operator fills them in .env"

    def ignored(path: str) -> bool:
        if shutil.which("git"):
            r = subprocess.run(
                ["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT, capture_output=True, timeout=30
            )
            if r.returncode in (0, 1):
                return r.returncode == 0
        patterns = [p.strip() for p in (ROOT / ".gitignore").read_text().splitlines()]
        return any(p in (path, f"/{path}") for p in patterns)

    assert ignored(".env") and not ignored(".env.example")


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
