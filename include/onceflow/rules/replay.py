"""The proof for any app, its rules: which batches a replay of the app's own plan runs, whether their records are
still there, and the verdict of its comparison with what the job committed (onceflow.operations.replay runs it with Spark).

The replay feeds the app's transformation, as a streaming query, exactly the source records of each committed
batch, one micro-batch per ledger batch, in ledger order, so that every batch sees what the job's batch saw: the
same records, the same state and the same watermark (Spark derives it from the batches before; across the job's
restarts it carries it in the checkpoint's commit log, `nextBatchWatermarkMs`, so a restart changes nothing). A
deterministic app (onceflow.app) then computes, batch by batch, exactly the results and DLQ records the job
committed; any difference is named with its batch and key, and the replay checks its watermark against the job's,
batch by batch.

A stateful plan's batch depends on every batch before it, so its replay begins at the ledger's first batch; a
stateless plan's at the first batch compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from onceflow.rules.ledger import LedgerEntry
from onceflow.rules.reconciliation import Check, Status
from onceflow.rules.sources import SourcePartition
from onceflow.wire import OnceflowError

NAME = "replay"  # the check's name in a reconciliation result


class Unprovable(OnceflowError):
    """The replay cannot prove this range; the message says why (the check is then a warning, not a pass)."""


@dataclass(frozen=True)
class Plan:
    """batches: the ledger batches the replay runs, in order, contiguous; replay batch i is batches[i].
    compared: the ledger batches whose output is compared, [first, last]."""

    batches: list[LedgerEntry]
    compared: tuple[int, int]

    @property
    def start(self) -> int:
        return self.batches[0].batch


def plan(
    history: Sequence[LedgerEntry],
    selected: Sequence[LedgerEntry],
    stateful: bool,
) -> Plan:
    """The replay of `selected` (stream batches, in order) given the app's whole committed `history`.

    A savepoint restored in the history changes nothing here: the ledger's stream batches stay one contiguous
    history (a restore's catch-up writes no batch of its own), and the restored job's state after the catch-up is the
    one the original run had after the sink's batch (docs/savepoints.md), so the batches after it are what the app's
    plan computes over the same straight history. The replay runs that history; a restore that did change a result
    shows as a difference in the batches after it."""
    if not selected:
        raise Unprovable("no committed batch to replay")
    first, last = selected[0].batch, selected[-1].batch
    if stateful:
        if not history or history[0].batch != 0:
            begins = history[0].batch if history else None
            raise Unprovable(
                f"the app's plan keeps state, so its replay must begin at the ledger's first batch, but the ledger "
                f"begins at batch {begins}: the records before it are not in the ledger's account"
            )
        start = 0
    else:
        start = first
    run = [e for e in history if start <= e.batch <= last]
    for i, e in enumerate(run):
        if e.batch != start + i:
            raise Unprovable(
                f"ledger batch {start + i} is missing (the next is {e.batch}): the replay needs every batch from "
                f"{start}; I1 names the gap"
            )
    if not run or run[-1].batch != last:
        raise Unprovable(f"ledger batch {last} is not in the history given")
    return Plan(run, (first, last))


def source_gone(p: Plan, log_starts: dict[SourcePartition, int]) -> str | None:
    """Why the replay cannot read its batches' source records, when retention deleted some (`log_starts`: each
    source partition's first offset still in the log); None when every record is there."""
    for e in p.batches:
        for part, (start, end) in sorted(e.ranges.items()):
            if end > start and log_starts.get(part, 0) > start:
                return (
                    f"the source records of batch {e.batch} are no longer in Kafka ({part} now begins at "
                    f"offset {log_starts[part]}, the batch read from {start}): retention deleted them, and the replay "
                    f"needs every batch from {p.start}"
                )
    return None


def differences(missing: list[dict[str, Any]], extra: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The record-level differences, named: a (batch, kind, output, key) the replay and the job both have but with
    other values is `different_value`; otherwise the job lacks a record (`missing`), holds one the replay does not
    (`unexpected`, or `duplicate` when the replay has it fewer times). A result on another output's topic than the
    replay's is `missing` on one and `unexpected` on the other."""

    def record(d: dict[str, Any]) -> tuple[Any, ...]:
        return (d["batch"], d["kind"], d.get("output"), d["key"])

    def named(kind: str, d: dict[str, Any]) -> dict[str, Any]:
        out = {"kind": kind, "batch": d["batch"], "record": d["kind"], "key": d["key"]}
        return out | ({"output": d["output"]} if d.get("output") is not None else {})

    by_key = {record(d): d for d in extra}
    out: list[dict[str, Any]] = []
    paired = set()
    for d in missing:
        k = record(d)
        other = by_key.get(k)
        if other is not None and other["replayed"] == 0 and d["committed"] == 0:
            paired.add(k)
            out.append(named("different_value", d))
        else:
            out.append(named("missing", d) | _n(d))
    for d in extra:
        if record(d) in paired:
            continue
        out.append(named("duplicate" if d["replayed"] > 0 else "unexpected", d) | _n(d))
    return out


def _n(d: dict[str, Any]) -> dict[str, Any]:
    return {"replayed": d["replayed"], "committed": d["committed"]}


def watermark_differences(p: Plan, replayed: dict[int, int]) -> list[dict[str, Any]]:
    """Compared batches whose watermark in the replay (replay batch -> ms) is not the job's: the replay did not
    see what the job saw, and its results there prove nothing."""
    first, last = p.compared
    out = []
    for i, e in enumerate(p.batches):
        if first <= e.batch <= last and replayed.get(i) != e.watermark_ms:
            out.append({"kind": "watermark", "batch": e.batch, "job_ms": e.watermark_ms, "replay_ms": replayed.get(i)})
    return out


def ledger_differences(p: Plan, counts: dict[int, tuple[int, int]]) -> list[dict[str, Any]]:
    """Compared batches whose ledger record counts other results or DLQ records than the replay computed
    (counts: ledger batch -> (results, dlq))."""
    first, last = p.compared
    out = []
    for e in p.batches:
        if first <= e.batch <= last:
            got = counts.get(e.batch, (0, 0))
            if (e.outputs, e.dlq) != got:
                out.append(
                    {
                        "kind": "ledger_count",
                        "batch": e.batch,
                        "ledger": [e.outputs, e.dlq],
                        "replayed": list(got),
                    }
                )
    return out


def check(p: Plan, figures: dict[str, Any], diffs: list[dict[str, Any]], cap: int = 100) -> Check:
    """The replay's verdict over the compared batches."""
    first, last = p.compared
    figures = {
        "replay_from": p.start,
        "replayed_batches": len(p.batches),
        "compared": [first, last],
        **figures,
    }
    if diffs:
        kinds: dict[str, int] = {}
        for d in diffs:
            kinds[d["kind"]] = kinds.get(d["kind"], 0) + 1
        listed = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        return Check(
            NAME,
            Status.FAIL,
            f"the app's plan replayed over the committed ranges of batches {first}..{last} differs from what the "
            f"job committed: {listed} (first: batch {diffs[0].get('batch')})",
            figures,
            diffs[:cap],
        )
    return Check(
        NAME,
        Status.PASS,
        f"the app's plan replayed over the committed ranges (from batch {p.start}) gives "
        f"exactly the {figures.get('results', 0)} results and {figures.get('dlq', 0)} DLQ records the job "
        f"committed in batches {first}..{last}, batch by batch, with the job's watermarks",
        figures,
    )


def unprovable(reason: str) -> Check:
    return Check(NAME, Status.WARN, f"the replay cannot prove this range: {reason}")
