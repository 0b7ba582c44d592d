"""The parsing rules of the access-log records, as data, plus a pure-Python reference implementation.

The streaming job applies these rules compiled in Java (`java/rules`, called from a Spark plan by
`onceflow_apps.access_log.parsing`; the Flink contender of make bench runs the same classes); this module states them
once (the regular expressions and limits are passed to Java from here) and implements them again in plain Python,
the specification the Java rules are tested against record for record, so that tests and the audit can recount the
source independently of Spark and compare.

Accepted forms (docs/design.md, section 1):
- NGINX combined log line: `IP - user [dd/Mon/yyyy:HH:mm:ss +zzzz] "request" status bytes "referer" "agent"`
- JSON object: `{"ts": <epoch ms, as a JSON integer or a string of digits, or ISO-8601>, "ip": "<IPv4|IPv6>"}`
Anything else is malformed, with one of the REASON_* codes. IPs are validated textually and counted under
their canonical text form (RFC 5952: `2001:DB8::1` and `2001:db8:0:0::1` are one key, `2001:db8::1`).

Two rules depend on more than the record's bytes, and both take their inputs from the record itself, so every
reader (the job, a replay, this reference parser, reconciliation, backfills) reaches the same verdict:
- an event time more than `max_ahead_ms` after the Kafka record's own timestamp is quarantined
  (`timestamp_ahead`): a client with a broken clock must not move the watermark ahead and turn every later record
  late. The wall clock of whoever processes the record plays no part.
- an operator can quarantine source offsets whose output can never be delivered (`quarantined`, see
  docs/operations.md): they go to the DLQ with their provenance only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone

from onceflow import wire

# ---------------------------------------------------------------------------- the rules, as data
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
IPV4 = rf"{_OCTET}(\.{_OCTET}){{3}}"
_H = r"[0-9a-f]{1,4}"
IPV6 = (
    "("
    + "|".join(
        [
            rf"({_H}:){{7}}{_H}",
            rf"({_H}:){{1,7}}:",
            rf"({_H}:){{1,6}}:{_H}",
            rf"({_H}:){{1,5}}(:{_H}){{1,2}}",
            rf"({_H}:){{1,4}}(:{_H}){{1,3}}",
            rf"({_H}:){{1,3}}(:{_H}){{1,4}}",
            rf"({_H}:){{1,2}}(:{_H}){{1,5}}",
            rf"{_H}:(:{_H}){{1,6}}",
            rf":((:{_H}){{1,7}}|:)",
            rf"({_H}:){{6}}{IPV4}",
            rf"({_H}:){{1,5}}:{IPV4}",
            rf"::(ffff(:0{{1,4}})?:)?{IPV4}",
        ]
    )
    + ")"
)
IP_RE = rf"^({IPV4}|{IPV6})$"  # applied to the lower-cased candidate
# `203.0.113.9 - - [21/Nov/2026:22:00:01 +0000] "GET / HTTP/1.1" 200 512 "-" "curl/8.5"`
# possessive (`++`, `*+`): a quoted field has one way to match, and without them Java's regex engine keeps a
# backtracking point for each of its characters (a line's match took 1.7 times as long: docs/performance.md)
_QUOTED = r'"((?:[^"\\]++|\\.)*+)"'
COMBINED_RE = (
    r"^(\S+) \S+ \S+ \[([0-9]{2}/[A-Za-z]{3}/[0-9]{4}:[0-9]{2}:[0-9]{2}:[0-9]{2} [+-][0-9]{4})\] "
    + _QUOTED
    + r" [0-9]{3} ([0-9]+|-) "
    + _QUOTED
    + " "
    + _QUOTED
    + "$"
)
COMBINED_TS_FORMAT = "dd/MMM/yyyy:HH:mm:ss Z"  # Spark datetime pattern (English month names)
EPOCH_MS_RE = r"^[0-9]{1,15}$"
ISO_TS_RE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?(Z|[+-][0-9]{2}:[0-9]{2})$"
# Event times outside this range are malformed: one absurd timestamp would otherwise move the watermark
# years ahead and turn every following record late.
MIN_TS_MS = 0  # 1970-01-01T00:00:00Z
MAX_TS_MS = 4_102_444_800_000  # 2100-01-01T00:00:00Z (exclusive)
MAX_RECORD_BYTES = 64 * 1024
# The version of these rules; recorded with every batch (ledger) and part of a backfill's identity.
RULES_VERSION = 2

REASON_EMPTY = "empty"
REASON_TOO_LARGE = "too_large"
REASON_NOT_UTF8 = "not_utf8"
REASON_BAD_JSON = "bad_json"
REASON_BAD_TS = "bad_timestamp"
REASON_TS_RANGE = "timestamp_out_of_range"
REASON_BAD_IP = "bad_ip"
REASON_UNRECOGNIZED = "unrecognized_format"
REASON_TS_AHEAD = "timestamp_ahead"
REASON_QUARANTINED = wire.REASON_QUARANTINED  # the platform applies it to every app
REASONS = (
    REASON_EMPTY,
    REASON_TOO_LARGE,
    REASON_NOT_UTF8,
    REASON_BAD_JSON,
    REASON_BAD_TS,
    REASON_TS_RANGE,
    REASON_BAD_IP,
    REASON_UNRECOGNIZED,
    REASON_TS_AHEAD,
    REASON_QUARANTINED,
)

_MONTHS = {
    m: i + 1 for i, m in enumerate(["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"])
}


@dataclass(frozen=True)
class Parsed:
    """A record's outcome: ts_us and ip when valid, else reason."""

    ts_us: int | None = None
    ip: str | None = None
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None


