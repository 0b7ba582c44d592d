"""The cluster as the platform sees it: its brokers, which broker leads each partition of the platform's topics
(and which replicas are in sync), and which broker coordinates the app's transactions and its consumer group."""

from __future__ import annotations

from typing import Any

from onceflow.config import Settings
from onceflow.kafka import clients as kafka_clients
from onceflow.kafka import topics

TRANSACTION_STATE = "__transaction_state"
CONSUMER_OFFSETS = "__consumer_offsets"


def java_string_hash(s: str) -> int:
    """Java's String.hashCode (over UTF-16 code units), as a signed 32-bit int."""
    h = 0
    for unit in s.encode("utf-16-be").hex(" ", 2).split():
        h = (31 * h + int(unit, 16)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def coordinator_partition(key: str, partitions: int) -> int:
    """The partition of __transaction_state (a transactional id) or __consumer_offsets (a group id) that holds
    `key`: Kafka's Utils.abs(key.hashCode) % partitions. Its leader is the key's coordinator."""
    h = java_string_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def describe(settings: Settings, timeout: float = 10.0) -> dict[str, Any]:
    """Brokers, leaders and in-sync replicas of the platform's topics, and the coordinators of the app's
    transactional id and consumer group (the brokers a kill must hit to test their failover)."""
    md = kafka_clients.admin(settings).list_topics(timeout=timeout)
    brokers = {b.id: f"{b.host}:{b.port}" for b in md.brokers.values()}
    names = [t.name for t in topics.specs(settings)]
    out_topics = {}
    for name in names:
        t = md.topics.get(name)
        if t is None or t.error is not None:
            continue
        out_topics[name] = {
            str(p.id): {"leader": p.leader, "replicas": list(p.replicas), "in_sync": list(p.isrs)}
            for p in sorted(t.partitions.values(), key=lambda p: p.id)
        }

    def coordinator(topic: str, key: str) -> dict[str, Any] | None:
        t = md.topics.get(topic)
        if t is None or not t.partitions:
            return None
        part = coordinator_partition(key, len(t.partitions))
        return {"key": key, "partition": part, "broker": t.partitions[part].leader}

    return {
        "brokers": {str(k): v for k, v in sorted(brokers.items())},
        "controller": md.controller_id,
        "topics": out_topics,
        "transaction_coordinator": coordinator(TRANSACTION_STATE, settings.transactional_id),
        "group_coordinator": coordinator(CONSUMER_OFFSETS, settings.group_id),
    }
