"""The replay decision and the coverage checks (I1), without a broker."""

import pytest

from onceflow import wire
from onceflow.rules.ledger import (
    BatchPlan,
    Committed,
    Decision,
    DivergentHistory,
    LedgerEntry,
    batch_from_metadata,
    check_coverage,
    decide,
    offset_metadata,
)
from onceflow.rules.sources import SourcePartition, on_topic


def P(p, topic="src"):
    return SourcePartition(topic, p)


def plan(n, start, end, topic="src"):
    return BatchPlan(batch=n, start=on_topic(topic, dict(enumerate(start))), end=on_topic(topic, dict(enumerate(end))))


def entry(n, start, end, topic="src"):
    return LedgerEntry.for_plan("app", plan(n, start, end, topic), 0, 0, 1.0, 0, wire.H_APP)


def committed(batch, offsets, topic="src"):
    return Committed.from_partitions((P(p, topic), o, offset_metadata(batch)) for p, o in enumerate(offsets))


def test_first_batch_writes():
    assert decide(plan(0, [0, 0], [5, 7]), Committed({}, None), None) is Decision.WRITE


def test_a_checkpoint_past_batch_0_with_nothing_committed_anywhere_never_writes():
    # a fresh checkpoint, and a restored one (epoch 2): the ledger topic was deleted or recreated and the group
    # expired; writing would start a second history under the first one's batch ids
    for epoch in (0, 2):
        p = BatchPlan(batch=812, start={P(0): 5}, end={P(0): 9}, epoch=epoch)
        with pytest.raises(DivergentHistory, match="neither the group nor the ledger"):
            decide(p, Committed({}, None), None, None)
    # batch 0 of a restored checkpoint (a savepoint taken before the first commit) still starts the history
    assert decide(BatchPlan(batch=0, start={P(0): 0}, end={P(0): 9}, epoch=1), Committed({}, None), None) is (
        Decision.WRITE
    )


def test_next_batch_writes_when_contiguous():
    assert decide(plan(3, [5, 7], [9, 9]), committed(2, [5, 7]), None) is Decision.WRITE


def test_replay_with_same_range_is_skipped():
    assert decide(plan(3, [5, 7], [9, 9]), committed(3, [9, 9]), entry(3, [5, 7], [9, 9])) is Decision.SKIP


def test_replay_with_different_range_fails_loudly():
    with pytest.raises(DivergentHistory, match="committed with ranges"):
        decide(plan(3, [5, 7], [10, 9]), committed(3, [9, 9]), entry(3, [5, 7], [9, 9]))


def test_replay_without_ledger_entry_fails():
    with pytest.raises(DivergentHistory, match="no record"):
        decide(plan(3, [5, 7], [9, 9]), committed(3, [9, 9]), None)


def test_gap_or_overlap_with_previous_batch_fails():
    with pytest.raises(DivergentHistory, match="gap or overlap"):
        decide(plan(3, [6, 7], [9, 9]), committed(2, [5, 7]), None)
    with pytest.raises(DivergentHistory, match="gap or overlap"):
        decide(plan(3, [4, 7], [9, 9]), committed(2, [5, 7]), None)


def test_checkpoint_behind_sink_fails():
    with pytest.raises(DivergentHistory, match="behind the sink"):
        decide(plan(3, [5, 7], [9, 9]), committed(7, [20, 20]), None)


def test_checkpoint_ahead_of_sink_fails():
    with pytest.raises(DivergentHistory, match="never written"):
        decide(plan(9, [5, 7], [9, 9]), committed(2, [5, 7]), None)


def test_foreign_offsets_fail():
    c = Committed.from_partitions([(P(0), 5, None), (P(1), 7, "")])
    assert c.foreign
    with pytest.raises(DivergentHistory, match="without onceflow batch metadata"):
        decide(plan(0, [0, 0], [5, 7]), c, None)


def test_mixed_batch_metadata_is_divergent():
    with pytest.raises(DivergentHistory):
        Committed.from_partitions([(P(0), 5, offset_metadata(1)), (P(1), 7, offset_metadata(2))])


def test_metadata_roundtrip():
    assert batch_from_metadata(offset_metadata(42)) == 42
    assert batch_from_metadata("garbage") is None and batch_from_metadata(None) is None


