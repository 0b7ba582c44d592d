"""The exactly-once protocol with a PostgreSQL table as the sink (docs/database-sink.md): one database transaction
per Spark micro-batch, beside the Kafka variant (onceflow.protocol.exactly_once), which it mirrors step for step.

Between Spark's `offsets/N` and `commits/N`, `DatabaseSink.write_batch` does, in ONE transaction of the app's
database role:

    0. SELECT the writer row FOR UPDATE   -> its generation must be this driver's, else Fenced (a newer one took over)
    1. the batch's results                -> upserted into <schema>.results (key, value, batch; writes + 1 on conflict)
    2. the batch's rejected input         -> <schema>.dlq (provenance, a capped copy of the value)
    3. one ledger row                     -> <schema>.ledger (batch, ranges per partition, counts, config hash)

and commits. Before opening it, it reads the ledger table and decides as the Kafka sink does (onceflow.rules.ledger
.decide, with the newest ledger row as the committed position): write batch N, skip a replay of a batch committed
with exactly this range, rebuild state only after a restore, or stop with divergent history. The ledger's primary
key (batch) is the last guard: a second commit of a batch fails whole.

Fencing: at start the driver takes the writer row's next generation (waiting for the row lock a previous driver's
open transaction holds, so that transaction ends first: committed or rolled back); every batch transaction locks the
row and checks it still holds that generation. A zombie's next transaction sees the newer one and stops.
After each commit the source offsets are committed to the app's Kafka group too, outside the transaction: the group
is a cache for lag and health; the ledger table decides.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import psycopg
from confluent_kafka import TopicPartition
from psycopg import errors as pg_errors
from psycopg import sql

from onceflow import wire
from onceflow.config import Settings
from onceflow.database import client, refusals, schema
from onceflow.faults import Injector
from onceflow.kafka import clients as kafka_clients
from onceflow.kafka import events as ev
from onceflow.protocol.batch_sink import BatchOutcome, BatchSink, OutRecord, UndeliverableRecord
from onceflow.rules import clock
from onceflow.rules.ledger import (
    BatchPlan,
    Committed,
    Decision,
    LedgerEntry,
    committed_from_ledger,
    offset_metadata,
)
from onceflow.wire import OnceflowError

log = logging.getLogger(__name__)
RECONNECT_S = 60.0  # how long a lost connection is tried again before the batch fails (the job restarts)


class Fenced(wire.Fenced):
    """Another driver of this app took the writer row: this one stops."""


class StatementTimedOut(OnceflowError):
    """A statement of the batch's transaction ran past ONCEFLOW_POSTGRES_STATEMENT_TIMEOUT_MS, or waited for a lock
    past ONCEFLOW_POSTGRES_LOCK_TIMEOUT_MS: the transaction rolled back; the batch is replayed after the restart."""


class DatabaseRefused(OnceflowError):
    """The server refused the batch's transaction while the connection stayed up (a full disk, a row that does not
    fit, a revoked grant: onceflow.database.refusals): it rolled back, nothing of the batch was written. The exit
    code says whether the job's restart can help."""

    def __init__(self, batch: int, error: psycopg.Error):
        sqlstate = getattr(error, "sqlstate", None)
        why = refusals.refusal(sqlstate)
        self.sqlstate = sqlstate
        self.exit_code = wire.EXIT_FAILED if why.restart else wire.EXIT_CONFIG
        first_line = (str(error).strip().splitlines() or [""])[0][:300]
        super().__init__(
            f"batch {batch}: {why.condition} (SQLSTATE {sqlstate}: {first_line}); the transaction rolled back and "
            f"nothing of the batch was written. {why.advice}"
        )


class ConnectionLost(OnceflowError):
    """The connection broke inside a batch's transaction; during the commit its outcome is unknown."""

    def __init__(self, message: str, phase: str):
        super().__init__(message)
        self.phase = phase


