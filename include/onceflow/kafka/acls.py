"""Who may do what on a secured cluster: the principals of one app and their ACLs, declared once.

Each role of the platform authenticates as its own principal, `User:onceflow.<app>.<role>`, and is allowed
exactly what its code does (docs/security.md lists the same table, rendered by `commands`):

- job: reads the source, writes sink, DLQ and ledger inside its own transactional id, commits the source offsets
  to its own group, is the only writer of its job events topic (and reads the ledger and its events back on start).
- backfill: reads the source and the ledger, writes its target topics and the ledger, with its own
  transactional-id prefix and group prefix, and its events on the shared events topic.
- control (the Airflow DAGs and the console): describes everything of the app, reads the ledger, both events
  topics, sink, DLQ and reconciliation results, writes alerts, health and the shared events topic.
- reconcile: reads everything it proves; writes nothing but its own results (the reconciliation topic, in its
  own transactional id, with its own group).

Only the job may write the job events topic: the job's facts (wire.JOB_EVENTS: a batch committed, progress, a
transaction timed out) that deploy, health, the reconciliation, the transaction watch and the console trust are
read from there only (onceflow.kafka.events.read), so no other principal, and no other app's job, can forge them.

Pure data: onceflow.kafka.security applies it (users and ACL bindings) and checks a principal's rights.
"""

from __future__ import annotations

from dataclasses import dataclass

from onceflow.config import Settings
from onceflow.rules import names

ROLES = ("job", "backfill", "control", "reconcile")
ADMIN = "onceflow-admin"  # the embedded stack's super user: creates topics, users and ACLs, never runs the job


@dataclass(frozen=True)
class Acl:
    """ALLOW `operation` on a resource for a principal (Kafka's implied rights apply: WRITE and READ include
    DESCRIBE)."""

    principal: str  # User:<name>
    resource: str  # TOPIC, GROUP, TRANSACTIONAL_ID, CLUSTER
    name: str
    pattern: str  # LITERAL or PREFIXED
    operation: str  # READ, WRITE, DESCRIBE, DESCRIBE_CONFIGS

    def __str__(self) -> str:
        what = "prefix" if self.pattern == "PREFIXED" else ""
        return f"{self.operation} on {self.resource} {what}{' ' if what else ''}{self.name!r} for {self.principal}"

    def command(self, bootstrap: str = "<bootstrap>") -> str:
        """The kafka-acls.sh command that grants it (for operators who run their own cluster)."""
        flag = {
            "TOPIC": f"--topic {self.name}",
            "GROUP": f"--group {self.name}",
            "TRANSACTIONAL_ID": f"--transactional-id {self.name}",
            "CLUSTER": "--cluster",
        }[self.resource]
        pattern = " --resource-pattern-type prefixed" if self.pattern == "PREFIXED" else ""
        op = "".join(w.capitalize() for w in self.operation.split("_"))
        return (
            f"kafka-acls.sh --bootstrap-server {bootstrap} --command-config admin.properties --add "
            f"--allow-principal {self.principal} --operation {op} {flag}{pattern}"
        )


def username(settings: Settings, role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; one of {ROLES}")
    return names.username(settings.app_id, role)


def principal(settings: Settings, role: str) -> str:
    return f"User:{username(settings, role)}"


def required(settings: Settings, role: str) -> list[Acl]:
    """The ACLs of one role of the app `settings.app_id`: no more than its code uses."""
    s, app, who = settings, settings.app_id, principal(settings, role)

    def topic(name: str, op: str) -> Acl:
        return Acl(who, "TOPIC", name, "LITERAL", op)

    def group(name: str, pattern: str = "LITERAL", op: str = "READ") -> Acl:
        return Acl(who, "GROUP", name, pattern, op)

    def txn(name: str, pattern: str = "LITERAL", op: str = "WRITE") -> Acl:
        return Acl(who, "TRANSACTIONAL_ID", name, pattern, op)

    # every role reads committed data with a consumer that never commits (onceflow.kafka.clients); Spark's
    # source consumers are named from the same prefix
    reader = [group(names.reader_group(app)), group(names.spark_group_prefix(app), "PREFIXED")]
    configs = Acl(who, "CLUSTER", "kafka-cluster", "LITERAL", "DESCRIBE_CONFIGS")  # transaction.max.timeout.ms
    if role == "job":
        return [
            *(topic(t, "READ") for t in s.source_topic_list),
            # the sink topic and every named output's (App.outputs)
            *(topic(t, "WRITE") for t in (*s.sink_topics, s.dlq_topic, s.ledger_topic, s.job_events_topic)),
            # the shared events: the savepoint and restore events of deploy's upgrade and restore, which run as the job
            topic(s.events_topic, "WRITE"),
            topic(s.ledger_topic, "READ"),
            # deploy's preflight: a batch committed recently by a driver elsewhere is another live instance
            topic(s.job_events_topic, "READ"),
            topic(s.dlq_topic, "DESCRIBE_CONFIGS"),  # preflight: a DLQ copy fits the topic's record limit
            # preflight: who stamps the source's records
            *(topic(t, "DESCRIBE_CONFIGS") for t in s.source_topic_list),
            group(names.group_id(app)),
            group(names.ledger_group(app)),
            *reader,
            txn(names.transactional_id(app)),
            configs,
        ]
    if role == "backfill":
        return [
            *(topic(t, "READ") for t in s.source_topic_list),
            topic(s.ledger_topic, "READ"),
            topic(s.ledger_topic, "WRITE"),
            topic(s.backfill_topic, "WRITE"),
            topic(s.backfill_topic, "READ"),
            topic(s.events_topic, "WRITE"),
            group(names.backfill_prefix(app), "PREFIXED"),
            *reader,
            txn(names.backfill_prefix(app), "PREFIXED"),
            configs,
        ]
    if role == "control":
        return [
            *(
                topic(t, "READ")
                for t in (
                    *s.source_topic_list,
                    *s.sink_topics,
                    s.dlq_topic,
                    s.ledger_topic,
                    s.events_topic,
                    s.job_events_topic,
                    s.alerts_topic,
                    s.health_topic,
                    s.reconciliation_topic,
                    s.backfill_topic,
                )
            ),
            *(topic(t, "WRITE") for t in (s.alerts_topic, s.health_topic, s.events_topic)),
            group(names.group_id(app), op="DESCRIBE"),
            group(names.reconciliation_group(app), op="DESCRIBE"),  # the console's proofs: the chain's position
            group(names.txn_watch_group(app)),
            *reader,
            configs,
        ]
    if role == "reconcile":
        return [
            *(
                topic(t, "READ")
                # the job's events: Spark's own count of rows dropped as late, which the late rule is checked against
                for t in (
                    *s.source_topic_list,
                    *s.sink_topics,
                    s.dlq_topic,
                    s.ledger_topic,
                    s.job_events_topic,
                    s.reconciliation_topic,
                )
            ),
            topic(s.reconciliation_topic, "WRITE"),
            group(names.group_id(app), op="DESCRIBE"),
            group(names.reconciliation_group(app)),
            *reader,
            txn(names.reconciliation_transactional_id(app)),
            configs,
        ]
    raise ValueError(f"unknown role {role!r}; one of {ROLES}")


def all_required(settings: Settings) -> list[Acl]:
    return [a for role in ROLES for a in required(settings, role)]


def commands(settings: Settings) -> list[str]:
    """kafka-acls.sh commands granting every role of the app its rights."""
    return [a.command(settings.bootstrap_servers) for a in all_required(settings)]
