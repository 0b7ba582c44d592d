"""The platform's plan of a declared app, built by Spark: its results and rejects with their provenance, its
determinism check, the CLI's validation, the second app's plan, and a new app's scaffold whose own test passes.
(The declarations themselves, without a JVM: tests/unit/app/test_apps.py.)"""

from __future__ import annotations

import pytest

from onceflow import config
from onceflow.app import AppError
from tests.support.apps import REGISTRY as REG


def _kafka_rows(spark, values):
    import datetime as dt

    rows = [(None, v, "t_source", 0, i, dt.datetime(2026, 1, 1, tzinfo=dt.UTC), 0) for i, v in enumerate(values)]
    return spark.createDataFrame(
        rows,
        "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, timestampType int",
    )


def test_the_platform_writes_an_apps_results_and_its_rejects_with_their_provenance(spark):
    from onceflow.spark import app_plan

    s = config.load(env={"ONCEFLOW_APP": "upper", "ONCEFLOW_APP_REGISTRY": REG})
    out = app_plan.output(s.declared_app().transform, _kafka_rows(spark, [b"a", b"", b"bc"]), s).collect()
    assert [c for c in out[0].asDict()] == app_plan.OUTPUT_COLUMNS
    got = sorted((r.kind, r.key, r.value, r.reason, r.src_offset) for r in out)
    assert got == [
        ("dlq", "t_source|0|1", b"", "empty", 1),
        ("result", "0|0", b"A", None, None),
        ("result", "0|2", b"BC", None, None),
    ]
    app_plan.check_deterministic(
        s.declared_app(), app_plan.output(s.declared_app().transform, _kafka_rows(spark, []), s)
    )


@pytest.mark.parametrize("app, message", [("lucky", "not deterministic"), ("unsure", "declared non-deterministic")])
def test_an_app_the_proofs_cannot_hold_to_is_refused(spark, app, message):
    from onceflow.spark import app_plan

    s = config.load(env={"ONCEFLOW_APP": app, "ONCEFLOW_APP_REGISTRY": REG})
    frame = app_plan.output(s.declared_app().transform, _kafka_rows(spark, [b"x"]), s)
    with pytest.raises(config.ConfigError, match=message):
        app_plan.check_deterministic(s.declared_app(), frame)


def test_ip_counts_plan_is_deterministic(spark):
    from onceflow.spark import app_plan

    s = config.load(env={})
    frame = app_plan.output(s.declared_app().transform, _kafka_rows(spark, [b'{"ip":"1.2.3.4","ts":"x"}']), s)
    app_plan.check_deterministic(s.declared_app(), frame)


