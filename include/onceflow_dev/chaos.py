"""`make chaos`: exactly-once under faults, in the manner of Kafka's own transaction system tests.

A bounded run on a private broker: the generator writes CHAOS_RECORDS / CHAOS_SECONDS records a second (late,
out-of-order and malformed ones among them) for CHAOS_SECONDS, and on until every planned fault is over and a batch
has committed after the last one (a fault after the input ended would have nothing to commit: its liveness could
not be measured), while a seeded schedule injects `kill -9`s of the job, hard kills and
restarts of the broker, SIGSTOP/SIGCONT pauses of the driver, and transactions held past their timeout (the
job's `stall_in_txn` fault at chosen batches). Then it waits for the job to drain, verifies the whole history
(`verify`: the generator's manifest in the source, the app's own audit or the ledger's accounting, lost and
duplicated must be 0, the DLQ complete) and with a Spark reconciliation run (the replay of the app's plan among its
checks), and prints what happened. Exit 1 on any loss, duplicate or failed check. Any declared app (CHAOS_APP).
CHAOS_SINK=postgres: the app writes to PostgreSQL (its server under the run's var dir), which is crash-restarted
CHAOS_DATABASE_CRASHES times too; a held transaction is then ended by the server's idle-in-transaction timeout.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import KafkaException

from onceflow import config, logs, wire
from onceflow.kafka import events as ev
from onceflow.kafka import reading as kafka_reading
from onceflow.kafka import topics
from onceflow.operations import audit
from onceflow.rules import clock
from onceflow.rules.names import private_topics
from onceflow.runtime import jobctl, launcher, procs
from onceflow.runtime.stacks import driver_pid
from onceflow_dev import (
    broker,
    chaos_plan,
    generator,
    interrupt,
    loopback,
    machine,
    postgres,
    scenario,
    stack,
    stall_stacks,
)
from onceflow_dev.generator import KIND_TAIL

log = logging.getLogger("onceflow_dev.chaos")


def env_or(name: str, default):
    """An environment variable as the type of its default (the CHAOS_* and SOAK_* knobs)."""
    return type(default)(os.environ.get(name, default))


@dataclass
class ChaosSpec:
    seconds: float = field(default_factory=lambda: env_or("CHAOS_SECONDS", 600.0))
    records: int = field(default_factory=lambda: env_or("CHAOS_RECORDS", 1_000_000))
    job_kills: int = field(default_factory=lambda: env_or("CHAOS_JOB_KILLS", 20))
    broker_restarts: int = field(default_factory=lambda: env_or("CHAOS_BROKER_RESTARTS", 3))
    stalls: int = field(default_factory=lambda: env_or("CHAOS_STALLS", 3))
    pauses: int = field(default_factory=lambda: env_or("CHAOS_PAUSES", 3))
    seed: int = field(default_factory=lambda: env_or("CHAOS_SEED", 1))
    # the declared app under faults (CHAOS_APP=ip_networks: the stateless one): its own settings, on chaos topics
    app: str = field(default_factory=lambda: env_or("CHAOS_APP", "ip_count"))
    # a warm standby driver takes over killed drivers (CHAOS_STANDBY=0: every kill is a cold restart)
    standby: int = field(default_factory=lambda: env_or("CHAOS_STANDBY", 1))
    # how long an even kill waits for the standby's session to be up; after it the kill is a cold restart. It was
    # 300 s: three held transactions' restarts each take the standby, and one seed waited 5 minutes per kill
    standby_wait_s: float = field(default_factory=lambda: env_or("CHAOS_STANDBY_WAIT_S", 60.0))
    # CHAOS_SECURED=1: on the secured stack (SASL/SCRAM over TLS, ACLs), the job on its least-privileged principal
    secured: int = field(default_factory=lambda: env_or("CHAOS_SECURED", 0))
    # CHAOS_SINK=postgres: the app writes to PostgreSQL (docs/database-sink.md), whose server crashes too
    sink: str = field(default_factory=lambda: env_or("CHAOS_SINK", "kafka"))
    database_crashes: int = field(default_factory=lambda: env_or("CHAOS_DATABASE_CRASHES", 3))
    # the job's drivers (and its standby) map a class-data archive of Spark's classes, as the platform's default
    # (ONCEFLOW_CLASS_DATA_SHARING): a restart and a standby's start load fewer classes; CHAOS_CLASS_DATA=0: without
    class_data: int = field(default_factory=lambda: env_or("CHAOS_CLASS_DATA", 1))
    ips: int = 5000


class Feed:
    """A chaos run's input: paced at `rate` records a second, for at least `seconds`, and on until `finish` (the
    faults are over and a batch committed after the last one). The manifest holds what was sent."""

    CAP = 30  # the input never runs longer than this many times `seconds`

    def __init__(self, s, rate: float, seconds: float, seed: int, ips: int, watermark_s: int, manifest):
        self.s, self.seconds, self.manifest = s, seconds, manifest
        self.stop = threading.Event()
        self.spec = generator.GeneratorSpec(
            count=None,
            duration_s=seconds * self.CAP,
            rate=rate,
            distinct_ips=ips,
            seed=seed,
            late_fraction=0.01,
            out_of_order_fraction=0.05,
            malformed_fraction=0.02,
            tail_s=30,
            watermark_s=watermark_s,
        )
        self.thread = threading.Thread(target=self._run, daemon=True, name="chaos-feed")
        self.failed: list[BaseException] = []

    def _run(self) -> None:
        try:
            generator.generate(self.s, self.spec, manifest=self.manifest, progress_every=100_000, stop=self.stop)
        except BaseException as e:  # reported by finish()
            self.failed.append(e)

    def start(self) -> None:
        self.t0 = time.monotonic()
        self.thread.start()

    def finish(self, job, after_ms: int, timeout: float = 300.0) -> list:
        """Stop once a batch committed after `after_ms` (the last fault's end) and `seconds` have passed; the
        records sent."""
        if not wait_commit_since(job, after_ms, timeout):
            log.warning("no batch committed within %.0f s of the last fault: its liveness figure says so", timeout)
        time.sleep(max(0.0, self.seconds - (time.monotonic() - self.t0)))
        self.stop.set()
        self.thread.join(600)
        if self.failed:
            raise RuntimeError(f"the chaos run's input failed: {self.failed[0]}") from self.failed[0]
        return generator.read_manifest(self.manifest)


def plan(spec: ChaosSpec) -> list[chaos_plan.Step]:
    """The seeded schedule (chaos_plan.single_node_plan). Faults land between 5 % and 85 % of the run, so the last
    part of the input is processed by a job that is left alone; broker restarts one at a time."""
    return chaos_plan.single_node_plan(
        spec.seed,
        spec.seconds,
        spec.job_kills,
        spec.broker_restarts,
        spec.pauses,
        database_crashes=spec.database_crashes if spec.sink == "postgres" else 0,
    )


def stall_batches(spec: ChaosSpec) -> list[int]:
    """The batches whose transaction is held past its timeout. Early ones (1, 3, 5, ...): how many batches a run
    has depends on how long the job was down (a backlog is read in fewer, larger batches), and a stall at a
    batch that never comes would be a fault never injected."""
    return [1 + 2 * i for i in range(spec.stalls)]


def run(spec: ChaosSpec, var_dir) -> dict:
    base = config.load(
        env={k: v for k, v in os.environ.items() if not k.startswith("ONCEFLOW_")},
        app=spec.app,
        var_dir=var_dir,
        **loopback.kafka(),
        broker_txn_abort_check_interval_ms=1000,
        broker_heap="1g",
        kafka_security_protocol="SASL_SSL" if spec.secured else "PLAINTEXT",
        class_data_sharing=bool(spec.class_data),
    )
    timeout_ms = 8000
    stall_s = timeout_ms / 1000 + 4
    s = base.replace(
        app_id="chaos",
        **private_topics("chaos"),
        trigger_interval_s=1.0,
        max_offsets_per_trigger=20_000,
        transaction_timeout_ms=timeout_ms,
        restart_attempts=1000,
        restart_delay_s=1.0,
        standby=bool(spec.standby),
        fault=",".join(f"stall_in_txn@{b}:{stall_s:.0f}" for b in stall_batches(spec)),
    )
    var_dir.mkdir(parents=True, exist_ok=True)
    stack.prepare_jvm(s)  # as `make run` does: the first job start is not a first start on this machine
    broker.start(base)
    # who does what: the job as itself; the upstream producer and the checks as the admin (all the same on a plain
    # stack); the recount as the read-only reconciliation principal
    job, observer, recon = s, s, s
    if spec.secured:
        from onceflow_dev import credentials

        observer = stack.provision(s)
        job, recon = credentials.as_role(s, "job"), credentials.as_role(s, "reconcile")
    if spec.sink == "postgres":  # the job writes as its database role, the checks read as the reader's
        job = postgres.provision_sink(job)
        observer, recon = postgres.sink_settings(observer, "reader"), postgres.sink_settings(recon, "reader")
    t0 = time.monotonic()
    manifest = var_dir / "chaos-manifest.csv"
    sampler = stacks = None
    try:
        topics.ensure(observer)
        feed = Feed(observer, spec.records / spec.seconds, spec.seconds, spec.seed, spec.ips, s.watermark_s, manifest)
        jobctl.start(job)
        jobctl.wait_running(job, timeout=300)
        sampler = LagSampler(observer)
        sampler.start()
        stacks = stall_stacks.StallStacks(job)  # a job that commits nothing for long: its stacks in its log
        stacks.start()
        feed.start()
        steps = plan(spec)
        outcome = OneNodeFaults(s, base, job, observer, spec, stall_s).run(steps, t0)
        # the stalls end by themselves (the coordinator aborts them): the last one is over a few seconds after it
        _wait_stall_over(observer, stall_s)
        ends = [f.end_ms for f in outcome.injected] + [
            e["ts_ms"] + int(stall_s * 1000) for e in events_of(observer, wire.FAULT_INJECTED)
        ]
        sent = feed.finish(observer, max(ends, default=0))
        wait_drained(observer, sent, timeout=max(600.0, spec.seconds))
        lag = sampler.stop()
        stacks_asked = stacks.stop()
        jobctl.stop(job)
        # the job's own stalls (transactions held past their timeout), as they happened
        stalls = events_of(observer, wire.FAULT_INJECTED)
        outcome.injected += [
            chaos_plan.Injected("stall_in_txn", e["ts_ms"], e["ts_ms"] + int(stall_s * 1000)) for e in stalls
        ]
        for b in stall_batches(spec)[len(stalls) :]:
            outcome.miss(chaos_plan.Step(0.0, "stall_in_txn"), f"batch {b} was never held (the run had fewer batches)")
        live = chaos_plan.liveness(
            outcome.injected,
            commit_times(observer),
            lag,
            bounds(),
            lag_slack=int(5 * spec.records / spec.seconds),
        )
        spark = launcher.local_session(s, "chaos-reconcile")
        from onceflow.operations import reconcile

        res = reconcile.run(spark, recon, with_gx=False)
        report = verify(observer, sent, recount=res)
        counts = {"kill_job": 0, "restart_broker": 0, "pause_driver": 0, "stall_in_txn": 0} | outcome.counts()
        if spec.sink == "postgres":
            counts.setdefault("crash_database", 0)
        report |= {
            "plan": [vars(st) for st in steps],
            "faults": counts,
            "missed": outcome.missed,
            "liveness": live,
            "restarts": len(restarts := events_of(observer, wire.SUPERVISOR_RESTART)),
            "standby_takeovers": sum(1 for e in restarts if e.get("standby") and e.get("delay_s") == 0),
            "transaction_timeouts": len(events_of(observer, wire.TRANSACTION_TIMEOUT)),
            "stalls_cut_by_a_kill": chaos_plan.cut_short(outcome.injected),
            "wall_s": round(time.monotonic() - t0, 1),
            "seed": spec.seed,
            "input_per_s": round(spec.records / spec.seconds),
            # liveness figures depend on the machine's speed (onceflow_dev.machine)
            "machine": machine.describe(),
            "secured": bool(spec.secured),
            "sink": spec.sink,
            "class_data": bool(spec.class_data),  # the drivers mapped a class-data archive
            # when the job, committing nothing for long, was asked for its threads' stacks (in its log)
            "stacks_asked_ms": [ms for ms, _ in stacks_asked],
        }
        report["reconciliation"] = {c.name: str(c.status) for c in res.checks}
        report["operator_stops"] = [e["type"] for e in events_of(observer, *chaos_plan.OPERATOR_STOPS)]
        report["failures"] = chaos_plan.failures(
            report,
            {
                "the reconciliation failed": res.ok,
                # every transaction held past its timeout must have been detected and reported as such
                "fewer transaction timeouts reported than transactions held past it": report["transaction_timeouts"]
                >= counts["stall_in_txn"] - report["stalls_cut_by_a_kill"],
            },
        )
        report["ok"] = not report["failures"]
        return report
    finally:
        for thread in (sampler, stacks):
            if thread is not None:
                thread.stopping.set()
        jobctl.stop(job, timeout=30)
        broker.stop(base)
        if spec.sink == "postgres":
            postgres.remove(base)


class OneNodeFaults:
    """The one-node run's faults (scenario.Fault each): kill -9 of the job (every other one onto a warm standby),
    the broker killed and started again, the driver paused, the database crash-restarted. Faults never overlap,
    each lands on a live job (a commit since the previous one began), and none starts while a held transaction
    waits for its timeout."""

    def __init__(self, s, base, job, observer, spec: ChaosSpec, stall_s: float):
        self.s, self.base, self.job, self.observer, self.spec, self.stall_s = s, base, job, observer, spec, stall_s
        self.last_kill_ms = 0
        self.kills = 0

    def run(self, steps: list[chaos_plan.Step], t0: float) -> chaos_plan.Outcome:
        faults = {
            "kill_job": self.kill_job,
            "restart_broker": self.restart_broker,
            "crash_database": self.crash_database,
            "pause_driver": self.pause_driver,
        }
        # a transaction held open must reach its timeout: no other fault until the coordinator aborted it
        return scenario.Scenario(
            faults, t0, before=lambda st: _wait_stall_over(self.observer, self.stall_s), live=live_since(self.observer)
        ).run(steps)

    def kill_job(self, st: chaos_plan.Step) -> scenario.Began:
        if not wait_commit_since(self.observer, self.last_kill_ms, 300):
            raise scenario.Missed("no batch committed since the previous job kill within 300 s")
        if self.spec.standby and self.kills % 2 == 0:
            _wait_standby(self.job, self.spec.standby_wait_s)  # every other kill lands on a warm standby (a takeover)
        at = clock.now_ms()

        def stall_over() -> None:
            # a stall may have begun meanwhile (the job picks its batch): waited out right before the kill, once the
            # job runs, not before that wait (a short chaos run's kill landed 0.8 s into a stall begun during it)
            nonlocal at
            _wait_stall_over(self.observer, self.stall_s)
            at = clock.now_ms()

        if not kill_running_job(self.job, after_ms=self.last_kill_ms, before=stall_over):
            raise scenario.Missed("no running job to kill within 300 s")
        self.last_kill_ms, self.kills = clock.now_ms(), self.kills + 1
        return scenario.Began(at)

    def restart_broker(self, st: chaos_plan.Step) -> scenario.Began:
        at = clock.now_ms()
        broker.kill(self.base)
        # one node: nothing commits while it is down, by nature; figures from its return
        return scenario.Began(at, restart=lambda: broker.start(self.base), from_end=True)

    def crash_database(self, st: chaos_plan.Step) -> scenario.Began:
        at = clock.now_ms()
        postgres.crash_restart(self.job, down_s=st.duration)
        # nothing commits while the server is down, by nature; figures from its return
        return scenario.Began(at, end_ms=clock.now_ms(), from_end=True)

    def pause_driver(self, st: chaos_plan.Step) -> scenario.Began:
        # a fault for a job that is still coming back would hit nothing: wait for its query to run
        try:
            jobctl.wait_running(self.job, after_ms=self.last_kill_ms, timeout=300)
        except TimeoutError:
            raise scenario.Missed("no running job to pause within 300 s") from None
        pid = driver_pid(self.s)  # a live driver only: the status file outlives it
        if pid is None:
            raise scenario.Missed("no running driver under the job's status file")
        at = clock.now_ms()
        os.kill(pid, signal.SIGSTOP)
        return scenario.Began(at, restart=lambda: os.kill(pid, signal.SIGCONT), from_end=True)


class LagSampler(threading.Thread):
    """The job's lag (records in the source past its committed position), sampled every `every_s` while a run
    lasts: (epoch ms, lag). A sample the cluster cannot answer (a coordinator down) is skipped."""

    def __init__(self, s, every_s: float = 1.0):
        super().__init__(daemon=True, name="chaos-lag")
        self.s, self.every_s = s, every_s
        self.samples: list[tuple[int, int]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(self.every_s):
            try:
                wm = kafka_reading.source_watermarks(self.s) or {}
                done = audit.committed_offsets(self.s, list(wm))
                lag = sum(hi - max(lo, done.get(p, 0)) for p, (lo, hi) in wm.items())
            except Exception as e:  # a fault under way: the next sample will do
                log.debug("lag sample skipped: %s", e)
                continue
            self.samples.append((clock.now_ms(), lag))

    def stop(self) -> list[tuple[int, int]]:
        self.stopping.set()
        self.join(30)
        return list(self.samples)


def bounds() -> chaos_plan.Bounds:
    """The liveness bounds of a run (CHAOS_COMMIT_BOUND_S, CHAOS_LAG_BOUND_S)."""
    d = chaos_plan.Bounds()
    return chaos_plan.Bounds(env_or("CHAOS_COMMIT_BOUND_S", d.commit_s), env_or("CHAOS_LAG_BOUND_S", d.lag_s))


def commit_times(s) -> list[int]:
    """When each batch the ledger holds committed (chaos_plan.commit_times)."""
    events = {e["batch"]: e["ts_ms"] for e in events_of(s, wire.BATCH_COMMITTED)}
    return chaos_plan.commit_times(events, {e.batch: e.commit_time_ms for e in audit.ledger_entries(s)})


def read_events(s, kinds: set[str], since_ms: int) -> list[dict]:
    """The job's events of `kinds` since `since_ms`, for a wait's condition: none while a fault makes the read fail
    (the events topic's leader killed or moving; seed 4711 on the cluster ended its run there), so it reads again."""
    try:
        return ev.read(s, kinds, since_ms=since_ms)
    except KafkaException as e:
        log.info("reading the job's events while a broker is away: %s (read again)", e)
        return []


def wait_commit_since(s, since_ms: int, timeout: float) -> bool:
    """A batch committed after `since_ms`, within `timeout` seconds: a job kill lands on a job that has made
    progress since the last one (a kill before that tests a restart loop, not recovery)."""
    try:

        def committed() -> bool:
            return any(e["ts_ms"] > since_ms for e in read_events(s, {wire.BATCH_COMMITTED}, since_ms))

        procs.wait_until(committed, timeout, interval=1.0, what="a commit")
        return True
    except TimeoutError:
        return False


LIVE_WAIT_S = 300.0  # how long a step waits for a commit since the previous fault before it is a miss


def live_since(s) -> Callable[[int], None]:
    """The fault engine's `live` wait (scenario.Scenario): a batch committed since the previous fault began, or the
    step is a miss that says so."""

    def wait(since_ms: int) -> None:
        if not wait_commit_since(s, since_ms, LIVE_WAIT_S):
            raise scenario.Missed(f"no batch committed within {LIVE_WAIT_S:.0f} s since the previous fault began")

    return wait


def liveness_lines(live: dict) -> str:
    """The liveness figures per fault kind, for the printed report."""
    rows = []
    for kind, k in live["by_kind"].items():
        rows.append(
            f"  {kind:<17} n={k['n']:<3} next commit median {k['to_commit_median_s']} s, worst "
            f"{k['to_commit_worst_s']} s; lag back median {k['to_lag_median_s']} s, worst {k['to_lag_worst_s']} s"
        )
    gap = live.get("commit_gap") or {}
    if gap.get("longest_s") is not None:
        during = ", ".join(gap["faults_in_it"]) or "no fault"
        rows.append(f"  longest time between two commits {gap['longest_s']} s ({during} in it)")
    b = live["bounds"]
    rows.append(
        f"  bounds: a commit within {b['commit_s']:.0f} s of each fault and of the commit before it when no fault "
        f"began, the lag back within {b['lag_s']:.0f} s of each fault"
    )
    rows += [f"  VIOLATION {v}" for v in live["violations"]]
    return "\n".join(rows)


def events_of(s, *types: str) -> list[dict]:
    """The app's events of these types, from the topic they live on (the job's facts: the job events topic)."""
    return ev.read(s, set(types))


def kill_running_job(s, after_ms: int = 0, timeout: float = 300.0, before: Callable[[], None] | None = None) -> bool:
    """kill -9 the job once its query runs (started after `after_ms`), `before` called right before the kill. A job
    can die on its own between that wait and the kill (a transaction held past its timeout fails its batch; the
    supervisor restarts it): then wait for the next launch and kill that one, so every planned kill hits a running
    job. False if none ran in `timeout`."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            jobctl.wait_running(s, after_ms=after_ms, timeout=left)
        except TimeoutError:
            break
        if before is not None:
            before()
        if jobctl.kill(s):
            return True
        time.sleep(0.5)
    log.warning("no running job to kill within %.0f s", timeout)
    return False


def _wait_stall_over(s, stall_s: float) -> None:
    stalls = events_of(s, wire.FAULT_INJECTED)
    if stalls:
        over = max(e["ts_ms"] for e in stalls) / 1000 + stall_s + 3  # + the failed commit and its event
        time.sleep(max(0.0, over - time.time()))


def _wait_standby(s, timeout: float = 180.0) -> None:
    try:
        procs.wait_until(
            lambda: (sb := jobctl.status(s).standby) is not None and sb.ready, timeout, what="a warm standby"
        )
    except TimeoutError:
        log.warning("no warm standby after %.0f s: this kill is a cold restart", timeout)


def wait_drained(s, sent, timeout: float) -> None:
    ends = generator.source_end_offsets(sent)
    procs.wait_until(
        lambda: audit.committed_offsets(s, ends) == ends, timeout, interval=2.0, what="the job to drain the input"
    )
    time.sleep(3 * s.trigger_interval_s)  # the windows the tail closes are emitted by the next batches


def verify(s, sent, recount=None) -> dict:
    """What the run wrote, against what it was sent (the generator's manifest), for any app: every sent record is
    in the source where the manifest says; the app's own audit where it declares one (App.audit: ip_count's
    recounts its windows), else I1 and the ledger's accounting of every sink and DLQ record (onceflow.operations.
    audit); and, given a reconciliation result (`recount`), the replay of the app's plan over the committed ranges.
    Lost and duplicated count what either found: results the audit or the replay expected and the job did not
    write, or wrote more often (the replay names at most its first differences: a lower bound, never 0 by mistake)."""
    on_broker = {(t, m.partition, m.offset) for t in s.source_topic_list for m in kafka_reading.read_topic(s, t)}
    not_in_source = sum(1 for r in sent if (r.topic, r.partition, r.offset) not in on_broker)
    rep = audit.audit(s)
    lost = len(rep.missing) + sum(max(0, e - f) for e, f in rep.wrong.values())
    duplicated = (
        sum(n - 1 for n in rep.duplicates.values())
        + sum(max(0, f - e) for e, f in rep.wrong.values())
        + len(rep.unexpected)
    )
    replay: dict = {}
    if recount is not None:
        rp = recount.check("replay")
        replay_lost, replay_dup = replay_counts(rp.differences)
        lost, duplicated = max(lost, replay_lost), max(duplicated, replay_dup)
        replay = {"replay": rp.status, "replay_summary": rp.summary}
    own_audit = s.declared_app().audit is not None
    return {
        "app": s.app,
        "audit": "its own audit" if own_audit else "I1 and the ledger's accounting",
        "records": len(sent),
        "tail_records": sum(1 for r in sent if r.kind == KIND_TAIL),
        "not_in_source": not_in_source,
        "batches": len(audit.ledger_entries(s)),
        "sink_records": rep.sink_records,
        "counted": rep.counted,
        "late": rep.late,
        # what the app rejected: the audit's own classification where it has one, else what the ledger counted
        "malformed": rep.malformed if own_audit else rep.dlq_records,
        "pending": rep.pending,
        "coverage_ok": rep.coverage.ok,
        "lost": lost,
        "duplicated": duplicated,
        "dlq_complete": not (rep.dlq_missing or rep.dlq_unexpected or rep.dlq_duplicates),
        "invariants_ok": rep.ok and not_in_source == 0,
        **replay,
    }


def replay_counts(differences: list[dict]) -> tuple[int, int]:
    """(lost, duplicated) from the replay's differences (onceflow.rules.replay.differences): a result the replay
    has and the job lacks, or has with another value, is lost; one the job wrote more often than the replay, or
    that no committed batch computes, is a duplicate."""
    lost = dup = 0
    for d in differences:
        if d["kind"] == "missing":
            lost += d["replayed"] - d["committed"]
        elif d["kind"] == "different_value":
            lost += 1
        elif d["kind"] in ("duplicate", "unexpected"):
            dup += d["committed"] - d["replayed"]
    return lost, dup


class BrokersDownByDesign(logging.Filter):
    """Leaves out librdkafka's errors of a broker it cannot reach (connection refused, disconnected, all brokers
    down): a chaos run stops brokers on purpose, and the run's own clients (hundreds over a run: one per check)
    logged a line each per attempt while a node was down (a cluster run: over a hundred lines in 20 s), burying the
    run's progress. librdkafka retries them itself; a client that cannot get through fails its call, which the run
    reports."""

    UNREACHABLE = ("Connection refused", "Disconnected", "brokers are down", "Connection reset")

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not any(s in msg for s in self.UNREACHABLE)


def prepare_var():
    """Quiet logging and an empty var/chaos for one chaos run (single or cluster topology)."""
    import shutil

    logs.setup(logging.INFO, logs.SHORT)
    for noisy in ("onceflow.events", "onceflow.kafka.client", "onceflow_dev.broker"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    client_log = logging.getLogger("onceflow.kafka.client")
    if not any(isinstance(f, BrokersDownByDesign) for f in client_log.filters):
        client_log.addFilter(BrokersDownByDesign())
    var = config.REPO_ROOT / "var" / "chaos"
    shutil.rmtree(var, ignore_errors=True)
    var.mkdir(parents=True)
    return var


def main() -> int:
    var = prepare_var()
    spec = ChaosSpec()
    report = run(spec, var)
    (var / "report.json").write_text(json.dumps(report, indent=1))
    f = report["faults"]
    print(f"""
