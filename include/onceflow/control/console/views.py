"""What the operator console shows, computed from what the readers bring back: pure, unit-tested without a broker.

Every function takes plain records (ledger entries, events, alerts, health records, reconciliation results) and
returns JSON-ready dicts; onceflow.control.console.readers does the bounded reading.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from onceflow import wire
from onceflow.config import Settings
from onceflow.control.alerts import Status as AlertStatus
from onceflow.rules import sources
from onceflow.rules.ledger import LedgerEntry


def _position_order(key: str) -> tuple[str, int]:
    topic, part = sources.split_key(key)
    return topic or "", int(part)


# ------------------------------------------------------------- values from Kafka records: typed or left out
# Events, health, alerts and reconciliation results are read from Kafka: untrusted. A field that should be a
# number is one here or is None; a text field is a string. (The page escapes every value as well.)


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _num(v: Any) -> float | int | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return v if v == v and v not in (float("inf"), float("-inf")) else None


def _text(v: Any) -> str | None:
    return None if v is None else v if isinstance(v, str) else str(v)


# ---------------------------------------------------------------------------- Now


def now_view(
    settings: Settings,
    status: dict[str, Any],
    health: dict[str, Any] | None,
    open_txns: Sequence[dict[str, Any]],
    now_ms: int,
) -> dict[str, Any]:
    """The job at a glance: intent and state, where the driver runs, the last commit and its age, the watermark
    against wall-clock time, rates, batch timing, restarts, lag per partition with Burrow's status, and the age of
    the open transaction against the timeout."""
    last_commit = status.get("last_commit_ms")
    wm = status.get("watermark_ms")
    progress = status.get("progress") or {}
    batch_since = status.get("batch_started_ms")
    partitions = []
    parts = (health or {}).get("partitions")
    # a partition's number, or `topic:number` on an app of several source topics (onceflow.rules.sources)
    parts = (
        {
            p: i
            for p, i in parts.items()
            if isinstance(p, str) and sources.POSITION_KEY.fullmatch(p) and isinstance(i, dict)
        }
        if isinstance(parts, dict)
        else {}
    )
    for p, info in sorted(parts.items(), key=lambda kv: _position_order(kv[0])):
        partitions.append(
            {
                "partition": int(p) if p.isdigit() else p,
                "lag": _int(info.get("lag")),
                "status": _text(info.get("status")),
                "trend": _text(info.get("trend")),
            }
        )
    ours = [t for t in open_txns if t.get("app") == settings.app_id and not t.get("backfill")]
    oldest = min((t["first_ts_ms"] for t in ours if t.get("first_ts_ms")), default=None)
    if oldest is None and batch_since and status.get("running_batch") is not None:
        oldest = batch_since  # the transaction of the batch in progress (records not flushed yet)
    return {
        "app": settings.app_id,
        "desired_state": status.get("desired_state"),
        "state": status.get("state"),
        "running": status.get("running"),
        "where": {
            "host": status.get("host"),
            "job_pid": status.get("job_pid"),
            "supervisor_pid": status.get("supervisor_pid"),
            "bootstrap_servers": settings.bootstrap_servers,
            "checkpoint": settings.checkpoint,
            "transactional_id": settings.transactional_id,
        },
        "last_batch": status.get("last_batch"),
        "last_commit_ms": last_commit,
        "last_commit_age_s": round((now_ms - last_commit) / 1000, 1) if last_commit else None,
        "watermark_ms": wm,
        "watermark_lag_s": round((now_ms - wm) / 1000, 1) if wm else None,
        "input_rows_per_s": progress.get("input_rows_per_s"),
        "processed_rows_per_s": progress.get("processed_rows_per_s"),
        "batch_duration_ms": (progress.get("duration_ms") or {}).get("triggerExecution"),
        "last_timings": status.get("last_timings"),
        "last_txn_ms": status.get("last_txn_ms"),
        "running_batch": status.get("running_batch"),
        "running_batch_s": round((now_ms - batch_since) / 1000, 1)
        if batch_since and status.get("running_batch") is not None
        else None,
        "restarts": status.get("restarts"),
        "health_restarts": len(_list((health or {}).get("restarts"))),
        "health_status": _text((health or {}).get("status")),
        "health_problems": [_text(p) for p in _list((health or {}).get("problems"))],
        "health_ts_ms": _int((health or {}).get("ts_ms")),
        "partitions": partitions,
        "total_lag": sum(p["lag"] or 0 for p in partitions) if partitions else None,
        "open_transaction_age_s": round((now_ms - oldest) / 1000, 1) if oldest else None,
        "transaction_timeout_s": settings.transaction_timeout_ms / 1000,
        "last_exit": status.get("last_exit"),
        "error": status.get("error"),
    }


# ---------------------------------------------------------------------------- Batches


def batch_rows(entries: Iterable[LedgerEntry], late_by_batch: dict[int, int]) -> list[dict[str, Any]]:
    """The ledger as table rows, newest first."""
    rows = []
    for e in entries:
        rows.append(
            {
                "batch": e.batch,
                "spark_batch": e.spark_batch,
                "epoch": e.epoch,
                "ranges": sources.keyed_to_json(e.ranges, list),
                "records": sum(end - s for s, end in e.ranges.values()),
                "outputs": e.outputs,
                "outputs_by_topic": e.outputs_by_topic,  # an app with named outputs: its results per topic
                "dlq": e.dlq,
                "late": late_by_batch.get(e.batch),
                "txn_ms": e.txn_ms,
                "commit_ms": e.commit_time_ms,
                "watermark_ms": e.watermark_ms,
            }
        )
    return sorted(rows, key=lambda r: -int(r["batch"]))


def filter_rows(
    rows: Iterable[dict[str, Any]],
    batch_from: int | None = None,
    batch_to: int | None = None,
    min_txn_ms: float | None = None,
    with_dlq: bool = False,
    with_late: bool = False,
) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        if batch_from is not None and r["batch"] < batch_from or batch_to is not None and r["batch"] > batch_to:
            continue
        if min_txn_ms is not None and r["txn_ms"] < min_txn_ms:
            continue
        if with_dlq and not r["dlq"] or with_late and not r["late"]:
            continue
        out.append(r)
    return out


def late_by_batch(progress_events: Iterable[dict[str, Any]]) -> dict[int, int]:
    """Late aggregates Spark dropped, per ledger batch, from the job's progress events (catch-up batches belong to
    no ledger batch: they re-read committed ones)."""
    out: dict[int, int] = {}
    for e in progress_events:
        batch = _int(e.get("ledger_batch"))
        if batch is None or e.get("decision") not in (None, "write"):
            continue
        out[batch] = _int(e.get("rows_dropped_by_watermark")) or 0
    return out


def series(entries: Sequence[LedgerEntry], health: Sequence[dict[str, Any]]) -> dict[str, list[list[float]]]:
    """The charts: lag (health runs), throughput (records per second of commit time) and transaction time (per
    batch) over time, as [epoch ms, value] points, oldest first."""
    by_time = sorted(entries, key=lambda e: e.commit_time_ms)
    throughput = []
    for prev, cur in zip(by_time, by_time[1:]):
        dt = (cur.commit_time_ms - prev.commit_time_ms) / 1000
        if dt > 0:
            throughput.append([cur.commit_time_ms, round(sum(b - a for a, b in cur.ranges.values()) / dt, 1)])
    return {
        "lag": sorted([h["ts_ms"], _num(h.get("total_lag")) or 0] for h in health if _int(h.get("ts_ms")) is not None),
        "throughput": throughput,
        "txn_ms": [[e.commit_time_ms, e.txn_ms] for e in by_time],
    }


# ---------------------------------------------------------------------------- transactions and alerts

TXN_EVENTS = (
    wire.TRANSACTION_NEAR_TIMEOUT,
    wire.TRANSACTION_TIMEOUT,
    wire.FENCED,
    wire.TRANSACTION_OUTCOME_UNKNOWN,
    wire.PRODUCER_REPLACED,
)


def transaction_incidents(
    settings: Settings, events: Iterable[dict[str, Any]], open_txns: Iterable[dict[str, Any]], now_ms: int
) -> list[dict[str, Any]]:
    """Near-timeouts, timeouts, fencing and unknown outcomes from the job's events, and the transactions open now
    on every topic the platform writes (hanging when older than the timeout), newest first, each with the exact
    command that resolves it."""
    out = []
    for e in events:
        kind = e.get("type")
        if kind not in TXN_EVENTS:
            continue
        if kind == wire.TRANSACTION_NEAR_TIMEOUT:
            fix = (
                "nothing yet: watch batch durations; if it repeats, lower ONCEFLOW_MAX_OFFSETS_PER_TRIGGER or raise "
                "ONCEFLOW_TRANSACTION_TIMEOUT_MS"
            )
        elif kind == wire.TRANSACTION_TIMEOUT:
            fix = (
                "nothing: the job replays the batch after its restart (`onceflow job status`); if it repeats, "
                "export ONCEFLOW_TRANSACTION_TIMEOUT_MS=<more> and redeploy (ip_count_deploy, action upgrade)"
            )
        elif kind == wire.FENCED:
            fix = (
                "another driver of the app took over: find it (`onceflow job status` on each host); keep one, "
                "then `onceflow job start` here only if this should be the one"
            )
        else:
            fix = "nothing: the writer replaced its producer and the batch was decided again from what is committed"
        out.append(
            {
                "ts_ms": _int(e.get("ts_ms")),
                "kind": kind,
                "batch": _int(e.get("batch")),
                "host": _text(e.get("host")),
                "pid": _int(e.get("pid")),
                "detail": _text(e.get("error") or e.get("why") or ""),
                "resolve": fix,
                "elapsed_ms": _num(e.get("elapsed_ms")) or _num(e.get("txn_ms")),
                "timeout_ms": _num(e.get("timeout_ms")),
            }
        )
    for t in open_txns:
        age = (now_ms - t["first_ts_ms"]) if t.get("first_ts_ms") else None
        hanging = age is not None and age > settings.transaction_timeout_ms
        if t.get("backfill"):
            who = f"backfill {t['backfill']}"
            fix = (
                f"if that backfill run is gone: re-run it (`onceflow backfill --id {t['backfill']} ...`): its "
                f"init_transactions aborts this one"
            )
        elif t.get("app"):
            who = f"app {t['app']} batch {t.get('batch')}"
            fix = "if that driver is gone: `onceflow job start` (its init_transactions aborts this one)"
        else:
            who = "a producer that is not onceflow"
            fix = ""
        cmd = (
            f"kafka-transactions.sh --bootstrap-server {settings.bootstrap_servers} abort --topic {t['topic']} "
            f"--partition {t['partition']} --start-offset {t['lso']}"
        )
        out.append(
            {
                "ts_ms": t.get("first_ts_ms"),
                "kind": "hanging_transaction" if hanging else "open_transaction",
                "topic": t["topic"],
                "partition": t["partition"],
                "age_s": round(age / 1000, 1) if age else None,
                "who": who,
                "lso": t["lso"],
                "high_watermark": t["high_watermark"],
                "resolve": (fix + "; otherwise: " if fix else "") + cmd
                if hanging
                else "nothing: still within the transaction timeout",
            }
        )
    return sorted(out, key=lambda r: -(r.get("ts_ms") or 0))


def _list(v: Any) -> list:
    return v if isinstance(v, list) else []


def _alert(a: dict[str, Any]) -> dict[str, Any] | None:
    """An alert record with its shown fields typed; one without a key or time is left out."""
    key, ts = _text(a.get("key")), _int(a.get("ts_ms"))
    if key is None or ts is None:
        return None
    return {
        **{k: _text(a.get(k)) for k in ("status", "severity", "source", "summary", "action")},
        "key": key,
        "ts_ms": ts,
        "one_off": a.get("one_off") is True,
    }


def alert_view(history: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The alert record: the conditions open now (firing, not resolved since) and the history, newest first."""
    latest: dict[str, dict[str, Any]] = {}
    hist = []
    for raw in history:
        a = _alert(raw)
        if a is None:
            continue
        hist.append(a)
        latest[a["key"]] = a
    open_now = [a for a in latest.values() if a["status"] == AlertStatus.FIRING and not a.get("one_off")]
    return {"open": sorted(open_now, key=lambda a: -a["ts_ms"]), "history": sorted(hist, key=lambda a: -a["ts_ms"])}


