"""The scheduled reconciliation chain: where it stands, and moving it only with a recorded proof.

Each scheduled `ip_count_reconciliation` run proves the ledger batches committed after the last batch the chain
proved, up to the newest one committed when it starts (at most ONCEFLOW_RECONCILE_MAX_BATCHES; the rest is the
next run's), whatever the timetable's data interval says. The chain's position is the committed offsets of its
own consumer group `onceflow.<app>.reconciliation` on the source topic (the end offsets of the last proven
batch, metadata {"batch", "run", "ts_ms"}), so `kafka-consumer-groups --describe` shows the records the job has
committed but the chain has not proven yet as that group's lag. A run's result record and the move of the
position are one Kafka transaction of the chain's own transactional id: the position moves if and only if the
proof is recorded, a failed run records its result and leaves the position where it was (the next run covers
those batches again), and a second chain run is fenced and re-checks the position before it commits, so no
batch is proven twice by the chain. Manual runs (by batch or time range) record their results beside it and do
not move it.
"""

from __future__ import annotations

import json
from pathlib import Path

from confluent_kafka import TopicPartition

from onceflow import wire
from onceflow.config import Settings
from onceflow.kafka import clients as kafka_clients
from onceflow.kafka import reading as kafka_reading
from onceflow.kafka.transactional import TransactionalWriter
from onceflow.rules import clock, names, sources
from onceflow.rules.reconciliation import (
    ChainPosition,
    Mode,
    ReconcileError,
    Result,
    Status,
    chain_metadata,
    chain_position,
)
from onceflow.rules.sources import SourcePartition

STATUS_TAIL = 2000  # reconciliation records read back for the status (the newest ones)


def home(settings: Settings) -> Path:
    return settings.var_dir / "reconciliation" / settings.app_id


def group_id(settings: Settings) -> str:
    return names.reconciliation_group(settings.app_id)


def transactional_id(settings: Settings) -> str:
    return names.reconciliation_transactional_id(settings.app_id)


def _partitions(settings: Settings) -> list[SourcePartition]:
    wm = kafka_reading.source_watermarks(settings)
    if wm is None:
        raise ReconcileError(f"a source topic of {', '.join(settings.source_topic_list)} does not exist")
    return sorted(wm)


def position(settings: Settings, consumer=None) -> ChainPosition:
    """The last batch the chain has proven: from its group's committed offsets, or, when the group holds nothing,
    from the newest chain result that moved it."""
    got = kafka_reading.group_offsets(settings, _partitions(settings), group=group_id(settings), consumer=consumer)
    pos = chain_position(meta for _, off, meta in got if off is not None)
    return pos if pos.batch is not None else position_from_results(settings)


def position_from_results(settings: Settings) -> ChainPosition:
    """The chain's position as its own records say: the newest chain result that proved batches (each was committed
    in one transaction with the move of the group's offsets). Kafka deletes the group's offsets
    `offsets.retention.minutes` after its last commit; a chain that trusted only them would start again at the
    ledger's first batch, need source records retention has deleted, and fail every run (protocol review N-3). The
    results are kept 90 days: a chain idle longer starts from the first batch the ledger still proves."""
    for r in reversed(recent_results(settings, limit=None)):
        if r.get("mode") == Mode.CHAIN and r.get("ok") and r.get("last_batch") is not None:
            return ChainPosition(int(r["last_batch"]), r.get("run_id"), r.get("finished_ms"))
    return ChainPosition()


