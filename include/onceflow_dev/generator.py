"""An emulation of an NGINX access-log service: writes (time, IP) records to the source topic (an app of several
source topics, App.sources: to each in turn, a run of one record per partition on each).

Reproducible from a seed; optional manifest (CSV: partition, offset, kind, ts_us, ip, reason, topic) records what
was sent and where it landed, so tests know the truth without trusting the job.
"""

from __future__ import annotations

import csv
import json
import logging
import random
import time
from bisect import bisect_left
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import accumulate
from pathlib import Path

from onceflow.config import Settings
from onceflow.kafka import clients as kafka_clients
from onceflow.rules import clock
from onceflow.rules.sources import SourcePartition
from onceflow.wire import OnceflowError
from onceflow_apps.access_log import rules as records

log = logging.getLogger(__name__)
KIND_OK = "ok"
KIND_OUT_OF_ORDER = "out_of_order"
KIND_LATE = "late"
KIND_MALFORMED = "malformed"
KIND_TAIL = "tail"
_MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]


class GeneratorError(OnceflowError, ValueError):
    pass


def pidfile(settings: Settings) -> Path:
    return settings.run_dir / "generator.pid"


@dataclass
class GeneratorSpec:
    count: int | None = 10_000  # records to send (None: until duration_s)
    duration_s: float | None = None  # or: send for this long (needs rate > 0)
    rate: float = 0.0  # records per second of wall time; 0 = as fast as possible
    event_rate: float | None = None  # records per second of *event* time; default: `rate`, or 1000 if unpaced
    start_ms: int | None = None  # event time of the first record; default: now
    distinct_ips: int = 1000
    ipv6_fraction: float = 0.2
    skew: float = 0.0  # Zipf exponent over the IPs; 0 = uniform
    out_of_order_fraction: float = 0.05  # shifted back by less than the watermark delay: never late
    late_fraction: float = 0.01  # shifted back by 30-120 s: late once the watermark has passed them
    malformed_fraction: float = 0.01
    future_fraction: float = 0.0  # event time a year ahead of the record (a broken client clock)
    json_fraction: float = 0.5  # the rest are combined log lines
    tail_s: float = 0.0  # after the run, one record per partition this far past the last event
    seed: int = 1
    partitions: int | None = None  # default: the source topic's partition count
    watermark_s: int = 5
    max_ahead_ms: int | None = 60_000  # the job's event-time skew rule, to record the reason of future records

    def validate(self) -> None:
        fr = {
            "ipv6_fraction": self.ipv6_fraction,
            "out_of_order_fraction": self.out_of_order_fraction,
            "late_fraction": self.late_fraction,
            "malformed_fraction": self.malformed_fraction,
            "json_fraction": self.json_fraction,
            "future_fraction": self.future_fraction,
        }
        for k, v in fr.items():
            if not 0 <= v <= 1:
                raise GeneratorError(f"{k} must be within [0, 1], got {v}")
        if self.out_of_order_fraction + self.late_fraction + self.malformed_fraction + self.future_fraction > 1:
            raise GeneratorError("out_of_order + late + malformed + future fractions add up to more than 1")
        if self.count is None and self.duration_s is None:
            raise GeneratorError("give a count or a duration")
        if self.count is not None and self.count < 0:
            raise GeneratorError("count must be >= 0")
        if self.duration_s is not None and self.rate <= 0:
            raise GeneratorError("a duration needs a rate > 0")
        if self.event_rate is None:
            self.event_rate = self.rate if self.rate > 0 else 1000.0
        if self.distinct_ips < 1 or self.event_rate <= 0 or self.rate < 0 or self.skew < 0:
            raise GeneratorError("distinct_ips >= 1, event_rate > 0, rate >= 0 and skew >= 0 are required")


@dataclass
class Sent:
    partition: int
    kind: str
    ts_us: int | None
    ip: str | None
    reason: str | None
    offset: int = -1
    topic: str = ""  # set by the sender: the source topic it went to


@dataclass
class GeneratorResult:
    sent: int = 0
    by_kind: dict = field(default_factory=dict)
    first_ts_ms: int | None = None
    last_ts_ms: int | None = None
    manifest: str | None = None
    seconds: float = 0.0


def _ip_pool(rng: random.Random, n: int, ipv6_fraction: float) -> list[str]:
    pool: set[str] = set()
    while len(pool) < n:
        if rng.random() < ipv6_fraction:
            ip6 = records.canonical_ip(
                "2001:db8:%x:%x::%x" % (rng.randrange(1 << 16), rng.randrange(1 << 16), rng.randrange(1, 1 << 16))
            )
            assert ip6 is not None  # a valid address by construction
            pool.add(ip6)
        else:
            pool.add(
                "%d.%d.%d.%d" % (rng.randrange(1, 224), rng.randrange(256), rng.randrange(256), rng.randrange(1, 255))
            )
    return sorted(pool)


