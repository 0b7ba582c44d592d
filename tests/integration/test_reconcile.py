"""Reconciliation against the real broker and real Spark: a clean history reconciles green (in one run, and in
chained slices); each kind of fault is caught with the exact difference. Faults are made on copies of the topics,
so the job's own history stays intact."""

import json

import pytest

from onceflow import wire
from onceflow.control import reconciliation
from onceflow.kafka import reading as kafka_reading
from onceflow.operations import audit, reconcile, replay
from onceflow.rules.reconciliation import Status
from onceflow.runtime import jobctl
from onceflow_dev.generator import KIND_MALFORMED, KIND_TAIL
from tests.support.harness import app_settings, copy_topic, end_offsets, expire_group, produce, wait_drained

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def history(kafka, tmp_path_factory):
    """One drained run of the job (late, out-of-order and malformed records), shared by this module's tests."""
    base = kafka
    from onceflow.kafka import topics

    name = "recon_history"
    s = app_settings(
        base,
        name,
        max_offsets_per_trigger=6000,
    )
    topics.ensure(s)
    sent = produce(
        s,
        tmp_path_factory.mktemp("recon") / "m.csv",
        count=30_000,
        event_rate=3000,
        distinct_ips=400,
        out_of_order_fraction=0.05,
        late_fraction=0.03,
        malformed_fraction=0.02,
        tail_s=30,
        seed=51,
    )
    jobctl.start(s)
    try:
        wait_drained(s, sent)
    finally:
        jobctl.stop(s)
    return s, sent


def status(res) -> dict:
    return {c.name: c.status for c in res.checks}


def test_a_clean_history_reconciles_green(history, spark):
    """The whole history in one run, with the GX suite. (Runs chained slice by slice, each carrying the open windows
    of the one before: test_the_chain_proves_every_batch_once_and_a_failed_run_does_not_move_it.)"""
    s, sent = history
    whole = reconcile.run(spark, s)
    assert whole.ok and set(status(whole).values()) == {Status.PASS}, json.dumps(whole.as_dict(), indent=1, default=str)
    i2 = whole.check("I2_accounting").figures
    assert i2["source_records"] == len(sent) and i2["late"] > 0 and i2["malformed_in_dlq"] > 0
    assert i2["pending"] == sum(1 for r in sent if r.kind == KIND_TAIL)  # only the tail's own windows are open
    # the late-row rule agrees with Spark's own numRowsDroppedByWatermark, batch by batch
    assert {b: n for b, n in i2["spark_rows_dropped_by_watermark"].items() if n} == i2["late_groups_by_batch"]
    assert whole.check("gx_suite").figures["expectations"] == 9 and whole.data_docs.endswith("index.html")
    # the result is recorded where the console can read it
    out = reconciliation.record(s, whole)
    assert (
        out["ok"]
        and json.loads(kafka_reading.read_topic(s, s.reconciliation_topic)[-1].value)["run_id"] == whole.run_id
    )


def test_a_duplicate_key_written_outside_any_transaction_is_caught(history, spark):
    s, _ = history
    victim = kafka_reading.read_topic(s, s.sink_topic)[7]
    injected = kafka_reading.Msg(victim.partition, -1, victim.key, victim.value, {}, victim.timestamp_ms)
    copy_topic(s, s.sink_topic, s.sink_topic + ".dup", extra=[injected])
    res = reconcile.run(spark, s.replace(sink_topic=s.sink_topic + ".dup"))
    i3 = res.check("I3_results")
    assert i3.status == Status.FAIL and [d["key"] for d in i3.differences if d["kind"] == "duplicate"] == [
        victim.key.decode()
    ]
    assert i3.figures["foreign_records"] == 1 and i3.figures["sink_records"] == i3.figures["ledger_outputs"]
    rp = res.check("replay")  # the generic proof sees it too: a record no committed batch wrote
    assert rp.status == Status.FAIL and [(d["kind"], d["batch"], d["key"]) for d in rp.differences] == [
        ("unexpected", None, victim.key.decode())
    ]
    gx = res.check("gx_suite")
    assert gx.status == Status.FAIL and gx.differences[0]["expectation"] == "expect_column_values_to_be_unique"
    assert status(res)["I1_coverage"] == Status.PASS and status(res)["I2_dlq"] == Status.PASS


