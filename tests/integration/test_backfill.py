"""Backfill against the real broker and real Spark: bad parameters refused before any write, a dry run writes
nothing, a run killed (kill -9) inside a chunk's transaction resumes and writes the rest once, a re-run writes
nothing; the result equals a recount from the generator's manifest."""

import json
import subprocess
import sys
import time
from collections import Counter

import pytest

from onceflow import wire
from onceflow.kafka import reading as kafka_reading
from onceflow.operations import audit, backfill
from onceflow.rules.backfill import BackfillError
from onceflow.rules.sources import of_topic
from onceflow.runtime import launcher, procs
from onceflow_apps.access_log import rules as records
from onceflow_dev.generator import KIND_MALFORMED
from tests.support.harness import end_offsets, expire_group, produce, truth

pytestmark = pytest.mark.integration


def expected_windows(s, sent) -> dict[str, int]:
    """Every valid record of the range counts (a batch recount has no watermark)."""
    return dict(
        Counter(
            records.sink_key(records.window_start_us(r.ts_us, s.window_s), r.ip)
            for r in sent
            if r.kind != KIND_MALFORMED
        )
    )


def written(s, topic, isolation="read_committed"):
    return kafka_reading.read_topic(s, topic, isolation=isolation)


def backfill_ledger(s):
    return [e for e in audit.ledger_records(s) if getattr(e, "kind", "") == "backfill"]


