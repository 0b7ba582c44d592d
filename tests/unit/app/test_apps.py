"""Declared apps (onceflow.app): found through the registry, their own settings under the environment's, refused
with a message that says what to change. (Their plans, built by Spark: tests/spark/test_app_plans.py.)"""

from __future__ import annotations

import pytest

from onceflow import config
from onceflow.app import App, AppError, registry
from tests.support.apps import REGISTRY as REG


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


def test_an_apps_hooks_name_a_module_and_a_function():
    from onceflow.app import App

    for hook in ("reference", "audit"):
        with pytest.raises(AppError, match=f"{hook} must be 'module:function'"):
            App(name="hooked", transform=lambda raw, ctx: None, **{hook: "not a function"})
    assert App(name="hooked", transform=lambda raw, ctx: None, audit="pkg.mod:check").audit == "pkg.mod:check"


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


@pytest.mark.parametrize("version", [0, -1, "2", True, 1.5])
def test_a_rules_version_that_is_not_a_positive_integer_is_refused(version):
    with pytest.raises(AppError, match="rules_version must be a positive integer"):
        App(name="v", transform=lambda raw, ctx: None, rules_version=version)


@pytest.mark.parametrize("name", ["main", "Loud", "with.dot", "9lives", "", "x" * 33])
def test_an_outputs_name_is_what_a_topic_name_can_end_with_and_not_the_sink_topics(name):
    with pytest.raises(AppError, match="an output's name is lower case letters"):
        App(name="fine", transform=lambda raw, ctx: None, outputs={name: "what it holds"})  # type: ignore[arg-type,return-value]
