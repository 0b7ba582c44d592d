"""`make chaos CHAOS_TOPOLOGY=cluster`: exactly-once under faults on a cluster topology, on loopback.

Three KRaft nodes (a controller quorum of three; topics replicated three ways, min.insync.replicas=2) and a Spark
standalone master with two workers; the job runs on the workers in client mode. While the generator writes
CHAOS_RECORDS / CHAOS_SECONDS records a second (for CHAOS_SECONDS, and on until the faults are over: chaos.Feed),
a seeded schedule injects:

- kill -9 of the broker that leads the sink's first partition (restarted after a few seconds);
- kill -9 of the app's transaction coordinator in the middle of a transaction (the run arms the job's stall, which
  holds its next transaction open for 8 s, below the timeout: the coordinator dies while it is open, and comes
  back; no transaction within 60 s is tried again, three times, then the run fails);
- one broker down for CHAOS_BROKER_DOWN_S (default 120 s) while the job goes on committing (counted);
- kill -9 of a Spark worker in the middle of the job (its executor goes with it; tasks are retried on the other);
- kill -9 of the job's driver (its supervisor restarts it).

Broker faults come one at a time, each once the node the last one stopped answers again and the cluster is fully
in sync: three nodes with min ISR 2 tolerate one down (onceflow_dev.chaos_plan). CHAOS_DOUBLE_FAULT=1 adds a second
node killed inside the outage on purpose; the report says so and checks that commits resume once a node is back.

Then the job drains the input and the whole history is verified against the generator's manifest, as `make
chaos` does (onceflow_dev.chaos.verify): lost 0, duplicated 0, the DLQ complete, I1-I4 exact. And liveness, per
fault: the time to the next committed batch and to the lag back at its level, against CHAOS_COMMIT_BOUND_S and
CHAOS_LAG_BOUND_S. A planned fault that was not injected fails the run, named with its reason.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onceflow import config, faults, wire
from onceflow.kafka import clients as kafka_clients
from onceflow.kafka import cluster, topics
from onceflow.rules import clock
from onceflow.rules.names import private_topics
from onceflow.runtime import jobctl, launcher, procs
from onceflow_dev import (
    broker,
    chaos,
    chaos_plan,
    interrupt,
    loopback,
    machine,
    scenario,
    spark_cluster,
    stack,
    stall_stacks,
)

log = logging.getLogger("onceflow_dev.chaos")


@dataclass
class ClusterChaosSpec:
    seconds: float = field(default_factory=lambda: chaos.env_or("CHAOS_SECONDS", 600.0))
    # 500 records/s: at 1,000 the job on the loopback cluster fell behind between faults on a slower day of this
    # 2-core machine (105,867 records behind at the first job kill, 549,741 at the last; docs/cluster.md), and a lag
    # that never comes back measures the machine's capacity, not recovery
    records: int = field(default_factory=lambda: chaos.env_or("CHAOS_RECORDS", 300_000))
    job_kills: int = field(default_factory=lambda: chaos.env_or("CHAOS_JOB_KILLS", 5))
    leader_kills: int = field(default_factory=lambda: chaos.env_or("CHAOS_LEADER_KILLS", 3))
    coordinator_kills: int = field(default_factory=lambda: chaos.env_or("CHAOS_COORDINATOR_KILLS", 2))
    worker_kills: int = field(default_factory=lambda: chaos.env_or("CHAOS_WORKER_KILLS", 2))
    broker_down_s: float = field(default_factory=lambda: chaos.env_or("CHAOS_BROKER_DOWN_S", 120.0))
    seed: int = field(default_factory=lambda: chaos.env_or("CHAOS_SEED", 1))
    app: str = field(default_factory=lambda: chaos.env_or("CHAOS_APP", "ip_count"))  # as in make chaos
    # CHAOS_DOUBLE_FAULT=1: one more node killed inside the outage, on purpose (chaos_plan.DOUBLE_FAULT_NOTE)
    double_fault: int = field(default_factory=lambda: chaos.env_or("CHAOS_DOUBLE_FAULT", 0))
    # CHAOS_SECURED=1: every node SASL/SCRAM over TLS with ACLs, the job on its least-privileged principal
    secured: int = field(default_factory=lambda: chaos.env_or("CHAOS_SECURED", 0))
    # the driver and executors map a class-data archive of Spark's classes, as the platform's default
    # (ONCEFLOW_CLASS_DATA_SHARING); CHAOS_CLASS_DATA=0: without
    class_data: int = field(default_factory=lambda: chaos.env_or("CHAOS_CLASS_DATA", 1))
    ips: int = 5000


SETTLE_S = 30.0  # a restarted node's catch-up, planned between broker faults (the run also waits for full ISR)
IN_SYNC_TIMEOUT_S = 240.0
COORDINATOR_STALL_S = 8  # a transaction held open this long (below its timeout) for its coordinator to die in it
TXN_WAIT_S = 60.0  # how long a coordinator kill waits for the transaction it armed, per try
TXN_TRIES = 3


def plan(spec: ClusterChaosSpec) -> list[chaos_plan.Step]:
    """The seeded schedule (chaos_plan.cluster_plan): the long outage at 20 % of the run, the other faults between
    5 % and 85 %, broker faults one at a time."""
    return chaos_plan.cluster_plan(
        spec.seed,
        spec.seconds,
        spec.job_kills,
        spec.leader_kills,
        spec.coordinator_kills,
        spec.worker_kills,
        spec.broker_down_s,
        double_fault=bool(spec.double_fault),
        settle_s=SETTLE_S,
    )


def fully_in_sync(s: config.Settings) -> bool:
    """Every partition of every topic (the internal ones too: the transaction state, the group offsets) has all
    its replicas in sync: the cluster tolerates its next node down. Every node's process runs first: the ISR still
    lists a node killed seconds ago (the controller drops it only when its session times out), and that let seed
    4711's leader kill follow a coordinator kill onto the same, already dead, node."""
    if not broker.status(s)["running"]:
        return False
    md = kafka_clients.admin(s).list_topics(timeout=10)
    if len(md.brokers) < s.brokers:
        return False
    return all(
        set(p.isrs) == set(p.replicas) for t in md.topics.values() if t.error is None for p in t.partitions.values()
    )


