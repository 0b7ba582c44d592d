"""Operational events (topic `onceflow_events`) and the job's status file.

Events are JSON: {"type", "app", "ts_ms", "host", "pid", ...}. They go out on an idempotent, non-transactional
producer so that they are visible even when the batch transaction they describe is aborted.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from onceflow.config import Settings
from onceflow.kafka import clients as kafka_clients

log = logging.getLogger("onceflow.events")

# The event types are part of the wire contract: onceflow.wire.


class EventBus:
    def __init__(self, settings: Settings, producer=None):
        self.settings = settings
        self._producer = producer if producer is not None else kafka_clients.idempotent_producer(settings)
        self._host = socket.gethostname()
        self._lock = threading.Lock()

    def emit(self, type_: str, level: int = logging.INFO, flush: bool = False, **fields: Any) -> dict:
        event = {
            "type": type_,
            "app": self.settings.app_id,
            "ts_ms": int(time.time() * 1000),
            "host": self._host,
            "pid": os.getpid(),
            **fields,
        }
        log.log(level, "%s %s", type_, json.dumps(fields, default=str, sort_keys=True))
        with self._lock:
            try:
                self._producer.produce(
                    self.settings.events_topic,
                    key=self.settings.app_id.encode(),
                    value=json.dumps(event, default=str).encode(),
                )
                self._producer.poll(0)
                if flush:
                    self._producer.flush(10)
            except Exception as e:  # events are best effort; the data path never fails because of them
                log.warning("could not publish event %s: %s", type_, e)
        return event

    def close(self) -> None:
        self._producer.flush(10)
        self._producer.close()


def write_status(path: Path, status: dict) -> None:
    """Atomically replace the status file `onceflow job status --json` reads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(status, default=str, indent=1, sort_keys=True))
    tmp.replace(path)


def read_status(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