def test_backfill_validates_resumes_after_kill9_and_writes_each_window_once(app, spark, tmp_path):
    s = app()
    before_ms = int(time.time() * 1000)
    sent = produce(
        s,
        tmp_path / "m.csv",
        count=12_000,
        event_rate=1000,
        distinct_ips=300,
        malformed_fraction=0.02,
        late_fraction=0.02,
        seed=61,
    )
    ends = of_topic(s.source_topic, end_offsets(sent))  # ip_count reads one source topic
    start = {p: 0 for p in ends}
    spec = lambda **kw: backfill.spec_from(
        s, **({"backfill_id": "bf1", "start": start, "end": ends, "chunk_size": 200} | kw)
    )

    # Refused before anything is written, each with its reason.
    bad = [
        (dict(end={p: 0 for p in ends}, start={p: 10 for p in ends}), "before start"),
        (dict(end={p: e + 5 for p, e in ends.items()}), "beyond the end of the source"),
        (dict(target="no.such.topic"), "unknown target topic"),
        (dict(target=s.sink_topic), "live job's sink topic"),
        (dict(since="2026-11-22T10:00:00Z", until="2026-11-22T09:00:00Z", start=None, end=None), "not after"),
        (dict(chunk_size=0), "chunk size"),
        (dict(backfill_id="no spaces"), "backfill id"),
    ]
    for kw, why in bad:
        with pytest.raises(BackfillError, match=why):
            backfill.validate(s, spec(**kw))
    reg = backfill.registry(s) / "other.json"
    reg.parent.mkdir(parents=True, exist_ok=True)
    import os
    import socket

    reg.write_text(
        json.dumps(
            {
                "id": "other",
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "source": s.source_topic,
                "start": {"0": 100},
                "end": {"0": 200},
            }
        )
    )
    with pytest.raises(BackfillError, match="overlaps backfill other"):
        backfill.validate(s, spec())
    reg.unlink()

    dry = backfill.run(spark, s, spec(dry_run=True))
    want = expected_windows(s, sent)
    assert dry["windows"] == len(want) and dry["would_write_chunks"] == -(-len(want) // 200) == dry["chunks"]
    assert not written(s, s.backfill_topic) and not backfill_ledger(s)
    # a range by time (Kafka record timestamps) resolves to the same offsets, so to the same windows
    by_time = backfill.run(
        spark,
        s,
        spec(
            start=None, end=None, since=str(before_ms - 1000), until=str(int(time.time() * 1000) + 1000), dry_run=True
        ),
    )
    assert by_time["end"] == {str(p): o for p, o in ends.items()} and by_time["windows"] == dry["windows"]

    # kill -9 inside chunk 3's transaction (a real SIGKILL of the backfill's process group)
    env = launcher.submit_env(s) | {"ONCEFLOW_FAULT": "crash_in_chunk@3"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "onceflow.cli",
            "backfill",
            "--id",
            "bf1",
            "--start-offsets",
            json.dumps(start),
            "--end-offsets",
            json.dumps(ends),
            "--chunk-size",
            "200",
        ],
        env=env,
        capture_output=True,
        timeout=300,
        start_new_session=True,
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert [e.batch for e in backfill_ledger(s)] == [0, 1, 2]
    assert len(written(s, s.backfill_topic)) == 3 * 200
    assert len(written(s, s.backfill_topic, "read_uncommitted")) > 3 * 200  # chunk 3 was open when it died

    # and a week passes: Kafka deletes the backfill group's offsets (deleting the group stands in for it); the
    # resume takes its progress from the ledger's chunk records, and writes no committed chunk again (N-2)
    expire_group(s, backfill.group_id(s, "bf1"))
    resumed = backfill.run(spark, s, spec())
    assert resumed["already_committed_chunks"] == 3 and resumed["written_chunks"] == dry["chunks"] - 3
    again = backfill.run(spark, s, spec())
    assert again["written_chunks"] == 0 and again["status"].startswith("complete")

    out = written(s, s.backfill_topic)
    keys = Counter(m.key.decode() for m in out)
    assert not [k for k, n in keys.items() if n > 1], "a window was written twice"
    assert {m.key.decode(): json.loads(m.value)["count"] for m in out} == want
    assert sorted(e.batch for e in backfill_ledger(s)) == list(range(dry["chunks"]))
    assert {e.backfill_id for e in backfill_ledger(s)} == {"bf1"}
    assert all(m.headers[wire.H_BACKFILL] == b"bf1" for m in out)
    # the same id with other parameters is a different backfill: refused, also once the group has expired
    with pytest.raises(BackfillError, match="other parameters"):
        backfill.validate(s, spec(chunk_size=300))
    expire_group(s, backfill.group_id(s, "bf1"))
    with pytest.raises(BackfillError, match="other parameters"):
        backfill.validate(s, spec(chunk_size=300))
    assert not procs.read_pidfile(backfill.registry(s) / "bf1.json")


def test_two_runs_of_one_backfill_never_write_a_chunk_twice(app, spark, tmp_path):
    """The dangerous order: run A validates (reading its progress: nothing committed) and waits before fencing;
    run B of the same id writes every chunk meanwhile. A then fences and must decide from what is committed now,
    not from what it read before: it writes nothing. (Deciding before fencing wrote every chunk twice.)

    A runs as if on another machine (its own var dir): on one machine the registry of running backfills refuses
    B before it starts, so only two hosts (two Airflow workers, say) can race like this."""
    from tests.support.harness import wait_event

    s = app()
    sent = produce(s, tmp_path / "m.csv", count=6000, event_rate=1000, distinct_ips=200, seed=62)
    ends = of_topic(s.source_topic, end_offsets(sent))  # ip_count reads one source topic
    start = {p: 0 for p in ends}
    env = launcher.submit_env(s) | {
        "ONCEFLOW_FAULT": "stall_before_fence@0:40",
        "ONCEFLOW_VAR_DIR": str(tmp_path / "other-host"),
    }
    a = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "onceflow.cli",
            "backfill",
            "--id",
            "twice",
            "--start-offsets",
            json.dumps(start),
            "--end-offsets",
            json.dumps(ends),
            "--chunk-size",
            "100",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_event(s, "fault_injected", timeout=180)  # A has validated and read its progress, and waits
        b = backfill.run(spark, s, backfill.spec_from(s, "twice", start, ends, chunk_size=100))
        out_a, err = a.communicate(timeout=240)
    finally:
        if a.poll() is None:
            a.kill()
    assert b["written_chunks"] == b["chunks"] and b["already_committed_chunks"] == 0
    assert a.returncode == 0, err[-2000:]
    assert '"written_chunks": 0' in out_a or "nothing left to write" in out_a, out_a[-2000:]
    out = written(s, s.backfill_topic)
    assert len(out) == len({m.key for m in out}) == b["windows"], "a chunk was written twice"
    assert {m.key.decode(): json.loads(m.value)["count"] for m in out} == expected_windows(s, sent)
    assert sorted(e.batch for e in backfill_ledger(s)) == list(range(b["chunks"]))


def test_a_time_range_backfill_resumes_after_the_source_grew(app, spark, tmp_path):
    """The range [since, until) reaches past the source's end when the backfill first runs: it resolves to the end
    of the log then, and a resumed run keeps that resolution (and its identity) however much arrives since."""
    s = app()
    since = int(time.time() * 1000) - 1000
    sent = produce(s, tmp_path / "a.csv", count=4000, event_rate=1000, distinct_ips=200, seed=63)
    until = int(time.time() * 1000) + 3_600_000
    argv = [
        sys.executable,
        "-m",
        "onceflow.cli",
        "backfill",
        "--id",
        "by-time",
        "--since",
        str(since),
        "--until",
        str(until),
        "--chunk-size",
        "100",
    ]
    env = launcher.submit_env(s) | {"ONCEFLOW_FAULT": "crash_in_chunk@2"}
    proc = subprocess.run(argv, env=env, capture_output=True, timeout=300, start_new_session=True)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert [e.batch for e in backfill_ledger(s)] == [0, 1]
    produce(
        s, tmp_path / "b.csv", count=2000, event_rate=1000, distinct_ips=200, seed=64, start_ms=1_795_000_100_000
    )  # more records inside [since, until) by their Kafka timestamps
    spec = backfill.spec_from(s, "by-time", since=str(since), until=str(until), chunk_size=100)
    resumed = backfill.run(spark, s, spec)
    ends = of_topic(s.source_topic, end_offsets(sent))
    assert resumed["already_committed_chunks"] == 2 and resumed["end"] == {str(p): o for p, o in ends.items()}, resumed
    out = written(s, s.backfill_topic)
    assert len(out) == len({m.key for m in out})
    assert {m.key.decode(): json.loads(m.value)["count"] for m in out} == expected_windows(s, sent)


def test_a_backfill_of_an_app_of_two_source_topics_reads_both_and_resumes_after_kill9(app, spark, tmp_path):
    """ip_networks reads its source and its named source `mirror`: a backfill's range is on both (positions keyed
    `topic:partition`), its chunks' group offsets and ledger records cover both, and a run killed (kill -9) inside a
    chunk resumes from them and writes every result once: each good record of either topic tagged with its network,
    on the output its network goes to (by the generator's manifest and the table, in plain Python)."""
    from onceflow_apps import ip_networks

    s = app(app="ip_networks")
    assert len(s.source_topic_list) == 2
    sent = produce(
        s, tmp_path / "n.csv", count=3000, event_rate=1000, distinct_ips=200, malformed_fraction=0.02, seed=65
    )
    ends = end_offsets(sent)
    assert {sp.topic for sp in ends} == set(s.source_topic_list)
    start = {f"{sp.topic}:{sp.partition}": 0 for sp in ends}
    end = {f"{sp.topic}:{sp.partition}": o for sp, o in ends.items()}
    with pytest.raises(BackfillError, match="name each position's topic"):  # which topic's partition 0?
        backfill.spec_from(s, "two", {"0": 0}, {"0": 10})

    argv = [sys.executable, "-m", "onceflow.cli", "backfill", "--id", "two", "--chunk-size", "400"]
    argv += ["--start-offsets", json.dumps(start), "--end-offsets", json.dumps(end)]
    env = launcher.submit_env(s) | {"ONCEFLOW_FAULT": "crash_in_chunk@2"}
    proc = subprocess.run(argv, env=env, capture_output=True, timeout=300, start_new_session=True)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert [e.batch for e in backfill_ledger(s)] == [0, 1]
    assert all(set(e.ranges) == set(ends) for e in backfill_ledger(s))  # each chunk's record: both topics' range
    resumed = backfill.run(spark, s, backfill.spec_from(s, "two", start, end, chunk_size=400))
    assert (
        resumed["already_committed_chunks"] == 2
        and resumed["end"] == end
        and resumed["source"] == ",".join(sorted(s.source_topic_list))
    )

    good = [r for r in truth(sent) if r.reason is None]
    out = written(s, s.backfill_topic)
    got = Counter((m.key.decode(), json.loads(m.value)["source"]) for m in out)
    assert got == Counter((r.ip, f"{r.partition.topic}|{r.partition.partition}|{r.offset}") for r in good)
    assert {json.loads(m.value)["source"].split("|")[0] for m in out} == set(s.source_topic_list)
    for m in out:
        v = json.loads(m.value)
        assert v["network"] == ip_networks.network_of(v["ip"])
        assert m.headers.get(wire.H_OUTPUT) == (
            o.encode() if (o := ip_networks.output_of(v["network"])) is not None else None
        )
    assert sorted(e.batch for e in backfill_ledger(s)) == list(range(resumed["chunks"]))
    # a time range resolves on both topics, to the same offsets
    by_time = backfill.run(
        spark, s, backfill.spec_from(s, "two-t", since="0", until=str(int(time.time() * 1000) + 60_000), dry_run=True)
    )
    assert by_time["end"] == end and by_time["windows"] == len(good)
