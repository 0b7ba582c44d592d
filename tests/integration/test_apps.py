"""A team's own app, the way docs/apps.md tells it: `onceflow app new`, registered, its job started on the broker,
records in, results out exactly once, proven by the replay. Nothing of the new app is written by the test."""

import json
import time

import pytest

from onceflow import cli
from onceflow.kafka import clients as kafka_clients
from onceflow.kafka import reading as kafka_reading
from onceflow.operations import audit
from onceflow.rules.sources import on_topic
from onceflow.runtime import jobctl, procs
from tests.support.harness import assert_replayed, harness

pytestmark = pytest.mark.integration


def test_a_new_apps_scaffold_runs_exactly_once_on_the_broker(app, spark, tmp_path, monkeypatch):
    assert cli.main(["app", "new", "team_clicks", "--dir", str(tmp_path), "--json"]) == 0
    root = tmp_path / "team_clicks"
    # as `pip install -e .` would: importable here and in the job's processes, registered by name
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("PYTHONPATH", str(root))
    s = app(app="team_clicks", app_registry="team_clicks=team_clicks.app:app", window_s=10, watermark_s=5)
    assert s.declared_app().name == "team_clicks"
    h = harness(s)
    producer = kafka_clients.idempotent_producer(h)

    def wave(n: int) -> None:
        for i in range(n):
            key = None if i % 25 == 24 else f"user{i % 7}".encode()  # every 25th without a key: its DLQ
            producer.produce(s.source_topic, key=key, value=f"click {i}".encode(), partition=i % 2)
        assert producer.flush(30) == 0

    jobctl.start(s)
    wave(100)  # the source stamps records on append (LogAppendTime): the second wave closes the first's windows
    procs.wait_until(lambda: audit.ledger_entries(s), 180, what="the first committed batch")
    time.sleep(16)  # past the 10 s window and the 5 s watermark, in the records' own (append) time
    wave(100)
    ends = on_topic(s.source_topic, {p: hi for p, (_, hi) in kafka_reading.watermarks(h, s.source_topic).items()})
    procs.wait_until(
        lambda: audit.committed_offsets(s, ends) == ends and kafka_reading.read_topic(h, s.sink_topic),
        180,
        what="both waves committed and the first wave's windows emitted",
    )
    assert jobctl.stop(s)

    results = [json.loads(m.value) for m in kafka_reading.read_topic(h, s.sink_topic)]
    assert {r["key"] for r in results} <= {f"user{i}" for i in range(7)} and sum(r["count"] for r in results) >= 96
    dlq = kafka_reading.read_topic(h, s.dlq_topic)
    assert len(dlq) == 8 and {m.headers["onceflow.reason"] for m in dlq} == {b"no_key"}
    figures = assert_replayed(s, spark)  # the platform's proof, with nothing written for this app
    assert figures["results"] == len(results) and figures["dlq"] == 8