def test_a_removed_ledger_record_is_a_gap_with_exact_offsets(history, spark):
    s, _ = history
    entries = audit.ledger_entries(s)
    gone = entries[2]
    copy_topic(
        s, s.ledger_topic, s.ledger_topic + ".gap", keep=lambda m: json.loads(m.value).get("batch") != gone.batch
    )
    res = reconcile.run(spark, s.replace(ledger_topic=s.ledger_topic + ".gap"), with_gx=False)
    i1 = res.check("I1_coverage")
    gaps = {(d["partition"], d["start"], d["end"]) for d in i1.differences if d["kind"] == "gap"}
    assert i1.status == Status.FAIL and gaps == {(p.partition, a, b) for p, (a, b) in gone.ranges.items() if b > a}
    assert res.check("replay").status == Status.WARN and f"batch {gone.batch} is missing" in res.check("replay").summary


def test_a_sink_record_rewritten_with_another_value_is_a_wrong_count(history, spark):
    s, _ = history
    victim = kafka_reading.read_topic(s, s.sink_topic)[3]
    v = json.loads(victim.value)

    def change(m):
        if (m.partition, m.offset) != (victim.partition, victim.offset):
            return m
        return kafka_reading.Msg(
            m.partition, m.offset, m.key, json.dumps(v | {"count": v["count"] + 1}).encode(), m.headers, m.timestamp_ms
        )

    copy_topic(s, s.sink_topic, s.sink_topic + ".wrong", change=change)
    res = reconcile.run(spark, s.replace(sink_topic=s.sink_topic + ".wrong"), with_gx=False)
    i3 = res.check("I3_results")
    assert i3.status == Status.FAIL
    assert [(d["key"], d["expected"], d["count"]) for d in i3.differences] == [
        (victim.key.decode(), v["count"], v["count"] + 1)
    ]
    assert [(d["kind"], d["key"]) for d in res.check("replay").differences] == [
        ("different_value", victim.key.decode())
    ]


def test_a_missing_dlq_record_is_named(history, spark):
    s, _ = history
    victim = kafka_reading.read_topic(s, s.dlq_topic)[5]
    copy_topic(s, s.dlq_topic, s.dlq_topic + ".less", keep=lambda m: m.offset != victim.offset)
    res = reconcile.run(spark, s.replace(dlq_topic=s.dlq_topic + ".less"), with_gx=False)
    dlq = res.check("I2_dlq")
    where = (int(victim.headers[wire.H_SOURCE_PARTITION]), int(victim.headers[wire.H_SOURCE_OFFSET]))
    assert dlq.status == Status.FAIL
    assert [(d["partition"], d["offset"]) for d in dlq.differences if d["kind"] == "dlq_missing"] == [where]
    assert res.check("I2_accounting").status == Status.FAIL  # one record unaccounted for
    assert [(d["kind"], d["record"], d["key"]) for d in res.check("replay").differences] == [
        ("missing", "dlq", f"{s.source_topic}|{where[0]}|{where[1]}")
    ]


