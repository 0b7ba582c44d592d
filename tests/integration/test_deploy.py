"""Deploy preflight against the real broker (no Spark needed)."""

import json
import time

import pytest

from onceflow import wire
from onceflow.control import deploy
from onceflow.kafka import clients as kafka_clients
from onceflow.kafka import reading as kafka_reading
from onceflow.runtime import jobctl

pytestmark = pytest.mark.integration


def test_preflight_refuses_when_another_driver_committed_recently(app):
    s = app()
    assert deploy.preflight_checks(s)["checkpoint"] == s.checkpoint
    p = kafka_clients.idempotent_producer(s)
    other = {
        "type": wire.BATCH_COMMITTED,
        "app": s.app_id,
        "ts_ms": int(time.time() * 1000),
        "host": "elsewhere",
        "pid": 4242,
        "batch": 17,
    }
    p.produce(s.job_events_topic, key=s.app_id.encode(), value=json.dumps(other).encode())
    p.flush(10)
    with pytest.raises(deploy.DeployError, match="another driver of app .* committed batch 17 .* from elsewhere"):
        deploy.preflight_checks(s)
    # An old commit from elsewhere is history, not a live driver: its record is read (written just now) but the
    # commit it reports is ten minutes old.
    from onceflow.kafka import topics

    old = s.replace(app_id=s.app_id + "_old", job_events_topic=s.job_events_topic + ".old")
    topics.ensure(old)
    p.produce(
        old.job_events_topic,
        key=old.app_id.encode(),
        value=json.dumps(other | {"app": old.app_id, "ts_ms": int(time.time() * 1000) - 600_000}).encode(),
    )
    p.flush(10)
    assert len(kafka_reading.read_topic(old, old.job_events_topic, since_ms=int(time.time() * 1000) - 60_000)) == 1
    assert jobctl.live_elsewhere(old) is None


def test_two_concurrent_starts_launch_one_driver(app):
    """Both pass preflight at once; only one may launch (the other's pid file would overwrite the first's)."""
    import subprocess
    import sys

    from onceflow.runtime import jobctl, launcher

    s = app()
    env = launcher.submit_env(s)
    procs_ = [
        subprocess.Popen(
            [sys.executable, "-m", "onceflow.cli", "job", "start"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs_]
    codes = sorted(p.returncode for p in procs_)
    assert codes == [0, 2], outs
    assert any("already running" in err for _, err in outs)
    jobctl.wait_running(s, timeout=180)  # the one launched driver runs
    assert jobctl.status(s).running
    assert jobctl.stop(s)
    assert not jobctl.status(s).running


def test_preflight_refuses_an_unwritable_checkpoint(app, tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the checkpoint's parent directory should be")
    s = app(checkpoint_uri=(blocker / "cp").as_uri())
    with pytest.raises(deploy.DeployError, match="is not writable"):
        deploy.preflight_checks(s)
