"""The secured cluster's settings, ACL declaration and credentials: pure, no broker."""

from __future__ import annotations

import json

import pytest

from onceflow import config
from onceflow.config import ConfigError
from onceflow.kafka import acls, clients


def secured(tmp_path, **kw) -> config.Settings:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    given = {
        "kafka_security_protocol": "SASL_SSL",
        "kafka_username": "onceflow.ip_count.job",
        "kafka_password": "s3cret-pw",
        "kafka_ca_file": str(ca),
    }
    return config.load(env={}, var_dir=tmp_path, **(given | kw))


def test_the_password_is_never_in_repr_as_dict_but_reaches_children_in_their_environment(tmp_path):
    s = secured(tmp_path)
    assert "s3cret-pw" not in repr(s)
    assert "s3cret-pw" not in json.dumps(s.as_dict(), default=str)
    assert s.as_dict()["kafka_password"] == "***"
    assert s.as_env()["ONCEFLOW_KAFKA_PASSWORD"] == "s3cret-pw"
    assert config.load(env=s.as_env()).kafka_password == "s3cret-pw"


def test_bad_security_settings_are_refused_with_what_to_change(tmp_path):
    with pytest.raises(ConfigError, match="KAFKA_SECURITY_PROTOCOL takes PLAINTEXT or SASL_SSL"):
        config.load(env={"ONCEFLOW_KAFKA_SECURITY_PROTOCOL": "SSL"})
    with pytest.raises(ConfigError, match="KAFKA_SASL_MECHANISM"):
        config.load(env={"ONCEFLOW_KAFKA_SASL_MECHANISM": "PLAIN"})
    no_creds = secured(tmp_path).replace(kafka_password="")
    with pytest.raises(ConfigError, match="ONCEFLOW_KAFKA_USERNAME and ONCEFLOW_KAFKA_PASSWORD"):
        clients.base(no_creds)
    no_ca = secured(tmp_path).replace(kafka_ca_file=str(tmp_path / "nope.pem"))
    with pytest.raises(ConfigError, match="ONCEFLOW_KAFKA_CA_FILE"):
        clients.base(no_ca)


def test_client_settings_librdkafka_and_java(tmp_path):
    assert clients.security(config.load(env={})) == {} and config.load(env={}).kafka_java_security() == {}
    s = secured(tmp_path, kafka_password='pa"ss\\word')
    c = clients.base(s)
    assert c["security.protocol"] == "SASL_SSL" and c["sasl.mechanism"] == "SCRAM-SHA-512"
    assert c["sasl.username"] == "onceflow.ip_count.job" and c["ssl.ca.location"] == s.kafka_ca
    j = s.kafka_java_security()
    assert j["ssl.truststore.type"] == "PEM" and j["ssl.truststore.location"] == s.kafka_ca
    # quotes and backslashes escaped inside the JAAS string
    assert j["sasl.jaas.config"].endswith('password="pa\\"ss\\\\word";')
    from onceflow.spark.kafka_source import kafka_options

    opts = kafka_options(s)
    assert opts["kafka.sasl.jaas.config"] == j["sasl.jaas.config"]
    assert opts["groupIdPrefix"] == f"{s.reader_group}.spark"


