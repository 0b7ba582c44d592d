"""`make bench`: onceflow's exactly-once job, the same query on Spark's at-least-once Kafka sink, and a plain
transactional confluent-kafka loop (the ceiling), side by side on one generated workload and one private broker.

Phases, each run in turn for every contender on the same machine:
1. throughput: a backlog of BENCH_RECORDS records (4 partitions, BENCH_IPS distinct IPs) is written once; each
   contender drains it from offset 0 to its own sink; records/s = records / (last result committed - first
   batch started); peak RSS (VmHWM) and CPU seconds of the contender's processes;
2. latency: records produced live at BENCH_LIVE_RATE/s for BENCH_LIVE_S s with event time = wall clock; a
   read_committed consumer stamps each result when it sees it; latency = seen - (window end + watermark delay),
   over the windows ending after the first BENCH_WARMUP_S s;
3. recovery (exactly-once job only): live input, then kill -9 of the job; the time to its next committed batch
   and until its lag is back to the level before the crash.
Prints one table and writes the figures to var/bench/results-<time>.json.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from onceflow import config, wire
from onceflow.apps import audit
from onceflow.kafka import clients as kafka_clients
from onceflow.kafka import events as ev
from onceflow.kafka import reading as kafka_reading
from onceflow.kafka import topics
from onceflow.runtime import jobctl, launcher, procs, supervisor
from onceflow_dev import broker, generator

log = logging.getLogger("onceflow_dev.bench")
# The job settings a tuning run varies (docs/performance.md); recorded with every result.
TUNABLES = (
    "trigger_interval_s",
    "close_out_batches",
    "max_offsets_per_trigger",
    "shuffle_partitions",
    "state_store_provider",
    "producer_linger_ms",
    "producer_batch_messages",
)


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


@dataclass
class BenchSpec:
    """The workload. The job's own settings are the embedded defaults (onceflow.config) unless BENCH_TRIGGER_S
    or BENCH_MAX_OFFSETS override them."""

    records: int = field(default_factory=lambda: _env_int("BENCH_RECORDS", 2_000_000))
    ips: int = field(default_factory=lambda: _env_int("BENCH_IPS", 10_000))
    event_rate: int = field(default_factory=lambda: _env_int("BENCH_EVENT_RATE", 20_000))
    live_rate: int = field(default_factory=lambda: _env_int("BENCH_LIVE_RATE", 5_000))
    live_s: int = field(default_factory=lambda: _env_int("BENCH_LIVE_S", 60))
    # results of windows ending in the first seconds of the live phase are not counted: the job's first
    # batches include the JVM's warm-up (JIT) and the query's first state store loads
    warmup_s: int = field(default_factory=lambda: _env_int("BENCH_WARMUP_S", 20))
    trigger_s: float = field(
        default_factory=lambda: float(os.environ.get("BENCH_TRIGGER_S", config.Settings.trigger_interval_s))
    )
    max_offsets: int = field(
        default_factory=lambda: _env_int("BENCH_MAX_OFFSETS", config.Settings.max_offsets_per_trigger)
    )


def _settings(base: config.Settings, app: str, source: str, spec: BenchSpec, **overrides) -> config.Settings:
    return base.replace(
        **(
            {
                "app_id": app,
                "source_topic": source,
                "sink_topic": f"{app}.sink",
                "dlq_topic": f"{app}.dlq",
                "ledger_topic": f"{app}.ledger",
                "events_topic": f"{app}.events",
                "alerts_topic": f"{app}.alerts",
                "health_topic": f"{app}.health",
                "reconciliation_topic": f"{app}.recon",
                "backfill_topic": f"{app}.backfill",
                "trigger_interval_s": spec.trigger_s,
                "max_offsets_per_trigger": spec.max_offsets,
            }
            | overrides
        )
    )


# ---------------------------------------------------------------------------- process accounting
def _group_pids(pid: int | None) -> list[int]:
    if pid is None:
        return []  # no process: nothing to account, like a process that is gone
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        return []
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.getpgid(int(d)) == pgid:
                    out.append(int(d))
            except (ProcessLookupError, PermissionError):
                pass
    return out


def usage(pid: int | None) -> dict:
    """Peak RSS (sum of VmHWM) and CPU seconds (utime + stime) of a process group, read while it runs."""
    hwm_kb, ticks = 0, 0
    for p in _group_pids(pid):
        try:
            status = Path(f"/proc/{p}/status").read_text()
            hwm_kb += int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("VmHWM")))
            stat = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(stat[11]) + int(stat[12])
        except (OSError, StopIteration):
            pass
    return {"peak_rss_mb": round(hwm_kb / 1024), "cpu_s": round(ticks / os.sysconf("SC_CLK_TCK"), 1)}


# ---------------------------------------------------------------------------- contenders
class Contender:
    name = ""

    def __init__(self, s: config.Settings):
        self.s = s

    def start(self) -> None: ...
    def stop(self) -> dict | None: ...
    def pid(self) -> int | None: ...
    def drained(self, end: dict[int, int]) -> dict | None: ...


class ExactlyOnce(Contender):
    name = "onceflow exactly-once"

    def start(self):
        jobctl.start(self.s)
        jobctl.wait_running(self.s, timeout=300)

    def pid(self):
        job = procs.read_pidfile(supervisor.job_pidfile(self.s))
        return job["pid"] if job else None

    def drained(self, end) -> dict | None:
        got = audit.committed_offsets(self.s, end)
        if got != end:
            return None
        entries = audit.ledger_entries(self.s)
        return {
            "first_ms": min(e.batch_ts_ms for e in entries if e.ranges and any(a < b for a, b in e.ranges.values())),
            "last_ms": max(e.commit_time_ms for e in entries),
            "batches": len(entries),
        }

    def stop(self):
        jobctl.stop(self.s)
        return {}


class AtLeastOnce(Contender):
    name = "Spark Kafka sink (at-least-once)"

    def start(self):
        argv = launcher.submit_argv(self.s)[:-1] + [str(Path(__file__).with_name("ip_count_alo.py"))]
        self.proc = procs.spawn_detached(argv, self.s.log_dir / f"{self.s.app_id}.log", env=launcher.submit_env(self.s))
        procs.wait_until(
            lambda: (ev.read_status(self.s.status_file) or {}).get("state") == "running",
            300,
            what="the at-least-once query to run",
        )

    def pid(self):
        return self.proc.pid

    def drained(self, end) -> dict | None:
        st = ev.read_status(self.s.status_file) or {}
        offs = json.loads(st["end_offsets"]) if st.get("end_offsets") else {}
        now = {int(p): o for p, o in offs.get(self.s.source_topic, {}).items()}
        if now != end or "first_batch_ms" not in st:
            return None
        return {"first_ms": st["first_batch_ms"], "last_ms": st["last_commit_ms"], "batches": st["batches"]}

    def stop(self):
        procs.stop_process(self.proc.pid, 60)
        return {}


# ---------------------------------------------------------------------------- phases
def throughput(c: Contender, end: dict[int, int], records_: int, timeout: float = 3600) -> dict:
    t0 = time.time()
    c.start()
    got = procs.wait_until(lambda: c.drained(end), timeout, interval=1.0, what=f"{c.name} to drain")
    use = usage(c.pid())
    c.stop()
    secs = (got["last_ms"] - got["first_ms"]) / 1000
    return {
        "records": records_,
        "seconds": round(secs, 1),
        "records_per_s": round(records_ / secs),
        "batches": got["batches"],
        "wall_incl_startup_s": round(time.time() - t0, 1),
    } | use


def ceiling(s: config.Settings, end: dict[int, int], records_: int) -> dict:
    """The plain loop in its own process; its peak RSS and CPU from wait4's rusage of that process alone."""
    import tempfile

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "onceflow_dev.bench_ceiling", json.dumps(end)],
            env={**os.environ, **s.as_env()},
            stdout=out,
            stderr=err,
        )
        _, status, ru = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text, errors = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"the ceiling loop failed ({proc.returncode}): {errors[-2000:]}")
    got = json.loads(text.strip().splitlines()[-1])
    secs = (got["last_ms"] - got["first_ms"]) / 1000
    return {
        "records": records_,
        "seconds": round(secs, 1),
        "records_per_s": round(records_ / secs),
        "batches": got["batches"],
        "peak_rss_mb": round(ru.ru_maxrss / 1024),
        "cpu_s": round(ru.ru_utime + ru.ru_stime, 1),
    }