def window_start_us(ts_us: int, window_s: int) -> int:
    w = window_s * 1_000_000
    return ts_us - (ts_us % w)


def iso_ms(ts_us: int) -> str:
    """The sink's timestamp format: ISO-8601 UTC with milliseconds."""
    dt = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=ts_us)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def sink_key(window_start_us_: int, ip: str) -> str:
    return f"{iso_ms(window_start_us_)}|{ip}"


# ---------------------------------------------------------------------------- reference implementation
_IPV4_FULL = re.compile(IPV4 + r"\Z")
_HEXTET = re.compile(r"[0-9a-f]{1,4}\Z")


def canonical_ip(candidate: object) -> str | None:
    """The canonical text of a valid IPv4 or IPv6 address (RFC 5952), else None: one address, one key.

    IPv4 stays as it is (dotted decimal, no leading zeros). IPv6: lower-case hex, no leading zeros in a group,
    the longest run of two or more zero groups written `::` (the first of equally long runs), a single zero
    group written `0`; an IPv4-mapped address (::ffff:0:0/96) keeps its last 32 bits dotted (section 5), every
    other address is pure hex. A dotted IPv4 may end any IPv6 spelling (`::ffff:1.2.3.4`, `64:ff9b::1.2.3.4`).
    Zone ids (`%eth0`) are not addresses. The same rule in Java: Rules.canonicalIp (java/rules)."""
    if not isinstance(candidate, str):
        return None
    s = candidate.lower()
    if _IPV4_FULL.match(s):
        return s
    if ":" not in s:
        return None
    if "." in s:  # an embedded IPv4 in the last 32 bits: two hex groups
        head, _, v4 = s.rpartition(":")
        if not _IPV4_FULL.match(v4):
            return None
        a, b, c, d = (int(x) for x in v4.split("."))
        s = f"{head}:{(a << 8) | b:x}:{(c << 8) | d:x}"
    halves = s.split("::")
    if len(halves) > 2:
        return None
    if len(halves) == 2:
        left = halves[0].split(":") if halves[0] else []
        right = halves[1].split(":") if halves[1] else []
        if len(left) + len(right) > 7:
            return None
        groups = left + ["0"] * (8 - len(left) - len(right)) + right
    else:
        groups = s.split(":")
    if len(groups) != 8 or not all(_HEXTET.match(g) for g in groups):
        return None
    return _render_ipv6([int(g, 16) for g in groups])


def _render_ipv6(v: list[int]) -> str:
    if v[:5] == [0] * 5 and v[5] == 0xFFFF:
        return f"::ffff:{v[6] >> 8}.{v[6] & 255}.{v[7] >> 8}.{v[7] & 255}"
    best, best_len, run = 0, 0, 0
    for i, x in enumerate(v):
        run = run + 1 if x == 0 else 0
        if run > best_len:
            best, best_len = i - run + 1, run
    h = [f"{x:x}" for x in v]
    if best_len < 2:
        return ":".join(h)
    return ":".join(h[:best]) + "::" + ":".join(h[best + best_len :])


