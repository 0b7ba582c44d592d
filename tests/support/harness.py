"""What the integration tests share: produce a known workload, wait for the job to drain it, prove exactness."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from pathlib import Path

from confluent_kafka.admin import NewTopic

from onceflow.config import Settings
from onceflow.kafka import clients as kafka_clients
from onceflow.kafka import reading as kafka_reading
from onceflow.operations import audit
from onceflow.rules import clock
from onceflow.rules.names import private_topics
from onceflow.rules.sources import SourcePartition
from onceflow.runtime import jobctl, procs
from onceflow_apps import ip_count_audit
from onceflow_apps import ip_count_invariants as invariants
from onceflow_apps.access_log import rules as records
from onceflow_dev import credentials, generator
from onceflow_dev.generator import KIND_MALFORMED, KIND_TAIL, GeneratorSpec

START_MS = 1_795_000_000_000  # a fixed event-time origin (2026-11-17), so runs are reproducible


def app_settings(base: Settings, app_id: str, **overrides) -> Settings:
    """A test's own app instance on the shared broker: `app_id` and its own topics (names.private_topics)."""
    return base.replace(app_id=app_id, **(private_topics(app_id) | overrides))


def harness(s: Settings) -> Settings:
    """The test's own view of Kafka. On the secured broker (make test-secured) the stack's admin: the input is
    produced and the truth read back by a principal that may, while the app's roles may not."""
    return credentials.as_admin(s) if s.secured else s


def role(s: Settings, name: str) -> Settings:
    """`s` as the app's principal for `name` (onceflow.kafka.acls.ROLES) on the secured broker; `s` otherwise."""
    return credentials.as_role(s, name) if s.secured else s


def produce(s: Settings, path: Path, stop=None, **spec) -> list[generator.Sent]:
    s = harness(s)
    spec.setdefault("start_ms", START_MS)
    spec.setdefault("watermark_s", s.watermark_s)
    spec.setdefault("max_ahead_ms", s.max_event_ahead_ms)
    generator.generate(s, GeneratorSpec(**spec), manifest=path, stop=stop)
    return generator.read_manifest(path)


def truth(sent: list[generator.Sent]) -> list[invariants.SourceRecord]:
    """The generator's own record of what it sent: the expected results do not depend on any parser."""
    return [
        invariants.SourceRecord(
            SourcePartition(r.topic, r.partition),
            r.offset,
            r.ts_us,
            r.ip,
            r.reason if r.kind == KIND_MALFORMED else None,
        )
        for r in sent
    ]


def end_offsets(sent: list[generator.Sent]) -> dict[SourcePartition, int]:
    return generator.source_end_offsets(sent)


def final_window_end_ms(s: Settings, sent: list[generator.Sent]) -> int:
    w = s.window_s * 1_000_000
    return (
        max(
            records.window_start_us(r.ts_us, s.window_s) + w
            for r in sent
            if r.ts_us is not None and r.kind != KIND_TAIL
        )
        // 1000
    )


def wait_drained(s: Settings, sent: list[generator.Sent], timeout: float = 300.0) -> None:
    """Until the group has committed every produced offset and the watermark has closed every window
    except the tail's (the tail records exist only to move the watermark)."""
    s = harness(s)
    ends = end_offsets(sent)
    target_wm = final_window_end_ms(s, sent)

    def drained():
        st = jobctl.status(s)
        if st.error and not st.running and not st.supervisor_pid:
            raise AssertionError(f"job failed: {st.error}")
        if audit.committed_offsets(s, ends) != ends:
            return False
        return max((e.watermark_ms for e in audit.ledger_entries(s)), default=0) >= target_wm

    procs.wait_until(drained, timeout, interval=2.0, what=f"{s.app_id} to drain {sum(ends.values())} records")


def assert_exact(s: Settings, sent: list[generator.Sent]) -> invariants.Report:
    """I1-I4 against the generator's manifest, plus: the source as stored equals the manifest, and aborted
    transactions (if any) are invisible to read_committed consumers."""
    s = harness(s)
    ledger = audit.ledger_records(s)
    src_on_broker = ip_count_audit.source_records(
        s, [e for e in ledger if isinstance(e, audit.LedgerEntry) and e.kind == "stream"], audit.quarantined(ledger)
    )
    by_pos = {(r.partition, r.offset): r for r in truth(sent)}
    assert len(src_on_broker) == len(by_pos), "the source topic does not hold what the generator sent"
    for r in src_on_broker:
        t = by_pos[(r.partition, r.offset)]
        assert (r.ts_us, r.ip, r.reason) == (t.ts_us, t.ip, t.reason), (r, t)

    entries = audit.ledger_entries(s)
    committed = audit.committed_offsets(s, end_offsets(sent))
    sink_msgs = kafka_reading.read_topic(s, s.sink_topic)
    sink = [invariants.SinkRecord(m.key.decode(), m.value, m.partition, m.offset) for m in sink_msgs]
    dlq = audit.dlq_provenance(kafka_reading.read_topic(s, s.dlq_topic))
    rep = invariants.check(
        entries, committed, truth(sent), sink, dlq, s.window_s, starting={p: 0 for p in end_offsets(sent)}
    )
    assert rep.ok, json.dumps(rep.summary(), indent=1, default=str)
    # Every valid record is counted exactly once, late, or still pending in an open window (I2).
    valid = sum(1 for r in sent if r.kind != KIND_MALFORMED)
    assert rep.counted + rep.late + rep.pending == valid
    assert rep.malformed == sum(1 for r in sent if r.kind == KIND_MALFORMED) == rep.ledger_dlq
    assert sum(json.loads(m.value)["count"] for m in sink_msgs) == rep.counted
    # I4: read_uncommitted sees at least as much; whatever it sees beyond read_committed is aborted data.
    uncommitted = kafka_reading.read_topic(s, s.sink_topic, isolation="read_uncommitted")
    assert len(uncommitted) >= len(sink_msgs)
    assert not Counter(m.key for m in sink_msgs) - Counter(m.key for m in uncommitted)
    return rep


