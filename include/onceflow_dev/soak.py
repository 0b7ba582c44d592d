"""`make soak`: the embedded platform as an operator runs it, for a long time, with faults at random times.

A private broker, Airflow started the way `make run` starts it (its schedules shortened through the settings),
the deploy DAG starting the job, input flowing at SOAK_RATE records/s for SOAK_SECONDS (default 1800), and a
seeded schedule of faults: kill -9 of the job (half of them with its supervisor, so that only the scheduled health
check can bring it back), hard kill and restart of the broker, SIGSTOP/SIGCONT pauses of the driver. Then the
input stops (with a tail that closes the last windows), the job drains it, and the run checks:

- every scheduled DAG run succeeded, or failed while an injected fault was under way (or within SOAK_GRACE_S of
  its end) and was followed by a successful run of the same DAG;
- the scheduled reconciliation chain proved every committed batch exactly once (contiguous slices from the first
  batch to the last, no batch twice), each proving run green;
- against the generator's manifest: lost 0, duplicated 0, the DLQ complete (I1-I4 exact).

Exit 1 if any of it fails. The report goes to var/soak/report.json and the terminal.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field

from onceflow import config, logs, wire
from onceflow.kafka import topics
from onceflow.operations import audit, recon_chain
from onceflow.rules import clock
from onceflow.rules.names import private_topics
from onceflow.runtime import jobctl, procs
from onceflow.runtime.stacks import driver_pid
from onceflow_dev import airflow_local, broker, chaos, generator, interrupt, loopback, scenario
from onceflow_dev.chaos_plan import Injected, Outcome, Step
from onceflow_dev.webhook_receiver import Receiver

log = logging.getLogger("onceflow_dev.soak")


@dataclass
class SoakSpec:
    seconds: float = field(default_factory=lambda: chaos.env_or("SOAK_SECONDS", 1800.0))
    rate: float = field(default_factory=lambda: chaos.env_or("SOAK_RATE", 200.0))
    job_kills: int = field(default_factory=lambda: chaos.env_or("SOAK_JOB_KILLS", 6))
    broker_restarts: int = field(default_factory=lambda: chaos.env_or("SOAK_BROKER_RESTARTS", 2))
    pauses: int = field(default_factory=lambda: chaos.env_or("SOAK_PAUSES", 2))
    seed: int = field(default_factory=lambda: chaos.env_or("SOAK_SEED", 1))
    grace_s: float = field(default_factory=lambda: chaos.env_or("SOAK_GRACE_S", 240.0))
    # the schedules, shortened through the settings an operator would set
    health_interval_s: float = 60.0
    txn_watch_interval_s: float = 30.0
    rotation_interval_minutes: float = 5.0
    reconcile_interval_minutes: float = 2.0


def plan(spec: SoakSpec) -> list[Step]:
    """The seeded schedule; faults between 10 % and 80 % of the run, in time order."""
    rng = random.Random(spec.seed)
    out = [Step(rng.uniform(0.1, 0.8) * spec.seconds, "kill_job") for _ in range(spec.job_kills)]
    out += [
        Step(rng.uniform(0.15, 0.75) * spec.seconds, "restart_broker", rng.uniform(3, 15))
        for _ in range(spec.broker_restarts)
    ]
    out += [Step(rng.uniform(0.1, 0.8) * spec.seconds, "pause_driver", rng.uniform(5, 30)) for _ in range(spec.pauses)]
    return sorted(out, key=lambda st: (st.at, st.kind))


class SoakFaults:
    """The soak's faults (scenario.Fault each): kill -9 of the job, half of them with its supervisor (so that only
    the scheduled health check brings it back), the broker killed and started again, the driver paused."""

    def __init__(self, s, base, seed: int):
        self.s, self.base = s, base
        self.rng = random.Random(seed + 1)

    def run(self, steps: list[Step], t0: float) -> Outcome:
        kinds = {"kill_job": self.kill_job, "restart_broker": self.restart_broker, "pause_driver": self.pause_driver}
        return scenario.Scenario(kinds, t0).run(steps)

    def kill_job(self, st: Step) -> scenario.Began:
        whole_tree = self.rng.random() < 0.5
        at = clock.now_ms()
        try:  # a fault for a job that is still coming back would hit nothing
            jobctl.wait_running(self.s, timeout=300)
        except TimeoutError:
            raise scenario.Missed("the job was not running within 300 s") from None
        if jobctl.kill(self.s, with_supervisor=whole_tree) is None:
            raise scenario.Missed("no job process to kill")
        return scenario.Began(at, end_ms=clock.now_ms(), note="job and supervisor" if whole_tree else "job")

    def restart_broker(self, st: Step) -> scenario.Began:
        at = clock.now_ms()
        broker.kill(self.base)
        return scenario.Began(at, restart=lambda: broker.start(self.base), note=f"down {st.duration:.0f} s")

    def pause_driver(self, st: Step) -> scenario.Began:
        pid = driver_pid(self.s)  # a live driver only: the status file outlives it
        if pid is None:
            raise scenario.Missed("no running driver under the job's status file")
        at = clock.now_ms()
        os.kill(pid, signal.SIGSTOP)
        return scenario.Began(at, restart=lambda: os.kill(pid, signal.SIGCONT), note=f"{st.duration:.0f} s")


def explained(run: dict, faults: list[Injected], grace_ms: int) -> Injected | None:
    """The injected fault a failed DAG run overlaps (from its start to its end, the fault widened by the grace)."""
    start = _ms(run.get("start_date") or run.get("run_after"))
    end = _ms(run.get("end_date") or run.get("run_after"))
    for f in faults:
        if start <= f.end_ms + grace_ms and end >= f.start_ms:
            return f
    return None


def chain_coverage(results: list[dict], first_batch: int, last_batch: int) -> dict:
    """Did the chain prove every batch in [first_batch, last_batch] exactly once? `results`: the chain's records."""
    proving = [r for r in results if r.get("mode") == "chain" and r.get("ok") and r.get("first_batch") is not None]
    covered: list[int] = []
    for r in proving:
        covered += list(range(r["first_batch"], r["last_batch"] + 1))
    want = list(range(first_batch, last_batch + 1))
    return {
        "runs": len(proving),
        "failed_runs": sum(1 for r in results if r.get("mode") == "chain" and not r["ok"]),
        "nothing_new_runs": sum(1 for r in results if r.get("mode") == "chain" and r.get("first_batch") is None),
        "batches_proven": len(covered),
        "twice": len(covered) - len(set(covered)),
        "missing": len(set(want) - set(covered)),
        "ok": covered == want,
    }


