"""The chaos runs' pure parts: a fault plan within what the topology tolerates, and liveness as figures.

A run is only a proof of liveness if its verdict does not depend on the seed. So:
- broker faults never overlap: each one's node must be back and caught up before the next (the runner also waits
  for every partition to be fully in sync); a topology of three nodes with min ISR 2 tolerates one node down, and
  a second one down is a deliberate step of its own, which says so (`Step.note`), never an accident of the seed;
- every fault lands on a live platform: the engine waits for a commit since the previous fault began
  (onceflow_dev.scenario), so no two faults a seed draws close together are judged as one;
- every planned step is injected, or the run fails and names the step and why (`Outcome.missed`);
- liveness is measured per fault: the time to the next committed batch and the time until the lag is back at its
  level before the fault, each against a stated bound (`Bounds`), with the median and the worst per kind;
- and between faults: the longest time between two commits is reported, and a wait between commits in which no
  fault began is held to the next-commit bound too (`commit_gap`), so a stall no fault explains fails the run.

Everything here is pure (no broker, no clock): `onceflow_dev.chaos` and `onceflow_dev.chaos_cluster` run it.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field
from typing import Any

from onceflow import wire

# the faults that take a broker node down (its partitions lose a replica until it is back and caught up)
BROKER_FAULTS = frozenset({"kill_leader", "kill_coordinator", "broker_down", "restart_broker"})
# the faults the platform must ride through while they last: the committed batches go on (or resume within the
# bound) from the moment they start. The others stop the job's progress by their nature (a paused driver, every
# replica of a partition gone): their figures run from the moment they end.
DOUBLE_FAULT_NOTE = (
    "deliberate double fault: a second node killed inside the outage, so two of three are down and min ISR 2 "
    "refuses every write until one is back; commits stall, by design, and must resume once a node is back"
)


@dataclass(frozen=True)
class Step:
    at: float  # seconds from the run's start
    kind: str
    duration: float = 0.0  # how long what it stops stays stopped
    note: str = ""  # why this step overlaps another, when that is its point

    @property
    def deliberate_overlap(self) -> bool:
        return bool(self.note)


@dataclass(frozen=True)
class Bounds:
    """What liveness means for a run, in seconds: a fault is followed by a committed batch within `commit_s`, and
    the lag is back at its level before the fault within `lag_s`."""

    commit_s: float = 120.0
    lag_s: float = 300.0


@dataclass(frozen=True)
class Injected:
    """A fault as it happened: when it began and when what it stopped was started again (epoch ms)."""

    kind: str
    start_ms: int
    end_ms: int
    from_end: bool = False  # figures run from its end (a fault that stops progress by its nature)
    note: str = ""

    @property
    def from_ms(self) -> int:
        return self.end_ms if self.from_end else self.start_ms


@dataclass
class Outcome:
    """What a run's faults did: each injected one with its figures, each planned one that was not, and why."""

    injected: list[Injected] = field(default_factory=list)
    missed: list[dict[str, Any]] = field(default_factory=list)

    def miss(self, step: Step, why: str) -> None:
        self.missed.append({"at_s": round(step.at, 1), "kind": step.kind, "why": why})

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.injected:
            out[f.kind] = out.get(f.kind, 0) + 1
        return out


def spread(rng: random.Random, n: int, lo: float, hi: float, seconds: float) -> list[float]:
    return [rng.uniform(lo, hi) * seconds for _ in range(n)]


def serialise(steps: list[Step], settle_s: float) -> list[Step]:
    """Broker faults one after another: a broker fault that would start while another one's node is down, or
    within `settle_s` of its return (catching up), moves to after that. Steps with a note (a deliberate overlap)
    stay where they are. Other kinds are left alone."""
    out: list[Step] = []
    busy_until = float("-inf")
    for st in sorted(steps, key=lambda x: x.at):
        if st.kind in BROKER_FAULTS and not st.deliberate_overlap:
            if st.at < busy_until:
                st = Step(busy_until, st.kind, st.duration, st.note)
            busy_until = st.at + st.duration + settle_s
        out.append(st)
    return sorted(out, key=lambda x: x.at)


