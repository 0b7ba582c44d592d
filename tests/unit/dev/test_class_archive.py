"""The test session's class-data archive (onceflow_dev.class_archive): named by what it depends on, built once,
and a failed build leaves nothing behind (the JVMs then run without it). No JVM runs here: spark-submit and
`java -version` are stood in for."""

from __future__ import annotations

import subprocess
from pathlib import Path

from onceflow import config
from onceflow_dev import class_archive


def test_a_new_jvm_is_a_new_archive_name(monkeypatch, tmp_path):
    s = config.load(env={}, var_dir=tmp_path, jvm_dir=tmp_path / "jvm")
    monkeypatch.setattr(class_archive, "_java_version", lambda: 'openjdk version "17.0.15"')
    a = class_archive.archive_path(s)
    monkeypatch.setattr(class_archive, "_java_version", lambda: 'openjdk version "17.0.16"')
    b = class_archive.archive_path(s)
    assert a != b and a.parent == b.parent == s.jvm_dir and a.suffix == ".jsa"


def _submit(monkeypatch, outcome):
    calls: list[dict] = []

    def run(cmd, env, **_kw):
        calls.append(env)
        dump = env["SPARK_SUBMIT_OPTS"].removeprefix("-XX:ArchiveClassesAtExit=")
        if outcome == 0:
            Path(dump).write_bytes(b"archive")
        return subprocess.CompletedProcess(cmd, outcome, "", "boom" if outcome else "")

    monkeypatch.setattr(class_archive.subprocess, "run", run)
    monkeypatch.setattr(class_archive, "_java_version", lambda: 'openjdk version "17.0.15"')
    return calls


def test_built_once_then_found(monkeypatch, tmp_path):
    s = config.load(env={}, var_dir=tmp_path, jvm_dir=tmp_path / "jvm")
    calls = _submit(monkeypatch, 0)
    first = class_archive.build(s)
    assert first is not None and first.read_bytes() == b"archive" and len(calls) == 1
    assert class_archive.build(s) == first and len(calls) == 1  # found, not built again
    assert not list(s.jvm_dir.glob("*.tmp")) and not list(s.jvm_dir.glob("*.work"))


def test_a_failed_build_is_none_and_leaves_nothing(monkeypatch, tmp_path):
    s = config.load(env={}, var_dir=tmp_path, jvm_dir=tmp_path / "jvm")
    _submit(monkeypatch, 1)
    assert class_archive.build(s) is None
    assert not list(s.jvm_dir.glob("spark-classes-*"))


def test_a_spark_submit_that_cannot_run_is_none(monkeypatch, tmp_path):
    s = config.load(env={}, var_dir=tmp_path, jvm_dir=tmp_path / "jvm")
    _submit(monkeypatch, 0)

    def missing(*_a, **_kw):
        raise FileNotFoundError("spark-submit")

    monkeypatch.setattr(class_archive.subprocess, "run", missing)
    assert class_archive.build(s) is None
    assert not list(s.jvm_dir.glob("spark-classes-*"))
