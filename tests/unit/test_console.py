"""The operator console without Airflow running or a broker: what each section computes from plain records, the
endpoints (auth overridden, readers faked), anonymous callers refused, and the last known state when Kafka is
down."""

import json
import time

import pytest
from fastapi.testclient import TestClient

from onceflow import config, wire
from onceflow.control.console import app as console
from onceflow.control.console import readers, views
from onceflow.rules.ledger import LedgerEntry

S = config.load(env={}, app_id="ip_count", transaction_timeout_ms=60_000)


def entry(batch, commit_ms, txn_ms=10.0, kind=wire.LEDGER_STREAM, backfill_id=None, outputs=5):
    return LedgerEntry(
        "ip_count",
        batch,
        "src",
        {0: (batch * 100, batch * 100 + 100), 1: (0, 0)},
        5_000,
        6_000,
        outputs,
        1,
        txn_ms,
        commit_ms,
        "onceflow.ip_count",
        kind=kind,
        backfill_id=backfill_id,
    )


def test_now_shows_the_job_lag_watermark_and_the_open_transaction():
    status = {
        "state": "running",
        "running": True,
        "desired_state": "running",
        "job_pid": 7,
        "last_batch": 41,
        "last_commit_ms": 95_000,
        "watermark_ms": 40_000,
        "running_batch": 42,
        "batch_started_ms": 99_000,
        "progress": {"input_rows_per_s": 120.5, "duration_ms": {"triggerExecution": 800}},
        "restarts": 2,
    }
    health = {
        "status": "degraded",
        "ts_ms": 98_000,
        "restarts": [1, 2, 3],
        "partitions": {"1": {"lag": 7, "status": "WARN", "trend": "growing"}, "0": {"lag": 3, "status": "OK"}},
    }
    txns = [{"app": "ip_count", "first_ts_ms": 90_000, "backfill": None}, {"app": "other", "first_ts_ms": 1}]
    v = views.now_view(S, status, health, txns, now_ms=100_000)
    assert (v["last_batch"], v["last_commit_age_s"], v["watermark_lag_s"]) == (41, 5.0, 60.0)
    assert [p["partition"] for p in v["partitions"]] == [0, 1] and v["total_lag"] == 10
    assert v["open_transaction_age_s"] == 10.0 and v["transaction_timeout_s"] == 60
    assert v["running_batch_s"] == 1.0 and v["health_restarts"] == 3 and v["batch_duration_ms"] == 800
    # no open transaction on the broker: the batch in progress stands for it
    assert views.now_view(S, status, health, [], 100_000)["open_transaction_age_s"] == 1.0


def test_batches_page_filters_and_charts():
    entries = [entry(b, 1_000 * b, txn_ms=b) for b in range(1, 6)]
    late = views.late_by_batch(
        [
            {"ledger_batch": 3, "decision": "write", "rows_dropped_by_watermark": 4},
            {"ledger_batch": 4, "decision": "catch_up", "rows_dropped_by_watermark": 9},
        ]
    )
    assert late == {3: 4}
    rows = views.batch_rows(entries, late)
    assert [r["batch"] for r in rows] == [5, 4, 3, 2, 1] and rows[2]["late"] == 4 and rows[0]["records"] == 100
    assert rows[0]["ranges"] == {"0": [500, 600], "1": [0, 0]}
    assert [r["batch"] for r in views.filter_rows(rows, batch_from=2, batch_to=4)] == [4, 3, 2]
    assert [r["batch"] for r in views.filter_rows(rows, min_txn_ms=4)] == [5, 4]
    assert [r["batch"] for r in views.filter_rows(rows, with_late=True)] == [3]
    s = views.series(entries, [{"ts_ms": 2, "total_lag": 9}, {"ts_ms": 1, "total_lag": 3}])
    assert s["lag"] == [[1, 3], [2, 9]] and s["throughput"][0] == [2_000, 100.0] and len(s["txn_ms"]) == 5


def test_transactions_name_the_command_that_resolves_them():
    evs = [
        {"type": wire.TRANSACTION_TIMEOUT, "batch": 9, "ts_ms": 5, "elapsed_ms": 61_000, "timeout_ms": 60_000},
        {"type": wire.BATCH_COMMITTED, "batch": 10, "ts_ms": 6},
    ]
    txns = [
        {
            "topic": "ip_count_sink",
            "partition": 2,
            "lso": 40,
            "high_watermark": 45,
            "first_ts_ms": 1_000,
            "app": None,
            "batch": None,
            "backfill": None,
        },
        {
            "topic": "ip_count_ledger",
            "partition": 0,
            "lso": 7,
            "high_watermark": 8,
            "first_ts_ms": 190_000,
            "app": "ip_count",
            "batch": "11",
            "backfill": "bf1",
        },
    ]
    out = views.transaction_incidents(S, evs, txns, now_ms=200_000)
    kinds = [i["kind"] for i in out]
    assert kinds == ["open_transaction", "hanging_transaction", wire.TRANSACTION_TIMEOUT]
    hanging = out[1]
    assert (
        "kafka-transactions.sh --bootstrap-server 127.0.0.1:9092 abort --topic ip_count_sink --partition 2 "
        "--start-offset 40"
        in hanging["resolve"]
        and hanging["age_s"] == 199.0
    )
    assert "replays the batch" in out[2]["resolve"]


