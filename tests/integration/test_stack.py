"""The embedded stack: the broker from Maven jars, the topics with explicit settings, the CLI around them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka.admin import ConfigResource, ResourceType

from onceflow import config
from onceflow.kafka import clients as kafka_clients
from onceflow.kafka import topics
from onceflow.runtime import jvm, launcher
from onceflow_dev import broker

pytestmark = pytest.mark.integration


def test_topics_have_explicit_settings(app):
    s = app()
    admin = kafka_clients.admin(s)
    md = admin.list_topics(timeout=10).topics
    for spec in topics.specs(s):
        assert len(md[spec.name].partitions) == spec.partitions
        res = ConfigResource(ResourceType.TOPIC, spec.name)
        cfg = admin.describe_configs([res])[res].result(10)
        for k, v in spec.config.items():
            assert cfg[k].value == v, (spec.name, k)
    assert len(md[s.source_topic].partitions) == 4
    assert len(md[s.ledger_topic].partitions) == 1
    assert topics.check(s) == []
    assert topics.ensure(s) == []  # idempotent


def test_broker_runs_transactions_v2(kafka):
    base = kafka
    from onceflow_dev import broker

    log = broker.paths(base).server_log.read_text()
    assert "transaction.version=2" in log or "transaction.version to 2" in log


def test_jvm_artifacts_are_cached(kafka, monkeypatch):
    base = kafka

    def no_maven(*a, **k):
        raise AssertionError("Maven ran again although the jars are cached")

    monkeypatch.setattr(subprocess, "run", no_maven)
    assert any(
        p.name.startswith("kafka_2.13-") for p in jvm.resolve("kafka-broker", base, broker.DEV_POMS).glob("*.jar")
    )
    names = [p.name for p in jvm.spark_kafka_jars(base)]
    assert any(n.startswith("spark-sql-kafka-0-10_2.13-") for n in names)
    assert not any(n.startswith("scala-library") for n in names), "pyspark already ships scala"


MAPS_ITS_ARCHIVE = """
import os, sys
from pyspark.sql import SparkSession
s = SparkSession.builder.getOrCreate()
maps = open(f"/proc/{os.getppid()}/maps").read()  # spark-submit's JVM starts this script
print("MAPPED" if sys.argv[1] in maps else "NOT MAPPED")
s.stop()
"""


def _mapped_archives(pid: int) -> set[str]:
    return {line.split()[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if line.endswith(".jsa")}


def test_the_sessions_spark_jvms_map_the_class_archive(spark, tmp_path):
    """Every Spark JVM of a test session maps the shared class-data archive (tests/conftest.py): the session's own,
    and a driver launched as the jobs' drivers are (spark-submit with the platform's local file system before Spark's
    jars, onceflow.runtime.local_fs), which did not from 2026-11-29 to 2026-11-30: the archive had been dumped
    without that class path, and a JVM whose class path does not start with the dump's ignores it. On a pytest-xdist
    worker too: the workers inherit the controller's SPARK_SUBMIT_OPTS, which they once took for a caller's own.
    And the platform's own launch with ONCEFLOW_CLASS_DATA_SHARING maps the same archive through its options. Read
    from /proc/<pid>/maps: a JVM that rejects the archive has it on its command line all the same."""
    if not os.environ.get("SPARK_SUBMIT_OPTS", "").startswith("-XX:TieredStopAtLevel=1"):  # not the suite's own
        pytest.skip("the caller set SPARK_SUBMIT_OPTS: the suite leaves a caller's JVM options as they are")
    opts = os.environ["SPARK_SUBMIT_OPTS"].split()
    archive = next((o.split("=", 1)[1] for o in opts if o.startswith("-XX:SharedArchiveFile=")), None)
    assert archive and Path(archive).is_file(), opts
    assert archive in _mapped_archives(spark.sparkContext._gateway.proc.pid)
    script = tmp_path / "maps.py"
    script.write_text(MAPS_ITS_ARCHIVE)
    s = config.load(env={}, var_dir=tmp_path)
    fs_conf = launcher.local_fs_conf(s, (tmp_path / "checkpoint").as_uri())
    assert fs_conf.get("spark.driver.extraClassPath"), fs_conf  # the jobs' class path, with javac on this machine
    # the suite's way (SPARK_SUBMIT_OPTS), and the platform's (ONCEFLOW_CLASS_DATA_SHARING: the launch's own options,
    # the same archive, found by its name)
    platform = launcher.with_class_data(s.replace(class_data_sharing=True), fs_conf)
    assert platform["spark.driver.extraJavaOptions"].endswith(f"-XX:SharedArchiveFile={archive}"), platform
    for conf, submit_opts in ((fs_conf, os.environ["SPARK_SUBMIT_OPTS"]), (platform, "-XX:TieredStopAtLevel=1")):
        argv = [launcher.spark_submit(), "--master", "local[1]"]
        for k, v in conf.items():
            argv += ["--conf", f"{k}={v}"]
        env = {**launcher.submit_env(s), "SPARK_SUBMIT_OPTS": submit_opts}
        proc = subprocess.run([*argv, str(script), archive], env=env, capture_output=True, text=True, timeout=300)
        assert proc.stdout.strip().splitlines()[-1:] == ["MAPPED"], (proc.stdout[-2000:], proc.stderr[-3000:])
        assert "Unable to use shared archive" not in proc.stdout + proc.stderr


def test_cli_stack_status_json(kafka):
    base = kafka
    env = base.as_env()
    out = subprocess.run(
        [sys.executable, "-m", "onceflow.cli", "stack", "status", "--json"],
        env={**env, "PATH": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    st = json.loads(out.stdout)
    assert st["broker"]["running"] and st["bootstrap_servers"] == base.bootstrap_servers


def test_missing_topic_is_reported(app):
    s = app().replace(sink_topic="no_such_topic")
    assert any("no_such_topic is missing" in p for p in topics.check(s))


def test_the_embedded_postgresql_is_private_to_loopback_and_airflow(tmp_path):
    """Airflow's metadata database (onceflow_dev.postgres): Debian's server, a cluster of its own under var/ (or
    /var/tmp when the server's user cannot reach var/), listening on one loopback port and no Unix socket, its
    password in a 0600 file; stopped and started again with its data; removed without a trace."""
    import stat
    from pathlib import Path

    from onceflow import config
    from onceflow.runtime import procs
    from onceflow_dev import postgres

    s = config.load(env={}, var_dir=tmp_path / "var")
    try:
        url = postgres.up(s)
        info = postgres.state(s)
        assert url.startswith("postgresql+psycopg2://airflow:") and f"@127.0.0.1:{info['port']}/airflow" in url
        assert stat.S_IMODE((s.var_dir / "postgres.json").stat().st_mode) == 0o600
        pids = procs.with_descendants([postgres.server_pid(s)])
        assert {(x.host, x.port) for x in procs.listening_sockets(pids)} == {("127.0.0.1", info["port"])}
        assert not list(postgres.home(s).resolve().rglob(".s.PGSQL.*"))  # no Unix socket
        env = (Path("/proc") / str(postgres.server_pid(s)) / "environ").read_bytes().split(b"\0")
        assert not [e for e in env if e.startswith(b"ONCEFLOW_")], "the server holds none of the caller's settings"
        postgres.query(s, "CREATE TABLE kept (n int)")
        postgres.query(s, "INSERT INTO kept VALUES (7) RETURNING n")
        assert postgres.down(s) and not postgres.running(s)
        assert postgres.up(s) == url  # the same cluster, port and password
        assert postgres.query(s, "SELECT n FROM kept") == [(7,)]
    finally:
        target = postgres.home(s).resolve()
        postgres.remove(s)
    assert not target.exists() and not postgres.running(s)
