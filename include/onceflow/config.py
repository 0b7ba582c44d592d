"""One typed place for every setting: defaults for the embedded stack, overrides from the environment.

The settings come in sections (SECTIONS: the Kafka cluster and its credentials, topics, the job, Spark, the result
sink, savepoints, supervision, the control plane, the embedded stack), each a frozen dataclass whose field types
carry their own rules (a Range, a Literal's choices, a Secret); `Settings` is all of them in one flat record.

The CLI, the streaming job, the supervisor, the batch jobs and the DAGs all call `load()`. Every field can be
overridden by an environment variable `ONCEFLOW_<FIELD>` (upper case), e.g. `ONCEFLOW_BOOTSTRAP_SERVERS`; the
declared app's own settings (`APP_SETTINGS`) are the defaults under the environment's, and one instance of several
takes its own from `ONCEFLOW__<INSTANCE>__<FIELD>` (instance_values). Values are validated on
load, so a misconfiguration fails before anything starts, with the setting to change. The reference of every
setting is generated from this module (docs/configuration.md, `make docs`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin, get_type_hints

from onceflow.app import registry
from onceflow.app.declaration import MAIN_OUTPUT, MAIN_SOURCE, App, AppError
from onceflow.rules import names
from onceflow.wire import OnceflowError

ENV_PREFIX = "ONCEFLOW_"
NODE_PORT_STEP = 10  # the embedded stack's node i listens on the first node's ports + 10 * (i - 1)
STANDALONE_SCHEME = "spark://"  # a Spark standalone master's URL; its executors run outside the driver's process
# Where the package sits: a source checkout's root (include/onceflow), else the directory holding site-packages
REPO_ROOT = Path(__file__).resolve().parents[2]


def in_checkout() -> bool:
    """The package runs from a source checkout (an editable install: `make`, the tests), not from a wheel."""
    return (REPO_ROOT / "pyproject.toml").is_file() and (REPO_ROOT / "include" / "onceflow").is_dir()


def _default_var_dir() -> Path:
    """Runtime state, when ONCEFLOW_VAR_DIR is unset: `var/` in a checkout (git-ignored); installed from a wheel,
    the user's state directory (XDG), never beside site-packages."""
    if in_checkout():
        return REPO_ROOT / "var"
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "onceflow"


def _default_jvm_dir() -> Path:
    """Resolved jars: a cache, shared by every var dir (of a checkout, or of the user)."""
    if in_checkout():
        return REPO_ROOT / "var" / "jvm"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "onceflow" / "jvm"


class ConfigError(OnceflowError, ValueError):
    """A setting is invalid; the message says which one and what to change."""


# ---------------------------------------------------------------------------- what one setting may hold
# A setting's own rule (its range, its choices, that it is secret) is part of its type, so `load` checks it for
# every field alike and the reference shows it; `Settings.validate` keeps only the rules between settings.
@dataclass(frozen=True)
class Range:
    """Bounds of a number setting; None: unbounded on that side."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False  # the bound itself is outside the range (> rather than >=)
    high_open: bool = False

    def holds(self, v: float) -> bool:
        above = self.low is None or (v > self.low if self.low_open else v >= self.low)
        below = self.high is None or (v < self.high if self.high_open else v <= self.high)
        return above and below

    def text(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"


class Secret:
    """Marks a setting never written anywhere: as_dict() redacts it, repr() leaves it out; it reaches a child
    process only in its environment (as_env)."""


POSITIVE = Range(low=0, low_open=True)
NOT_NEGATIVE = Range(low=0)
PosInt = Annotated[int, POSITIVE]
PosFloat = Annotated[float, POSITIVE]
NonNegInt = Annotated[int, NOT_NEGATIVE]
NonNegFloat = Annotated[float, NOT_NEGATIVE]
Fraction = Annotated[float, Range(low=0, high=1, low_open=True, high_open=True)]
Port = Annotated[int, Range(low=1, high=65535)]
SecretStr = Annotated[str, Secret]


# ---------------------------------------------------------------------------- the settings, by section
# Each section is a typed class of its own (Settings.section gives one); Settings is all of them in one flat record.
# A dataclass takes its bases' fields from the last base to the first, hence the bases listed last section first.
@dataclass(frozen=True)
class Runtime:
    """Where runtime state lives (git-ignored)."""

    var_dir: Path = _default_var_dir()
    # Resolved JVM artifacts (Kafka broker, Spark connector): shared by every var_dir (a checkout's var/jvm;
    # installed from a wheel: $XDG_CACHE_HOME/onceflow/jvm).
    jvm_dir: Path = _default_jvm_dir()


@dataclass(frozen=True)
class KafkaCluster:
    """Kafka: the cluster and how each client reaches it (its security: docs/security.md)."""

    bootstrap_servers: str = "127.0.0.1:9092"
    # PLAINTEXT (the embedded default) or SASL_SSL: SCRAM over TLS, every client authenticated as its role's
    # principal (onceflow.kafka.acls), the brokers' certificates checked against kafka_ca_file.
    kafka_security_protocol: Literal["PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: Literal["SCRAM-SHA-512", "SCRAM-SHA-256"] = "SCRAM-SHA-512"
    kafka_username: str = ""
    # Never written anywhere: as_dict() redacts it, repr() leaves it out; it reaches a child process only in its
    # environment (as_env), and comes from an Airflow connection or ONCEFLOW_KAFKA_PASSWORD.
    kafka_password: SecretStr = field(default="", repr=False)
    # PEM file of the CA that signed the brokers' certificates; empty: the embedded stack's (var/kafka/tls/ca.pem)
    kafka_ca_file: str = ""
    # The broker's ceiling for any producer's transaction.timeout.ms (Kafka default 15 min).
    broker_transaction_max_timeout_ms: PosInt = 900_000


@dataclass(frozen=True)
class Topics:
    """Topics: the app's own and the shared ones, as the platform creates them."""

    # An app's own topics; empty: named from its app_id (onceflow.rules.names), e.g. <app_id>_source.
    source_topic: str = ""
    sink_topic: str = ""
    dlq_topic: str = ""
    ledger_topic: str = ""
    events_topic: str = names.SHARED_TOPICS["events_topic"]  # shared: savepoints, restores, quarantines, backfills
    # The job's own facts (its driver's and supervisor's events: wire.JOB_EVENTS), per app (<app_id>_events); only
    # the job's principal may write it, so nothing else can forge them (docs/security.md).
    job_events_topic: str = ""
    alerts_topic: str = names.SHARED_TOPICS["alerts_topic"]
    health_topic: str = names.SHARED_TOPICS["health_topic"]
    reconciliation_topic: str = names.SHARED_TOPICS["reconciliation_topic"]
    backfill_topic: str = ""
    # The topics of the app's named outputs (App.outputs), name=topic comma-separated; an output not named here goes
    # to `<sink_topic>-<name>`. Each has sink_partitions partitions.
    output_topics: str = ""
    # The topics of the app's named sources (App.sources), name=topic comma-separated; a source not named here is read
    # from `<source_topic>-<name>`. Created (when the platform creates them) with source_partitions partitions.
    source_topics: str = ""
    source_partitions: PosInt = 4
    sink_partitions: PosInt = 4
    replication_factor: PosInt = 1
    min_insync_replicas: PosInt = 1


