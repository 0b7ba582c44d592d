"""ip_count's I2 and I3 (onceflow_apps.ip_count_invariants) on constructed data: each kind of fault is reported
precisely."""

import json

from onceflow.rules.invariants import SinkRecord
from onceflow.rules.ledger import LedgerEntry
from onceflow.rules.sources import SourcePartition, on_topic
from onceflow_apps.access_log import rules as R
from onceflow_apps.ip_count_invariants import SourceRecord, check, expected

P0 = SourcePartition("src", 0)


def SRC(by_partition):
    """Ranges or offsets of topic src, by partition."""
    return on_topic("src", by_partition)


W = 5
S = 1_800_000_000_000_000  # a window boundary, in microseconds (divisible by 5 s)


def entry(batch, start, end, wm_ms, outputs=0, dlq=0):
    return LedgerEntry("app", batch, SRC({0: (start, end)}), wm_ms, 0, outputs, dlq, 1.0, 0, "t")


def sink(ws_us, ip, count):
    key = R.sink_key(ws_us, ip)
    value = json.dumps(
        {"window_start": R.iso_ms(ws_us), "window_end": R.iso_ms(ws_us + W * 1_000_000), "ip": ip, "count": count}
    ).encode()
    return SinkRecord(key, value)


def history():
    src = [
        SourceRecord(P0, 0, S + 1, "1.1.1.1"),
        SourceRecord(P0, 1, S + 2, "1.1.1.1"),
        SourceRecord(P0, 2, S + 3, "2.2.2.2"),
        SourceRecord(P0, 3, None, None, "bad_ip"),
        # batch 1: watermark of batch 0 is S/1000 + 5000 ms: a record of window S is late now
        SourceRecord(P0, 4, S + 10, "1.1.1.1"),
        SourceRecord(P0, 5, S + 6_000_000, "1.1.1.1"),
        SourceRecord(P0, 6, S + 60_000_000, "3.3.3.3"),
    ]  # far ahead: window not final yet
    entries = [entry(0, 0, 4, S // 1000 + 5000, outputs=0, dlq=1), entry(1, 4, 7, S // 1000 + 55_000, outputs=3)]
    good_sink = [sink(S, "1.1.1.1", 2), sink(S, "2.2.2.2", 1), sink(S + 5_000_000, "1.1.1.1", 1)]
    return src, entries, good_sink


def test_expected_uses_previous_batch_watermark_for_late_rows():
    src, entries, _ = history()
    exp = expected(src, entries, W)
    assert exp.late == 1 and exp.pending == 1 and exp.malformed == {(P0, 3)}
    assert exp.counts == {
        R.sink_key(S, "1.1.1.1"): 2,
        R.sink_key(S, "2.2.2.2"): 1,
        R.sink_key(S + 5_000_000, "1.1.1.1"): 1,
    }


def test_clean_history_is_ok():
    src, entries, good = history()
    rep = check(entries, SRC({0: 7}), src, good, [(P0, 3)], W)
    assert rep.ok, rep.summary()


def test_duplicate_key_is_reported():
    src, entries, good = history()
    rep = check(entries, SRC({0: 7}), src, good + [good[0]], [(P0, 3)], W)
    assert not rep.ok and rep.duplicates == {good[0].key: 2}


def test_wrong_count_and_missing_key_are_reported():
    src, entries, good = history()
    rep = check(entries, SRC({0: 7}), src, [sink(S, "1.1.1.1", 3), good[1]], [(P0, 3)], W)
    assert rep.wrong == {good[0].key: (2, 3)} and rep.missing == {good[2].key: 1}


def test_ledger_gap_and_dlq_faults_are_reported():
    src, entries, good = history()
    rep = check([entries[1]], SRC({0: 7}), src, good, [], W, starting=SRC({0: 0}))
    assert [(i.kind, i.start, i.end) for i in rep.coverage.issues] == [("gap", 0, 4)]
    rep = check(entries, SRC({0: 7}), src, good, [], W)
    assert rep.dlq_missing == [(P0, 3)]
    rep = check(entries, SRC({0: 7}), src, good, [(P0, 3), (P0, 3), (P0, 5)], W)
    assert rep.dlq_duplicates == [(P0, 3)] and rep.dlq_unexpected == [(P0, 5)]


def test_sink_value_must_match_its_key():
    src, entries, good = history()
    bad = SinkRecord(good[0].key, good[1].value)
    rep = check(entries, SRC({0: 7}), src, [bad] + good[1:], [(P0, 3)], W)
    assert rep.malformed_values and not rep.ok


def _ip_count_args():
    src, entries, good = history()
    return entries, SRC({0: 7}), src, good, [(P0, 3)], W


def test_the_key_by_key_audit_counts_the_dlq_itself():
    assert "dlq_records" not in check(*_ip_count_args()).summary()
