"""The PostgreSQL sink's tables (onceflow.database.schema): what the sink checks at start, without a server."""

import pytest

from onceflow import config
from onceflow.database import schema


def _found(tables=schema.COLUMNS, drop=(), retype=None):
    rows = []
    for table, columns in tables.items():
        for column, data_type in columns.items():
            if (table, column) in drop:
                continue
            rows.append((table, column, (retype or {}).get((table, column), data_type)))
    return rows


def test_the_ddl_creates_every_column_the_sink_checks_with_its_type():
    statements = {t: schema._DDL[t] for t in schema.COLUMNS}
    for table, columns in schema.COLUMNS.items():
        for column, data_type in columns.items():
            assert f"{column} {data_type}" in statements[table], (table, column)


def test_tables_as_created_have_no_problems():
    assert schema.problems("app", _found()) == []


def test_a_missing_table_a_missing_column_and_a_wrong_type_are_each_named():
    found = [r for r in _found(drop={("results", "writes")}, retype={("dlq", "value"): "text"}) if r[0] != "writer"]
    assert schema.problems("app", found) == [
        "table app.results has no column writes (integer)",
        "column app.dlq.value is text, the sink writes bytea",
        "table app.writer is missing",
    ]


class _Conn:
    def __init__(self, rows):
        self.rows = rows

    def cursor(self):
        conn = self

        class Cur:
            def __enter__(self):
                return self

            def __exit__(self, *a):
                return False

            def execute(self, *a):
                pass

            def fetchall(self):
                return conn.rows

        return Cur()

    def rollback(self):
        pass


def test_the_check_at_start_says_what_to_run():
    with pytest.raises(schema.SchemaError, match=r"table app.ledger is missing.*onceflow db provision"):
        schema.check(_Conn([r for r in _found() if r[0] != "ledger"]), "app")


def test_an_apps_tables_live_in_its_own_schema_and_its_job_role_is_named_for_it():
    s = config.load(env={}, app_id="team-a", sink_kind="postgres")
    assert s.database_schema == "team-a" and s.database_user == "onceflow_team-a_job"
    assert config.load(env={}, app_id="x", postgres_schema="reporting").database_schema == "reporting"
    assert "postgres_password" not in repr(config.load(env={}, postgres_password="secret"))
    assert config.load(env={}, postgres_password="secret").as_dict()["postgres_password"] == "***"
