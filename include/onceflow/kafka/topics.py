"""The platform's topics, with explicit settings, created and checked through the admin API."""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka.admin import NewTopic

from onceflow.config import Settings
from onceflow.kafka import clients as kafka_clients

KEEP_FOREVER = "-1"
WEEK_MS = str(7 * 24 * 3600 * 1000)


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str]


def specs(settings: Settings) -> list[TopicSpec]:
    common = {
        "min.insync.replicas": str(settings.min_insync_replicas),
        "cleanup.policy": "delete",
        "unclean.leader.election.enable": "false",
    }
    return [
        # Stamped by the broker: the skew rule judges event times against the broker's clock, not the producer's
        # (a producer whose clock runs ahead would otherwise pass its own records); the stamp is stored, so
        # replays, backfills and reconciliation judge alike (docs/operations.md).
        # the source topic, then each named source's (App.sources)
        *(
            TopicSpec(
                t,
                settings.source_partitions,
                {**common, "retention.ms": WEEK_MS, "message.timestamp.type": "LogAppendTime"},
            )
            for t in settings.sources.values()
        ),
        # the sink topic, then each named output's (App.outputs)
        *(TopicSpec(t, settings.sink_partitions, {**common, "retention.ms": WEEK_MS}) for t in settings.sink_topics),
        # DLQ and ledger are the audit trail: kept until an operator decides otherwise.
        TopicSpec(settings.dlq_topic, 1, {**common, "retention.ms": KEEP_FOREVER}),
        # One partition: the ledger is one ordered history per app (key = app id).
        TopicSpec(settings.ledger_topic, 1, {**common, "retention.ms": KEEP_FOREVER}),
        TopicSpec(settings.events_topic, 1, {**common, "retention.ms": WEEK_MS}),
        # The job's own events (only its principal writes them: docs/security.md), kept like the shared ones.
        TopicSpec(settings.job_events_topic, 1, {**common, "retention.ms": WEEK_MS}),
        # Only state changes are written here: the alert record the console shows, and the dedup state.
        TopicSpec(settings.alerts_topic, 1, {**common, "retention.ms": str(90 * 24 * 3600 * 1000)}),
        TopicSpec(settings.health_topic, 1, {**common, "retention.ms": WEEK_MS}),
        # One record per reconciliation run: the proof the console shows.
        TopicSpec(settings.reconciliation_topic, 1, {**common, "retention.ms": str(90 * 24 * 3600 * 1000)}),
        # Backfilled windows, apart from the live sink by default (docs/backfill.md).
        TopicSpec(settings.backfill_topic, settings.sink_partitions, {**common, "retention.ms": WEEK_MS}),
    ]


def ensure(settings: Settings, timeout: float = 30.0) -> list[str]:
    """Create missing topics; return the names created. Existing topics are checked, not altered."""
    admin = kafka_clients.admin(settings)
    existing = admin.list_topics(timeout=timeout).topics
    todo = [
        NewTopic(s.name, num_partitions=s.partitions, replication_factor=settings.replication_factor, config=s.config)
        for s in specs(settings)
        if s.name not in existing
    ]
    created = []
    for name, fut in (admin.create_topics(todo, operation_timeout=timeout) if todo else {}).items():
        fut.result(timeout)
        created.append(name)
    # A topic just created can take a moment to appear in the metadata the check reads.
    deadline = time.monotonic() + timeout
    while True:
        problems = check(settings, timeout)
        if not problems or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    if problems:
        raise RuntimeError("topics exist with unexpected settings: " + "; ".join(problems))
    return created


def job_topics(settings: Settings) -> set[str]:
    """The topics the streaming job itself reads and writes (on a secured cluster, the only ones it may see)."""
    s = settings
    return {*s.source_topic_list, *s.sink_topics, s.dlq_topic, s.ledger_topic, s.job_events_topic}


def check(settings: Settings, timeout: float = 10.0, only: set[str] | None = None) -> list[str]:
    """Problems with the topics as they are on the cluster (missing, wrong partition count); [] when fine. `only`:
    the topics to check (a principal sees only the topics it has rights on)."""
    admin = kafka_clients.admin(settings)
    md = admin.list_topics(timeout=timeout).topics
    problems = []
    for s in specs(settings):
        if only is not None and s.name not in only:
            continue
        t = md.get(s.name)
        if t is None or t.error is not None:
            problems.append(
                f"topic {s.name} is missing: run `onceflow-dev stack up` (or create it with {s.partitions} partitions)"
            )
        elif len(t.partitions) != s.partitions and s.name not in settings.source_topic_list:
            problems.append(f"topic {s.name} has {len(t.partitions)} partitions, expected {s.partitions}")
    return problems
