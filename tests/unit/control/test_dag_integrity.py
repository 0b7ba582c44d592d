"""The DAG files parse, without a metadata database or a broker, in seconds: the first thing a broken DAG file
fails (a running Airflow would show it as an import error). What each DAG declares: owner, retries, tags, docs,
concurrency, schedule and the typed Params of its manual trigger."""

from __future__ import annotations

from datetime import timedelta

import pytest

DAGS = (
    "ip_count_deploy",
    "ip_count_health",
    "ip_count_txn_watch",
    "ip_count_checkpoint_rotation",
    "ip_count_reconciliation",
    "ip_count_backfill",
)


@pytest.fixture(scope="module")
def dagbag(tmp_path_factory, monkeypatch_module):
    # connections come from the environment (as the deployed stack gives them); nothing is looked up at parse time
    monkeypatch_module.setenv("ONCEFLOW_VAR_DIR", str(tmp_path_factory.mktemp("var")))
    from airflow.dag_processing.dagbag import DagBag

    return DagBag()  # the dags folder: tests.conftest points AIRFLOW__CORE__DAGS_FOLDER at dags/, examples off


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_the_dag_files_import_without_errors(dagbag):
    assert dagbag.import_errors == {}
    assert sorted(dagbag.dag_ids) == sorted(DAGS)


def test_dags_have_owners_retries_tags_and_docs(dagbag):
    for dag_id in DAGS:
        d = dagbag.dags[dag_id]
        assert d.owner == "onceflow" and "retries" in d.default_args
        assert "onceflow" in d.tags and d.doc_md and len(d.doc_md) > 100
        # backfills of disjoint ranges may run side by side (overlaps are refused in validation)
        assert d.max_active_runs == (4 if dag_id == "ip_count_backfill" else 1) and not d.catchup
    deploy = dagbag.dags["ip_count_deploy"]
    assert deploy.schedule is None or str(deploy.timetable.summary) in ("None", "")
    assert deploy.params.get_param("action").schema["enum"] == ["start", "stop", "restart", "upgrade", "restore"]
    assert deploy.params.get_param("allow_rewind").schema["type"] == "boolean"
    assert dagbag.dags["ip_count_checkpoint_rotation"].schedule == timedelta(minutes=60)


KINDS = ("deploy", "health", "txn_watch", "checkpoint_rotation", "reconciliation", "backfill")


def test_one_set_of_dags_per_app_instance(tmp_path, monkeypatch):
    """ONCEFLOW_APPS: each app instance gets its DAGs (`<app_id>_<kind>`, tagged and documented with its id); an
    instance other than the environment's own takes its names from its id, not the other's environment."""
    from airflow.dag_processing.dagbag import DagBag

    from onceflow.control import orchestration

    monkeypatch.setenv("ONCEFLOW_VAR_DIR", str(tmp_path))
    monkeypatch.setenv("ONCEFLOW_APPS", "ip_count, ip_networks, eu_networks=ip_networks")
    monkeypatch.setenv("ONCEFLOW_SOURCE_TOPIC", "ip_count_in")  # the environment's own instance's
    bag = DagBag()
    assert bag.import_errors == {}
    assert set(bag.dag_ids) == {f"{a}_{k}" for a in ("ip_count", "ip_networks", "eu_networks") for k in KINDS}
    health = bag.dags["eu_networks_health"]
    assert "eu_networks" in health.tags and "`eu_networks` job" in health.doc_md and "ip_count" not in health.doc_md
    eu = orchestration.instance_settings("eu_networks")
    assert (eu.app, eu.app_id, eu.source_topic, eu.close_out_batches) == (
        "ip_networks",
        "eu_networks",
        "eu_networks_source",
        False,  # its declaration's, under no one else's environment
    )
    assert orchestration.instance_settings("ip_count").source_topic == "ip_count_in"


def test_an_instance_takes_its_own_schedule_and_pace_from_its_variables(monkeypatch, tmp_path):
    """ONCEFLOW__<INSTANCE>__<SETTING>: one instance of a control plane checked less often and paced slower than the
    others, its DAGs' schedules and its settings its own; a variable that names no instance fails the DAG files'
    import with what to change."""
    from datetime import timedelta

    from airflow.dag_processing.dagbag import DagBag

    from onceflow.control import orchestration

    monkeypatch.setenv("ONCEFLOW_VAR_DIR", str(tmp_path))
    monkeypatch.setenv("ONCEFLOW_APPS", "ip_count, eu-networks=ip_networks")
    monkeypatch.setenv("ONCEFLOW_RECONCILE_INTERVAL_MINUTES", "5")  # the control plane's, for every instance
    monkeypatch.setenv("ONCEFLOW__EU_NETWORKS__RECONCILE_INTERVAL_MINUTES", "30")
    monkeypatch.setenv("ONCEFLOW__EU_NETWORKS__TRIGGER_INTERVAL_S", "10")
    bag = DagBag()
    assert bag.import_errors == {}
    assert bag.dags["eu-networks_reconciliation"].schedule == timedelta(minutes=30)
    assert bag.dags["ip_count_reconciliation"].schedule == timedelta(minutes=5)
    eu, first = orchestration.instance_settings("eu-networks"), orchestration.instance_settings("ip_count")
    assert (eu.trigger_interval_s, eu.reconcile_interval_minutes) == (10.0, 30.0)
    assert (first.trigger_interval_s, first.reconcile_interval_minutes) == (5.0, 5.0)

    monkeypatch.setenv("ONCEFLOW__EU_NETWORK__TRIGGER_INTERVAL_S", "10")  # a typo of the instance
    bag = DagBag()
    assert bag.import_errors and all(
        "ONCEFLOW__EU_NETWORK__TRIGGER_INTERVAL_S names no instance" in e for e in bag.import_errors.values()
    ), bag.import_errors


def test_app_instances_are_parsed_or_refused():
    from onceflow import config

    s = config.load(env={})
    assert config.instances(s) == {"ip_count": "ip_count"}
    assert config.instances(s.replace(apps="a=ip_count, ip_networks")) == {
        "a": "ip_count",
        "ip_networks": "ip_networks",
    }
    assert {"ip_count", "ip_networks"} <= set(config.instances(s.replace(apps="*")))
    for bad in ("a=ip_count,a=ip_networks", "=ip_count", "a="):
        with pytest.raises(config.ConfigError, match="ONCEFLOW_APPS"):
            config.instances(s.replace(apps=bad))