def cluster_plan(
    seed: int,
    seconds: float,
    job_kills: int,
    leader_kills: int,
    coordinator_kills: int,
    worker_kills: int,
    broker_down_s: float,
    double_fault: bool = False,
    settle_s: float = 30.0,
) -> list[Step]:
    """The cluster run's schedule. The long outage starts at 20 % of the run; the other faults land between 5 % and
    85 %, the broker faults serialised around it. With `double_fault`, one more node is killed a third of the way
    into the outage, for 20 s."""
    rng = random.Random(seed)
    steps = [Step(t, "kill_job") for t in spread(rng, job_kills, 0.05, 0.85, seconds)]
    steps += [Step(t, "kill_leader", rng.uniform(3, 10)) for t in spread(rng, leader_kills, 0.05, 0.85, seconds)]
    steps += [Step(t, "kill_coordinator", 5.0) for t in spread(rng, coordinator_kills, 0.05, 0.85, seconds)]
    steps += [Step(t, "kill_worker", rng.uniform(5, 15)) for t in spread(rng, worker_kills, 0.05, 0.85, seconds)]
    outage = Step(0.2 * seconds, "broker_down", broker_down_s)
    steps.append(outage)
    if double_fault:
        steps.append(Step(outage.at + broker_down_s / 3, "kill_leader", 20.0, DOUBLE_FAULT_NOTE))
    return serialise(steps, settle_s)


def single_node_plan(
    seed: int,
    seconds: float,
    job_kills: int,
    broker_restarts: int,
    pauses: int,
    settle_s: float = 15.0,
    database_crashes: int = 0,
) -> list[Step]:
    """The one-node run's schedule: faults between 5 % and 85 % of the run (the rest is a job left alone), broker
    restarts one at a time. With a PostgreSQL sink, `database_crashes` crash-restarts of its server (drawn after the
    rest, so a seed's other faults stay where they were)."""
    rng = random.Random(seed)
    steps = [Step(t, "kill_job") for t in spread(rng, job_kills, 0.05, 0.85, seconds)]
    steps += [Step(t, "restart_broker", rng.uniform(2, 8)) for t in spread(rng, broker_restarts, 0.1, 0.8, seconds)]
    steps += [Step(t, "pause_driver", rng.uniform(2, 12)) for t in spread(rng, pauses, 0.05, 0.85, seconds)]
    steps += [Step(t, "crash_database", rng.uniform(1, 6)) for t in spread(rng, database_crashes, 0.05, 0.85, seconds)]
    return serialise(steps, settle_s)


def cut_short(injected: list[Injected]) -> int:
    """How many held transactions (stall_in_txn) a kill of the job cut before their timeout: such a transaction ends
    with its driver (the next one fences it, or the database rolls it back) and no timeout can be reported for it.
    The job's stalls come at the batches it chose, so the schedule cannot always keep its kills clear of them."""
    kills = [f.start_ms for f in injected if f.kind == "kill_job"]
    return sum(1 for f in injected if f.kind == "stall_in_txn" and any(f.start_ms <= k < f.end_ms for k in kills))


def commit_times(events: dict[int, int], ledger: dict[int, int]) -> list[int]:
    """When each committed batch committed: its `batch_committed` event's time (batch -> ms), or, for a batch whose
    event was lost (the driver killed between its commit and the event's delivery: seed 1 on the cluster counted a
    leader kill's next commit 67 s late for it), its ledger record's commit time (batch -> ms: written just before
    the commit, so early by the commit's own duration, and by a stall the run injects after it). The ledger, not
    the events, says what committed."""
    return sorted(events.get(b, t) for b, t in ledger.items())


def lag_at(samples: list[tuple[int, int]], ms: int) -> int | None:
    """The last lag sample at or before `ms` (samples are (epoch ms, lag) in time order)."""
    before = [lag for t, lag in samples if t <= ms]
    return before[-1] if before else None


