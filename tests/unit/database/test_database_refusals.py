"""What a server's refusal of a table sink's transaction means (onceflow.database.refusals): the condition, the
advice, and whether the job's restart can help, from the SQLSTATE alone."""

import psycopg
import pytest

from onceflow import wire
from onceflow.database.refusals import refusal
from onceflow.protocol.database_sink import DatabaseRefused


@pytest.mark.parametrize(
    "sqlstate, says, restart",
    [
        ("53100", "disk is full", True),  # transient: the replay succeeds once there is room
        ("53300", "no connection left", True),
        ("53000", "ran out of a resource", True),  # the class, for a state not named
        ("40P01", "deadlock", True),
        ("25006", "read-only", True),
        ("22021", "not UTF-8", False),  # the same rows fail the same way on every replay
        ("22003", "does not fit", False),
        ("23514", "constraint", False),
        ("23505", "constraint", False),
        ("42501", "lost a privilege", False),
        ("42P01", "table of the app is gone", False),
        ("54000", "exceeds a limit", False),
        ("XX000", "refused the transaction", True),  # unknown: a restart, and health pages if it repeats
        (None, "refused the transaction", True),
    ],
)
def test_each_refusal_says_what_happened_and_whether_a_restart_helps(sqlstate, says, restart):
    r = refusal(sqlstate)
    assert says in r.condition and r.restart is restart
    assert ("The job restarts" in r.advice) is restart and ("The job stops" in r.advice) is not restart


def test_the_sinks_error_carries_the_exit_code_and_the_servers_message():
    e = DatabaseRefused(7, psycopg.errors.DiskFull("could not extend file: No space left on device\nDETAIL: more"))
    assert e.exit_code == wire.EXIT_FAILED and e.sqlstate == "53100"
    assert str(e).startswith("batch 7: the database server's disk is full (SQLSTATE 53100: could not extend file")
    assert "DETAIL" not in str(e) and "nothing of the batch was written" in str(e)
    assert DatabaseRefused(7, psycopg.errors.CheckViolation("no")).exit_code == wire.EXIT_CONFIG