# ---------------------------------------------------------------------------- savepoints, proofs, backfills


def savepoint_rows(listed: Iterable[Any]) -> list[dict[str, Any]]:
    rows = []
    for x in listed:
        v = x.verified or {}
        rows.append(
            {
                "id": x.id,
                "created_ms": x.created_ms,
                "batch": x.ledger_batch,
                "mode": x.mode,
                "size_bytes": x.total_size,
                "complete": x.complete,
                "error": x.error,
                "verified": None if not v else ("ok" if v.get("ok") else "damaged"),
                "restorable": v.get("compatible") if v else None,
                "verified_ms": v.get("ts_ms"),
                "problems": (v.get("problems") or []) + (v.get("incompatibilities") or []),
            }
        )
    return sorted(rows, key=lambda r: -r["created_ms"])


def check_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "name": _text(c.get("name")),
            "status": _text(c.get("status")),
            "summary": _text(c.get("summary")),
            "differences": _list(c.get("differences"))[:20],
        }
        for c in _list(result.get("checks"))
        if isinstance(c, dict)
    ]


def _pair(v: Any) -> list[int] | None:
    """[first, last] of two integers, or None."""
    if isinstance(v, list | tuple) and len(v) == 2 and _int(v[0]) is not None and _int(v[1]) is not None:
        return [v[0], v[1]]
    return None


