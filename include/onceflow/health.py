"""Health of the streaming job: alive, progress, lag (Burrow rules), checkpoint freshness; and remediation.

`collect()` reads the world, `assess()` (pure) turns a reading into a status and alert conditions,
`remediate()` restarts a dead or stalled job within a bounded number of attempts, then stops trying and pages.
Each run's record (with the lag sample window the next run needs) goes to the health topic and to
`var/run/<app>.health.json`.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from confluent_kafka import TopicPartition

from . import alerts, audit, events as ev, jobctl, kafka_clients, lag
from .config import Settings

log = logging.getLogger(__name__)
HEALTHY, DEGRADED, FAILING, STOPPED = "HEALTHY", "DEGRADED", "FAILING", "STOPPED"
WINDOW = 10  # lag samples kept per partition


@dataclass
class HealthRecord:
    app: str
    ts_ms: int
    running: bool
    job_pid: int | None
    last_commit_age_s: float | None
    partitions: dict = field(default_factory=dict)    # partition -> {"samples": [...], "status": ..., "lag": ...}
    total_lag: int = 0
    checkpoint_age_s: float | None = None
    status: str = HEALTHY
    problems: list = field(default_factory=list)
    restarts: list = field(default_factory=list)     # ts_ms of restarts done by the health check
    action: str = "none"
    desired: str | None = None                       # what the operator asked for: running / stopped

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, default=str).encode()


def health_file(settings: Settings) -> Path:
    return settings.run_dir / f"{settings.app_id}.health.json"


def last_record(settings: Settings) -> HealthRecord | None:
    try:
        return HealthRecord(**json.loads(health_file(settings).read_text()))
    except (OSError, ValueError, TypeError):
        pass
    msgs = [m for m in audit.read_topic(settings, settings.health_topic) if m.key == settings.app_id.encode()]
    return HealthRecord(**json.loads(msgs[-1].value)) if msgs else None


def _end_offsets(settings: Settings) -> dict[int, int]:
    admin = kafka_clients.admin(settings)
    md = admin.list_topics(settings.source_topic, timeout=10).topics[settings.source_topic]
    ends = kafka_clients.latest_offsets(admin, [TopicPartition(settings.source_topic, p) for p in md.partitions])
    return {p: off for (_, p), off in ends.items()}


def checkpoint_age_s(settings: Settings, now: float) -> float | None:
    """Age of the newest file in the checkpoint's commit log (local checkpoints; None elsewhere)."""
    u = urlparse(settings.checkpoint)
    if u.scheme not in ("", "file"):
        return None
    commits = Path(u.path) / "commits"
    mtimes = [p.stat().st_mtime for p in commits.glob("*") if p.is_file()] if commits.exists() else []
    return round(now - max(mtimes), 1) if mtimes else None


def collect(settings: Settings, previous: HealthRecord | None) -> HealthRecord:
    now = time.time()
    st = jobctl.status(settings)
    ends = _end_offsets(settings)
    committed = audit.committed_offsets(settings, ends)
    parts = {}
    for p, end in sorted(ends.items()):
        prev = (previous.partitions.get(str(p)) or previous.partitions.get(p) or {}) if previous else {}
        samples = [lag.Sample(**s) for s in prev.get("samples", [])]
        cur = committed.get(p, 0)
        moved = bool(samples) and samples[-1].committed != cur
        commit_ts = int(now * 1000) if moved else prev.get("commit_ts_ms")
        sample = lag.Sample(int(now * 1000), cur, end, commit_ts)
        samples = (samples + [sample])[-WINDOW:]
        parts[str(p)] = {"samples": [s.to_dict() for s in samples], "lag": sample.lag,
                         "status": lag.evaluate(samples), "trend": lag.trend(samples).value,
                         "commit_ts_ms": commit_ts}
    return HealthRecord(app=settings.app_id, ts_ms=int(now * 1000), running=st["running"], job_pid=st["job_pid"],
                        last_commit_age_s=st["last_commit_age_s"], partitions=parts,
                        total_lag=sum(v["lag"] for v in parts.values()),
                        checkpoint_age_s=checkpoint_age_s(settings, now),
                        restarts=list(previous.restarts) if previous else [], desired=st["desired_state"])