def settings_for(var_dir: Path, spec: ClusterChaosSpec) -> config.Settings:
    base = config.load(
        env={k: v for k, v in os.environ.items() if not k.startswith("ONCEFLOW_")},
        app=spec.app,
        var_dir=var_dir,
        **loopback.cluster(),
        driver_memory="512m",
        executor_memory="1g",
        cores_max=2,  # the reconciliation recount at the end needs the workers' other cores
        broker_txn_abort_check_interval_ms=1000,
        broker_heap="512m",
        kafka_security_protocol="SASL_SSL" if spec.secured else "PLAINTEXT",
        class_data_sharing=bool(spec.class_data),
    )
    return base.replace(
        app_id="chaos",
        **private_topics("chaos"),
        trigger_interval_s=1.0,
        max_offsets_per_trigger=20_000,
        # room for a coordinator's failover (6 s to fence the dead node, then the new one loads the state)
        transaction_timeout_ms=30_000,
        restart_attempts=1000,
        restart_delay_s=1.0,
        # a coordinator kill arms this and waits for the transaction it holds open (onceflow.faults.arm)
        fault=f"stall_in_txn@armed:{COORDINATOR_STALL_S}",
    )


class Runner:
    """The cluster run's faults (scenario.Fault each), carried out with overlap: what a fault stopped is started
    again by a timer `duration` later, whatever the steps after it are waiting for (a deliberate double fault starts
    while the outage's node is still down). Every fault but a deliberate overlap waits for a commit since the previous
    one began; a broker fault waits for every partition in sync too."""

    def __init__(self, s: config.Settings, job: config.Settings, t0: float):
        self.s, self.job, self.t0 = s, job, t0
        self.last_kill_ms = 0
        self.worker_kills = 0
        # nodes a broker fault stopped whose start again has not returned: a node being started has its process
        # (and, until its old session times out, its place in the ISR), so fully_in_sync alone let seed 1's leader
        # kill land on node 1 while its coordinator kill was starting it again
        self.restarting: set[int] = set()
        self.outcome = chaos_plan.Outcome()

    def carry_out(self, steps: list[chaos_plan.Step]) -> None:
        faults: dict[str, scenario.Fault] = {
            "kill_job": self.kill_job,
            "kill_worker": self.kill_worker,
            "kill_coordinator": self.kill_coordinator,
            "kill_leader": self.kill_node,
            "broker_down": self.kill_node,
        }
        self.outcome = scenario.Scenario(
            faults, self.t0, overlap=True, before=self._in_sync, live=chaos.live_since(self.job)
        ).run(steps)

    def windows(self, kind: str = "", note: str = "") -> list[tuple[int, int]]:
        """(start, end) of the injected faults of `kind` (or with `note`): the outage's and the double fault's."""
        return [
            (f.start_ms, f.end_ms)
            for f in self.outcome.injected
            if (kind and f.kind == kind) or (note and f.note == note)
        ]

    def _in_sync(self, st: chaos_plan.Step) -> None:
        if st.kind not in chaos_plan.BROKER_FAULTS or st.deliberate_overlap:
            return
        try:
            procs.wait_until(
                lambda: not self.restarting and fully_in_sync(self.s), IN_SYNC_TIMEOUT_S, interval=2.0, what="full ISR"
            )
        except TimeoutError:
            raise scenario.Missed(f"the cluster was not fully in sync within {IN_SYNC_TIMEOUT_S:.0f} s") from None

    def kill_job(self, st: chaos_plan.Step) -> scenario.Began:
        if not chaos.wait_commit_since(self.job, self.last_kill_ms, 300):
            raise scenario.Missed("no batch committed since the previous job kill within 300 s")
        at = clock.now_ms()
        if not chaos.kill_running_job(self.job, after_ms=self.last_kill_ms):
            raise scenario.Missed("no running job to kill within 300 s")
        self.last_kill_ms = clock.now_ms()
        return scenario.Began(at)

    def kill_worker(self, st: chaos_plan.Step) -> scenario.Began:
        i = 1 + self.worker_kills % 2
        at = clock.now_ms()
        if not spark_cluster.kill_worker(self.s, i):
            raise scenario.Missed(f"Spark worker {i} was not running")
        self.worker_kills += 1
        return scenario.Began(at, restart=lambda: spark_cluster.start(self.s, workers=2), note=st.note)

    def kill_node(self, st: chaos_plan.Step) -> scenario.Began:
        """kill_leader (the sink's partition 0's leader) or broker_down (node 3): killed now."""
        s = self.s
        node = 3 if st.kind == "broker_down" else cluster.describe(s)["topics"][s.sink_topic]["0"]["leader"]
        at = clock.now_ms()
        if node is None or node < 0 or not broker.kill(s, node):
            raise scenario.Missed(f"node {node} (the sink's leader) was not running")
        return self._node_down(st, at, node)

    def kill_coordinator(self, st: chaos_plan.Step) -> scenario.Began:
        """Arm the job's stall, wait for the transaction it holds open, kill that transaction's coordinator in it.
        No transaction in time is a reason to try again, not to skip the fault."""
        s = self.s
        marker_dir = s.run_dir / "faults" / s.app_id
        for _ in range(TXN_TRIES):
            armed_ms = clock.now_ms()
            faults.arm(marker_dir)
            if not self._stalled_since(armed_ms):
                continue
            node = (cluster.describe(s).get("transaction_coordinator") or {}).get("broker")
            at = clock.now_ms()
            if node is not None and node >= 0 and broker.kill(s, node):
                return self._node_down(st, at, node)
        faults.armed_path(marker_dir, "stall_in_txn").unlink(missing_ok=True)
        raise scenario.Missed(f"no transaction open within {TXN_WAIT_S:.0f} s, {TXN_TRIES} tries")

    def _node_down(self, st: chaos_plan.Step, at: int, node: int) -> scenario.Began:
        self.restarting.add(node)

        def restart() -> None:
            broker.start_node(self.s, node)  # returns once the node answers
            self.restarting.discard(node)  # (a failed start leaves it there: the run fails on it)

        return scenario.Began(at, restart=restart, from_end=st.deliberate_overlap, note=st.note)

    def _stalled_since(self, armed_ms: int) -> bool:
        def held() -> bool:
            return any(e["ts_ms"] >= armed_ms for e in chaos.read_events(self.s, {wire.FAULT_INJECTED}, armed_ms))

        try:
            procs.wait_until(held, TXN_WAIT_S, interval=0.3, what="an armed transaction")
            return True
        except TimeoutError:
            return False