@dataclass(frozen=True)
class Job:
    """The streaming job: which app, its pace and its transactions."""

    # The declared app this job runs (onceflow.app: an `onceflow.apps` entry point or app_registry); its
    # declaration's settings are the defaults of the settings in APP_SETTINGS.
    app: str = "ip_count"
    # This instance of the app: its topics, groups, transactional id, checkpoint and files; empty: the app's name.
    app_id: str = ""
    # Apps declared outside installed packages: name=package.module:attribute, comma-separated.
    app_registry: str = ""
    checkpoint_uri: str = ""  # default: <var_dir>/checkpoints/<app_id>
    trigger_interval_s: NonNegFloat = 5.0
    # Run the batch that emits newly closed windows at once instead of one trigger later (onceflow.rules.pacing).
    close_out_batches: bool = True
    # With close-out batches, paced batches start this long after each multiple of the trigger interval, so that
    # the record that closes a window, stamped on the multiple, has left its producer and is read by the batch
    # planned for it (onceflow.rules.pacing). Without it such windows waited one more trigger interval. At most
    # half the trigger interval is used. Jobs sharing a machine each take their own margin, so that their batches do
    # not all start at the same moments (docs/performance.md, "Two jobs on one machine"). 150: at 5,000 records/s the
    # batch planned for a boundary read the stream to within 36 ms of its planning (docs/performance.md, "The pacing
    # margin"); the chase (onceflow.rules.pacing) covers a closing event held back longer.
    trigger_margin_ms: NonNegInt = 150
    # With close-out batches, when the batch planned for a window's closing moment would hold at least
    # lead_batch_min_records records of input, one more batch is planned this long before it (onceflow.rules.pacing),
    # so that the batch reading the closing event, and the close-out batch after it, hold little. 0: no lead batches.
    # 700: the lead batch (an interval's input at 5,000 records/s) is committed before the boundary batch is due; at
    # that rate the steady p99 went from 1,155 to 918 ms for 0.06 of a core more (docs/performance.md, "A lead
    # batch"). At most half the trigger interval is used.
    lead_batch_ms: NonNegInt = 700
    # Below this many records in the lead batch, none is planned: a quiet stream does not pay a batch's fixed cost
    # for a boundary batch that is small anyway. 10,000: 2,000 records/s with a 5 s trigger.
    lead_batch_min_records: NonNegInt = 10_000
    # Per-batch costs (planning, state store commit, checkpoint files, transaction) amortise over the batch:
    # 500,000 drained a backlog ~10-20 % faster than 200,000 (docs/performance.md, make bench-sweep).
    max_offsets_per_trigger: PosInt = 500_000
    min_batches_to_retain: PosInt = 100
    window_s: PosInt = 5
    watermark_s: NonNegInt = 5
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    # The classic setting for this job in Flink. Must not exceed broker_transaction_max_timeout_ms.
    transaction_timeout_ms: PosInt = 60_000
    near_timeout_fraction: Fraction = 0.8
    # The transactional producer's batching (the whole batch is produced, then committed at once).
    producer_linger_ms: NonNegInt = 5
    producer_batch_messages: PosInt = 10_000
    # A batch whose output has at most this many rows by the bound the job knows before running it (the state's rows
    # at Spark's last progress report, the records read since, one result per output and one DLQ record per record
    # read: onceflow.runtime.driver_state.output_rows_bound) is computed and brought to the driver in one Spark job,
    # held whole until its transaction commits; a larger or unknown one is stored in the executors and streamed a
    # partition at a time. Saves about 0.1 s of each small batch (docs/performance.md, "One Spark job for a small
    # output"). 0: always stored. A transform that emits more rows per record than it has outputs (an explode, a
    # stream-stream join's fan-out) can exceed the bound: set 0 for it if its batches are large.
    collect_max_rows: NonNegInt = 250_000
    # An event time more than this after its Kafka record's timestamp is quarantined (DLQ `timestamp_ahead`):
    # a broken client clock must not move the watermark. Recorded per batch in the ledger.
    max_event_ahead_s: NonNegFloat = 60.0
    # DLQ copies carry at most this many bytes of the original value (size and sha256 in headers), so a record
    # near the broker's size limit still fits into the DLQ with its provenance.
    dlq_max_value_bytes: Annotated[int, Range(low=0, high=900_000, low_open=True)] = 64 * 1024
    # How long a replay waits for the ledger's record of its batch when another producer's open transaction
    # (a backfill chunk) holds the ledger's last stable offset back.
    ledger_wait_s: PosFloat = 120.0
    # A commit or abort that does not finish in this time has an unknown outcome: the producer is replaced.
    commit_timeout_s: PosFloat = 120.0
    # send_offsets_to_transaction's timeout. librdkafka can block in that call past it when the group's coordinator
    # died (librdkafka #5456): past it and a grace (itself, at most 15 s) the producer is taken for wedged, replaced,
    # and the batch written again by the same driver.
    send_offsets_timeout_s: PosFloat = 30.0
    # Fixed by the checkpoint: Spark keeps the provider a query started with; a savepoint records it.
    state_store_provider: str = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"


