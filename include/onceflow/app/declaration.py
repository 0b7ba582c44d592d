"""What a team declares to put its own stream on the platform: an App.

An app is a name, a transformation and its own settings. The platform does everything else from that: the Kafka
source (read_committed, its offsets in the checkpoint), one Kafka transaction per micro-batch carrying the app's
results, its DLQ records and the ledger record, fencing, the ledger, savepoints, preflight, health, alerts and the
console (docs/design.md). A declaration never imports Spark at module level: the control plane (the DAGs at
parse time, the CLI) reads declarations without a JVM; the transformation imports what it needs when it runs.

For the platform's proofs to hold, a transformation must be deterministic: the same source records give the same
results, whenever and wherever they are computed. No wall-clock time (`current_timestamp()`, `now()`), no
randomness (`rand()`, `uuid()`), no lookups of anything that changes (a table, a service): event time comes from
the records, windows close on the watermark, and a replayed batch then writes exactly what its first attempt
would have.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onceflow.wire import OnceflowError

if TYPE_CHECKING:  # types only: this module is read without Spark and below the settings
    from pyspark.sql import DataFrame

    from onceflow.config import Settings

# An app's name is part of its topics, groups, transactional ids, principals and file names (onceflow.rules.names).
NAME = re.compile(r"[a-z][a-z0-9_]{0,47}")
# A named output's name is part of its default topic, `<sink topic>-<output>` (onceflow.config.Settings.outputs).
OUTPUT_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
# The output a result row without an `output` goes to: the app's sink topic.
MAIN_OUTPUT = "main"
# The source read from the app's source topic; each further source (App.sources) has a name of its own.
MAIN_SOURCE = "main"


class AppError(OnceflowError, ValueError):
    """A declaration is invalid or cannot be found; the message says what to change."""


def check_name(name: object) -> None:
    """Refuse a name that cannot be an app's (it is part of its Kafka names and file names)."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise AppError(
            f"an app's name is lower case letters, digits and underscores, starting with a letter (at most 48): "
            f"got {name!r}"
        )


@dataclass(frozen=True)
class Context:
    """What the platform hands a transformation besides its source: the app's settings (its window, watermark and
    clock rule among them) and the source records an operator quarantined (each must become a reject with reason
    `quarantined`: onceflow.operations.quarantine)."""

    settings: Settings
    quarantine: Sequence[Any] = ()


@dataclass(frozen=True)
class Results:
    """A transformation's output, both parts computed from one source DataFrame (one transaction carries both).

    rows: the results, columns `key` (string) and `value` (string or binary), written to the app's sink topic; an
      app with named outputs (App.outputs) adds a column `output` (string) naming the one a row goes to (null: the
      sink topic). A row naming an output the app does not declare fails its batch: nothing of it is committed.
    rejects: the source records that are not results and why, columns `value`, `topic`, `partition`, `offset`,
      `timestamp` (as the Kafka source gives them) and `reason` (a short stable word, e.g. `malformed`); the
      platform writes each to the DLQ with its provenance (a capped copy of the value, its size and sha256).
      None: the app rejects nothing.
    """

    rows: DataFrame
    rejects: DataFrame | None = None