def test_a_running_job_reconciles_green_while_it_commits(app, spark, tmp_path, monkeypatch):
    """Input flowing, batches committing during the run: the reconciliation reads a consistent cut (the group's
    position first, then the ledger up to it), so a batch committed meanwhile is neither a gap nor foreign. The
    test makes sure a batch commits between the two reads: every read of the group's position first waits for the
    job's next commit (read in the other order, the ledger then lacks the group's batch: a false I1 gap)."""
    import threading

    from onceflow.runtime import procs

    real_position = audit.committed_position

    def after_the_next_commit(settings, partitions):
        seen = jobctl.status(s).last_batch
        procs.wait_until(
            lambda: (jobctl.status(s).last_batch or -1) > (seen or -1), 120, what="a commit between the reads"
        )
        return real_position(settings, partitions)

    # batches 3 s apart: each run replays every batch since the last (about a second each), beside the job
    s = app(max_offsets_per_trigger=1500, trigger_interval_s=3.0)
    fed: dict = {}
    done = threading.Event()
    feeder = threading.Thread(
        target=lambda: fed.update(
            sent=produce(
                s,
                tmp_path / "m.csv",
                stop=done,
                count=60_000,
                rate=400,
                event_rate=400,
                distinct_ips=200,
                late_fraction=0.02,
                malformed_fraction=0.02,
                seed=52,
                start_ms=1_795_000_000_000,
            )
        ),
        daemon=True,
    )
    jobctl.start(s)
    feeder.start()
    procs.wait_until(lambda: len(audit.ledger_entries(s)) >= 4, 180, what="a few committed batches")
    monkeypatch.setattr(audit, "committed_position", after_the_next_commit)
    before = audit.ledger_entries(s)[-1].batch
    res = reconcile.run(spark, s, with_gx=False)
    assert res.ok and set(status(res).values()) == {Status.PASS}, json.dumps(res.as_dict(), indent=1, default=str)
    assert audit.ledger_entries(s)[-1].batch > before, "the job committed while the reconciliation ran"
    done.set()
    feeder.join(30)
    assert jobctl.stop(s)


def test_the_chain_proves_every_batch_once_and_a_failed_run_does_not_move_it(history, spark):
    """The scheduled chain: slices of at most N batches from the last proven one; a failed run records its result
    and leaves the chain where it was (the next run covers the same batches again); nothing new succeeds."""
    from onceflow.operations import recon_chain

    s0, sent = history
    s = s0.replace(
        reconcile_max_batches=3, reconciliation_topic=f"{s0.reconciliation_topic}.chain", var_dir=s0.var_dir / "chain"
    )
    from onceflow.kafka import topics

    topics.ensure(s)
    entries = audit.ledger_entries(s)
    assert len(entries) >= 5
    first = reconcile.run_chain(spark, s, with_gx=False)
    assert first.ok and (first.first_batch, first.last_batch) == (entries[0].batch, entries[2].batch)
    assert reconciliation.record(s, first)["chain_moved"]
    assert recon_chain.position(s).batch == entries[2].batch
    # the group's committed offsets are the end of the proven batch: lag tools show what is left to prove
    assert audit.committed_offsets(s, entries[2].end, group=recon_chain.group_id(s)) == {
        p: o for p, o in entries[2].end.items()
    }
    # a run that fails (a duplicate slipped into the sink) is recorded but does not move the chain
    victim = kafka_reading.read_topic(s, s.sink_topic)[-3]
    injected = kafka_reading.Msg(victim.partition, -1, victim.key, victim.value, {}, victim.timestamp_ms)
    copy_topic(s, s.sink_topic, s.sink_topic + ".chaindup", extra=[injected])
    broken = s.replace(sink_topic=s.sink_topic + ".chaindup")
    failed = reconcile.run_chain(spark, broken, with_gx=False)
    assert not failed.ok and failed.first_batch == entries[3].batch
    assert not reconciliation.record(broken, failed)["chain_moved"]
    st = recon_chain.status(s, entries[-1].batch)
    assert st["proven_through"] == entries[2].batch and st["failed"] == [[failed.first_batch, failed.last_batch]]
    # the next run covers those batches again, and the rest, until nothing is new
    proven = [first]
    while True:
        res = reconcile.run_chain(spark, s, with_gx=False)
        assert res.ok, json.dumps(res.as_dict(), indent=1)
        reconciliation.record(s, res)
        if res.first_batch is None:
            assert res.verdict == "nothing new"
            break
        proven.append(res)
    spans = [(r.first_batch, r.last_batch) for r in proven]
    assert spans[1][0] == failed.first_batch
    # the chain keeps its replay's state: each run replays only what no run has replayed yet (the retry of the
    # failed slice nothing new but what was committed since), and its replay fails where the duplicate is
    replayed_now = [r.check("replay").figures["replayed_now"] for r in proven]
    assert replayed_now == [3, proven[1].last_batch - failed.last_batch] + [z - a + 1 for a, z in spans[2:]], spans
    assert failed.check("replay").status == Status.FAIL
    assert failed.check("replay").figures["replayed_now"] == failed.last_batch - failed.first_batch + 1
    covered = [b for a, z in spans for b in range(a, z + 1)]
    assert covered == [e.batch for e in entries], spans  # every batch once, in order, no gap
    # and every source record in one slice's books: the slices' accounting adds up to the generator's manifest
    books = [r.check("I2_accounting").figures for r in proven]
    assert sum(b["source_records"] for b in books) == len(sent), books
    assert sum(b["malformed_in_dlq"] for b in books) == sum(1 for r in sent if r.kind == KIND_MALFORMED), books
    assert sum(b["late"] for b in books) > 0, books
    st = recon_chain.status(s, entries[-1].batch)
    assert st["proven_through"] == entries[-1].batch and st["pending"] == [] and st["failed"] == []
    recorded = [json.loads(m.value) for m in kafka_reading.read_topic(s, s.reconciliation_topic)]
    assert [r["mode"] for r in recorded] == ["chain"] * len(recorded) and recorded[-1]["verdict"] == "nothing new"
    # a manual range far behind the chain (its carry-in is older than the chain's newest three): beside the chain
    manual = reconcile.run(spark, s, first=entries[1].batch, last=entries[2].batch, with_gx=False)
    assert manual.ok and manual.mode == "manual"
    reconciliation.record(s, manual)
    assert recon_chain.position(s).batch == entries[-1].batch
    # Kafka deletes the chain group's offsets after offsets.retention.minutes (deleting the group stands in for
    # it): the position comes from the newest chain result that moved it, and the chain does not start over (N-3)
    gid = recon_chain.group_id(s)
    expire_group(s, gid)
    assert audit.committed_offsets(s, entries[-1].end, group=gid) == {}
    assert recon_chain.position(s).batch == entries[-1].batch
    again = reconcile.run_chain(spark, s, with_gx=False)
    assert again.verdict == "nothing new" and again.proven_before == entries[-1].batch


