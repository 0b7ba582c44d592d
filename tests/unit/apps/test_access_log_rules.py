"""The parsing rules, on the pure-Python reference implementation."""

import json

import pytest

from onceflow_apps.access_log import rules as R
from tests.support.records import random_addresses, spellings

LINE = '203.0.113.9 - - [21/Nov/2026:22:00:01 +0000] "GET / HTTP/1.1" 200 512 "-" "curl/8.5"'
T0 = 1795298401 * 1_000_000  # 2026-11-21T22:00:01Z in microseconds


def test_combined_line():
    p = R.parse(LINE.encode())
    assert p.ok and p.ip == "203.0.113.9" and p.ts_us == T0


def test_combined_line_zone_offset_and_ipv6():
    p = R.parse(b'2001:DB8::7 - - [21/Nov/2026:23:00:01 +0100] "GET / HTTP/1.1" 404 - "-" "x"')
    assert p.ok and p.ip == "2001:db8::7" and p.ts_us == T0


@pytest.mark.parametrize(
    "ts",
    [1795298401000, "1795298401000", "2026-11-21T22:00:01Z", "2026-11-21T22:00:01.000Z", "2026-11-21T23:00:01+01:00"],
)
def test_json_timestamp_forms(ts):
    p = R.parse(json.dumps({"ts": ts, "ip": "10.1.2.3"}).encode())
    assert p.ok and p.ts_us == T0 and p.ip == "10.1.2.3"


@pytest.mark.parametrize(
    "ip, key",
    [
        ("::1", "::1"),
        ("::", "::"),
        ("2001:db8::1", "2001:db8::1"),
        ("fe80::1:2:3:4", "fe80::1:2:3:4"),
        ("::ffff:192.0.2.1", "::ffff:192.0.2.1"),
        ("::FFFF:192.0.2.1", "::ffff:192.0.2.1"),
        ("0:0:0:0:0:ffff:c000:201", "::ffff:192.0.2.1"),
        ("2001:0db8:0000:0000:0000:ff00:0042:8329", "2001:db8::ff00:42:8329"),
        ("1::", "1::"),
        ("1:2:3:4:5:6:7::", "1:2:3:4:5:6:7:0"),
        ("2001:DB8::1", "2001:db8::1"),
        ("2001:db8:0:0::1", "2001:db8::1"),
        ("2001:db8:0:1:1:1:1:1", "2001:db8:0:1:1:1:1:1"),
        ("2001:0:0:1:0:0:0:1", "2001:0:0:1::1"),
        ("1:0:0:2:0:0:3:4", "1::2:0:0:3:4"),
        ("::1.2.3.4", "::102:304"),
        ("64:ff9b::1.2.3.4", "64:ff9b::102:304"),
        ("1:2:3:4:5:6:1.2.3.4", "1:2:3:4:5:6:102:304"),
    ],
)
def test_ipv6_is_counted_under_its_canonical_form(ip, key):
    assert R.parse(json.dumps({"ts": 1, "ip": ip}).encode()).ip == key


@pytest.mark.parametrize(
    "ip",
    [
        "256.1.1.1",
        "1.2.3",
        "01.2.3.4",
        "1.2.3.4.5",
        "2001:db8:::1",
        "fe80::1%eth0",
        "1:2:3:4:5:6:7:8:9",
        "g::1",
        "",
        " 1.2.3.4",
        "localhost",
        "1::2::3",
        "12345::1",
        ":::",
        ":",
        "1:2:3:4:5:6:7:1.2.3.4",
        "::1.2.3",
        "::256.1.1.1",
        "[::1]",
        "1.2.3.4::",
    ],
)
def test_bad_ips(ip):
    assert R.parse(json.dumps({"ts": 1, "ip": ip}).encode()).reason == R.REASON_BAD_IP


def test_ip_regex_agrees_with_ipaddress_module():
    import ipaddress
    import random

    rng = random.Random(7)
    for _ in range(3000):
        parts = [format(rng.randrange(1 << 16), "x") for _ in range(rng.randrange(1, 9))]
        cut = rng.randrange(len(parts) + 1)
        cand = ":".join(parts[:cut]) + ("::" if rng.random() < 0.5 else ":") + ":".join(parts[cut:])
        try:
            ipaddress.IPv6Address(cand)
            valid = True
        except ValueError:
            valid = False
        assert (R.parse(json.dumps({"ts": 1, "ip": cand}).encode()).ip is not None) == valid, cand


