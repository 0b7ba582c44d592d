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
