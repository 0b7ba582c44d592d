"""Savepoints against the real broker and real Spark: taken under load, restored after kill -9, stop-with-savepoint
upgrade, rewinds, damaged savepoints. Every run ends with the exactness check of the whole history."""

import json
import threading
from pathlib import Path

import pytest

from onceflow import wire
from onceflow.control import deploy
from onceflow.kafka import events as ev
from onceflow.operations import savepoints
from onceflow.rules.savepoints import DATA_DIR, MANIFEST, SavepointError
from onceflow.rules.sources import SourcePartition
from onceflow.runtime import jobctl, procs
from tests.support.harness import assert_exact, audit, events, produce, wait_drained

pytestmark = pytest.mark.integration


def wait_batch(s, at_least: int, timeout: float = 180.0) -> int:
    """Until the job has committed ledger batch `at_least` (or later)."""

    def reached():
        b = jobctl.status(s).last_batch
        return b if b is not None and b >= at_least else None

    return procs.wait_until(reached, timeout, interval=0.3, what=f"{s.app_id} to commit batch {at_least}")


def feed_in_background(s, path, **spec) -> tuple[threading.Thread, dict]:
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(sent=produce(s, path, **spec)), daemon=True)
    t.start()
    return t, out


def checkpoint_listing(s) -> dict:
    return savepoints.Store(s.checkpoint).files()


def test_savepoint_under_load_then_kill9_and_restore_latest_is_exact(app, tmp_path, spark):
    s = app(max_offsets_per_trigger=2500, restart_attempts=10)
    feeder, fed = feed_in_background(
        s,
        tmp_path / "m.csv",
        count=50_000,
        rate=2500,
        event_rate=2500,
        distinct_ips=800,
        late_fraction=0.02,
        malformed_fraction=0.02,
        tail_s=30,
        seed=31,
    )
    jobctl.start(s)
    wait_batch(s, 2)
    m = savepoints.create(s)  # the job keeps running and committing meanwhile
    assert m.mode == "running" and m.total_size > 0 and m.spark_batch == m.ledger_batch
    assert savepoints.verify(s, m.id).compatible
    wait_batch(s, m.ledger_batch + 3)
    jobctl.kill(s, with_supervisor=True)  # kill -9 of the driver's whole process tree, maybe mid-transaction
    sink_batch = audit.ledger_entries(s)[-1].batch
    assert sink_batch >= m.ledger_batch + 3

    plan = savepoints.restore(s, "latest", bus=ev.EventBus(s))
    assert plan.manifest.id == m.id and not plan.rewind
    assert (plan.catch_up.ledger_from, plan.catch_up.ledger_to) == (m.ledger_batch + 1, sink_batch)
    assert savepoints.replaced_checkpoints(s), "the replaced checkpoint is kept, not deleted"
    jobctl.start(s)
    feeder.join(timeout=300)
    wait_drained(s, fed["sent"])
    assert_exact(s, fed["sent"])

    skipped = [e for e in events(s, wire.BATCH_REPLAY_SKIPPED) if e.get("decision") == "catch_up"]
    assert [(e["batch"], e["spark_batch"], e["catch_up_from"]) for e in skipped][:1] == [
        (sink_batch, m.spark_batch + 1, m.ledger_batch + 1)
    ]
    [rec] = audit.restore_records(s)
    assert (rec.savepoint_id, rec.sink_batch, rec.rewind, rec.skipped_batches) == (
        m.id,
        sink_batch,
        False,
        (m.ledger_batch + 1, sink_batch),
    )
    after = [e for e in audit.ledger_entries(s) if e.batch > sink_batch]
    assert after and after[0].spark_batch == m.spark_batch + 2 and after[0].epoch == rec.epoch
    assert jobctl.stop(s)
    # The whole history reconciles, across the restore: the catch-up batch's late rows are charged to no ledger
    # batch (it wrote nothing), and each progress event names the ledger batch it belongs to.
    from onceflow.operations import reconcile

    res = reconcile.run(spark, s, with_gx=False)
    assert res.ok, json.dumps([c.__dict__ for c in res.failures()], default=str)
    assert res.check("I2_accounting").figures["spark_rows_dropped_by_watermark"]
    # the proof for any app too: the app's plan replayed over the ledger's history, across the restore, finds every
    # result of the batches before it, and after it, as committed (it was a warning, "not built yet", before)
    replayed = res.check("replay")
    assert replayed.status == "pass", replayed.summary
    assert replayed.figures["committed_results"] == replayed.figures["results"] > 0


