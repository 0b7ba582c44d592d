"""The short variant of `make chaos`: its own broker (it is killed and restarted), fewer faults, less data; the
same exact verification (nothing lost, nothing duplicated, the DLQ complete, reconciliation green)."""

import pytest

from onceflow_dev import chaos

pytestmark = pytest.mark.integration


def test_short_chaos_run_loses_nothing_and_duplicates_nothing(tmp_path):
    spec = chaos.ChaosSpec(seconds=60, records=60_000, job_kills=2, broker_restarts=1, stalls=1, pauses=1, seed=3)
    rep = chaos.run(spec, tmp_path / "var")
    assert rep["ok"], rep
    assert (rep["lost"], rep["duplicated"], rep["dlq_complete"]) == (0, 0, True)
    assert rep["faults"] == {"kill_job": 2, "restart_broker": 1, "pause_driver": 1, "stall_in_txn": 1}, rep
    assert rep["transaction_timeouts"] >= 1 and rep["restarts"] >= 3  # the timeout and both kills
    assert rep["standby_takeovers"] >= 1  # kills that landed on a warm standby (ChaosSpec.standby)
    assert set(rep["reconciliation"].values()) == {"pass"}