@dataclass(frozen=True)
class Spark:
    """Spark: where the job runs and what it may take (docs/cluster.md)."""

    master: str = "local[2]"
    shuffle_partitions: PosInt = 4
    driver_memory: str = "1g"
    # Spark on a cluster (ONCEFLOW_MASTER spark://..., k8s://..., yarn): the executors, and where the driver runs
    # ("client": where it is launched; "cluster": in the cluster, Kubernetes and YARN only for Python).
    deploy_mode: Literal["client", "cluster"] = "client"
    executor_memory: str = "1g"
    executor_cores: int = 1
    # The platform's Spark JVMs on this machine (the job's driver and standby, its executors on a standalone cluster
    # at a loopback address, the batch jobs) map one class-data archive of Spark's classes (JDK CDS,
    # onceflow.runtime.class_data), built on first use under jvm_dir (a minute or two, once per JVM, pyspark and
    # class path; `onceflow-dev stack up` builds it before the first job starts): each start and restart loads and
    # verifies fewer classes (docs/cluster.md, docs/performance.md). A JVM that cannot map it starts as before.
    class_data_sharing: bool = True
    # HotSpot's JIT in the same JVMs (and in the job's executors on a cluster): C2, the optimising compiler, takes a
    # method after 4 times the calls and loop iterations of the JVM's default, so a JVM that starts (a deploy, a
    # restart after a crash, a batch job) spends less of its cores compiling code it runs only in its first batches;
    # code that stays hot reaches C2 as before, later. Measured on a backlog: the same steady batches, the first ones
    # and the CPU lower (docs/performance.md, "The JIT's thresholds"). Empty: the JVM's defaults.
    jit_options: str = (
        "-XX:Tier4InvocationThreshold=20000 -XX:Tier4CompileThreshold=40000 -XX:Tier4BackEdgeThreshold=160000"
    )
    # The garbage collector of the same JVMs. Parallel: a stop-the-world collector with no concurrent phases and no
    # G1 write barriers in the tasks' code; measured on a backlog, the drain 0.88 of G1's time at 0.93 of its CPU,
    # peak RSS lower (docs/performance.md, "The garbage collector"). serial: one thread, for the smallest heaps;
    # g1: the JVM's default on a server-class machine, shorter pauses on heaps of many GB; jvm: whatever the JVM picks.
    jvm_gc: Literal["parallel", "serial", "g1", "jvm"] = "parallel"
    # Under the parallel or serial collector, the job asks its driver JVM for a full collection while it waits at
    # least a second for its next batch, once the old generation holds this fraction of its committed size: the JVM
    # would otherwise take that collection (a pause of a few hundred milliseconds) inside whichever batch filled it,
    # a window's batch (docs/performance.md, "Full collections between batches"). 0: only the JVM decides.
    gc_while_idle_at: Annotated[float, Range(low=0, high=1)] = 0.8
    # Standalone: the most cores the streaming job takes from the cluster (spark.cores.max; 0 = all, Spark's
    # default). A long-lived job that takes every core starves the reconciliation recount and backfills.
    cores_max: NonNegInt = 0
    # Kubernetes cluster mode: the image (onceflow installed at app_root_in_image, as docker/ builds it), its
    # namespace and the driver's service account.
    k8s_image: str = ""
    k8s_namespace: str = "default"
    k8s_service_account: str = "spark"
    # On a secured cluster: the Kubernetes secret with the role's Kafka password (key `password`) and the CA
    # (key `ca.pem`). The driver gets the password from it (secretKeyRef), driver and executors the CA mounted at
    # k8s_kafka_secret_mount: neither is ever in the submit command.
    k8s_kafka_secret: str = "onceflow-kafka"
    k8s_kafka_secret_mount: str = "/etc/onceflow/kafka"
    app_root_in_image: str = "/opt/onceflow"


@dataclass(frozen=True)
class ResultSink:
    """Where results go (docs/database-sink.md)."""

    # kafka: the app's sink topic, in the Kafka transaction of each batch; postgres: its PostgreSQL tables, in one
    # database transaction per batch with the ledger row (the DLQ then is a table too).
    sink_kind: Literal["kafka", "postgres"] = "kafka"
    # The PostgreSQL server of the postgres sink (the embedded stack's: `onceflow-dev stack up --postgres`).
    postgres_host: str = "127.0.0.1"
    # Its port (the embedded server's is chosen free at its first start and printed by `stack up --postgres`).
    postgres_port: Port = 5432
    # The database that holds every app's schema.
    postgres_database: str = "onceflow"
    # The job's role (it writes the app's tables); empty: onceflow_<app_id>_job (onceflow.rules.names.db_role).
    postgres_user: str = ""
    # Like kafka_password: redacted by as_dict(), left out of repr(), in a child's environment only (as_env).
    postgres_password: SecretStr = field(default="", repr=False)
    # The schema of the app's tables (results, dlq, ledger, writer: onceflow.database.schema); empty: its app id.
    postgres_schema: str = ""
    # A statement of a batch's transaction that runs longer fails the batch before its commit (it is replayed).
    postgres_statement_timeout_ms: PosInt = 60_000
    # ... and one that waits longer for a lock another session holds on the app's tables.
    postgres_lock_timeout_ms: PosInt = 10_000


@dataclass(frozen=True)
class Savepoints:
    """Savepoints and their rotation (Hadoop-compatible URIs through fsspec: file://, hdfs://, s3://)."""

    savepoint_uri: str = ""  # default: <var_dir>/savepoints/<app_id>
    savepoint_keep: PosInt = 10  # the newest K savepoints are kept ...
    savepoint_max_age_s: PosFloat = 86_400.0  # ... and none older than this, except the newest
    savepoint_incomplete_grace_s: float = 3600.0  # a savepoint without manifest this old was abandoned
    rotation_interval_minutes: PosFloat = 60.0
    checkpoint_size_alert_bytes: PosInt = 1 << 30


@dataclass(frozen=True)
class Supervision:
    """The supervisor (Flink's classic fixed-delay restart strategy: 3 attempts, 10 s apart)."""

    restart_attempts: NonNegInt = 3
    restart_delay_s: NonNegFloat = 10.0
    # A warm standby driver (its JVM and Spark session up, waiting on the app's lock) takes over at once when the
    # active driver's process is lost (kill -9, OOM kill); other failures keep the fixed delay. Client mode only.
    standby: bool = False