def run(spec: ClusterChaosSpec, var_dir: Path) -> dict[str, Any]:
    s = settings_for(var_dir, spec)
    var_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    manifest = var_dir / "chaos-manifest.csv"
    steps = plan(spec)
    # the job as itself; the producer, the fault plan's lookups and the checks as the admin (on a secured stack; all
    # the same on a plain one)
    job = s
    sampler = stacks = None
    stack.prepare_jvm(s)  # as `make run` does: the first job start is not a first start on this machine
    try:
        broker.start(s)
        if spec.secured:
            from onceflow_dev import credentials

            s, job = stack.provision(s), credentials.as_role(s, "job")
        spark_cluster.start(s, workers=2)
        topics.ensure(s)
        jobctl.start(job)
        jobctl.wait_running(job, timeout=300)
        feed = chaos.Feed(s, spec.records / spec.seconds, spec.seconds, spec.seed, spec.ips, s.watermark_s, manifest)
        sampler = chaos.LagSampler(s)
        sampler.start()
        stacks = stall_stacks.StallStacks(job)  # a job that commits nothing for long: its stacks in its log
        stacks.start()
        feed.start()
        runner = Runner(s, job, t0)
        runner.carry_out(steps)
        sent = feed.finish(s, max((f.end_ms for f in runner.outcome.injected), default=0))
        chaos.wait_drained(s, sent, timeout=max(900.0, spec.seconds))
        lag = sampler.stop()
        stacks_asked = stacks.stop()
        jobctl.stop(job)
        recount = None
        if s.declared_app().audit is None:  # without an audit of its own, the replay of its plan is the app's proof
            from onceflow.operations import reconcile

            recount = reconcile.run(launcher.local_session(s, "chaos-reconcile"), s, with_gx=False)
        report = chaos.verify(s, sent, recount)
        commits = chaos.commit_times(s)
        outcome = runner.outcome
        live = chaos_plan.liveness(
            outcome.injected, commits, lag, chaos.bounds(), lag_slack=int(5 * spec.records / spec.seconds)
        )

        doubles = runner.windows(note=chaos_plan.DOUBLE_FAULT_NOTE)

        def committed_in(windows: list[tuple[int, int]]) -> list[int]:
            return [sum(1 for t in commits if a <= t <= b) for a, b in windows]

        report |= {
            "topology": "3 KRaft nodes (RF 3, min ISR 2), Spark master + 2 workers",
            "plan": [vars(st) for st in steps],
            "faults": outcome.counts(),
            "missed": outcome.missed,
            "liveness": live,
            "batches_committed_while_a_broker_was_down": committed_in(runner.windows(kind="broker_down")),
            "double_fault": [
                {"window_ms": w, "committed_during": n, "why": chaos_plan.DOUBLE_FAULT_NOTE}
                for w, n in zip(doubles, committed_in(doubles), strict=True)
            ],
            "restarts": len(chaos.events_of(s, wire.SUPERVISOR_RESTART)),
            "transaction_timeouts": len(chaos.events_of(s, wire.TRANSACTION_TIMEOUT)),
            "wall_s": round(time.monotonic() - t0, 1),
            "seed": spec.seed,
            "input_per_s": round(spec.records / spec.seconds),
            "machine": machine.describe(),  # liveness figures depend on its speed (onceflow_dev.machine)
            "secured": bool(spec.secured),
            "class_data": bool(spec.class_data),  # the driver and executors mapped a class-data archive
            # when the job, committing nothing for long, was asked for its threads' stacks (in its log)
            "stacks_asked_ms": [ms for ms, _ in stacks_asked],
        }
        # the outage is tolerated (one node of three): commits go on through it, except while the deliberate
        # double fault has a second node down
        outage_ok = all(n > 0 for n in report["batches_committed_while_a_broker_was_down"]) or bool(spec.double_fault)
        report["operator_stops"] = [e["type"] for e in chaos.events_of(s, *chaos_plan.OPERATOR_STOPS)]
        report["failures"] = chaos_plan.failures(
            report, {"no batch committed through the outage of one node of three": outage_ok}
        )
        report["ok"] = not report["failures"]
        return report
    finally:
        for thread in (sampler, stacks):
            if thread is not None:
                thread.stopping.set()
        jobctl.stop(job, timeout=30)
        spark_cluster.stop(s)
        broker.stop(s)


