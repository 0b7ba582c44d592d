"""The command line's own surface."""

import json

import pytest


def test_the_cli_says_its_version(capsys):
    from importlib import metadata

    from onceflow import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"onceflow {metadata.version('onceflow')}"


def test_the_development_commands_are_onceflow_devs_and_the_old_spelling_hands_them_on(monkeypatch, tmp_path, capsys):
    """`onceflow-dev` (onceflow_dev.cli) owns the embedded stack, the generator, the local Airflow and `where`;
    `onceflow produce ...` parses nothing itself and runs the same command line there, --help included."""
    from onceflow import cli
    from onceflow_dev import cli as dev_cli

    monkeypatch.setenv("ONCEFLOW_VAR_DIR", str(tmp_path))
    ran = []
    monkeypatch.setattr(dev_cli, "cmd_produce", lambda args, s: ran.append((args.count, args.rate, s.app_id)) or 0)
    for main in (dev_cli.main, cli.main):
        assert main(["--app", "ip_networks", "produce", "--count", "7", "--rate", "5"]) == 0
    assert ran == [(7, 5.0, "ip_networks")] * 2
    with pytest.raises(SystemExit):
        cli.main(["produce", "--help"])
    assert capsys.readouterr().out.startswith("usage: onceflow-dev produce")
    with pytest.raises(SystemExit):  # a platform command still refuses what it does not know
        cli.main(["job", "status", "--count", "7"])
    assert "unrecognized arguments: --count 7" in capsys.readouterr().err


def test_topics_and_provision_need_no_development_tooling_and_the_embedded_stack_says_it_does(
    monkeypatch, tmp_path, capsys
):
    """A production image has no onceflow_dev: `stack topics` (docker-compose's airflow-init) still works there, and
    `stack up` says in one line what is missing rather than a traceback."""
    import sys

    from onceflow import cli
    from onceflow.kafka import topics

    monkeypatch.setenv("ONCEFLOW_VAR_DIR", str(tmp_path))
    for name in [m for m in sys.modules if m.split(".")[0] == "onceflow_dev"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "onceflow_dev", None)  # import onceflow_dev fails, as in the image
    monkeypatch.setattr(topics, "ensure", lambda s: [s.source_topic])
    assert cli.main(["stack", "topics", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["created"] == ["ip_count_source"]
    with pytest.raises(SystemExit) as e:
        cli.main(["stack", "up"])
    assert "needs the development tooling (onceflow_dev)" in str(e.value.code)


def test_kafka_tools_run_from_the_stacks_jars_with_their_arguments_untouched(monkeypatch, tmp_path):
    """`onceflow-dev kafka transactions ...` (and `onceflow kafka ...`, handed on) is bin/kafka-transactions.sh: the
    same class from the embedded stack's jars, its arguments passed as typed, its exit code returned."""
    from onceflow import cli
    from onceflow_dev import broker
    from onceflow_dev import cli as dev_cli

    monkeypatch.setenv("ONCEFLOW_VAR_DIR", str(tmp_path))
    monkeypatch.setattr(broker, "kafka_classpath", lambda s: "/jars/*")
    monkeypatch.setattr(broker, "java", lambda: "/usr/bin/java")
    ran = []

    class Done:
        returncode = 3

    monkeypatch.setattr(dev_cli.subprocess, "run", lambda cmd, check: ran.append(cmd) or Done())
    args = ["--bootstrap-server", "127.0.0.1:9092", "abort", "--topic", "t", "--partition", "1", "--start-offset", "0"]
    for main in (dev_cli.main, cli.main):
        assert main(["kafka", "transactions", *args]) == 3
    assert ran == [["/usr/bin/java", "-cp", "/jars/*", "org.apache.kafka.tools.TransactionsCommand", *args]] * 2


def test_show_prints_a_named_outputs_topic_and_refuses_an_output_the_app_lacks(monkeypatch, tmp_path, capsys):
    """`onceflow --app ip_networks show sink --output unlisted` reads that output's topic; an output the app does not
    declare, or --output with another kind of record, is refused before anything is read."""
    from onceflow import cli
    from onceflow.kafka import reading

    monkeypatch.setenv("ONCEFLOW_VAR_DIR", str(tmp_path))
    read = []
    monkeypatch.setattr(reading, "read_topic", lambda s, topic, **kw: read.append(topic) or [])
    assert cli.main(["--app", "ip_networks", "show", "sink", "--output", "unlisted"]) == 0
    assert read == ["ip_networks_sink-unlisted"]
    for args, says in (
        (["--app", "ip_networks", "show", "sink", "--output", "elsewhere"], "has no output 'elsewhere'"),
        (["--app", "ip_networks", "show", "dlq", "--output", "unlisted"], "--output is for `onceflow show sink`"),
    ):
        capsys.readouterr()
        assert cli.main(args) != 0
        assert says in capsys.readouterr().err
    assert read == ["ip_networks_sink-unlisted"]
