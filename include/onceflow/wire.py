"""The wire contract: what onceflow writes that other programs read, named once.

Header names on the records the job, backfills and operator actions write; the event types on the events topics;
the kinds of output rows and of ledger records; the streaming job's exit codes and what the supervisor does with
each; the base exception. Consumers (the console, an auditor's script, a downstream job merging a backfill) rely
on these names; changing one is a breaking change of the platform's contract (docs/design.md).
"""

from __future__ import annotations

import enum
import signal


class OnceflowError(RuntimeError):
    """The base of onceflow's own errors: each says what happened and what to change. One that ends the streaming
    job sets the job's exit code (None: the kind of error decides, onceflow.runtime.driver_state)."""

    exit_code: ExitCode | None = None


class Fenced(OnceflowError):
    """A newer instance of the app took over its sink (Kafka: its transactional id; a database: its writer row):
    this one stops for good and is never restarted."""


# ---------------------------------------------------------------------------- record headers
H_APP = "onceflow.app"  # every record the platform writes: the app id
H_BATCH = "onceflow.batch"  # sink, DLQ and ledger records of the job: the ledger batch
H_KIND = "onceflow.kind"  # operator and control records: restore, quarantine, reconciliation
H_BACKFILL = "onceflow.backfill"  # a backfill's records: its id
H_CHUNK = "onceflow.chunk"  # ... and the chunk
H_OUTPUT = "onceflow.output"  # a backfill's record of a named output (App.outputs): its name
# provenance of a DLQ record (Kafka Connect style)
H_SOURCE_TOPIC = "onceflow.source.topic"
H_SOURCE_PARTITION = "onceflow.source.partition"
H_SOURCE_OFFSET = "onceflow.source.offset"
H_SOURCE_TIMESTAMP = "onceflow.source.timestamp"
H_REASON = "onceflow.reason"
REASON_QUARANTINED = "quarantined"  # the platform's own reason: an operator quarantined the source record
H_ORIGINAL_SIZE = "onceflow.original.size"  # the original value's size (-1: unknown)
H_ORIGINAL_SHA256 = "onceflow.original.sha256"  # set when the copy holds less than the original
H_TRUNCATED = "onceflow.truncated"  # "true" when the copy holds less than the original

# ---------------------------------------------------------------------------- output rows and ledger records
KIND_RESULT = "result"  # an output row of a batch: a (window, ip) count for the sink
KIND_DLQ = "dlq"  # an output row of a batch: a malformed source record for the DLQ
LEDGER_STREAM = "stream"  # one committed batch of the streaming job
LEDGER_BACKFILL = "backfill"  # one committed chunk of a backfill
LEDGER_RESTORE = "restore"  # a savepoint restore (an operator action)
LEDGER_QUARANTINE = "quarantine"  # quarantined source offsets (an operator action)

# ---------------------------------------------------------------------------- events (onceflow.kafka.events)
JOB_STARTED = "job_started"
JOB_STOPPED = "job_stopped"
JOB_FAILED = "job_failed"
BATCH_COMMITTED = "batch_committed"
BATCH_REPLAY_SKIPPED = "batch_replay_skipped"
PROGRESS = "progress"
TRANSACTION_NEAR_TIMEOUT = "transaction_near_timeout"
TRANSACTION_TIMEOUT = "transaction_timeout"
TRANSACTION_OUTCOME_UNKNOWN = "transaction_outcome_unknown"
PRODUCER_REPLACED = "producer_replaced"
TRANSACTION_HANGING = "transaction_hanging"  # the broker left an aborted transaction open: the job stops
FENCED = "fenced"
DIVERGENT_HISTORY = "divergent_history"
GROUP_OFFSETS_LOST = "group_offsets_lost"
FAULT_INJECTED = "fault_injected"
SUPERVISOR_RESTART = "supervisor_restart"
SUPERVISOR_GAVE_UP = "supervisor_gave_up"
SAVEPOINT_CREATED = "savepoint_created"
SAVEPOINT_DELETED = "savepoint_deleted"
SAVEPOINT_RESTORED = "savepoint_restored"
RECORDS_QUARANTINED = "records_quarantined"
BACKFILL_STARTED = "backfill_started"
BACKFILL_CHUNK = "backfill_chunk_committed"
BACKFILL_DONE = "backfill_done"

