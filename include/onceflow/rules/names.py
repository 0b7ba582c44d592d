"""Every Kafka name of an app, built in one place: its topics, consumer groups, transactional ids and principals.

The settings (onceflow.config) default an app's topics from here, the clients, the backfill, the reconciliation
chain and the transaction watch take their group and transactional ids from here, and the ACLs
(onceflow.kafka.acls) grant exactly these names, so a name can never differ between the code that uses it and
the right that allows it. Pure: strings in, strings out.

An app `<app>` (its instance id, Settings.app_id) owns:

- topics `<app>_source`, `<app>_sink`, `<app>_dlq`, `<app>_ledger`, `<app>_events` (the job's own facts) and
  `<app>_backfill` (defaults: a setting may name another topic), and one per named output of its app,
  `<sink topic>-<output>` (onceflow.config.Settings.outputs: '-' is neither '.' nor '_', so it folds onto no other
  name of the app);
- the job's transactional id and group `onceflow.<app>` (a restarted job fences its predecessor by reusing it);
- `onceflow.<app>.ledger` (the job reading its ledger back), `onceflow.<app>.reconciliation` (the chain's
  position and its transactional id), `onceflow.<app>.backfill.<id>` (a backfill's transactional id and group);
- `onceflow.reader.<app>` for read_committed consumers that never commit, and Spark's source consumers under
  `onceflow.reader.<app>.spark`;
- principals `onceflow.<app>.<role>` (job, backfill, control, reconcile).

Its control plane's DAGs are `<app>_<kind>` (deploy, health, txn_watch, checkpoint_rotation, reconciliation,
backfill).

The topics every app shares (savepoints and restores, alerts, health, reconciliation results) are platform-wide:
`onceflow_events`, `onceflow_alerts`, `onceflow_health`, `onceflow_reconciliation`.

A run of the development tools or tests (the bench, chaos, the soak, a test's app) takes a private topic set
instead (private_topics): `<app>.<suffix>` for every topic setting, the shared ones too, so it never touches the
platform-wide topics. Kafka takes '.' and '_' for one character when it checks a new topic's name for a collision;
no suffix holds either and an app id holds no '.', so no two app ids' private sets collide (`x.job_events` would
have collided with app `x_job`'s `x_job.events`). An app id's private set folds onto its own defaults (`x.source`
and `x_source`): a cluster holds one or the other.
"""

from __future__ import annotations

PREFIX = "onceflow"

# an app's own topics: the setting's field -> the suffix of its default name
APP_TOPICS = {
    "source_topic": "source",
    "sink_topic": "sink",
    "dlq_topic": "dlq",
    "ledger_topic": "ledger",
    "job_events_topic": "events",
    "backfill_topic": "backfill",
}
SHARED_TOPICS = {
    "events_topic": f"{PREFIX}_events",
    "alerts_topic": f"{PREFIX}_alerts",
    "health_topic": f"{PREFIX}_health",
    "reconciliation_topic": f"{PREFIX}_reconciliation",
}


# a run's private topics (private_topics): every topic setting's field -> its suffix. No suffix holds '.' or '_'
# (Kafka's collision check takes them for one character), hence `job-events`.
PRIVATE_TOPICS = {
    "source_topic": "source",
    "sink_topic": "sink",
    "dlq_topic": "dlq",
    "ledger_topic": "ledger",
    "job_events_topic": "job-events",
    "backfill_topic": "backfill",
    "events_topic": "events",
    "alerts_topic": "alerts",
    "health_topic": "health",
    "reconciliation_topic": "recon",
}


def kafka_collision_key(topic: str) -> str:
    """A topic's name as Kafka compares it when it creates one: '.' and '_' are one character, so two names with
    the same key cannot both exist on a cluster."""
    return topic.replace(".", "_")


def private_topics(app: str) -> dict[str, str]:
    """A run's own topic set for app `app`, as settings (Settings.replace(**private_topics(app))): every topic
    setting, the shared ones too, named `<app>.<suffix>`; no two app ids' sets collide as Kafka compares names."""
    return {field: f"{app}.{suffix}" for field, suffix in PRIVATE_TOPICS.items()}


