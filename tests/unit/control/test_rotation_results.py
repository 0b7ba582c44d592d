"""The rotation's and the transaction watch's typed results (onceflow.control.rotation, txnwatch): what a DAG task
returns is their JSON, and the next task reads it back as the same result."""

import json

from onceflow.control import txnwatch
from onceflow.control.rotation import Action, Result, Retained, Rotation, SavepointStep


def test_a_savepoint_step_survives_the_xcom_between_two_tasks():
    for step in (
        SavepointStep(Result.OK, id="sp-20261127T000000000Z-b5", batch=5, mode="running", files=9, compatible=True),
        SavepointStep(Result.FAILED, error="the ledger has no record of batch 5"),
        SavepointStep(Result.SKIPPED, why="nothing committed"),
        SavepointStep(Result.OK, Action.VERIFY, id="sp-x", incompatibilities=("spark 3.5.1",), verification={"ok": 1}),
    ):
        back = SavepointStep.from_dict(json.loads(json.dumps(step.as_dict())))
        assert back == step and back.failed == (step.status == Result.FAILED)


def test_a_rotation_is_ok_unless_its_savepoint_failed():
    kept = Retained(
        kept=("a",), deleted=({"id": "b", "why": "age"},), replaced_checkpoints_deleted=(), keep=2, max_age_s=1
    )
    ok = Rotation("a", SavepointStep(Result.SKIPPED, why="nothing committed"), kept, {"size_bytes": 1})
    failed = Rotation("a", SavepointStep(Result.FAILED, error="x"), kept, {})
    assert ok.ok and not failed.ok
    d = json.loads(json.dumps(failed.as_dict()))
    assert d["ok"] is False and d["savepoint"]["status"] == "failed" and d["retention"]["deleted"][0]["why"] == "age"


def test_the_transaction_watchs_result_is_json_for_its_task():
    found = txnwatch.WatchResult(
        events=2,
        open_transactions=(txnwatch.OpenTxn("t", 0, 5, 9, None, "a", "3"),),
        hanging=({"partition": 0},),
        alerts=("k firing",),
    )
    assert json.loads(json.dumps(found.as_dict())) == {
        "events": 2,
        "open_transactions": [found.open_transactions[0].__dict__],
        "hanging": [{"partition": 0}],
        "alerts": ["k firing"],
    }
