"""`make bench-sweep`: the tuning runs behind the job's defaults (docs/performance.md).

On one private broker and one backlog (as in `make bench`), the exactly-once job runs once per variant of its
settings, each differing from the embedded defaults in one setting: throughput over the backlog (from offset 0,
into its own sink), then result latency over live input. Prints one table; raw figures go to
var/bench/sweep-<time>.json. BENCH_SWEEP picks variants by number (e.g. "0,2,4"); the BENCH_* workload
variables of `make bench` apply, except that the latency phase's steady state is 120 s unless BENCH_LIVE_S is set.
"""

from __future__ import annotations

import json
import os
import time

from onceflow import config
from onceflow.kafka import topics
from onceflow.runtime import jobctl
from onceflow_dev import bench, interrupt

# A variant's latency is a rough figure, over 120 s of steady state (about 23 windows) unless BENCH_LIVE_S says
# otherwise: at make bench's 1,200 s the ten variants would take over three hours.
SWEEP_LIVE_S = 120
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
VARIANTS: list[tuple[str, dict]] = [
    ("embedded default", {}),
    ("close-out batches off", {"close_out_batches": False}),
    ("trigger 2 s", {"trigger_interval_s": 2.0}),
    ("trigger 10 s", {"trigger_interval_s": 10.0}),
    ("RocksDB state store", {"state_store_provider": ROCKSDB}),
    ("shuffle partitions 2", {"shuffle_partitions": 2}),
    ("shuffle partitions 8", {"shuffle_partitions": 8}),
    ("maxOffsetsPerTrigger 500,000", {"max_offsets_per_trigger": 500_000}),
    ("producer linger 50 ms", {"producer_linger_ms": 50}),
    ("class-data archive off", {"class_data_sharing": False}),
    ("G1 garbage collector", {"jvm_gc": "g1"}),
]


def chosen() -> list[tuple[int, str, dict]]:
    """The variants to run, in order; one may come twice (a control for drift during the sweep)."""
    pick = os.environ.get("BENCH_SWEEP", "")
    idx = [int(x) for x in pick.split(",") if x.strip()] if pick else range(len(VARIANTS))
    return [(i, *VARIANTS[i]) for i in idx]


def run_variant(base: config.Settings, end: dict[int, int], spec: bench.BenchSpec, run: int, overrides: dict) -> dict:
    s = bench._settings(base, f"sweep{run}", "bench.source", spec, **overrides)
    live = bench._settings(base, f"sweep{run}_live", f"sweep{run}_live.source", spec, **overrides)
    try:
        topics.ensure(s)
        topics.ensure(live)
        tp = bench.throughput(bench.ExactlyOnce(s), end, sum(end.values()))
        lat = bench.latency(bench.ExactlyOnce(live), live, spec)
    finally:
        jobctl.stop(s, timeout=30)
        jobctl.stop(live, timeout=30)
    return {
        "settings": {k: getattr(s, k) for k in bench.TUNABLES},
        "throughput": tp,
        "latency": lat,
        "p99_in_triggers": round(lat.get("p99_ms", 0) / 1000 / s.trigger_interval_s, 2),
    }


def table(rows: list[tuple[str, dict]]) -> str:
    head = ("variant", "records/s", "batches", "CPU s", "p50 ms", "p99 ms", "p99 / trigger")
    lines = [head]
    for name, r in rows:
        tp, lat = r["throughput"], r["latency"]
        lines.append(
            (
                name,
                f"{tp['records_per_s']:,}",
                str(tp["batches"]),
                str(tp["cpu_s"]),
                str(lat.get("p50_ms", "-")),
                str(lat.get("p99_ms", "-")),
                str(r["p99_in_triggers"]),
            )
        )
    widths = [max(len(row[c]) for row in lines) for c in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in lines)


def main() -> int:
    bench.setup_logging()
    # the variants are compared with one another, each from a cold start as before: no warm-up apart
    spec = bench.BenchSpec(
        live_s=bench._env_int("BENCH_LIVE_S", SWEEP_LIVE_S), warmup_s=bench._env_int("BENCH_WARMUP_S", 0)
    )
    var = config.REPO_ROOT / "var" / "bench"
    rows: list[tuple[str, dict]] = []
    with bench.bench_stack(spec, var) as (base, end):
        for run, (i, name, overrides) in enumerate(chosen()):
            bench.log.info("run %d, variant %d: %s %s", run, i, name, overrides)
            rows.append((name, run_variant(base, end, spec, run, overrides)))
            bench.log.info("  %s", rows[-1][1])
    out = var / f"sweep-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps({"spec": spec.as_json(), "runs": [{"variant": n} | r for n, r in rows]}, indent=1))
    print(table(rows))
    print(f"\nfigures: {out}")
    return 0


if __name__ == "__main__":
    interrupt.run(main)