@dataclass(frozen=True)
class App:
    """A declared stream.

    name: the app's name; its instances' Kafka names derive from it (onceflow.rules.names).
    transform: source DataFrame (Spark's Kafka source columns) and Context -> Results; a streaming plan, run by
      the job per micro-batch, and the same plan the platform can run as a batch.
    settings: the app's own defaults for the platform's per-app settings (APP_SETTINGS in onceflow.config: its
      window and watermark, trigger, partitions, topics); the environment still overrides them.
    reasons: what goes to the DLQ and why, reason -> meaning (the console and docs show it).
    sources: the app's named sources besides its source topic, name -> meaning. Each is a topic of its own
      (`<source topic>-<name>` unless ONCEFLOW_SOURCE_TOPICS names another), subscribed by the job's one Kafka
      source: the transformation sees all their records in one DataFrame (its `topic` column says which), and each
      batch's range, ledger record, savepoint and proof covers every partition of every source topic.
    outputs: the app's named outputs besides its sink topic, name -> meaning. Each is a topic of its own
      (`<sink topic>-<name>` unless ONCEFLOW_OUTPUT_TOPICS names another), written in the same transaction as the
      rest of the batch, counted per topic in its ledger record and proven by the same replay.
    event_time: whether results are event-time windows closed by a watermark (health judges event-time lag only
      then).
    deterministic: the author's word that the transformation is deterministic (see the module's docstring); the
      platform's proofs of an app that is not are refused.
    reference: optional `module:function`, an independent second check of the app's results that the
      reconciliation runs beside the replay of the app's own plan (onceflow.operations.replay), written apart from
      that plan (ip_count's reference recount: onceflow_apps.ip_count_reference.recount).
    rules_version: the version of the app's rules for what a record yields (its parsing, what it rejects and
      why); raise it when they change. Each batch's ledger record carries it; a restore, a savepoint's catch-up and
      the reconciliation refuse to mix batches of another version.
    audit: optional `module:function`, the app's own key-by-key check for `onceflow audit` (no Spark: the source,
      sink and DLQ read with a Kafka client), called with (settings, snapshot, sink records, DLQ provenance) and
      returning an onceflow.rules.invariants.Report (ip_count's: onceflow_apps.ip_count_audit.check). Without it
      the audit checks what holds for any app: I1 coverage and the ledger's accounting of every sink and DLQ record.
    java: Java sources (files, or directories searched for `.java` files) of JVM functions the transformation calls,
      a compiled parse of a hot record form, say (ip_count's: onceflow_apps.access_log). The platform compiles them
      with the JDK's javac against pyspark's jars on first use, once per content, and puts the jar on the class path
      of every Spark session that runs the app's plan: the job, its replays and recounts, backfills, `onceflow app
      validate` (onceflow.runtime.app_jars). Registering a function in a session is the transformation's own step.
      Without a JDK such an app does not start, and says so.
    """

    name: str
    transform: Callable[[DataFrame, Context], Results]
    description: str = ""
    settings: Mapping[str, Any] = field(default_factory=dict)
    reasons: Mapping[str, str] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)
    outputs: Mapping[str, str] = field(default_factory=dict)
    event_time: bool = True
    deterministic: bool = True
    reference: str | None = None
    audit: str | None = None
    rules_version: int = 1
    java: Sequence[str | Path] = ()

    def __post_init__(self) -> None:
        check_name(self.name)
        if not callable(self.transform):
            raise AppError(f"app {self.name}: transform must be a function (source, context) -> Results")
        for hook in ("reference", "audit"):
            where = getattr(self, hook)
            if where is not None and not re.fullmatch(r"[\w.]+:\w+", where):
                raise AppError(f"app {self.name}: {hook} must be 'module:function', got {where!r}")
        if isinstance(self.rules_version, bool) or not isinstance(self.rules_version, int) or self.rules_version < 1:
            raise AppError(f"app {self.name}: rules_version must be a positive integer, got {self.rules_version!r}")
        java = self.java
        if (
            isinstance(java, str | Path)
            or not isinstance(java, Sequence)
            or not all(isinstance(j, str | Path) for j in java)
        ):
            raise AppError(f"app {self.name}: java must be a sequence of paths (Java files or directories of them)")
        if not isinstance(self.settings, Mapping):
            raise AppError(f"app {self.name}: settings must be a mapping of setting names to values")
        for kind, one, named, main, topic in (
            ("sources", "a source", self.sources, MAIN_SOURCE, "source"),
            ("outputs", "an output", self.outputs, MAIN_OUTPUT, "sink"),
        ):
            if not isinstance(named, Mapping):
                raise AppError(f"app {self.name}: {kind} must be a mapping of names to what each holds")
            for name in named:
                if not isinstance(name, str) or not OUTPUT_NAME.fullmatch(name) or name == main:
                    raise AppError(
                        f"app {self.name}: {one}'s name is lower case letters, digits and underscores, starting with "
                        f"a letter (at most 32), and not {main!r} (the {topic} topic's): got {name!r}"
                    )