class DatabaseSink(BatchSink):
    unknown_outcome = (ConnectionLost,)

    def __init__(
        self,
        settings: Settings,
        bus: ev.EventBus,
        faults: Injector | None = None,
        *,
        connect: Callable[[], Any] | None = None,
        group: Any | None = None,
    ):
        """Connects, checks the app's tables and takes the writer row (fencing the previous driver). Seams: `connect`
        makes a connection (again after one is lost), `group` caches the committed offsets in Kafka (None: the
        app's consumer group)."""
        self.s, self.bus, self.faults = settings, bus, faults
        self.rules_version = settings.declared_app().rules_version  # carried by each ledger record
        self._connect = connect or (lambda: client.connect(settings))
        self.conn = self._connect()
        schema.check(self.conn, settings.database_schema)
        self.holder = f"{settings.app_id}@{clock.now_ms()}"
        self.generation = self._claim()
        self.group = (
            group if group is not None else kafka_clients.read_committed_consumer(settings, group_id=settings.group_id)
        )

    # ------------------------------------------------------------------ fencing
    def _claim(self) -> int:
        return claim_writer(self.conn, self.s, self.holder)

    # ------------------------------------------------------------------ the protocol
    def decide(self, plan: BatchPlan) -> Decision:
        """As the Kafka sink decides, with the ledger table's newest row as the committed position."""
        entry, newest = self._reading(
            lambda: (client.ledger_entry(self.conn, self.s, plan.batch), client.newest_entry(self.conn, self.s))
        )
        committed = committed_from_ledger(newest) if newest is not None else Committed(offsets={}, batch=None)
        return self._decided(plan, committed, entry if committed.batch == plan.batch else None)

    def ledger_entry(self, batch: int) -> LedgerEntry | None:
        entry: LedgerEntry | None = self._reading(lambda: client.ledger_entry(self.conn, self.s, batch))
        return entry

    def _recover(self, error: BaseException) -> dict[str, Any]:
        self._reconnect()
        return {
            "sink": "postgres",
            "phase": getattr(error, "phase", None),
            "action": "reconnected; the batch is decided again from the ledger table",
        }

    def _outcome_text(self, error: BaseException) -> str:
        return f"the transaction, lost with its connection ({getattr(error, 'phase', None)}),"

    def _after_commit(self, plan: BatchPlan) -> None:
        self._cache_offsets(plan)

    def _write(self, plan: BatchPlan, rows: Iterable[OutRecord]) -> BatchOutcome:
        self._fault("crash_before_produce", plan.batch)
        started = time.monotonic()
        phase = "begin"
        try:
            with self.conn.transaction(), self.conn.cursor() as cur:
                phase = "fence"
                self._check_generation(cur)
                phase = "write"
                outputs, dlq = self._copy(cur, plan, rows)
                self._fault("crash_after_produce", plan.batch)
                entry = LedgerEntry.for_plan(
                    self.s.app_id,
                    plan,
                    outputs,
                    dlq,
                    (time.monotonic() - started) * 1000,
                    clock.now_ms(),
                    f"postgres:{self.s.database_schema}#{self.generation}",
                    self.rules_version,
                    self.s.max_event_ahead_ms,
                )
                # the row's columns are the entry's, for queries; the entry is the record
                cur.execute(
                    sql.SQL(
                        "INSERT INTO {t} (batch, epoch, ranges, outputs, dlq, config_hash, entry) SELECT "
                        "(e->>'batch')::bigint, (e->>'epoch')::integer, e->'ranges', (e->>'outputs')::bigint, "
                        "(e->>'dlq')::bigint, %s, e FROM (SELECT %s::jsonb AS e) AS x"
                    ).format(t=client.table(self.s, "ledger")),
                    (self.s.job_config_hash(), entry.to_json().decode()),
                )
                self._fault("stall_in_txn", plan.batch)
                phase = "commit"  # leaving the block commits
        except (pg_errors.QueryCanceled, pg_errors.LockNotAvailable) as e:  # rolled back by leaving the block
            raise StatementTimedOut(_timeout_advice(plan.batch, e)) from e
        except pg_errors.IdleInTransactionSessionTimeout as e:
            advice = (
                "the server ended the transaction; the batch is decided again and written once. If the driver is "
                "slow rather than stalled, raise ONCEFLOW_TRANSACTION_TIMEOUT_MS"
            )
            elapsed_ms = (time.monotonic() - started) * 1000
            self._timed_out(
                plan, elapsed_ms, self.s.transaction_timeout_ms, str(e).strip()[:300], advice, sink="postgres"
            )
            raise ConnectionLost(f"batch {plan.batch}: the transaction was idle past its timeout", phase) from e
        except psycopg.Error as e:
            if self.conn.closed or phase == "commit":  # lost with its connection; in the commit, maybe landed
                raise ConnectionLost(f"batch {plan.batch}: {str(e).strip()[:300]}", phase) from e
            raise DatabaseRefused(plan.batch, e) from e  # reported by the server: rolled back, nothing written
        txn_ms = (time.monotonic() - started) * 1000
        self._cache_offsets(plan)
        self._committed(plan, outputs, dlq, txn_ms, sink="postgres")
        self._fault("crash_after_commit", plan.batch)
        self._fault("raise_after_commit", plan.batch)
        return BatchOutcome(plan.batch, Decision.WRITE, outputs, dlq, txn_ms)

    def _check_generation(self, cur: Any) -> None:
        cur.execute(sql.SQL("SELECT generation, holder FROM {t} FOR UPDATE").format(t=client.table(self.s, "writer")))
        row = cur.fetchone()
        if row is None or int(row[0]) != self.generation:
            now = f"generation {row[0]} ({row[1]})" if row else "nobody"
            self.bus.emit(
                wire.FENCED,
                logging.ERROR,
                flush=True,
                sink="postgres",
                generation=self.generation,
                error=f"the writer row holds {now}",
                action="another instance of this app took over; this one stops",
            )
            raise Fenced(
                f"the writer row of {self.s.database_schema} holds {now}, not this driver's generation "
                f"{self.generation}: another instance of app {self.s.app_id} took over; this one stops"
            )

    def _copy(self, cur: Any, plan: BatchPlan, rows: Iterable[OutRecord]) -> tuple[int, int]:
        """Stream the batch's rows into a staging table (COPY), then upsert the results and insert the DLQ rows from
        it. Returns (results rows written, DLQ rows written)."""
        cur.execute(
            "CREATE TEMP TABLE IF NOT EXISTS onceflow_stage (seq bigserial, kind text, key text, value bytea, "
            "src_topic text, src_partition integer, src_offset bigint, src_timestamp_ms bigint, reason text, "
            "original_size integer, original_sha256 text) ON COMMIT DELETE ROWS"
        )
        columns = (
            "kind, key, value, src_topic, src_partition, src_offset, src_timestamp_ms, reason, original_size, "
            "original_sha256"
        )
        with cur.copy(f"COPY onceflow_stage ({columns}) FROM STDIN") as copy:
            for r in rows:
                if r.kind != wire.KIND_RESULT and self.faults is not None and r.value is not None:
                    if self.faults.undeliverable(r.src_partition, r.src_offset):
                        raise UndeliverableRecord(
                            f"the DLQ copy of {r.src_topic}[{r.src_partition}] offset {r.src_offset} is refused "
                            f"(injected fault): quarantine the record (onceflow quarantine add)"
                        )
                copy.write_row(
                    (
                        r.kind,
                        r.key,
                        r.value,
                        r.src_topic,
                        r.src_partition,
                        r.src_offset,
                        r.src_timestamp_ms,
                        r.reason,
                        r.src_size,
                        r.src_sha256,
                    )
                )
        cur.execute(
            sql.SQL(
                "INSERT INTO {t} AS r (key, value, batch) "
                "SELECT DISTINCT ON (key) key, convert_from(value, 'UTF8'), %s FROM onceflow_stage "
                "WHERE kind = %s ORDER BY key, seq DESC "
                "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, batch = EXCLUDED.batch, "
                "writes = r.writes + 1, updated_at = now()"
            ).format(t=client.table(self.s, "results")),
            (plan.batch, wire.KIND_RESULT),
        )
        outputs = cur.rowcount
        cur.execute(
            sql.SQL(
                "INSERT INTO {t} (key, src_topic, src_partition, src_offset, src_timestamp_ms, reason, value, "
                "original_size, original_sha256, batch) SELECT key, coalesce(src_topic, ''), src_partition, src_offset, "
                "src_timestamp_ms, coalesce(reason, ''), value, original_size, original_sha256, %s FROM onceflow_stage "
                "WHERE kind <> %s"
            ).format(t=client.table(self.s, "dlq")),
            (plan.batch, wire.KIND_RESULT),
        )
        return outputs, cur.rowcount

    def _cache_offsets(self, plan: BatchPlan) -> None:
        """The committed position into the app's Kafka group (not transactional: a cache for lag and health)."""
        offsets = [
            TopicPartition(sp.topic, sp.partition, off, offset_metadata(plan.batch, plan.epoch))
            for sp, off in sorted(plan.end.items())
        ]
        try:
            self.group.commit(offsets=offsets, asynchronous=False)
        except Exception as e:  # the ledger table holds the truth; the next commit refreshes the cache
            log.warning(
                "batch %s committed; caching its offsets in group %s failed: %s", plan.batch, self.s.group_id, e
            )

    # ------------------------------------------------------------------ connections
    def _reading(self, read: Callable[[], Any]) -> Any:
        """Run `read` in a read-only transaction; a connection lost between batches (the server restarted) is
        replaced once."""
        for attempt in (1, 2):
            try:
                with self.conn.transaction():
                    return read()
            except psycopg.OperationalError:
                if attempt == 2 or not self.conn.closed:
                    raise
                self._reconnect()
        raise AssertionError("unreachable")

    def _reconnect(self) -> None:
        """A new connection, tried for up to RECONNECT_S (a restarting server); the generation stays this driver's
        (each transaction checks it)."""
        try:
            self.conn.close()
        except Exception:
            pass
        deadline = time.monotonic() + RECONNECT_S
        while True:
            try:
                self.conn = self._connect()
                return
            except client.DatabaseUnreachable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)

    def close(self) -> None:
        for c in (self.group, self.conn):
            try:
                c.close()
            except Exception:
                pass