def app_topic(app: str, field: str) -> str:
    """The default topic of an app's topic setting `field` (one of APP_TOPICS)."""
    return f"{app}_{APP_TOPICS[field]}"


def transactional_id(app: str) -> str:
    """Stable per app: a restarted job fences its predecessor (zombie fencing)."""
    return f"{PREFIX}.{app}"


def group_id(app: str) -> str:
    """The consumer group whose committed offsets are the job's true position."""
    return f"{PREFIX}.{app}"


def ledger_group(app: str) -> str:
    """The job's consumer of its own ledger (read back on start and for a replay)."""
    return f"{group_id(app)}.ledger"


def reader_group(app: str) -> str:
    """Every read_committed consumer of the app that never commits."""
    return f"{PREFIX}.reader.{app}"


def spark_group_prefix(app: str) -> str:
    """Spark's Kafka source names its consumers' groups under this prefix."""
    return f"{reader_group(app)}.spark"


def reconciliation_group(app: str) -> str:
    """The scheduled reconciliation chain's position: the source offsets it has proven."""
    return f"{group_id(app)}.reconciliation"


def reconciliation_transactional_id(app: str) -> str:
    return f"{transactional_id(app)}.reconciliation"


def backfill_prefix(app: str) -> str:
    """Every backfill's transactional id and group start with this (the ACLs grant the prefix)."""
    return f"{transactional_id(app)}.backfill."


def backfill_transactional_id(app: str, backfill_id: str) -> str:
    """One backfill's own transactional id: never the live job's, so neither fences the other."""
    return f"{backfill_prefix(app)}{backfill_id}"


def backfill_group(app: str, backfill_id: str) -> str:
    """One backfill's consumer group, under the same prefix as its transactional id."""
    return f"{backfill_prefix(app)}{backfill_id}"


def txn_watch_group(app: str) -> str:
    return f"{PREFIX}.txn_watch.{app}"


def dag_id(app: str, kind: str) -> str:
    """The control plane's DAG of that kind (deploy, health, ...) for the app instance (dags/onceflow_<kind>.py)."""
    return f"{app}_{kind}"


def username(app: str, role: str) -> str:
    """The principal's name of one role of the app (onceflow.kafka.acls.ROLES)."""
    return f"{PREFIX}.{app}.{role}"


def connection_id(base: str, app: str, role: str, own: bool) -> str:
    """The Airflow connection with the Kafka credentials of one role of app instance `app` (`base`:
    ONCEFLOW_KAFKA_CONN_ID, which also holds the endpoint). The environment's own instance (`own`): `base` for the
    control plane, `<base>_<role>` for the others; any other instance of the control plane (ONCEFLOW_APPS):
    `<base>_<app>` and `<base>_<app>_<role>`, since each instance has principals of its own."""
    scope = base if own else f"{base}_{app}"
    return scope if role == "control" else f"{scope}_{role}"


# The PostgreSQL sink (onceflow.database): each app instance has a schema of its own, named by its app id (quoted:
# an id may hold '-'), holding its results, its DLQ, its ledger and its writer row (the fencing generation); its
# roles are granted that schema only.
DB_TABLES = ("results", "dlq", "ledger", "writer")


def db_schema(app: str) -> str:
    return app


def db_role(app: str, purpose: str) -> str:
    """The database role of one purpose of the app instance: `job` writes its tables, `reader` reads them."""
    return f"{PREFIX}_{app}_{purpose}"


# Which database role each of an app's Kafka roles (onceflow.kafka.acls.ROLES) uses when its sink is a table: the job
# writes; the control plane (the console, health) and the reconciliation read; a backfill writes to Kafka only.
DB_PURPOSE_OF_ROLE = {"job": "job", "control": "reader", "reconcile": "reader"}


def db_connection_id(app: str, purpose: str) -> str:
    """The Airflow connection (type postgres) with the database role of one purpose of app instance `app`."""
    return f"{PREFIX}_postgres_{app}_{purpose}"