def test_ledger_entry_json_roundtrip():
    e = entry(4, [1, 2], [3, 4])
    assert LedgerEntry.from_json(e.to_json()) == e
    per_topic = LedgerEntry.for_plan("app", plan(4, [1], [3]), 3, 0, 1.0, 0, "t", outputs_by_topic={"s": 1, "s-x": 2})
    assert LedgerEntry.from_json(per_topic.to_json()) == per_topic


@pytest.mark.parametrize("bad", [[1], {"s": -1}, {"s": "1"}, {"s": True}])
def test_a_ledger_records_per_topic_counts_are_topic_to_count(bad):
    import json

    from onceflow.rules.ledger import MalformedRecord

    d = json.loads(entry(4, [1], [3]).to_json()) | {"outputs_by_topic": bad}
    with pytest.raises(MalformedRecord, match="outputs_by_topic"):
        LedgerEntry.from_json(json.dumps(d))


def test_plan_rejects_backwards_range():
    with pytest.raises(ValueError):
        plan(1, [5], [4])


def test_coverage_contiguous():
    es = [entry(0, [0, 0], [5, 3]), entry(1, [5, 3], [5, 3]), entry(2, [5, 3], [9, 8])]
    rep = check_coverage(reversed(es), committed={P(0): 9, P(1): 8}, starting={P(0): 0, P(1): 0})
    assert rep.ok and rep.batches == 3 and rep.covered == {P(0): (0, 9), P(1): (0, 8)}


def test_coverage_gap_overlap_and_committed_mismatch():
    es = [entry(0, [0, 0], [5, 3]), entry(1, [6, 3], [8, 4]), entry(2, [7, 4], [9, 5])]
    rep = check_coverage(es, committed={P(0): 9, P(1): 6})
    kinds = [(i.kind, i.partition, i.start, i.end) for i in rep.issues]
    assert ("gap", P(0), 5, 6) in kinds
    assert ("overlap", P(0), 7, 8) in kinds
    assert ("not_at_committed", P(1), 5, 6) in kinds


def test_coverage_missing_starting_offsets_is_a_gap():
    rep = check_coverage([entry(0, [3], [5])], starting={P(0): 0})
    assert [(i.kind, i.start, i.end) for i in rep.issues] == [("gap", 0, 3)]


def test_coverage_divergent_duplicate_batch_and_jump():
    es = [entry(0, [0], [5]), entry(0, [0], [6]), entry(2, [5], [7])]
    kinds = {i.kind for i in check_coverage(es).issues}
    assert {"divergent_batch", "batch_sequence"} <= kinds


NO_OFFSETS = Committed({}, None)


def test_lost_group_offsets_are_decided_from_the_ledger_never_by_writing_blindly():
    newest = entry(3, [5, 7], [9, 9])
    # a replay of the newest committed batch: skipped, not written twice
    assert decide(plan(3, [5, 7], [9, 9]), NO_OFFSETS, None, newest) is Decision.SKIP
    # the batch after it, starting where it ended: written
    assert decide(plan(4, [9, 9], [12, 10]), NO_OFFSETS, None, newest) is Decision.WRITE
    # anything else is divergent history
    with pytest.raises(DivergentHistory, match="ranges"):
        decide(plan(3, [5, 7], [10, 9]), NO_OFFSETS, None, newest)
    with pytest.raises(DivergentHistory, match="gap or overlap"):
        decide(plan(4, [8, 9], [12, 10]), NO_OFFSETS, None, newest)
    with pytest.raises(DivergentHistory, match="never written"):
        decide(plan(6, [9, 9], [12, 10]), NO_OFFSETS, None, newest)
    with pytest.raises(DivergentHistory, match="behind the sink"):
        decide(plan(2, [1, 1], [5, 7]), NO_OFFSETS, None, newest)
    # nothing anywhere: only a first batch may be written
    assert decide(plan(0, [0, 0], [5, 7]), NO_OFFSETS, None, None) is Decision.WRITE
    with pytest.raises(DivergentHistory, match="neither the group nor the ledger"):
        decide(plan(5, [0, 0], [5, 7]), NO_OFFSETS, None, None)


def test_a_lookup_past_the_scan_bound_stops_like_divergent_history(monkeypatch):
    """Not a plain crash (a restart would scan the same records again, forever): the job stops for good, exit 4."""
    from onceflow import config
    from onceflow.protocol import ledger_reader
    from onceflow.rules.ledger import DivergentHistory

    s = config.load(env={}, app_id="a")
    monkeypatch.setattr(ledger_reader, "stable_end", lambda settings, admin=None: (0, ledger_reader.MAX_SCAN + 5000))
    read = []
    monkeypatch.setattr(ledger_reader, "_app_entries", lambda c, settings, a, b: read.append(b - a) or [])
    with pytest.raises(DivergentHistory, match="cannot be proven within the scan's bound"):
        ledger_reader.find_entry(None, s, 7)
    assert sum(read) == ledger_reader.MAX_SCAN


