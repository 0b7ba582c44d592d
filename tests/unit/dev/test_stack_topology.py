"""The embedded stack remembers how it was started (<var_dir>/stack.json), as a compose project does: the CLI's
later commands use that topology in a shell that exported nothing, and `stack down` stops everything it started,
whatever the shell says."""

from __future__ import annotations

import json

import pytest

from onceflow import cli, config
from onceflow_dev import cli as dev_cli
from onceflow_dev import stack


@pytest.fixture
def remembered(tmp_path, monkeypatch):
    """A 3-node stack with a Spark cluster, remembered under a var dir; the shell then exports only that var dir."""
    for k in list(__import__("os").environ):
        if k.startswith(config.ENV_PREFIX):
            monkeypatch.delenv(k)
    s = config.load(
        env={},
        var_dir=tmp_path,
        brokers=3,
        bootstrap_servers="127.0.0.1:19092",
        controller_port=19093,
        master="spark://127.0.0.1:17077",
        broker_heap="256m",
    )
    stack.remember(s, spark_workers=2)
    monkeypatch.setenv("ONCEFLOW_VAR_DIR", str(tmp_path))
    return s


def test_the_topology_is_written_where_the_stack_lives_and_read_back(remembered, tmp_path):
    got = json.loads((tmp_path / config.STACK_FILE).read_text())
    assert got["spark_workers"] == 2
    env = config.remembered_stack(tmp_path)
    assert env["ONCEFLOW_BROKERS"] == "3" and env["ONCEFLOW_MASTER"] == "spark://127.0.0.1:17077"
    assert env["ONCEFLOW_BOOTSTRAP_SERVERS"] == "127.0.0.1:19092,127.0.0.1:19102,127.0.0.1:19112"
    assert "ONCEFLOW_KAFKA_PASSWORD" not in env  # a topology, not credentials


def test_a_fresh_shell_sees_the_remembered_stack_and_what_it_exports_wins(remembered, tmp_path, monkeypatch):
    s = config.load(env=config.with_remembered_stack({"ONCEFLOW_VAR_DIR": str(tmp_path)}))
    assert (s.brokers, s.replication_factor, s.min_insync_replicas, s.broker_heap) == (3, 3, 2, "256m")
    assert s.bootstrap_servers == remembered.bootstrap_servers and s.master == remembered.master
    mine = config.load(
        env=config.with_remembered_stack({"ONCEFLOW_VAR_DIR": str(tmp_path), "ONCEFLOW_BROKER_HEAP": "1g"})
    )
    assert mine.broker_heap == "1g"
    assert config.remembered_stack(tmp_path / "elsewhere") == {}  # no stack there: the defaults


def test_status_in_a_fresh_shell_reports_the_remembered_cluster(remembered, monkeypatch, capsys):
    seen = {}
    monkeypatch.setattr(stack, "status", lambda s: seen.setdefault("s", s) and {"broker": {"running": True}})
    assert dev_cli.main(["stack", "status", "--json"]) == 0
    assert seen["s"].brokers == 3 and seen["s"].master == remembered.master
    assert json.loads(capsys.readouterr().out)["remembered"]["ONCEFLOW_BROKERS"] == "3"


def test_down_stops_what_the_stack_started_whatever_the_shell_exported(remembered, monkeypatch, tmp_path):
    monkeypatch.setenv("ONCEFLOW_BROKERS", "1")  # a shell that says one broker while three run
    monkeypatch.setenv("ONCEFLOW_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    stopped = {}

    def down(s):
        stopped["s"] = s
        stack.forget(s)
        return {}

    monkeypatch.setattr(stack, "down", down)
    assert cli.main(["stack", "down", "--json"]) == 0  # the old spelling, handed on to onceflow-dev
    s = stopped["s"]
    assert s.brokers == 3 and s.bootstrap_servers == remembered.bootstrap_servers and s.master == remembered.master
    assert not (tmp_path / config.STACK_FILE).exists()


@pytest.mark.parametrize("secured", [False, True])
def test_stack_up_makes_every_instances_topics_and_on_the_secured_stack_its_principals(secured, tmp_path, monkeypatch):
    """A control plane of two instances (ONCEFLOW_APPS) on a fresh stack: each instance's DAGs and job find their
    own topics, and on the secured stack their own principals and ACLs, without a `stack provision` by hand."""
    for k in list(__import__("os").environ):
        if k.startswith(config.ENV_PREFIX):
            monkeypatch.delenv(k)
    s = config.load(env={}, var_dir=tmp_path, apps="edge=ip_count,nets=ip_networks", app_id="edge")
    if secured:
        s = s.replace(kafka_security_protocol="SASL_SSL")
    made: dict[str, list[str]] = {"topics": [], "principals": []}
    monkeypatch.setattr(stack.launcher, "session_jars", lambda s: [])
    monkeypatch.setattr(stack.broker, "start", lambda s: {})
    monkeypatch.setattr(stack, "status", lambda s: {})
    monkeypatch.setattr(stack, "provision", lambda inst: made["principals"].append(inst.app_id) or inst)
    monkeypatch.setattr(
        stack.topics, "ensure", lambda inst: made["topics"].append(inst.source_topic) or [inst.sink_topic]
    )
    info = stack.up(s)
    nets = config.load_instance("nets", "ip_networks", env=s.as_env())
    assert made["topics"] == [s.source_topic, nets.source_topic] and s.source_topic != nets.source_topic
    assert made["principals"] == (["edge", "nets"] if secured else [])
    assert info["topics_created"] == [s.sink_topic, nets.sink_topic]
