"""An app's JVM functions (App.java): declared as paths, compiled into a jar that every launch of the app carries
(onceflow.runtime.app_jars), refused with a message that says what to change where they cannot be compiled. The
compiled classes themselves, built and loaded in Spark: tests/spark (the access-log rules) and
tests/spark/test_app_jars.py (the compiler)."""

from pathlib import Path

import pytest

from onceflow import config
from onceflow.app import App, AppError, Results
from onceflow.runtime import app_jars, javac, launcher
from onceflow_apps import access_log


def _transform(raw, ctx):
    return Results(rows=raw)


def test_the_shipped_apps_bring_the_access_log_rules_in_java():
    for name in ("ip_count", "ip_networks"):
        app = config.load(env={}, app=name).declared_app()
        assert tuple(app.java) == access_log.JAVA
        assert javac.sources(access_log.JAVA)  # Rules.java, Utf8.java, ParseRecord.java


@pytest.mark.parametrize("java", ["Rules.java", Path("Rules.java"), [1], 3])
def test_java_is_a_sequence_of_paths(java):
    with pytest.raises(AppError, match="java must be a sequence of paths"):
        App(name="x", transform=_transform, java=java)


def test_an_app_without_java_gets_no_jar_and_no_compiler(monkeypatch, tmp_path):
    monkeypatch.setattr(javac, "jar", lambda *a: pytest.fail("nothing to compile"))
    s = config.load(env={}, jvm_dir=tmp_path)
    assert app_jars.jars_of(s, App(name="plain", transform=_transform)) == []
    assert not any(tmp_path.iterdir())


def test_without_a_jdk_the_app_is_refused_with_what_to_install(monkeypatch, tmp_path):
    which = javac.shutil.which
    monkeypatch.setattr(javac.shutil, "which", lambda name: None if name == "javac" else which(name))
    s = config.load(env={}, jvm_dir=tmp_path)
    with pytest.raises(app_jars.AppJarError) as e:
        app_jars.jars(s)
    said = str(e.value)
    assert "app ip_count" in said and "no javac" in said and "openjdk-17-jdk-headless" in said, said
    assert not any(tmp_path.iterdir())  # nothing half-built left behind


def test_a_source_root_without_java_files_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(javac.JavacError, match="no .java file"):
        javac.sources([tmp_path / "empty"])
    with pytest.raises(javac.JavacError, match="neither a .java file"):
        javac.sources([tmp_path / "missing.txt"])


def test_every_launch_of_the_app_carries_its_jar(monkeypatch, tmp_path):
    built = tmp_path / "app-java-0123.jar"
    monkeypatch.setattr(app_jars, "jars_of", lambda s, app: [built] if app.java else [])
    s = config.load(env={})
    for spec in (launcher.submit_spec(s), launcher.batch_spec(s, "reconcile"), launcher.batch_spec(s, "backfill")):
        assert str(built) in spec["jars"].split(","), spec["jars"]
    assert built in launcher.session_jars(s)  # the CLI's in-process sessions (local_session) too
