"""Alerts: what is wrong, deduplicated while it persists, announced again when it resolves.

A condition is identified by a key (e.g. `health:ip_count:stalled`). `transitions()` (pure) compares the
conditions found now with the last known state per key and returns what to send: FIRING for a new condition,
RESOLVED for one that went away, nothing while a condition persists. One-off conditions (a transaction
timeout event) fire once and carry no resolution. Every transition is appended to the alerts topic, which is
also where the last state is read back from: the topic is the alert record the console shows.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import cast

from onceflow.kafka import clients as kafka_clients
from onceflow.kafka.reading import read_topic
from onceflow.rules import clock, json_records

log = logging.getLogger(__name__)


class Status(StrEnum):
    FIRING = "firing"
    RESOLVED = "resolved"


class Severity(StrEnum):
    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"


@dataclass(frozen=True)
class Condition:
    key: str
    severity: str
    summary: str
    action: str
    details: dict = field(default_factory=dict)
    one_off: bool = False  # an event, not a state: fires once, never resolves


@dataclass(frozen=True)
class Alert:
    key: str
    status: str
    severity: str
    summary: str
    action: str
    app: str
    source: str  # which check raised it (health, txn_watch, ...)
    ts_ms: int
    details: dict = field(default_factory=dict)
    one_off: bool = False

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, default=str).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Alert:
        return json_records.from_json(cls, json.loads(raw))

    def text(self) -> str:
        head = f"[{self.severity.upper()} {self.status.upper()}] {self.app}: {self.summary}"
        return head if self.status == Status.RESOLVED else f"{head}\nWhat to do: {self.action}"


def transitions(
    current: Iterable[Condition],
    last_state: Mapping[str, str],
    app: str,
    source: str,
    scope_prefix: str,
    now_ms: int | None = None,
) -> list[Alert]:
    """What to send now. `last_state`: key -> FIRING/RESOLVED/ONCE as last recorded. Only keys starting with
    `scope_prefix` can be resolved by this call: each check resolves only its own conditions."""
    now_ms = now_ms or clock.now_ms()
    out: list[Alert] = []
    seen = set()
    for c in current:
        if c.key in seen:  # the same condition twice in one evaluation is one alert
            continue
        seen.add(c.key)
        if c.one_off and c.key in last_state:
            continue
        if last_state.get(c.key) != Status.FIRING:
            out.append(
                Alert(c.key, Status.FIRING, c.severity, c.summary, c.action, app, source, now_ms, c.details, c.one_off)
            )
    for key, status in sorted(last_state.items()):
        if status == Status.FIRING and key not in seen and key.startswith(scope_prefix):
            out.append(Alert(key, Status.RESOLVED, Severity.INFO, f"resolved: {key}", "nothing", app, source, now_ms))
    return out


ONCE = "once"


def fold_state(history: Iterable[Alert]) -> dict[str, str]:
    """The last status per key from the alert record (oldest first); one-off alerts fold to ONCE."""
    state: dict[str, str] = {}
    for a in history:
        state[a.key] = ONCE if a.one_off else a.status
    return state


class AlertSink:
    """Records alerts on the alerts topic and hands them to notifiers (callables taking an Alert)."""

    def __init__(self, settings, notifiers: Sequence = ()):
        self.s = settings
        self.notifiers = list(notifiers)

    def history(self) -> list[Alert]:
        return [
            Alert.from_json(cast(bytes, m.value))
            for m in read_topic(self.s, self.s.alerts_topic)
            if m.key == self.s.app_id.encode()
        ]  # onceflow's alert records always carry a value

    def state(self) -> dict[str, str]:
        return fold_state(self.history())

    def publish(self, alerts: Sequence[Alert]) -> list[Alert]:
        if not alerts:
            return []
        p = kafka_clients.idempotent_producer(self.s)
        for a in alerts:
            p.produce(self.s.alerts_topic, key=self.s.app_id.encode(), value=a.to_json())
        if p.flush(30):
            raise RuntimeError("alerts could not be recorded on the alerts topic")
        for a in alerts:
            log.warning("alert %s", a.text().replace("\n", " | "))
            for n in self.notifiers:
                try:
                    n(a)
                except Exception as e:  # one broken channel must not hide the alert from the others
                    log.error("notifier %s failed for %s: %s", n, a.key, e)
        return list(alerts)

    def raise_and_resolve(self, conditions: Sequence[Condition], source: str, scope_prefix: str) -> list[Alert]:
        return self.publish(transitions(conditions, self.state(), self.s.app_id, source, scope_prefix))