@pytest.mark.parametrize(
    "raw,reason",
    [
        (b"", R.REASON_EMPTY),
        (None, R.REASON_EMPTY),
        (b"\xff\xfe\x00", R.REASON_NOT_UTF8),
        (b"x" * (R.MAX_RECORD_BYTES + 1), R.REASON_TOO_LARGE),
        (b'{"ts": 1, "ip": "1.2.3.4"', R.REASON_BAD_JSON),
        (b'{"ts": 1, "ip": "1.2.3.4"} trailing', R.REASON_BAD_JSON),
        (b"{'ts': 1, 'ip': '1.2.3.4'}", R.REASON_BAD_JSON),
        (b'{"ts": "yesterday", "ip": "1.2.3.4"}', R.REASON_BAD_TS),
        (b'{"ts": 1.5, "ip": "1.2.3.4"}', R.REASON_BAD_TS),
        (b'{"ts": -1, "ip": "1.2.3.4"}', R.REASON_BAD_TS),
        (b'{"ts": true, "ip": "1.2.3.4"}', R.REASON_BAD_TS),
        (b'{"ts": "2026-11-21", "ip": "1.2.3.4"}', R.REASON_BAD_TS),
        (b'{"ip": "1.2.3.4"}', R.REASON_BAD_TS),
        (b'{"ts": 99999999999999, "ip": "1.2.3.4"}', R.REASON_TS_RANGE),
        (b'{"ts": 1, "ip": null}', R.REASON_BAD_IP),
        (b"hello world", R.REASON_UNRECOGNIZED),
        (b'1.2.3.4 - - [21/Nov/2026:22:00:01 +0000] "GET / HTTP/1.1" 200 512', R.REASON_UNRECOGNIZED),
        (b'1.2.3.4 - - [32/Nov/2026:22:00:01 +0000] "GET / HTTP/1.1" 200 512 "-" "x"', R.REASON_BAD_TS),
        (b'1.2.3.4 - - [21/Foo/2026:22:00:01 +0000] "GET / HTTP/1.1" 200 512 "-" "x"', R.REASON_BAD_TS),
        (b'999.2.3.4 - - [21/Nov/2026:22:00:01 +0000] "GET / HTTP/1.1" 200 512 "-" "x"', R.REASON_BAD_IP),
    ],
)
def test_malformed(raw, reason):
    assert R.parse(raw).reason == reason


@pytest.mark.parametrize(
    "ts_ms,start_ms",
    [
        (1795298400000, 1795298400000),  # exactly on a boundary: belongs to the window it starts
        (1795298404999, 1795298400000),  # last millisecond of the window
        (1795298405000, 1795298405000),  # next window
        (0, 0),
    ],
)
def test_window_boundaries(ts_ms, start_ms):
    assert R.window_start_us(ts_ms * 1000, 5) == start_ms * 1000


def test_sink_key_format():
    assert R.sink_key(T0 - 1_000_000, "::1") == "2026-11-21T22:00:00.000Z|::1"
    assert R.iso_ms(T0 + 123_456) == "2026-11-21T22:00:01.123Z"


def test_an_event_time_too_far_ahead_of_its_record_is_quarantined():
    v = b'{"ts": 1795298460001, "ip": "10.0.0.1"}'
    assert R.parse(v, 1795298400000, 60_000).reason == R.REASON_TS_AHEAD
    assert R.parse(v, 1795298400001, 60_000).ok  # exactly at the limit
    assert R.parse(v).ok and R.parse(v, None, 60_000).ok  # no record timestamp, or no rule: not judged
    # the rule judges valid records only; a malformed one keeps its own reason
    assert R.parse(b'{"ts": 1895298460001, "ip": "999.1.1.1"}', 1795298400000, 60_000).reason == R.REASON_BAD_IP
    assert R.parse(v, 1795298400000, 60_000, quarantined=True).reason == R.REASON_QUARANTINED


def test_every_spelling_of_an_address_is_one_key():
    import ipaddress

    rng, values = random_addresses()
    for v in values:
        keys = {R.canonical_ip(t) for t in spellings(rng, v)}
        assert len(keys) == 1 and None not in keys, (hex(v), spellings(rng, v), keys)
        key = keys.pop()
        assert R.canonical_ip(key) == key  # idempotent
        assert int(ipaddress.IPv6Address(key)) == v  # the same address
        if not key.startswith("::ffff:") or "." not in key:  # RFC 5952 = Python's text, except mapped
            assert key == ipaddress.IPv6Address(v).compressed