def main() -> int:
    """`make chaos CHAOS_TOPOLOGY=cluster`."""
    var = chaos.prepare_var()
    report = run(ClusterChaosSpec(), var)
    (var / "report.json").write_text(json.dumps(report, indent=1))
    print(f"""
app               {report["app"]} (checked by {report["audit"]}{" and the replay of its plan" if "replay" in report else ""})
topology          {report["topology"]}{"; SASL/SCRAM over TLS, ACLs, the job as its own principal" if report["secured"] else ""}{"; a class-data archive" if report["class_data"] else ""}
records           {report["records"]:,} ({report["malformed"]:,} malformed, {report["late"]:,} late) at {report["input_per_s"]:,}/s
faults injected   {report["faults"]}; not injected: {report["missed"] or "none"}
while a broker was down for minutes: {report["batches_committed_while_a_broker_was_down"]} batches committed
{"".join(f"double fault      {d['committed_during']} batches committed while two nodes were down ({d['why']})" + chr(10) for d in report["double_fault"])}liveness (seconds from each fault)
{chaos.liveness_lines(report["liveness"])}
restarts          {report["restarts"]} (supervisor); transaction timeouts {report["transaction_timeouts"]}
lost              {report["lost"]}
duplicated        {report["duplicated"]}
DLQ complete      {report["dlq_complete"]}; I1-I4 {"ok" if report["invariants_ok"] else "FAILED"}
wall time         {report["wall_s"]} s
result            {chaos_plan.verdict(report)}  (report: {var / "report.json"})""")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    interrupt.run(main)
