"""`make bench`: onceflow's exactly-once job, the same query on Spark's at-least-once Kafka sink, a plain
transactional confluent-kafka loop (the ceiling), and the same query on Flink 2.x with its exactly-once KafkaSink
(checkpoints every 5 s, and every BENCH_FLINK_FAST_MS; onceflow_dev.bench_flink), side by side on one generated
workload and one private broker; ip_networks (the stateless second app) and ip_count into a PostgreSQL table too.
BENCH_CONTENDERS picks rows (CONTENDERS); `run` is the whole run, which tests/bench/test_short_bench.py runs small.

Phases, each run in turn for every contender on the same machine:
1. throughput: a backlog of BENCH_RECORDS records (4 partitions, BENCH_IPS distinct IPs) is written once; each
   contender drains it from offset 0 to its own sink; records/s = records / (last result committed - first
   batch started); peak RSS (VmHWM) and CPU seconds of the contender's processes; then its sink is read with
   read_committed and checked against the counts recounted from the backlog (onceflow_dev.bench_check): a
   contender whose output is wrong is marked WRONG in the table;
2. latency: records produced live at BENCH_LIVE_RATE/s with event time = wall clock, from the contender's start; a
   read_committed consumer stamps each result when it sees it; latency = seen - (window end + watermark delay), and
   for ip_networks (no window: one result per record, on either of its outputs) seen - the record's event time.
   First the catch-up: until the contender's lag (source records past the position it committed) stays within
   two trigger intervals of input for BENCH_STEADY_S s (at most BENCH_CATCHUP_MAX_S): its time from the first
   record is a figure of its own (`catch_up_s`). Then the warm-up, BENCH_WARMUP_S s (default 120: a JVM caught up
   after a cold start still compiles its hot code), measured apart (`warmup`). Then the steady state: BENCH_LIVE_S
   s more of input (default 1,200: about 240 windows), over the windows that end in it (`windows`, and p50/p95/p99 of their
   results; ip_networks: over the records stamped in it). The row `eos_loaded` measures onceflow the same way with
   a second onceflow job running beside it (another ip_count at BENCH_LOAD_RATE records/s, default
   BENCH_LIVE_RATE, caught up before the measured job starts); the load is reported with it (its CPU over the
   phase, and whether it kept up);
3. recovery (exactly-once job only): live input, then kill -9 of the job; the time to its next committed batch
   and until its lag is back to the level before the crash; BENCH_RECOVERY_RUNS times (default 3, each a fresh app:
   the median and the worst) restarted by its supervisor after the fixed delay (a new spark-submit), as many taken
   over by its warm standby (ONCEFLOW_STANDBY).
Prints one table and writes the figures to var/bench/results-<time>.json.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from onceflow import config, logs, wire
from onceflow.kafka import clients as kafka_clients
from onceflow.kafka import events as ev
from onceflow.kafka import reading as kafka_reading
from onceflow.kafka import topics
from onceflow.operations import audit
from onceflow.rules import clock
from onceflow.rules.names import private_topics
from onceflow.runtime import jobctl, launcher, procs, run_files, supervisor
from onceflow_dev import (
    bench_check,
    bench_flink,
    broker,
    generator,
    interrupt,
    loopback,
    machine,
    postgres,
    spark_cluster,
    stack,
)
from onceflow_dev.stamper import Stamper

log = logging.getLogger("onceflow_dev.bench")
# The job settings a tuning run varies (docs/performance.md); recorded with every result.
TUNABLES = (
    "trigger_interval_s",
    "close_out_batches",
    "max_offsets_per_trigger",
    "shuffle_partitions",
    "state_store_provider",
    "producer_linger_ms",
    "class_data_sharing",
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
    # the steady state's length: 1,200 s holds about 240 of ip_count's 5 s windows, so a p99 is not the slowest window
    # of a couple of dozen (120 s, the default until 2026-11-30: 23 windows)
    live_s: int = field(default_factory=lambda: _env_int("BENCH_LIVE_S", 1_200))
    # the latency phase's steady state begins once the lag stayed low this long; catch-up gives up after the max
    steady_s: int = field(default_factory=lambda: _env_int("BENCH_STEADY_S", 15))
    # then the warm-up: a JVM caught up after a cold start is still compiling its hot code (C2) for a minute or two,
    # and its windows then wait longer. Their figures are reported apart (`warmup`), the steady state's follow it
    warmup_s: int = field(default_factory=lambda: _env_int("BENCH_WARMUP_S", 120))
    catchup_max_s: int = field(default_factory=lambda: _env_int("BENCH_CATCHUP_MAX_S", 300))
    trigger_s: float = field(
        default_factory=lambda: float(os.environ.get("BENCH_TRIGGER_S", config.Settings.trigger_interval_s))
    )
    max_offsets: int = field(
        default_factory=lambda: _env_int("BENCH_MAX_OFFSETS", config.Settings.max_offsets_per_trigger)
    )
    # the Flink contender: BENCH_FLINK=0 leaves it out; its second configuration's checkpoint interval
    flink: bool = field(default_factory=lambda: os.environ.get("BENCH_FLINK", "1") != "0")
    flink_fast_ms: int = field(default_factory=lambda: _env_int("BENCH_FLINK_FAST_MS", 500))
    # the recovery phase's kills per mode (restart, standby): median and worst are reported
    recovery_runs: int = field(default_factory=lambda: _env_int("BENCH_RECOVERY_RUNS", 3))
    # rows for ip_count into PostgreSQL (docs/database-sink.md), throughput and latency (its results polled from the
    # table every 200 ms), on a server of the bench's own; BENCH_POSTGRES=0 leaves them out
    postgres: bool = field(default_factory=lambda: os.environ.get("BENCH_POSTGRES", "1") != "0")
    # the loaded latency row (`eos_loaded`): a second onceflow job (another ip_count, its own source) fed this many
    # records/s beside the measured one; 0: BENCH_LIVE_RATE, the measured job's own rate
    load_rate: int = field(default_factory=lambda: _env_int("BENCH_LOAD_RATE", 0))
    # the second job's trigger_margin_ms: -1 (the default) is half the trigger interval, so its batches start half
    # an interval after the measured job's, as an operator spreads jobs that share a machine (docs/performance.md);
    # BENCH_LOAD_MARGIN_MS=300, the job's default, paces both on the same moments
    load_margin_ms: int = field(default_factory=lambda: _env_int("BENCH_LOAD_MARGIN_MS", -1))
    # BENCH_CONTENDERS=eos,alo,...: only these rows (onceflow's own, `eos`, always runs: every ratio is to it);
    # empty: every row the flags above allow. The short variant, `make bench-short` (tests/bench/test_short_bench.py),
    # leaves out `flink_fast`, the same code as `flink` at another interval
    contenders: frozenset[str] = field(
        default_factory=lambda: frozenset(filter(None, os.environ.get("BENCH_CONTENDERS", "").split(",")))
    )
    # BENCH_TOPOLOGY=cluster: the same run on the loopback cluster (three brokers, replication 3 with min ISR 2, and
    # a Spark standalone master with two workers: the job's tasks in the workers' executors, its writer in the
    # driver); the default, one-node: one broker and Spark in the job's own JVM (local[2])
    topology: str = field(default_factory=lambda: os.environ.get("BENCH_TOPOLOGY", "one-node"))

    def __post_init__(self) -> None:
        if self.topology not in TOPOLOGIES:
            raise ValueError(f"BENCH_TOPOLOGY={self.topology!r}: one of {', '.join(TOPOLOGIES)}")

    def as_json(self) -> dict:
        """The workload as a results file records it."""
        return self.__dict__ | {"contenders": sorted(self.contenders)}

    def load_margin(self) -> int:
        """The second job's trigger_margin_ms in the loaded row: BENCH_LOAD_MARGIN_MS, or half the trigger."""
        return self.load_margin_ms if self.load_margin_ms >= 0 else int(self.trigger_s * 1000) // 2

    def runs(self, key: str) -> bool:
        """Whether the row `key` (one of CONTENDERS) is in this run."""
        if key not in CONTENDERS:
            raise ValueError(f"unknown bench contender {key!r}: one of {', '.join(CONTENDERS)}")
        allowed = {
            "flink": self.flink,
            "flink_fast": self.flink,
            "eos_postgres": self.postgres,
            # two jobs' executors at once are not told apart by their CPU (executor_pids): one node only
            "eos_loaded": self.topology == "one-node",
        }.get(key, True)
        return key == "eos" or (allowed and (not self.contenders or key in self.contenders))