def _combined_line(ip: str, ts_ms: int, rng: random.Random) -> tuple[bytes, int]:
    """Render a combined-format line; its clock has second precision and a random zone offset."""
    offset_min = rng.choice([0, 0, 0, 60, -330, 540])
    dt = datetime.fromtimestamp(ts_ms // 1000, tz=UTC) + timedelta(minutes=offset_min)
    sign = "+" if offset_min >= 0 else "-"
    zone = "%s%02d%02d" % (sign, abs(offset_min) // 60, abs(offset_min) % 60)
    stamp = f"{dt.day:02d}/{_MONTHS[dt.month - 1]}/{dt.year}:{dt:%H:%M:%S} {zone}"
    path = rng.choice(["/", "/index.html", "/api/v1/items?id=%d" % rng.randrange(1000), "/static/app.js"])
    status = rng.choice([200, 200, 200, 304, 404, 500])
    line = (
        f'{ip} - - [{stamp}] "GET {path} HTTP/1.1" {status} {rng.randrange(100, 50000)} '
        f'"-" "Mozilla/5.0 (onceflow-generator)"'
    )
    return line.encode(), (ts_ms // 1000) * 1_000_000


def _json_record(ip: str, ts_ms: int, rng: random.Random) -> tuple[bytes, int]:
    if rng.random() < 0.5:
        ts: object = ts_ms
    else:
        ts = records.iso_ms(ts_ms * 1000)
    return json.dumps({"ts": ts, "ip": ip}).encode(), ts_ms * 1000


def _malformed(ip: str, ts_ms: int, rng: random.Random) -> bytes:
    kind = rng.randrange(7)
    if kind == 0:
        return b'{"ts": ' + str(ts_ms).encode() + b', "ip": "' + ip.encode()  # truncated JSON
    if kind == 1:
        return json.dumps({"ts": ts_ms, "ip": "999.1.2.3"}).encode()
    if kind == 2:
        return json.dumps({"ts": "yesterday", "ip": ip}).encode()
    if kind == 3:
        return b"\xff\xfe garbage \x00"
    if kind == 4:
        return b""
    if kind == 5:
        return f'{ip} - - [99/Nov/2026:25:61:00 +0000] "GET / HTTP/1.1" 200 1 "-" "x"'.encode()
    return b"this is not an access log line"


class _Sender:
    """Produces the records to the source topic and keeps the manifest's rows, offsets filled in on delivery."""

    def __init__(self, settings: Settings):
        self.topics = settings.source_topic_list
        self.producer = kafka_clients.idempotent_producer(
            settings, **{"linger.ms": 50, "batch.size": 262144, "compression.type": "lz4"}
        )
        self.sent: list[Sent] = []
        self.errors: list[str] = []

    def emit(self, value: bytes, rec: Sent, ts_ms: int | None = None, turn: int = 0) -> None:
        """Send `rec` to the source topic of this `turn` (one after the other, for an app of several)."""
        idx = len(self.sent)
        rec.topic = self.topics[turn % len(self.topics)]
        self.sent.append(rec)

        def on_delivery(err, msg, idx=idx):
            if err is not None:
                self.errors.append(str(err))
            else:
                self.sent[idx].offset = msg.offset()

        while True:
            try:
                self.producer.produce(
                    rec.topic, value=value, partition=rec.partition, on_delivery=on_delivery, timestamp=ts_ms or 0
                )
                break
            except BufferError:
                self.producer.poll(0.05)
        self.producer.poll(0)

    def flush(self) -> None:
        remaining = self.producer.flush(60)
        if remaining or self.errors:
            raise RuntimeError(f"generator: {remaining} records undelivered, errors: {self.errors[:5]}")


def _partitions(settings: Settings, spec: GeneratorSpec) -> int:
    if spec.partitions is not None:
        return spec.partitions
    md = kafka_clients.admin(settings).list_topics(settings.source_topic, timeout=10)
    t = md.topics.get(settings.source_topic)
    if t is None or t.error is not None:
        raise GeneratorError(f"source topic {settings.source_topic} does not exist: run `onceflow-dev stack up`")
    return len(t.partitions)


def _summary(sent: list[Sent], seconds: float) -> GeneratorResult:
    result = GeneratorResult()
    result.sent = len(sent)
    for s in sent:
        result.by_kind[s.kind] = result.by_kind.get(s.kind, 0) + 1
    ts_all = [s.ts_us for s in sent if s.ts_us is not None]
    if ts_all:
        result.first_ts_ms, result.last_ts_ms = min(ts_all) // 1000, max(ts_all) // 1000
    result.seconds = round(seconds, 3)
    return result


def generate(
    settings: Settings, spec: GeneratorSpec, manifest: Path | None = None, progress_every: int = 0, stop=None
) -> GeneratorResult:
    """Send the records of `spec`; `stop` (a threading.Event) ends the run early, like a duration."""
    spec.validate()
    assert spec.event_rate is not None  # validate() sets it
    rng = random.Random(spec.seed)
    parts = _partitions(settings, spec)
    ips = _ip_pool(rng, spec.distinct_ips, spec.ipv6_fraction)
    cum = list(accumulate(1.0 / (i + 1) ** spec.skew for i in range(len(ips))))
    start_ms = spec.start_ms if spec.start_ms is not None else default_start_ms(spec, clock.now_ms())
    out = _Sender(settings)
    t0 = time.monotonic()
    i = 0
    max_ts_ms = start_ms
    while spec.count is None or i < spec.count:
        elapsed = time.monotonic() - t0
        if spec.duration_s is not None and elapsed >= spec.duration_s or stop is not None and stop.is_set():
            break
        if spec.rate > 0 and i / spec.rate > elapsed:
            time.sleep(min(i / spec.rate - elapsed, 0.5))
            continue
        ip = ips[bisect_left(cum, rng.random() * cum[-1])]
        value, rec, ts_ms = _record(spec, rng, ip, i % parts, start_ms + int(i * 1000 / spec.event_rate))
        out.emit(value, rec, ts_ms, turn=i // parts)
        if rec.kind != KIND_MALFORMED and rec.ts_us is not None:
            max_ts_ms = max(max_ts_ms, rec.ts_us // 1000)
        i += 1
        if progress_every and i % progress_every == 0:
            log.info("produced %d records (%.0f/s)", i, i / max(1e-9, time.monotonic() - t0))
    if spec.tail_s > 0:
        tail_ms = max_ts_ms + int(spec.tail_s * 1000)
        for turn in range(len(out.topics)):  # every partition of every source topic: the watermark moves on all
            for part in range(parts):
                value, ts_us = _json_record(ips[0], tail_ms, random.Random(part))
                out.emit(value, Sent(part, KIND_TAIL, ts_us, ips[0], None), turn=turn)
    out.flush()
    result = _summary(out.sent, time.monotonic() - t0)
    if manifest is not None:
        write_manifest(manifest, out.sent)
        result.manifest = str(manifest)
    return result


def _record(
    spec: GeneratorSpec, rng: random.Random, ip: str, part: int, clock_ms: int
) -> tuple[bytes, Sent, int | None]:
    """One record at event time `clock_ms`: its value, what the manifest says of it, its Kafka timestamp (None:
    the producer's clock)."""
    u = rng.random()
    if u < spec.malformed_fraction:
        value = _malformed(ip, clock_ms, rng)
        return value, Sent(part, KIND_MALFORMED, None, None, records.parse(value).reason), None
    if u < spec.malformed_fraction + spec.future_fraction:
        # a client whose clock is a year ahead: its record's Kafka timestamp is the real time of sending
        now_ms = clock.now_ms()
        value, _ = _json_record(ip, now_ms + 365 * 86_400_000, rng)
        reason = records.parse(value, now_ms, spec.max_ahead_ms).reason
        return value, Sent(part, KIND_MALFORMED, None, None, reason), now_ms
    kind, ts_ms = KIND_OK, clock_ms
    u -= spec.future_fraction
    if u < spec.malformed_fraction + spec.late_fraction:
        kind, ts_ms = KIND_LATE, clock_ms - rng.randrange(30_000, 120_000)
    elif u < spec.malformed_fraction + spec.late_fraction + spec.out_of_order_fraction:
        kind, ts_ms = KIND_OUT_OF_ORDER, clock_ms - rng.randrange(1, max(2, spec.watermark_s * 1000 - 1000))
    render = _json_record if rng.random() < spec.json_fraction else _combined_line
    value, ts_us = render(ip, max(ts_ms, 0), rng)
    return value, Sent(part, kind, ts_us, ip, None), None


def default_start_ms(spec: GeneratorSpec, now_ms: int) -> int:
    """Paced: event time starts now and follows the clock. Unpaced (a backlog written as fast as possible): the
    backlog is history that ends now, so no event time lies ahead of its record's timestamp (the job quarantines
    event times too far ahead of it)."""
    if spec.rate > 0 or not spec.count:
        return now_ms
    assert spec.event_rate is not None  # validate() sets it
    return now_ms - int(spec.count * 1000 / spec.event_rate) - int(spec.tail_s * 1000) - 1000


MANIFEST_FIELDS = ["partition", "offset", "kind", "ts_us", "ip", "reason", "topic"]


def write_manifest(path: Path, sent: list[Sent]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(MANIFEST_FIELDS)
        for s in sent:
            w.writerow(
                [s.partition, s.offset, s.kind, "" if s.ts_us is None else s.ts_us, s.ip or "", s.reason or "", s.topic]
            )


def read_manifest(path: Path) -> list[Sent]:
    out = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            out.append(
                Sent(
                    int(row["partition"]),
                    row["kind"],
                    int(row["ts_us"]) if row["ts_us"] else None,
                    row["ip"] or None,
                    row["reason"] or None,
                    int(row["offset"]),
                    row.get("topic") or "",
                )
            )
    return out


def source_end_offsets(sent: list[Sent]) -> dict[SourcePartition, int]:
    """Where the records sent end, per source partition: the position a job that read them all has committed."""
    ends: dict[SourcePartition, int] = {}
    for r in sent:
        if not r.topic:  # a record a caller wrote down itself, without saying where it went
            raise ValueError(f"a sent record without its topic: {r}")
        at = SourcePartition(r.topic, r.partition)
        ends[at] = max(ends.get(at, 0), r.offset + 1)
    return ends
