"""Declared apps (onceflow.app): found through the registry, their own settings under the environment's, refused
with a message that says what to change; the platform's plan of an app and its determinism check (Spark)."""

from __future__ import annotations

import pytest

from onceflow import config
from onceflow.app import App, AppError, registry

REG = (
    ",".join(f"{n}=tests.support.apps:{n}" for n in ("upper", "lucky", "unsure", "greedy"))
    + ",ghost=tests.support.apps:not_an_app,wrongname=tests.support.apps:upper"
)


def test_the_shipped_app_is_found_through_its_entry_point():
    assert "ip_count" in registry.declared()
    app = config.load(env={}).declared_app()
    assert app.name == "ip_count" and app.deterministic and app.event_time
    assert "malformed" not in app.reasons and "bad_json" in app.reasons  # the DLQ's reasons, each explained


def test_an_apps_own_settings_are_defaults_under_the_environment():
    s = config.load(env={"ONCEFLOW_APP": "upper", "ONCEFLOW_APP_REGISTRY": REG})
    assert (s.app, s.app_id, s.source_topic, s.window_s, s.source_partitions) == (
        "upper",
        "upper",
        "upper_source",
        7,
        2,
    )
    s = config.load(env={"ONCEFLOW_APP": "upper", "ONCEFLOW_APP_REGISTRY": REG, "ONCEFLOW_WINDOW_S": "9"})
    assert s.window_s == 9
    assert config.load(env={"ONCEFLOW_APP_REGISTRY": REG}, app="upper", app_id="upper_eu").source_topic == (
        "upper_eu_source"
    )


@pytest.mark.parametrize(
    "app, message",
    [
        ("nope", "no app named 'nope' is declared"),
        ("ghost", "not an onceflow.app.App"),
        ("wrongname", "declares an app named 'upper'"),
        ("greedy", "bootstrap_servers"),
    ],
)
def test_a_bad_declaration_fails_at_load_with_what_to_change(app, message):
    with pytest.raises(config.ConfigError, match=message) as e:
        config.load(env={"ONCEFLOW_APP": app, "ONCEFLOW_APP_REGISTRY": REG})
    assert "ONCEFLOW_APP=" in str(e.value)


def test_a_registry_entry_must_name_a_module_and_an_attribute():
    with pytest.raises(AppError, match="name=package.module:attribute"):
        registry.parse("upper=tests.support.apps")
    assert registry.parse(" a=m:x , ,b=n.o:y") == {"a": "m:x", "b": "n.o:y"}


def test_an_app_name_is_what_every_kafka_name_can_hold():
    for bad in ("Upper", "1st", "a.b", "a-b", ""):
        with pytest.raises(AppError, match="lower case"):
            App(name=bad, transform=lambda raw, ctx: None)
    with pytest.raises(AppError, match="transform must be a function"):
        App(name="x", transform="module:function")  # type: ignore[arg-type]


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


def test_the_cli_lists_the_declared_apps_and_names_a_broken_one(monkeypatch, capsys, tmp_path):
    import json

    from onceflow import cli

    monkeypatch.setenv("ONCEFLOW_VAR_DIR", str(tmp_path))
    monkeypatch.setenv("ONCEFLOW_APP_REGISTRY", REG)
    assert cli.main(["app", "list", "--json"]) == 2  # ghost and wrongname are broken
    listed = {a["app"]: a for a in json.loads(capsys.readouterr().out)}
    assert listed["ip_count"]["declared_in"] == "onceflow_apps.ip_count:app"
    assert listed["upper"]["settings"] == {"window_s": 7, "source_partitions": 2}
    assert "not an onceflow.app.App" in listed["ghost"]["error"]


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
