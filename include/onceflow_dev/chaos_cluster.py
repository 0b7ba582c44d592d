"""`make chaos CHAOS_TOPOLOGY=cluster`: exactly-once under faults on a cluster topology, on loopback.

Three KRaft nodes (a controller quorum of three; topics replicated three ways, min.insync.replicas=2) and a Spark
standalone master with two workers; the job runs on the workers in client mode. While the generator writes
CHAOS_RECORDS records over CHAOS_SECONDS, a seeded schedule injects:

- kill -9 of the broker that leads the sink's first partition (restarted after a few seconds);
- kill -9 of the app's transaction coordinator in the middle of a transaction (the job holds a few transactions
  open for 3 s, below the timeout: the coordinator dies while each is open, and comes back);
- one broker down for CHAOS_BROKER_DOWN_S (default 120 s) while the job goes on committing (counted);
- kill -9 of a Spark worker in the middle of the job (its executor goes with it; tasks are retried on the other);
- kill -9 of the job's driver (its supervisor restarts it).

Then the job drains the input and the whole history is verified against the generator's manifest, as `make
chaos` does (onceflow_dev.chaos.verify): lost 0, duplicated 0, the DLQ complete, I1-I4 exact.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onceflow import config, wire
from onceflow.kafka import cluster, topics
from onceflow.runtime import jobctl, procs
from onceflow_dev import broker, chaos, generator, spark_cluster

log = logging.getLogger("onceflow_dev.chaos")


@dataclass
class ClusterChaosSpec:
    seconds: float = field(default_factory=lambda: chaos.env_or("CHAOS_SECONDS", 600.0))
    records: int = field(default_factory=lambda: chaos.env_or("CHAOS_RECORDS", 600_000))
    job_kills: int = field(default_factory=lambda: chaos.env_or("CHAOS_JOB_KILLS", 5))
    leader_kills: int = field(default_factory=lambda: chaos.env_or("CHAOS_LEADER_KILLS", 3))
    coordinator_kills: int = field(default_factory=lambda: chaos.env_or("CHAOS_COORDINATOR_KILLS", 2))
    worker_kills: int = field(default_factory=lambda: chaos.env_or("CHAOS_WORKER_KILLS", 2))
    broker_down_s: float = field(default_factory=lambda: chaos.env_or("CHAOS_BROKER_DOWN_S", 120.0))
    seed: int = field(default_factory=lambda: chaos.env_or("CHAOS_SEED", 1))
    # CHAOS_SECURED=1: every node SASL/SCRAM over TLS with ACLs, the job on its least-privileged principal
    secured: int = field(default_factory=lambda: chaos.env_or("CHAOS_SECURED", 0))
    ips: int = 5000


def plan(spec: ClusterChaosSpec) -> list[tuple[float, str, float]]:
    """(seconds from the start, kind, duration), seeded. The long broker outage starts at 20 % of the run; the
    other faults land between 5 % and 85 %."""
    rng = random.Random(spec.seed)
    out = [(rng.uniform(0.05, 0.85) * spec.seconds, "kill_job", 0.0) for _ in range(spec.job_kills)]
    out += [
        (rng.uniform(0.05, 0.85) * spec.seconds, "kill_leader", rng.uniform(3, 10)) for _ in range(spec.leader_kills)
    ]
    out += [
        (rng.uniform(0.05, 0.85) * spec.seconds, "kill_worker", rng.uniform(5, 15)) for _ in range(spec.worker_kills)
    ]
    out.append((0.2 * spec.seconds, "broker_down", spec.broker_down_s))
    return sorted(out)


def coordinator_stalls(spec: ClusterChaosSpec) -> list[int]:
    """The batches whose transaction is held open 3 s (below the timeout) for the coordinator to be killed in it."""
    return [2 + 3 * i for i in range(spec.coordinator_kills)]


def settings_for(var_dir: Path, spec: ClusterChaosSpec) -> config.Settings:
    boot = ",".join(f"127.0.0.1:{procs.free_port()}" for _ in range(3))
    ctl = procs.free_port_run(3, config.NODE_PORT_STEP)
    base = config.load(
        env={k: v for k, v in os.environ.items() if not k.startswith("ONCEFLOW_")},
        var_dir=var_dir,
        brokers=3,
        bootstrap_servers=boot,
        controller_port=ctl,
        master=f"spark://127.0.0.1:{procs.free_port()}",
        driver_memory="512m",
        executor_memory="1g",
        cores_max=2,  # the reconciliation recount at the end needs the workers' other cores
        broker_txn_abort_check_interval_ms=1000,
        broker_heap="512m",
        kafka_security_protocol="SASL_SSL" if spec.secured else "PLAINTEXT",
    )
    stall = ",".join(f"stall_in_txn@{b}:3" for b in coordinator_stalls(spec))
    return base.replace(
        app_id="chaos",
        **{
            f"{k}_topic": f"chaos.{k}"
            for k in ("source", "sink", "dlq", "ledger", "events", "job_events", "alerts", "health", "backfill")
        },
        reconciliation_topic="chaos.recon",
        trigger_interval_s=1.0,
        max_offsets_per_trigger=20_000,
        # room for a coordinator's failover (6 s to fence the dead node, then the new one loads the state)
        transaction_timeout_ms=30_000,
        restart_attempts=1000,
        restart_delay_s=1.0,
        fault=stall,
    )


def run(spec: ClusterChaosSpec, var_dir: Path) -> dict[str, Any]:
    s = settings_for(var_dir, spec)
    var_dir.mkdir(parents=True, exist_ok=True)
    counts = {"kill_job": 0, "kill_leader": 0, "kill_coordinator": 0, "kill_worker": 0, "broker_down": 0}
    down_windows: list[tuple[int, int]] = []  # (from, to) epoch ms of each long outage
    t0 = time.monotonic()
    manifest = var_dir / "chaos-manifest.csv"
    stop = threading.Event()
    lock = threading.Lock()  # one broker fault at a time: two nodes down would stop the cluster (min ISR 2)
    # the job as itself; the producer, the fault plan's lookups and the checks as the admin (on a secured stack; all
    # the same on a plain one)
    job = s
    try:
        broker.start(s)
        if spec.secured:
            from onceflow_dev import credentials, stack

            s, job = stack.provision(s), credentials.as_role(s, "job")
        spark_cluster.start(s, workers=2)
        topics.ensure(s)
        jobctl.start(job)
        jobctl.wait_running(job, timeout=300)

        def coordinator_killer() -> None:
            seen = 0
            while not stop.is_set() and seen < len(coordinator_stalls(spec)):
                stalls = chaos.events_of(s, wire.FAULT_INJECTED)
                if len(stalls) > seen:
                    seen = len(stalls)
                    with lock:
                        node = (cluster.describe(s).get("transaction_coordinator") or {}).get("broker")
                        if node and broker.kill(s, node):  # the transaction is open now, held 3 s
                            counts["kill_coordinator"] += 1
                            time.sleep(5)
                            broker.start_node(s, node)
                            log.info(
                                "t=%.0fs killed the transaction coordinator (node %s) mid-transaction",
                                time.monotonic() - t0,
                                node,
                            )
                stop.wait(0.2)

        killer = threading.Thread(target=coordinator_killer, daemon=True)
        killer.start()
        feeder = threading.Thread(
            target=lambda: generator.generate(
                s,
                generator.GeneratorSpec(
                    count=spec.records,
                    rate=spec.records / spec.seconds,
                    distinct_ips=spec.ips,
                    seed=spec.seed,
                    late_fraction=0.01,
                    out_of_order_fraction=0.05,
                    malformed_fraction=0.02,
                    tail_s=30,
                    watermark_s=s.watermark_s,
                ),
                manifest=manifest,
                progress_every=100_000,
            ),
            daemon=True,
        )
        feeder.start()
        last_kill_ms = 0
        for at, kind, dur in plan(spec):
            time.sleep(max(0.0, at - (time.monotonic() - t0)))
            if kind == "kill_job":
                if chaos.kill_running_job(job, after_ms=last_kill_ms):
                    counts[kind] += 1
                    last_kill_ms = int(time.time() * 1000)
            elif kind in ("kill_leader", "broker_down"):
                with lock:
                    node = cluster.describe(s)["topics"][s.sink_topic]["0"]["leader"] if kind == "kill_leader" else 3
                    down_ms = int(time.time() * 1000)
                    broker.kill(s, node)
                    time.sleep(dur)
                    if kind == "broker_down":
                        down_windows.append((down_ms, int(time.time() * 1000)))
                    broker.start_node(s, node)
                    counts[kind] += 1
            elif kind == "kill_worker":
                i = 1 + counts[kind] % 2
                if spark_cluster.kill_worker(s, i):
                    counts[kind] += 1
                    time.sleep(dur)
                    spark_cluster.start(s, workers=2)
            log.info("t=%.0fs %s (%s)", time.monotonic() - t0, kind, counts)
        feeder.join(spec.seconds * 3 + 300)
        stop.set()
        killer.join(60)
        sent = generator.read_manifest(manifest)
        chaos.wait_drained(s, sent, timeout=max(900.0, spec.seconds))
        jobctl.stop(job)
        report = chaos.verify(s, sent)
        commits = [e["ts_ms"] for e in chaos.events_of(s, wire.BATCH_COMMITTED)]
        down_commits = [sum(1 for t in commits if a <= t <= b) for a, b in down_windows]
        report |= {
            "topology": "3 KRaft nodes (RF 3, min ISR 2), Spark master + 2 workers",
            "faults": counts,
            "batches_committed_while_a_broker_was_down": down_commits,
            "restarts": len(chaos.events_of(s, wire.SUPERVISOR_RESTART)),
            "transaction_timeouts": len(chaos.events_of(s, wire.TRANSACTION_TIMEOUT)),
            "wall_s": round(time.monotonic() - t0, 1),
            "seed": spec.seed,
            "secured": bool(spec.secured),
        }
        report["ok"] = (
            report["lost"] == 0
            and report["duplicated"] == 0
            and report["dlq_complete"]
            and report["invariants_ok"]
            and all(n > 0 for n in down_commits)
        )
        return report
    finally:
        stop.set()
        jobctl.stop(job, timeout=30)
        spark_cluster.stop(s)
        broker.stop(s)


def main() -> int:
    """`make chaos CHAOS_TOPOLOGY=cluster`."""
    var = chaos.prepare_var()
    report = run(ClusterChaosSpec(), var)
    (var / "report.json").write_text(json.dumps(report, indent=1))
    print(f"""
topology          {report["topology"]}{"; SASL/SCRAM over TLS, ACLs, the job as its own principal" if report["secured"] else ""}
records           {report["records"]:,} ({report["malformed"]:,} malformed, {report["late"]:,} late)
faults injected   {report["faults"]}
while a broker was down for minutes: {report["batches_committed_while_a_broker_was_down"]} batches committed
restarts          {report["restarts"]} (supervisor); transaction timeouts {report["transaction_timeouts"]}
lost              {report["lost"]}
duplicated        {report["duplicated"]}
DLQ complete      {report["dlq_complete"]}; I1-I4 {"ok" if report["invariants_ok"] else "FAILED"}
wall time         {report["wall_s"]} s
result            {"PASS" if report["ok"] else "FAIL"}  (report: {var / "report.json"})""")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
