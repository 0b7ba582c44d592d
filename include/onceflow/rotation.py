"""Checkpoint and savepoint rotation (what `ip_count_checkpoint_rotation` runs, and `onceflow savepoint rotate`).

One run: take a savepoint (while the job runs; a stopped job's checkpoint is saved as it is), verify it, apply
the retention rules (onceflow.retention), and report the checkpoint's size, file count, oldest retained batch
and growth since the previous run. Alerts: a savepoint that fails or does not verify (critical), a checkpoint
above `ONCEFLOW_CHECKPOINT_SIZE_ALERT_BYTES` (warning); both resolve by themselves when the next run is fine.
"""
from __future__ import annotations

import json
import logging
import time

from . import alerts, events as ev, savepoints
from .config import Settings
from .savepoint_rules import SavepointError

log = logging.getLogger(__name__)
STATS_FILE = "_rotation.json"


def rotate(settings: Settings, sink: alerts.AlertSink | None = None, now_ms: int | None = None) -> dict:
    now_ms = now_ms or int(time.time() * 1000)
    key = f"rotation:{settings.app_id}:"
    conditions: list[alerts.Condition] = []
    report: dict = {"app": settings.app_id, "ts_ms": now_ms}

    stats = savepoints.checkpoint_stats(settings)
    if stats["latest_committed_batch"] is None:
        report["savepoint"] = {"status": "skipped", "why": "the checkpoint has no committed batch yet"}
    else:
        try:
            m = savepoints.create(settings, bus=ev.EventBus(settings))
            v = savepoints.verify(settings, m.id)
            report["savepoint"] = {"status": "ok" if v.ok else "failed", "id": m.id, "batch": m.ledger_batch,
                                   "size_bytes": m.total_size, "files": len(m.files), "problems": v.problems}
            if not v.ok:
                savepoints.delete(settings, m.id)
                raise SavepointError(f"savepoint {m.id} did not verify: {'; '.join(v.problems)}")
        except Exception as e:  # any failure is reported and alerted, then fails the run
            log.error("savepoint failed: %s", e)
            report["savepoint"] = {"status": "failed", "error": str(e)}
            conditions.append(alerts.Condition(
                key + "savepoint_failed", alerts.CRITICAL, f"taking a savepoint failed: {e}",
                "look at the rotation task's log; until a savepoint succeeds, restore points age",
                {"error": str(e)}))

    plan = savepoints.prune(settings, now_ms)
    report["retention"] = {"kept": plan.keep, "deleted": [{"id": i, "why": w} for i, w in plan.delete],
                           "replaced_checkpoints_deleted": savepoints.prune_replaced(settings, now_ms)}

    store = savepoints.Store(settings.savepoints)
    try:
        prev = json.loads(store.read(STATS_FILE))
    except (FileNotFoundError, ValueError):
        prev = None
    stats["growth_bytes"] = stats["size_bytes"] - prev["size_bytes"] if prev else None
    stats["growth_files"] = stats["files"] - prev["files"] if prev else None
    stats["since_ms"] = prev.get("ts_ms") if prev else None
    report["checkpoint"] = stats
    store.write_atomic(STATS_FILE, json.dumps(stats | {"ts_ms": now_ms}).encode())
    if stats["size_bytes"] > settings.checkpoint_size_alert_bytes:
        conditions.append(alerts.Condition(
            key + "checkpoint_size", alerts.WARNING,
            f"the checkpoint holds {stats['size_bytes']} bytes in {stats['files']} files, above "
            f"{settings.checkpoint_size_alert_bytes} (growth since the last run: {stats['growth_bytes']})",
            "check ONCEFLOW_MIN_BATCHES_TO_RETAIN and the state size (windows x IPs); raise "
            "ONCEFLOW_CHECKPOINT_SIZE_ALERT_BYTES if the growth is expected",
            {k: stats[k] for k in ("size_bytes", "files", "growth_bytes", "oldest_batch")}))
    if sink is not None:
        report["alerts"] = [a.key + ":" + a.status for a in
                            sink.raise_and_resolve(conditions, source="rotation", scope_prefix=key)]
    report["ok"] = report["savepoint"]["status"] != "failed"
    return report
