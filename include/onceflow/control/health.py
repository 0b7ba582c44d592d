"""Health of the streaming job: alive, progress, lag (Burrow rules), checkpoint freshness; and remediation.

`collect()` reads the world, `assess()` (pure) turns a reading into a status and alert conditions,
`remediate()` restarts a dead or stalled job within a bounded number of attempts, then stops trying and pages.
A restart never changes the operator's intent (desired state); a restart that fails counts against the budget
and pages; a job that ended for a reason a restart cannot fix (fenced by a newer instance, divergent history,
misconfiguration) pages and is left alone. Progress is judged from the later of the last commit and the job's
start, and a batch in progress gets a grace (a backlog or the catch-up batch after a restore can be long).
"Everything is late" is never healthy: the share of late aggregates over recent batches and the watermark's
distance from wall-clock time are judged too.
Each run's record (with the lag sample window the next run needs) goes to the health topic and to
`var/run/<app>.health.json`.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, cast

from confluent_kafka import TopicPartition

from onceflow import wire
from onceflow.config import Settings
from onceflow.control import alerts
from onceflow.kafka import clients as kafka_clients
from onceflow.kafka import events as ev
from onceflow.kafka import reading as kafka_reading
from onceflow.operations import audit
from onceflow.rules import lag, sources
from onceflow.rules.sources import SourcePartition
from onceflow.runtime import jobctl, run_files, stacks
from onceflow.storage.store import Store

log = logging.getLogger(__name__)


class State(StrEnum):
    HEALTHY = "HEALTHY"
    DEGRADED = "DEGRADED"  # a warning holds
    FAILING = "FAILING"  # a critical condition holds
    STOPPED = "STOPPED"  # stopped on purpose (the operator's intent): not restarted, not alerted
    RESTARTING = "RESTARTING"  # the job is down between two runs and its supervisor is bringing it back


class Action(StrEnum):
    """What a health run did about what it found."""

    NONE = "none"
    RESTARTED = "restarted"
    RESTART_FAILED = "restart failed"
    GAVE_UP = "gave up"  # the restart budget is spent: paged


WINDOW = 10  # lag samples kept per partition


def lag_noise_s(settings: Settings) -> float:
    """The input a job that keeps up holds between commits, in seconds: a trigger interval and a batch's own time
    (at most another interval when it keeps up), so the lag rule's WARN is falling behind, not where in the commit
    cycle a health run happened to look (onceflow.rules.lag)."""
    return 2 * settings.trigger_interval_s


@dataclass
class HealthRecord:
    app: str
    ts_ms: int
    running: bool
    job_pid: int | None
    last_commit_age_s: float | None
    partitions: dict = field(default_factory=dict)  # partition -> {"samples": [...], "status": ..., "lag": ...}
    total_lag: int = 0
    checkpoint_age_s: float | None = None
    status: str = State.HEALTHY
    problems: list = field(default_factory=list)
    restarts: list = field(default_factory=list)  # ts_ms of restarts done by the health check
    action: str = Action.NONE
    desired: str | None = None  # what the operator asked for: running / stopped
    progress_age_s: float | None = None  # since the later of the last commit and the job's start
    batch_running_s: float | None = None  # how long the batch in progress has been running
    last_exit: dict | None = None  # why supervision ended, when the job is not running
    watermark_ms: int | None = None
    late_fraction: float | None = None  # late (window, ip) aggregates / all, over recent batches
    late_batches: int = 0  # the batches that share is taken over
    restart_error: str | None = None
    supervised: bool = False  # the job's supervisor is alive (while the job is not: it is restarting it)
    stacks_logged_ms: int | None = None  # a stalled driver's stacks, asked before its restart, are in the logs
    waiting_in: list = field(default_factory=list)  # its threads' innermost frames in onceflow's code, from them

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, default=str).encode()


def health_file(settings: Settings) -> Path:
    return settings.run_dir / f"{settings.app_id}.health.json"


def last_record(settings: Settings) -> HealthRecord | None:
    try:
        return HealthRecord(**json.loads(health_file(settings).read_text()))
    except (OSError, ValueError, TypeError):
        pass
    msgs = [m for m in kafka_reading.read_topic(settings, settings.health_topic) if m.key == settings.app_id.encode()]
    return HealthRecord(**json.loads(cast(bytes, msgs[-1].value))) if msgs else None  # health records carry a value


def _end_offsets(settings: Settings) -> dict[SourcePartition, int]:
    admin = kafka_clients.admin(settings)
    tps = [TopicPartition(sp.topic, sp.partition) for sp in audit.source_partitions(settings, admin)]
    ends = kafka_reading.latest_offsets(admin, tps)
    return {SourcePartition(t, p): off for (t, p), off in ends.items()}


def checkpoint_age_s(settings: Settings, now: float) -> float | None:
    """Age of the newest file in the checkpoint's commit log, on whatever store it lives (None: no commit yet, or
    a store that reports no modification times)."""
    newest = Store(settings.checkpoint).newest_mtime("commits")
    return round(now - newest, 1) if newest is not None else None


def late_share(progress: list[dict]) -> tuple[float | None, int]:
    """Spark drops a late row after its partial aggregation: per batch it reports the (window, ip) aggregates it
    dropped (`rows_dropped_by_watermark`) and those it updated. The dropped share over the written batches (not
    replays or catch-up) says whether the job still counts what it reads."""
    written = [p for p in progress if p.get("decision", "write") == "write" and p.get("input_rows")]
    dropped = sum(int(p.get("rows_dropped_by_watermark") or 0) for p in written)
    updated = sum(int(p.get("state_rows_updated") or 0) for p in written)
    if dropped + updated < LATE_MIN_AGGREGATES:
        return None, len(written)
    return round(dropped / (dropped + updated), 4), len(written)


LATE_MIN_AGGREGATES = 20  # fewer aggregates over the window say nothing


def recent_progress(settings: Settings, since_ms: int) -> list[dict]:
    """The job's progress events (from its own events topic only) since `since_ms`."""
    return ev.read(settings, {wire.PROGRESS}, since_ms=since_ms, timeout_s=60)


