"""`make bench-quiet`: what a job costs when its stream is quiet. Each contender runs on its own topics of one private
broker, fed live at BENCH_QUIET_RATE records/s (200) with event time = now; after BENCH_QUIET_WARMUP_S (600 s: the
driver JVM's JIT compiles Spark's code paths for about ten minutes at this rate, so a shorter wait measures its
warm-up, not a long-running job) the CPU seconds of its process group (the driver JVM and its Python process, and the
processes they fork and reap; Flink's one JVM) are read, and again BENCH_QUIET_S (180 s) later. Reported: CPU seconds
per minute, the share of one core, the CPU of each minute of the warm-up, and the latency of the results of windows
ending in the measured period (as `make bench`'s live phase). Contenders one after another in one run: onceflow
exactly-once, Spark's Kafka sink (at-least-once) and Flink's exactly-once KafkaSink with 5 s checkpoints
(BENCH_FLINK=0 leaves it out). docs/performance.md has the figures."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable

from onceflow import config
from onceflow.kafka import topics
from onceflow.rules import clock
from onceflow_dev import broker, interrupt, machine, stack
from onceflow_dev.bench import (
    AtLeastOnce,
    BenchSpec,
    Contender,
    ExactlyOnce,
    Flink,
    _settings,
    live_feed,
    private_settings,
    setup_logging,
    usage,
    window_latencies,
)
from onceflow_dev.stamper import Stamper

log = logging.getLogger("onceflow_dev.bench_quiet")
RATE = int(os.environ.get("BENCH_QUIET_RATE", 200))
WARMUP_S = int(os.environ.get("BENCH_QUIET_WARMUP_S", 600))
MEASURE_S = int(os.environ.get("BENCH_QUIET_S", 180))
# which contenders, one after another (default: eos, alo and, unless BENCH_FLINK=0, flink_5000; also known:
# eos_margin_0, eos_jit_default, eos_gc_jvm and eos_shuffle_2)
CONTENDERS = [k for k in os.environ.get("BENCH_QUIET_CONTENDERS", "").split(",") if k]


def quiet(c: Contender, s: config.Settings, ips: int = 300) -> dict:
    """One contender at RATE records/s: CPU over MEASURE_S after WARMUP_S, and its results' latency meanwhile."""
    stamper = Stamper(s)
    stamper.start()
    minutes: list[float] = []  # CPU seconds in each minute since the start: how long the JVM's warm-up lasts
    try:
        c.start()
        t_live = clock.now_ms()
        feeder = live_feed(
            s, RATE, ips, WARMUP_S + MEASURE_S, seed=11, out_of_order_fraction=0.02, malformed_fraction=0.01
        )
        feeder.start()
        t_start, last = time.monotonic(), usage(c.pid())["cpu_s"]
        for m in range(1, WARMUP_S // 60 + 1):
            time.sleep(max(0.0, t_start + 60 * m - time.monotonic()))
            now_cpu = usage(c.pid())["cpu_s"]
            minutes.append(round(now_cpu - last, 1))
            last = now_cpu
            log.info("  warm-up minute %d of %d: %s CPU s", m, WARMUP_S // 60, minutes[-1])
        time.sleep(max(0.0, t_start + WARMUP_S - time.monotonic()))
        before, t0 = usage(c.pid()), time.monotonic()
        t_first = clock.now_ms()
        feeder.join(MEASURE_S + 60)
        after, t1 = usage(c.pid()), time.monotonic()
        t_end = clock.now_ms()
        time.sleep(3 * s.trigger_interval_s + s.watermark_s + s.window_s)  # the last measured windows close
    except BaseException:
        try:
            c.stop()
        finally:
            stamper.discard()  # the contender's error is the one to see
        raise
    c.stop()
    seen = stamper.stop(30)
    cpu_s = round(after["cpu_s"] - before["cpu_s"], 1)
    seconds = round(t1 - t0, 1)
    log.info("  %s: %s CPU s in %s s since %d ms after its start", c.name, cpu_s, seconds, t_first - t_live)
    log.info("  %s: CPU s in each minute of the warm-up: %s", c.name, minutes)
    return {
        "cpu_s": cpu_s,
        "seconds": seconds,
        "cpu_s_per_min": round(cpu_s / seconds * 60, 1),
        "cores": round(cpu_s / seconds, 3),
        "peak_rss_mb": after["peak_rss_mb"],
        "warmup_cpu_s_by_minute": minutes,
    } | window_latencies(seen, s, t_first, t_end)


def main() -> int:
    setup_logging()
    spec = BenchSpec()
    var = config.REPO_ROOT / "var" / "bench-quiet"
    base = private_settings(var)
    results: dict = {
        "method": {"rate": RATE, "warmup_s": WARMUP_S, "measure_s": MEASURE_S, "trigger_s": spec.trigger_s},
        "machine": machine.describe(),
        "quiet": {},
    }
    stack.prepare_jvm(base)  # as `make run` does: no contender's CPU pays for a first start on this machine
    broker.start(base)
    try:
        known: dict[str, tuple[Callable[[config.Settings], Contender], dict]] = {
            "eos": (ExactlyOnce, {}),
            # onceflow without the pacing margin (onceflow.rules.pacing): what the margin changes, in the same run
            "eos_margin_0": (ExactlyOnce, {"trigger_margin_ms": 0}),
            # onceflow with HotSpot's own JIT thresholds (Settings.jit_options empty): what the platform's change, in one run
            "eos_jit_default": (ExactlyOnce, {"jit_options": ""}),
            # onceflow whose driver's full collections the JVM alone decides (Settings.gc_while_idle_at 0)
            "eos_gc_jvm": (ExactlyOnce, {"gc_while_idle_at": 0.0}),
            # onceflow with 2 shuffle partitions (Settings.shuffle_partitions): 4 fewer tasks a batch, 2 fewer waves
            "eos_shuffle_2": (ExactlyOnce, {"shuffle_partitions": 2}),
            "alo": (AtLeastOnce, {}),
            "flink_5000": (lambda s: Flink(s, 5000), {}),
        }
        keys = CONTENDERS or ["eos", "alo", *(["flink_5000"] if spec.flink else [])]
        unknown = sorted(set(keys) - set(known))
        if unknown:
            raise SystemExit(f"BENCH_QUIET_CONTENDERS: unknown {unknown}; known: {sorted(known)}")
        for key in keys:
            make, overrides = known[key]
            s = _settings(base, f"quiet_{key}", f"quiet_{key}.source", spec, **overrides)
            topics.ensure(s)
            c = make(s)
            log.info("quiet: %s", c.name)
            results["quiet"][key] = quiet(c, s)
            log.info("  %s", results["quiet"][key])
    finally:
        broker.stop(base)
    out = var / f"results-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(results, indent=1))
    print("| | CPU s per minute | cores | p50 ms | p99 ms | results |")
    print("|---|---|---|---|---|---|")
    for key, r in results["quiet"].items():
        print(
            f"| {key} | {r['cpu_s_per_min']} | {r['cores']} | {r.get('p50_ms', '-')} | {r.get('p99_ms', '-')} "
            f"| {r['results']} |"
        )
    print(f"\nfigures: {out}")
    return 0


if __name__ == "__main__":
    interrupt.run(main)