def test_stop_with_savepoint_upgrade_continues_exact_and_damaged_savepoints_are_refused(app, tmp_path):
    s = app(max_offsets_per_trigger=4000)
    first = produce(s, tmp_path / "a.csv", count=20_000, event_rate=2000, distinct_ips=500, seed=32)
    jobctl.start(s)
    wait_batch(s, 2)
    # A change of the query's meaning is refused before anything stops.
    with pytest.raises(deploy.DeployError, match="incompatibly"):
        deploy.upgrade(s.replace(window_s=10))
    assert jobctl.status(s).running

    s2 = s.replace(max_offsets_per_trigger=7000, trigger_interval_s=2.0)  # a compatible change
    out = deploy.upgrade(s2, wait_s=240)
    assert out.savepoint is not None
    m = savepoints.load(s2, out.savepoint)
    assert m.mode == "stop"
    # Stopped at a batch boundary: the savepoint is exactly where the sink stood.
    assert (
        m.group_offsets == m.end_offsets
        and json.loads(m.group_metadata[SourcePartition(s.source_topic, 0)])["batch"] == m.ledger_batch
    )
    assert jobctl.status(s2).running
    started = [e for e in events(s2, wire.JOB_STARTED)]
    assert len(started) == 2
    second = produce(
        s2,
        tmp_path / "b.csv",
        count=10_000,
        event_rate=2000,
        distinct_ips=500,
        seed=33,
        start_ms=1_795_000_015_000,
        tail_s=30,
    )
    wait_drained(s2, first + second)
    assert_exact(s2, first + second)
    assert jobctl.stop(s2)

    # Damaged savepoints: each is refused with the reason, and the checkpoint stays as it was.
    good = savepoints.create(s2)
    assert savepoints.verify(s2, good.id).ok
    root = Path(savepoints.Store(s2.savepoints).root)
    corrupt = _clone(root, good.id, "sp-20200101T000000000Z-b1")
    state_file = next(p for p in (corrupt / DATA_DIR / "state").rglob("*.delta"))
    data = bytearray(state_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state_file.write_bytes(bytes(data))
    missing = _clone(root, good.id, "sp-20200101T000000000Z-b2")
    (missing / DATA_DIR / f"commits/{good.spark_batch}").unlink()
    other_spark = _clone(root, good.id, "sp-20200101T000000000Z-b3")
    mf = json.loads((other_spark / MANIFEST).read_text())
    (other_spark / MANIFEST).write_text(json.dumps(mf | {"spark_version": "3.5.1"}))
    before = checkpoint_listing(s2)
    for sp_id, why in [
        (corrupt.name, "is corrupt"),
        (missing.name, f"commits/{good.spark_batch} is missing"),
        (other_spark.name, "taken with Spark 3.5.1"),
    ]:
        v = savepoints.verify(s2, sp_id)
        assert not v.compatible and why in " ".join(v.problems + v.incompatibilities)
        with pytest.raises(SavepointError, match=why):
            savepoints.restore(s2, sp_id)
    assert checkpoint_listing(s2) == before
    assert not savepoints.replaced_checkpoints(s2)


def _clone(root: Path, sp_id: str, new_id: str) -> Path:
    import shutil

    shutil.copytree(root / sp_id, root / new_id)
    mf = json.loads((root / new_id / MANIFEST).read_text())
    (root / new_id / MANIFEST).write_text(json.dumps(mf | {"id": new_id}))
    return root / new_id


def test_older_savepoint_is_a_rewind_refused_without_the_flag_and_exact_with_it(app, tmp_path):
    s = app(max_offsets_per_trigger=2500)
    feeder, fed = feed_in_background(
        s,
        tmp_path / "m.csv",
        count=50_000,
        rate=2000,
        event_rate=2000,
        distinct_ips=800,
        late_fraction=0.02,
        malformed_fraction=0.02,
        tail_s=30,
        seed=34,
    )
    jobctl.start(s)
    wait_batch(s, 1)
    older = savepoints.create(s)
    wait_batch(s, older.ledger_batch + 2)
    newer = savepoints.create(s)
    wait_batch(s, newer.ledger_batch + 2)
    assert jobctl.stop(s)

    # The older savepoint is a rewind (the newer one would not be: test_savepoint_under_load_...): refused,
    # nothing touched ...
    assert savepoints.check_restore(s, newer.id).rewind is False
    before = checkpoint_listing(s)
    with pytest.raises(SavepointError, match="rewind.*--allow-rewind"):
        savepoints.restore(s, older.id)
    assert checkpoint_listing(s) == before and not audit.restore_records(s)
    # ... and with the flag it is done, recorded, and nothing committed is written twice or lost.
    sink_batch = audit.ledger_entries(s)[-1].batch
    plan = savepoints.restore(s, older.id, allow_rewind=True)
    assert plan.rewind and plan.catch_up.ledger_from == older.ledger_batch + 1
    jobctl.start(s)
    feeder.join(timeout=300)
    wait_drained(s, fed["sent"])
    assert_exact(s, fed["sent"])
    recs = audit.restore_records(s)
    assert [(r.rewind, r.epoch) for r in recs] == [(True, 1)]  # a rewind starts the ledger's next epoch
    assert recs[0].skipped_batches == (older.ledger_batch + 1, sink_batch)
    assert recs[0].skipped == {
        p: (older.end_offsets[p], e)
        for p, e in audit.ledger_entries(s)[[e.batch for e in audit.ledger_entries(s)].index(sink_batch)].end.items()
    }
    assert jobctl.stop(s)