def collect(settings: Settings, previous: HealthRecord | None) -> HealthRecord:
    now = time.time()
    st = jobctl.status(settings)
    ends = _end_offsets(settings)
    committed = audit.consumed_position(settings, ends).offsets  # the ledger's, when the group has expired
    parts: dict[str, dict[str, Any]] = {}
    run_start = st.started_ms
    # a run that has not committed yet is judged by the down and progress rules (their thresholds), not by lag's
    run_committed = bool(run_start and int(st.last_commit_ms or 0) >= run_start)
    keys = sources.position_keys(ends)  # a partition's number, or `topic:number` for several source topics
    for p, end in sorted(ends.items()):
        prev = (previous.partitions.get(keys[p]) or {}) if previous else {}
        samples = [lag.Sample(**s) for s in prev.get("samples", [])]
        cur = committed.get(p, 0)
        moved = bool(samples) and samples[-1].committed != cur
        commit_ts = int(now * 1000) if moved else prev.get("commit_ts_ms")
        sample = lag.Sample(int(now * 1000), cur, end, commit_ts)
        samples = (samples + [sample])[-WINDOW:]
        parts[keys[p]] = {
            "samples": [s.to_dict() for s in samples],
            "lag": sample.lag,
            # judged over the job's current run only; while it is down the down/restarting rules speak
            "status": (
                lag.evaluate(samples, since_ms=run_start, run_committed=run_committed, noise_s=lag_noise_s(settings))
                if st.running
                else lag.Level.OK
            ),
            "trend": lag.trend(samples).value,
            "commit_ts_ms": commit_ts,
        }
    now_ms = int(now * 1000)
    marks = [t for t in (st.last_commit_ms, st.started_ms) if t]
    since = previous.ts_ms if previous else now_ms - int(settings.health_restart_window_s * 1000)
    share, n = late_share(recent_progress(settings, max(since, now_ms - 15 * 60_000)))
    return HealthRecord(
        app=settings.app_id,
        ts_ms=now_ms,
        running=st.running,
        job_pid=st.job_pid,
        last_commit_age_s=st.last_commit_age_s,
        partitions=parts,
        total_lag=sum(v["lag"] for v in parts.values()),
        checkpoint_age_s=checkpoint_age_s(settings, now),
        restarts=list(previous.restarts) if previous else [],
        desired=st.desired_state,
        progress_age_s=round((now_ms - max(marks)) / 1000, 1) if marks else None,
        batch_running_s=round((now_ms - st.batch_started_ms) / 1000, 1) if st.batch_started_ms else None,
        last_exit=st.last_exit.as_json() if st.last_exit else None,
        watermark_ms=st.watermark_ms if st.running else None,
        late_fraction=share,
        late_batches=n,
        supervised=st.supervisor_pid is not None,
    )