def _java_full(pattern: str, s: str) -> bool:
    # Java's `$` in rlike/regexp_extract does not match before a trailing newline; Python's does. \Z does not.
    return re.match(pattern.removesuffix("$") + r"\Z", s) is not None


def _iso_to_us(s: str) -> int | None:
    if not _java_full(ISO_TS_RE, s):
        return None
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (dt - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def _combined_ts_to_us(s: str) -> int | None:
    # dd/Mon/yyyy:HH:mm:ss +zzzz
    try:
        day, mon, rest = s[0:2], s[3:6], s[7:]
        year, hh, mm, ss = int(rest[0:4]), int(rest[5:7]), int(rest[8:10]), int(rest[11:13])
        month = _MONTHS[mon.capitalize()]  # Spark parses month names case-insensitively
        off = rest[14:]
        sign = 1 if off[0] == "+" else -1
        tz = timezone(sign * timedelta(hours=int(off[1:3]), minutes=int(off[3:5])))
        dt = datetime(year, month, int(day), hh, mm, ss, tzinfo=tz)
    except (ValueError, KeyError, IndexError):
        return None
    return (dt - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def _in_range(ts_us: int) -> bool:
    return MIN_TS_MS * 1000 <= ts_us < MAX_TS_MS * 1000


def ahead(ts_us: int, record_ts_ms: int | None, max_ahead_ms: int | None) -> bool:
    """Is the event time more than `max_ahead_ms` after the Kafka record's timestamp? (No rule without both.)"""
    if record_ts_ms is None or max_ahead_ms is None:
        return False
    return ts_us // 1000 > record_ts_ms + max_ahead_ms


def parse(
    value: bytes | None, record_ts_ms: int | None = None, max_ahead_ms: int | None = None, quarantined: bool = False
) -> Parsed:
    """Classify one source record exactly as the streaming job does (`record_ts_ms`: the Kafka record's
    timestamp; `quarantined`: the operator quarantined its offset)."""
    if quarantined:
        return Parsed(reason=REASON_QUARANTINED)
    parsed = _parse_value(value)
    if parsed.ok and parsed.ts_us is not None and ahead(parsed.ts_us, record_ts_ms, max_ahead_ms):
        return Parsed(reason=REASON_TS_AHEAD)
    return parsed


def _parse_value(value: bytes | None) -> Parsed:
    if value is None or len(value) == 0:
        return Parsed(reason=REASON_EMPTY)
    if len(value) > MAX_RECORD_BYTES:
        return Parsed(reason=REASON_TOO_LARGE)
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return Parsed(reason=REASON_NOT_UTF8)
    text = text.strip(" ")
    if text.startswith("{"):
        # One object, trailing characters after it ignored (Spark's JSON reader's rule), but the record must end
        # with the closing brace.
        try:
            obj, _ = json.JSONDecoder().raw_decode(text)
        except ValueError:
            return Parsed(reason=REASON_BAD_JSON)
        if not text.endswith("}"):
            return Parsed(reason=REASON_BAD_JSON)
        if not isinstance(obj, dict):
            return Parsed(reason=REASON_BAD_JSON)
        raw_ts = obj.get("ts")
        ts_us: int | None = None
        if isinstance(raw_ts, int) and not isinstance(raw_ts, bool):
            raw_ts = str(raw_ts)
        if isinstance(raw_ts, str):
            if _java_full(EPOCH_MS_RE, raw_ts):
                ts_us = int(raw_ts) * 1000
            else:
                ts_us = _iso_to_us(raw_ts)
        if ts_us is None:
            return Parsed(reason=REASON_BAD_TS)
        if not _in_range(ts_us):
            return Parsed(reason=REASON_TS_RANGE)
        ip = canonical_ip(obj.get("ip"))
        if ip is None:
            return Parsed(reason=REASON_BAD_IP)
        return Parsed(ts_us=ts_us, ip=ip)
    m = re.match(COMBINED_RE.removesuffix("$") + r"\Z", text)
    if not m:
        return Parsed(reason=REASON_UNRECOGNIZED)
    ts_us = _combined_ts_to_us(m.group(2))
    if ts_us is None:
        return Parsed(reason=REASON_BAD_TS)
    if not _in_range(ts_us):
        return Parsed(reason=REASON_TS_RANGE)
    ip = canonical_ip(m.group(1))
    if ip is None:
        return Parsed(reason=REASON_BAD_IP)
    return Parsed(ts_us=ts_us, ip=ip)