class Stamper(threading.Thread):
    """Reads a sink with read_committed and stamps each result with the moment it became visible."""

    seen: list[tuple[int, str]]  # (ms when it became visible, its window end)

    def __init__(self, s: config.Settings):
        super().__init__(daemon=True)
        self.s, self.seen, self.stop_ev = s, [], threading.Event()

    def run(self):
        c = kafka_clients.read_committed_consumer(
            self.s, group_id=f"bench.stamper.{self.s.app_id}", **{"fetch.wait.max.ms": 50}
        )
        c.subscribe([self.s.sink_topic])
        while not self.stop_ev.is_set():
            for m in c.consume(num_messages=5000, timeout=0.2):
                if m.error() is None:
                    v = json.loads(cast(bytes, m.value()))  # the sink's records always carry a value
                    self.seen.append((int(time.time() * 1000), v["window_end"]))
        c.close()


def _iso_ms(text: str) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def latency(c: Contender, s: config.Settings, spec: BenchSpec) -> dict:
    """Live input with event time = now; latency of each result = visible - (window end + watermark delay)."""
    stamper = Stamper(s)
    stamper.start()
    c.start()
    t_live = int(time.time() * 1000)
    generator.generate(
        s,
        generator.GeneratorSpec(
            count=None,
            duration_s=spec.live_s,
            rate=spec.live_rate,
            distinct_ips=spec.ips,
            late_fraction=0.0,
            seed=7,
            out_of_order_fraction=0.05,
            malformed_fraction=0.01,
            watermark_s=s.watermark_s,
            tail_s=0,
        ),
    )
    t_end = int(time.time() * 1000)
    time.sleep(3 * s.trigger_interval_s + s.watermark_s + s.window_s)
    use = usage(c.pid())
    c.stop()
    stamper.stop_ev.set()
    stamper.join(10)
    delay = s.watermark_s * 1000
    # windows wholly inside the live period after the warm-up, and early enough that a later event closes them
    first = t_live + max(spec.warmup_s, 2 * s.window_s) * 1000
    lat = sorted(
        seen - (_iso_ms(we) + delay) for seen, we in stamper.seen if first <= _iso_ms(we) <= t_end - s.window_s * 1000
    )
    if not lat:
        return {"results": 0}

    def pct(q):
        return lat[min(len(lat) - 1, int(q * len(lat)))]

    return {
        "results": len(lat),
        "p50_ms": pct(0.50),
        "p95_ms": pct(0.95),
        "p99_ms": pct(0.99),
        "max_ms": lat[-1],
        "mean_ms": round(statistics.mean(lat)),
    } | {f"live_{k}": v for k, v in use.items()}


