"""The class-data archive (onceflow.runtime.class_data): named by what it depends on, built once,
and a failed build leaves nothing behind (the JVMs then run without it). No JVM runs here: spark-submit and
`java -version` are stood in for."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from onceflow import config
from onceflow.runtime import class_data, launcher, local_fs

DRIVER_CP = "/var/jvm/local-fs/nio-local-fs-0123.jar"


def test_a_new_jvm_is_a_new_archive_name(monkeypatch, tmp_path):
    s = config.load(env={}, var_dir=tmp_path, jvm_dir=tmp_path / "jvm")
    monkeypatch.setattr(class_data, "driver_class_path", lambda _s: DRIVER_CP)
    monkeypatch.setattr(class_data, "_java_version", lambda: 'openjdk version "17.0.15"')
    a = class_data.archive_path(s)
    monkeypatch.setattr(class_data, "_java_version", lambda: 'openjdk version "17.0.16"')
    b = class_data.archive_path(s)
    assert a != b and a.parent == b.parent == s.jvm_dir and a.suffix == ".jsa"


def test_a_new_driver_class_path_is_a_new_archive_name(monkeypatch, tmp_path):
    """A JVM maps the archive only if its class path starts with the one it was dumped with: another local file
    system jar (or none, without javac) needs another archive."""
    s = config.load(env={}, var_dir=tmp_path, jvm_dir=tmp_path / "jvm")
    monkeypatch.setattr(class_data, "_java_version", lambda: 'openjdk version "17.0.15"')
    names = set()
    for cp in (DRIVER_CP, "/var/jvm/local-fs/nio-local-fs-4567.jar", None):
        monkeypatch.setattr(class_data, "driver_class_path", lambda _s, cp=cp: cp)
        names.add(class_data.archive_path(s))
    assert len(names) == 3


def _submit(monkeypatch, outcome):
    calls: list[dict] = []
    monkeypatch.setattr(class_data, "driver_class_path", lambda _s: DRIVER_CP)

    def run(cmd, env, **_kw):
        calls.append({**env, "argv": cmd})
        dump = env["SPARK_SUBMIT_OPTS"].removeprefix("-XX:ArchiveClassesAtExit=")
        if outcome == 0:
            Path(dump).write_bytes(b"archive")
        return subprocess.CompletedProcess(cmd, outcome, "", "boom" if outcome else "")

    monkeypatch.setattr(class_data.subprocess, "run", run)
    monkeypatch.setattr(class_data, "_java_version", lambda: 'openjdk version "17.0.15"')
    return calls


def test_built_once_then_found(monkeypatch, tmp_path):
    s = config.load(env={}, var_dir=tmp_path, jvm_dir=tmp_path / "jvm")
    calls = _submit(monkeypatch, 0)
    first = class_data.build(s, "spark-submit", {})
    assert first is not None and first.read_bytes() == b"archive" and len(calls) == 1
    # dumped with the class path the jobs' drivers start with (spark.driver.extraClassPath goes before Spark's jars)
    assert f"spark.driver.extraClassPath={DRIVER_CP}" in calls[0]["argv"]
    assert class_data.build(s, "spark-submit", {}) == first and len(calls) == 1  # found, not built again
    assert not list(s.jvm_dir.glob("*.tmp")) and not list(s.jvm_dir.glob("*.work"))


def test_a_failed_build_is_none_leaves_nothing_and_is_not_tried_at_every_launch(monkeypatch, tmp_path):
    s = config.load(env={}, var_dir=tmp_path, jvm_dir=tmp_path / "jvm")
    calls = _submit(monkeypatch, 1)
    assert class_data.build(s, "spark-submit", {}) is None
    assert not list(s.jvm_dir.glob("spark-classes-*"))
    # a restart does not wait for another build that fails: the failure and its reason are recorded ...
    assert class_data.build(s, "spark-submit", {}) is None and len(calls) == 1
    [failed] = s.jvm_dir.glob(".spark-classes-*.failed")
    assert "boom" in failed.read_text()
    # ... until an operator deletes the record
    failed.unlink()
    assert class_data.build(s, "spark-submit", {}) is None and len(calls) == 2


def test_a_spark_submit_that_cannot_run_is_none(monkeypatch, tmp_path):
    s = config.load(env={}, var_dir=tmp_path, jvm_dir=tmp_path / "jvm")
    _submit(monkeypatch, 0)

    def missing(*_a, **_kw):
        raise FileNotFoundError("spark-submit")

    monkeypatch.setattr(class_data.subprocess, "run", missing)
    assert class_data.build(s, "spark-submit", {}) is None
    assert not list(s.jvm_dir.glob("spark-classes-*"))


def _launches(monkeypatch, tmp_path, jar: Path | None = Path("/jvm/local-fs/nio-local-fs-0123.jar"), **overrides):
    """The job's and a batch job's Spark conf with the local file system's jar at `jar` and an archive built."""
    archive = tmp_path / "spark-classes-0123.jsa"
    built: list[Path] = []
    monkeypatch.setattr(local_fs, "jar", lambda _s: jar)
    monkeypatch.setattr(class_data, "build", lambda _s, _submit, _env: built.append(archive) or archive)
    s = config.load(env={}, var_dir=tmp_path, **overrides)
    return launcher.submit_spec(s)["conf"], launcher.batch_spec(s, "reconcile")["conf"], archive, built


@pytest.mark.parametrize("master", ["local[2]", "spark://127.0.0.1:7077"])
def test_with_class_data_sharing_the_driver_and_executors_here_map_the_archive(monkeypatch, tmp_path, master):
    job, batch, archive, _ = _launches(monkeypatch, tmp_path, master=master, class_data_sharing=True)
    option = f"-XX:SharedArchiveFile={archive}"
    for conf in (job, batch):
        assert conf["spark.driver.extraJavaOptions"].split()[-1] == option
        assert "-XX:+ExitOnOutOfMemoryError" in conf["spark.driver.extraJavaOptions"]  # the log options kept
        assert conf["spark.executor.extraJavaOptions"].split()[-1] == option


def test_on_by_default_and_off_when_told_nothing_built(monkeypatch, tmp_path):
    job, _, archive, _ = _launches(monkeypatch, tmp_path)
    assert job["spark.driver.extraJavaOptions"].endswith(f"-XX:SharedArchiveFile={archive}")
    job, batch, _, built = _launches(monkeypatch, tmp_path, class_data_sharing=False)
    assert "SharedArchiveFile" not in json.dumps([job, batch]) and not built


@pytest.mark.parametrize(
    "overrides",
    [
        dict(master="spark://10.0.0.5:7077"),  # executors on other machines: the archive's path is not theirs
        dict(checkpoint_uri="hdfs://namenode:8020/onceflow/cp"),  # the job's class path is not the archive's
    ],
)
def test_not_where_the_class_path_or_the_machine_is_another(monkeypatch, tmp_path, overrides):
    job, _, _, _ = _launches(monkeypatch, tmp_path, class_data_sharing=True, **overrides)
    assert "SharedArchiveFile" not in json.dumps(job)


def test_not_without_the_local_file_systems_jar(monkeypatch, tmp_path):
    """No javac here: the launches keep Hadoop's file system and Spark's own class path, and go without the archive
    (dumped with the jar first) rather than have one built for them."""
    job, batch, _, built = _launches(monkeypatch, tmp_path, jar=None)
    assert "SharedArchiveFile" not in json.dumps([job, batch]) and not built
