"""An app's tables in PostgreSQL, in a schema of its own (onceflow.rules.names.db_schema), and the roles' grants.

    results  one row per key: the app's value, the batch that wrote it last, how many batches wrote it
    dlq      the source records the app rejected, with their provenance (a capped copy of the value)
    ledger   one row per committed batch: its offset ranges per partition and counts (the LedgerEntry's JSON)
    writer   one row: the generation of the driver that may write (fencing, onceflow.protocol.database_sink)

The DLQ is a table, not the Kafka topic: only a table can be in the one database transaction that also holds the
batch's results and its ledger row; a Kafka write cannot join it. The job's role may read and write these tables and
nothing else (no DDL); the reader role (the console, the reconciliation) may only read them.
"""

from __future__ import annotations

from typing import Any

from psycopg import sql

from onceflow.wire import OnceflowError

# column -> PostgreSQL's data_type, as information_schema reports it (what the sink checks at start)
COLUMNS: dict[str, dict[str, str]] = {
    "results": {"key": "text", "value": "text", "batch": "bigint", "writes": "integer"},
    "dlq": {
        "key": "text",
        "src_topic": "text",
        "src_partition": "integer",
        "src_offset": "bigint",
        "src_timestamp_ms": "bigint",
        "reason": "text",
        "value": "bytea",
        "original_size": "integer",
        "original_sha256": "text",
        "batch": "bigint",
    },
    "ledger": {
        "batch": "bigint",
        "epoch": "integer",
        "ranges": "jsonb",
        "outputs": "bigint",
        "dlq": "bigint",
        "config_hash": "text",
        "entry": "jsonb",
    },
    "writer": {"generation": "bigint", "holder": "text"},
}

_DDL = {
    "results": """CREATE TABLE IF NOT EXISTS {schema}.results (
        key text PRIMARY KEY,
        value text NOT NULL,
        batch bigint NOT NULL,
        writes integer NOT NULL DEFAULT 1,
        updated_at timestamptz NOT NULL DEFAULT now())""",
    "dlq": """CREATE TABLE IF NOT EXISTS {schema}.dlq (
        key text NOT NULL,
        src_topic text NOT NULL,
        src_partition integer NOT NULL,
        src_offset bigint NOT NULL,
        src_timestamp_ms bigint,
        reason text NOT NULL,
        value bytea,
        original_size integer,
        original_sha256 text,
        batch bigint NOT NULL,
        PRIMARY KEY (src_topic, src_partition, src_offset))""",
    "ledger": """CREATE TABLE IF NOT EXISTS {schema}.ledger (
        batch bigint PRIMARY KEY,
        epoch integer NOT NULL,
        ranges jsonb NOT NULL,
        outputs bigint NOT NULL,
        dlq bigint NOT NULL,
        config_hash text NOT NULL,
        entry jsonb NOT NULL,
        committed_at timestamptz NOT NULL DEFAULT now())""",
    "writer": """CREATE TABLE IF NOT EXISTS {schema}.writer (
        one boolean PRIMARY KEY DEFAULT true CHECK (one),
        generation bigint NOT NULL,
        holder text NOT NULL,
        since timestamptz NOT NULL DEFAULT now())""",
}


class SchemaError(OnceflowError, ValueError):
    """The app's tables are missing or not as the sink writes them; the message says what to change."""


def ddl(schema: str) -> list[sql.Composed]:
    """The statements that create the app's schema and tables (idempotent)."""
    ident = sql.Identifier(schema)
    return [sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident)] + [
        sql.SQL(_DDL[t]).format(schema=ident) for t in COLUMNS
    ]


def grants(schema: str, job_role: str, reader_role: str) -> list[sql.Composed]:
    """The job's role reads and writes the app's tables; the reader's only reads them. Neither may create or drop."""
    ident = sql.Identifier(schema)
    job, reader = sql.Identifier(job_role), sql.Identifier(reader_role)
    tables = sql.SQL(", ").join(sql.SQL("{}.{}").format(ident, sql.Identifier(t)) for t in COLUMNS)
    return [
        sql.SQL("GRANT USAGE ON SCHEMA {} TO {}, {}").format(ident, job, reader),
        sql.SQL("GRANT SELECT, INSERT, UPDATE ON {} TO {}").format(tables, job),
        sql.SQL("GRANT SELECT ON {} TO {}").format(tables, reader),
    ]


def problems(schema: str, found: list[tuple[str, str, str]]) -> list[str]:
    """What is wrong with the app's tables, from information_schema's (table, column, data_type) rows of `schema`;
    empty when the sink can write them."""
    have: dict[str, dict[str, str]] = {}
    for table, column, data_type in found:
        have.setdefault(table, {})[column] = data_type
    out = []
    for table, columns in COLUMNS.items():
        if table not in have:
            out.append(f"table {schema}.{table} is missing")
            continue
        for column, data_type in columns.items():
            got = have[table].get(column)
            if got is None:
                out.append(f"table {schema}.{table} has no column {column} ({data_type})")
            elif got != data_type:
                out.append(f"column {schema}.{table}.{column} is {got}, the sink writes {data_type}")
    return out


def check(conn: Any, schema: str) -> None:
    """Refuse to start on tables the sink cannot write, before any batch (SchemaError says what to change)."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns WHERE table_schema = %s",
            (schema,),
        )
        found = cur.fetchall()
    conn.rollback()  # leave no transaction open
    wrong = problems(schema, found)
    if wrong:
        raise SchemaError(
            f"the app's PostgreSQL tables cannot take its results: {'; '.join(wrong)}. Create them with "
            f"`onceflow db provision` (as a role that may create schemas), or see docs/database-sink.md for the DDL"
        )


def ensure_database(server: Any, name: str) -> None:
    """Create database `name` if it is missing (`server`: an autocommit connection to another database of the
    server, as a role that may create databases)."""
    if server.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
        server.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def ensure_login_role(server: Any, role: str, password: str) -> None:
    """Create login role `role`, or set its password again (the server stores it as scram-sha-256, its default)."""
    exists = server.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is not None
    verb = sql.SQL("ALTER" if exists else "CREATE")
    server.execute(sql.SQL("{} ROLE {} LOGIN PASSWORD {}").format(verb, sql.Identifier(role), sql.Literal(password)))


def provision(conn: Any, schema: str, job_role: str, reader_role: str) -> None:
    """Create the app's schema and tables and grant its roles (which must exist), in one transaction."""
    with conn.transaction(), conn.cursor() as cur:
        for stmt in ddl(schema) + grants(schema, job_role, reader_role):
            cur.execute(stmt)