CLUSTER_WORKERS = 2
TOPOLOGY_NAMES = {
    "one-node": "one broker, Spark local[2] in the job's JVM",
    "cluster": f"three brokers (replication 3, min ISR 2), a Spark standalone master with {CLUSTER_WORKERS} workers",
}
TOPOLOGIES = tuple(TOPOLOGY_NAMES)

# every row `make bench` can have, in the table's order
# (eos_loaded: a latency row only, onceflow's latency with a second onceflow job running beside it)
CONTENDERS = ("eos", "eos_ip_networks", "eos_postgres", "alo", "ceiling", "flink", "flink_fast", "eos_loaded")


def _settings(base: config.Settings, app_id: str, source: str, spec: BenchSpec, **overrides) -> config.Settings:
    """An app of the bench's own, reading `source`, its other topics its own (private_topics): no two bench
    apps collide as Kafka compares topic names."""
    return base.replace(
        **(
            private_topics(app_id)
            | {
                "app_id": app_id,
                "source_topic": source,
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


def executor_pids(since_ticks: int) -> list[int]:
    """The Spark executors a standalone worker started after `since_ticks` (a process start time, in clock ticks
    since boot): on the cluster a job's tasks run in them, outside the job's process group. The bench's contenders
    run one at a time, so the executors started since one began are its own."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            if b"CoarseGrainedExecutorBackend" not in Path(f"/proc/{d}/cmdline").read_bytes():
                continue
            if int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[19]) >= since_ticks:
                out.append(int(d))
        except (OSError, ValueError, IndexError):
            pass
    return out


def boot_ticks_now() -> int:
    """Now, as a process start time is written in /proc/<pid>/stat (clock ticks since boot)."""
    return int(float(Path("/proc/uptime").read_text().split()[0]) * os.sysconf("SC_CLK_TCK"))


def usage(pid: int | None, executors_since: int | None = None) -> dict:
    """Peak RSS (sum of VmHWM) and CPU seconds of a process group, read while it runs: each member's own (utime +
    stime) and that of its children it has reaped (cutime + cstime), such as the short processes a JVM forks (Hadoop's
    `chmod` on each file it creates, without its native library). A member that ends between two readings is still
    counted, in its parent's reaped time, when the parent is in the group. `executors_since`: the Spark executors
    started since then count too (the cluster topology, executor_pids)."""
    hwm_kb, ticks = 0, 0
    extra = executor_pids(executors_since) if executors_since is not None and pid is not None else []
    for p in _group_pids(pid) + extra:
        try:
            status = Path(f"/proc/{p}/status").read_text()
            hwm_kb += int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("VmHWM")))
            stat = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += sum(int(x) for x in stat[11:15])
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

    def position(self, partitions: list[int]) -> dict[int, int] | None:
        """The source offsets (per partition) up to which the contender has committed its output; None if unknown."""
        return None

    def commit_interval_s(self) -> float:
        """How often the contender commits its position (a Spark trigger; Flink's checkpoint interval)."""
        return self.s.trigger_interval_s

    def commit_phase(self, start_ms: int, end_ms: int) -> dict:
        """Where in the windows' interval its commits fell over the steady state, for a contender that picks that
        itself (Flink); {} for onceflow's, paced on fixed moments."""
        return {}

    def lag(self, s: config.Settings) -> int | None:
        """Source records past the committed position; None while unknown (nothing committed yet)."""
        wm = kafka_reading.watermarks(s, s.source_topic) or {}
        pos = self.position(list(wm)) if wm else None
        if not pos:
            return None
        return sum(max(0, hi - pos.get(p, lo)) for p, (lo, hi) in wm.items())


def read_to_the_end(position: dict[int, int], end: dict[int, int], last_batch_read: bool, closes: bool) -> bool:
    """A contender has drained the backlog: its committed position is the end, and, for an app whose results are
    windows a watermark closes (`closes`), its last batch read nothing: the close-out batch that writes the windows
    the last data batch's watermark closed (Spark evicts with the previous batch's watermark). Without it a loaded
    machine stopped the job first and the sink lacked those windows (every one, with a single data batch). A
    stateless app has no such batch to wait for."""
    return position == end and not (closes and last_batch_read)


class ExactlyOnce(Contender):
    name = "onceflow exactly-once"

    def start(self):
        jobctl.start(self.s)
        jobctl.wait_running(self.s, timeout=300)

    def pid(self):
        job = procs.read_pidfile(supervisor.job_pidfile(self.s))
        return job["pid"] if job else None

    def drained(self, end) -> dict | None:
        entries = audit.ledger_entries(self.s)
        last_read = bool(entries) and any(a < b for a, b in entries[-1].ranges.values())
        if not entries or not read_to_the_end(
            audit.committed_on_source(self.s, end), end, last_read, self.s.declared_app().event_time
        ):
            return None
        return {
            "first_ms": min(e.batch_ts_ms for e in entries if e.ranges and any(a < b for a, b in e.ranges.values())),
            "last_ms": max(e.commit_time_ms for e in entries),
            "batches": len(entries),
        }

    def position(self, partitions):
        return audit.committed_on_source(self.s, partitions) or None

    def stop(self):
        jobctl.stop(self.s)
        return {}


class AtLeastOnce(Contender):
    name = "Spark Kafka sink (at-least-once)"

    def start(self):
        argv = launcher.submit_argv(self.s)[:-1] + [str(Path(__file__).with_name("ip_count_alo.py"))]
        self.proc = procs.spawn_detached(argv, self.s.log_dir / f"{self.s.app_id}.log", env=launcher.submit_env(self.s))
        procs.wait_until(
            lambda: (run_files.read_json(self.s.status_file) or {}).get("state") == wire.JobState.RUNNING,
            300,
            what="the at-least-once query to run",
        )

    def pid(self):
        return self.proc.pid

    def drained(self, end) -> dict | None:
        st = run_files.read_json(self.s.status_file) or {}  # the at-least-once query's own status file
        last_read = st.get("last_input_rows") != 0
        if "first_batch_ms" not in st or not read_to_the_end(self.position(list(end)) or {}, end, last_read, True):
            return None
        return {"first_ms": st["first_batch_ms"], "last_ms": st["last_commit_ms"], "batches": st["batches"]}

    def position(self, partitions):
        st = run_files.read_json(self.s.status_file) or {}  # the end offsets of its last completed batch
        offs = json.loads(st["end_offsets"]) if st.get("end_offsets") else {}
        return {int(p): o for p, o in offs.get(self.s.source_topic, {}).items()} or None

    def stop(self):
        procs.stop_process(self.proc.pid, 60)
        return {}


class Flink(bench_flink.FlinkJob, Contender):
    """Flink 2.x, KafkaSink EXACTLY_ONCE, a checkpoint (and so a transaction per subtask) every `checkpoint_ms`."""

    def __init__(self, s: config.Settings, checkpoint_ms: int, expect: bench_check.Expected | None = None):
        Contender.__init__(self, s)
        bench_flink.FlinkJob.__init__(self, s, checkpoint_ms, expect)
        self.name = f"Flink KafkaSink (exactly-once, checkpoint {checkpoint_ms} ms)"

    def commit_interval_s(self) -> float:
        return self.checkpoint_ms / 1000


# ---------------------------------------------------------------------------- correctness
def expected_counts(s: config.Settings, topic: str, end: dict[int, int]) -> bench_check.Expected:
    """The backlog recounted with onceflow's reference parser (each partition in offset order)."""
    from confluent_kafka import TopicPartition

    counts = bench_check.ExpectedCounts(s.window_s, s.watermark_s, s.max_event_ahead_ms)
    c = kafka_clients.read_committed_consumer(s, group_id="bench.expected", **{"enable.partition.eof": True})
    try:
        for m in kafka_reading.consume_to_end(c, [TopicPartition(topic, p, 0) for p in end], timeout_s=1200):
            counts.add(m.partition(), m.value(), m.timestamp()[1])
    finally:
        c.close()
    return counts.result()


def check(s: config.Settings, exp: bench_check.Expected) -> dict:
    """A contender's sink (and DLQ) as read_committed consumers see them (a table sink: its tables, in one
    transaction), against the recount."""
    if s.sink_kind == "postgres":
        _, rows = audit.table_snapshot(s)
        pairs = ((k.encode(), v.encode()) for k, v, _ in rows.results)
        return bench_check.compare(exp, pairs, s.window_s, dlq_records=len(rows.dlq))
    sink = kafka_reading.read_topic(s, s.sink_topic, timeout_s=600)
    dlq = kafka_reading.read_topic(s, s.dlq_topic, timeout_s=600)
    return bench_check.compare(exp, ((m.key, m.value) for m in sink), s.window_s, dlq_records=len(dlq))


def check_any_app(s: config.Settings, exp: bench_check.Expected) -> dict:
    """An app without ip_count's windows (ip_networks): `onceflow audit` (its own audit, or I1 and the ledger's
    accounting of every sink and DLQ record), and every record of the backlog once, as one result or one DLQ
    record (ip_networks writes one result per good record)."""
    rep = audit.audit(s)
    dlq = rep.dlq_records if rep.dlq_records is not None else rep.malformed
    exact = rep.ok and rep.sink_records + dlq == exp.records
    return {
        "verdict": "exact" if exact else "WRONG",
        "sink_records": rep.sink_records,
        "dlq_records": dlq,
        "records": exp.records,
        "audit_ok": rep.ok,
    }


def contender_usage(c: Contender, since: int) -> dict:
    """`usage` of a contender's processes; on a standalone master (the cluster topology) with the executors started
    since `since` (boot_ticks_now() before it started)."""
    return usage(c.pid(), since if c.s.on_standalone else None)


# ---------------------------------------------------------------------------- phases
def throughput(c: Contender, end: dict[int, int], records_: int, timeout: float = 3600) -> dict:
    t0, since = time.time(), boot_ticks_now()
    c.start()
    got = procs.wait_until(lambda: c.drained(end), timeout, interval=1.0, what=f"{c.name} to drain")
    use = contender_usage(c, since)
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


def _iso_ms(text: str) -> int:
    return clock.parse_iso_ms(text)


# the recovery phase's bounds: a warm standby's readiness, the first commit after the kill, the lag back
STANDBY_READY_S, NEXT_COMMIT_S, LAG_BACK_S = 300, 300, 600
# The input outlasts every wait of the phase, and is stopped once the recovery is measured. It ran 150 s before:
# on the loopback cluster a standby took 2.5 minutes to be ready, the input had ended by the kill, and no batch
# was left to commit after it.
RECOVERY_FEED_S = 60 + STANDBY_READY_S + NEXT_COMMIT_S + LAG_BACK_S


def live_feed(
    s: config.Settings,
    rate: int,
    ips: int,
    duration_s: float,
    seed: int,
    stop: threading.Event | None = None,
    **extra,
):
    """A thread (not started) producing `rate` records/s over `ips` IPs with event time = now, until `stop` is set
    or `duration_s` passed; nothing late on purpose (`extra`: other fractions of the generator's)."""
    gen = generator.GeneratorSpec(
        count=None,
        duration_s=duration_s,
        rate=rate,
        distinct_ips=ips,
        late_fraction=0.0,
        seed=seed,
        watermark_s=s.watermark_s,
        tail_s=0,
        **extra,
    )
    return threading.Thread(target=generator.generate, args=(s, gen), kwargs={"stop": stop}, daemon=True)


def latency(c: Contender, s: config.Settings, spec: BenchSpec) -> dict:
    """Live input with event time = now; latency of each result = visible - (window end + watermark delay), over
    the steady state that follows the contender's catch-up after its cold start (the module's docstring)."""
    stamper = Stamper(s)
    stamper.start()
    stop = threading.Event()
    try:  # a failed row (a Flink contender's is reported, the bench goes on) leaves no feed or stamper running
        since = boot_ticks_now()
        c.start()
        duration_s = spec.catchup_max_s + spec.steady_s + spec.warmup_s + spec.live_s + 60
        feed = live_feed(
            s,
            spec.live_rate,
            spec.ips,
            duration_s,
            seed=7,
            stop=stop,
            out_of_order_fraction=0.05,
            malformed_fraction=0.01,
        )
        t_live = clock.now_ms()
        feed.start()
        bound = steady_lag_bound(spec.live_rate, c.commit_interval_s())
        steady_ms = catch_up(c, s, bound, spec)
        caught_up = steady_ms is not None
        t_caught = steady_ms if steady_ms is not None else clock.now_ms()
        t_first = t_caught + spec.warmup_s * 1000
        log.info(
            "  %s after %.0f s; warm-up for %d s, then steady state for %d s",
            "caught up" if caught_up else "not caught up",
            (t_caught - t_live) / 1000,
            spec.warmup_s,
            spec.live_s,
        )
        hold_steady(c, s, t_caught, t_first + spec.live_s * 1000, bound, measured_from_ms=t_first)
        t_end = clock.now_ms()
        stop.set()
        feed.join(60)
        time.sleep(3 * s.trigger_interval_s + s.watermark_s + s.window_s)
        use = contender_usage(c, since)
        c.stop()
        phase = c.commit_phase(t_first, t_end)
    except BaseException:
        stop.set()
        stamper.discard()
        raise
    seen = stamper.stop(30)
    return window_latencies(seen, s, t_first, t_end) | {
        "caught_up": caught_up,
        "catch_up_s": round((t_caught - t_live) / 1000, 1),
        "warmup": window_latencies(seen, s, t_caught, t_first) if spec.warmup_s else {},
        "steady_lag_bound": bound,
        "measured_s": round((t_end - t_first) / 1000, 1),
        **phase,
        **{f"live_{k}": v for k, v in use.items()},
    }


def catch_up(c: Contender, s: config.Settings, bound: int, spec: BenchSpec) -> int | None:
    """Sample `c`'s lag every second until it has stayed within `bound` for BENCH_STEADY_S (at most
    BENCH_CATCHUP_MAX_S + BENCH_STEADY_S): the moment (epoch ms) the steady state began, None if it never did."""
    lags: list[tuple[int, int]] = []
    deadline = time.monotonic() + spec.catchup_max_s + spec.steady_s
    steady_ms = None
    while steady_ms is None and time.monotonic() < deadline:
        time.sleep(1.0)
        lag = c.lag(s)
        if lag is not None:
            lags.append((clock.now_ms(), lag))
        steady_ms = steady_since(lags, bound, spec.steady_s * 1000)
    return steady_ms


def loaded_latency(base: config.Settings, spec: BenchSpec) -> dict:
    """Phase 2 for onceflow with the machine loaded by a second onceflow job: another ip_count instance on a source of
    its own, fed live at the load rate, started first and measured once it has caught up (its cold start is not the
    load), running until the measured job's phase ends. The load is reported with the figures: its rate, its CPU
    over the measured job's phase, and whether it kept up."""
    rate = spec.load_rate or spec.live_rate
    margin_ms = spec.load_margin()
    load = _settings(base, "bench_load", "bench_load.source", spec, trigger_margin_ms=margin_ms)
    s = _settings(base, "bench_live_eos_loaded", "bench_live_eos_loaded.source", spec)
    for x in (load, s):
        topics.ensure(x)
    job, stop = ExactlyOnce(load), threading.Event()
    feed = live_feed(
        load,
        rate,
        spec.ips,
        3 * (spec.catchup_max_s + spec.steady_s + spec.warmup_s + spec.live_s) + 300,
        seed=9,
        stop=stop,
    )
    bound = steady_lag_bound(rate, job.commit_interval_s())
    try:
        job.start()
        feed.start()
        # measured even if it never catches up: the load is then more than the machine keeps up with, and says so
        ready = catch_up(job, load, bound, spec) is not None
        before, t0 = usage(job.pid())["cpu_s"], time.monotonic()
        got = latency(ExactlyOnce(s), s, spec)
        used, wall = usage(job.pid())["cpu_s"] - before, time.monotonic() - t0
        lag_end = job.lag(load)
    finally:
        stop.set()
        if feed.ident is not None:  # started
            feed.join(60)
        job.stop()
    return got | {
        "load": {
            "app": load.app,
            "rate": rate,
            "margin_ms": margin_ms,
            "cpu_s": round(used, 1),
            "cores": round(used / wall, 2) if wall > 0 else None,
            "caught_up_before": ready,
            "lag_at_end": lag_end,
            "kept_up": ready and lag_end is not None and lag_end <= bound,
        }
    }


def hold_steady(
    c: Contender,
    s: config.Settings,
    start_ms: int,
    end_ms: int,
    bound: int,
    every_s: float = 60.0,
    measured_from_ms: int | None = None,
) -> None:
    """Wait until `end_ms`, logging the contender's lag every `every_s`: a steady state lasts 20 minutes at the
    defaults, and a job that fell behind shows it here, not only in the figures at the end. One lag lookup a minute,
    against one a second while catching up. `start_ms`: when the caught-up state began (the start of the hold that
    proved the catch-up, so already past); `measured_from_ms`: where its warm-up ends and the measured steady state
    begins (default `start_ms`: no warm-up). Each line says which of the two it is in, counted from its own start."""
    first_ms = start_ms if measured_from_ms is None else measured_from_ms
    warm_s, total_s = (first_ms - start_ms) / 1000, (end_ms - first_ms) / 1000
    while (left_s := (end_ms - clock.now_ms()) / 1000) > 0:
        time.sleep(min(every_s, left_s))
        if (now := clock.now_ms()) < end_ms:
            if now < first_ms:
                what, done_s, of_s = "warm-up", (now - start_ms) / 1000, warm_s
            else:
                what, done_s, of_s = "steady state", (now - first_ms) / 1000, total_s
            log.info("  %s %.0f of %.0f s, lag %s records (bound %d)", what, done_s, of_s, c.lag(s), bound)


def steady_lag_bound(rate: int, commit_interval_s: float) -> int:
    """The most lag a caught-up contender shows: the position moves only on a commit, so just before one the lag
    holds a whole interval's input; twice that (and at least 2 s of input) absorbs a slow batch or checkpoint.
    Taken from the trigger alone, Flink's 5 s checkpoints never counted as caught up beside a 2 s trigger."""
    return int(2 * rate * max(commit_interval_s, 1.0))


def steady_since(lags: list[tuple[int, int]], bound: int, hold_ms: int) -> int | None:
    """The moment (epoch ms) from which every lag sample stayed at most `bound`, once that has held for
    `hold_ms`; None until then. `lags`: (epoch ms, lag) samples in time order."""
    since = None
    for ts, lag in lags:
        if lag > bound:
            since = None
        elif since is None:
            since = ts
    if since is not None and lags and lags[-1][0] - since >= hold_ms:
        return since
    return None


def window_latencies(seen: list[tuple[int, str]], s: config.Settings, first_ms: int, end_ms: int) -> dict:
    """Percentiles of each result's latency over the steady state [first_ms, end_ms]. An event-time app's result
    (a window) is due at its window's end plus the watermark delay, counted for the windows ending in
    [first_ms, end_ms - one window] (early enough that a later event closes them); a stateless app's result is due
    at the event time of its record (the live feed stamps now), counted for the records stamped in the steady state."""
    windowed = s.declared_app().event_time
    delay, tail = (s.watermark_s * 1000, s.window_s * 1000) if windowed else (0, 0)
    inside = [(seen_ms, a) for seen_ms, a in seen if first_ms <= _iso_ms(a) <= end_ms - tail]
    lat = sorted(seen_ms - (_iso_ms(a) + delay) for seen_ms, a in inside)
    if not lat:
        return {"results": 0, "windows": 0} if windowed else {"results": 0}

    def pct(q):
        return lat[min(len(lat) - 1, int(q * len(lat)))]

    return {
        "results": len(lat),
        **({"windows": len({a for _, a in inside})} if windowed else {}),
        "p50_ms": pct(0.50),
        "p95_ms": pct(0.95),
        "p99_ms": pct(0.99),
        "max_ms": lat[-1],
        "mean_ms": round(statistics.mean(lat)),
    }


def recovery(s: config.Settings, spec: BenchSpec) -> dict:
    """kill -9 of the exactly-once job under live input: time to its next commit and until lag recovers."""
    jobctl.start(s)
    jobctl.wait_running(s, timeout=300)
    feed_s = RECOVERY_FEED_S
    stop_feed = threading.Event()
    feeder = live_feed(s, spec.live_rate, spec.ips, feed_s, seed=8, stop=stop_feed)
    feeder.start()
    time.sleep(20)

    def lag():
        wm = kafka_reading.watermarks(s, s.source_topic)
        assert wm is not None  # the source topic exists: the job reads it
        hi = {p: h for p, (_, h) in wm.items()}
        got = audit.committed_on_source(s, hi)
        return sum(hi[p] - got.get(p, 0) for p in hi)

    if s.standby:  # the kill lands on a job whose standby is up (it is launched after the job's first commit)
        procs.wait_until(
            lambda: (sb := jobctl.status(s).standby) is not None and sb.ready, STANDBY_READY_S, what="a warm standby"
        )
    before = []
    for _ in range(int(2 * spec.trigger_s) + 3):
        time.sleep(0.5)
        before.append(lag())
    level = max(before)
    t_kill = clock.now_ms()
    jobctl.kill(s)
    first = procs.wait_until(
        lambda: next((e for e in _events(s, wire.BATCH_COMMITTED) if e["ts_ms"] > t_kill), None),
        NEXT_COMMIT_S,
        interval=0.2,
        what="a commit after the kill",
    )
    back = procs.wait_until(lambda: lag() <= level and clock.now_ms(), LAG_BACK_S, interval=0.5, what="lag to recover")
    stop_feed.set()  # measured: the rest of the input would only be waited for
    feeder.join(feed_s + 30)
    jobctl.stop(s)
    return {
        "pre_crash_lag": level,
        "to_next_commit_s": round((first["ts_ms"] - t_kill) / 1000, 1),
        "to_lag_recovered_s": round((back - t_kill) / 1000, 1),
        "restart_delay_s": s.restart_delay_s,
    }


def recovery_summary(runs: list[dict]) -> dict:
    """The runs of one recovery mode: each, and the median and worst of both times."""
    import statistics

    out: dict = {"runs": runs, "restart_delay_s": runs[0]["restart_delay_s"]}
    for k in ("to_next_commit_s", "to_lag_recovered_s"):
        values = [r[k] for r in runs]
        out[k] = round(statistics.median(values), 1)
        out[f"{k}_max"] = max(values)
    out["pre_crash_lag"] = max(r["pre_crash_lag"] for r in runs)
    return out


def _events(s, type_):
    return ev.read(s, {type_})  # from the topic the type lives on (the job's facts: the job events topic)


# ---------------------------------------------------------------------------- the run
def setup_logging() -> None:
    logs.setup(logging.INFO, logs.SHORT)
    for noisy in ("onceflow.events", "onceflow_dev.generator", "onceflow.kafka.client"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def private_settings(var: Path, topology: str = "one-node") -> config.Settings:
    """The embedded defaults on a private broker of free ports under `var` (emptied of the last run's broker, jobs
    and logs); the caller's ONCEFLOW_* environment is left out. On the cluster topology: three brokers and a
    standalone Spark master (as the cluster tests' and `make chaos`'s, docs/cluster.md)."""
    import shutil

    for sub in ("kafka", "checkpoints", "run", "log", "spark"):
        shutil.rmtree(var / sub, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEFLOW_")}
    if topology == "cluster":
        return config.load(
            env=env,
            var_dir=var,
            **loopback.cluster(),
            driver_memory="1g",
            executor_memory="1g",
            cores_max=2,
            broker_heap="512m",
            restart_delay_s=2.0,
        )
    return config.load(
        env=env,
        var_dir=var,
        **loopback.kafka(),
        broker_heap="1g",
        restart_delay_s=2.0,
    )


@contextmanager
def bench_stack(spec: BenchSpec, var: Path):
    """A private broker (three, and a Spark master with its workers, on the cluster topology) with the backlog written
    to `bench.source`; yields (base settings, end offsets)."""
    base = private_settings(var, spec.topology)
    stack.prepare_jvm(base)  # as `make run` does: no contender's CPU pays for a first start on this machine
    broker.start(base)
    try:
        if spec.topology == "cluster":
            spark_cluster.start(base, workers=CLUSTER_WORKERS)
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
        if spec.topology == "cluster":
            spark_cluster.stop(base)
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


def main(var: Path = config.REPO_ROOT / "var" / "bench") -> int:
    setup_logging()
    results: dict = {}
    out = var / f"results-{time.strftime('%Y%m%dT%H%M%S')}.json"
    try:
        run(BenchSpec(), var, results)
    except Exception as e:  # a phase that fails keeps the figures of the phases before it
        log.exception("the bench stopped")
        results["error"] = f"{type(e).__name__}: {str(e)[:500]}"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    if "error" in results:
        print(f"\nthe bench stopped ({results['error']}); the figures of the phases before it: {out}")
        return 1
    print(table(results))
    print(f"\nfigures: {out}")
    return 0


def run(spec: BenchSpec, var: Path, results: dict | None = None) -> dict:
    """Every phase for every contender of `spec` on a private broker under `var`; the figures, with the ratios, in
    `results` (filled as the phases end, so a caller keeps what was measured when one fails)."""
    results = {} if results is None else results
    results |= {"spec": spec.as_json(), "machine": machine.describe()}
    with bench_stack(spec, var) as (base, end):
        run_contenders(base, end, spec, results)
    results["ratios"] = ratios(results, spec.trigger_s)
    return results


def ratios(results: dict, trigger_s: float) -> dict:
    """onceflow's figures over each other row's of the same run (None where that row did not run)."""
    tp = results["throughput"]

    def over(key: str, base: str = "eos") -> float | None:
        if not tp.get(key, {}).get("records_per_s") or not tp.get(base, {}).get("records_per_s"):
            return None
        return round(tp[base]["records_per_s"] / tp[key]["records_per_s"], 3)

    return {
        "eos_vs_alo_throughput": over("alo"),
        "eos_vs_ceiling_throughput": over("ceiling"),
        "ip_networks_vs_ip_count_throughput": over("eos", "eos_ip_networks"),
        "postgres_vs_kafka_sink_throughput": over("eos", "eos_postgres"),
        "eos_p99_in_trigger_intervals": round(results["latency"]["eos"].get("p99_ms", 0) / 1000 / trigger_s, 2),
        "eos_loaded_p99_in_trigger_intervals": (
            round(results["latency"]["eos_loaded"]["p99_ms"] / 1000 / trigger_s, 2)
            if results["latency"].get("eos_loaded", {}).get("p99_ms")
            else None
        ),
    } | flink_ratios(results)


def _checked(s: config.Settings, exp: bench_check.Expected) -> dict:
    got = check(s, exp)
    log.info("  correctness: %s", got)
    return got


def _reported(flink: Flink, phase) -> dict:
    """A Flink phase's figures; a contender that fails is reported (its error in the figures), the bench goes on."""
    try:
        got = phase()
    except Exception as e:
        log.exception("the Flink contender failed")
        flink.stop()
        got = {"error": f"{type(e).__name__}: {str(e)[:500]}"}
    log.info("  %s", got)
    return got


def flink_configs(spec: BenchSpec) -> dict[str, int]:
    """The Flink rows: checkpoint interval (ms) per key. 5 s is the classic setting (as the Spark trigger);
    BENCH_FLINK_FAST_MS the short one that gives Flink its best latency (docs/performance.md)."""
    configs = {"flink": 5000, "flink_fast": spec.flink_fast_ms}
    return {key: ms for key, ms in configs.items() if spec.runs(key)}


def flink_ratios(results: dict) -> dict:
    """onceflow / Flink: throughput, and p99 latency (below 1: onceflow's results are visible sooner)."""
    tp, lat, out = results["throughput"], results["latency"], {}
    for key in ("flink", "flink_fast"):
        if tp.get(key, {}).get("records_per_s"):
            out[f"eos_vs_{key}_throughput"] = round(tp["eos"]["records_per_s"] / tp[key]["records_per_s"], 3)
        if lat.get(key, {}).get("p99_ms") and lat["eos"].get("p99_ms"):
            out[f"eos_vs_{key}_p99"] = round(lat["eos"]["p99_ms"] / lat[key]["p99_ms"], 3)
            if model := bench_flink.over_phases(lat["eos"]["p99_ms"], lat[key]):
                out[f"{key}_over_phases"] = model
    return out


def latencies(base: config.Settings, rows: set[str], spec: BenchSpec) -> dict:
    """Phase 2 for each streaming row of `rows`, each on a fresh app and source of its own."""
    out: dict = {}
    onceflow = {
        "eos": (ExactlyOnce, {}),
        "alo": (AtLeastOnce, {}),
        # the stateless app: each result due at its record's event time
        "eos_ip_networks": (ExactlyOnce, {"app": "ip_networks", **config.app_defaults({"app": "ip_networks"})}),
        "eos_postgres": (ExactlyOnce, {}),
    }
    for key, (cls, given) in onceflow.items():
        if key not in rows:
            continue
        s = _settings(base, f"bench_live_{key}", f"bench_live_{key}.source", spec, **given)
        s = postgres.provision_sink(s) if key == "eos_postgres" else s
        topics.ensure(s)
        log.info("latency: %s", NAMES[key])
        out[key] = latency(cls(s), s, spec)
        log.info("  %s", out[key])
    if "eos_loaded" in rows:
        log.info("latency: %s", NAMES["eos_loaded"])
        out["eos_loaded"] = loaded_latency(base, spec)
        log.info("  %s", out["eos_loaded"])
    for key, ms in flink_configs(spec).items():
        s = _settings(base, f"bench_live_{key}", f"bench_live_{key}.source", spec)
        topics.ensure(s)
        flink = Flink(s, ms)
        log.info("latency: %s", flink.name)
        out[key] = _reported(flink, lambda f=flink, s=s: latency(f, s, spec))
    return out


def run_contenders(base: config.Settings, end: dict[int, int], spec: BenchSpec, results: dict) -> None:
    names = [key for key in ("eos", "alo", "ceiling") if spec.runs(key)]
    apps = {name: _settings(base, f"bench_{name}", "bench.source", spec) for name in names}
    apps |= {key: _settings(base, f"bench_{key}", "bench.source", spec) for key in flink_configs(spec)}
    # the second app (onceflow_apps.ip_networks: no window, no state, a table join) on the same backlog, with its own
    # declared settings: what the platform costs a stateless stream
    net = {"app": "ip_networks"}
    if spec.runs("eos_ip_networks"):
        apps["eos_ip_networks"] = _settings(
            base, "bench_ip_networks", "bench.source", spec, **net, **config.app_defaults(net)
        )
    # ip_count with its results in PostgreSQL (docs/database-sink.md): the server under the bench's var dir
    if spec.runs("eos_postgres"):
        apps["eos_postgres"] = postgres.provision_sink(_settings(base, "bench_postgres", "bench.source", spec))
    try:
        for s in apps.values():
            topics.ensure(s)
        results["settings"] = {k: getattr(apps["eos"], k) for k in TUNABLES}
        results["settings"]["flink_checkpoint_ms"] = flink_configs(spec)
        n = sum(end.values())
        log.info("recounting the backlog with the reference parser (the correctness check's expectation)")
        exp = expected_counts(base, "bench.source", end)
        log.info(
            "  %d records, %d malformed, %d keys (%d must be written), %d records an engine may drop as late",
            exp.records,
            exp.malformed,
            len(exp.keys),
            len(exp.must_keys()),
            exp.uncertain_records,
        )
        results["throughput"], results["correctness"] = {}, {}
        for key, cls in (("eos", ExactlyOnce), ("alo", AtLeastOnce)):
            if key not in apps:
                continue
            contender = cls(apps[key])
            log.info("throughput: %s", contender.name)
            results["throughput"][key] = throughput(contender, end, n)
            log.info("  %s", results["throughput"][key])
            results["correctness"][key] = _checked(apps[key], exp)
        if "eos_ip_networks" in apps:
            log.info("throughput: onceflow exactly-once, ip_networks")
            results["throughput"]["eos_ip_networks"] = throughput(ExactlyOnce(apps["eos_ip_networks"]), end, n)
            log.info("  %s", results["throughput"]["eos_ip_networks"])
            results["correctness"]["eos_ip_networks"] = check_any_app(apps["eos_ip_networks"], exp)
            log.info("  correctness: %s", results["correctness"]["eos_ip_networks"])
        if "eos_postgres" in apps:
            log.info("throughput: onceflow exactly-once into PostgreSQL")
            results["throughput"]["eos_postgres"] = throughput(ExactlyOnce(apps["eos_postgres"]), end, n)
            log.info("  %s", results["throughput"]["eos_postgres"])
            results["correctness"]["eos_postgres"] = _checked(apps["eos_postgres"], exp)
        if "ceiling" in apps:
            log.info("throughput: ceiling")
            results["throughput"]["ceiling"] = ceiling(apps["ceiling"], end, n)
            log.info("  %s", results["throughput"]["ceiling"])
            results["correctness"]["ceiling"] = _checked(apps["ceiling"], exp)
        for key, ms in flink_configs(spec).items():
            flink = Flink(apps[key], ms, exp)
            log.info("throughput: %s", flink.name)
            results["throughput"][key] = _reported(
                flink, lambda f=flink: throughput(f, end, n) | {"checkpoints": f.checkpoints()}
            )
            if "error" in results["throughput"][key]:
                continue
            results["correctness"][key] = _checked(apps[key], exp)
        loaded = {"eos_loaded"} if spec.runs("eos_loaded") else set()  # a latency row only
        results["latency"] = latencies(base, set(apps) | loaded, spec)
        results["recovery"] = {}
        for key, standby in (("restart", False), ("standby", True)):
            runs = []
            for i in range(spec.recovery_runs):  # where the kill lands in a batch's cycle varies: several, each fresh
                s = _settings(
                    base, f"bench_recovery_{key}_{i}", f"bench_recovery_{key}_{i}.source", spec, standby=standby
                )
                topics.ensure(s)
                log.info("recovery after kill -9 (%s, %d of %d)", key, i + 1, spec.recovery_runs)
                runs.append(recovery(s, spec))
                log.info("  %s", runs[-1])
            if runs:  # BENCH_RECOVERY_RUNS=0: no recovery rows
                results["recovery"][key] = recovery_summary(runs)
    finally:
        for s in apps.values():
            jobctl.stop(s, timeout=30)
        if "eos_postgres" in apps:
            postgres.remove(base)


NAMES = {
    "eos": "onceflow exactly-once",
    "eos_ip_networks": "onceflow exactly-once, ip_networks (stateless)",
    "eos_postgres": "onceflow exactly-once into PostgreSQL",
    "alo": "Spark Kafka sink (at-least-once)",
    "ceiling": "confluent-kafka txn loop (no Spark)",
    "eos_loaded": "onceflow exactly-once beside a second job",
}


def table(r: dict) -> str:
    tp, lat = r["throughput"], r["latency"]
    ok = r.get("correctness", {})
    header = "records/s,p50 ms,p95 ms,p99 ms,windows,catch-up s,warm-up p99 ms,peak RSS MB,CPU s,output"
    rows = [("", *header.split(","))]
    names = dict(NAMES)
    flink_ms = r.get("settings", {}).get("flink_checkpoint_ms", {})
    names |= {k: f"Flink KafkaSink exactly-once (ckpt {ms} ms)" for k, ms in flink_ms.items()}
    for k in names:
        if k not in tp:
            continue
        l_ = lat.get(k, {})
        if "error" in tp[k]:
            rows.append((names[k], "FAILED", "-", "-", "-", "-", "-", "-", "-", "-", tp[k]["error"][:60]))
            continue
        rows.append(
            (
                names[k],
                f"{tp[k]['records_per_s']:,}",
                str(l_.get("p50_ms", "-")),
                str(l_.get("p95_ms", "-")),
                str(l_.get("p99_ms", "-")),
                str(l_.get("windows", "-")),
                str(l_.get("catch_up_s", "-")) + ("" if l_.get("caught_up", True) else " (never)"),
                str((l_.get("warmup") or {}).get("p99_ms", "-")),
                str(tp[k]["peak_rss_mb"]),
                str(tp[k]["cpu_s"]),
                ok.get(k, {}).get("verdict", "not checked"),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    ra, rec = r["ratios"], r["recovery"]
    lines += [
        "",
        f"topology: {TOPOLOGY_NAMES[r['spec'].get('topology', 'one-node')]}",
        f"exactly-once / at-least-once throughput: {ra.get('eos_vs_alo_throughput') or '-'}",
        f"exactly-once / ceiling throughput:       {ra.get('eos_vs_ceiling_throughput') or '-'}",
        f"ip_networks / ip_count throughput (onceflow): {ra.get('ip_networks_vs_ip_count_throughput') or '-'}",
        f"PostgreSQL sink / Kafka sink throughput (onceflow): {ra.get('postgres_vs_kafka_sink_throughput') or '-'}",
        f"exactly-once p99 latency in trigger intervals ({r['spec']['trigger_s']} s): "
        f"{ra['eos_p99_in_trigger_intervals']}",
        *(
            f"exactly-once beside a second job ({x['load']['app']} at {x['load']['rate']:,} records/s, "
            f"paced {x['load'].get('margin_ms', '-')} ms after the trigger, {x['load']['cores']} of a core, "
            f"{'kept up' if x['load']['kept_up'] else 'did NOT keep up'}): p50 "
            f"{x.get('p50_ms', '-')} ms, p99 {x.get('p99_ms', '-')} ms, "
            f"{ra.get('eos_loaded_p99_in_trigger_intervals') or '-'} trigger intervals"
            for x in ([lat["eos_loaded"]] if "eos_loaded" in lat else [])
        ),
        *(
            f"exactly-once / {names[k]}: throughput {ra.get(f'eos_vs_{k}_throughput', '-')}, "
            f"p99 latency {ra.get(f'eos_vs_{k}_p99', '-')}"
            + (
                f" (its checkpoints triggered {lat[k]['trigger_phase_ms']} ms into each window's interval, "
                f"each taking {lat[k]['checkpoint_ms']} ms)"
                if lat.get(k, {}).get("trigger_phase_ms") is not None
                else ""
            )
            for k in flink_ms
        ),
        *(
            f"  over the phases its checkpoints may take (modelled on this run: its p99 = phase + "
            f"{m['p99_beyond_phase_ms']} ms): its p99 {m['p99_over_phases_ms']} ms on average, onceflow's "
            f"{m['eos_p99_over_it']} of that, and below Flink's at {m['eos_below_share']:.0%} of the phases"
            for k in flink_ms
            if (m := ra.get(f"{k}_over_phases"))
        ),
        *(
            f"late records counted by {names[k]}: {c['late_counted']} of {c['late_records']} (any share is correct: "
            f"it depends on how its watermark moved)"
            for k, c in ok.items()
            if "late_counted" in c
        ),
        *(
            f"recovery after kill -9 ({how}, median and worst of {len(x['runs'])}): next commit in "
            f"{x['to_next_commit_s']} s (worst {x['to_next_commit_s_max']} s), lag back to its pre-crash level (at most "
            f"{x['pre_crash_lag']} records) in {x['to_lag_recovered_s']} s (worst {x['to_lag_recovered_s_max']} s)"
            + (f"; restart delay {x['restart_delay_s']} s" if how == "restart" else "; warm standby")
            for how, x in rec.items()
        ),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    interrupt.run(main)