def test_the_cli_validates_an_app_by_building_its_plan(monkeypatch, capsys, tmp_path, spark):
    import json

    from onceflow import cli

    monkeypatch.setenv("ONCEFLOW_VAR_DIR", str(tmp_path))
    monkeypatch.setenv("ONCEFLOW_APP_REGISTRY", REG)
    monkeypatch.setattr(cli, "_spark", lambda s, name: spark)
    assert cli.main(["--app", "upper", "app", "validate", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["output_columns"][:3] == ["kind", "key", "value"]
    assert cli.main(["--app", "lucky", "app", "validate"]) == 2
    assert "not deterministic" in capsys.readouterr().err


def test_ip_networks_tags_each_good_record_once_with_its_networks_block(spark, tmp_path):
    import json

    from onceflow.spark import app_plan
    from onceflow_apps import ip_networks

    assert ip_networks.network_of("1.2.3.4") == "apnic-1" and ip_networks.network_of("8.200.0.1") == "level3-8b"
    assert ip_networks.network_of("9.9.9.9") == ip_networks.UNLISTED and ip_networks.network_of("::1") == "ipv6"
    overlapping = tmp_path / "n.csv"
    overlapping.write_text("cidr,network\n10.0.0.0/8,a\n10.1.0.0/16,b\n")
    with pytest.raises(AppError, match="overlap"):
        ip_networks.networks(overlapping)

    s = config.load(env={"ONCEFLOW_APP": "ip_networks"})
    assert s.source_topic == "ip_networks_source" and not s.close_out_batches and not s.declared_app().event_time
    values = [
        b'{"ip":"8.128.0.0","ts":1767225600000}',  # the first address of a block
        b'{"ip":"8.127.255.255","ts":1767225600000}',  # the last of the one before it
        b'{"ip":"2001:DB8::1","ts":1767225600000}',
        b'{"ip":"9.9.9.9","ts":1767225600000}',
        b"garbage",
    ]
    frame = app_plan.output(s.declared_app().transform, _kafka_rows(spark, values), s)
    app_plan.check_deterministic(s.declared_app(), frame)
    out = frame.collect()
    results = sorted(
        (r.key, json.loads(r.value)["network"], json.loads(r.value)["source"], r.output)
        for r in out
        if r.kind == "result"
    )
    assert results == [  # the requests of no listed network go to its named output
        ("2001:db8::1", "ipv6", "t_source|0|2", "unlisted"),
        ("8.127.255.255", "level3-8", "t_source|0|1", None),
        ("8.128.0.0", "level3-8b", "t_source|0|0", None),
        ("9.9.9.9", "unlisted", "t_source|0|3", "unlisted"),
    ]
    assert [(r.kind, r.reason, r.src_offset) for r in out if r.kind == "dlq"] == [("dlq", "unrecognized_format", 4)]


def test_a_new_apps_scaffold_is_listed_valid_and_its_own_test_passes(monkeypatch, capsys, tmp_path):
    """`onceflow app new NAME`: the package it writes is what docs/apps.md describes, and its test passes as its
    author runs it (pytest in the package, a JVM of its own)."""
    import json
    import os
    import subprocess
    import sys

    from onceflow import cli

    monkeypatch.setenv("ONCEFLOW_VAR_DIR", str(tmp_path / "var"))
    assert cli.main(["app", "new", "team_clicks", "--dir", str(tmp_path), "--json"]) == 0
    root = tmp_path / "team_clicks"
    assert json.loads(capsys.readouterr().out)["written"] == str(root)
    assert 'team_clicks = "team_clicks.app:app"' in (root / "pyproject.toml").read_text()
    assert cli.main(["app", "new", "team_clicks", "--dir", str(tmp_path)]) == 2  # nothing overwritten
    assert "exists" in capsys.readouterr().err
    assert cli.main(["app", "new", "Team-Clicks", "--dir", str(tmp_path)]) == 2
    assert "lower case" in capsys.readouterr().err

    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("ONCEFLOW_APP_REGISTRY", "team_clicks=team_clicks.app:app")
    assert cli.main(["app", "list", "--json"]) == 0
    listed = {a["app"]: a for a in json.loads(capsys.readouterr().out)}
    assert listed["team_clicks"]["dlq_reasons"] == ["no_key"] and listed["team_clicks"]["event_time"]

    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEFLOW_")}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout[-3000:] + out.stderr[-2000:]


def test_an_apps_rows_name_their_outputs_exactly_when_it_declares_outputs(spark):
    """Declared outputs and an `output` column go together: either alone is refused when the plan is built (by
    `onceflow app validate` and at the job's start), not found batch by batch."""
    from onceflow.spark import app_plan

    s = config.load(env={"ONCEFLOW_APP": "upper", "ONCEFLOW_APP_REGISTRY": REG})
    routed = s.declared_app().transform

    def routing(raw, ctx):
        from pyspark.sql import functions as F

        out = routed(raw, ctx)
        return type(out)(rows=out.rows.withColumn("output", F.lit("elsewhere")), rejects=out.rejects)

    with pytest.raises(config.ConfigError, match="its rows have an `output` column but it declares no outputs"):
        app_plan.output(routing, _kafka_rows(spark, [b"a"]), s)
    networks = config.load(env={"ONCEFLOW_APP": "ip_networks"})
    with pytest.raises(config.ConfigError, match=r"declares outputs \['unlisted'\] but its rows have no `output`"):
        app_plan.output(routed, _kafka_rows(spark, [b"a"]), networks)