def test_each_role_is_allowed_what_its_code_uses_and_no_other_apps_resources():
    s = config.load(env={})
    other = s.replace(
        app_id="other",
        source_topic="o.source",
        sink_topic="o.sink",
        dlq_topic="o.dlq",
        ledger_topic="o.ledger",
        events_topic="o.events",
        job_events_topic="o.job_events",
        alerts_topic="o.alerts",
        health_topic="o.health",
        reconciliation_topic="o.recon",
        backfill_topic="o.backfill",
    )
    mine = {(a.resource, a.name, a.pattern) for a in acls.all_required(s)}
    theirs = {(a.resource, a.name, a.pattern) for a in acls.all_required(other)}
    assert mine & theirs == {("CLUSTER", "kafka-cluster", "LITERAL")}
    # no prefix of one app matches a resource of the other
    for a in acls.all_required(s):
        if a.pattern == "PREFIXED":
            assert not any(name.startswith(a.name) for _, name, _ in theirs), a
    job = {(a.resource, a.name, a.operation) for a in acls.required(s, "job")}
    assert ("TOPIC", s.sink_topic, "WRITE") in job and ("TOPIC", s.sink_topic, "READ") not in job
    assert ("TRANSACTIONAL_ID", s.transactional_id, "WRITE") in job
    assert not any(r == "TOPIC" and op in ("CREATE", "DELETE", "ALTER", "ALL") for r, _, op in job)
    recon = acls.required(s, "reconcile")
    writes = {a.name for a in recon if a.operation == "WRITE"}
    assert writes == {s.reconciliation_topic, f"{s.transactional_id}.reconciliation"}
    backfill_txn = [a for a in acls.required(s, "backfill") if a.resource == "TRANSACTIONAL_ID"]
    assert [(a.name, a.pattern) for a in backfill_txn] == [(f"{s.transactional_id}.backfill.", "PREFIXED")]
    assert "job" not in {a.principal.split(".")[-1] for a in acls.required(s, "control")}


def test_grant_commands_are_kafka_acls_lines():
    s = config.load(env={})
    lines = acls.commands(s)
    assert len(lines) == len(acls.all_required(s))
    assert (
        "kafka-acls.sh --bootstrap-server 127.0.0.1:9092 --command-config admin.properties --add --allow-principal "
        "User:onceflow.ip_count.backfill --operation Write --transactional-id onceflow.ip_count.backfill. "
        "--resource-pattern-type prefixed"
    ) in lines
    assert any("--operation DescribeConfigs --cluster" in x for x in lines)


def test_each_airflow_role_takes_its_principal_from_its_connection_and_no_password_reaches_argv(monkeypatch, tmp_path):
    """The DAGs' settings: the endpoint and the control plane's principal from `onceflow_kafka`, the job's from
    `onceflow_kafka_job` (a health restart too); the spark-submit command carries no password."""
    from onceflow.control import orchestration

    ca = tmp_path / "ca.pem"
    ca.write_text("pem")
    extra = {"bootstrap.servers": "k1:9093,k2:9093", "security.protocol": "sasl_ssl", "ssl.ca.location": str(ca)}
    for conn_id, user, pw in (
        ("ONCEFLOW_KAFKA", "onceflow.ip_count.control", "control-pw"),
        ("ONCEFLOW_KAFKA_JOB", "onceflow.ip_count.job", "job-pw"),
    ):
        spec = {"conn_type": "kafka", "login": user, "password": pw, "extra": extra}
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id}", json.dumps(spec))
    for k in [k for k in __import__("os").environ if k.startswith("ONCEFLOW_")]:
        monkeypatch.delenv(k)
    control = orchestration.settings()
    assert (control.kafka_username, control.kafka_password) == ("onceflow.ip_count.control", "control-pw")
    assert control.secured and control.bootstrap_servers == "k1:9093,k2:9093" and control.kafka_ca == str(ca)
    job = orchestration.settings(role="job")
    assert (job.kafka_username, job.kafka_password, job.bootstrap_servers) == (
        "onceflow.ip_count.job",
        "job-pw",
        "k1:9093,k2:9093",
    )
    assert orchestration.for_role(control, "job").kafka_password == "job-pw"  # health's restart
    argv = orchestration.spark_submit_argv(job)
    assert not any("job-pw" in a for a in argv)


