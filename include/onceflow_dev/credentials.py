"""The secured embedded stack's passwords: made at random, kept in var/kafka/credentials.json (0600).

This file is the stack's secret store, like an operator's vault: the stack reads it to create the SCRAM users and
to fill the Airflow connections (onceflow_dev.airflow_local); no other part of the platform reads or writes it.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

from onceflow.config import Settings
from onceflow.kafka import acls
from onceflow_dev.private_files import write_private


def path(settings: Settings) -> Path:
    return settings.var_dir / "kafka" / "credentials.json"


def ensure(settings: Settings) -> dict[str, str]:
    """username -> password for the admin and every role of `settings.app_id`, made once."""
    f = path(settings)
    known: dict[str, str] = json.loads(f.read_text()) if f.exists() else {}
    wanted = [acls.ADMIN, *(acls.username(settings, r) for r in acls.ROLES)]
    if all(u in known for u in wanted):
        return known
    known |= {u: secrets.token_urlsafe(18) for u in wanted if u not in known}
    write_private(f, json.dumps(known, indent=1))
    return known


def as_user(settings: Settings, user: str) -> Settings:
    return settings.replace(
        kafka_security_protocol="SASL_SSL", kafka_username=user, kafka_password=ensure(settings)[user]
    )


def as_role(settings: Settings, role: str) -> Settings:
    """`settings` authenticated as the app's principal for `role` (job, backfill, control, reconcile)."""
    return as_user(settings, acls.username(settings, role))


def as_admin(settings: Settings) -> Settings:
    return as_user(settings, acls.ADMIN)
