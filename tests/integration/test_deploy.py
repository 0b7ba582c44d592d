"""Deploy preflight against the real broker (no Spark needed)."""
import json
import time

import pytest

from onceflow import deploy, kafka_clients
from onceflow import events as ev

pytestmark = pytest.mark.integration


def test_preflight_refuses_when_another_driver_committed_recently(app):
    s = app()
    assert deploy.preflight_checks(s)["checkpoint"] == s.checkpoint
    p = kafka_clients.idempotent_producer(s)
    other = {"type": ev.BATCH_COMMITTED, "app": s.app_id, "ts_ms": int(time.time() * 1000), "host": "elsewhere",
             "pid": 4242, "batch": 17}
    p.produce(s.events_topic, key=s.app_id.encode(), value=json.dumps(other).encode())
    p.flush(10)
    with pytest.raises(deploy.DeployError, match="another driver of app .* committed batch 17 .* from elsewhere"):
        deploy.preflight_checks(s)
    # An old commit from elsewhere is history, not a live driver.
    assert deploy.live_elsewhere(s, within_s=0.001) is None


def test_preflight_refuses_an_unwritable_checkpoint(app, tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the checkpoint's parent directory should be")
    s = app(checkpoint_uri=(blocker / "cp").as_uri())
    with pytest.raises(deploy.DeployError, match="is not writable"):
        deploy.preflight_checks(s)