@dataclass(frozen=True)
class ControlPlane:
    """The control plane (Airflow)."""

    # The app instances the control plane (Airflow's DAGs, one set per instance) runs: comma-separated `app` or
    # `app_id=app`; `*`: every declared app under its own name; empty: the one instance these settings name.
    apps: str = ""
    kafka_conn_id: str = "onceflow_kafka"  # Airflow connection holding bootstrap.servers
    # The schedules of the watching DAGs (read when the DAG files are parsed; shortened for tests and soaks).
    health_interval_s: PosFloat = 120.0
    txn_watch_interval_s: PosFloat = 60.0
    reconcile_interval_minutes: PosFloat = 60.0
    # The scheduled reconciliation chain proves at most this many committed batches per run; the rest is the
    # next run's (onceflow.operations.recon_chain).
    reconcile_max_batches: PosInt = 2000
    # The batch jobs the control plane launches (the recount and replay, a backfill) run at this nice level
    # (0-19), below the streaming job's: where they share its machine, a proof may wait, the stream should not.
    batch_job_nice: Annotated[int, Range(low=0, high=19)] = 10
    spark_conn_id: str = "spark_default"  # Airflow connection: Spark master / deploy mode
    health_progress_threshold_s: PosFloat = 120.0  # no committed batch for this long while input waits = stalled
    checkpoint_freshness_threshold_s: float = 600.0
    health_restart_attempts: NonNegInt = 3  # restarts by the health check per window, then page
    health_restart_window_s: float = 3600.0
    health_batch_grace_s: NonNegFloat = 900.0  # a batch in progress may run this much longer (catch-up, backlog)
    # Late records over recent batches (health) or a reconciled range above this share: "everything is late"
    late_fraction_threshold: Annotated[float, Range(low=0, high=1, low_open=True)] = 0.5
    # The watermark this far behind wall-clock time while the job has caught up: producers' clocks are behind,
    # or an old topic is being replayed
    health_event_time_lag_threshold_s: float = 3600.0
    alert_channels: str = ""  # comma-separated: webhook, slack, smtp
    alert_webhook_conn_id: str = "onceflow_webhook"
    # The path the webhook channel posts to, under its connection's host (the HTTP provider's endpoint)
    alert_webhook_endpoint: str = ""
    alert_slack_conn_id: str = "onceflow_slack"
    alert_smtp_conn_id: str = "smtp_default"
    alert_email_to: str = ""


@dataclass(frozen=True)
class EmbeddedStack:
    """The embedded stack (`onceflow-dev stack up`: docs/cluster.md)."""

    # Kafka nodes of the embedded stack (each a broker and a controller; 3 = a controller quorum of three). With
    # more than one, an unset bootstrap list names every node (ports spaced by NODE_PORT_STEP from the first), and
    # unset replication settings become 3 and 2 (see `load`).
    brokers: PosInt = 1
    controller_port: int = 9093
    # How often the coordinator looks for timed-out transactions (Kafka default 10 s).
    broker_txn_abort_check_interval_ms: int = 10_000
    broker_heap: str = "512m"
    airflow_port: int = 8080
    # The embedded Airflow's metadata database: postgres (Debian's PostgreSQL server, started under var/ on
    # loopback, as Airflow recommends beyond a trial: onceflow_dev.postgres) or sqlite (a file; one writer at a time)
    airflow_db: Literal["postgres", "sqlite"] = "postgres"
    # The address the embedded stack's servers (Airflow's api-server, the Spark standalone master and workers
    # and their web UIs) and a Spark driver on this machine (local[...] or a loopback spark:// master) bind: an
    # IP address. Loopback by default; 0.0.0.0 (or ::) opens them to the network (docs/security.md).
    listen_host: str = "127.0.0.1"


@dataclass(frozen=True)
class Testing:
    """Fault injection for tests; empty = off (see onceflow.faults)."""

    fault: str = ""


S = TypeVar("S")
SECTIONS: tuple[type, ...] = (
    Runtime,
    KafkaCluster,
    Topics,
    Job,
    Spark,
    ResultSink,
    Savepoints,
    Supervision,
    ControlPlane,
    EmbeddedStack,
    Testing,
)


