"""Reconciliation and backfill rules without a broker: range selection, late-row watermarks, window emission,
the verdicts and their differences; backfill parameter checks and chunking."""

import json

import pytest

from onceflow import wire
from onceflow.control import reconciliation
from onceflow.rules import backfill as br
from onceflow.rules import reconciliation as rr
from onceflow.rules.ledger import LedgerEntry, check_coverage
from onceflow.rules.sources import SourcePartition, on_topic


def SRC(by_partition):
    """Ranges or offsets of topic src, by partition."""
    return on_topic("src", by_partition)


def entry(n, ranges, wm, commit_ms=0):
    return LedgerEntry("app", n, SRC(ranges), wm, 0, 1, 0, 1.0, commit_ms, wire.H_APP)


ENTRIES = [
    entry(0, {0: (0, 10), 1: (0, 5)}, 0, 1000),
    entry(1, {0: (10, 20), 1: (5, 5)}, 5000, 2000),
    entry(2, {0: (20, 25), 1: (5, 9)}, 5000, 3000),
    entry(3, {0: (25, 30), 1: (9, 12)}, 15000, 4000),
]


def test_select_batches_by_id_or_commit_time():
    assert [e.batch for e in rr.select_batches(ENTRIES, first=1, last=2)] == [1, 2]
    assert [e.batch for e in rr.select_batches(ENTRIES, since_ms=2000, until_ms=4000)] == [1, 2]
    assert [e.batch for e in rr.select_batches(ENTRIES)] == [0, 1, 2, 3]
    with pytest.raises(rr.ReconcileError):
        rr.select_batches(ENTRIES, first=3, last=1)


def test_batch_rows_carry_the_previous_batchs_watermark_and_skip_empty_ranges():
    rows = rr.batch_rows(rr.select_batches(ENTRIES, first=1, last=3), ENTRIES)
    assert rows == [
        rr.BatchRow("src", 0, 10, 20, 1, 0),
        rr.BatchRow("src", 0, 20, 25, 2, 5000),
        rr.BatchRow("src", 1, 5, 9, 2, 5000),
        rr.BatchRow("src", 0, 25, 30, 3, 5000),
        rr.BatchRow("src", 1, 9, 12, 3, 5000),
    ]
    assert rr.source_ranges(ENTRIES[1:]) == SRC({0: (10, 30), 1: (5, 12)})


def test_emission_is_the_first_batch_whose_watermark_reaches_the_window_end():
    em = rr.Emission(ENTRIES)
    assert em.batch(5000) == 1 and em.batch(4000) == 1 and em.batch(10000) == 3 and em.batch(15001) is None
    assert em.batch(0) == 0


def test_a_lost_carry_reads_only_the_batches_that_can_count_in_a_window_still_open():
    """Window 5 s, delay 5 s: a record read in batch j ends a window at most 10 s past the watermark of batch j+1;
    a window is open after batch a-1 only above a-1's watermark."""
    wms = [0, 0, 10_000, 20_000, 30_000, 40_000, 40_000]
    entries = [entry(n, {0: (n * 10, n * 10 + 10)}, wm) for n, wm in enumerate(wms)]
    pick = [e.batch for e in rr.carry_sources(entries, 6, 5000, 5000)]
    # open after batch 5 means ending above 40 s; batch 3 (next watermark 30 s) reaches 40 s at most, batch 4 50 s
    assert pick == [4, 5]
    assert [e.batch for e in rr.carry_sources(entries, 3, 5000, 5000)] == [1, 2]
    assert rr.carry_sources(entries, 0, 5000, 5000) == []
    # a run past the newest batch: the last one has no successor to bound it, so it is always read
    assert [e.batch for e in rr.carry_sources(entries, 7, 5000, 5000)] == [4, 5, 6]
    # a recorded watermark below an earlier one counts as the highest seen before it, as emission does
    dipped = entries[:5] + [entry(5, {0: (50, 60)}, 5_000)] + entries[6:]
    assert [e.batch for e in rr.carry_sources(dipped, 6, 5000, 5000)] == [3, 4, 5]