# Exit codes after which the supervisor stops for good: a restart would not help either.
NOT_RESTARTABLE = {code: why for code, why in wire.NO_RESTART.items() if code != wire.EXIT_OK}


def condition_key(app: str, what: str = "") -> str:
    """The alert key of one of an app's health conditions (`health:<app>:<what>`); `what` empty: the prefix every
    one of them starts with (the scope the health check raises and resolves)."""
    return f"health:{app}:{what}"


def assess(rec: HealthRecord, settings: Settings, now_ms: int | None = None) -> list[alerts.Condition]:
    """The record's problems as alert conditions; sets rec.status."""
    out: list[alerts.Condition]
    app, out = settings.app_id, []
    now_ms = now_ms or rec.ts_ms
    restarting = False
    if not rec.running and rec.desired != wire.Intent.RUNNING:
        # Never deployed, or stopped on purpose: nothing to supervise, nothing to restart.
        rec.problems, rec.status = [], State.STOPPED
        return out
    code = (rec.last_exit or {}).get("exit_code")
    if not rec.running and code in NOT_RESTARTABLE:
        out.append(
            alerts.Condition(
                condition_key(app, "not_restartable"),
                alerts.Severity.CRITICAL,
                f"the streaming job {app} stopped for good: {NOT_RESTARTABLE[code]} (exit {code}); it is not restarted",
                "read the job log (" + str(settings.log_dir / (app + ".log")) + "): a fenced job means another driver "
                "of the app runs elsewhere; divergent history needs `onceflow audit` and a decision (restore a "
                "savepoint); a misconfiguration needs the setting the log names. Then deploy (action start)",
                {"exit_code": code},
            )
        )
    elif not rec.running and rec.supervised and (rec.progress_age_s or 0) <= settings.health_progress_threshold_s:
        # between two runs of the job: its supervisor restarts it (fixed delay, bounded attempts), and gives up by
        # exiting; restarting it here too would only kill that restart. Longer than the threshold is down.
        restarting = True
    elif not rec.running:
        out.append(
            alerts.Condition(
                condition_key(app, "down"),
                alerts.Severity.CRITICAL,
                f"the streaming job {app} is not running",
                "the health check restarts it; if it keeps failing read the job log "
                f"({settings.log_dir / (app + '.log')}) and `onceflow job status`",
            )
        )
    stalled_after = settings.health_progress_threshold_s
    waiting = rec.total_lag > 0
    age = rec.progress_age_s
    if rec.batch_running_s is not None:  # a batch in progress: judged by how long it runs, with a grace
        stalled = rec.batch_running_s > stalled_after + settings.health_batch_grace_s
        age = rec.batch_running_s
    else:
        stalled = age is not None and age > stalled_after
    if rec.running and waiting and stalled:
        out.append(
            alerts.Condition(
                condition_key(app, "stalled"),
                alerts.Severity.CRITICAL,
                (f"batch running for {age} s" if rec.batch_running_s is not None else f"no batch committed for {age} s")
                + f" while {rec.total_lag} records wait (threshold {stalled_after:.0f} s"
                + (f" + {settings.health_batch_grace_s:.0f} s grace)" if rec.batch_running_s is not None else ")"),
                "the health check writes the driver's stacks to this run's log and the job log, then restarts the job; "
                "they say where it waited; look for long batches or transaction timeouts in the job log too",
                {"lag": rec.total_lag, "progress_age_s": rec.progress_age_s, "batch_running_s": rec.batch_running_s},
            )
        )
    out += _event_time(rec, settings, now_ms)
    for p, info in sorted(rec.partitions.items()):
        status = info["status"]
        if status == lag.Level.OK:
            continue
        sev = alerts.Severity.WARNING if status == lag.Level.WARN else alerts.Severity.CRITICAL
        out.append(
            alerts.Condition(
                condition_key(app, f"lag:{p}"),
                sev,
                f"lag on {_where(settings, p)} is {status} ({info['lag']} records, trend {info['trend']})",
                "WARN: the job falls behind; raise ONCEFLOW_MAX_OFFSETS_PER_TRIGGER or add cores. STALL/STOP: the job "
                "does not commit; see the progress alert. REWIND: the group's offsets went backwards: someone reset them",
                {"partition": int(p) if p.isdigit() else p, "lag": info["lag"], "status": status},
            )
        )
    cp = rec.checkpoint_age_s
    if waiting and cp is not None and cp > settings.checkpoint_freshness_threshold_s:
        out.append(
            alerts.Condition(
                condition_key(app, "checkpoint_stale"),
                alerts.Severity.WARNING,
                f"the checkpoint's commit log was last written {cp:.0f} s ago while input waits",
                f"check that {settings.checkpoint} is writable and the job commits batches",
            )
        )
    rec.problems = [c.summary for c in out] + (["the supervisor is restarting the job"] if restarting else [])
    rec.status = (
        State.FAILING
        if any(c.severity == alerts.Severity.CRITICAL for c in out)
        else State.DEGRADED
        if out
        else State.RESTARTING
        if restarting
        else State.HEALTHY
    )
    return out


