"""One engine for the fault loops of `make chaos` (one node and the cluster) and `make soak`.

A run's plan is a list of steps (chaos_plan.Step: when, which kind of fault, how long), drawn from its seed. The
engine carries them out in time order, each by the fault of its kind, and records what happened in a
chaos_plan.Outcome: every fault injected, with when it began and when what it stopped was started again, and every
planned step that could not be injected, with why. A step is never skipped in silence.

A fault is a function of its step: it begins the fault and returns `Began` (when, and how to start again what it
stopped), or raises `Missed` with the reason. What a fault stopped is started again `step.duration` later: inline,
so the next step waits (`overlap=False`: one node, the soak), or by a timer, so later steps begin on time while it
is down (`overlap=True`: the cluster, where a deliberate double fault is a step inside an outage).

With `live`, every step lands on a live platform: before it, `live(ms)` waits for a batch committed since the
previous fault began; the first step, for one since the engine began (a job still on its first batch is not live:
cluster seed 1 drew a worker kill 1 s after the job's start, whose first batch had to wait for a new executor).
Each fault's liveness figures are then its own, and a verdict does not depend on which faults a seed happens to
draw close together (cluster seed 2 drew a leader kill and a worker kill in one second, then a
leader kill and a job kill a second apart: next commits 124-164 s against a 120 s bound). A deliberate overlap
(`Step.note`) is exempt: landing inside another fault is its point.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from onceflow.rules import clock
from onceflow.wire import OnceflowError
from onceflow_dev.chaos_plan import Injected, Outcome, Step

log = logging.getLogger("onceflow_dev.scenario")


@dataclass(frozen=True)
class Began:
    """A fault as it began: at `at_ms`; `restart` starts again what it stopped (None: nothing to start, as a kill -9
    of the job, whose supervisor or standby brings it back; or a fault that ended itself at `end_ms`)."""

    at_ms: int
    restart: Callable[[], object] | None = None
    end_ms: int | None = None
    from_end: bool = False  # its liveness figures run from its end (it stops progress by its nature)
    note: str = ""


class Missed(OnceflowError):
    """A planned step that could not be injected; the message says why."""


Fault = Callable[[Step], Began]


class Scenario:
    """Carries out a plan (`run`) with the faults of each kind; `before` runs ahead of every step (a wait the run
    needs between faults) and may raise Missed too, as may `live` (a commit since the previous fault began)."""

    def __init__(
        self,
        faults: Mapping[str, Fault],
        t0: float,
        *,
        overlap: bool = False,
        before: Callable[[Step], None] | None = None,
        live: Callable[[int], None] | None = None,
    ):
        self.faults, self.t0, self.overlap, self.before, self.live = faults, t0, overlap, before, live
        self.outcome = Outcome()
        self.last_began_ms = 0  # when the previous injected fault began (the first: when the run began)

    def run(self, steps: list[Step]) -> Outcome:
        unknown = sorted({st.kind for st in steps} - set(self.faults))
        if unknown:
            raise ValueError(f"the plan has steps of kinds no fault carries out: {unknown}")
        timers: list[threading.Timer] = []
        self.last_began_ms = clock.now_ms()  # the first step waits for a commit since the engine began
        for st in sorted(steps, key=lambda x: x.at):
            time.sleep(max(0.0, st.at - self.elapsed()))
            try:
                if self.live is not None and not st.deliberate_overlap:
                    self.live(self.last_began_ms)
                if self.before is not None:
                    self.before(st)
                began = self.faults[st.kind](st)
            except Missed as e:
                self.outcome.miss(st, str(e))
                log.warning("t=%.0fs %s not injected: %s", self.elapsed(), st.kind, e)
                continue
            self.last_began_ms = began.at_ms
            if began.restart is None:
                self._record(st, began, began.end_ms if began.end_ms is not None else began.at_ms)
            elif self.overlap:
                timer = threading.Timer(st.duration, self._end, args=(st, began))
                timer.start()
                timers.append(timer)
            else:
                time.sleep(st.duration)
                self._end(st, began)
            log.info("t=%.0fs %s (%s)", self.elapsed(), st.kind, self.outcome.counts())
        for timer in timers:
            timer.join()
        return self.outcome

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def _end(self, st: Step, began: Began) -> None:
        assert began.restart is not None  # only faults that stopped something end here
        try:
            began.restart()
        except Exception as e:  # recorded: a run fails on a fault it could not end
            log.error("t=%.0fs starting again after %s failed: %s", self.elapsed(), st.kind, e)
            self.outcome.miss(st, f"{st.kind}: starting again failed: {e}")
            return
        self._record(st, began, clock.now_ms())
        log.info("t=%.0fs %s over after %.0f s", self.elapsed(), st.kind, st.duration)

    def _record(self, st: Step, began: Began, end_ms: int) -> None:
        self.outcome.injected.append(Injected(st.kind, began.at_ms, end_ms, began.from_end, began.note))