def test_verdicts_list_precise_differences():
    cov = rr.coverage_check(check_coverage([ENTRIES[0], ENTRIES[2]], SRC({0: 25, 1: 9})))
    assert cov.status == rr.Status.FAIL and {
        (d["kind"], d["partition"], d["start"], d["end"]) for d in cov.differences if d["kind"] == "gap"
    } == {("gap", 0, 10, 20)}
    ok = rr.accounting_check(100, 80, 5, 10, 5, {2: 3}, {2: 3})
    assert ok.status == rr.Status.PASS
    off = rr.accounting_check(100, 79, 5, 10, 5, {2: 4}, {2: 3})
    assert off.status == rr.Status.FAIL and [d["kind"] for d in off.differences] == ["unbalanced", "late_vs_spark"]
    i3 = rr.results_check(3, 4, [{"key": "k", "times": 2}], [], [{"key": "j", "expected": 2, "count": 3}], [], [], 3)
    assert i3.status == rr.Status.FAIL and "1 duplicate key(s), 1 wrong count(s), 4 sink records vs 3" in i3.summary
    assert (
        rr.visibility_check(5, 7, 0, 0).status == rr.Status.PASS
        and rr.visibility_check(5, 7, 1, 0).status == rr.Status.FAIL
    )
    res = rr.Result("app", "r1", 1, 3, SRC({0: (10, 30)}), 1, 2, [ok, i3])
    again = rr.Result.from_dict(res.as_dict())
    assert again.as_dict() == res.as_dict() and not again.ok and [c.name for c in again.failures()] == ["I3_results"]


def test_reconcile_range_params():
    assert reconciliation.range_from(2, 5) == {"first": 2, "last": 5}
    assert reconciliation.range_from(since="2026-11-22T10:00:00Z", until="1795341600001") == {
        "since_ms": 1795341600000,
        "until_ms": 1795341600001,
    }
    assert reconciliation.range_from() is None and reconciliation.range_from(None, None, "", "") is None  # chain
    for args, why in [
        ((2, None), "both"),
        ((5, 2), "before"),
        ((1, 2, "2026-11-22T10:00:00Z"), "not both"),
        ((None, None, "yesterday"), "not a time"),
        ((None, None, "2026-11-22T10:00:00Z", "2026-11-22T09:00:00Z"), "not after"),
    ]:
        with pytest.raises(rr.ReconcileError, match=why):
            reconciliation.range_from(*args)
    assert reconciliation.args_for(None) == ["--chain"]
    assert reconciliation.args_for({"first": 2, "last": 5}, with_gx=False) == ["--first", "2", "--last", "5", "--no-gx"]


def _e(batch, commit_ms=0):
    return LedgerEntry("app", batch, SRC({0: (batch * 10, batch * 10 + 10)}), 0, 0, 1, 0, 1.0, commit_ms, wire.H_APP)


def test_the_chain_takes_every_batch_once_in_bounded_slices():
    entries = [_e(b) for b in range(0, 10)]
    assert rr.chain_range(None, entries, 4) == (0, 3)  # nothing proven yet: from the first batch
    assert rr.chain_range(3, entries, 4) == (4, 7)
    assert rr.chain_range(7, entries, 4) == (8, 9)  # the rest
    assert rr.chain_range(9, entries, 4) is None  # nothing new
    with pytest.raises(rr.ReconcileError, match="batches 4..5 are missing"):
        rr.chain_range(3, [e for e in entries if e.batch not in (4, 5)], 4)
    # the position round-trips through the group's offset metadata (one per partition, all alike)
    meta = rr.chain_metadata(7, "r1", 123)
    assert rr.chain_position([meta, meta, None]) == rr.ChainPosition(7, "r1", 123)
    assert rr.chain_position([]) == rr.ChainPosition()
    with pytest.raises(rr.ReconcileError, match="several batches"):
        rr.chain_position([meta, rr.chain_metadata(8, "r2", 124)])
    with pytest.raises(rr.ReconcileError, match="did not write"):
        rr.chain_position(["{not json"])
    cov = rr.coverage([_e(4, 1000), _e(5, 2000)])
    assert cov == {
        "batches": [4, 5],
        "count": 2,
        "commit_time_ms": [1000, 2000],
        "source_topic": "src",
        "source_offsets": {"0": [40, 60]},
    }


def test_results_are_json_all_the_way_down():
    import decimal
    import json

    res = rr.Result(
        "app",
        "r1",
        1,
        3,
        SRC({0: (10, 30)}),
        1,
        2,
        [
            rr.Check(
                "I2",
                rr.Status.PASS,
                "ok",
                {"n": decimal.Decimal("12"), "share": decimal.Decimal("0.5"), "by_batch": {1: 3}},
                [{"batches": (1, 2)}],
            )
        ],
    )
    d = res.as_dict()
    assert json.loads(json.dumps(d)) == d  # no default=str needed: nothing is a repr
    assert d["checks"][0]["figures"] == {"n": 12, "share": 0.5, "by_batch": {"1": 3}}
    assert d["verdict"] == "ok" and rr.Result.from_dict(d).as_dict() == d
    chain_idle = rr.Result("app", "r2", None, None, {}, 1, mode=rr.Mode.CHAIN)
    assert chain_idle.verdict == "nothing new"


def spec(**kw):
    """A backfill of an app of one source topic, src; `start`, `end` by partition of it."""
    d = dict(id="b1", source_topics=("src",), target_topic="bf", chunk_size=10, start={0: 0, 1: 5}, end={0: 100, 1: 50})
    d |= kw
    return br.Spec(**(d | {"start": SRC(d["start"]), "end": SRC(d["end"])}))