def _ranges(v: Any) -> dict[str, list[int]] | None:
    """{partition: [start, end]} with integer offsets (the pairs that are not are left out), or None. A partition is
    its number, or `topic:number` for an app of several source topics (onceflow.rules.sources)."""
    if not isinstance(v, dict):
        return None
    return {
        p: r
        for p, r in ((p, _pair(r)) for p, r in v.items())
        if isinstance(p, str) and sources.POSITION_KEY.fullmatch(p) and r
    }


def _brief(r: Any) -> dict[str, Any] | None:
    if not isinstance(r, dict):
        return None
    return {
        "run_id": _text(r.get("run_id")),
        "mode": _text(r.get("mode")),
        "verdict": _text(r.get("verdict")),
        "batches": [_int(b) for b in (_list(r.get("batches")) + [None, None])[:2]],
        "finished_ms": _int(r.get("finished_ms")),
        "failed_checks": [_text(c) for c in _list(r.get("failed_checks"))],
    }


def chain_view(chain: dict[str, Any]) -> dict[str, Any]:
    """The reconciliation chain's status (onceflow.operations.recon_chain.status, computed from the reconciliation
    topic's records) with every field typed: batch numbers integers, ranges [first, last] pairs of integers (any
    other pair left out), texts strings."""
    return {
        "app": _text(chain.get("app")),
        "proven_through": _int(chain.get("proven_through")),
        "proven_by_run": _text(chain.get("proven_by_run")),
        "proven_at_ms": _int(chain.get("proven_at_ms")),
        "newest_committed_batch": _int(chain.get("newest_committed_batch")),
        "pending": [p for p in map(_pair, _list(chain.get("pending"))) if p],
        "failed": [p for p in map(_pair, _list(chain.get("failed"))) if p],
        "last_chain_run": _brief(chain.get("last_chain_run")),
        "recent_runs": [b for b in map(_brief, _list(chain.get("recent_runs"))) if b],
    }