def liveness(
    injected: list[Injected], commits_ms: list[int], lag: list[tuple[int, int]], bounds: Bounds, lag_slack: int
) -> dict[str, Any]:
    """Per fault: seconds from it (its start, or its end for a fault that stops progress by its nature) to the next
    committed batch, and to the lag back at its level before the fault (plus `lag_slack` records: a batch's worth
    of the input's pace, the lag's own noise). A figure that is missing (no commit, lag never back) or over its
    bound is a violation. When more faults start before the lag is back, the lag's recovery is no longer this
    fault's alone: its bound then runs from the last of them (seed 1 on the cluster: five job kills a minute apart,
    each restart a minute long, and the lag back only once they stopped). The same holds for the next commit: a fault
    that begins before it (the job's own stall at a planned batch, which no step's wait can hold back, on the first
    batch after a kill) makes the wait no longer this fault's alone, and its bound runs from the last of them. Per
    kind: the median and the worst of each figure."""
    commits = sorted(commits_ms)
    samples = sorted(lag)
    ordered = sorted(injected, key=lambda x: x.start_ms)
    faults: list[dict[str, Any]] = []
    violations: list[str] = []
    for f in ordered:
        nxt = next((c for c in commits if c > f.from_ms), None)
        to_commit = None if nxt is None else (nxt - f.from_ms) / 1000
        before_commit, commit_anchor = _last_of(f, ordered, nxt)
        commit_judged = None if nxt is None or nxt <= commit_anchor else (nxt - commit_anchor) / 1000
        before = lag_at(samples, f.start_ms)
        to_lag = judged = None
        overlapped: list[Injected] = []
        if before is not None:
            level = before + lag_slack
            back = next((t for t, n in samples if t > f.from_ms and n <= level), None)
            to_lag = None if back is None else (back - f.from_ms) / 1000
            overlapped, anchor = _last_of(f, ordered, back)
            judged = None if back is None else (back - anchor) / 1000
        row = {
            "kind": f.kind,
            "at_ms": f.start_ms,
            "down_s": round((f.end_ms - f.start_ms) / 1000, 1),
            "measured_from": "end" if f.from_end else "start",
            "to_commit_s": None if to_commit is None else round(to_commit, 1),
            "lag_before": before,
            "to_lag_s": None if to_lag is None else round(to_lag, 1),
        }
        if before_commit:
            row["commit_overlapped_by"] = len(before_commit)
            row["commit_judged_from_last_s"] = None if commit_judged is None else round(commit_judged, 1)
        if overlapped:
            row["lag_overlapped_by"] = len(overlapped)
            row["lag_judged_from_last_s"] = None if judged is None else round(judged, 1)
        if f.note:
            row["note"] = f.note
        faults.append(row)
        what = f"{f.kind} at {f.start_ms}"
        judged_commit = commit_judged if before_commit else to_commit
        if judged_commit is None or judged_commit > bounds.commit_s:
            since = f" of the last of {len(before_commit) + 1} faults" if before_commit else ""
            violations.append(
                f"{what}: no committed batch within {bounds.commit_s:.0f} s{since} (got {row['to_commit_s']})"
            )
        if before is not None and (judged is None or judged > bounds.lag_s):
            since = f" of the last of {len(overlapped) + 1} faults" if overlapped else ""
            violations.append(f"{what}: lag not back at {before} (+{lag_slack}) within {bounds.lag_s:.0f} s{since}")
    gap, gap_violations = commit_gap(commits, ordered, bounds)
    by_kind: dict[str, dict[str, Any]] = {}
    for kind in sorted({str(r["kind"]) for r in faults}):
        rows = [r for r in faults if r["kind"] == kind]
        by_kind[kind] = {"n": len(rows), **_spread("to_commit_s", rows), **_spread("to_lag_s", rows)}
    return {
        "bounds": {"commit_s": bounds.commit_s, "lag_s": bounds.lag_s, "lag_slack": lag_slack},
        "faults": faults,
        "by_kind": by_kind,
        "violations": violations + gap_violations,
        "commit_gap": gap,
        "lag_samples": samples,  # (epoch ms, lag): the figures can be judged again from the report
    }