def claim_writer(conn: Any, settings: Settings, holder: str) -> int:
    """The writer row's next generation, for `holder`: every driver that took an earlier one is fenced (its next
    batch transaction finds the row moved on and fails). A driver's open batch transaction holds the row's lock:
    this waits for it to end (at most the statement timeout, then it fails and the caller may retry)."""
    t = client.table(settings, "writer")
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SELECT set_config('lock_timeout', %s, true)", (str(settings.postgres_statement_timeout_ms),))
        cur.execute(
            sql.SQL(
                "INSERT INTO {t} AS w (one, generation, holder) VALUES (true, 1, %s) ON CONFLICT (one) DO UPDATE "
                "SET generation = w.generation + 1, holder = EXCLUDED.holder, since = now() RETURNING generation"
            ).format(t=t),
            (holder,),
        )
        row = cur.fetchone()
    generation = int(row[0])
    log.info("took the writer row of %s for %s: generation %d", settings.database_schema, holder, generation)
    return generation


def fence(settings: Settings, holder: str) -> int:
    """Fence every driver of the app (an operator's change to its history: a restore, a quarantine), as a newer
    driver would: take the writer row's next generation on a connection of its own."""
    with client.connect(settings, "fence") as conn:
        return claim_writer(conn, settings, holder)


def _timeout_advice(batch: int, e: Exception) -> str:
    if isinstance(e, pg_errors.LockNotAvailable):
        return (
            f"batch {batch}: a lock on the app's tables was held by another session past "
            f"ONCEFLOW_POSTGRES_LOCK_TIMEOUT_MS; the transaction rolled back and the batch is replayed after the "
            f"restart. Find the session in pg_stat_activity (pg_locks) and end it, or raise the setting"
        )
    return (
        f"batch {batch}: a statement ran past ONCEFLOW_POSTGRES_STATEMENT_TIMEOUT_MS; the transaction rolled back and "
        f"the batch is replayed after the restart with the same range: raise the setting above what the batch needs"
    )