TWO = ("access", "mirror")


def two(start, end, **kw):
    """A backfill of an app of two source topics, positions keyed `topic:partition`."""
    return br.Spec(
        **(
            dict(id="b2", source_topics=TWO, target_topic="bf", chunk_size=10)
            | {"start": br.parse_offsets(start, TWO), "end": br.parse_offsets(end, TWO)}
            | kw
        )
    )


def test_backfill_params_are_checked_before_any_write():
    protected = {"sink": "sink", "dlq": "DLQ"}
    br.check_params(spec(), protected)
    for kw, why in [
        (dict(id="a b"), "backfill id"),
        (dict(id="b.reconciliation"), "backfill id"),  # no "." in a part of a group or transactional id
        (dict(chunk_size=0), "chunk size"),
        (dict(start={}, end={}), "either by offsets"),
        (dict(since_ms=1, until_ms=2), "either"),
        (dict(start={0: 0}, end={1: 5}), "different partitions"),
        (dict(end={0: 100, 1: 4}), "before start"),
        (dict(target_topic="sink"), "live job's sink"),
        (dict(start={}, end={}, since_ms=5, until_ms=5), "not after"),
    ]:
        with pytest.raises(br.BackfillError, match=why):
            br.check_params(spec(**kw), protected)
    src = {"src": br.TopicFacts(True, {0: 0, 1: 10}, {0: 100, 1: 50})}
    with pytest.raises(br.BackfillError, match="partition 1: offset 5 is no longer in the source"):
        br.check_against(spec(), src, br.TopicFacts(True))
    with pytest.raises(br.BackfillError, match="unknown target"):
        br.check_against(spec(start={0: 0, 1: 10}), src, br.TopicFacts(False))
    with pytest.raises(br.BackfillError, match="beyond the end"):
        br.check_against(spec(start={0: 0, 1: 10}, end={0: 101, 1: 50}), src, br.TopicFacts(True))
    with pytest.raises(br.BackfillError, match="unknown source topic src"):
        br.check_against(spec(start={0: 0, 1: 10}), {}, br.TopicFacts(True))
    assert br.parse_offsets('{"0": 5}', ["src"]) == SRC({0: 5}) and br.parse_offsets(None, ["src"]) == {}
    assert br.parse_offsets({0: "5"}, ["src"]) == SRC({0: 5})  # a dict from Python, a string from a form
    for bad in ("[1, 2]", "{not json", '{"x": 1}', '{"0": "five"}', '{"0": true}', '{"other:0": 1}'):
        with pytest.raises(br.BackfillError):
            br.parse_offsets(bad, ["src"])


def test_a_backfill_of_two_source_topics_names_each_position_and_checks_each_topic():
    s = two('{"access:0": 0, "mirror:0": 5}', '{"access:0": 100, "mirror:0": 50}')
    assert s.start == {SourcePartition("access", 0): 0, SourcePartition("mirror", 0): 5}
    assert s.positions(s.end) == {"access:0": 100, "mirror:0": 50} and s.source_field == "access,mirror"
    # a range on one of them is still written with its topic: the spec names two, and its JSON reads back
    one = two('{"mirror:0": 5}', '{"mirror:0": 50}')
    assert one.positions(one.start) == {"mirror:0": 5}
    assert br.Spec.from_dict(json.loads(json.dumps(one.as_dict()))) == one
    assert br.Spec.from_dict(json.loads(json.dumps(s.as_dict()))) == s
    assert one.spec_hash() != s.spec_hash() != spec().spec_hash()
    with pytest.raises(br.BackfillError, match=r'reads 2 source topics \(access, mirror\).*"access:0"'):
        br.parse_offsets('{"0": 5}', TWO)  # which topic's partition 0?
    with pytest.raises(br.BackfillError, match="'other' is not a source topic of the app"):
        br.parse_offsets('{"other:0": 5}', TWO)
    facts = {"access": br.TopicFacts(True, {0: 0}, {0: 100}), "mirror": br.TopicFacts(True, {0: 10}, {0: 60})}
    with pytest.raises(br.BackfillError, match="mirror partition 0: offset 5 is no longer in the source"):
        br.check_against(s, facts, br.TopicFacts(True))
    br.check_against(
        two('{"access:0": 0, "mirror:0": 10}', '{"access:0": 100, "mirror:0": 60}'), facts, br.TopicFacts(True)
    )
    with pytest.raises(br.BackfillError, match="unknown source topic mirror"):
        br.check_against(s, {"access": facts["access"]}, br.TopicFacts(True))
    with pytest.raises(br.BackfillError, match="has no partition 1"):
        br.check_against(two('{"access:1": 0}', '{"access:1": 1}'), facts, br.TopicFacts(True))
    with pytest.raises(br.BackfillError, match="mirror partition 0: end 4 is before start 5"):
        br.check_params(two('{"mirror:0": 5}', '{"mirror:0": 4}'), {})
    # the same partition number on the other topic is another position: no overlap
    a, m = SourcePartition("access", 0), SourcePartition("mirror", 0)
    assert not br.overlaps({a: 0}, {a: 10}, {m: 0}, {m: 10}) and br.overlaps(
        {a: 0, m: 0}, {a: 10, m: 1}, {m: 0}, {m: 10}
    )


