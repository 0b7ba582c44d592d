"""What an audit holds any app to (onceflow.rules.invariants): I1 and the ledger's accounting, on constructed data."""

from onceflow.rules.invariants import SinkRecord, check_accounting
from onceflow.rules.ledger import LedgerEntry
from onceflow.rules.sources import SourcePartition, on_topic

P0 = SourcePartition("src", 0)


def SRC(by_partition):
    """Ranges or offsets of topic src, by partition."""
    return on_topic("src", by_partition)


def entry(batch, start, end, wm_ms, outputs=0, dlq=0):
    return LedgerEntry("app", batch, SRC({0: (start, end)}), wm_ms, 0, outputs, dlq, 1.0, 0, "t")


def test_an_app_without_its_own_audit_is_held_to_the_ledgers_accounting():
    """What holds for any app (check_accounting): each output and each reject the committed batches counted is on
    the sink and the DLQ once, whatever the records mean; a key may repeat (a stateless app keys by IP)."""
    entries = [entry(0, 0, 4, 0, outputs=2, dlq=1), entry(1, 4, 7, 0, outputs=2)]
    rows = [
        SinkRecord("1.1.1.1", b"a"),
        SinkRecord("2.2.2.2", b"b"),
        SinkRecord("1.1.1.1", b"c"),
        SinkRecord("x", b"d"),
    ]
    assert check_accounting(entries, SRC({0: 7}), rows, [(P0, 3)]).ok
    foreign = check_accounting(entries, SRC({0: 7}), rows + [SinkRecord("z", b"e")], [(P0, 3)])
    assert not foreign.ok and (foreign.sink_records, foreign.ledger_outputs) == (5, 4)
    lost = check_accounting(entries, SRC({0: 7}), rows, [])
    assert not lost.ok and (lost.dlq_records, lost.ledger_dlq) == (0, 1) and lost.summary()["dlq_records"] == 0
    twice = check_accounting(entries, SRC({0: 7}), rows, [(P0, 3), (P0, 3)])
    assert not twice.ok and twice.dlq_duplicates == [(P0, 3)]
    outside = check_accounting(entries, SRC({0: 7}), rows, [(P0, 9)])  # no committed batch read offset 9
    assert not outside.ok and outside.dlq_unexpected == [(P0, 9)]
    gap = check_accounting([entries[1]], SRC({0: 7}), rows[2:], [], starting=SRC({0: 0}))
    assert not gap.ok and not gap.coverage.ok