def _event_time(rec: HealthRecord, settings: Settings, now_ms: int) -> list[alerts.Condition]:
    """Late records and the watermark against wall-clock time: "everything is late" is never healthy."""
    app, out = settings.app_id, []
    if rec.late_fraction is not None and rec.late_fraction > settings.late_fraction_threshold:
        out.append(
            alerts.Condition(
                condition_key(app, "late"),
                alerts.Severity.CRITICAL,
                f"{100 * rec.late_fraction:.0f}% of the (window, ip) aggregates of the last {rec.late_batches} batches "
                f"were dropped as late (threshold {100 * settings.late_fraction_threshold:.0f}%): the job reads records "
                f"but does not count them",
                "the watermark is ahead of the input: a producer's clock behind the others, or an old topic replayed "
                "into the source. Check the DLQ for timestamp_ahead records and `onceflow job status` (watermark); "
                "reconciliation reports the exact late count per batch",
                {"late_fraction": rec.late_fraction},
            )
        )
    wm = rec.watermark_ms
    if rec.running and wm:
        ahead_ms = wm - now_ms
        allowed_ms = settings.max_event_ahead_ms + settings.watermark_s * 1000 + 60_000
        if ahead_ms > allowed_ms:
            out.append(
                alerts.Condition(
                    condition_key(app, "watermark_ahead"),
                    alerts.Severity.CRITICAL,
                    f"the watermark is {ahead_ms / 1000:.0f} s ahead of wall-clock time (allowed {allowed_ms / 1000:.0f} "
                    f"s): every record with a correct clock is dropped as late",
                    "a producer stamps records with a clock ahead (Kafka timestamp and event time alike: a source "
                    "topic on CreateTime cannot tell; the platform creates its sources on LogAppendTime): fix its "
                    "clock. A watermark never moves back without emitting windows twice, and a savepoint restore "
                    "does not undo the jump (its catch-up batch re-reads the jumped records). The records dropped "
                    "since are in the source: recount their range with a backfill (docs/backfill.md), or start "
                    "the stream again under a new app id (docs/operations.md#event-time-and-bad-clocks)",
                    {"ahead_ms": ahead_ms},
                )
            )
        behind_ms = now_ms - wm
        caught_up = rec.total_lag <= settings.max_offsets_per_trigger
        if caught_up and behind_ms > settings.health_event_time_lag_threshold_s * 1000:
            out.append(
                alerts.Condition(
                    condition_key(app, "event_time_lag"),
                    alerts.Severity.WARNING,
                    f"the watermark is {behind_ms / 1000:.0f} s behind wall-clock time although the job has caught up "
                    f"(threshold {settings.health_event_time_lag_threshold_s:.0f} s)",
                    "the producers' clocks are behind, or old records are being replayed into the source",
                    {"behind_ms": behind_ms},
                )
            )
    return out


