"""Savepoints without a broker: which files belong to a cut, state recoverability, manifest checks,
compatibility, the restore decision (including the catch-up after a restore behind the sink), retention."""

import json
from dataclasses import replace

import pytest

from onceflow import wire
from onceflow.rules import checkpoint, retention
from onceflow.rules.checkpoint import Epoch, batch_plan, parse_offsets_file, render_offsets_file
from onceflow.rules.ledger import (
    BatchPlan,
    Committed,
    Decision,
    DivergentHistory,
    LedgerEntry,
    RestoreRecord,
    decide,
    offset_metadata,
    parse_record,
)
from onceflow.rules.savepoints import (
    FileEntry,
    Manifest,
    RestoreFacts,
    Runtime,
    SavepointError,
    cut_problems,
    file_problems,
    in_cut,
    incompatibilities,
    plan_restore,
    state_problems,
)
from onceflow.rules.sources import SourcePartition, on_topic
from onceflow.storage.store import Store

HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKS = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def checkpoint_files(last_batch: int, partitions: int = 2, snapshot_at: int | None = None) -> list[str]:
    files = [
        "metadata",
        ".metadata.crc",
        "sources/0/0",
        "sources/0/.0.crc",
        "state/0/_metadata/metadata",
        "onceflow/epoch.json",
    ]
    for b in range(last_batch + 1):
        files += [f"offsets/{b}", f"offsets/.{b}.crc", f"commits/{b}", f"commits/.{b}.crc"]
    for p in range(partitions):
        for v in range(1, last_batch + 2):
            files += [f"state/0/{p}/{v}.delta", f"state/0/{p}/.{v}.delta.crc"]
        if snapshot_at:
            files.append(f"state/0/{p}/{snapshot_at}.snapshot")
    return files


def test_cut_keeps_batches_up_to_n_and_state_versions_up_to_n_plus_1():
    files = checkpoint_files(7) + ["offsets/8", "state/0/0/9.delta", "state/0/1/.9.delta.abc123.tmp"]
    cut = sorted(f for f in files if in_cut(f, 5))
    assert "offsets/5" in cut and "commits/.5.crc" in cut and "offsets/6" not in cut and "commits/7" not in cut
    assert "state/0/0/6.delta" in cut and "state/0/1/.6.delta.crc" in cut and "state/0/0/7.delta" not in cut
    assert not any(f.endswith(".tmp") for f in cut)
    assert {"metadata", "sources/0/0", "state/0/_metadata/metadata", "onceflow/epoch.json"} <= set(cut)
    assert cut_problems(cut, 5, partitions=2) == []


def test_state_chain_needs_every_increment_after_the_newest_snapshot():
    files = set(checkpoint_files(12, snapshot_at=10))
    files -= {f"state/0/1/{v}.delta" for v in range(1, 10)}  # cleaned up by Spark: the snapshot covers them
    assert state_problems(files, 13, 2) == []
    files.discard("state/0/1/12.delta")
    assert state_problems(files, 13, 2) == [
        "state/0/1: no increment for state version(s) 12 (needed to load version 13 from the snapshot of version 10)"
    ]
    files.discard("state/0/0/3.delta")  # before partition 0's snapshot: not needed
    assert len(state_problems(files, 13, 2)) == 1
    assert (
        "state/0/1: no increment for state version(s) 1..9, 12"
        in state_problems(files - {"state/0/1/10.snapshot"}, 13, 2)[0]
    )


def test_state_chain_rocksdb_zip_and_changelog():
    files = ["state/0/0/4.zip", "state/0/0/5.changelog", "state/0/0/6_ab12.changelog"]
    assert state_problems(files, 6, 1) == []
    assert state_problems(files, 7, 1) and "7" in state_problems(files, 7, 1)[0]


def test_cut_problems_name_missing_and_later_batches():
    files = set(checkpoint_files(4)) - {"commits/4"}
    assert cut_problems(files, 4, 2) == ["commits/4 is missing"]
    assert "batches after 3 are present ([4])" in cut_problems(set(checkpoint_files(4)), 3, 2)[0]


def P(p, topic="src"):
    return SourcePartition(topic, p)


def S(*offsets):
    """Offsets of partitions 0, 1, ... of topic src."""
    return on_topic("src", dict(enumerate(offsets)))


def entry(n, start, end, wm=0):
    return LedgerEntry(
        "app", n, {P(p): (s, e) for p, (s, e) in enumerate(zip(start, end))}, wm, 1000 + n, 1, 0, 1.0, 0, wire.H_APP
    )