def recovery(s: config.Settings, spec: BenchSpec) -> dict:
    """kill -9 of the exactly-once job under live input: time to its next commit and until lag recovers."""
    jobctl.start(s)
    jobctl.wait_running(s, timeout=300)
    feeder = threading.Thread(
        target=generator.generate,
        daemon=True,
        args=(
            s,
            generator.GeneratorSpec(
                count=None,
                duration_s=spec.live_s,
                rate=spec.live_rate,
                distinct_ips=spec.ips,
                late_fraction=0.0,
                seed=8,
                watermark_s=s.watermark_s,
            ),
        ),
    )
    feeder.start()
    time.sleep(spec.live_s / 3)

    def lag():
        wm = kafka_reading.watermarks(s, s.source_topic)
        assert wm is not None  # the source topic exists: the job reads it
        hi = {p: h for p, (_, h) in wm.items()}
        got = audit.committed_offsets(s, hi)
        return sum(hi[p] - got.get(p, 0) for p in hi)

    before = []
    for _ in range(int(2 * spec.trigger_s) + 3):
        time.sleep(0.5)
        before.append(lag())
    level = max(before)
    t_kill = int(time.time() * 1000)
    jobctl.kill(s)
    first = procs.wait_until(
        lambda: next((e for e in _events(s, wire.BATCH_COMMITTED) if e["ts_ms"] > t_kill), None),
        300,
        interval=0.2,
        what="a commit after the kill",
    )
    back = procs.wait_until(
        lambda: lag() <= level and int(time.time() * 1000), 600, interval=0.5, what="lag to recover"
    )
    feeder.join(spec.live_s + 30)
    jobctl.stop(s)
    return {
        "pre_crash_lag": level,
        "to_next_commit_s": round((first["ts_ms"] - t_kill) / 1000, 1),
        "to_lag_recovered_s": round((back - t_kill) / 1000, 1),
        "restart_delay_s": s.restart_delay_s,
    }