def _ms(iso: str | None) -> int:
    if not iso:
        return 0
    return clock.parse_iso_ms(iso)


def run(spec: SoakSpec, var_dir) -> dict:
    base = config.load(
        env={k: v for k, v in os.environ.items() if not k.startswith("ONCEFLOW_")},
        var_dir=var_dir,
        **loopback.kafka(),
        broker_txn_abort_check_interval_ms=1000,
        broker_heap="1g",
    )
    s = base.replace(
        app_id="soak",
        **private_topics("soak"),
        airflow_port=procs.free_port(),
        alert_channels="webhook",
        trigger_interval_s=2.0,
        max_offsets_per_trigger=20_000,
        restart_attempts=5,
        restart_delay_s=2.0,
        health_interval_s=spec.health_interval_s,
        txn_watch_interval_s=spec.txn_watch_interval_s,
        rotation_interval_minutes=spec.rotation_interval_minutes,
        reconcile_interval_minutes=spec.reconcile_interval_minutes,
        savepoint_keep=5,
    )
    var_dir.mkdir(parents=True, exist_ok=True)
    receiver = Receiver()
    extra = {
        "AIRFLOW_CONN_ONCEFLOW_WEBHOOK": json.dumps(receiver.connection()),
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(procs.free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(procs.free_port()),
    }
    manifest = var_dir / "soak-manifest.csv"
    t0 = time.monotonic()
    broker.start(base)
    try:
        topics.ensure(s)
        airflow_local.up(s, trigger_deploy=True, timeout=600, extra_env=extra)
        airflow_local.wait_job_started(s, timeout=600)
        api = airflow_local.client(s)
        log.info(
            "Airflow at http://localhost:%d (%s); the job runs; input for %.0f s at %.0f records/s",
            s.airflow_port,
            airflow_local.password(s),
            spec.seconds,
            spec.rate,
        )
        fed: dict = {}
        feeder = threading.Thread(
            target=lambda: fed.update(
                result=generator.generate(
                    s,
                    generator.GeneratorSpec(
                        count=int(spec.rate * spec.seconds),
                        rate=spec.rate,
                        distinct_ips=2000,
                        seed=spec.seed,
                        late_fraction=0.01,
                        out_of_order_fraction=0.03,
                        malformed_fraction=0.01,
                        tail_s=30,
                        watermark_s=s.watermark_s,
                    ),
                    manifest=manifest,
                    progress_every=50_000,
                )
            ),
            daemon=True,
        )
        t_input = time.monotonic()
        feeder.start()
        outcome = SoakFaults(s, base, spec.seed).run(plan(spec), t_input)
        feeder.join(spec.seconds * 2 + 600)
        sent = generator.read_manifest(manifest)
        chaos.wait_drained(s, sent, timeout=max(900.0, spec.seconds / 2))
        last = audit.ledger_entries(s)[-1].batch
        # the chain catches up with the last committed batch on its schedule (bounded)
        procs.wait_until(
            lambda: (recon_chain.position(s).batch or -1) >= last,
            6 * 60 * spec.reconcile_interval_minutes + 600,
            interval=10,
            what=f"the scheduled reconciliation chain to prove batch {last}",
        )
        runs = {d: api.runs(d, run_type="scheduled", limit=1000) for d in airflow_local.watch_dags(s)}
        report = judge(s, spec, runs, outcome.injected, sent, last)
        # every planned fault is injected, or the run fails and says which and why
        report["missed"] = outcome.missed
        report["ok"] = report["ok"] and not outcome.missed
        report["alerts"] = _alert_counts(receiver)
        report["wall_s"] = round(time.monotonic() - t0, 1)
        return report
    finally:
        airflow_local.down(s)
        jobctl.stop(s, timeout=60)
        broker.stop(base)
        receiver.close()


def judge(s, spec: SoakSpec, runs: dict[str, list[dict]], faults: list[Injected], sent, last_batch: int) -> dict:
    grace_ms = int(spec.grace_s * 1000)
    dag_report, unexplained = {}, []
    for dag_id, rs in runs.items():
        rs = sorted(rs, key=lambda r: _ms(r["run_after"]))
        failed = [r for r in rs if r["state"] == "failed"]
        for r in failed:
            f = explained(r, faults, grace_ms)
            later_green = any(x["state"] == "success" and _ms(x["run_after"]) > _ms(r["run_after"]) for x in rs)
            if f is None or not later_green:
                unexplained.append(
                    {
                        "dag": dag_id,
                        "run": r["dag_run_id"],
                        "fault": f.kind if f else None,
                        "followed_by_green": later_green,
                    }
                )
        dag_report[dag_id] = {
            "scheduled": len(rs),
            "success": sum(1 for r in rs if r["state"] == "success"),
            "failed": len(failed),
        }
    first = audit.ledger_entries(s)[0].batch
    chain = chain_coverage(recon_chain.recent_results(s, limit=100_000), first, last_batch)
    exact = chaos.verify(s, sent)
    counts: dict[str, int] = {}
    for f in faults:
        counts[f.kind] = counts.get(f.kind, 0) + 1
    ok = (
        not unexplained
        and chain["ok"]
        and exact["lost"] == 0
        and exact["duplicated"] == 0
        and exact["dlq_complete"]
        and exact["invariants_ok"]
    )
    return {
        "ok": ok,
        "seconds": spec.seconds,
        "rate": spec.rate,
        "seed": spec.seed,
        "faults": counts,
        "fault_log": [f.__dict__ for f in faults],
        "dag_runs": dag_report,
        "unexplained_failures": unexplained,
        "chain": chain,
        "exact": exact,
        "restarts": len(chaos.events_of(s, wire.SUPERVISOR_RESTART)),
    }


def _alert_counts(receiver: Receiver) -> dict[str, int]:
    out: dict[str, int] = {}
    for a in receiver.alerts():
        k = f"{a['key'].split(':')[0]}:{a['key'].split(':')[2] if a['key'].count(':') >= 2 else ''} {a['status']}"
        out[k] = out.get(k, 0) + 1
    return out


def main() -> int:
    logs.setup(logging.INFO, logs.SHORT)
    for noisy in ("onceflow.events", "onceflow.kafka.client", "onceflow_dev.broker"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    var = config.REPO_ROOT / "var" / "soak"
    import shutil

    shutil.rmtree(var, ignore_errors=True)
    spec = SoakSpec()
    report = run(spec, var)
    (var / "report.json").write_text(json.dumps(report, indent=1))
    d, c, e = report["dag_runs"], report["chain"], report["exact"]
    print(f"""
soak              {spec.seconds:.0f} s of input at {spec.rate:.0f} records/s, seed {spec.seed} ({report["wall_s"]} s in all)
faults injected   {report["faults"]}; not injected: {report["missed"] or "none"}
scheduled runs    {", ".join(f"{k.removeprefix('ip_count_')} {v['success']}/{v['scheduled']} green" for k, v in d.items())}
failures          {len(report["unexplained_failures"])} not explained by a fault or not followed by a green run
chain             {c["runs"]} proving runs covered batches once each: {c["ok"]} ({c["batches_proven"]} batches, {c["twice"]} twice, {c["missing"]} missing; {c["failed_runs"]} failed runs, {c["nothing_new_runs"]} with nothing new)
records           {e["records"]:,} ({e["malformed"]:,} malformed, {e["late"]:,} late); restarts {report["restarts"]}
lost              {e["lost"]}
duplicated        {e["duplicated"]}
DLQ complete      {e["dlq_complete"]}; I1-I4 {"ok" if e["invariants_ok"] else "FAILED"}
alerts            {report["alerts"]}
result            {"PASS" if report["ok"] else "FAIL"}  (report: {var / "report.json"})""")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    interrupt.run(main)