def manifest(**kw) -> Manifest:
    d = dict(
        id="sp-20261122T010000000Z-b5",
        app="app",
        created_ms=1_000,
        mode="running",
        checkpoint="file:///c",
        spark_batch=5,
        ledger_batch=5,
        epoch=0,
        end_offsets=S(50, 60),
        watermark_ms=10_000,
        batch_ts_ms=1005,
        group_offsets=S(50, 60),
        group_metadata=S('{"batch":5}', '{"batch":5}'),
        ledger_entry=json.loads(entry(5, [40, 55], [50, 60], 10_000).to_json()),
        spark_version="4.2.0",
        state_store_provider=HDFS,
        shuffle_partitions=2,
        job_config_hash="h1",
        files=(FileEntry("metadata", 3, "aa"), FileEntry("commits/5", 4, "bb")),
        total_size=7,
    )
    d.update(kw)
    return Manifest(**d)


RT = Runtime(app="app", spark_version="4.2.0", state_store_provider=HDFS, job_config_hash="h1", shuffle_partitions=2)


def committed(batch, offsets):
    return Committed.from_partitions((P(p), o, offset_metadata(batch)) for p, o in enumerate(offsets))


def facts(sink_batch, sink_end, newer=(), low=(0, 0), last_epoch=0, at_sp=None, at_sink=None):
    return RestoreFacts(
        committed=committed(sink_batch, sink_end),
        ledger_at_savepoint=at_sp or entry(5, [40, 55], [50, 60], 10_000),
        ledger_at_sink=at_sink or entry(sink_batch, [0, 0], sink_end, 77_000),
        newer=tuple(newer),
        source_low=S(*low),
        last_epoch=last_epoch,
        now_ms=9,
    )


def test_manifest_roundtrip_and_file_checks():
    m = manifest()
    assert Manifest.from_json(m.to_json()) == m
    assert file_problems(m, {"metadata": (3, "aa"), "commits/5": (4, "bb")}) == []
    probs = file_problems(m, {"metadata": (3, "zz"), "extra": (1, "x")})
    assert probs[0].startswith("metadata is corrupt") and "commits/5 is missing" in probs[1]
    assert "files not in the manifest: ['extra']" in probs[2]
    with pytest.raises(SavepointError, match="format"):
        Manifest.from_json(json.dumps(json.loads(m.to_json()) | {"format": 99}))


def test_incompatible_savepoints_are_refused_with_the_reason():
    rt = replace(RT, spark_version="4.3.0", state_store_provider=ROCKS, job_config_hash="h2")
    why = incompatibilities(manifest(), rt)
    assert len(why) == 3 and "Spark 4.2.0" in why[0] and "RocksDBStateStoreProvider" in why[1] and "query" in why[2]
    with pytest.raises(SavepointError, match="cannot be restored: .*Spark 4.2.0"):
        plan_restore(manifest(), rt, facts(5, [50, 60]))


def test_restore_at_the_sinks_batch_continues_without_catch_up():
    p = plan_restore(manifest(), RT, facts(5, [50, 60], last_epoch=2))
    assert p.catch_up is None and not p.rewind
    assert p.epoch == Epoch(
        epoch=3, ledger_shift=0, spark_batch_from=6, savepoint_id=manifest().id, restored_ms=9, prior_shift=0
    )
    assert p.record.skipped == {} and p.record.sink_batch == 5


def test_restore_behind_the_sink_catches_up_in_one_batch_that_writes_nothing():
    p = plan_restore(manifest(), RT, facts(9, [90, 95]))
    c = p.catch_up
    assert (c.spark_batch, c.ledger_from, c.ledger_to) == (6, 6, 9)
    assert c.start == S(50, 60) and c.end == S(90, 95) and c.watermark_ms == 77_000 and c.records == 75
    assert p.epoch.ledger_shift == 3 and p.epoch.catch_up_spark_batch == 6 and p.epoch.catch_up_from == 6
    # until the catch-up batch commits, the checkpoint's last batch is the savepoint's: still ledger batch 5 (a
    # savepoint taken then must not be labelled with the sink's batch 8)
    assert p.epoch.ledger_batch(5) == 5 and p.epoch.ledger_batch(6) == 9 and p.epoch.ledger_batch(7) == 10
    assert p.record.skipped_batches == (6, 9) and p.record.skipped == S((50, 90), (60, 95))
    assert RestoreRecord.from_json(p.record.to_json()) == p.record
    assert isinstance(parse_record(p.record.to_json()), RestoreRecord)


def test_rewind_needs_the_flag_and_is_recorded():
    with pytest.raises(SavepointError, match="is a rewind.*--allow-rewind"):
        plan_restore(manifest(), RT, facts(9, [90, 95], newer=["sp-later"]))
    p = plan_restore(manifest(), RT, facts(9, [90, 95], newer=["sp-later"]), allow_rewind=True)
    assert p.rewind and p.record.rewind and p.catch_up.ledger_from == 6


