"""The Flink contender of `make bench`: the same query on Apache Flink 2.x with its KafkaSink in EXACTLY_ONCE mode.

The job is `jvm/flink-ip-count/` (Java, built by its checked-in pom from official artifacts on Maven Central into
`var/jvm/flink-ip-count/`, on first use; never part of the project's requirements): Kafka source (earliest, every
partition, read_committed) -> onceflow's parse rules (the regular expressions and limits of
`onceflow_apps.access_log.rules`, passed on the command line) -> bounded-out-of-orderness watermarks (settings.watermark_s)
per Kafka partition -> tumbling event-time windows (settings.window_s) per IP -> count -> KafkaSink
(DeliveryGuarantee.EXACTLY_ONCE, transactional id prefix `flink.<app>`), the Spark job's key and value byte for byte;
malformed records to the app's DLQ topic (key `topic|partition|offset`, the value capped at dlq_max_value_bytes,
no provenance headers; like the at-least-once contender's DLQ), also exactly once. It runs as a local mini-cluster in
one JVM (`java -cp ... dev.onceflow.flink.IpCount`), in its own process group, with the parallelism of the Spark
job's local master and the Spark driver's heap.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import shutil
import statistics
import subprocess
import threading
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from onceflow import config, resources
from onceflow.kafka import clients as kafka_clients
from onceflow.kafka import reading as kafka_reading
from onceflow.rules import clock
from onceflow.runtime import jvm, procs
from onceflow.wire import OnceflowError
from onceflow_apps import access_log
from onceflow_apps.access_log import rules as records
from onceflow_dev.bench_check import Expected
from onceflow_dev.stamper import arrived

log = logging.getLogger(__name__)
NAME = "flink-ip-count"
SOURCE_DIR = config.REPO_ROOT / "jvm" / NAME
# onceflow's own access-log rules in Java, which the job compiles beside its own sources (its pom's add-source)
RULES_DIR = Path(access_log.__file__).parent / "java" / "rules"
MAIN_CLASS = "dev.onceflow.flink.IpCount"
# What Flink's own launcher (config.sh, env.java.opts.all) opens on Java 17 for its reflection.
JAVA_OPENS = [
    "--add-exports=java.base/sun.net.util=ALL-UNNAMED",
    "--add-exports=java.rmi/sun.rmi.registry=ALL-UNNAMED",
    "--add-exports=java.security.jgss/sun.security.krb5=ALL-UNNAMED",
    *(
        f"--add-opens=java.base/{p}=ALL-UNNAMED"
        for p in (
            "java.lang",
            "java.net",
            "java.io",
            "java.nio",
            "sun.nio.ch",
            "java.lang.reflect",
            "java.text",
            "java.time",
            "java.util",
            "java.util.concurrent",
            "java.util.concurrent.atomic",
            "java.util.concurrent.locks",
        )
    ),
]
_COMPLETED = re.compile(r"Completed checkpoint (\d+) for job")
_TRIGGERED = re.compile(r"Triggering checkpoint (\d+) \(.*\) @ (\d+) for job")
_DURATION = re.compile(r"Completed checkpoint (\d+) for job .*checkpointDuration=(\d+) ms, finalizationTime=(\d+) ms")


def checkpoint_phase(log_text: str, start_ms: int, end_ms: int, window_ms: int) -> dict:
    """Where Flink's checkpoints fell against the windows, over the checkpoints triggered in [start_ms, end_ms]
    (its CheckpointCoordinator's log lines): a window's results are committed when the first checkpoint after the
    window fires completes, so a row's latency follows the moment in each window's interval its checkpoints are
    triggered (`trigger_phase_ms`: the trigger's epoch ms modulo the window, the median) plus how long one takes
    (`checkpoint_ms`: its duration and finalization, the median). Flink picks that moment itself (a random initial
    delay), once per job: onceflow's batches are paced on fixed moments instead (onceflow.rules.pacing)."""
    took = {int(n): int(d) + int(f) for n, d, f in _DURATION.findall(log_text)}
    phases, durations = [], []
    for n, at in _TRIGGERED.findall(log_text):
        if start_ms <= int(at) <= end_ms:
            phases.append(int(at) % window_ms)
            if int(n) in took:
                durations.append(took[int(n)])
    if not phases:
        return {}
    return {
        "checkpoints_measured": len(phases),
        "trigger_phase_ms": statistics.median_high(phases),
        "checkpoint_ms": statistics.median_high(durations) if durations else None,
    }


def over_phases(eos_p99_ms: int, flink: dict) -> dict:
    """onceflow's p99 against Flink's wherever Flink's checkpoints may fall, not only where they fell in this run.

    `flink`: a Flink row's latency figures (its p99, `trigger_phase_ms` and the `checkpoint_interval_ms` and
    `window_ms` its commit_phase reports). With checkpoints every window, each window's results wait from its due
    moment to the next checkpoint's completion: Flink's p99 is its phase plus a lag that does not depend on the phase
    (a result's way to the sink, the checkpoint itself, the commit), `beyond`. The phase is Flink's own draw, once per
    job: its CheckpointCoordinator triggers the first checkpoint after a random delay within one interval, then at a
    fixed rate, so over job starts the phase is uniform over the interval. Taking every phase's result as ready in
    time (the best case for Flink: a phase just after a window's due moment can miss its results and wait a whole
    interval more), Flink's p99 is uniform over [beyond, beyond + interval): reported are its mean, onceflow's p99
    over that mean, and the share of phases at which onceflow's p99 is the lower. A model on one run's figures, said
    so wherever it is shown; {} for another interval than the window's or a row without the figures."""
    interval, phase, p99 = (flink.get(k) for k in ("checkpoint_interval_ms", "trigger_phase_ms", "p99_ms"))
    if interval is None or phase is None or not p99 or interval != flink.get("window_ms"):
        return {}
    beyond = (p99 - phase) % interval
    mean = beyond + interval / 2
    return {
        "p99_beyond_phase_ms": beyond,
        "p99_over_phases_ms": round(mean),
        "eos_p99_over_it": round(eos_p99_ms / mean, 3),
        "eos_below_share": round(min(1.0, max(0.0, (interval + beyond - eos_p99_ms) / interval)), 2),
    }


class FlinkBuildError(OnceflowError):
    pass


def _digest() -> str:
    h = hashlib.sha256()
    for root in (SOURCE_DIR, RULES_DIR):
        for f in sorted(p for p in root.rglob("*") if p.is_file()):
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
    h.update(resources.MAVEN_SETTINGS.read_bytes())
    return h.hexdigest()


def install(settings: config.Settings) -> Path:
    """Build the job and copy its runtime closure into `<jvm_dir>/flink-ip-count/` (build/ and lib/), once per
    version of its sources: Maven with strict checksums (-C), from Maven Central only (onceflow/resources/maven/settings.xml)."""
    out = settings.jvm_dir / NAME
    digest = _digest()
    if _built(out, digest):
        return out
    settings.jvm_dir.mkdir(parents=True, exist_ok=True)
    # two processes at once (the bench's test and the rules' test on two workers) take turns: the second finds it
    with open(settings.jvm_dir / f".{NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if _built(out, digest):
            return out
        return _build(out, digest)


def _built(out: Path, digest: str) -> bool:
    stamp = out / ".sources.sha256"
    return stamp.exists() and stamp.read_text() == digest and (out / "build" / f"{NAME}.jar").exists()


def _build(out: Path, digest: str) -> Path:
    stamp = out / ".sources.sha256"
    if shutil.which("mvn") is None:
        raise FlinkBuildError("Maven (mvn) is needed to build the Flink contender: apt-get install maven")
    tmp = out.with_name(NAME + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    log.info("building the Flink contender with Maven (first use)")
    proc = jvm.maven(SOURCE_DIR / "pom.xml", "package", "dependency:copy-dependencies", f"-Dout.dir={tmp}")
    if proc.returncode != 0:
        raise FlinkBuildError(f"Maven could not build jvm/{NAME}:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    stamp.write_text(digest)
    return out


def parallelism(master: str, cores_max: int = 0) -> int:
    """The Spark job's task slots, which Flink's local run matches: local[N] -> N, local[*] -> every core, local ->
    1; on a standalone master (`make bench` on the cluster) the job's `cores_max`, where Flink still runs in one
    JVM of its own (the brokers are the cluster's)."""
    if master.startswith(config.STANDALONE_SCHEME):
        if cores_max <= 0:
            raise ValueError(f"the Flink contender matches the job's cores: set cores_max for the master {master!r}")
        return cores_max
    m = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\d+)?\])?", master.strip())
    if m is None:
        raise ValueError(f"the Flink contender matches the job's cores: {master!r} is not a master it knows")
    n = m.group(1)
    return 1 if n is None else (os.cpu_count() or 1) if n == "*" else int(n)


def status_dir(s: config.Settings) -> Path:
    return s.run_dir / f"{s.app_id}.flink"


def argv(s: config.Settings, home: Path, checkpoint_ms: int) -> list[str]:
    java = shutil.which("java") or "java"
    cp = f"{home / 'build' / '*'}{os.pathsep}{home / 'lib' / '*'}"
    args = {
        "bootstrap": s.bootstrap_servers,
        "source": s.source_topic,
        "sink": s.sink_topic,
        "dlq": s.dlq_topic,
        "group": f"flink.{s.app_id}",
        "txn-prefix": f"flink.{s.app_id}",
        "parallelism": parallelism(s.master, s.cores_max),
        "checkpoint-ms": checkpoint_ms,
        "checkpoint-dir": s.checkpoint,
        "window-s": s.window_s,
        "watermark-s": s.watermark_s,
        "status-dir": status_dir(s),
        "txn-timeout-ms": s.transaction_timeout_ms,
        "linger-ms": s.producer_linger_ms,
        "combined-re": records.COMBINED_RE,
        "epoch-re": records.EPOCH_MS_RE,
        "iso-re": records.ISO_TS_RE,
        "ipv4-re": records.IPV4,
        "min-ts-ms": records.MIN_TS_MS,
        "max-ts-ms": records.MAX_TS_MS,
        "max-record-bytes": records.MAX_RECORD_BYTES,
        "max-ahead-ms": s.max_event_ahead_ms,
        "dlq-max-bytes": s.dlq_max_value_bytes,
    }
    return [java, f"-Xmx{s.driver_memory}", *JAVA_OPENS, "-cp", cp, MAIN_CLASS] + [
        x for k, v in args.items() for x in (f"--{k}", str(v))
    ]


class SinkWatcher(threading.Thread):
    """Reads the sink with read_committed from its start and notes when each key first became visible."""

    def __init__(self, s: config.Settings, wanted: set[str]):
        super().__init__(daemon=True)
        self.s, self.wanted, self.stop_ev = s, set(wanted), threading.Event()
        self.missing = len(self.wanted)
        self.complete_ms: int | None = None
        self.last_ms: int | None = None

    def run(self) -> None:
        c = kafka_clients.read_committed_consumer(
            self.s, group_id=f"bench.watch.{self.s.app_id}", **{"fetch.wait.max.ms": 50}
        )
        md = c.list_topics(self.s.sink_topic, timeout=10).topics[self.s.sink_topic]
        c.assign([TopicPartition(self.s.sink_topic, p, OFFSET_BEGINNING) for p in md.partitions])
        try:
            while not self.stop_ev.is_set():
                for m in arrived(c, 0.2):  # stamped when seen, not when a batch of 5,000 filled
                    if m.error() is not None:
                        continue
                    now = clock.now_ms()
                    self.last_ms = now
                    key = (m.key() or b"").decode(errors="replace")
                    if key in self.wanted:
                        self.wanted.discard(key)
                        self.missing = len(self.wanted)
                        if not self.wanted:
                            self.complete_ms = now
        finally:
            c.close()


class FlinkJob:
    """start/pid/drained/stop like bench.Contender. `expect` (the throughput phase): `drained` waits until every
    result the backlog must produce is committed; without it (the latency phase) only start and stop matter."""

    name = "Flink KafkaSink (exactly-once)"

    def __init__(self, s: config.Settings, checkpoint_ms: int, expect: Expected | None = None):
        self.s, self.checkpoint_ms, self.expect = s, checkpoint_ms, expect
        self.proc: subprocess.Popen | None = None
        self.watcher: SinkWatcher | None = None
        self.quiet_since: float | None = None

    @property
    def log_file(self) -> Path:
        return self.s.log_dir / f"{self.s.app_id}.log"

    def start(self) -> None:
        home = install(self.s)
        shutil.rmtree(status_dir(self.s), ignore_errors=True)
        status_dir(self.s).mkdir(parents=True)
        if self.expect is not None:
            self.watcher = SinkWatcher(self.s, self.expect.must_keys())
            self.watcher.start()
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self.log_file.unlink(missing_ok=True)
        self.proc = procs.spawn_detached(argv(self.s, home, self.checkpoint_ms), self.log_file, env=dict(os.environ))
        # running = its first checkpoint completed: every task is deployed and the sink's transactions work
        procs.wait_until(lambda: self._alive() and self.checkpoints() > 0, 300, what="the Flink job's first checkpoint")

    def _alive(self) -> bool:
        assert self.proc is not None  # started
        if self.proc.poll() is not None:
            raise RuntimeError(f"the Flink job exited ({self.proc.returncode}):\n{self._log_tail()}")
        return True

    def _log_tail(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def checkpoints(self) -> int:
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return 0
        return max((int(n) for n in _COMPLETED.findall(text)), default=0)

    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def commit_phase(self, start_ms: int, end_ms: int) -> dict:
        """Its checkpoints' moment in the windows' interval over [start_ms, end_ms] (checkpoint_phase)."""
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return {}
        window_ms = self.s.window_s * 1000
        got = checkpoint_phase(text, start_ms, end_ms, window_ms)
        return got | {"checkpoint_interval_ms": self.checkpoint_ms, "window_ms": window_ms} if got else {}

    def first_ms(self) -> int | None:
        got = [int(f.read_text()) for f in status_dir(self.s).glob("first_record_ms.*") if not f.name.endswith("tmp")]
        return min(got) if got else None

    def drained(self, end: dict[int, int]) -> dict | None:
        """All the results the backlog must produce are committed; or, should some never come (a wrong answer,
        which the correctness check then reports), the source's offsets committed on checkpoint reached the end
        and nothing new became visible in the sink for 3 checkpoint intervals (at least 15 s)."""
        self._alive()
        assert self.watcher is not None  # the throughput phase passes `expect`
        first = self.first_ms()
        done_ms = self.watcher.complete_ms
        if done_ms is None and self._source_done(end):
            quiet_ms = max(15_000, 3 * self.checkpoint_ms)
            last = self.watcher.last_ms or 0
            if clock.now_ms() - last > quiet_ms:
                log.warning("Flink: %d expected results never became visible", self.watcher.missing)
                done_ms = last
        if done_ms is None or first is None:
            return None
        return {"first_ms": first, "last_ms": done_ms, "batches": self.checkpoints()}

    def _source_done(self, end: dict[int, int]) -> bool:
        got = self.position(list(end)) or {}
        return bool(got) and all(got.get(p, -1) >= o for p, o in end.items())

    def position(self, partitions: list[int]) -> dict[int, int] | None:
        """The source offsets Flink's Kafka source committed to its group on its last checkpoint (those of the
        checkpoint whose transactions are committed); None while it has none."""
        c = kafka_clients.read_committed_consumer(self.s, group_id=f"flink.{self.s.app_id}")
        try:
            got = kafka_reading.committed(c, [TopicPartition(self.s.source_topic, p) for p in partitions], 10)
        except Exception:  # the group has no offsets yet, or the coordinator is busy: unknown
            return None
        finally:
            c.close()
        return {tp.partition: tp.offset for tp in got if tp.offset >= 0} or None

    def stop(self) -> dict:
        if self.proc is not None:
            procs.stop_process(self.proc.pid, 60)
        if self.watcher is not None:
            self.watcher.stop_ev.set()
            self.watcher.join(10)
        return {"checkpoints": self.checkpoints()}


def check_rules(settings: config.Settings, values: list[tuple[bytes, int]]) -> list[records.Parsed]:
    """The Flink job's parse rules (dev.onceflow.flink.Rules) on (value, Kafka timestamp ms) pairs, as
    records.Parsed: to compare them with the reference parser."""
    import base64

    home = install(settings)
    cmd = argv(settings, home, 1000)
    cmd[cmd.index(MAIN_CLASS)] = "dev.onceflow.flink.RulesCheck"
    stdin = "".join(f"{ts} {base64.b64encode(v).decode()}\n" for v, ts in values)
    proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=300, check=True)
    out = []
    for line in proc.stdout.splitlines():
        reason, ts, ip = line.split("\t")
        out.append(records.Parsed(reason=reason) if reason != "-" else records.Parsed(ts_us=int(ts), ip=ip))
    return out