def commit(settings: Settings, res: Result) -> dict:
    """Record a chain run's result, and, if it proved batches, move the position to its last batch in the same
    transaction. Fences every other chain run first (the chain's transactional id), then checks that the position
    is still the one this run started from: otherwise another run proved these batches already, and this result is
    not recorded as the chain's."""
    if res.mode != Mode.CHAIN:
        raise ValueError("only chain runs move the chain")
    tid = transactional_id(settings)
    writer = TransactionalWriter(
        lambda: kafka_clients.transactional_producer(settings, tid),
        tid,
        settings.transaction_timeout_ms,
        commit_timeout_s=settings.commit_timeout_s,
    )
    consumer = kafka_clients.read_committed_consumer(settings, group_id=group_id(settings))
    try:
        now = position(settings, consumer)
        if now.batch != res.proven_before:
            raise ReconcileError(
                f"the chain moved while this run ran (it started after batch {res.proven_before}, "
                f"the chain is now at {now.batch}, proven by run {now.run_id}): another chain run "
                f"proved these batches; this result is not recorded as the chain's"
            )
        moves = res.ok and res.last_batch is not None
        with writer.transaction():
            writer.produce(
                settings.reconciliation_topic,
                settings.app_id.encode(),
                json.dumps(res.as_dict()).encode(),
                [(wire.H_APP, settings.app_id.encode()), (wire.H_KIND, b"reconciliation")],
            )
            if moves:
                assert res.last_batch is not None  # `moves` says so
                meta = chain_metadata(res.last_batch, res.run_id, clock.now_ms())
                ends = sources.keyed_from_json(
                    res.coverage["end_offsets"], res.coverage.get("end_topic") or settings.source_topic
                )
                writer.send_offsets(
                    [TopicPartition(p.topic, p.partition, int(ends[p]), meta) for p in sorted(ends)],
                    consumer.consumer_group_metadata(),
                )
        return {"chain_moved": moves, "proven_through": res.last_batch if moves else now.batch}
    finally:
        consumer.close()
        writer.close()


def recent_results(settings: Settings, limit: int | None = STATUS_TAIL) -> list[dict]:
    """The app's newest reconciliation results (chain and manual), oldest first, from the last `limit` records
    of the reconciliation topic (a bounded read; None: all it holds)."""
    wm = kafka_reading.watermarks(settings, settings.reconciliation_topic)
    if not wm:
        return []
    low, high = wm[0]
    c = kafka_clients.read_committed_consumer(settings)
    key = settings.app_id.encode()
    out = []
    try:
        first = low if limit is None else max(low, high - limit)
        for m in kafka_reading.read_range(c, settings.reconciliation_topic, 0, first, high):
            if m.key() != key or m.value() is None:
                continue
            try:
                out.append(json.loads(m.value()))
            except ValueError:
                continue
    finally:
        c.close()
    return out


def status(settings: Settings, newest_batch: int | None) -> dict:
    """Which committed batches are proven, pending or failed. `newest_batch`: the job's newest committed batch."""
    pos = position(settings)
    proven = pos.batch
    runs = recent_results(settings)
    failed: list[list[int]] = []
    for r in runs:
        if (
            r.get("mode") == Mode.CHAIN
            and not r.get("ok")
            and r.get("first_batch") is not None
            and (proven is None or r["first_batch"] > proven)
        ):
            failed.append([r["first_batch"], r["last_batch"]])
    failed = _merge(failed)
    pending = []
    lo = 0 if proven is None else proven + 1
    if newest_batch is not None and newest_batch >= lo:
        cur = lo
        for a, b in failed:
            if a > cur:
                pending.append([cur, min(a - 1, newest_batch)])
            cur = max(cur, b + 1)
        if cur <= newest_batch:
            pending.append([cur, newest_batch])
    last = next((r for r in reversed(runs) if r.get("mode") == Mode.CHAIN), None)
    return {
        "app": settings.app_id,
        "proven_through": proven,
        "proven_by_run": pos.run_id,
        "proven_at_ms": pos.ts_ms,
        "newest_committed_batch": newest_batch,
        "pending": [p for p in pending if p[0] <= p[1]],
        "failed": failed,
        "last_chain_run": _brief(last) if last else None,
        "recent_runs": [_brief(r) for r in runs[-10:]],
    }


def _merge(ranges: list[list[int]]) -> list[list[int]]:
    out: list[list[int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _brief(r: dict) -> dict:
    return {
        "run_id": r.get("run_id"),
        "mode": r.get("mode", "manual"),
        "verdict": r.get("verdict"),
        "batches": [r.get("first_batch"), r.get("last_batch")],
        "finished_ms": r.get("finished_ms"),
        "failed_checks": [c["name"] for c in r.get("checks", []) if c.get("status") == Status.FAIL],
    }
