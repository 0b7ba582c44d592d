"""Fixtures the unit tests of several packages share."""

from __future__ import annotations

import subprocess
import sys

import pytest

from onceflow import config
from onceflow.rules import clock
from onceflow.runtime import app_jars, class_data, supervisor
from onceflow.runtime.run_files import JobStatus


@pytest.fixture(autouse=True)
def no_class_data_build(request, monkeypatch):
    """Unit tests start no JVM: a launch put together here (class-data sharing is on by default) finds no archive
    instead of building one with spark-submit. test_class_data stands spark-submit in itself."""
    if request.module.__name__.rpartition(".")[2] != "test_class_data":
        monkeypatch.setattr(class_data, "build", lambda *_a, **_kw: None)


@pytest.fixture(autouse=True)
def no_app_jar_build(request, monkeypatch):
    """Unit tests start no javac either: an app's JVM functions (App.java) are a jar of that name, not compiled.
    test_app_jars compiles (or fails to) on purpose; tests/spark loads the real jar."""
    if request.module.__name__.rpartition(".")[2] != "test_app_jars":
        real = app_jars.jars_of
        monkeypatch.setattr(
            app_jars,
            "jars_of",
            lambda s, app: (
                [s.jvm_dir / app_jars.JAR_NAME / f"{app_jars.JAR_NAME}-unit.jar"] if app.java else real(s, app)
            ),
        )


@pytest.fixture
def driver(tmp_path):
    """A process under the default app's status file and job log (ONCEFLOW_VAR_DIR=tmp_path): a driver's command
    line and its signal handler, or not."""
    s = config.load(env={"ONCEFLOW_VAR_DIR": str(tmp_path)})
    started = []

    def start(is_driver: bool) -> subprocess.Popen:
        log_path = supervisor.job_log(s)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        code = (
            "import faulthandler, time\nfrom onceflow import wire\n"
            "faulthandler.register(wire.STACKS_SIGNAL, all_threads=True)\n"
            if is_driver
            else "import time\n"
        ) + "print('ready', flush=True)\ntime.sleep(60)\n"
        script = tmp_path / ("entrypoints" if is_driver else "other") / "stream.py"
        script.parent.mkdir(exist_ok=True)
        script.write_text(code)
        with open(log_path, "ab") as log_file:
            p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=log_file, text=True)
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        started.append(p)
        JobStatus(app=s.app_id, pid=p.pid, started_ms=clock.now_ms()).write(s.status_file)
        return p

    yield s, start
    for p in started:
        p.kill()
        p.wait(10)
