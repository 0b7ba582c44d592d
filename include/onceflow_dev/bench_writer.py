"""`make bench-writer`: how many output records one transaction takes per second from the driver, and where the
driver-side writer stops scaling.

One batch's output is written into one transaction by the job's own sink (onceflow.protocol.exactly_once), from
the driver. Contenders, side by side in one run, for each output size (BENCH_WRITER_SIZES) and each topology
(BENCH_WRITER_TOPOLOGIES: one broker with replication 1, three brokers with replication 3, min.insync.replicas 2,
acks=all):
- `producer`:  a bare confluent-kafka producer (idempotent, acks=all, no transaction) producing the same records
  from a Python loop: the ceiling of one Python thread producing;
- `sink`:      the job's sink, the rows from a Python generator: the protocol's cost over the ceiling;
- `streamed`:  the job's sink, the rows of a Spark DataFrame stored and then streamed into it as the job's writer does
  (onceflow.runtime.batch_writer.SparkOutput, onceflow.spark.partition_stream), the DataFrame built from `spark.range` in
  BENCH_WRITER_PARTITIONS partitions: what a batch's transaction costs end to end;
- `postgres`, `pg_streamed`: the same two with the PostgreSQL sink (onceflow.protocol.database_sink: COPY into a
  staging table, the upsert, the ledger row, one database transaction), on the embedded server under the bench's
  var dir; its group cache is committed on the topology's brokers.
records/s = records / (the first record handed to the producer .. the commit returned). Prints a table and
writes var/bench-writer/results-<time>.json.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Iterator

from onceflow import config, logs, wire
from onceflow.kafka import clients as kafka_clients
from onceflow.kafka import events as ev
from onceflow.kafka import topics
from onceflow.protocol.batch_sink import OutRecord
from onceflow.protocol.sinks import open_sink
from onceflow.rules.ledger import BatchPlan
from onceflow.rules.names import private_topics
from onceflow.rules.sources import SourcePartition
from onceflow.runtime import launcher
from onceflow.runtime.batch_writer import SparkOutput
from onceflow_dev import broker, interrupt, loopback, postgres

log = logging.getLogger("onceflow_dev.bench_writer")
VALUE = b'{"window_start":"2026-11-23T00:00:00Z","window_end":"2026-11-23T00:00:05Z","ip":"%s","count":1}'


def _rows(n: int) -> Iterator[OutRecord]:
    for i in range(n):
        ip = f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"
        yield OutRecord(wire.KIND_RESULT, f"1795000000000|{ip}", VALUE % ip.encode())


def _app(base: config.Settings, name: str) -> config.Settings:
    s = base.replace(app_id=name, **private_topics(name))
    topics.ensure(s)
    return s


def _plan(s: config.Settings) -> BatchPlan:
    parts = [SourcePartition(s.source_topic, p) for p in range(s.source_partitions)]
    return BatchPlan(batch=0, start=dict.fromkeys(parts, 0), end=dict.fromkeys(parts, 0))


def run_producer(s: config.Settings, n: int) -> float:
    p = kafka_clients.idempotent_producer(
        s, **{"linger.ms": s.producer_linger_ms, "batch.num.messages": s.producer_batch_messages}
    )
    t0 = time.monotonic()
    for r in _rows(n):
        while True:
            try:
                p.produce(s.sink_topic, r.value, r.key.encode())
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    if p.flush(600):
        raise RuntimeError("the bare producer did not deliver everything")
    return time.monotonic() - t0


def run_sink(s: config.Settings, n: int, rows=None) -> float:
    sink = open_sink(s, ev.EventBus.for_job(s))
    try:
        t0 = time.monotonic()
        out = sink.write_batch(_plan(s), rows if rows is not None else _rows(n))
        elapsed = time.monotonic() - t0
        if out.outputs != n:
            raise RuntimeError(f"{out.outputs} written, {n} expected")
        return elapsed
    finally:
        sink.close()


def run_streamed(spark, s: config.Settings, n: int, partitions: int) -> float:
    from pyspark.sql import functions as F

    ip = F.format_string(
        "10.%d.%d.%d",
        F.shiftright("id", 16).bitwiseAND(255),
        F.shiftright("id", 8).bitwiseAND(255),
        F.col("id").bitwiseAND(255),
    )
    df = spark.range(0, n, 1, partitions).select(
        F.lit(wire.KIND_RESULT).alias("kind"),
        F.concat(F.lit("1795000000000|"), ip).alias("key"),
        F.format_string(VALUE.decode(), ip).cast("binary").alias("value"),
    )
    with SparkOutput().stored(df) as rows:  # as the job's writer does: stored first, then streamed into the sink
        return run_sink(s, n, rows=rows)


def main() -> int:
    logs.setup(logging.INFO, logs.SHORT)
    for noisy in ("onceflow.events", "onceflow.kafka.client", "onceflow_dev.broker", "py4j"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    sizes = [int(x) for x in os.environ.get("BENCH_WRITER_SIZES", "100000,500000,2000000").split(",")]
    topologies = [int(x) for x in os.environ.get("BENCH_WRITER_TOPOLOGIES", "1,3").split(",")]
    partitions = int(os.environ.get("BENCH_WRITER_PARTITIONS", "4"))
    contenders = os.environ.get("BENCH_WRITER_CONTENDERS", "producer,sink,streamed,postgres,pg_streamed").split(",")
    var = config.REPO_ROOT / "var" / "bench-writer"
    shutil.rmtree(var, ignore_errors=True)
    var.mkdir(parents=True)
    results: list[dict] = []
    from pyspark.sql import SparkSession

    base0 = config.load(var_dir=var)
    builder = SparkSession.builder.master("local[2]").appName("bench-writer")
    for k, v in launcher.spark_conf(base0).items():
        builder = builder.config(k, v)
    spark = builder.config("spark.driver.memory", "1g").getOrCreate()
    try:
        for nodes in topologies:
            topo_var = var / f"brokers-{nodes}"
            base = config.load(env={}, var_dir=topo_var, **loopback.kafka(nodes))
            broker.start(base)
            try:
                for n in sizes:
                    for contender in contenders:
                        s = _app(base, f"w{nodes}_{contender}_{n}")
                        if contender in ("postgres", "pg_streamed"):  # the server's files under the bench's var
                            s = postgres.provision_sink(s.replace(var_dir=var)).replace(var_dir=topo_var)
                        if contender == "producer":
                            secs = run_producer(s, n)
                        elif contender in ("sink", "postgres"):
                            secs = run_sink(s, n)
                        else:
                            secs = run_streamed(spark, s, n, partitions)
                        row = {
                            "brokers": nodes,
                            "replication": s.replication_factor,
                            "records": n,
                            "contender": contender,
                            "seconds": round(secs, 2),
                            "records_per_s": round(n / secs),
                        }
                        results.append(row)
                        log.info("%s", row)
            finally:
                broker.stop(base)
    finally:
        spark.stop()
        postgres.remove(config.load(env={}, var_dir=var))
    out = var / f"results-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(results, indent=1))
    print(f"\n{'brokers':>7} {'records':>9} {'contender':>9} {'seconds':>8} {'records/s':>10} {'of producer':>11}")
    ceiling = {(r["brokers"], r["records"]): r["records_per_s"] for r in results if r["contender"] == "producer"}
    for r in results:
        ratio = r["records_per_s"] / ceiling[(r["brokers"], r["records"])]
        print(
            f"{r['brokers']:>7} {r['records']:>9,} {r['contender']:>9} {r['seconds']:>8} "
            f"{r['records_per_s']:>10,} {ratio:>11.2f}"
        )
    print(f"\n(results: {out})")
    return 0


if __name__ == "__main__":
    interrupt.run(main)
