"""Progress lines of long work (a backfill's chunks, a recount's stages): what the operator reads in the Airflow task
log and at the terminal while the work runs, and how a reader finds them in a child's noisy output.

A line is `MARKER` followed by the text; `extract` finds them in whatever else the process wrote (Spark's and the
JVM's own output, other log lines), so the child's log file stays whole and only the progress is relayed."""

from __future__ import annotations

import logging

MARKER = "onceflow-progress: "

log = logging.getLogger("onceflow.progress")


def report(text: str) -> None:
    """Say how far the work is: the line goes to the log (stderr of a batch job, the CLI's terminal)."""
    log.info("%s%s", MARKER, text)


def _duration(s: float) -> str:
    s = max(0, int(round(s)))
    if s < 90:
        return f"{s} s"
    if s < 5400:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {(s % 3600) // 60:02d} min"


def step(what: str, done: int, total: int, unit: str, records: int, elapsed_s: float, start: int = 0) -> str:
    """`backfill bf-1: chunk 3 of 10, 15000 records, 2500 records/s, ETA 7 s`: k of n, the records this run wrote,
    their rate and the time left at that rate. `start`: the steps done before this run began (a resumed backfill),
    which took none of its time."""
    rate = records / elapsed_s if elapsed_s > 0 else 0.0
    text = f"{what}: {unit} {done} of {total}, {records} records, {rate:.0f} records/s"
    if start < done < total and elapsed_s > 0:
        text += f", ETA {_duration((total - done) * elapsed_s / (done - start))}"
    elif done >= total:
        text += f", done in {_duration(elapsed_s)}"
    return text


def extract(text: str) -> list[str]:
    """The progress lines in `text` (complete lines only), without their marker."""
    out = []
    for line in text.splitlines():
        i = line.find(MARKER)
        if i >= 0:
            out.append(line[i + len(MARKER) :].strip())
    return out
