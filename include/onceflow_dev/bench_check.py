"""`make bench`'s correctness check: what every contender's sink must hold after the throughput phase.

Pure (no Kafka, no Spark): `ExpectedCounts` takes the backlog's records in each partition's offset order and parses
them with onceflow's reference rules (`onceflow_apps.access_log.rules.parse`, malformed records excluded); `compare` checks
a sink's records against it.

Late records. Which records an engine drops as late depends on its watermark, and the contenders' watermarks move
differently: Spark's is global (newest event time of all partitions - delay) and moves only between micro-batches,
so every record of one batch is on time against the batch's own input (a 500,000-record batch counts the late
records it holds); the plain loop's moves per 50,000-record batch; Flink's is the minimum over partitions of each
partition's newest event time - delay, moved every 200 ms (its auto-watermark interval) as records are read. None
of these is wrong. So the check splits each (window, ip) count in two:
- certain: records whose window ends after (the newest event time read before them *in their own partition*) -
  delay. No engine may drop them: Flink's watermark never exceeds that bound (it is a minimum over partitions of
  exactly such maxima, taken before the record), and Spark's global one reaches it only if a partition were read
  far ahead of another, which its proportional per-partition batch split does not do;
- uncertain: the other valid records (in the generated workload: the ones the generator shifted back 30-120 s as
  late), which an engine may or may not count.
A sink's count for a key must lie in [certain, certain + uncertain]. Windows ending at or before the lowest
partition's newest event time - delay must be emitted (every engine's final watermark passed them); windows ending
after the newest event time of all - delay must not be; the ones between may be (Spark's global watermark closes
them, Flink's per-partition minimum does not).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from onceflow.rules import clock
from onceflow_apps.access_log import rules as records


@dataclass
class Expected:
    """Per sink key (`window_start|ip`): [certain count, uncertain count, window end (us)]."""

    keys: dict[str, list[int]] = field(default_factory=dict)
    must_close_us: int = 0  # windows ending at or before this must be in the sink
    may_close_us: int = 0  # windows ending after this must not
    records: int = 0
    malformed: int = 0
    uncertain_records: int = 0

    def must_keys(self) -> set[str]:
        """The keys every correct contender writes."""
        return {k for k, (c, _, end) in self.keys.items() if c > 0 and end <= self.must_close_us}


class ExpectedCounts:
    """Feed the backlog's records with `add` (each partition's records in offset order; partitions may interleave),
    then `result()`."""

    def __init__(self, window_s: int, watermark_s: int, max_ahead_ms: int | None):
        self.w_us, self.delay_us, self.max_ahead_ms = window_s * 1_000_000, watermark_s * 1_000_000, max_ahead_ms
        self.window_s = window_s
        self.newest: dict[int, int] = {}  # partition -> newest event time read so far (us)
        self.out = Expected()

    def add(self, partition: int, value: bytes | None, record_ts_ms: int | None) -> None:
        self.out.records += 1
        r = records.parse(value, record_ts_ms, self.max_ahead_ms)
        if not r.ok:
            self.out.malformed += 1
            return
        assert r.ts_us is not None and r.ip is not None  # a valid record has both
        start = records.window_start_us(r.ts_us, self.window_s)
        end = start + self.w_us
        newest = self.newest.get(partition)
        certain = newest is None or end > newest - self.delay_us
        slot = self.out.keys.setdefault(records.sink_key(start, r.ip), [0, 0, end])
        slot[0 if certain else 1] += 1
        self.out.uncertain_records += 0 if certain else 1
        if newest is None or r.ts_us > newest:
            self.newest[partition] = r.ts_us

    def result(self) -> Expected:
        if self.newest:
            self.out.must_close_us = min(self.newest.values()) - self.delay_us
            self.out.may_close_us = max(self.newest.values()) - self.delay_us
        return self.out


def sink_value(key: str, count: int, window_s: int) -> bytes:
    """The sink's value for `key` as the Spark job writes it (to_json of window_start, window_end, ip, count)."""
    start_text, _, ip = key.partition("|")
    start_us = clock.parse_iso_us(start_text)
    doc = {
        "window_start": records.iso_ms(start_us),
        "window_end": records.iso_ms(start_us + window_s * 1_000_000),
        "ip": ip,
        "count": count,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def compare(
    exp: Expected,
    sink: Iterable[tuple[bytes | None, bytes | None]],
    window_s: int,
    dlq_records: int | None = None,
    examples: int = 5,
) -> dict:
    """Check a sink's (key, value) records against `exp`. `dlq_records`: how many records the contender's DLQ
    holds (checked against the malformed count when given). Returns the figures and a verdict: "ok", or
    "WRONG: ..." naming what differs."""
    seen: dict[str, int] = {}
    duplicates = bad_format = 0
    diffs: list[str] = []
    for k, v in sink:
        key = (k or b"").decode(errors="replace")
        try:
            count = int(json.loads(v or b"")["count"])
            formatted = "|" in key and v == sink_value(key, count, window_s)
        except (ValueError, KeyError, TypeError):
            count, formatted = -1, False
        if not formatted:
            bad_format += 1
            if len(diffs) < examples:
                diffs.append(f"format: {key!r} -> {v!r}")
            if count < 0:
                continue
        if key in seen:
            duplicates += 1
            if len(diffs) < examples:
                diffs.append(f"duplicate: {key} ({seen[key]}, then {count})")
            continue
        seen[key] = count
    missing = wrong = extra = late_counted = compared = 0
    for key, (c, u, end) in exp.keys.items():
        n = seen.get(key)
        if c > 0 and end <= exp.must_close_us:
            compared += 1
        if n is None:
            if c > 0 and end <= exp.must_close_us:
                missing += 1
                if len(diffs) < examples:
                    diffs.append(f"missing: {key} (expected {c}" + (f"..{c + u})" if u else ")"))
            continue
        if end > exp.may_close_us:
            extra += 1
            if len(diffs) < examples:
                diffs.append(f"window not closed yet: {key} = {n}")
        elif not c <= n <= c + u:
            wrong += 1
            if len(diffs) < examples:
                diffs.append(f"count: {key} = {n}, expected {c}" + (f"..{c + u}" if u else ""))
        late_counted += min(max(n - c, 0), u)
    unknown = [k for k in seen if k not in exp.keys]
    extra += len(unknown)
    diffs += [f"unexpected key: {k} = {seen[k]}" for k in unknown[: max(0, examples - len(diffs))]]
    problems = {
        "keys differ": missing + wrong + extra,
        "duplicates": duplicates,
        "badly formatted": bad_format,
    }
    dlq_ok = dlq_records is None or dlq_records == exp.malformed
    verdict = ", ".join(f"{n} {what}" for what, n in problems.items() if n)
    if not dlq_ok:
        verdict = ", ".join(filter(None, [verdict, f"DLQ {dlq_records} of {exp.malformed}"]))
    return {
        "verdict": f"WRONG: {verdict}" if verdict else "ok",
        "keys_compared": compared,
        "keys_seen": len(seen),
        "missing": missing,
        "wrong_count": wrong,
        "extra": extra,
        "duplicates": duplicates,
        "badly_formatted": bad_format,
        "late_records": exp.uncertain_records,
        "late_counted": late_counted,
        "malformed": exp.malformed,
        "dlq_records": dlq_records,
        "examples": diffs,
    }
