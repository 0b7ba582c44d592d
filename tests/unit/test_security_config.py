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
    with pytest.raises(ConfigError, match="KAFKA_SECURITY_PROTOCOL is PLAINTEXT or SASL_SSL"):
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
