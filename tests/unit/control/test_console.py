"""The operator console without Airflow running or a broker: what each section computes from plain records, the
endpoints (auth overridden, readers faked), anonymous callers refused, and the last known state when Kafka is
down."""

import json
import time
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from onceflow import config, wire
from onceflow.control.console import app as console
from onceflow.control.console import readers, views
from onceflow.rules.ledger import LedgerEntry
from onceflow.rules.sources import on_topic

S = config.load(env={}, app_id="ip_count", transaction_timeout_ms=60_000)


def entry(batch, commit_ms, txn_ms=10.0, kind=wire.LEDGER_STREAM, backfill_id=None, outputs=5):
    return LedgerEntry(
        "ip_count",
        batch,
        on_topic("src", {0: (batch * 100, batch * 100 + 100), 1: (0, 0)}),
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
    monkeypatch.setattr(console, "settings", lambda app_id=None: s)
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
        assert 'class="apps"' not in page.text  # one instance: no app selector
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
    monkeypatch.setattr(console, "settings", lambda app_id=None: S.replace(var_dir=tmp_path))
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
        "/app/ip_count/now",
        "/app/ip_count/api/now",
        "/app/no_such_app/api/now",  # refused before anything is said about which instances exist
    ]:
        assert c.get(path).status_code in (401, 403), path


