"""The control plane's DAGs built from their files, as Airflow's DAG processor builds them (dags/onceflow_<kind>.py, one
DAG per app instance), with the environment the caller set; no metadata database needed to build one."""

from __future__ import annotations

import importlib.util

from onceflow.config import REPO_ROOT


def build(kind: str, app_id: str):
    """The DAG of kind `kind` (deploy, health, ...) of app instance `app_id`."""
    spec = importlib.util.spec_from_file_location(f"_dag_{kind}_{app_id}", REPO_ROOT / "dags" / f"onceflow_{kind}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.build(app_id)
