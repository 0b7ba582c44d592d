"""The one clock and the one ISO-8601 reader (onceflow.rules.clock)."""

import time

import pytest

from onceflow.rules import clock
from onceflow.rules import reconciliation as rr


def test_iso_times_with_a_zone_are_read_as_epoch_ms():
    assert clock.parse_iso_ms("2026-11-17T00:00:00Z") == 1_794_873_600_000
    assert clock.parse_iso_ms("2026-11-17T01:00:00+01:00") == 1_794_873_600_000
    assert clock.parse_iso_ms("2026-11-17T00:00:00.250Z") == 1_794_873_600_250
    with pytest.raises(ValueError):
        clock.parse_iso_ms("yesterday")


def test_an_operators_time_is_read_by_the_same_reader_or_refused_with_the_forms_it_takes():
    assert rr.to_ms("2026-11-17T00:00:00Z") == clock.parse_iso_ms("2026-11-17T00:00:00Z")
    assert rr.to_ms("1794873600000") == 1_794_873_600_000
    with pytest.raises(rr.ReconcileError, match="ISO-8601"):
        rr.to_ms("soon")


def test_now_is_wall_clock_milliseconds():
    before = int(time.time() * 1000)
    assert before <= clock.now_ms() <= int(time.time() * 1000)


def test_one_iso_reader_to_the_microsecond_and_a_time_without_an_offset_is_utc_on_any_machine(monkeypatch):
    import time
    from datetime import timedelta

    for us in (1_794_873_600_123_000, 1_794_873_600_000_001, 1_000_000_000_123_456, 1_752_000_000_000_999):
        text = (clock.EPOCH + timedelta(microseconds=us)).isoformat().replace("+00:00", "Z")
        assert clock.parse_iso_us(text) == us
        assert clock.parse_iso_ms(text) == us // 1000
    monkeypatch.setenv("TZ", "Asia/Tokyo")  # a machine in another zone reads the same instant
    time.tzset()
    try:
        assert clock.parse_iso_ms("2026-11-17T00:00:00") == 1_794_873_600_000
    finally:
        monkeypatch.undo()
        time.tzset()
