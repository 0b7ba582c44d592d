"""The replay proof's rules without Spark or a broker: where a replay begins, what it cannot prove and why, and
which differences it names."""

import pytest

from onceflow.rules import replay as rp
from onceflow.rules.ledger import LedgerEntry
from onceflow.rules.reconciliation import Status
from onceflow.rules.sources import on_topic


def SRC(by_partition):
    """Ranges or offsets of topic src, by partition."""
    return on_topic("src", by_partition)


def entry(n, wm=0, outputs=1, dlq=0):
    return LedgerEntry("app", n, SRC({0: (n * 10, n * 10 + 10)}), wm, 0, outputs, dlq, 1.0, n, "t")


HISTORY = [entry(0), entry(1), entry(2, 5000), entry(3, 5000), entry(4, 9000)]


def test_a_stateful_replay_begins_at_the_first_batch():
    p = rp.plan(HISTORY, HISTORY[3:], stateful=True)
    assert p.start == 0 and p.compared == (3, 4) and [e.batch for e in p.batches] == [0, 1, 2, 3, 4]


def test_a_stateless_replay_begins_at_the_first_batch_compared():
    p = rp.plan(HISTORY, HISTORY[3:], stateful=False)
    assert p.start == 3 and [e.batch for e in p.batches] == [3, 4]


def test_source_records_deleted_by_retention_are_named():
    p = rp.plan(HISTORY, HISTORY[3:], stateful=True)
    assert rp.source_gone(p, SRC({0: 0})) is None
    assert "batch 0 are no longer in Kafka (src[0] now begins at offset 15, the batch read from 0)" in str(
        rp.source_gone(p, SRC({0: 15}))
    )
    assert rp.source_gone(rp.plan(HISTORY, HISTORY[3:], stateful=False), SRC({0: 30})) is None


@pytest.mark.parametrize(
    "history, says",
    [
        (HISTORY[1:], "begins at batch 1"),
        ([e for e in HISTORY if e.batch != 2], "ledger batch 2 is missing"),
    ],
)
def test_what_a_replay_cannot_prove_is_a_warning_that_says_why(history, says):
    with pytest.raises(rp.Unprovable, match=says):
        rp.plan(history, HISTORY[3:], stateful=True)
    assert rp.unprovable("x").status == Status.WARN


def test_a_replay_runs_across_a_savepoint_restore_as_the_ledgers_straight_history():
    """A restore behind the sink at batch 4 (savepoint at 2, catch-up of 3..4): the ledger's stream batches go on
    5, 6 in the new epoch; the replay runs 0..6 as one history and compares the batches asked for."""
    after = [
        LedgerEntry("app", n, SRC({0: (n * 10, n * 10 + 10)}), 9000, 0, 1, 0, 1.0, n, "t", epoch=1) for n in (5, 6)
    ]
    history = HISTORY + after
    p = rp.plan(history, history[4:], stateful=True)
    assert [e.batch for e in p.batches] == [0, 1, 2, 3, 4, 5, 6] and p.compared == (4, 6)


def test_differences_are_named_per_batch_and_key():
    missing = [
        {"batch": 3, "kind": "result", "key": "a", "replayed": 1, "committed": 0},
        {"batch": 3, "kind": "result", "key": "b", "replayed": 1, "committed": 0},
    ]
    extra = [
        {"batch": 3, "kind": "result", "key": "a", "replayed": 0, "committed": 1},  # same key, another value
        {"batch": 4, "kind": "dlq", "key": "src|0|41", "replayed": 1, "committed": 2},
        {"batch": None, "kind": "result", "key": "z", "replayed": 0, "committed": 1},  # no transaction wrote it
    ]
    assert [(d["kind"], d["batch"], d["key"]) for d in rp.differences(missing, extra)] == [
        ("different_value", 3, "a"),
        ("missing", 3, "b"),
        ("duplicate", 4, "src|0|41"),
        ("unexpected", None, "z"),
    ]


def test_the_verdict_checks_watermarks_and_ledger_counts_of_the_compared_batches_only():
    p = rp.plan(HISTORY, HISTORY[3:], stateful=True)
    assert rp.watermark_differences(p, {0: 0, 1: 0, 2: 5000, 3: 5000, 4: 9000}) == []
    assert rp.watermark_differences(p, {0: 0, 1: 7, 2: 5000, 3: 6000, 4: 9000}) == [
        {"kind": "watermark", "batch": 3, "job_ms": 5000, "replay_ms": 6000}
    ]
    assert rp.ledger_differences(p, {3: (1, 0), 4: (1, 0), 0: (9, 9)}) == []
    assert rp.ledger_differences(p, {3: (1, 0), 4: (2, 0)}) == [
        {"kind": "ledger_count", "batch": 4, "ledger": [1, 0], "replayed": [2, 0]}
    ]
    ok = rp.check(p, {"results": 2, "dlq": 0}, [])
    assert ok.status == Status.PASS and ok.figures["replay_from"] == 0
    bad = rp.check(p, {}, rp.ledger_differences(p, {3: (1, 0)}))
    assert bad.status == Status.FAIL and "1 ledger_count" in bad.summary and bad.differences[0]["batch"] == 4


def test_a_result_on_another_outputs_topic_is_missing_on_one_and_unexpected_on_the_other():
    missing = [{"batch": 3, "kind": "result", "output": "main", "key": "a", "replayed": 1, "committed": 0}]
    extra = [{"batch": 3, "kind": "result", "output": "unlisted", "key": "a", "replayed": 0, "committed": 1}]
    assert [(d["kind"], d["output"], d["key"]) for d in rp.differences(missing, extra)] == [
        ("missing", "main", "a"),
        ("unexpected", "unlisted", "a"),
    ]