def test_each_app_instance_has_its_pages_its_data_and_its_own_access_check(monkeypatch, tmp_path):
    """Two instances on one control plane (ONCEFLOW_APPS): the environment's own at the root, each under
    /app/<app_id>/ with an app selector; each read with its own settings; each page checked against its own deploy
    DAG; a DAG's tab opens its own instance's page."""
    from airflow.api_fastapi.core_api import security

    own = S.replace(var_dir=tmp_path)
    nets = own.replace(app_id="nets", app="ip_networks")
    monkeypatch.setattr(console, "instances", lambda: {"ip_count": "ip_count", "nets": "ip_networks"})
    monkeypatch.setattr(console, "settings", lambda app_id=None: nets if app_id == "nets" else own)
    monkeypatch.setattr(readers, "broker_answers", lambda settings, timeout_s=1.5: True)
    monkeypatch.setattr(readers, "read_now", lambda settings: {"app": settings.app_id})
    checked: list[str] = []

    def access(method, access_entity=None, param_dag_id=None):  # stands for Airflow's: who may read which DAG
        def inner(request, user):
            checked.append(param_dag_id)
            if param_dag_id == "nets_deploy" and user != "nets-reader":
                raise console.HTTPException(403, "no access to nets_deploy")

        return inner

    monkeypatch.setattr(console, "requires_access_dag", access)
    app = console.create_app()
    user = {"name": "ip-count-reader"}
    app.dependency_overrides[security.get_user] = lambda: user["name"]
    c = TestClient(app)
    assert c.get("/api/now").json()["data"] == {"app": "ip_count"} and checked[-1] == "ip_count_deploy"
    assert c.get("/app/nets/api/now").status_code == 403 and checked[-1] == "nets_deploy"
    user["name"] = "nets-reader"
    assert c.get("/app/nets/api/now").json()["data"] == {"app": "nets"}
    assert c.get("/app/elsewhere/api/now").status_code == 404
    page = c.get("/app/nets/batches")
    assert page.status_code == 200 and "onceflow · nets" in page.text and 'const APP = "nets"' in page.text
    assert 'const BASE = "/app/nets"' in page.text  # its endpoints and the DAGs it triggers are its own
    assert '<a href="/batches" class="" data-app="ip_count"' in page.text  # the selector: the same page elsewhere
    assert '<a href="/app/nets/batches" class="on" data-app="nets"' in page.text
    r = c.get("/dag/nets_checkpoint_rotation", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "/app/nets/savepoints"
    r = c.get("/dag/ip_count_reconciliation", follow_redirects=False)
    assert r.headers["location"] == "/proofs"


# ---------------------------------------------------------------------------- hostile records (docs/security.md)

HOSTILE = '<img src=x onerror="alert(1)">'
# ${...} holes of the page's script that neither start with an escaping or markup helper nor sit inside an esc(...)
# argument, each reviewed: how often it occurs, and why it is safe there. A new occurrence fails the test (a hole
# named like a reviewed one, e.g. `${what}`, may be unsafe somewhere else), so each one is looked at.
REVIEWED_HOLES = {
    "...": (1, "a comment"),
    "path": (1, "an Error message: shown with textContent"),
    "r.status": (1, "an Error message (textContent); fetch's status is a number"),
    "body.error": (1, "the banner: textContent"),
    "what": (2, "the flash line's textContent, and the run's note (JSON)"),
    "dagId": (2, "the flash line's textContent; the REST path (this script's literal DAG ids)"),
    "v": (1, "card(k, html): the callers build html with esc()"),
    "((p[0]-x0)/(x1-x0||1)*300).toFixed(1)": (1, "a number, inside pts (escaped)"),
    "(120-(p[1]/y1)*110).toFixed(1)": (1, "a number, inside pts (escaped)"),
    "good.includes(v)?'ok':bad.includes(v)?'bad':'warn'": (1, "a class name literal"),
    "r[0]": (1, "rng(): its callers escape what it returns"),
    "r[1]": (1, "rng(): its callers escape what it returns"),
    "x.dataset.verify": (1, "text for trigger() (escaped there)"),
    "x.dataset.restore": (3, "text for window.confirm and trigger() (escaped there)"),
    "conf.backfill_id": (1, "text for trigger() (escaped there)"),
}
HELPERS = ("esc(", "fmtMs(", "pill(", "card(", "chart(", "encodeURIComponent(")


def _skip_string(s: str, i: int) -> int:
    """i at a string literal's opening quote: the index after its closing one."""
    q, i = s[i], i + 1
    while s[i] != q:
        i += 2 if s[i] == "\\" else 1
    return i + 1


def _skip_template(s: str, i: int) -> int:
    """i at a template literal's opening backtick: the index after its closing one."""
    i += 1
    while s[i] != "`":
        if s[i] == "\\":
            i += 2
        elif s.startswith("${", i):
            i = _close(s, i + 2, "{", "}")
        else:
            i += 1
    return i + 1


def _close(s: str, i: int, opening: str, closing: str) -> int:
    """i just after an opening bracket: the index after the bracket that closes it (strings and template literals,
    with the brackets inside them, skipped)."""
    depth = 1
    while True:
        c = s[i]
        if c in "'\"":
            i = _skip_string(s, i)
        elif c == "`":
            i = _skip_template(s, i)
        else:
            depth += (c == opening) - (c == closing)
            i += 1
            if depth == 0:
                return i


def _holes(script: str) -> list[tuple[int, str]]:
    """Every ${...} hole of `script` (nested ones too): where it starts, and its expression."""
    out, i = [], 0
    while (i := script.find("${", i)) >= 0:
        out.append((i, script[i + 2 : _close(script, i + 2, "{", "}") - 1]))
        i += 2
    return out


def _inside_esc(script: str) -> list[tuple[int, int]]:
    """The spans of `script` that are arguments of esc(...): whatever a hole there yields is escaped with them."""
    import re

    return [(m.end(), _close(script, m.end(), "(", ")")) for m in re.finditer(r"(?<![\w.])esc\(", script)]


def _unreviewed(script: str) -> list[str]:
    """The holes of `script` that put a value into markup unescaped, as far as a reading of the source can tell."""
    from collections import Counter

    escaped = _inside_esc(script)
    seen = Counter(
        h
        for i, h in _holes(script)
        if not any(a <= i < b for a, b in escaped) and not h.startswith(HELPERS) and not _structural(h)
    )
    return [f"{h} ({n}x)" for h, n in seen.items() if n > REVIEWED_HOLES.get(h, (0, ""))[0]]


def _skeleton(expr: str) -> str:
    """`expr` with each template literal replaced by T and each string literal by S (their insides skipped)."""

    def string_end(i: int) -> int:  # i at the opening quote
        return expr.index(expr[i], i + 1)

    def template_end(i: int) -> int:  # i at the opening backtick
        j = i + 1
        while expr[j] != "`":
            j = hole_end(j + 2) + 1 if expr.startswith("${", j) else j + 1
        return j

    def hole_end(j: int) -> int:  # j just after "${": the index of its closing brace
        depth = 1
        while True:
            c = expr[j]
            if c == "`":
                j = template_end(j) + 1
                continue
            if c in "'\"":
                j = string_end(j) + 1
                continue
            depth += {"{": 1, "}": -1}.get(c, 0)
            if depth == 0:
                return j
            j += 1

    out, i = [], 0
    while i < len(expr):
        c = expr[i]
        if c in "'\"":
            out.append("S")
            i = string_end(i) + 1
        elif c == "`":
            out.append("T")
            i = template_end(i) + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _structural(hole: str) -> bool:
    """A conditional or a map whose results are template literals or string literals (their own holes are checked
    in turn), not values."""
    import re

    rest = re.sub(r"\b(esc|pill|fmtMs)\([^()]*(\([^()]*\))*[^()]*\)", "S", _skeleton(hole)).strip()
    branch = r"(?:[TS]|\(\s*[^?()]+\?\s*[TS]\s*:\s*[TS]\s*\))"
    ternary = rf"[^?]+\?\s*{branch}\s*:\s*{branch}"
    mapped = r"[\w.()\[\]|{}\s,]+\.map\(\s*\(?[\w,\s\[\]]+\)?\s*=>\s*T\s*\)\.join\(S\)(\s*\|\|\s*S)?"
    return bool(re.fullmatch(ternary, rest) or re.fullmatch(mapped, rest))


def test_every_value_the_page_puts_into_markup_is_escaped():
    from onceflow.control.console import page

    unescaped = _unreviewed(page.SCRIPT)
    assert not unescaped, f"${{...}} holes without esc(): {unescaped}"
    # and the checker itself sees an unescaped value: a new hole, one more of a reviewed name, one in a branch
    assert not _structural("x.ok ? x.value : ''") and _structural("x.ok ? `<b>${esc(x.v)}</b>` : ''")
    for bad in (
        "el.innerHTML = `<td>${r.epoch}</td>`;",
        "el.innerHTML = `<td>${what}</td>`;",
        "el.innerHTML = `${card('k', `<b>${r.outputs}</b>`)}`;",
        "el.innerHTML = `${r.ok ? r.dlq : ''}`;",
        "el.innerHTML = `${rows.map(r => `<td>${r.txn_ms}</td>`).join('')}`;",
    ):
        assert _unreviewed(page.SCRIPT + bad), bad
    # while a value escaped as part of a larger one is not reported
    assert not _unreviewed(page.SCRIPT + "el.innerHTML = `${esc(`${r.a}:${r.b}`)}`;")


def test_ledger_records_with_a_hostile_value_in_any_field_are_refused():
    from onceflow.rules.ledger import MalformedRecord, parse_record

    good = json.loads(entry(3, 1_000).to_json())
    parse_record(json.dumps(good))
    from dataclasses import fields

    text = {f.name for f in fields(LedgerEntry) if "str" in str(f.type)}  # a hostile string is a string there
    for field in good:
        if field == "kind":
            continue
        for bad in ([HOSTILE], {"x": HOSTILE}, *([] if field in text else [HOSTILE])):
            with pytest.raises(MalformedRecord, match=field):
                parse_record(json.dumps(good | {field: bad}))
    with pytest.raises(MalformedRecord):
        parse_record(json.dumps(good | {"ranges": {"0": [HOSTILE, 1]}}))
    with pytest.raises(MalformedRecord):
        parse_record("[1, 2]")


def test_event_health_alert_and_proof_fields_are_typed_before_they_reach_the_page():
    ev = {
        "type": wire.TRANSACTION_TIMEOUT,
        "app": "ip_count",
        "ts_ms": HOSTILE,
        "batch": HOSTILE,
        "pid": HOSTILE,
        "elapsed_ms": HOSTILE,
        "timeout_ms": [HOSTILE],
        "host": {"x": HOSTILE},
    }
    (inc,) = views.transaction_incidents(S, [ev], [], now_ms=1)
    assert (inc["ts_ms"], inc["batch"], inc["pid"], inc["elapsed_ms"], inc["timeout_ms"]) == (None,) * 5
    assert isinstance(inc["host"], str)
    now = views.now_view(
        S,
        {},
        {"status": HOSTILE, "ts_ms": HOSTILE, "partitions": {"0": {"lag": HOSTILE}, HOSTILE: {}}, "problems": HOSTILE},
        [],
        now_ms=1,
    )
    assert now["partitions"] == [{"partition": 0, "lag": None, "status": None, "trend": None}]
    assert now["health_ts_ms"] is None and now["health_problems"] == []
    assert views.late_by_batch([{"ledger_batch": HOSTILE}, {"ledger_batch": 2, "rows_dropped_by_watermark": "x"}]) == {
        2: 0
    }
    alerts = views.alert_view([{"key": "k", "ts_ms": HOSTILE}, {"key": "k", "ts_ms": 5, "status": 1, "summary": 2}])
    assert [a["ts_ms"] for a in alerts["history"]] == [5] and alerts["history"][0]["summary"] == "2"
    (run,) = views.reconciliation_runs(
        [{"first_batch": HOSTILE, "last_batch": 3, "finished_ms": HOSTILE, "ok": "yes", "checks": [HOSTILE]}]
    )
    assert run["batches"] == [None, 3] and run["ok"] is False and run["checks"] == []


def test_a_malformed_ledger_record_is_left_out_of_the_page_not_the_page_out():
    from onceflow.kafka.reading import Msg

    bad = json.loads(entry(1, 1).to_json()) | {"epoch": HOSTILE}
    msgs = [Msg(0, 0, b"ip_count", json.dumps(bad).encode(), {}), Msg(0, 1, b"ip_count", entry(2, 2).to_json(), {})]
    assert [e.batch for e in map(readers._entry, msgs) if e is not None] == [2]


def test_pages_carry_a_content_security_policy_with_a_fresh_script_nonce(client):
    import re

    c, s = client
    seen = set()
    for section in ("now", "now", "batches"):
        r = c.get(f"/{section}")
        csp = r.headers["content-security-policy"]
        (nonce,) = set(re.findall(r"'nonce-([^']+)'", csp))
        assert "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]
        assert "object-src 'none'" in csp and "base-uri 'none'" in csp and "frame-ancestors 'self'" in csp
        scripts = re.findall(r"<script([^>]*)>", r.text)
        assert scripts and all(f'nonce="{nonce}"' in a for a in scripts)
        assert r.headers["x-content-type-options"] == "nosniff"
        seen.add(nonce)
    assert len(seen) == 3
    api = c.get("/api/savepoints")
    assert api.headers["x-content-type-options"] == "nosniff"
    assert "default-src 'none'" in api.headers["content-security-policy"]


def test_a_value_cannot_close_the_pages_script_element():
    from onceflow.control.console import page

    html = page.render("now", "/x</script><script>alert(1)</script>", "ip_count", "n")
    assert html.count("</script>") == 2 and "alert(1)</script>" not in html


def test_data_docs_run_sandboxed_in_an_opaque_origin(client):
    c, s = client
    root = readers.data_docs_root(s)
    root.mkdir(parents=True)
    (root / "index.html").write_text("<h1>GX</h1>")
    r = c.get("/data-docs/index.html")
    assert r.status_code == 200
    policy = [p.strip() for p in r.headers["content-security-policy"].split(";")]
    sandbox = next(p for p in policy if p.startswith("sandbox"))
    assert "allow-scripts" in sandbox and "allow-same-origin" not in sandbox


def test_the_cache_is_bounded_and_written_at_a_throttled_rate(tmp_path, monkeypatch):
    s = S.replace(var_dir=tmp_path)
    cache = readers.Cache(s, max_entries=3, persist_s=60)
    writes = []
    monkeypatch.setattr(cache, "_write", lambda: writes.append(len(cache.data)))
    for i in range(10):
        cache.put(f"batches:{i}", i)
    assert list(cache.data) == ["batches:7", "batches:8", "batches:9"] and len(writes) == 1
    cache.get("batches:7")  # used: kept over the older ones
    cache.put("now", 1)
    assert list(cache.data) == ["batches:9", "batches:7", "now"]
    # a cache file from before the bound (thousands of keys) loads bounded
    readers._cache_file(s).parent.mkdir(parents=True, exist_ok=True)
    readers._cache_file(s).write_text(json.dumps({f"k{i}": {"ts_ms": 1, "value": i} for i in range(1000)}))
    assert len(readers.Cache(s, max_entries=5).data) == 5


def test_events_are_typed_when_read_so_no_reader_computes_with_markup():
    from onceflow.control import txnwatch
    from onceflow.kafka import events as ev

    forged = {"type": wire.TRANSACTION_TIMEOUT, "app": "ip_count", "ts_ms": 5, "batch": HOSTILE, "host": [HOSTILE]}
    forged |= {"elapsed_ms": HOSTILE, "fraction": "1", "pid": True}
    assert ev._typed(forged)
    assert not {"batch", "elapsed_ms", "fraction", "pid"} & set(forged) and isinstance(forged["host"], str)
    assert not ev._typed({"type": wire.TRANSACTION_TIMEOUT, "ts_ms": HOSTILE})
    # the transaction watch reads it without failing (before: int('<img ...>') stopped every run of the DAG)
    committed = {"type": wire.BATCH_COMMITTED, "app": "ip_count", "batch": 7, "ts_ms": 9}
    assert txnwatch.replayed(forged, [committed]) and txnwatch.event_conditions([forged])


def test_nan_and_infinity_in_a_ledger_number_are_refused():
    from onceflow.rules.ledger import MalformedRecord, parse_record

    good = json.loads(entry(3, 1_000).to_json())
    for field in ("txn_ms", "outputs", "epoch", "watermark_ms"):
        for bad in (float("nan"), float("inf"), float("-inf")):
            with pytest.raises(MalformedRecord, match=field):
                parse_record(json.dumps(good | {field: bad}))  # Python writes NaN / Infinity, and reads them


class FakeKafka:
    """Topics as lists of records, read the way onceflow.kafka.reading.read_tail reads them (the newest `want` that
    `keep` keeps): the console's readers, the ledger's parsing and the events' reader all run for real."""

    def __init__(self):
        self.topics: dict[str, list] = {}

    def write(self, topic, value, key=b"ip_count"):
        from onceflow.kafka.reading import Msg

        msgs = self.topics.setdefault(topic, [])
        value = value if isinstance(value, bytes) else json.dumps(value).encode()
        msgs.append(Msg(0, len(msgs), key, value, {}))

    def read_tail(self, settings, topic, keep=lambda m: True, want=100, max_scan=20_000, step=2_000, before=None):
        kept = [m for m in self.topics.get(topic, []) if (before is None or m.offset < before) and keep(m)]
        return kept[-want:], None


@pytest.fixture
def kafka(monkeypatch):
    from onceflow.control import txnwatch
    from onceflow.kafka import reading

    k = FakeKafka()
    monkeypatch.setattr(reading, "read_tail", k.read_tail)
    monkeypatch.setattr(txnwatch, "open_transactions", lambda settings, topics: [])
    return k


def _strict(text):
    """JSON as a browser reads it: NaN and Infinity are not JSON."""

    def refuse(c):
        raise AssertionError(f"{c} in an answer")

    return json.loads(text, parse_constant=refuse)


def test_hostile_ledger_and_event_records_through_the_endpoints(client, kafka):
    c, s = client
    good = json.loads(entry(2, 2_000).to_json())
    kafka.write(s.ledger_topic, good)
    for field, bad in [
        ("epoch", HOSTILE),
        ("outputs", {"<script>": 1}),
        ("dlq", [HOSTILE]),
        ("txn_ms", "1;alert(1)"),
        ("txn_ms", float("nan")),
        ("batch", HOSTILE),
        ("commit_time_ms", True),
        ("ranges", {"0": [HOSTILE, 1]}),
        ("ranges", {HOSTILE: [0, 1]}),
    ]:
        kafka.write(s.ledger_topic, good | {field: bad, "batch": 3} | ({"batch": bad} if field == "batch" else {}))
    kafka.write(s.ledger_topic, b"<script>alert(1)</script>")  # not JSON at all
    kafka.write(s.ledger_topic, good | {"batch": 4})
    progress = {"type": wire.PROGRESS, "app": "ip_count", "decision": "write", "ts_ms": 1}
    kafka.write(s.job_events_topic, progress | {"ledger_batch": 4, "rows_dropped_by_watermark": HOSTILE})
    kafka.write(s.job_events_topic, progress | {"ledger_batch": HOSTILE, "rows_dropped_by_watermark": 7})
    r = c.get("/api/batches?size=50")
    body = _strict(r.text)
    assert r.status_code == 200 and body["ok"], body
    rows = body["data"]["rows"]
    assert [row["batch"] for row in rows] == [4, 2]  # every hostile record left out, the page still there
    for row in rows:
        for k in ("batch", "epoch", "records", "outputs", "dlq", "commit_ms", "watermark_ms"):
            assert type(row[k]) is int, (k, row[k])
        assert isinstance(row["txn_ms"], float | int) and row["late"] in (None, 0)
    assert HOSTILE not in r.text and "<script>" not in r.text
    # the charts read the same ledger: numbers only
    charts = _strict(c.get("/api/charts").text)["data"]
    assert all(isinstance(v, int | float) for points in charts.values() for p in points for v in p)

    # the job's events, with markup where numbers belong, through the transactions page's endpoint
    timeout = {"type": wire.TRANSACTION_TIMEOUT, "app": "ip_count", "ts_ms": 5}
    kafka.write(s.job_events_topic, timeout | {"elapsed_ms": HOSTILE, "timeout_ms": "60000", "batch": HOSTILE})
    kafka.write(s.job_events_topic, timeout | {"pid": [HOSTILE], "host": {"h": HOSTILE}, "error": [HOSTILE]})
    kafka.write(s.job_events_topic, timeout | {"elapsed_ms": float("inf"), "timeout_ms": float("nan")})
    kafka.write(s.job_events_topic, {"type": wire.TRANSACTION_TIMEOUT, "app": "ip_count", "ts_ms": HOSTILE})
    t = c.get("/api/transactions")
    incidents = _strict(t.text)["data"]["incidents"]
    assert len(incidents) == 3
    for i in incidents:
        assert (i["ts_ms"], i["batch"], i["pid"], i["elapsed_ms"], i["timeout_ms"]) == (5, None, None, None, None)
        assert all(isinstance(i[k], str) or i[k] is None for k in ("host", "detail"))
    assert t.headers["content-type"].startswith("application/json") and t.headers["x-content-type-options"] == "nosniff"


def test_the_proofs_endpoint_types_reconciliation_batch_numbers(client, monkeypatch):
    from onceflow.operations import recon_chain
    from onceflow.runtime import jobctl

    c, s = client
    monkeypatch.setattr(jobctl, "status", lambda settings: SimpleNamespace(last_batch=9))
    chain = {
        "app": "ip_count",
        "proven_through": HOSTILE,
        "proven_by_run": ["r"],
        "proven_at_ms": "1",
        "newest_committed_batch": 9,
        "pending": [[HOSTILE, 3], [4, 9], "x", [1]],
        "failed": [[2, float("nan")], [1, 2]],
        "last_chain_run": {"run_id": HOSTILE, "batches": [HOSTILE, 2], "finished_ms": 1.5, "failed_checks": [1]},
        "recent_runs": [HOSTILE, {"batches": HOSTILE}],
    }
    monkeypatch.setattr(recon_chain, "status", lambda settings, newest: chain)
    run = {
        "run_id": 1,
        "first_batch": "1",
        "last_batch": 3,
        "finished_ms": float("inf"),
        "ok": True,
        "verdict": HOSTILE,
        "coverage": {"commit_time_ms": [HOSTILE, 1], "source_offsets": {"0": [0, 5], "1": [HOSTILE, 2], HOSTILE: 1}},
        "checks": [{"name": HOSTILE, "status": "pass", "summary": None, "differences": [{"x": float("nan")}]}],
    }
    monkeypatch.setattr(recon_chain, "recent_results", lambda settings, limit=500: [run, HOSTILE])
    r = c.get("/api/proofs")
    body = _strict(r.text)
    assert body["ok"], body
    ch, (out,) = body["data"]["chain"], body["data"]["runs"]
    assert (ch["proven_through"], ch["proven_by_run"], ch["proven_at_ms"]) == (None, "['r']", None)
    assert ch["pending"] == [[4, 9]] and ch["failed"] == [[1, 2]] and ch["newest_committed_batch"] == 9
    assert ch["last_chain_run"]["batches"] == [None, 2] and ch["last_chain_run"]["finished_ms"] is None
    assert ch["last_chain_run"]["failed_checks"] == ["1"] and len(ch["recent_runs"]) == 1
    assert ch["recent_runs"][0]["batches"] == [None, None] and ch["recent_runs"][0]["run_id"] is None
    assert out["batches"] == [None, 3] and out["finished_ms"] is None and out["run_id"] == "1"
    assert out["commit_time_ms"] is None and out["source_offsets"] == {"0": [0, 5]}
    assert out["checks"][0]["differences"] == [{"x": None}]  # strict JSON: the cache and the page both read it
    assert out["verdict"] == HOSTILE  # a text: a string, escaped by the page


def test_an_answer_and_the_cache_file_are_strict_json(client, monkeypatch):
    c, s = client
    monkeypatch.setattr(readers, "read_alerts", lambda settings: {"a": float("nan"), "b": [float("-inf"), 1.5]})
    body = _strict(c.get("/api/alerts").text)
    assert body["data"] == {"a": None, "b": [None, 1.5]}
    assert _strict(readers._cache_file(s).read_text())["alerts"]["value"] == body["data"]


def test_the_cache_writes_again_once_persist_s_has_passed(tmp_path, monkeypatch):
    s = S.replace(var_dir=tmp_path)
    clock = [1_000.0]
    monkeypatch.setattr(readers.time, "monotonic", lambda: clock[0])
    cache = readers.Cache(s, max_entries=10, persist_s=30)
    path = readers._cache_file(s)
    cache.put("a", 1)  # the first answer is written at once (a restart soon after has it)
    assert set(json.loads(path.read_text())) == {"a"}
    for i in range(50):  # a busy page: no write per request
        clock[0] += 0.5
        cache.put(f"b{i % 3}", i)
    assert set(json.loads(path.read_text())) == {"a"}
    clock[0] += 30
    cache.put("c", 2)
    assert set(json.loads(path.read_text())) == {"a", "b0", "b1", "b2", "c"}
    assert json.loads(path.read_text())["b1"]["value"] == 49


def test_a_cache_file_with_other_entries_loads_only_the_well_formed_ones(tmp_path):
    s = S.replace(var_dir=tmp_path)
    path = readers._cache_file(s)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"now": {"ts_ms": 5, "value": 1}, "x": 3, "y": {"value": 1}, "z": {"ts_ms": "5"}}))
    assert list(readers.Cache(s).data) == ["now"]
    path.write_text("[1, 2]")
    assert not readers.Cache(s).data


def test_the_backfill_forms_id_pattern_is_the_dags_and_compiles_as_a_browser_compiles_it():
    """A browser compiles an input's `pattern` with the `v` flag, where an unescaped '-' in a class is an error
    and the pattern is then ignored: the form's first pattern (`[A-Za-z0-9._-]`) was, and admitted '.', which the
    backfill DAG refuses."""
    import re

    from onceflow.control.console import page
    from onceflow.operations import backfill

    (pattern,) = re.findall(r'name="backfill_id" required pattern="([^"]+)"', page.SCRIPT)
    as_browser = pattern.replace("\\\\", "\\")  # the script's template literal unescapes it once
    assert not re.search(r"[^\\]-\]", as_browser), as_browser  # a class's last '-' escaped
    for id_ in ("console-1", "a_b", "x" * 64, "a.b", "-a", "x" * 65, "no spaces"):
        assert bool(re.fullmatch(as_browser, id_)) == bool(re.fullmatch(backfill.ID_PATTERN, id_)), id_