def test_the_apps_own_plan_replayed_over_the_committed_ranges_is_what_the_job_committed(history, spark):
    """The proof for any app (onceflow.operations.replay), here on ip_count: the replay of its plan, batch by batch,
    matches the sink and the DLQ record for record, with the job's watermarks, and names a changed value."""
    s, _ = history
    snap = audit.snapshot(s)
    app, q = s.declared_app(), audit.quarantined(snap.records)
    res = replay.check(spark, s, app, snap.entries, snap.entries, q)
    assert res.status == Status.PASS, json.dumps(res.figures, default=str) + json.dumps(res.differences[:5])
    f = res.figures
    assert f["results"] == f["committed_results"] == sum(e.outputs for e in snap.entries) > 0
    assert f["dlq"] == f["committed_dlq"] == sum(e.dlq for e in snap.entries) > 0
    assert f["replay_from"] == 0 and f["replayed_batches"] == len(snap.entries)

    tail = snap.entries[len(snap.entries) // 2 :]  # a later range: the replay still begins at batch 0 (state)
    victim = next(m for m in kafka_reading.read_topic(s, s.sink_topic) if int(m.headers[wire.H_BATCH]) >= tail[0].batch)
    copy_topic(
        s,
        s.sink_topic,
        s.sink_topic + ".replay",
        change=lambda m: (
            m
            if (m.partition, m.offset) != (victim.partition, victim.offset)
            else kafka_reading.Msg(m.partition, m.offset, m.key, m.value + b" ", m.headers, m.timestamp_ms)
        ),
    )
    wrong = replay.check(spark, s.replace(sink_topic=s.sink_topic + ".replay"), app, snap.entries, tail, q)
    assert wrong.status == Status.FAIL
    assert [(d["kind"], d["batch"], d["key"]) for d in wrong.differences] == [
        ("different_value", int(victim.headers[wire.H_BATCH]), victim.key.decode())
    ]
    assert wrong.figures["replay_from"] == 0 and wrong.figures["compared"] == [tail[0].batch, tail[-1].batch]


def test_a_restart_after_a_committed_batch_is_replayed_as_the_job_ran_it(app, spark, tmp_path):
    """The job stopped right after a batch, before its next trigger, and started again: its first batch after the
    restart runs with the watermark the batch before it advanced (Spark keeps it in the checkpoint's commit log), so
    one replay run, which never restarts, computes what the job did."""
    from onceflow.runtime import procs

    s = app(close_out_batches=False, trigger_interval_s=60, max_offsets_per_trigger=100_000)
    one = produce(s, tmp_path / "a.csv", count=2000, event_rate=200, distinct_ips=40, malformed_fraction=0.01, seed=61)
    jobctl.start(s)
    procs.wait_until(lambda: len(audit.ledger_entries(s)) >= 1, 180, what="batch 0 committed")
    assert jobctl.stop(s)  # at the boundary after batch 0, before the next trigger could run a batch
    two = produce(s, tmp_path / "b.csv", count=2000, event_rate=200, distinct_ips=40, malformed_fraction=0.01, seed=62)
    ends = end_offsets(one + two)
    jobctl.start(s)
    procs.wait_until(lambda: audit.committed_offsets(s, ends) == ends, 180, what="the second part committed")
    assert jobctl.stop(s)

    snap = audit.snapshot(s)
    entries = snap.entries
    assert [e.batch for e in entries[:2]] == [0, 1] and entries[0].watermark_ms == 0
    assert entries[1].watermark_ms > 0  # advanced by batch 0's events, though a new query built batch 1
    res = replay.check(spark, s, s.declared_app(), entries, entries, audit.quarantined(snap.records))
    assert res.status == Status.PASS, res.summary + json.dumps(res.differences[:5])
    assert res.figures["results"] > 0


def test_a_lost_carry_reads_only_batches_whose_windows_can_still_be_open(history, spark, tmp_path):
    """A reconciliation with no carry file (a lost var/, the first run) rebuilds the carry-in from the batches that
    can still count in an open window, not from the ledger's first batch, whose source records retention may have
    deleted. Runs last: it extends the module's history by a later stretch of event time, then deletes the source
    records of every batch before the ones the carry needs."""
    from onceflow.rules import reconciliation as rr
    from tests.support.harness import START_MS, delete_records_before

    s0, _ = history
    later = START_MS + 10 * 60_000  # ten minutes of event time after the first stretch: its windows are all closed
    sent = produce(s0, tmp_path / "later.csv", count=18_000, event_rate=3000, start_ms=later, tail_s=30, seed=52)
    jobctl.start(s0)
    try:
        wait_drained(s0, sent)
    finally:
        jobctl.stop(s0)
    entries = audit.ledger_entries(s0)
    last = entries[-1].batch
    needed = rr.carry_sources(entries, last, s0.window_s * 1000, s0.watermark_s * 1000)
    assert needed and needed[0].batch > entries[0].batch, [(e.batch, e.watermark_ms) for e in entries]
    delete_records_before(s0, s0.source_topic, {p.partition: lo for p, (lo, _) in needed[0].ranges.items()})
    s = s0.replace(var_dir=tmp_path / "fresh")  # no carry kept
    res = reconcile.run(spark, s, first=last, last=last, with_gx=False)
    assert res.ok, json.dumps(res.as_dict(), indent=1)
    # the replay of a stateful plan needs every batch's records from batch 0, and says they are gone
    assert res.check("replay").status == Status.WARN and "no longer in Kafka" in res.check("replay").summary
