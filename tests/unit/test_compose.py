"""docker-compose.yaml (not startable here: no Docker engine) checked against onceflow's configuration."""

from pathlib import Path

import pytest
import yaml

from onceflow import config
from onceflow.kafka import topics

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((ROOT / "docker-compose.yaml").read_text())


def env_of(svc) -> dict:
    return {k: str(v) for k, v in (svc.get("environment") or {}).items()}


def test_services_and_health_checks(compose):
    svcs = compose["services"]
    expected = {
        "kafka-1",
        "kafka-2",
        "kafka-3",
        "spark-master",
        "spark-worker-1",
        "spark-worker-2",
        "postgres",
        "airflow-init",
        "airflow-apiserver",
        "airflow-scheduler",
        "airflow-dag-processor",
        "airflow-triggerer",
    }
    assert expected <= set(svcs)
    for name, svc in svcs.items():
        if name != "airflow-init":
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
        assert env["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://kafka-{i}:9092"
        voters.add(env["KAFKA_CONTROLLER_QUORUM_VOTERS"])
    assert voters == {"1@kafka-1:9093,2@kafka-2:9093,3@kafka-3:9093"}


def test_onceflow_settings_match_the_topology(compose):
    svcs = compose["services"]
    airflow_env = env_of(svcs["airflow-scheduler"])
    onceflow_env = {k: v for k, v in airflow_env.items() if k.startswith(config.ENV_PREFIX)}
    s = config.load(env=onceflow_env)  # every name is a real setting and every value validates
    unknown = {
        k for k in onceflow_env if k[len(config.ENV_PREFIX) :].lower() not in config.Settings.__dataclass_fields__
    }
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
    assert airflow_env["AIRFLOW_CONN_ONCEFLOW_KAFKA"].count("kafka-") == 3
    for name in ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"):
        assert env_of(svcs[name]) == airflow_env, f"{name} must share the same configuration"


# Settings the loopback stack picks for a small, fast machine and a production cluster keeps at Kafka's defaults.
EMBEDDED_ONLY = {
    "offsets.topic.num.partitions": "4 on loopback (fast start); Kafka's 50 in production",
    "transaction.state.log.num.partitions": "4 on loopback (fast start); Kafka's 50 in production",
}
# Where each node is: compared by structure, not by value (ports and paths differ by design).
PLACEMENT = {"node.id", "controller.quorum.voters", "listeners", "advertised.listeners", "log.dirs"}


def kafka_properties(env: dict) -> dict:
    """The apache/kafka image's mapping: KAFKA_FOO_BAR=v becomes the server property foo.bar=v."""
    return {k[len("KAFKA_") :].lower().replace("_", "."): v for k, v in env.items() if k.startswith("KAFKA_")}


def test_each_broker_runs_what_the_embedded_cluster_nodes_run(compose, tmp_path):
    """`onceflow stack up --brokers 3` writes each node's server.properties (onceflow_dev.broker); every setting
    there, for the same ONCEFLOW_* settings, is the compose file's, and the compose file sets nothing else."""
    from onceflow_dev import broker

    svcs = compose["services"]
    onceflow_env = {k: v for k, v in env_of(svcs["airflow-scheduler"]).items() if k.startswith(config.ENV_PREFIX)}
    s = config.load(env=onceflow_env, var_dir=tmp_path)
    assert s.brokers == 3 and s.replication_factor == 3 and s.min_insync_replicas == 2
    quorum = broker.nodes(s)
    assert [f"{n.host}:{n.port}" for n in quorum] == [f"kafka-{i}:9092" for i in (1, 2, 3)]
    for n in quorum:
        want = broker.server_properties(s, n, quorum)
        got = kafka_properties(env_of(svcs[f"kafka-{n.id}"]))
        differs = {
            k: (want.get(k), got.get(k))
            for k in set(want) | set(got)
            if k not in PLACEMENT and k not in EMBEDDED_ONLY and want.get(k) != got.get(k)
        }
        assert not differs, f"kafka-{n.id} and the embedded node {n.id} differ: {differs}"
        assert got["node.id"] == want["node.id"]
        assert got["advertised.listeners"] == want["advertised.listeners"]

        def voters(v: str) -> list[str]:
            return [x.rsplit(":", 1)[0] for x in v.split(",")]  # id@host, without the controller port

        assert voters(got["controller.quorum.voters"]) == voters(want["controller.quorum.voters"])

        def names(v: str) -> list[str]:
            return sorted(x.split("://")[0] for x in v.split(","))

        assert names(got["listeners"]) == names(want["listeners"])
    assert set(EMBEDDED_ONLY) <= set(broker.server_properties(s, quorum[0], quorum))


def test_two_spark_workers_reach_the_checkpoint_the_driver_writes(compose):
    """`--spark-workers 2`; the executors write the checkpoint's state: every worker mounts the volume that holds
    it at the path the driver (in the Airflow containers) uses."""
    svcs = compose["services"]
    workers = sorted(n for n in svcs if n.startswith("spark-worker-"))
    assert workers == ["spark-worker-1", "spark-worker-2"]
    s = config.load(env={k: v for k, v in env_of(svcs["airflow-scheduler"]).items() if k.startswith("ONCEFLOW_")})
    checkpoint_path = s.checkpoint.removeprefix("file://")
    driver_mounts = {v.split(":")[0]: v.split(":")[1] for v in svcs["airflow-scheduler"]["volumes"]}
    for name in workers:
        svc = svcs[name]
        assert s.master in svc["command"]
        mounts = {v.split(":")[0]: v.split(":")[1] for v in svc.get("volumes", [])}
        shared = [vol for vol, path in mounts.items() if driver_mounts.get(vol) == path]
        assert any(checkpoint_path.startswith(mounts[vol]) for vol in shared), f"{name} cannot reach {s.checkpoint}"