app               {report["app"]} (checked by {report["audit"]}{" and the replay of its plan" if "replay" in report else ""})
stack             {"secured: SASL/SCRAM over TLS, ACLs; the job as its own principal" if report["secured"] else "plaintext"}{"; a class-data archive" if report["class_data"] else ""}
records           {report["records"]:,} ({report["malformed"]:,} malformed, {report["late"]:,} late) at {report["input_per_s"]:,}/s
faults injected   {f["kill_job"]} kill -9 of the job, {f["restart_broker"]} broker kill+restart, {f["pause_driver"]} driver SIGSTOP/SIGCONT, {f["stall_in_txn"]} transactions held past their timeout ({report["transaction_timeouts"]} timeouts reported, {report.get("stalls_cut_by_a_kill", 0)} cut short by a kill)
not injected      {report["missed"] or "none"}
liveness (seconds from each fault; from its end for a broker restart and a pause)
{liveness_lines(report["liveness"])}
restarts          {report["restarts"]} (supervisor; {report["standby_takeovers"]} by the warm standby)
lost              {report["lost"]}
duplicated        {report["duplicated"]}
DLQ complete      {report["dlq_complete"]}
invariants I1-I4  {"ok" if report["invariants_ok"] else "FAILED"}; reconciliation {report["reconciliation"]}
wall time         {report["wall_s"]} s
result            {chaos_plan.verdict(report)}  (report: {var / "report.json"})""")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    interrupt.run(main)