RESTART_ON = ("down", "stalled")  # the conditions a restart can fix


def remediate(
    rec: HealthRecord, conditions: list[alerts.Condition], settings: Settings, now_ms: int, start_fn=None
) -> list[alerts.Condition]:
    """Restart a down or stalled job, at most `health_restart_attempts` times per window; then page. The restart
    leaves the operator's intent as it is; a failed start counts as an attempt and pages (`restart_failed`)."""
    fixable = {condition_key(settings.app_id, c) for c in RESTART_ON}
    if not any(c.key in fixable for c in conditions):
        return []
    window_ms = settings.health_restart_window_s * 1000
    recent = [t for t in rec.restarts if now_ms - t < window_ms]
    if len(recent) >= settings.health_restart_attempts:
        rec.action = Action.GAVE_UP
        return [
            alerts.Condition(
                condition_key(settings.app_id, "gave_up"),
                alerts.Severity.CRITICAL,
                f"{len(recent)} restarts by the health check in the last "
                f"{settings.health_restart_window_s / 3600:.1f} h did not bring the job back",
                "page the on-call: the job needs a human (see the job log and `onceflow job status`)",
            )
        ]
    rec.restarts = recent + [now_ms]
    if condition_key(settings.app_id, "stalled") in {c.key for c in conditions}:
        _log_stacks(rec, settings, now_ms)  # the restart ends the wait it was stalled in: keep where it was
    try:
        jobctl.stop(settings, timeout=60, record_intent=False)
        (start_fn or jobctl.start)(settings)
    except Exception as e:  # broker down, preflight: the job stays down, the operator's intent stays "running"
        rec.action, rec.restart_error = Action.RESTART_FAILED, str(e)[:2000]
        return [
            alerts.Condition(
                condition_key(settings.app_id, "restart_failed"),
                alerts.Severity.CRITICAL,
                f"restarting the job failed: {str(e)[:300]}",
                "the health check tries again on its next runs (within its restart budget); fix what the error names",
                {"error": str(e)[:2000]},
            )
        ]
    rec.action = Action.RESTARTED
    return []


def _log_stacks(rec: HealthRecord, settings: Settings, now_ms: int) -> None:
    got = stacks.dump(settings)
    if got is None:
        return
    log.warning(
        "the stalled driver's threads before its restart (pid %d, written to %s too):\n%s",
        got.pid,
        got.log,
        "\n\n".join(got.threads),
    )
    rec.stacks_logged_ms, rec.waiting_in = now_ms, stacks.waiting_in(got.threads)


def with_stacks(conditions: list[alerts.Condition], rec: HealthRecord, settings: Settings) -> list[alerts.Condition]:
    """The stalled alert carries where the driver waited (the page says it, not only the logs)."""
    if not rec.waiting_in:
        return conditions
    key = condition_key(settings.app_id, "stalled")
    return [replace(c, details={**c.details, "waiting_in": rec.waiting_in}) if c.key == key else c for c in conditions]


def publish(rec: HealthRecord, settings: Settings) -> None:
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    run_files.write_json(health_file(settings), json.loads(rec.to_json()))
    p = kafka_clients.idempotent_producer(settings)
    p.produce(settings.health_topic, key=settings.app_id.encode(), value=rec.to_json())
    p.flush(15)


def check(settings: Settings, sink: alerts.AlertSink, start_fn=None) -> HealthRecord:
    """One health run: collect, assess, remediate, alert (deduplicated), publish the record."""
    rec = collect(settings, last_record(settings))
    conditions = assess(rec, settings)
    conditions += remediate(rec, conditions, settings, rec.ts_ms, start_fn)
    conditions = with_stacks(conditions, rec, settings)
    sink.raise_and_resolve(conditions, "health", scope_prefix=condition_key(settings.app_id))
    publish(rec, settings)
    return rec


def _where(settings: Settings, key: str) -> str:
    """A health record's partition key as `topic[partition]` (its number alone on an app of one source topic)."""
    topic, part = sources.split_key(key)
    return f"{topic or settings.source_topic}[{part}]"
