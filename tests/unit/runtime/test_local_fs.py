"""Which launches write their checkpoint through onceflow's local file system (onceflow.runtime.local_fs): spark-submit
launches whose driver and executors run on this machine, for a `file:` checkpoint; never an in-process session, a
cluster elsewhere or another scheme; and nothing breaks where no JDK can build it. The class itself, built and used:
tests/spark/test_local_fs.py."""

import logging
from pathlib import Path

import pytest

from onceflow import config
from onceflow.runtime import javac, launcher, local_fs

KEYS = {"spark.hadoop.fs.file.impl", "spark.driver.extraClassPath", "spark.executor.extraClassPath"}


@pytest.fixture
def built(monkeypatch, tmp_path):
    jar = tmp_path / "nio-local-fs.jar"
    monkeypatch.setattr(local_fs, "jar", lambda s: jar)
    return jar


@pytest.mark.parametrize("master", ["local[2]", "spark://127.0.0.1:7077"])
def test_a_local_checkpoint_of_executors_here_goes_through_the_class(built, master):
    s = config.load(env={}, master=master)
    job = launcher.submit_spec(s)["conf"]
    assert job["spark.hadoop.fs.file.impl"] == local_fs.CLASS == "dev.onceflow.hadoop.NioLocalFileSystem"
    assert job["spark.driver.extraClassPath"] == job["spark.executor.extraClassPath"] == str(built)
    # the batch jobs' replay checkpoint too (under var/), through spark-submit ...
    assert KEYS <= set(launcher.batch_spec(s, "reconcile")["conf"])
    # ... but not an in-process session: its JVM may already run without the jar on its class path
    assert not KEYS & set(launcher.batch_conf(s))


@pytest.mark.parametrize(
    "overrides",
    [
        dict(checkpoint_uri="hdfs://namenode:8020/onceflow/cp"),
        dict(master="spark://10.0.0.5:7077"),  # executors on other machines: the path is not theirs
        dict(master="k8s://https://kube.example:6443", deploy_mode="cluster", k8s_image="registry.example/o:1"),
    ],
)
def test_elsewhere_hadoops_own_file_system_stays(monkeypatch, overrides):
    monkeypatch.setattr(local_fs, "jar", lambda s: pytest.fail("not built where it cannot apply"))
    s = config.load(env={}, **overrides)
    assert not KEYS & set(launcher.submit_spec(s)["conf"])


def test_without_javac_the_job_starts_on_hadoops_file_system_and_says_so_once(monkeypatch, caplog, tmp_path):
    which = javac.shutil.which
    monkeypatch.setattr(javac.shutil, "which", lambda name: None if name == "javac" else which(name))
    monkeypatch.setattr(local_fs, "_warned", set())
    s = config.load(env={}, jvm_dir=tmp_path)
    with caplog.at_level(logging.INFO, logger=local_fs.__name__):
        for _ in range(3):
            assert local_fs.conf(s, executors_here=True) == {}
    said = [r.getMessage() for r in caplog.records if r.name == local_fs.__name__]
    assert len(said) == 1 and "no javac" in said[0] and "openjdk-17-jdk-headless" in said[0], said
    assert not any(Path(tmp_path).iterdir())  # nothing half-built left behind
