"""What the server's refusal of a batch's transaction means, and what the operator changes (pure: from the SQLSTATE).

A refusal is an error the server reported while the connection stayed up: the transaction rolled back, nothing of
the batch was written, and the batch is written once when the cause is gone. Whether a restart can help decides the
job's exit code: a full disk or a deadlock passes (the supervisor restarts the job and Spark replays the batch); a
row that does not fit the tables, a constraint someone added, a dropped table or a revoked grant fails the same way
on every replay, so the job stops with a misconfiguration and the message says what to change.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Refusal:
    condition: str  # what happened, in a few words
    advice: str  # what to change
    restart: bool  # whether the job's restart (the batch's replay) can succeed once nobody changes anything


_RESTART = " The job restarts and writes the batch once."
_STOP = " The job stops (a restart would fail the same way) until it is changed."

# exact SQLSTATEs first, then the class (the first two characters); PostgreSQL's Appendix A
_BY_STATE: dict[str, Refusal] = {
    "53100": Refusal(
        "the database server's disk is full",
        "Free space on the server's data volume (or move the app's tables to another tablespace)." + _RESTART,
        True,
    ),
    "53200": Refusal(
        "the database server is out of memory",
        "Lower the server's memory settings or add memory." + _RESTART,
        True,
    ),
    "53300": Refusal(
        "the database server has no connection left",
        "Raise the server's max_connections or end idle sessions (pg_stat_activity)." + _RESTART,
        True,
    ),
    "25006": Refusal(
        "the database server is read-only (a standby, or default_transaction_read_only)",
        "Point ONCEFLOW_POSTGRES_HOST at the primary." + _RESTART,
        True,
    ),
    "22021": Refusal(
        "a result is not UTF-8 text (or holds a NUL byte)",
        "The results table stores values as text: make the app write its values as text (JSON, say)." + _STOP,
        False,
    ),
    "42501": Refusal(
        "the job's database role lost a privilege on the app's tables",
        "Grant it again: onceflow db provision." + _STOP,
        False,
    ),
    "42P01": Refusal(
        "a table of the app is gone",
        "onceflow db status says what is missing, onceflow db provision creates it." + _STOP,
        False,
    ),
    "42703": Refusal(
        "a column of the app's tables is gone",
        "onceflow db status says what is missing; add it back as the sink writes it." + _STOP,
        False,
    ),
}
_BY_CLASS: dict[str, Refusal] = {
    "22": Refusal(
        "a row of the batch does not fit the app's tables",
        "Fix the app's output or the column's type (onceflow db status lists what the sink writes)." + _STOP,
        False,
    ),
    "23": Refusal(
        "a constraint on the app's tables refused a row",
        "The sink's own keys are the only constraints it keeps: drop the one that was added." + _STOP,
        False,
    ),
    "40": Refusal(
        "the server rolled the transaction back (a deadlock or a serialization failure)",
        "Nothing to change unless it repeats: find the other session in pg_locks." + _RESTART,
        True,
    ),
    "42": Refusal(
        "the app's tables are not as the sink writes them",
        "onceflow db status says what is wrong." + _STOP,
        False,
    ),
    "53": Refusal(
        "the database server ran out of a resource",
        "Raise the server's limit named in the message." + _RESTART,
        True,
    ),
    "54": Refusal(
        "a row of the batch exceeds a limit of the server (a key too long to index, say)",
        "Keep the app's keys short (under 2,000 bytes)." + _STOP,
        False,
    ),
}
_UNKNOWN = Refusal("the database server refused the transaction", "See the server's message." + _RESTART, True)


def refusal(sqlstate: str | None) -> Refusal:
    """What the server's error `sqlstate` means for a batch; unknown states are treated as passing (a restart)."""
    if not sqlstate:
        return _UNKNOWN
    return _BY_STATE.get(sqlstate) or _BY_CLASS.get(sqlstate[:2]) or _UNKNOWN
