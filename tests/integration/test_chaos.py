"""The short variant of `make chaos`: its own broker (it is killed and restarted), fewer faults, less data; the
same exact verification (nothing lost, nothing duplicated, the DLQ complete, reconciliation green) and the same
liveness figures and bounds (every planned fault injected; after each, a commit and the lag back in bound)."""

import json

import pytest

from onceflow_dev import chaos

pytestmark = pytest.mark.integration


def test_short_chaos_run_loses_nothing_and_duplicates_nothing(tmp_path):
    # 500 records/s: the input runs on until the faults are over, and a warm standby's Spark session comes up in
    # minutes on a loaded 2-core machine (the first kill waits for it: a takeover is one of the claims)
    spec = chaos.ChaosSpec(
        seconds=60, records=30_000, job_kills=2, broker_restarts=1, stalls=1, pauses=1, seed=3, standby_wait_s=480
    )
    rep = chaos.run(spec, tmp_path / "var")
    why = {k: rep.get(k) for k in ("faults", "missed", "lost", "duplicated", "dlq_complete", "reconciliation")}
    assert rep["ok"], json.dumps(why | {"violations": rep["liveness"]["violations"]}, indent=1, default=str)
    assert (rep["lost"], rep["duplicated"], rep["dlq_complete"]) == (0, 0, True)
    assert rep["faults"] == {"kill_job": 2, "restart_broker": 1, "pause_driver": 1, "stall_in_txn": 1}, rep
    assert rep["transaction_timeouts"] >= 1 and rep["restarts"] >= 3  # the timeout and both kills
    assert rep["standby_takeovers"] >= 1  # kills that landed on a warm standby (ChaosSpec.standby)
    assert set(rep["reconciliation"].values()) == {"pass"}
    # liveness as figures: every fault was followed by a commit and the lag back at its level, within the bounds
    live = rep["liveness"]
    assert rep["missed"] == [] and live["violations"] == [], (rep["missed"], live["violations"])
    assert len(live["faults"]) == 5 and all(f["to_commit_s"] is not None for f in live["faults"]), live["faults"]
    assert set(live["by_kind"]) == {"kill_job", "restart_broker", "pause_driver", "stall_in_txn"}
