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
