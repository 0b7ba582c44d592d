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
