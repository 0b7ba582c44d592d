"""A secured cluster's principals and ACLs for one app, applied by an admin; and what a principal is missing.

`provision` (run as a super user: the embedded stack's admin, or an operator's) creates the SCRAM users of the
app's roles and the ACLs onceflow.kafka.acls declares. `missing` is what preflight asks before anything is
written: the ACLs a role needs on topics and groups that the cluster says this principal does not have, each
named with the command that grants it.
"""

from __future__ import annotations

import logging

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialUpsertion,
)

from onceflow.config import Settings
from onceflow.kafka import acls
from onceflow.kafka import clients as kafka_clients

log = logging.getLogger(__name__)
SCRAM_ITERATIONS = 8192


def binding(a: acls.Acl) -> AclBinding:
    return AclBinding(
        ResourceType[a.resource if a.resource != "CLUSTER" else "BROKER"],
        a.name,
        ResourcePatternType[a.pattern],
        a.principal,
        "*",
        AclOperation[a.operation],
        AclPermissionType.ALLOW,
    )


def provision(admin_settings: Settings, app: Settings, passwords: dict[str, str], timeout: float = 30.0) -> dict:
    """Create (or reset) the SCRAM users of `app`'s roles with `passwords` (role -> password) and grant their ACLs.
    Idempotent: Kafka keeps one copy of an ACL however often it is created."""
    admin = kafka_clients.admin(admin_settings)
    mech = ScramMechanism[admin_settings.kafka_sasl_mechanism.replace("-", "_")]
    upserts: list[UserScramCredentialAlteration] = [
        UserScramCredentialUpsertion(acls.username(app, role), ScramCredentialInfo(mech, SCRAM_ITERATIONS), pw.encode())
        for role, pw in passwords.items()
    ]
    for _, fut in admin.alter_user_scram_credentials(upserts, request_timeout=timeout).items():
        fut.result()
    wanted = acls.all_required(app)
    for _, fut in admin.create_acls([binding(a) for a in wanted], request_timeout=timeout).items():
        fut.result()
    log.info("provisioned %d users and %d ACLs for app %s", len(upserts), len(wanted), app.app_id)
    return {"users": [acls.username(app, role) for role in passwords], "acls": len(wanted)}


def missing(settings: Settings, role: str, timeout: float = 15.0) -> list[acls.Acl]:
    """The ACLs of `role` on the app's topics that the connected principal lacks (the cluster's own answer: the
    authorized operations DescribeTopics returns). The cluster's own operations are only described to a principal
    allowed DESCRIBE on it, which no role needs: preflight's describe-configs call checks DESCRIBE_CONFIGS by using
    it. Groups and transactional ids are not described this way; their refusals come at first use, named there."""
    from confluent_kafka import TopicCollection

    admin = kafka_clients.admin(settings)
    need = acls.required(settings, role)
    topics = sorted({a.name for a in need if a.resource == "TOPIC"})
    have: dict[tuple[str, str], set[str]] = {}
    for name, fut in admin.describe_topics(
        TopicCollection(topics), include_authorized_operations=True, request_timeout=timeout
    ).items():
        try:
            desc = fut.result()
            have[("TOPIC", name)] = {op.name for op in (desc.authorized_operations or [])}
        except KafkaException:
            have[("TOPIC", name)] = set()  # not authorized to describe it (or it does not exist: topics.check says)
    out = []
    for a in need:
        ops = have.get((a.resource, a.name))
        if ops is None:
            continue
        if a.operation not in ops and "ALL" not in ops:
            out.append(a)
    return out
