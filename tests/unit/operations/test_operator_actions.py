"""A restore or a quarantine changes the checkpoint under the job: refused while anything of the app still runs
here, the job, its supervisor (which relaunches the job after its restart delay) or a standby (which takes over),
and done under the start lock (protocol review N-11). Refused before any broker is asked anything."""

import sys

import pytest

from onceflow import config
from onceflow.operations import quarantine, savepoints
from onceflow.runtime import jobctl, procs, standby, supervisor


@pytest.fixture
def s(tmp_path):
    # a bootstrap nobody listens on: a check that asked the broker would hang, not pass
    return config.load(env={}, var_dir=tmp_path, bootstrap_servers="127.0.0.1:9")


@pytest.fixture
def sleeper(tmp_path):
    p = procs.spawn_detached([sys.executable, "-c", "import time; time.sleep(120)"], tmp_path / "sleeper.log")
    yield p.pid
    procs.stop_process(p.pid, 5)


@pytest.mark.parametrize(
    "what, pidfile",
    [("its supervisor", supervisor.supervisor_pidfile), ("a standby driver", standby.pidfile)],
)
def test_restore_and_quarantine_wait_for_the_supervisor_and_the_standby(s, sleeper, what, pidfile):
    procs.write_pidfile(pidfile(s), sleeper, "time.sleep(120)")
    assert what in (jobctl.still_running(s) or "")
    with pytest.raises(savepoints.SavepointError, match=f"is running \\({what}"):
        savepoints.restore(s, "latest")
    with pytest.raises(quarantine.QuarantineError, match=f"is running \\({what}"):
        quarantine.add(s, 0, 10, 20, reason="poison")


def test_nothing_running_is_nothing_running(s):
    assert jobctl.still_running(s) is None
