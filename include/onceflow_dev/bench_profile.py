"""`make bench-profile`: where a batch's time goes, as a ladder of runs over the same backlog.

Each rung adds one part of the job to the one before, in one Spark session configured as the job is (master,
shuffle partitions, state store provider), over the backlog `make bench` writes (BENCH_RECORDS records):

1. read: the Kafka source alone (`read_committed`), as a batch;
2. + parse: the job's parse and classification (onceflow_apps.access_log.parsing), as a batch;
3. + aggregate: the windowed count and the DLQ split (onceflow_apps.ip_count_plan), as a batch: no state store;
4. + micro-batches and state store: the streaming query with the job's plan and trigger limits, each batch's
   output computed and dropped (`noop`);
5. + results to the driver: as 4, with the output streamed to the Python driver (onceflow.spark.partition_stream,
   as Arrow batches as the job does; and once as pickled Rows, as it did before) and dropped there;
6. + produce and commit: the job itself (`onceflow/entrypoints/stream.py` under its supervisor), as `make bench` runs it.

records/s of each rung = backlog records / its wall time (rungs 4-6: first batch start to last commit, as the
bench measures); the share of a part = the time it adds over the rung before, over the job's time. Rungs 1-3 run
twice and report the second run (the first pays for the JIT). Prints a table, writes var/bench/profile-<time>.json.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time

from onceflow import config
from onceflow.kafka import topics
from onceflow.runtime import launcher
from onceflow.spark import app_plan, kafka_source, partition_stream
from onceflow_apps import ip_count_plan as plan_of
from onceflow_apps.access_log import parsing
from onceflow_dev import bench, interrupt

log = logging.getLogger("onceflow_dev.bench")


def _timed(fn) -> float:
    t = time.monotonic()
    fn()
    return time.monotonic() - t


def batch_rungs(spark, s: config.Settings, end: dict[int, int]) -> dict[str, float]:
    def raw():
        return kafka_source.read_range(spark, s, s.source_topic, {p: 0 for p in end}, end).select(
            "value", "topic", "partition", "offset", "timestamp"
        )

    rungs = {
        "read": lambda: raw().write.format("noop").mode("overwrite").save(),
        "parse": lambda: (
            parsing.classify(raw(), s.max_event_ahead_ms, ()).write.format("noop").mode("overwrite").save()
        ),
        "aggregate": lambda: plan_of.results_and_dlq(raw(), s).write.format("noop").mode("overwrite").save(),
    }
    out = {}
    for name, fn in rungs.items():
        _timed(fn)  # the JIT's and the connector's first run
        out[name] = _timed(fn)
        log.info("rung %s: %.1f s", name, out[name])
    return out


def streaming_rung(spark, s: config.Settings, end: dict[int, int], to_driver: str = "") -> float:
    """The job's streaming plan over the backlog, each batch's output dropped in Spark or in the driver (moved there
    as pickled Rows, `rows`, or as Arrow batches, `tuples`); first batch start to last batch end, like the bench's
    throughput."""
    marks: list[float] = []
    total = sum(end.values())
    seen = {"records": 0}

    def each(df, batch_id):
        marks.append(time.monotonic())
        if to_driver:
            for _ in getattr(partition_stream, to_driver)(df):
                pass
        else:
            df.write.format("noop").mode("overwrite").save()
        marks.append(time.monotonic())

    with tempfile.TemporaryDirectory() as cp:
        frame = plan_of.results_and_dlq(app_plan.source(spark, s.replace(starting_offsets="earliest")), s)
        q = frame.writeStream.foreachBatch(each).option("checkpointLocation", cp).trigger(processingTime="0 seconds")
        query = q.start()
        try:
            while True:
                p = query.lastProgress
                if p is not None:
                    eo = p["sources"][0]["endOffset"] or {}
                    eo = json.loads(eo) if isinstance(eo, str) else eo
                    done = sum(int(o) for o in eo.get(s.source_topic, {}).values())
                    seen["records"] = done
                    if done >= total and not query.status["isTriggerActive"]:
                        break
                if query.exception() is not None:
                    raise RuntimeError(str(query.exception()))
                time.sleep(0.5)
        finally:
            query.stop()
    return marks[-1] - marks[0] if len(marks) >= 2 else float("nan")


def main() -> int:
    bench.setup_logging()
    spec = bench.BenchSpec()
    var = config.REPO_ROOT / "var" / "bench"
    with bench.bench_stack(spec, var) as (base, end):
        n = sum(end.values())
        s = bench._settings(base, "bench_profile", "bench.source", spec)
        topics.ensure(s)
        spark = launcher.local_session(s, "profile", log_file=var / "log" / "profile-spark.log")
        try:
            secs = batch_rungs(spark, s, end)
            secs["state"] = streaming_rung(spark, s, end)
            log.info("rung state: %.1f s", secs["state"])
            secs["driver_rows"] = streaming_rung(spark, s, end, to_driver="rows")
            log.info("rung driver (pickled Rows): %.1f s", secs["driver_rows"])
            secs["driver"] = streaming_rung(spark, s, end, to_driver="tuples")
            log.info("rung driver (Arrow): %.1f s", secs["driver"])
        finally:
            spark.stop()
        job_s = bench._settings(base, "bench_profile_job", "bench.source", spec)
        topics.ensure(job_s)
        job = bench.throughput(bench.ExactlyOnce(job_s), end, n)
        secs["job"] = job["seconds"]
    rows = [
        ("read", "Kafka read (read_committed)"),
        ("parse", "+ parse and classify"),
        ("aggregate", "+ windowed count, DLQ split (batch)"),
        ("state", "+ micro-batches, state store"),
        ("driver", "+ results to the driver (Arrow)"),
        ("job", "+ produce and commit (the job)"),
    ]
    result = {"records": n, "spec": spec.as_json(), "seconds": secs, "rungs": []}
    prev = 0.0
    lines = [f"{'rung':<40} {'s':>7} {'records/s':>11} {'adds s':>7} {'share':>6}"]
    for key, label in rows:
        t = secs[key]
        add = max(0.0, t - prev)
        share = add / secs["job"]
        result["rungs"].append(
            {
                "rung": key,
                "seconds": round(t, 1),
                "records_per_s": round(n / t),
                "adds_s": round(add, 1),
                "share": round(share, 3),
            }
        )
        lines.append(f"{label:<40} {t:>7.1f} {n / t:>11,.0f} {add:>7.1f} {share:>6.0%}")
        prev = max(prev, t)
    lines.append(
        f"(results to the driver as pickled Rows instead, as before: {secs['driver_rows']:.1f} s, "
        f"{n / secs['driver_rows']:,.0f} records/s)"
    )
    out = var / f"profile-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=1))
    print("\n".join(lines))
    print(f"\nfigures: {out}")
    return 0


if __name__ == "__main__":
    interrupt.run(main)