# The job's own facts: what the streaming job's processes (driver, supervisor) emit, on the app's job events topic
# (Settings.job_events_topic), which only the job's principal may write. Readers trust these types from that topic
# only (onceflow.kafka.events.read); every other type is on the shared events topic (Settings.events_topic).
JOB_EVENTS = frozenset(
    {
        JOB_STARTED,
        JOB_STOPPED,
        JOB_FAILED,
        BATCH_COMMITTED,
        BATCH_REPLAY_SKIPPED,
        PROGRESS,
        TRANSACTION_NEAR_TIMEOUT,
        TRANSACTION_TIMEOUT,
        TRANSACTION_OUTCOME_UNKNOWN,
        PRODUCER_REPLACED,
        TRANSACTION_HANGING,
        FENCED,
        DIVERGENT_HISTORY,
        GROUP_OFFSETS_LOST,
        SUPERVISOR_RESTART,
        SUPERVISOR_GAVE_UP,
    }
)
# Emitted by the job and by backfills, each on its own topic (a test's injected fault).
ANY_ROLE_EVENTS = frozenset({FAULT_INJECTED})


# ---------------------------------------------------------------------------- the job's state and its operator's intent
class JobState(enum.StrEnum):
    """The `state` of the job's status file (`onceflow job status` shows it)."""

    STARTING = "starting"  # launched; its driver has not written its own status yet
    RUNNING = "running"
    STOPPED = "stopped"  # on request
    FAILED = "failed"  # ended by an error (its exit code says what the supervisor does)


class Intent(enum.StrEnum):
    """What the operator asked for last (the desired-state file): the health check restarts only a job meant to run."""

    RUNNING = "running"
    STOPPED = "stopped"


# The signal that makes a running job write every Python thread's stack to its log, the job running on (a job that
# commits nothing: where it waits; docs/operations.md)
STACKS_SIGNAL = signal.SIGUSR1


# ---------------------------------------------------------------------------- the streaming job's exit codes
# The supervisor sees the driver's code through spark-submit's JVM, so none may be one the JVM uses itself: 3 is
# -XX:+ExitOnOutOfMemoryError's (a crash, restarted), above 128 a death by signal (a lost process).
class ExitCode(enum.IntEnum):
    """The streaming job's exit code, with what the supervisor does after it: restart (after the fixed delay) or
    not, and why not (a restart would not help)."""

    restart: bool
    why: str

    def __new__(cls, value: int, restart: bool, why: str) -> ExitCode:
        code = int.__new__(cls, value)
        code._value_ = value
        code.restart = restart
        code.why = why
        return code

    OK = 0, False, "stopped"  # stopped on request
    FAILED = 1, True, "a crash"  # restarted after a fixed delay
    CONFIG = 2, False, "misconfiguration"  # the message says what to change
    DIVERGENT = 4, False, "divergent history"  # checkpoint and committed history disagree (or cannot be proven to)
    LOCKED = 5, False, "another instance holds the app's lock on this machine"
    FENCED = 6, False, "fenced by a newer instance"  # of the app
    HANGING = (
        7,
        False,
        "a transaction the broker left open",
    )  # committing would show its records: the operator aborts it


EXIT_OK = ExitCode.OK
EXIT_FAILED = ExitCode.FAILED
EXIT_CONFIG = ExitCode.CONFIG
JVM_OUT_OF_MEMORY = 3  # not ours: the driver JVM's exit on OutOfMemoryError (a crash, restarted)
EXIT_DIVERGENT = ExitCode.DIVERGENT
EXIT_LOCKED = ExitCode.LOCKED
EXIT_FENCED = ExitCode.FENCED

# Exit codes after which the supervisor does not restart the job, and why: derived from ExitCode.
NO_RESTART: dict[int, str] = {code: code.why for code in ExitCode if not code.restart}
