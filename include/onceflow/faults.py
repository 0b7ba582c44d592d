"""Fault injection at named points of the protocol, for tests. Off unless ONCEFLOW_FAULT is set.

ONCEFLOW_FAULT is a comma-separated list of `point@batch[:seconds]`:
- `crash_before_produce@N`: die before batch N opens its transaction
- `crash_after_produce@N`:  die with batch N's records produced into an open transaction (before commit)
- `crash_after_commit@N`:   die after batch N's Kafka commit, before Spark writes commits/N (forces a replay)
- `raise_after_commit@N`:   raise an error (no kill) after batch N's Kafka commit: the query fails, Spark does not
                            write commits/N, the restarted job replays the batch
- `undeliverable@P:O`:      the DLQ copy of source record (partition P, offset O) is refused like a record the
                            broker can never accept, every time (not once) while it carries a payload: a poison
                            record, for the quarantine procedure
- `stall_in_txn@N:S`:       hold batch N's transaction open for S seconds before committing
- `hang_send_offsets@N:S`:  batch N's send_offsets_to_transaction blocks S seconds past its own timeout, as
                            librdkafka's does when the group's coordinator died (librdkafka #5456)
- `stall_in_txn@armed:S`:   hold the first transaction after the fault is armed (`arm()`, by a chaos run that wants
                            a transaction open when it kills a broker) open for S seconds; fires once per arming
- `crash_in_chunk@N`:       (backfill) die with chunk N's records in an open transaction
- `crash_after_chunk@N`:    (backfill) die right after chunk N's transaction committed
- `stall_before_chunks@N:S`: (backfill) wait S seconds after reading its progress and computing, before its first
                            chunk (N is ignored): another run of the same id can then overtake it
- `stall_before_fence@N:S`: (backfill) wait S seconds after validating (which reads the progress), before fencing
                            older runs (N is ignored): another run can commit every chunk in between
A crash is a SIGKILL of the job's whole process group (the Python driver and its JVM), like `kill -9`.
Each fault fires once per checkpoint: a marker file beside the checkpoint's run state remembers it, so the
replayed batch after the restart goes through.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from onceflow.wire import OnceflowError

POINTS = (
    "crash_before_produce",
    "crash_after_produce",
    "crash_after_commit",
    "raise_after_commit",
    "stall_in_txn",
    "hang_send_offsets",
    "crash_in_chunk",
    "crash_after_chunk",
    "stall_before_chunks",
    "stall_before_fence",
    "undeliverable",
)
STALLS = ("stall_in_txn", "hang_send_offsets", "stall_before_chunks", "stall_before_fence")
ARMED = -1  # the batch of a fault that fires when armed (`arm`), not at a planned batch


class InjectedFault(OnceflowError):
    """An error raised on purpose (fault injection), not a crash."""


class FaultSpecError(OnceflowError, ValueError):
    pass


@dataclass(frozen=True)
class Fault:
    point: str
    batch: int
    seconds: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.point}@{self.batch}"


def parse(spec: str) -> list[Fault]:
    out = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        try:
            point, rest = item.split("@", 1)
            batch_s, _, secs = rest.partition(":")
            f = Fault(point, ARMED if batch_s == "armed" else int(batch_s), float(secs) if secs else 0.0)
        except ValueError:
            raise FaultSpecError(f"bad fault {item!r}: expected point@batch[:seconds]") from None
        if f.point not in POINTS:
            raise FaultSpecError(f"unknown fault point {f.point!r}; known: {', '.join(POINTS)}")
        if f.batch == ARMED and f.point != "stall_in_txn":
            raise FaultSpecError(f"{item!r}: only stall_in_txn can be armed")
        if f.point in STALLS and f.seconds <= 0:
            raise FaultSpecError(f"{item!r}: {f.point} needs seconds, e.g. {f.point}@3:20")
        out.append(f)
    return out


class Injector:
    def __init__(self, spec: str, marker_dir: Path, on_fire=None):
        self.faults = parse(spec)
        self.marker_dir = marker_dir
        self.on_fire = on_fire

    def _fired(self, f: Fault) -> Path:
        return self.marker_dir / f"fault.{f.point}.{f.batch}.fired"

    def undeliverable(self, partition: int | None, offset: int | None) -> bool:
        """Is the DLQ copy of this source record to be refused (fault `undeliverable@P:O`)?"""
        return any(
            f.point == "undeliverable" and f.batch == partition and int(f.seconds) == offset for f in self.faults
        )

    def hit(self, point: str, batch: int) -> None:
        for f in self.faults:
            if f.batch == ARMED and f.point == point:
                try:
                    armed_path(self.marker_dir, point).unlink()  # once per arming, whoever armed it
                except FileNotFoundError:
                    continue
                f = Fault(point, batch, f.seconds)  # reported with the batch it held
            elif f.point != point or f.batch != batch or self._fired(f).exists():
                continue
            else:
                self.marker_dir.mkdir(parents=True, exist_ok=True)
                self._fired(f).write_text(str(time.time()))
            if self.on_fire:
                self.on_fire(f)
            if point in STALLS:
                time.sleep(f.seconds)
            elif point == "raise_after_commit":
                raise InjectedFault(f"injected error after the commit of batch {batch}")
            else:
                os.killpg(os.getpgrp(), signal.SIGKILL)


def armed_path(marker_dir: Path, point: str) -> Path:
    return marker_dir / f"fault.{point}.armed"


def arm(marker_dir: Path, point: str = "stall_in_txn") -> None:
    """Arm the job's `point@armed` fault: its next batch holds its transaction open (the chaos runs' way to find a
    transaction open when they kill its coordinator)."""
    marker_dir.mkdir(parents=True, exist_ok=True)
    armed_path(marker_dir, point).write_text(str(time.time()))
