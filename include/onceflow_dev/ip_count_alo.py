"""The same Spark query as the ip_count app's job (onceflow/entrypoints/stream.py), written with Spark's built-in Kafka sink (at-least-once): what a
user would pick instead of onceflow. Used only by `make bench` as the baseline. Progress goes to the status file
(ONCEFLOW_* settings, like the real job) so the benchmark can time it the same way."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from onceflow import config, wire
from onceflow.rules import clock
from onceflow.runtime import run_files
from onceflow.spark import app_plan
from onceflow.spark.progress import JsonProgressListener
from onceflow_apps import ip_count_plan as ip_count


class Progress(JsonProgressListener):  # the job's cheap listener: a contender should not pay pyspark's
    def __init__(self, settings):
        self.s = settings
        self.data = {
            "app": settings.app_id,
            "pid": os.getpid(),
            "state": "running",
            "batches": 0,
            "started_ms": clock.now_ms(),
        }

    def on_progress(self, progress):
        p = progress  # Spark's JSON of it
        now = clock.now_ms()
        if p.get("numInputRows") and "first_batch_ms" not in self.data:
            self.data["first_batch_ms"] = now - int((p.get("durationMs") or {}).get("triggerExecution", 0))
        sources = p.get("sources") or []
        self.data.update(
            batches=self.data["batches"] + 1,
            last_commit_ms=now,
            last_batch=p["batchId"],
            end_offsets=json.dumps(sources[0]["endOffset"]) if sources else None,
            # 0: a batch without input (Spark runs one when the watermark moved): it emits the windows the last
            # data batch's watermark closed, so the results of all input read so far are written
            last_input_rows=p.get("numInputRows", 0),
        )
        run_files.write_json(self.s.status_file, self.data)


def main() -> int:
    s = config.load()
    spark = SparkSession.builder.getOrCreate()
    spark.streams.addListener(Progress(s))
    out = ip_count.results_and_dlq(app_plan.source(spark, s), s)
    frame = out.select(
        F.when(F.col("kind") == wire.KIND_RESULT, F.lit(s.sink_topic)).otherwise(F.lit(s.dlq_topic)).alias("topic"),
        F.col("key").cast("binary").alias("key"),
        "value",
    )
    query = (
        frame.writeStream.format("kafka")
        .option("kafka.bootstrap.servers", s.bootstrap_servers)
        .option("checkpointLocation", s.checkpoint)
        .outputMode("append")
        .trigger(processingTime=f"{s.trigger_interval_s} seconds")
        .start()
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while query.isActive and not stop.is_set():
        query.awaitTermination(1)
    query.stop()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