def test_another_app_instance_takes_its_own_principals_and_never_the_environments(monkeypatch, tmp_path):
    """A control plane of two instances (ONCEFLOW_APPS): the second's control plane and job run as its own
    principals, from `onceflow_kafka_<app_id>[_<role>]`; without those connections it is refused with the
    connection to create, never run as the first instance's principal."""
    from onceflow.control import orchestration

    ca = tmp_path / "ca.pem"
    ca.write_text("pem")
    extra = {"bootstrap.servers": "k1:9093", "security.protocol": "sasl_ssl", "ssl.ca.location": str(ca)}
    for k in [k for k in __import__("os").environ if k.startswith("ONCEFLOW_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("ONCEFLOW_APPS", "ip_count,nets=ip_count")

    def connection(conn_id, user):
        spec = {"conn_type": "kafka", "login": user, "password": f"{user}-pw", "extra": extra}
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id}", json.dumps(spec))

    connection("ONCEFLOW_KAFKA", "onceflow.ip_count.control")
    connection("ONCEFLOW_KAFKA_JOB", "onceflow.ip_count.job")
    with pytest.raises(ConfigError, match="no Airflow connection onceflow_kafka_nets with the Kafka credentials of "):
        orchestration.settings(app_id="nets")
    with pytest.raises(ConfigError, match="onceflow_kafka_nets_job .* onceflow.nets.job"):
        orchestration.settings(role="job", app_id="nets")
    connection("ONCEFLOW_KAFKA_NETS", "onceflow.nets.control")
    connection("ONCEFLOW_KAFKA_NETS_JOB", "onceflow.nets.job")
    control = orchestration.settings(app_id="nets")
    assert (control.app_id, control.kafka_username, control.kafka_password, control.bootstrap_servers) == (
        "nets",
        "onceflow.nets.control",
        "onceflow.nets.control-pw",
        "k1:9093",
    )
    assert orchestration.settings(role="job", app_id="nets").kafka_username == "onceflow.nets.job"
    assert orchestration.for_role(control, "job").kafka_username == "onceflow.nets.job"  # health's restart
    # the environment's own instance keeps its connections
    assert orchestration.settings(role="job").kafka_username == "onceflow.ip_count.job"
    assert orchestration.settings().kafka_username == "onceflow.ip_count.control"


def test_only_the_job_may_write_its_events_topic_and_who_reads_it():
    """The job's facts (a batch committed, progress, a transaction timed out) come from the job events topic, which
    no principal but the app's job may write: not a backfill, not the control plane, not another app's job."""
    s = config.load(env={})
    assert s.job_events_topic != s.events_topic
    rights = {
        role: {a.operation for a in acls.required(s, role) if a.resource == "TOPIC" and a.name == s.job_events_topic}
        for role in acls.ROLES
    }
    assert rights == {"job": {"WRITE", "READ"}, "backfill": set(), "control": {"READ"}, "reconcile": {"READ"}}
    writers = {a.principal for a in acls.all_required(s) if a.name == s.job_events_topic and a.operation == "WRITE"}
    assert writers == {acls.principal(s, "job")}
    other = s.replace(app_id="other", job_events_topic="other_events", events_topic=s.events_topic)
    assert not any(a.name == s.job_events_topic for a in acls.all_required(other))
    # the shared topic: everyone else's events (the job's deploy actions: savepoints and restores)
    shared = {
        role: {a.operation for a in acls.required(s, role) if a.resource == "TOPIC" and a.name == s.events_topic}
        for role in acls.ROLES
    }
    assert shared == {"job": {"WRITE"}, "backfill": {"WRITE"}, "control": {"READ", "WRITE"}, "reconcile": set()}


def _msg(offset: int, value, key: bytes | None = b"ip_count", ts: int = 0):
    from onceflow.kafka import reading

    raw = value if value is None or isinstance(value, bytes) else json.dumps(value).encode()
    return reading.Msg(0, offset, key, raw, {}, ts)


def test_events_are_read_each_type_from_its_topic_only(monkeypatch):
    """A job fact on the shared topic (forged by a backfill's or the control plane's principal) is never taken for
    the job's; records not keyed by the app, not JSON or of another app are skipped; both topics merge by time."""
    from onceflow import wire
    from onceflow.kafka import events as ev
    from onceflow.kafka import reading

    s = config.load(env={})

    def e(type_, ts, **kw):
        return {"type": type_, "app": s.app_id, "ts_ms": ts, "host": "h", "pid": 1} | kw

    topics = {
        s.job_events_topic: [
            _msg(0, e(wire.BATCH_COMMITTED, 10, batch=1)),
            _msg(1, e(wire.PROGRESS, 11, batch=1)),
            _msg(2, b"not json"),
            _msg(3, None),
            _msg(4, e(wire.FAULT_INJECTED, 12, fault="f")),
            _msg(5, e(wire.SAVEPOINT_CREATED, 13)),  # not a job fact: not taken from here
            _msg(6, e(wire.BATCH_COMMITTED, 30, batch=2)),
        ],
        s.events_topic: [
            _msg(0, e(wire.BATCH_COMMITTED, 20, batch=99, host="elsewhere")),  # forged
            _msg(1, e(wire.PROGRESS, 21, batch=99)),  # forged
            _msg(2, e(wire.SAVEPOINT_CREATED, 22, id="sp")),
            _msg(3, e(wire.BACKFILL_DONE, 23), key=b"other"),  # another app's key
            _msg(4, e(wire.BACKFILL_DONE, 24) | {"app": "other"}),  # keyed by the app, but of another app
            _msg(5, e(wire.FAULT_INJECTED, 25, fault="g")),
            _msg(6, e(wire.BACKFILL_DONE, 26, id="b")),
        ],
    }
    read = []

    def read_topic(settings, topic, isolation="read_committed", timeout_s=120.0, since_ms=None):
        read.append(topic)
        return topics[topic]

    monkeypatch.setattr(reading, "read_topic", read_topic)
    committed = ev.read(s, {wire.BATCH_COMMITTED})
    assert [x["batch"] for x in committed] == [1, 2] and read == [s.job_events_topic]
    read.clear()
    assert [x["batch"] for x in ev.read(s, [wire.PROGRESS])] == [1]
    read.clear()
    assert [x["id"] for x in ev.read(s, {wire.SAVEPOINT_CREATED})] == ["sp"] and read == [s.events_topic]
    assert [x["fault"] for x in ev.read(s, {wire.FAULT_INJECTED})] == ["f", "g"]  # each from its writer's topic
    assert [x["ts_ms"] for x in ev.read(s)] == [10, 11, 12, 22, 25, 26, 30]  # every type, merged by time
    assert [x["ts_ms"] for x in ev.read(s, {wire.BACKFILL_DONE}, any_app=True)] == [23, 24, 26]
    assert wire.BATCH_COMMITTED in wire.JOB_EVENTS and not wire.JOB_EVENTS & {
        wire.SAVEPOINT_CREATED,
        wire.SAVEPOINT_RESTORED,
        wire.RECORDS_QUARANTINED,
        wire.BACKFILL_STARTED,
        wire.BACKFILL_DONE,
    }


def test_the_job_publishes_its_events_on_its_own_topic_everyone_else_on_the_shared_one():
    from onceflow.kafka import events as ev

    class Producer:
        def __init__(self):
            self.sent: list[str] = []

        def produce(self, topic, key, value):
            self.sent.append(topic)

        def poll(self, _):
            pass

    s = config.load(env={})
    job, other = Producer(), Producer()
    ev.EventBus.for_job(s, job).emit("batch_committed")
    ev.EventBus(s, other).emit("savepoint_created")
    assert (job.sent, other.sent) == ([s.job_events_topic], [s.events_topic])


def test_a_table_sinks_roles_take_their_database_role_from_their_own_connection(monkeypatch):
    """A postgres-sink app under Airflow: the job (deploy, health's restart) writes as the job's database role,
    the console and the reconciliation read as the reader's, a backfill gets none; each from its own connection."""
    from onceflow.control import orchestration

    for k in [k for k in __import__("os").environ if k.startswith("ONCEFLOW_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("ONCEFLOW_SINK_KIND", "postgres")
    for purpose in ("job", "reader"):
        spec = {
            "conn_type": "postgres",
            "host": "db",
            "port": 6543,
            "login": f"r-{purpose}",
            "password": f"{purpose}-pw",
        }
        monkeypatch.setenv(
            f"AIRFLOW_CONN_ONCEFLOW_POSTGRES_IP_COUNT_{purpose.upper()}", json.dumps(spec | {"schema": "d"})
        )
    job = orchestration.settings(role="job")
    assert (job.postgres_user, job.postgres_password, job.postgres_host, job.postgres_port) == (
        "r-job",
        "job-pw",
        "db",
        6543,
    )
    assert job.postgres_database == "d"
    for reader in (orchestration.settings(), orchestration.settings(role="reconcile")):
        assert (reader.postgres_user, reader.postgres_password) == ("r-reader", "reader-pw")
    assert orchestration.settings(role="backfill").postgres_password == ""
    assert orchestration.for_role(orchestration.settings(), "job").postgres_password == "job-pw"  # health's restart
    monkeypatch.setenv("ONCEFLOW_SINK_KIND", "kafka")
    assert orchestration.settings(role="job").postgres_password == ""  # a Kafka sink's job holds no database role


def test_the_embedded_stack_gives_airflow_each_database_role_as_a_connection_the_dags_read(monkeypatch, tmp_path):
    """`airflow up` on a stack started with --postgres: the job's and the reader's roles as Airflow connections in
    Airflow's environment (onceflow_dev.airflow_local.database_env), read back by the DAGs' settings."""
    from onceflow import config
    from onceflow.control import orchestration
    from onceflow_dev import airflow_local, postgres
    from onceflow_dev.private_files import write_private

    s = config.load(env={}, var_dir=tmp_path)
    assert airflow_local.database_env(s) == {}  # no sink database: nothing
    roles = {"onceflow_ip_count_job": "j-pw", "onceflow_ip_count_reader": "r-pw"}
    write_private(tmp_path / "postgres.json", json.dumps({"port": 45678, "password": "su", "roles": roles}))
    env = airflow_local.database_env(s)
    assert sorted(env) == [
        "AIRFLOW_CONN_ONCEFLOW_POSTGRES_IP_COUNT_JOB",
        "AIRFLOW_CONN_ONCEFLOW_POSTGRES_IP_COUNT_READER",
    ]
    assert "su" not in json.dumps(env)  # the server's own password is Airflow's metadata database's, not the DAGs'
    assert postgres.serves_sinks(s)
    for k in [k for k in __import__("os").environ if k.startswith("ONCEFLOW_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("ONCEFLOW_SINK_KIND", "postgres")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    job = orchestration.settings(role="job")
    assert (job.postgres_port, job.postgres_user, job.postgres_password) == (45678, "onceflow_ip_count_job", "j-pw")
    assert orchestration.settings().postgres_password == "r-pw"


def test_an_apps_named_outputs_are_written_by_its_job_and_read_by_its_control_plane_and_reconciliation():
    s = config.load(env={}, app="ip_networks")
    unlisted = s.outputs["unlisted"]
    assert ("TOPIC", unlisted, "WRITE") in {(a.resource, a.name, a.operation) for a in acls.required(s, "job")}
    for role in ("control", "reconcile"):
        assert ("TOPIC", unlisted, "READ") in {(a.resource, a.name, a.operation) for a in acls.required(s, role)}
    backfill = {a.name for a in acls.required(s, "backfill") if a.resource == "TOPIC"}
    assert unlisted not in backfill  # a backfill writes its own target topic, never the live outputs


def test_an_apps_source_topics_are_read_by_every_role_that_reads_its_source():
    s = config.load(env={}, app="ip_networks")
    assert len(s.source_topic_list) == 2
    for role in ("job", "control", "reconcile", "backfill"):
        granted = {(a.name, a.operation) for a in acls.required(s, role) if a.resource == "TOPIC"}
        assert {(t, "READ") for t in s.source_topic_list} <= granted, role
    job = {(a.name, a.operation) for a in acls.required(s, "job") if a.resource == "TOPIC"}
    assert {(t, "DESCRIBE_CONFIGS") for t in s.source_topic_list} <= job  # preflight: who stamps each
    assert not {(t, "WRITE") for t in s.source_topic_list} & job  # the job never writes its sources