def _events(s, type_):
    # onceflow's events always carry a value
    return [
        e
        for e in (json.loads(cast(bytes, m.value)) for m in kafka_reading.read_topic(s, s.events_topic))
        if e["type"] == type_
    ]


# ---------------------------------------------------------------------------- the run
def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    for noisy in ("onceflow.events", "onceflow_dev.generator", "onceflow.kafka.client"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@contextmanager
def bench_stack(spec: BenchSpec, var: Path):
    """A private broker with the backlog written to `bench.source`; yields (base settings, end offsets)."""
    import shutil

    for sub in ("kafka", "checkpoints", "run", "log"):
        shutil.rmtree(var / sub, ignore_errors=True)
    base = config.load(
        env={k: v for k, v in os.environ.items() if not k.startswith("ONCEFLOW_")},
        var_dir=var,
        bootstrap_servers=f"127.0.0.1:{procs.free_port()}",
        controller_port=procs.free_port(),
        broker_heap="1g",
        restart_delay_s=2.0,
    )
    broker.start(base)
    try:
        backlog = _settings(base, "bench_backlog", "bench.source", spec)
        topics.ensure(backlog)
        log.info("writing the backlog: %d records", spec.records)
        t = time.time()
        generator.generate(
            backlog,
            generator.GeneratorSpec(
                count=spec.records,
                rate=0,
                event_rate=spec.event_rate,
                distinct_ips=spec.ips,
                skew=0.5,
                seed=3,
                late_fraction=0.01,
                malformed_fraction=0.01,
                out_of_order_fraction=0.05,
                tail_s=30,
                watermark_s=base.watermark_s,
            ),
            progress_every=500_000,
        )
        log.info("backlog written in %.0f s", time.time() - t)
        wm = kafka_reading.watermarks(base, "bench.source")
        assert wm is not None  # topics.ensure created it
        end = {p: h for p, (_, h) in wm.items()}
        _warm_up(base, end)
        yield base, end
    finally:
        broker.stop(base)


def _warm_up(s: config.Settings, end: dict[int, int]) -> None:
    """Read the backlog once before any contender does: the broker's own JIT warm-up would otherwise fall on
    whichever contender runs first (measured: the same job drained the backlog 17 % slower first than last)."""
    from confluent_kafka import TopicPartition

    t = time.time()
    c = kafka_clients.read_committed_consumer(s, group_id="bench.warmup", **{"enable.partition.eof": True})
    try:
        n = sum(
            1
            for _ in kafka_reading.consume_to_end(c, [TopicPartition("bench.source", p, 0) for p in end], timeout_s=600)
        )
    finally:
        c.close()
    log.info("broker warmed up: read %d records in %.0f s", n, time.time() - t)


def main() -> int:
    setup_logging()
    spec = BenchSpec()
    var = config.REPO_ROOT / "var" / "bench"
    results: dict = {"spec": spec.__dict__, "machine": {"cores": os.cpu_count(), "python": sys.version.split()[0]}}
    with bench_stack(spec, var) as (base, end):
        run_contenders(base, end, spec, results)
    tp = results["throughput"]
    results["ratios"] = {
        "eos_vs_alo_throughput": round(tp["eos"]["records_per_s"] / tp["alo"]["records_per_s"], 3),
        "eos_vs_ceiling_throughput": round(tp["eos"]["records_per_s"] / tp["ceiling"]["records_per_s"], 3),
        "eos_p99_in_trigger_intervals": round(results["latency"]["eos"].get("p99_ms", 0) / 1000 / spec.trigger_s, 2),
    }
    out = var / f"results-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(results, indent=1))
    print(table(results))
    print(f"\nfigures: {out}")
    return 0


def run_contenders(base: config.Settings, end: dict[int, int], spec: BenchSpec, results: dict) -> None:
    apps = {name: _settings(base, f"bench_{name}", "bench.source", spec) for name in ("eos", "alo", "ceiling")}
    try:
        for s in apps.values():
            topics.ensure(s)
        results["settings"] = {k: getattr(apps["eos"], k) for k in TUNABLES}
        n = sum(end.values())
        results["throughput"] = {}
        for key, contender in (("eos", ExactlyOnce(apps["eos"])), ("alo", AtLeastOnce(apps["alo"]))):
            log.info("throughput: %s", contender.name)
            results["throughput"][key] = throughput(contender, end, n)
            log.info("  %s", results["throughput"][key])
        log.info("throughput: ceiling")
        results["throughput"]["ceiling"] = ceiling(apps["ceiling"], end, n)
        log.info("  %s", results["throughput"]["ceiling"])
        results["latency"] = {}
        for key, cls in (("eos", ExactlyOnce), ("alo", AtLeastOnce)):
            s = _settings(base, f"bench_live_{key}", f"bench_live_{key}.source", spec)
            topics.ensure(s)
            log.info("latency: %s", cls.name)
            results["latency"][key] = latency(cls(s), s, spec)
            log.info("  %s", results["latency"][key])
        s = _settings(base, "bench_recovery", "bench_recovery.source", spec)
        topics.ensure(s)
        log.info("recovery after kill -9")
        results["recovery"] = recovery(s, spec)
        log.info("  %s", results["recovery"])
    finally:
        for s in apps.values():
            jobctl.stop(s, timeout=30)


def table(r: dict) -> str:
    tp, lat = r["throughput"], r["latency"]
    rows = [("", "records/s", "p50 ms", "p95 ms", "p99 ms", "peak RSS MB", "CPU s")]
    names = {
        "eos": "onceflow exactly-once",
        "alo": "Spark Kafka sink (at-least-once)",
        "ceiling": "confluent-kafka txn loop (no Spark)",
    }
    for k in ("eos", "alo", "ceiling"):
        l_ = lat.get(k, {})
        rows.append(
            (
                names[k],
                f"{tp[k]['records_per_s']:,}",
                str(l_.get("p50_ms", "-")),
                str(l_.get("p95_ms", "-")),
                str(l_.get("p99_ms", "-")),
                str(tp[k]["peak_rss_mb"]),
                str(tp[k]["cpu_s"]),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    ra, rec = r["ratios"], r["recovery"]
    lines += [
        "",
        f"exactly-once / at-least-once throughput: {ra['eos_vs_alo_throughput']}",
        f"exactly-once / ceiling throughput:       {ra['eos_vs_ceiling_throughput']}",
        f"exactly-once p99 latency in trigger intervals ({r['spec']['trigger_s']} s): "
        f"{ra['eos_p99_in_trigger_intervals']}",
        f"recovery after kill -9: next commit in {rec['to_next_commit_s']} s, lag back to its pre-crash level "
        f"({rec['pre_crash_lag']}) in {rec['to_lag_recovered_s']} s (restart delay {rec['restart_delay_s']} s)",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    sys.exit(main())