def test_alerts_open_and_history():
    hist = [
        {"key": "a", "status": "firing", "ts_ms": 1},
        {"key": "b", "status": "firing", "ts_ms": 2},
        {"key": "a", "status": "resolved", "ts_ms": 3},
        {"key": "c", "status": "firing", "ts_ms": 4, "one_off": True},
    ]
    v = views.alert_view(hist)
    assert [a["key"] for a in v["open"]] == ["b"] and [a["ts_ms"] for a in v["history"]] == [4, 3, 2, 1]


def test_backfills_by_id_with_the_running_one_first():
    entries = [
        entry(0, 10, kind=wire.LEDGER_BACKFILL, backfill_id="x"),
        entry(1, 20, kind=wire.LEDGER_BACKFILL, backfill_id="x"),
        entry(5, 30),
    ]
    evs = [
        {"type": wire.BACKFILL_STARTED, "id": "x", "chunks": 3},
        {"type": wire.BACKFILL_STARTED, "id": "y", "chunks": 8},
    ]
    v = views.backfill_view(entries, [{"id": "y", "pid": 4, "host": "h", "started_ms": 40}], evs)
    assert [b["id"] for b in v] == ["y", "x"] and v[1]["chunks"] == 2 and v[1]["records"] == 10
    assert (v[1]["total_chunks"], v[1]["complete"]) == (3, False) and (v[0]["total_chunks"], v[0]["chunks"]) == (8, 0)
    done = views.backfill_view(entries, [], evs + [{"type": wire.BACKFILL_DONE, "id": "x"}])
    assert done[0]["complete"]


@pytest.fixture
def client(monkeypatch, tmp_path):
    s = S.replace(var_dir=tmp_path)
    monkeypatch.setattr(console, "settings", lambda: s)
    app = console.create_app()
    app.dependency_overrides[console.authorized] = lambda: None
    monkeypatch.setattr(readers, "broker_answers", lambda settings, timeout_s=1.5: True)
    return TestClient(app), s


def test_every_section_answers_and_the_pages_render(client, monkeypatch):
    c, s = client
    fake = {
        "read_now": {"last_batch": 3},
        "read_charts": {"lag": []},
        "read_transactions": {"incidents": []},
        "read_alerts": {"open": [], "history": []},
        "read_savepoints": {"savepoints": []},
        "read_proofs": {"chain": {}, "runs": []},
        "read_backfills": {"backfills": []},
    }
    for name, value in fake.items():
        monkeypatch.setattr(readers, name, lambda settings, value=value: value)
    monkeypatch.setattr(
        readers, "read_batches", lambda settings, size, before, filters: {"rows": [], "size": size, "filters": filters}
    )
    for path in ("now", "charts", "transactions", "alerts", "savepoints", "proofs", "backfills"):
        body = c.get(f"/api/{path}").json()
        assert body["ok"] and not body["stale"] and body["data"] == fake[f"read_{path}"], path
    b = c.get("/api/batches?size=20&batch_from=3&with_dlq=true").json()
    assert b["data"]["size"] == 20 and b["data"]["filters"]["batch_from"] == 3 and b["data"]["filters"]["with_dlq"]
    assert c.get("/api/batches?size=100000").status_code == 422  # pages are bounded
    for section in console.SECTIONS:
        page = c.get(f"/{section}")
        assert page.status_code == 200 and "onceflow · ip_count" in page.text and "const SECTION" in page.text
    assert c.get("/nothing").status_code == 404
    r = c.get("/dag/ip_count_checkpoint_rotation", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"].endswith("/savepoints")


def test_when_kafka_is_down_the_console_says_so_and_shows_the_last_known_state(client, monkeypatch):
    c, s = client
    monkeypatch.setattr(readers, "read_now", lambda settings: {"last_batch": 12})
    assert c.get("/api/now").json()["data"] == {"last_batch": 12}
    monkeypatch.setattr(readers, "broker_answers", lambda settings, timeout_s=1.5: False)
    down = c.get("/api/now").json()
    assert not down["ok"] and down["stale"] and down["data"] == {"last_batch": 12}
    assert "does not answer" in down["error"] and down["as_of_ms"] <= int(time.time() * 1000)
    # the last known state survives a restart of the API server (a file under var/run)
    assert json.loads(readers._cache_file(s).read_text())["now"]["value"] == {"last_batch": 12}
    fresh = console.create_app()
    fresh.dependency_overrides[console.authorized] = lambda: None
    assert TestClient(fresh).get("/api/now").json()["data"] == {"last_batch": 12}
    # a section never read before: the error, and no data
    never = c.get("/api/alerts").json()
    assert not never["ok"] and not never["stale"] and never["data"] is None


def test_data_docs_are_served_and_nothing_outside_them(client):
    c, s = client
    root = readers.data_docs_root(s)
    root.mkdir(parents=True)
    (root / "index.html").write_text("<h1>GX</h1>")
    (root.parent / "secret.txt").write_text("no")
    assert c.get("/data-docs/index.html").text == "<h1>GX</h1>"
    assert c.get("/data-docs/../secret.txt").status_code == 404
    assert c.get("/data-docs/%2e%2e/secret.txt").status_code == 404


def test_anonymous_callers_are_refused_everywhere(monkeypatch, tmp_path):
    monkeypatch.setattr(console, "settings", lambda: S.replace(var_dir=tmp_path))
    c = TestClient(console.create_app())  # Airflow's own access dependency, not overridden
    for path in [
        "/",
        "/now",
        "/batches",
        "/api/now",
        "/api/batches",
        "/api/savepoints",
        "/data-docs/index.html",
        "/icon.svg",
        "/dag/ip_count_deploy",
    ]:
        assert c.get(path).status_code in (401, 403), path