@pytest.mark.parametrize(
    "f, match",
    [
        (dict(sink_batch=3, sink_end=[30, 40]), "sink is behind the savepoint"),
        (dict(sink_batch=9, sink_end=[90, 95], low=[55, 0]), "retention has already deleted"),
        (dict(sink_batch=9, sink_end=[90, 95], at_sp=entry(5, [41, 55], [50, 60])), "another history"),
        (dict(sink_batch=9, sink_end=[90, 95], at_sink=entry(9, [0, 0], [90, 94])), "inconsistent"),
    ],
)
def test_restore_refusals(f, match):
    with pytest.raises(SavepointError, match=match):
        plan_restore(manifest(), RT, facts(**f))


def test_restore_refused_when_the_sink_has_nothing():
    f = replace(facts(5, [50, 60]), committed=Committed({}, None))
    with pytest.raises(SavepointError, match="another history"):
        plan_restore(manifest(), RT, f)


def test_catch_up_decision_and_the_shifted_batches_after_it():
    cu = BatchPlan(batch=9, start=S(50, 60), end=S(90, 95), spark_batch=6, epoch=1, catch_up_from=6)
    e9 = entry(9, [80, 90], [90, 95])
    assert decide(cu, committed(9, [90, 95]), e9) is Decision.CATCH_UP
    with pytest.raises(DivergentHistory, match="another driver wrote"):
        decide(cu, committed(10, [91, 95]), None)
    with pytest.raises(DivergentHistory, match="does not end at"):
        decide(cu, committed(9, [90, 95]), entry(9, [80, 90], [90, 96]))
    nxt = BatchPlan(batch=10, start=S(90, 95), end=S(99, 99), spark_batch=7, epoch=1)
    assert decide(nxt, committed(9, [90, 95]), None) is Decision.WRITE


def test_batch_plan_maps_spark_ids_to_ledger_ids_through_the_epoch(tmp_path):
    meta = {"batchWatermarkMs": 1, "batchTimestampMs": 2, "conf": {"spark.sql.shuffle.partitions": "2"}}
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "5").write_text(
        "v1\n" + json.dumps(meta) + '\n{"src":{"0":50,"1":60}}\n{"src":{"0":50,"1":60}}'
    )
    text = render_offsets_file((tmp_path / "offsets" / "5").read_text(), S(90, 95), 77_000, 1009)
    (tmp_path / "offsets" / "6").write_text(text)
    m6, end6 = parse_offsets_file(text, ["src"])
    assert end6 == S(90, 95) and m6["batchWatermarkMs"] == 77_000 and m6["conf"] == meta["conf"]
    assert text.count('"src":{"0":90,"1":95}') == 2  # every source line of the topic (both union branches)
    ep = Epoch(epoch=1, ledger_shift=3, spark_batch_from=6, catch_up_spark_batch=6, catch_up_from=6)
    p = batch_plan(Store(tmp_path.as_uri()), 6, ["src"], ep)
    assert (p.batch, p.spark_batch, p.catch_up_from, p.epoch) == (9, 6, 6, 1)
    assert p.start == S(50, 60) and p.end == S(90, 95) and p.watermark_ms == 77_000
    assert Epoch.from_json(ep.to_json()) == ep
    assert json.loads(offset_metadata(9, 1)) == {"batch": 9, "epoch": 1}


def test_a_manifest_of_before_reads_its_topic_from_its_ledger_record_and_one_of_two_topics_names_them():
    m = manifest()
    old = json.loads(m.to_json())
    assert old["end_offsets"] == {"0": 50, "1": 60} and old["source_topic"] == "src"
    del old["source_topic"]  # as written before an app could read several topics
    assert Manifest.from_json(json.dumps(old)) == m
    two = manifest(
        end_offsets={P(0, "a"): 5, P(0, "b"): 7},
        group_offsets={P(0, "a"): 5, P(0, "b"): 7},
        group_metadata={P(0, "a"): "{}", P(0, "b"): "{}"},
    )
    d = json.loads(two.to_json())
    assert d["source_topic"] == "a,b" and d["end_offsets"] == {"a:0": 5, "b:0": 7}
    assert Manifest.from_json(two.to_json()) == two


def test_a_catch_up_over_two_topics_renders_one_source_line_and_plans_both(tmp_path):
    meta = {"batchWatermarkMs": 1, "batchTimestampMs": 2, "conf": {}}
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "0").write_text("v1\n" + json.dumps(meta) + '\n{"a":{"0":5},"b":{"0":2,"1":3}}')
    (tmp_path / "sources" / "0").mkdir(parents=True)
    (tmp_path / "sources" / "0" / "0").write_text('\x00v1\n{"a":{"0":0},"b":{"0":0,"1":0}}')
    end = {P(0, "a"): 9, P(0, "b"): 4, P(1, "b"): 8}
    text = render_offsets_file((tmp_path / "offsets" / "0").read_text(), end, 3, 4)
    assert text.splitlines()[2] == '{"a":{"0":9},"b":{"0":4,"1":8}}'
    (tmp_path / "offsets" / "1").write_text(text)
    p = batch_plan(Store(tmp_path.as_uri()), 1, ["a", "b"])
    assert p.start == {P(0, "a"): 5, P(0, "b"): 2, P(1, "b"): 3} and p.end == end and p.topics == ["a", "b"]
    first = batch_plan(Store(tmp_path.as_uri()), 0, ["a", "b"])
    assert first.start == {P(0, "a"): 0, P(0, "b"): 0, P(1, "b"): 0}