def commit_gap(commits: list[int], ordered: list[Injected], bounds: Bounds) -> tuple[dict[str, Any], list[str]]:
    """The longest time between two commits, and every wait between commits that no fault accounts for.

    A fault's own figure stops at its next commit, so a stall after it went unseen: on seed 4711 on the cluster
    (2026-11-30) a coordinator kill's next commit came after 9.5 s, and the batch after it waited 71 s on a
    `send_offsets` call that did not return. A wait from commit `a` to commit `b` in which a fault began or is
    judged from (its start, or its end for a fault that stops progress by its nature) is that fault's next commit,
    judged by `liveness`; any other wait must be within the next-commit bound, or the run fails. The wait before
    the first commit (the job's start) is not a gap."""
    pairs = list(zip(commits, commits[1:], strict=False))
    violations = [
        f"no committed batch for {(b - a) / 1000:.1f} s from {a}, and no fault began in that time "
        f"(bound {bounds.commit_s:.0f} s)"
        for a, b in pairs
        if b - a > bounds.commit_s * 1000 and not any(a <= f.start_ms < b or a <= f.from_ms < b for f in ordered)
    ]
    if not pairs:
        return {"longest_s": None, "from_ms": None, "faults_in_it": []}, violations
    a, b = max(pairs, key=lambda p: p[1] - p[0])
    in_flight = [f.kind for f in ordered if f.start_ms < b and f.end_ms >= a]
    return {"longest_s": round((b - a) / 1000, 1), "from_ms": a, "faults_in_it": in_flight}, violations


def _last_of(f: Injected, ordered: list[Injected], until_ms: int | None) -> tuple[list[Injected], int]:
    """The faults that began after `f` and before `until_ms` (None: not yet), and the moment the last of them (or `f`)
    is judged from."""
    later = [g for g in ordered if f.start_ms < g.start_ms and (until_ms is None or g.start_ms < until_ms)]
    return later, max([f.from_ms, *(g.from_ms for g in later)])


def _spread(key: str, rows: list[dict[str, Any]]) -> dict[str, float | None]:
    vals = [r[key] for r in rows if r[key] is not None]
    name = key.removesuffix("_s")
    return {
        f"{name}_median_s": round(statistics.median(vals), 1) if vals else None,
        f"{name}_worst_s": max(vals) if vals else None,
    }


# The job's events that stop it for an operator (not restarted): a run that ends in one waits for a person, and
# the report names it rather than only the liveness bound it then breaks.
OPERATOR_STOPS = (wire.TRANSACTION_HANGING, wire.FENCED, wire.DIVERGENT_HISTORY)


def failures(report: dict[str, Any], checks: dict[str, bool]) -> list[str]:
    """Why a chaos run fails, in words, from its report and the runner's own `checks` (what each must hold, named
    by what a failure means); empty: it passes."""
    out = []
    if report["lost"]:
        out.append(f"{report['lost']} records lost")
    if report["duplicated"]:
        out.append(f"{report['duplicated']} results written twice")
    if not report["dlq_complete"]:
        out.append("the DLQ is not the malformed input once each (missing, unexpected or doubled records)")
    if not report["invariants_ok"]:
        out.append("an invariant failed (I1-I4 or the accounting: the audit)")
    if report["missed"]:
        out.append(f"{len(report['missed'])} planned fault(s) not injected")
    violations = report["liveness"]["violations"]
    if violations:
        out.append(f"{len(violations)} liveness bound(s) exceeded")
    stops = report.get("operator_stops") or []
    if stops:
        out.append(f"the job stopped for an operator ({', '.join(sorted(set(stops)))})")
    out += [what for what, ok in checks.items() if not ok]
    return out


def reasons(report: dict[str, Any]) -> str:
    """Why a run failed, on one line (its failures)."""
    return "; ".join(report.get("failures") or ["(no reason recorded)"])


def verdict(report: dict[str, Any]) -> str:
    return "PASS" if report["ok"] else f"FAIL: {reasons(report)}"
