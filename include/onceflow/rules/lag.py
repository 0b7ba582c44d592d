"""Consumer lag evaluation modelled on LinkedIn Burrow's rules (pure logic, no I/O).

Each health run appends one sample per partition (time, committed offset, end offset). Over the window of the
last samples a partition is:
- OK      lag is zero at some point in the window, or the committed offset moves and lag does not grow;
- WARN    the committed offset moves but lag grows across the whole window (falling behind), beyond what a job that
          keeps up shows between two of its commits (`noise_s`: the input of that many seconds; a micro-batch job
          commits every trigger interval, so a sample taken at a random point of that cycle sees anything from 0
          up to a batch of input, and three samples in a row can grow by chance alone);
- STALL   lag > 0 and the committed offset never moved across the window (the consumer is stuck);
- STOP    lag > 0 and the newest commit is older than the window's span (the consumer stopped committing);
- REWIND  the committed offset went backwards.

A restart of the job starts a new window for the other rules (`since_ms`, the current run's start), and the run
is judged from its first commit on (`run_committed`): the lag that grew while the job was down, starting and
running its first batch is the restart's, judged by health's down and progress rules against their own thresholds
(a start slower than two health intervals is not a stuck consumer), not a consumer falling behind or stalled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any


class Level(StrEnum):
    """A partition's lag status (the rules above), worst last."""

    OK = "OK"
    WARN = "WARN"
    REWIND = "REWIND"
    STALL = "STALL"
    STOP = "STOP"

    @property
    def severity(self) -> int:
        return {"OK": 0, "WARN": 1, "REWIND": 2, "STALL": 3, "STOP": 3}[self.value]


@dataclass(frozen=True)
class Sample:
    ts_ms: int
    committed: int
    end: int
    commit_ts_ms: int | None = None  # when the committed offset last changed, if known

    @property
    def lag(self) -> int:
        return max(0, self.end - self.committed)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Trend(StrEnum):
    FLAT = "flat"
    GROWING = "growing"
    SHRINKING = "shrinking"


def trend(samples: Sequence[Sample]) -> Trend:
    if len(samples) < 2:
        return Trend.FLAT
    first, last = samples[0].lag, samples[-1].lag
    return Trend.GROWING if last > first else Trend.SHRINKING if last < first else Trend.FLAT


def evaluate(
    samples: Sequence[Sample],
    min_samples: int = 3,
    since_ms: int | None = None,
    run_committed: bool = True,
    noise_s: float = 0.0,
) -> Level:
    """The Burrow status of one partition over its sample window (oldest first). With `since_ms` (the job's current
    run's start) the samples before it count only for REWIND, and the run is judged from its first commit on: until
    then (`run_committed` False) it is OK here, and falling behind (WARN) is judged from the first sample that moved:
    a run begins with a backlog and a slow first batch. `noise_s`: lag up to the input of that many seconds (at the
    window's own input rate) is the commit cycle's, not falling behind."""
    for a, b in zip(samples, samples[1:]):
        if b.committed < a.committed:
            return Level.REWIND
    if since_ms is not None:
        if not run_committed:
            return Level.OK
        samples = [s for s in samples if s.ts_ms >= since_ms]
    if not samples:
        return Level.OK
    last = samples[-1]
    if last.lag == 0 or any(s.lag == 0 for s in samples):
        return Level.OK
    if len(samples) < min_samples:
        return Level.OK
    span = samples[-1].ts_ms - samples[0].ts_ms
    moved = samples[-1].committed != samples[0].committed
    if not moved:
        if last.commit_ts_ms is not None and last.ts_ms - last.commit_ts_ms > span:
            return Level.STOP
        return Level.STALL
    if since_ms is not None:
        samples = samples[next(i for i, s in enumerate(samples) if s.committed != samples[0].committed) :]
    lags = [s.lag for s in samples]
    if len(lags) >= min_samples and all(b > a for a, b in zip(lags, lags[1:])) and last.lag > cycle(samples, noise_s):
        return Level.WARN
    return Level.OK


def cycle(samples: Sequence[Sample], noise_s: float) -> float:
    """The lag a job that keeps up may show between two commits: the records `noise_s` seconds of the window's input
    bring (its end offsets' growth over its span)."""
    span_s = (samples[-1].ts_ms - samples[0].ts_ms) / 1000
    if noise_s <= 0 or span_s <= 0:
        return 0.0
    return (samples[-1].end - samples[0].end) / span_s * noise_s


def worst(statuses: Sequence[str]) -> Level:
    return max((Level(s) for s in statuses), key=lambda s: s.severity, default=Level.OK)