def sp(i, age_h, complete=True):
    return retention.SavepointInfo(f"sp{i}", NOW - int(age_h * 3600_000), complete, i)


NOW = 10_000 * 3600_000


def test_retention_keeps_newest_k_within_max_age_and_always_the_newest():
    history = [sp(i, age_h=30 - i) for i in range(15)]  # sp14 newest (16 h), sp0 oldest (30 h)
    plan = retention.plan(history, NOW, keep=10, max_age_s=20 * 3600)
    assert plan.keep == ["sp14", "sp13", "sp12", "sp11", "sp10"]  # 16..20 h old; sp9 is 21 h
    assert set(plan.delete_ids) == {f"sp{i}" for i in range(10)}
    assert dict(plan.delete)["sp4"] == "beyond the newest 10"
    assert dict(plan.delete)["sp9"].startswith("older than 72000 s")
    only_old = retention.plan([sp(1, 100), sp(2, 90)], NOW, keep=10, max_age_s=3600)
    assert only_old.keep == ["sp2"] and only_old.delete_ids == ["sp1"]
    assert retention.plan([sp(i, 1) for i in range(3)], NOW, keep=2, max_age_s=86400).delete_ids == ["sp0"]


def test_retention_leaves_fresh_incomplete_savepoints_alone():
    plan = retention.plan(
        [sp(1, 1), sp(2, 0.1, complete=False), sp(3, 5, complete=False)],
        NOW,
        keep=10,
        max_age_s=86400,
        incomplete_grace_s=3600,
    )
    assert plan.keep == ["sp1", "sp2"] and plan.delete_ids == ["sp3"]
    with pytest.raises(ValueError):
        retention.plan([], NOW, keep=0, max_age_s=1)


def test_a_catch_up_under_another_skew_limit_is_refused():
    """The catch-up batch rebuilds state from committed batches with the job's rules now: a skew limit other than
    the one those batches were classified with would rebuild a state their results never came from."""
    rt = replace(RT, max_event_ahead_ms=60_000)
    assert plan_restore(manifest(), rt, replace(facts(9, [90, 95]), catch_up_skews=frozenset({60_000}))).catch_up
    with pytest.raises(SavepointError, match=r"skew limit of \[120\] s.*rebuild their state with 60 s"):
        plan_restore(manifest(), rt, replace(facts(9, [90, 95]), catch_up_skews=frozenset({120_000})))
    # at the sink's batch nothing is re-read: any setting goes
    assert plan_restore(manifest(), rt, replace(facts(5, [50, 60]), catch_up_skews=frozenset({120_000})))


def test_a_catch_up_under_other_parse_rules_is_refused():
    """Likewise the parse rules' version each batch records (protocol review N-10): a rollback to code with older
    rules, then a restore, would rebuild state under rules the batches after the savepoint did not use."""
    rt = replace(RT, rules_version=2)
    assert plan_restore(manifest(), rt, replace(facts(9, [90, 95]), catch_up_rules=frozenset({2}))).catch_up
    assert plan_restore(manifest(), rt, replace(facts(9, [90, 95]), catch_up_rules=frozenset({None}))).catch_up
    with pytest.raises(SavepointError, match=r"parse rules version \[2, 3\].*classifies with version 2"):
        plan_restore(manifest(), rt, replace(facts(9, [90, 95]), catch_up_rules=frozenset({2, 3})))


def test_first_start_debris_is_the_hidden_files_of_a_checkpoint_with_no_planned_batch():
    killed_writing_offsets_0 = {
        "offsets": [".0.5f0c.tmp", "..0.5f0c.tmp.crc"],
        "state": [],
        "commits": [],
    }
    assert checkpoint.first_start_debris(killed_writing_offsets_0) == [
        "offsets/..0.5f0c.tmp.crc",
        "offsets/.0.5f0c.tmp",
    ]
    # a batch planned: the checkpoint is a running query's, and its files are Spark's to read
    assert checkpoint.first_start_debris({"offsets": ["0", ".1.ab.tmp"], "commits": []}) == []
    # a visible file that is no batch: another query's, left for Spark to refuse
    assert checkpoint.first_start_debris({"offsets": ["other"], "commits": [".x.tmp"]}) == ["commits/.x.tmp"]
    assert checkpoint.first_start_debris({}) == []
