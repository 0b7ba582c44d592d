"""Connections to the app's database and the reads of its ledger table.

Every connection carries the app's statement and lock timeouts, so a statement that hangs or a lock another session
holds fails the batch before its commit (it is replayed) instead of holding the job."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from onceflow.config import Settings
from onceflow.rules.ledger import LedgerEntry
from onceflow.wire import OnceflowError


class DatabaseUnreachable(OnceflowError):
    """The server did not answer, or refused the role's login; the message says which."""


def connect(settings: Settings, purpose: str = "job") -> psycopg.Connection:
    """A connection as the settings' role (postgres_user/password), not in autocommit: the sink's transactions are
    explicit."""
    # A transaction left idle longer than the job's transaction timeout (a driver stalled inside it) is ended by the
    # server, as Kafka's coordinator aborts one: the batch is decided again and written once.
    options = (
        f"-c statement_timeout={settings.postgres_statement_timeout_ms} "
        f"-c lock_timeout={settings.postgres_lock_timeout_ms} "
        f"-c idle_in_transaction_session_timeout={settings.transaction_timeout_ms}"
    )
    try:
        return psycopg.connect(
            host=settings.postgres_host,
            port=settings.postgres_port,
            dbname=settings.postgres_database,
            user=settings.database_user,
            password=settings.postgres_password or None,
            connect_timeout=10,
            application_name=f"onceflow.{settings.app_id}.{purpose}",
            options=options,
        )
    except psycopg.OperationalError as e:
        where = f"{settings.postgres_host}:{settings.postgres_port}/{settings.postgres_database}"
        raise DatabaseUnreachable(
            f"cannot connect to PostgreSQL at {where} as {settings.database_user}: {str(e).strip()[:300]} "
            f"(ONCEFLOW_POSTGRES_HOST, _PORT, _DATABASE, _USER, _PASSWORD)"
        ) from e


def table(settings: Settings, name: str) -> sql.Composed:
    """The qualified name of one of the app's tables (onceflow.database.schema.COLUMNS)."""
    return sql.SQL("{}.{}").format(sql.Identifier(settings.database_schema), sql.Identifier(name))


def _entries(conn: Any, settings: Settings, clause: str = "", params: tuple = ()) -> list[LedgerEntry]:
    """The ledger rows `clause` (SQL after the FROM) selects, as LedgerEntry."""
    query = sql.SQL("SELECT entry::text FROM {} " + clause).format(table(settings, "ledger"))
    with conn.cursor() as cur:
        cur.execute(query, params)
        return [LedgerEntry.from_json(r[0]) for r in cur.fetchall()]


def ledger_entry(conn: Any, settings: Settings, batch: int) -> LedgerEntry | None:
    """The committed ledger row of batch `batch` (None: not committed)."""
    got = _entries(conn, settings, "WHERE batch = %s", (batch,))
    return got[0] if got else None


def newest_entry(conn: Any, settings: Settings) -> LedgerEntry | None:
    """The app's newest committed ledger row (None: it has committed nothing)."""
    got = _entries(conn, settings, "ORDER BY batch DESC LIMIT 1")
    return got[0] if got else None


def ledger_entries(conn: Any, settings: Settings) -> list[LedgerEntry]:
    """Every committed ledger row, by batch."""
    return _entries(conn, settings, "ORDER BY batch")


def ledger_page(settings: Settings, size: int, before: int | None) -> tuple[list[LedgerEntry], int | None]:
    """One page of the ledger table, newest first: `size` batches below batch `before` (None: the newest), and the
    cursor of the next page (None: no older batch). What the console shows of a table sink."""
    with connect(settings, "console") as conn:
        conn.read_only = True
        got = _entries(
            conn,
            settings,
            "WHERE batch < %s ORDER BY batch DESC LIMIT %s",
            (before if before is not None else 2**62, size + 1),
        )
    entries = got[:size]
    return entries, (entries[-1].batch if len(got) > size else None)


def row_counts(conn: Any, settings: Settings) -> dict[str, int]:
    """How many rows each of the app's tables holds (`onceflow db status`)."""
    return {
        name: int(conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table(settings, name))).fetchone()[0])
        for name in ("results", "dlq", "ledger")
    }


def snapshot(settings: Settings) -> tuple[list[LedgerEntry], list[tuple[str, str, int]], list[tuple]]:
    """One consistent cut of the app's tables (a REPEATABLE READ transaction, as its role): the ledger's rows, the
    results (key, value, batch) and the DLQ rows (src_partition, src_offset, key, value, reason, batch, src_topic)."""
    with connect(settings, "reader") as conn:
        conn.read_only = True
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with conn.transaction():
            entries = ledger_entries(conn, settings)
            results = conn.execute(sql.SQL("SELECT key, value, batch FROM {}").format(table(settings, "results")))
            rows = [(str(k), str(v), int(b)) for k, v, b in results.fetchall()]
            dlq = conn.execute(
                sql.SQL("SELECT src_partition, src_offset, key, value, reason, batch, src_topic FROM {}").format(
                    table(settings, "dlq")
                )
            ).fetchall()
    return entries, rows, [tuple(r) for r in dlq]
