"""A transaction of the job's that the broker left open (docs/operations.md, "A hanging transaction"): a one-replica
broker restarted while a partition had no leader can skip an aborted transaction's markers ("likely deleted already
and hence can be skipped"); its records then stay open, and the next COMMIT of the same producer id closes them as
committed (chaos seed 4 on one node). The sink looks before a new producer's first decision
(onceflow.protocol.exactly_once); this module says whose an open transaction is and what the operator runs."""

from __future__ import annotations

from onceflow import wire
from onceflow.wire import OnceflowError

Open = dict[tuple[str, int], tuple[int, int]]  # (topic, partition) -> (last stable offset, high watermark)


class HangingTransaction(OnceflowError):
    """The job stops for the operator (exit 7, not restarted) rather than commit over a transaction the broker will
    never settle."""

    exit_code = wire.ExitCode.HANGING


def opened_by_job(headers: dict[str, bytes], app_id: str) -> bool:
    """Whether a ledger record is one the job writes for a batch (the app's and the batch's headers); a backfill's,
    a restore's or a quarantine's carry their own, and their transactions are theirs to settle."""
    return (
        headers.get(wire.H_APP) == app_id.encode()
        and wire.H_BATCH in headers
        and not {wire.H_KIND, wire.H_BACKFILL} & set(headers)
    )


def abort_commands(bootstrap_servers: str, found: Open, secured: bool = False) -> list[str]:
    """Kafka's own command per open partition (bin/kafka-transactions.sh; `onceflow-dev kafka transactions` on the
    embedded stack), which writes the ABORT marker the broker skipped."""
    config = " --command-config <the admin's client properties>" if secured else ""
    return [
        f"kafka-transactions.sh --bootstrap-server {bootstrap_servers}{config} abort --topic {t} --partition {p} "
        f"--start-offset {lso}"
        for (t, p), (lso, _) in sorted(found.items())
    ]


def refusal(found: Open, commands: list[str], waited_s: float, batch: int) -> HangingTransaction:
    where = ", ".join(
        f"{t}[{p}] since offset {lso} (high watermark {hw})" for (t, p), (lso, hw) in sorted(found.items())
    )
    return HangingTransaction(
        f"a transaction is open on {where}, not settled by the broker for {waited_s:.0f} s: its markers were most "
        f"likely dropped (a broker restarted while the partition had no leader). Committing with this producer id "
        f"would make its records visible, so the job stops before batch {batch}. Abort "
        f"{'it' if len(found) == 1 else 'it on each'}: {'; '.join(commands)}; then start the job (docs/operations.md)"
    )
