"""Client configurations in one place, so every producer and consumer of the platform agrees on them."""

from __future__ import annotations

import logging

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from onceflow.config import Settings

# librdkafka's own log lines go through Python logging (forwarded when a client is polled), not raw stderr.
CLIENT_LOG = logging.getLogger("onceflow.kafka.client")


def base(settings: Settings) -> dict:
    return {"bootstrap.servers": settings.bootstrap_servers, "log_level": 3, "logger": CLIENT_LOG} | security(settings)


def security(settings: Settings) -> dict:
    """librdkafka's settings for the cluster's security (onceflow.config.Settings.kafka_client_security)."""
    return settings.kafka_client_security()


def admin(settings: Settings, **extra) -> AdminClient:
    return AdminClient(base(settings) | extra)


def read_committed_consumer(settings: Settings, group_id: str | None = None, **extra) -> Consumer:
    """A consumer that sees committed data only; never commits on its own."""
    conf = {
        **base(settings),
        "group.id": group_id or settings.reader_group,
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        **extra,
    }
    return Consumer(conf)


def idempotent_producer(settings: Settings, **extra) -> Producer:
    return Producer({**base(settings), "enable.idempotence": True, "acks": "all", "linger.ms": 20, **extra})


def transactional_producer(settings: Settings, transactional_id: str, **extra) -> Producer:
    return Producer(
        {
            **base(settings),
            "transactional.id": transactional_id,
            "transaction.timeout.ms": settings.transaction_timeout_ms,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "message.max.bytes": 1_000_000,
            **extra,
        }
    )