# ---------------------------------------------------------------------------- several source topics


def two(n, a, b):
    """A plan over topics `a` (partitions 0, 1) and `b` (partition 0): a, b are ([starts], [ends])."""
    start = on_topic("a", dict(enumerate(a[0]))) | on_topic("b", dict(enumerate(b[0])))
    end = on_topic("a", dict(enumerate(a[1]))) | on_topic("b", dict(enumerate(b[1])))
    return BatchPlan(batch=n, start=start, end=end)


def test_a_one_topic_ledger_record_keeps_its_shape_and_reads_back():
    import json

    e = entry(4, [1, 2], [3, 4])
    d = json.loads(e.to_json())
    assert d["topic"] == "src" and d["ranges"] == {"0": [1, 3], "1": [2, 4]}
    # a record written before several topics were possible reads back on its topic
    assert LedgerEntry.from_json(e.to_json()).ranges == {P(0): (1, 3), P(1): (2, 4)}


def test_a_ledger_record_of_several_topics_names_them_and_reads_back():
    import json

    e = LedgerEntry.for_plan("app", two(2, ([0, 0], [5, 6]), ([0], [7])), 0, 0, 1.0, 0, "t")
    d = json.loads(e.to_json())
    assert d["topic"] == "a,b"
    assert d["ranges"] == {"a:0": [0, 5], "a:1": [0, 6], "b:0": [0, 7]}
    assert LedgerEntry.from_json(e.to_json()) == e and e.topics == ["a", "b"]


@pytest.mark.parametrize(
    "topic, ranges, why",
    [
        ("a,b", {"0": [0, 5]}, "names no topic"),  # several topics: every key names its own
        ("a,b", {"c:0": [0, 5]}, "does not name"),  # a topic the record does not name
        ("a b", {"0": [0, 5]}, "not a Kafka topic name"),
        ("", {"0": [0, 5]}, "source topic name"),
        ("a", {"a:x": [0, 5]}, "partition number"),
        (7, {"0": [0, 5]}, "source topic name"),
    ],
)
def test_positions_that_are_not_what_the_platform_writes_are_refused(topic, ranges, why):
    import json

    from onceflow.rules.ledger import MalformedRecord

    d = json.loads(entry(4, [1], [3]).to_json()) | {"topic": topic, "ranges": ranges}
    with pytest.raises(MalformedRecord, match=why):
        LedgerEntry.from_json(json.dumps(d))


def test_the_replay_decision_over_two_topics():
    newest = LedgerEntry.for_plan("app", two(3, ([5, 7], [9, 9]), ([2], [4])), 0, 0, 1.0, 0, "t")
    at = Committed.from_partitions((p, o, offset_metadata(3)) for p, o in newest.end.items())
    assert decide(two(3, ([5, 7], [9, 9]), ([2], [4])), at, newest) is Decision.SKIP
    assert decide(two(4, ([9, 9], [12, 10]), ([4], [4])), at, None) is Decision.WRITE
    # the same partition number on the other topic is another position: a gap on b[0] is caught
    with pytest.raises(DivergentHistory, match=r"gap or overlap at \{b\[0\]"):
        decide(two(4, ([9, 9], [12, 10]), ([5], [6])), at, None)
    # a replay that reads b's range differently is divergent history, whatever a's says
    with pytest.raises(DivergentHistory, match="committed with ranges"):
        decide(two(3, ([5, 7], [9, 9]), ([2], [5])), at, newest)


def test_coverage_is_per_topic_and_partition():
    es = [
        LedgerEntry.for_plan("app", two(0, ([0, 0], [5, 3]), ([0], [4])), 0, 0, 1.0, 0, "t"),
        LedgerEntry.for_plan("app", two(1, ([5, 3], [8, 3]), ([6], [9])), 0, 0, 1.0, 0, "t"),
    ]
    rep = check_coverage(es)
    assert [(i.kind, i.partition, i.start, i.end) for i in rep.issues] == [("gap", P(0, "b"), 4, 6)]
    assert rep.covered == {P(0, "a"): (0, 8), P(1, "a"): (0, 3), P(0, "b"): (0, 9)}