def test_a_backfill_of_one_source_topic_keeps_its_identity():
    """The hash of a backfill of one topic is what it was before several were possible (computed then), so a
    backfill started before resumes after an upgrade instead of being refused as "other parameters"."""
    assert spec().spec_hash() == "038f308e792aec63"
    assert spec(start={}, end={}, since_ms=1000, until_ms=2000).spec_hash() == "7af7b3d595b27524"
    assert spec().as_dict()["start"] == {"0": 0, "1": 5}


def test_backfill_overlap_chunks_and_identity():
    p0, p1 = SourcePartition("src", 0), SourcePartition("src", 1)
    assert br.overlaps({p0: 0}, {p0: 10}, {p0: 9}, {p0: 20}) and not br.overlaps({p0: 0}, {p0: 10}, {p0: 10}, {p0: 20})
    assert not br.overlaps({p0: 0}, {p0: 10}, {p1: 0}, {p1: 10})
    assert br.chunks(0, 10) == 0 and br.chunks(10, 10) == 1 and br.chunks(11, 10) == 2
    assert br.first_chunk_to_write(None) == 0 and br.first_chunk_to_write(3) == 4
    assert spec().spec_hash() == spec(dry_run=True).spec_hash() != spec(chunk_size=11).spec_hash()
    # the window, the parsing rules and the skew rule are part of a backfill's identity
    assert (
        len(
            {
                spec().spec_hash(),
                spec(window_s=10).spec_hash(),
                spec(rules=2).spec_hash(),
                spec(max_event_ahead_ms=1).spec_hash(),
            }
        )
        == 4
    )


def test_a_time_range_is_identified_by_its_times_and_resumes_on_its_first_resolution():
    by_time = spec(start={}, end={}, since_ms=1000, until_ms=2000)
    resolved_now = spec(start={0: 0, 1: 10}, end={0: 100, 1: 50}, since_ms=1000, until_ms=2000)
    grown = spec(start={0: 0, 1: 10}, end={0: 180, 1: 90}, since_ms=1000, until_ms=2000)
    assert by_time.spec_hash() == resolved_now.spec_hash() == grown.spec_hash()
    assert by_time.spec_hash() != spec(start={}, end={}, since_ms=1000, until_ms=3000).spec_hash()
    br.check_params(resolved_now, {}, resolved=True)  # a resolved time range carries both
    with pytest.raises(br.BackfillError, match="either"):
        br.check_params(resolved_now, {})
    meta = br.chunk_metadata(4, "abc", 10)
    assert json.loads(meta) == {"chunk": 4, "spec": "abc", "start": 10}


def test_each_chunk_follows_the_groups_last_committed_chunk():
    br.check_next_chunk(0, None, "b")
    br.check_next_chunk(5, 4, "b")
    for chunk, committed in ((0, 3), (2, None), (5, 5)):
        with pytest.raises(br.BackfillError, match="another run committed chunk"):
            br.check_next_chunk(chunk, committed, "b")


def test_everything_late_fails_i2_though_the_books_balance():
    ok = rr.accounting_check(100, 80, 5, 10, 5, None, {}, late_threshold=0.5)
    assert ok.status == rr.Status.PASS and ok.figures["late_fraction"] == round(5 / 90, 4)
    bad = rr.accounting_check(100, 0, 85, 10, 5, None, {}, late_threshold=0.5)
    assert bad.status == rr.Status.FAIL and bad.differences[0]["kind"] == "late_fraction" and "94%" in bad.summary


def test_batches_under_other_parse_rules_are_not_judged_and_do_not_move_the_chain():
    from dataclasses import replace

    same = [replace(_e(b), rules=2) for b in range(3)] + [_e(3)]  # an entry from before versions were recorded
    assert rr.rules_check(same, 2, chain=False) is None
    older = [replace(_e(b), rules=1) for b in range(2)] + [replace(_e(b), rules=2) for b in range(2, 4)]
    manual = rr.rules_check(older, 2, chain=False)
    assert manual is not None and manual.status == rr.Status.SKIP and "batches 0..1" in manual.summary
    chain = rr.rules_check(older, 2, chain=True)
    assert chain is not None and chain.status == rr.Status.FAIL and "version [1]" in chain.summary