def assert_replayed(s: Settings, spark) -> dict:
    """The proof for any app (onceflow.operations.replay): the app's own plan, replayed over every committed range,
    gives batch by batch what the sink and the DLQ hold, with the job's watermarks. Returns its figures."""
    from onceflow.operations import replay
    from onceflow.rules.reconciliation import Status

    s = harness(s)
    snap = audit.snapshot(s)
    res = replay.check(spark, s, s.declared_app(), snap.entries, snap.entries, audit.quarantined(snap.records))
    assert res.status == Status.PASS, res.summary + "\n" + json.dumps(res.differences[:10], default=str)
    assert res.figures["results"] > 0
    return res.figures


def events(s: Settings, type_: str | None = None) -> list[dict]:
    """Every event on both events topics (the job's own and the shared one), whoever wrote it, merged by time."""
    h = harness(s)
    out = [json.loads(m.value) for t in (s.job_events_topic, s.events_topic) for m in kafka_reading.read_topic(h, t)]
    return sorted((e for e in out if type_ is None or e["type"] == type_), key=lambda e: e["ts_ms"])


def wait_event(s: Settings, type_: str, timeout: float = 120.0, count: int = 1) -> list[dict]:
    return procs.wait_until(
        lambda: (lambda ev: ev if len(ev) >= count else None)(events(s, type_)),
        timeout,
        interval=1.0,
        what=f"{count} {type_} event(s) of {s.app_id}",
    )


def wait_job_exit(s: Settings, timeout: float = 120.0) -> None:
    procs.wait_until(
        lambda: not jobctl.status(s).running and not jobctl.status(s).supervisor_pid,
        timeout,
        what=f"{s.app_id} to exit",
    )


def now_ms() -> int:
    return clock.now_ms()


def copy_topic(s, src: str, dst: str, keep=lambda m: True, change=lambda m: m, extra=()):
    """Copy `src` to a new topic `dst` (same partitions, offsets shift only where records are dropped), record
    by record with timestamps and headers, dropping or changing what the fault needs."""
    s = harness(s)
    admin = kafka_clients.admin(s)
    parts = len(admin.list_topics(src, timeout=10).topics[src].partitions)
    admin.create_topics([NewTopic(dst, num_partitions=parts, replication_factor=1)])[dst].result(30)
    p = kafka_clients.idempotent_producer(s)
    for m in list(kafka_reading.read_topic(s, src)) + list(extra):
        if keep(m):
            m = change(m)
            p.produce(
                dst,
                key=m.key,
                value=m.value,
                partition=m.partition,
                timestamp=m.timestamp_ms,
                headers=list(m.headers.items()),
            )
    assert p.flush(30) == 0


def expire_group(s: Settings, group_id: str) -> None:
    """What Kafka does to a group `offsets.retention.minutes` after its last commit: its offsets are gone. Deleting
    the group stands in for the expiry. (The admin client is held until its future resolves: one dropped at once
    leaves the future unanswered.)"""
    admin = kafka_clients.admin(s)
    admin.delete_consumer_groups([group_id], request_timeout=30)[group_id].result(30)


def delete_records_before(s: Settings, topic: str, offsets: dict[int, int]) -> None:
    """What retention does to a topic's oldest records: the log starts at `offsets` per partition."""
    from confluent_kafka import TopicPartition

    admin = kafka_clients.admin(s)
    futures = admin.delete_records(
        [TopicPartition(topic, p, o) for p, o in sorted(offsets.items())], request_timeout=30
    )
    for f in futures.values():
        f.result(30)


def fed_and_killed(s: Settings, tmp_path: Path, kill_seed: int, kills: int = 2, between=None, **spec) -> list:
    """Start the job, feed it `spec` (the generator's) from a thread, and kill -9 it `kills` times at random moments,
    each once its (restarted) query runs; the records sent, once the feed is done. `between(k)`, if given, is called
    after the k-th kill (1-based) once the job runs again (another fault, e.g. a database restart)."""
    produced: dict = {}
    feeder = threading.Thread(target=lambda: produced.update(sent=produce(s, tmp_path / "m.csv", **spec)), daemon=True)
    jobctl.start(s)
    feeder.start()
    rng = random.Random(kill_seed)
    done, last_kill = 0, 0
    deadline = time.monotonic() + 600
    while done < kills and time.monotonic() < deadline:  # `make chaos` kills at random many times more
        jobctl.wait_running(s, after_ms=last_kill, timeout=180)
        time.sleep(rng.uniform(0.5, 5.0))
        last_kill = now_ms()
        if jobctl.kill(s):
            done += 1
            if between is not None:
                jobctl.wait_running(s, after_ms=last_kill, timeout=180)
                between(done)
    assert done == kills
    feeder.join(timeout=300)
    return produced["sent"]