@dataclass(frozen=True)
class Settings(
    Testing, EmbeddedStack, ControlPlane, Supervision, Savepoints, ResultSink, Spark, Job, Topics, KafkaCluster, Runtime
):
    """Every setting (its SECTIONS), and what is derived from them."""

    def __post_init__(self) -> None:
        # the names left empty follow the app (a frozen dataclass: set once, here)
        if not self.app_id:
            object.__setattr__(self, "app_id", self.app)
        for topic in names.APP_TOPICS:
            if not getattr(self, topic):
                object.__setattr__(self, topic, names.app_topic(self.app_id, topic))

    def declared_app(self) -> App:
        """The declaration of the app this job runs (onceflow.app)."""
        return declaration(self.app, self.app_registry)

    def section(self, cls: type[S]) -> S:
        """One section of these settings as its own typed record, e.g. `s.section(KafkaCluster)`."""
        if cls not in SECTIONS:
            raise TypeError(f"{cls.__name__} is not a section of the settings; the sections: {SECTIONS}")
        return cls(**{f.name: getattr(self, f.name) for f in fields(cls)})  # type: ignore[arg-type]

    # ------------------------------------------------------------------ derived names
    @property
    def database_schema(self) -> str:
        return self.postgres_schema or names.db_schema(self.app_id)

    @property
    def database_user(self) -> str:
        return self.postgres_user or names.db_role(self.app_id, "job")

    @property
    def outputs(self) -> dict[str, str]:
        """Every output of the app -> its topic: the main output (onceflow.app.MAIN_OUTPUT) on sink_topic, each named
        output (App.outputs) on the topic output_topics gives it, else `<sink_topic>-<name>`."""
        given = parse_output_topics(self.output_topics)
        named = {n: given.get(n, f"{self.sink_topic}-{n}") for n in self.declared_app().outputs}
        return {MAIN_OUTPUT: self.sink_topic, **named}

    @property
    def sources(self) -> dict[str, str]:
        """Every source of the app -> its topic: the main source (onceflow.app.declaration.MAIN_SOURCE) on
        source_topic, each named source (App.sources) on the topic source_topics gives it, else
        `<source_topic>-<name>`."""
        given = parse_output_topics(self.source_topics, "SOURCE_TOPICS")
        named = {n: given.get(n, f"{self.source_topic}-{n}") for n in self.declared_app().sources}
        return {MAIN_SOURCE: self.source_topic, **named}

    @property
    def source_topic_list(self) -> list[str]:
        """The topics the job reads, sorted (as positions are: onceflow.rules.sources)."""
        return sorted(set(self.sources.values()))

    @property
    def sink_topics(self) -> tuple[str, ...]:
        """The topics the job writes its results to (its outputs'), the sink topic first."""
        return tuple(self.outputs.values())

    @property
    def transactional_id(self) -> str:
        """Stable per app: a restarted job fences its predecessor (zombie fencing)."""
        return names.transactional_id(self.app_id)

    @property
    def group_id(self) -> str:
        """The consumer group whose committed offsets are the job's true position."""
        return names.group_id(self.app_id)

    @property
    def checkpoint(self) -> str:
        return self.checkpoint_uri or (self.var_dir / "checkpoints" / self.app_id).as_uri()

    @property
    def savepoints(self) -> str:
        return (self.savepoint_uri or (self.var_dir / "savepoints" / self.app_id).as_uri()).rstrip("/")

    @property
    def reader_group(self) -> str:
        """The group of every read_committed consumer that never commits (onceflow.kafka.clients); Spark's Kafka
        consumers are named under `<it>.spark` (onceflow.spark.kafka_source). The ACLs grant both."""
        return names.reader_group(self.app_id)

    def kafka_client_security(self) -> dict[str, str]:
        """librdkafka's settings for the cluster's security: nothing on PLAINTEXT; SCRAM over TLS otherwise."""
        if not self.secured:
            return {}
        user, ca = self._kafka_credentials()
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": self.kafka_sasl_mechanism,
            "sasl.username": user,
            "sasl.password": self.kafka_password,
            "ssl.ca.location": ca,
            "ssl.endpoint.identification.algorithm": "https",
        }

    def kafka_java_security(self) -> dict[str, str]:
        """The same for Java clients (Spark's Kafka source: its kafka.* options). The password only inside
        sasl.jaas.config, which Spark redacts from plans and UIs (spark.redaction.regex matches "password")."""
        if not self.secured:
            return {}
        user, ca = self._kafka_credentials()

        def quoted(v: str) -> str:
            return v.replace("\\", "\\\\").replace('"', '\\"')

        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": self.kafka_sasl_mechanism,
            "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{quoted(user)}" password="{quoted(self.kafka_password)}";',
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": ca,
        }

    def _kafka_credentials(self) -> tuple[str, str]:
        if not (self.kafka_username and self.kafka_password):
            raise ConfigError(
                f"Kafka at {self.bootstrap_servers} is SASL_SSL and no credentials are set: set "
                f"{ENV_PREFIX}KAFKA_USERNAME and {ENV_PREFIX}KAFKA_PASSWORD, or the login and password of the Airflow "
                f"connection {self.kafka_conn_id}"
            )
        if not Path(self.kafka_ca).is_file():
            raise ConfigError(
                f"the CA file {self.kafka_ca} for Kafka's TLS does not exist: set {ENV_PREFIX}KAFKA_CA_FILE to the PEM "
                f"of the CA that signed the brokers' certificates"
            )
        return self.kafka_username, self.kafka_ca

    @property
    def on_standalone(self) -> bool:
        """The job's master is a Spark standalone cluster (not local[N], not Kubernetes)."""
        return self.master.startswith(STANDALONE_SCHEME)

    @property
    def secured(self) -> bool:
        return self.kafka_security_protocol == "SASL_SSL"

    @property
    def kafka_ca(self) -> str:
        """The CA file clients check the brokers' certificates against."""
        return self.kafka_ca_file or str(self.var_dir / "kafka" / "tls" / "ca.pem")

    @property
    def max_event_ahead_ms(self) -> int:
        return int(self.max_event_ahead_s * 1000)

    @property
    def run_dir(self) -> Path:
        return self.var_dir / "run"

    @property
    def log_dir(self) -> Path:
        return self.var_dir / "log"

    @property
    def status_file(self) -> Path:
        return self.run_dir / f"{self.app_id}.status.json"

    @property
    def bootstrap_host_port(self) -> tuple[str, int]:
        return self.bootstrap_addresses[0]

    @property
    def bootstrap_addresses(self) -> list[tuple[str, int]]:
        out = []
        for item in self.bootstrap_servers.split(","):
            host, _, port = item.strip().rpartition(":")
            out.append((host.strip("[]"), int(port)))
        return out

    def kafka_nodes(self) -> list[tuple[int, str, int, int]]:
        """The embedded stack's nodes: (node id, host, client port, controller port), node i's ports spaced by
        NODE_PORT_STEP from the first's unless the bootstrap list names every node."""
        addrs = self.bootstrap_addresses
        host, port = addrs[0]
        out = []
        for i in range(self.brokers):
            h, p = addrs[i] if len(addrs) == self.brokers else (host, port + NODE_PORT_STEP * i)
            out.append((i + 1, h, p, self.controller_port + NODE_PORT_STEP * i))
        return out

    def job_config_hash(self) -> str:
        """A hash of the settings that shape the job's results (for savepoints and upgrade checks)."""
        keys = ("source_topic", "sink_topic", "dlq_topic", "window_s", "watermark_s", "app_id", "app")
        shape = {k: getattr(self, k) for k in keys} | {"rules": self.declared_app().rules_version}
        if len(self.outputs) > 1:  # (only then: the hash of an app without named outputs is what it was)
            shape["outputs"] = self.outputs
        if len(self.sources) > 1:  # (likewise)
            shape["sources"] = self.sources
        blob = json.dumps(shape, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def replace(self, **changes: Any) -> Settings:
        s = dataclasses.replace(self, **changes)
        s.validate()
        return s

    def without_kafka_credentials(self) -> Settings:
        """No Kafka principal (and no database role): for processes that authenticate nowhere (Spark's master and
        workers) or through their own connections (Airflow)."""
        return self.replace(kafka_username="", kafka_password="", postgres_password="")

    def as_env(self) -> dict[str, str]:
        """The environment that reproduces these settings in a child process."""
        return {ENV_PREFIX + f.name.upper(): str(getattr(self, f.name)) for f in fields(self)}

    def as_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        for rule in field_rules().values():
            if rule.secret:
                d[rule.name] = "***" if d[rule.name] else ""
        d["var_dir"] = str(self.var_dir)
        d["jvm_dir"] = str(self.jvm_dir)
        d["checkpoint"] = self.checkpoint
        d["savepoints"] = self.savepoints
        d["transactional_id"] = self.transactional_id
        d["group_id"] = self.group_id
        return d

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ConfigError(msg)

        for rule in field_rules().values():
            rule.check(getattr(self, rule.name))
        need(
            all(o.startswith("-XX:") and len(o) > 4 for o in self.jit_options.split()),
            f"{ENV_PREFIX}JIT_OPTIONS takes HotSpot options (-XX:...) separated by spaces, or nothing for the JVM's "
            f"defaults; got {self.jit_options!r}",
        )
        channels = {c.strip() for c in self.alert_channels.split(",") if c.strip()}
        need(
            channels <= {"webhook", "slack", "smtp"},
            f"{ENV_PREFIX}ALERT_CHANNELS takes webhook, slack, smtp; got {sorted(channels)}",
        )
        need(
            "smtp" not in channels or bool(self.alert_email_to),
            f"{ENV_PREFIX}ALERT_EMAIL_TO is needed when the smtp alert channel is on",
        )
        need(
            self.min_insync_replicas <= self.replication_factor,
            f"{ENV_PREFIX}MIN_INSYNC_REPLICAS ({self.min_insync_replicas}) must be <= "
            f"{ENV_PREFIX}REPLICATION_FACTOR ({self.replication_factor})",
        )
        need(
            # no '.': it separates an app's name from the parts of its group and transactional ids, and an app
            # `a.backfill.x` would fall under app `a`'s backfill prefix (its ACLs, its fencing)
            bool(self.app_id) and all(c.isalnum() or c in "_-" for c in self.app_id),
            f"{ENV_PREFIX}APP_ID must be non-empty and use only letters, digits, '_', '-' (got {self.app_id!r})",
        )
        # one topic per job: a topic named twice would mix records of different kinds (a job fact read as a shared
        # event, a ledger record as output); the ACLs, too, are granted per topic (docs/security.md). Compared as
        # Kafka compares names for collisions, '.' and '_' as one character: Kafka refuses to create the second.
        given = parse_output_topics(self.output_topics)
        app = self.declared_app()
        unknown = sorted(set(given) - set(app.outputs))
        need(
            not unknown,
            f"{ENV_PREFIX}OUTPUT_TOPICS names outputs app {app.name} does not declare: {unknown}; its outputs: "
            f"{sorted(app.outputs) or 'none besides its sink topic'}",
        )
        unknown = sorted(set(parse_output_topics(self.source_topics, "SOURCE_TOPICS")) - set(app.sources))
        need(
            not unknown,
            f"{ENV_PREFIX}SOURCE_TOPICS names sources app {app.name} does not declare: {unknown}; its sources: "
            f"{sorted(app.sources) or 'none besides its source topic'}",
        )
        need(
            self.sink_kind == "kafka" or not app.outputs,
            f"app {app.name} declares named outputs ({sorted(app.outputs)}): the postgres sink holds one output; "
            f"set {ENV_PREFIX}SINK_KIND=kafka",
        )
        # each topic by the variable that names it (an output's: ONCEFLOW_OUTPUT_TOPICS[name])
        topics = (
            {ENV_PREFIX + f.upper(): getattr(self, f) for f in TOPIC_FIELDS}
            | {f"{ENV_PREFIX}OUTPUT_TOPICS[{n}]": v for n, v in self.outputs.items() if n != MAIN_OUTPUT}
            | {f"{ENV_PREFIX}SOURCE_TOPICS[{n}]": v for n, v in self.sources.items() if n != MAIN_SOURCE}
        )
        kafka_name = {f: names.kafka_collision_key(v) for f, v in topics.items()}
        shared = sorted({k for k in kafka_name.values() if list(kafka_name.values()).count(k) > 1})
        need(
            not shared,
            "each topic setting names its own topic (Kafka takes '.' and '_' for one character); named twice: "
            + ", ".join(" and ".join(f"{f}={topics[f]!r}" for f in topics if kafka_name[f] == k) for k in shared),
        )
        need(
            _is_ip(self.listen_host),
            f"{ENV_PREFIX}LISTEN_HOST is the IP address the embedded servers bind (127.0.0.1, or 0.0.0.0 to open "
            f"them to the network), got {self.listen_host!r}",
        )
        need(
            self.deploy_mode == "client" or self.master.startswith(("k8s://", "yarn")),
            f"{ENV_PREFIX}DEPLOY_MODE=cluster needs Kubernetes or YARN ({ENV_PREFIX}MASTER k8s://... or yarn): "
            f"Spark standalone cannot run Python drivers in cluster mode",
        )
        need(
            not self.master.startswith("k8s://") or self.deploy_mode == "client" or bool(self.k8s_image),
            f"{ENV_PREFIX}K8S_IMAGE must name the image (onceflow installed at {ENV_PREFIX}APP_ROOT_IN_IMAGE) for "
            f"Kubernetes cluster mode",
        )
        need(
            not self.standby or self.deploy_mode == "client",
            f"{ENV_PREFIX}STANDBY needs {ENV_PREFIX}DEPLOY_MODE=client: a standby driver waits on the app's lock next "
            f"to its supervisor (in cluster mode the cluster manager restarts the driver)",
        )
        # (brokers = 1 is also the setting for an existing cluster, whose size onceflow does not know)
        need(
            self.brokers == 1 or self.replication_factor <= self.brokers,
            f"{ENV_PREFIX}REPLICATION_FACTOR ({self.replication_factor}) must be <= {ENV_PREFIX}BROKERS "
            f"({self.brokers})",
        )
        try:
            _ = self.bootstrap_addresses  # parses, or raises
        except ValueError:
            raise ConfigError(
                f"{ENV_PREFIX}BOOTSTRAP_SERVERS must be host:port[,host:port], got {self.bootstrap_servers!r}"
            ) from None
        check_transaction_timeout(self.transaction_timeout_ms, self.broker_transaction_max_timeout_ms)


TOPIC_FIELDS = (
    "source_topic",
    "sink_topic",
    "dlq_topic",
    "ledger_topic",
    "events_topic",
    "job_events_topic",
    "alerts_topic",
    "health_topic",
    "reconciliation_topic",
    "backfill_topic",
)


def parse_output_topics(raw: str, setting: str = "OUTPUT_TOPICS") -> dict[str, str]:
    """ONCEFLOW_OUTPUT_TOPICS (or SOURCE_TOPICS): `name=topic[,name=topic]` -> {name: topic}; refused when
    malformed."""
    out: dict[str, str] = {}
    for part in (p.strip() for p in raw.split(",")):
        if not part:
            continue
        name, eq, topic = (x.strip() for x in part.partition("="))
        if not eq or not name or not topic or name in out:
            noun = "source" if setting == "SOURCE_TOPICS" else "output"
            raise ConfigError(f"{ENV_PREFIX}{setting} is name=topic[,name=topic], each {noun} once; got {raw!r}")
        out[name] = topic
    return out


def _is_ip(host: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def check_transaction_timeout(job_timeout_ms: int, broker_max_ms: int) -> None:
    """The broker refuses InitProducerId when a producer asks for more than its maximum; say so up front."""
    if job_timeout_ms > broker_max_ms:
        raise ConfigError(
            f"transaction.timeout.ms of the job ({job_timeout_ms} ms) is above the broker's "
            f"transaction.max.timeout.ms ({broker_max_ms} ms): lower {ENV_PREFIX}TRANSACTION_TIMEOUT_MS "
            f"to at most {broker_max_ms}, or raise transaction.max.timeout.ms on the brokers"
        )


@dataclass(frozen=True)
class FieldRule:
    """What one setting may hold, read from its type: the Python type, its choices (a Literal), its Range, and
    whether it is a Secret."""

    name: str
    type: type
    choices: tuple[str, ...] = ()
    range: Range | None = None
    secret: bool = False

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    def check(self, v: Any) -> None:
        if self.choices and v not in self.choices:
            raise ConfigError(f"{self.env} takes {_either(self.choices)}, got {v!r}")
        if self.range is not None and not self.range.holds(v):
            raise ConfigError(f"{self.env} must be {self.range.text()}, got {v}")

    def coerce(self, raw: str) -> Any:
        t = self.type
        try:
            if t is bool:
                if raw.lower() in ("1", "true", "yes", "on"):
                    return True
                if raw.lower() in ("0", "false", "no", "off", ""):
                    return False
                raise ValueError(raw)
            if t is int:
                return int(raw.replace("_", ""))
            return t(raw)
        except ValueError:
            raise ConfigError(f"{self.env}={raw!r} is not a valid {t.__name__}") from None

    def describe(self) -> str:
        """The type as the reference shows it: `int > 0`, `kafka or postgres`, `str (secret)`."""
        if self.choices:
            return _either(self.choices)
        out = self.type.__name__
        if self.range is not None:
            out += " " + self.range.text()
        return out + (" (secret)" if self.secret else "")


def _either(choices: tuple[str, ...]) -> str:
    return ", ".join(choices[:-1]) + " or " + choices[-1] if len(choices) > 1 else choices[0]


def _rule(name: str, hint: Any) -> FieldRule:
    extras: tuple[Any, ...] = ()
    if get_origin(hint) is Annotated:
        hint, *rest = get_args(hint)
        extras = tuple(rest)
    if get_origin(hint) is Literal:
        return FieldRule(name, str, choices=tuple(get_args(hint)))
    return FieldRule(
        name,
        hint,
        range=next((x for x in extras if isinstance(x, Range)), None),
        secret=Secret in extras,
    )


_RULES: dict[str, FieldRule] = {}


def field_rules() -> dict[str, FieldRule]:
    """Each setting's rule, by name, in the order Settings declares them."""
    if not _RULES:
        hints = get_type_hints(Settings, include_extras=True)
        _RULES.update({f.name: _rule(f.name, hints[f.name]) for f in fields(Settings)})
    return _RULES


def load(env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Defaults, then `ONCEFLOW_*` environment variables, then the instance's own `ONCEFLOW__<INSTANCE>__*` ones
    (instance_values), then explicit overrides; validated."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for f in fields(Settings):
        key = ENV_PREFIX + f.name.upper()
        if key in env:
            values[f.name] = field_rules()[f.name].coerce(env[key])
    app_id = str(
        overrides.get("app_id") or values.get("app_id") or overrides.get("app") or values.get("app") or Settings.app
    )
    values.update(instance_values(env, app_id))
    values.update(overrides)
    unknown = set(values) - {f.name for f in fields(Settings)}
    if unknown:
        raise ConfigError(f"unknown settings: {sorted(unknown)}")
    values = app_defaults(values) | values
    values |= topology_defaults(values)
    s = Settings(**values)
    s.validate()
    return s


# The settings an app's declaration may set for itself (App.settings): its shape and pace, never where the
# platform runs nor its credentials.
APP_SETTINGS = frozenset(
    {
        *names.APP_TOPICS,
        "output_topics",
        "source_topics",
        "source_partitions",
        "sink_partitions",
        "trigger_interval_s",
        "close_out_batches",
        "trigger_margin_ms",
        "lead_batch_ms",
        "lead_batch_min_records",
        "max_offsets_per_trigger",
        "collect_max_rows",
        "shuffle_partitions",
        "window_s",
        "watermark_s",
        "starting_offsets",
        "transaction_timeout_ms",
        "max_event_ahead_s",
        "dlq_max_value_bytes",
        "driver_memory",
        "executor_memory",
        "executor_cores",
        "cores_max",
        "sink_kind",
    }
)


def declaration(app: str, app_registry: str = "") -> App:
    """The declared app `app`, found through the registry (onceflow.app.registry)."""
    try:
        return registry.find(app, app_registry)
    except AppError as e:
        raise ConfigError(f"{ENV_PREFIX}APP={app}: {e}") from e


def instances(s: Settings, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The app instances of Settings.apps, app id -> app, in the order given. With `env`, its per-instance
    variables are checked against them (check_instance_env)."""
    if not s.apps.strip():
        return {s.app_id: s.app}
    out = _listed_instances(s)
    if env is not None:
        check_instance_env(env, list(out))
    return out


def _listed_instances(s: Settings) -> dict[str, str]:
    if s.apps.strip() == "*":
        return {name: name for name in registry.declared(s.app_registry)}
    out: dict[str, str] = {}
    for item in (x.strip() for x in s.apps.split(",")):
        if not item:
            continue
        app_id, _, app = item.partition("=") if "=" in item else (item, "", item)
        app_id, app = app_id.strip(), app.strip()
        if not app_id or not app or app_id in out:
            raise ConfigError(f"{ENV_PREFIX}APPS: {item!r} is not `app` or `app_id=app`, or names an instance twice")
        out[app_id] = app
    return out


# What the environment sets for its own app instance only: another instance of the same control plane takes its
# names from its id and its shape from its declaration, not from the other instance's environment.
INSTANCE_ONLY = frozenset({"app", "app_id", "checkpoint_uri", "fault", "apps"})


# Settings one instance of a control plane that runs several (Settings.apps) may take for itself, from
# `ONCEFLOW__<INSTANCE>__<SETTING>`: its shape, pace, places, schedules, thresholds and alert routing. Not where the
# stack is (its Kafka cluster and embedded servers, var_dir, the shared topics), not which app it is, and no secret:
# an instance's credentials come from its own connections (docs/security.md).
INSTANCE_PREFIX = ENV_PREFIX + "_"
NOT_PER_INSTANCE = frozenset({"app", "app_id", "apps", "app_registry", "kafka_conn_id", "postgres_password"})
PER_INSTANCE = (
    frozenset(
        {f.name for c in (Job, Spark, ResultSink, Savepoints, Supervision, ControlPlane) for f in fields(c)}
        | APP_SETTINGS
    )
    - NOT_PER_INSTANCE
)


def instance_token(app_id: str) -> str:
    """How an instance id is written in its settings' variable names: upper case, '-' as '_'."""
    return app_id.upper().replace("-", "_")


def instance_values(env: Mapping[str, str], app_id: str) -> dict[str, Any]:
    """The settings `ONCEFLOW__<INSTANCE>__<SETTING>` variables give instance `app_id` (e.g.
    ONCEFLOW__NETS__TRIGGER_INTERVAL_S=10), coerced; a variable of this instance that names no setting an instance
    may take for itself is refused. A longer instance id that begins the same way (nets__eu) is another's."""
    head = f"{INSTANCE_PREFIX}{instance_token(app_id)}__"
    out: dict[str, Any] = {}
    for key, raw in env.items():
        name = key[len(head) :].lower() if key.startswith(head) else ""
        if not name or "__" in name:
            continue
        if name not in PER_INSTANCE:
            hint = "not a setting" if name not in field_rules() else "a setting of the whole stack or of its identity"
            raise ConfigError(
                f"{key}: {name!r} is {hint}, not one an instance takes for itself; per instance: {sorted(PER_INSTANCE)}"
            )
        out[name] = field_rules()[name].coerce(raw)
    return out


def check_instance_env(env: Mapping[str, str], ids: Sequence[str]) -> None:
    """Refuse per-instance variables that name no instance of ONCEFLOW_APPS (a typo would otherwise leave an
    instance on the defaults), and instances whose ids write alike in variable names (a-b and a_b)."""
    tokens: dict[str, str] = {}
    for app_id in ids:
        other = tokens.setdefault(instance_token(app_id), app_id)
        if other != app_id:
            raise ConfigError(
                f"{ENV_PREFIX}APPS: instances {other!r} and {app_id!r} are both {INSTANCE_PREFIX}{instance_token(app_id)}__* "
                "in per-instance variables: rename one"
            )
    for key in env:
        if key.startswith(INSTANCE_PREFIX) and not any(key.startswith(f"{INSTANCE_PREFIX}{t}__") for t in tokens):
            raise ConfigError(
                f"{key} names no instance of {ENV_PREFIX}APPS ({', '.join(ids)}): per-instance variables are "
                f"{INSTANCE_PREFIX}<INSTANCE>__<SETTING>, the instance's id in upper case with '-' as '_'"
            )


def load_instance(app_id: str, app: str, env: Mapping[str, str] | None = None) -> Settings:
    """The settings of instance `app_id` of `app` (Settings.apps): the environment's own instance as the environment
    says; any other without the environment's per-app settings (APP_SETTINGS and INSTANCE_ONLY)."""
    env = os.environ if env is None else env
    own = load(env)
    if own.app_id == app_id and own.app == app:
        return own
    mine = {f"{ENV_PREFIX}{k.upper()}" for k in APP_SETTINGS | INSTANCE_ONLY}
    return load({k: v for k, v in env.items() if k not in mine}, app=app, app_id=app_id)


def app_defaults(given: Mapping[str, Any]) -> dict[str, Any]:
    """The declared app's own settings (App.settings), for the settings not given."""
    app = declaration(str(given.get("app", Settings.app)), str(given.get("app_registry", "")))
    wrong = sorted(set(app.settings) - APP_SETTINGS)
    if wrong:
        raise ConfigError(
            f"{ENV_PREFIX}APP={app.name}: its declaration sets {wrong}, which an app may not set for itself; it may set "
            f"{sorted(APP_SETTINGS)}"
        )
    return {k: v for k, v in app.settings.items() if k not in given}


# The embedded stack remembers how it was started (onceflow_dev.stack.up writes it under its var dir), as a compose
# project does: the CLI's later commands use it, whatever the shell exported (docs/operations.md).
STACK_FILE = "stack.json"


def remembered_stack(var_dir: Path) -> dict[str, str]:
    """The settings the embedded stack under `var_dir` was started with, as ONCEFLOW_* variables ({} if none)."""
    try:
        got = json.loads((var_dir / STACK_FILE).read_text())
    except (OSError, ValueError):
        return {}
    got = got.get("settings") if isinstance(got, dict) else None
    if not isinstance(got, dict):
        return {}
    return {k: v for k, v in got.items() if isinstance(k, str) and k.startswith(ENV_PREFIX) and isinstance(v, str)}


def with_remembered_stack(env: Mapping[str, str]) -> dict[str, str]:
    """`env` over the remembered stack of its var dir: what the shell sets wins, the stack fills in the rest."""
    var_dir = Path(env.get(ENV_PREFIX + "VAR_DIR") or Settings.var_dir)
    return {**remembered_stack(var_dir), **env}


def topology_defaults(given: Mapping[str, Any]) -> dict[str, Any]:
    """What a multi-node embedded stack implies for the settings not given: a bootstrap list of every node (so a
    client still finds the cluster when one node is down), replication 3 with min.insync.replicas 2 (one node may
    fail without losing a committed write)."""
    n = int(given.get("brokers", 1))
    if n <= 1:
        return {}
    out: dict[str, Any] = {}
    boot = str(given.get("bootstrap_servers", Settings.bootstrap_servers))
    if len(boot.split(",")) == 1:
        host, _, port = boot.strip().rpartition(":")
        out["bootstrap_servers"] = ",".join(f"{host}:{int(port) + NODE_PORT_STEP * i}" for i in range(n))
    if "replication_factor" not in given:
        out["replication_factor"] = min(3, n)
    if "min_insync_replicas" not in given:
        out["min_insync_replicas"] = min(2, n)
    return out
