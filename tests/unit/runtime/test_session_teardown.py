"""A test run ended by SIGTERM (`timeout N pytest`, a CI runner giving up) still tears its fixtures down, so the
broker, Airflow, PostgreSQL and jobs they started do not outlive it (tests.support.session.end_on_sigterm)."""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from onceflow.runtime import procs

REPO = Path(__file__).resolve().parents[3]


def test_a_run_ended_by_sigterm_tears_its_session_fixtures_down(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(
        textwrap.dedent(
            """
            import os
            import pytest
            from tests.support.session import end_on_sigterm

            end_on_sigterm()


            @pytest.fixture(scope="session")
            def server():
                yield
                with open(os.environ["TORN_DOWN"], "w") as f:  # stands in for stopping the broker
                    f.write("stopped")
            """
        )
    )
    (suite / "test_long.py").write_text(
        textwrap.dedent(
            """
            import os, time

            def test_waits(server):
                open(os.environ["STARTED"], "w").close()
                time.sleep(120)
            """
        )
    )
    started, torn_down = tmp_path / "started", tmp_path / "torn_down"
    env = {
        **os.environ,
        "STARTED": str(started),
        "TORN_DOWN": str(torn_down),
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(suite), str(suite)],
        cwd=suite,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        procs.wait_until(started.exists, 60, interval=0.1, what="the test to start")
        run.send_signal(signal.SIGTERM)
        out, _ = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert torn_down.read_text() == "stopped", out.decode()
    assert run.returncode != 0  # interrupted, not passed


def test_a_run_on_workers_ended_by_sigterm_leaves_no_worker_server_running(tmp_path):
    """Each pytest-xdist worker starts its own server (the suite's broker) in a session of its own; SIGTERM to the
    controller took the workers down before their teardown, and every worker's broker stayed listening."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(
        textwrap.dedent(
            """
            import os, time, uuid
            os.environ["PYTEST_ONCEFLOW_SESSION"] = uuid.uuid4().hex
            os.environ.setdefault("PYTEST_ONCEFLOW_RUN", uuid.uuid4().hex)

            import pytest
            from pathlib import Path
            from onceflow.runtime import procs
            from tests.support.session import end_on_sigterm, pytest_unconfigure  # as tests/conftest.py

            end_on_sigterm()


            @pytest.fixture(scope="session")
            def server(worker_id):
                started = Path(os.environ["STARTED"])
                proc = procs.spawn_detached(["sleep", "300"], started / f"{worker_id}.log")  # as the broker starts
                (started / f"{worker_id}.pid").write_text(str(proc.pid))
                yield
                time.sleep(20)  # a broker's controlled shutdown takes seconds
                proc.terminate()
            """
        )
    )
    for name in ("a", "b"):
        (suite / f"test_{name}.py").write_text("import time\n\ndef test_waits(server):\n    time.sleep(120)\n")
    started = tmp_path / "started"
    started.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ONCEFLOW_RUN"}  # this run's own is not the inner one's
    env |= {"STARTED": str(started), "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile"]
        + ["--rootdir", str(suite), str(suite)],
        cwd=suite,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    pids: list[int] = []
    try:
        procs.wait_until(lambda: len(list(started.glob("*.pid"))) == 2, 90, interval=0.1, what="both workers' servers")
        pids = [int(p.read_text()) for p in started.glob("*.pid")]
        run.send_signal(signal.SIGTERM)
        out, _ = run.communicate(timeout=90)
        procs.wait_until(
            lambda: not any(procs.pid_alive(p) for p in pids), 30, interval=0.2, what="the servers to stop"
        )
    finally:
        if run.poll() is None:
            run.kill()
        for p in pids:
            if procs.pid_alive(p):
                os.kill(p, signal.SIGKILL)
    assert run.returncode != 0, out.decode()