def reconciliation_runs(results: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each run's verdict, coverage and checks (with their exact differences), newest first."""
    out = []
    for r in results:
        if not isinstance(r, dict):
            continue
        cov = r.get("coverage")
        cov = cov if isinstance(cov, dict) else {}
        out.append(
            {
                "run_id": _text(r.get("run_id")),
                "mode": _text(r.get("mode", "manual")),
                "verdict": _text(r.get("verdict")),
                "ok": r.get("ok") is True,
                "batches": [_int(r.get("first_batch")), _int(r.get("last_batch"))],
                "commit_time_ms": _pair(cov.get("commit_time_ms")),
                "source_offsets": _ranges(cov.get("source_offsets")),
                "finished_ms": _int(r.get("finished_ms")),
                "data_docs": bool(r.get("data_docs")),
                "checks": check_rows(r),
            }
        )
    return sorted(out, key=lambda r: -(r.get("finished_ms") or 0))


def backfill_view(
    entries: Iterable[LedgerEntry], running: Iterable[dict[str, Any]], events: Iterable[dict[str, Any]] = ()
) -> list[dict[str, Any]]:
    """Each backfill of the app: its chunks (of how many, from its runs' events), records, range, last commit, and
    whether a run is going on now."""
    by_id: dict[str, dict[str, Any]] = {}
    for e in entries:
        if e.kind != wire.LEDGER_BACKFILL or not e.backfill_id:
            continue
        b = by_id.setdefault(
            e.backfill_id,
            {
                "id": e.backfill_id,
                "chunks": 0,
                "records": 0,
                "first_ms": None,
                "last_ms": None,
                "ranges": None,
                "spec": e.spec_hash,
                "running": None,
            },
        )
        b["chunks"] += 1
        b["records"] += e.outputs
        b["first_ms"] = min(x for x in (b["first_ms"], e.commit_time_ms) if x is not None)
        b["last_ms"] = max(x for x in (b["last_ms"], e.commit_time_ms) if x is not None)
        b["ranges"] = sources.keyed_to_json(e.ranges, list)
    total: dict[str, int] = {}
    finished: dict[str, bool] = {}
    for ev in events:  # oldest first: the newest run of an id decides
        if ev.get("type") == wire.BACKFILL_STARTED and isinstance(ev.get("id"), str):
            total[ev["id"]], finished[ev["id"]] = _int(ev.get("chunks")) or 0, False
        elif ev.get("type") == wire.BACKFILL_DONE and isinstance(ev.get("id"), str):
            finished[ev["id"]] = True
    for b in by_id.values():
        b["total_chunks"] = total.get(b["id"])
        b["complete"] = finished.get(b["id"]) or (b["total_chunks"] is not None and b["chunks"] >= b["total_chunks"])
    for r in running:
        b = by_id.setdefault(
            r["id"],
            {
                "id": r["id"],
                "chunks": 0,
                "records": 0,
                "first_ms": None,
                "last_ms": None,
                "ranges": None,
                "spec": None,
                "running": None,
                "total_chunks": total.get(r["id"]),
                "complete": False,
            },
        )
        b["running"] = {"pid": r.get("pid"), "host": r.get("host"), "started_ms": r.get("started_ms")}
    return sorted(by_id.values(), key=lambda b: (b["running"] is None, -(b["last_ms"] or 0)))