def assess(rec: HealthRecord, settings: Settings) -> list[alerts.Condition]:
    """The record's problems as alert conditions; sets rec.status."""
    app, out = settings.app_id, []
    if not rec.running and rec.desired != "running":
        # Never deployed, or stopped on purpose: nothing to supervise, nothing to restart.
        rec.problems, rec.status = [], STOPPED
        return out
    if not rec.running:
        out.append(alerts.Condition(f"health:{app}:down", alerts.CRITICAL, f"the streaming job {app} is not running",
                                    "the health check restarts it; if it keeps failing read the job log "
                                    f"({settings.log_dir / (app + '.log')}) and `onceflow job status`"))
    stalled_after = settings.health_progress_threshold_s
    waiting = rec.total_lag > 0
    age = rec.last_commit_age_s
    if rec.running and waiting and (age is None or age > stalled_after):
        out.append(alerts.Condition(
            f"health:{app}:stalled", alerts.CRITICAL,
            f"no batch committed for {age if age is not None else 'ever'} s while {rec.total_lag} records wait "
            f"(threshold {stalled_after:.0f} s)",
            "the health check restarts the job; look for long batches or transaction timeouts in the job log",
            {"lag": rec.total_lag, "last_commit_age_s": age}))
    for p, info in sorted(rec.partitions.items()):
        status = info["status"]
        if status == lag.OK:
            continue
        sev = alerts.WARNING if status == lag.WARN else alerts.CRITICAL
        out.append(alerts.Condition(
            f"health:{app}:lag:{p}", sev,
            f"lag on {settings.source_topic}[{p}] is {status} ({info['lag']} records, trend {info['trend']})",
            "WARN: the job falls behind; raise ONCEFLOW_MAX_OFFSETS_PER_TRIGGER or add cores. STALL/STOP: the job "
            "does not commit; see the progress alert. REWIND: the group's offsets went backwards: someone reset them",
            {"partition": int(p), "lag": info["lag"], "status": status}))
    cp = rec.checkpoint_age_s
    if waiting and cp is not None and cp > settings.checkpoint_freshness_threshold_s:
        out.append(alerts.Condition(
            f"health:{app}:checkpoint_stale", alerts.WARNING,
            f"the checkpoint's commit log was last written {cp:.0f} s ago while input waits",
            f"check that {settings.checkpoint} is writable and the job commits batches"))
    rec.problems = [c.summary for c in out]
    rec.status = FAILING if any(c.severity == alerts.CRITICAL for c in out) else DEGRADED if out else HEALTHY
    return out


RESTART_ON = ("down", "stalled")  # the conditions a restart can fix


def remediate(rec: HealthRecord, conditions: list[alerts.Condition], settings: Settings, now_ms: int,
              start_fn=None) -> list[alerts.Condition]:
    """Restart a down or stalled job, at most `health_restart_attempts` times per window; then page."""
    fixable = {f"health:{settings.app_id}:{c}" for c in RESTART_ON}
    if not any(c.key in fixable for c in conditions):
        return []
    window_ms = settings.health_restart_window_s * 1000
    recent = [t for t in rec.restarts if now_ms - t < window_ms]
    if len(recent) >= settings.health_restart_attempts:
        rec.action = "gave up"
        return [alerts.Condition(f"health:{settings.app_id}:gave_up", alerts.CRITICAL,
                                 f"{len(recent)} restarts by the health check in the last "
                                 f"{settings.health_restart_window_s / 3600:.1f} h did not bring the job back",
                                 "page the on-call: the job needs a human (see the job log and `onceflow job status`)")]
    jobctl.stop(settings, timeout=60)
    (start_fn or jobctl.start)(settings)
    rec.restarts = recent + [now_ms]
    rec.action = "restarted"
    return []


def publish(rec: HealthRecord, settings: Settings) -> None:
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    ev.write_status(health_file(settings), json.loads(rec.to_json()))
    p = kafka_clients.idempotent_producer(settings)
    p.produce(settings.health_topic, key=settings.app_id.encode(), value=rec.to_json())
    p.flush(15)


def check(settings: Settings, sink: alerts.AlertSink, start_fn=None) -> HealthRecord:
    """One health run: collect, assess, remediate, alert (deduplicated), publish the record."""
    rec = collect(settings, last_record(settings))
    conditions = assess(rec, settings)
    conditions += remediate(rec, conditions, settings, rec.ts_ms, start_fn)
    sink.raise_and_resolve(conditions, "health", scope_prefix=f"health:{settings.app_id}:")
    publish(rec, settings)
    return rec
