"""A class-data archive (JDK CDS) of Spark's driver classes, for the test session's many short-lived Spark JVMs.

Every job start, recount and backfill in the suite is a fresh driver JVM that loads and verifies the same ~15,000
classes of Spark before its first batch. A dynamic archive (`-XX:ArchiveClassesAtExit`) taken once from a small
workload that loads what a job loads (a batch aggregation, a stateful streaming query with a watermark through
`foreachBatch`) lets each later JVM map those classes instead: a short Spark application measured 14-15 s of CPU
without it and 7 s with it on this machine (docs/testing.md). Sharing class data cannot change what a program
computes; a JVM whose class path or build does not match the archive ignores it (`-Xshare:auto`) and starts as
before.

The archive is kept under `var/jvm/`, named by what it depends on (the JVM's version, pyspark's version and its
jars), and built once: processes building it at once take turns. A failed build is logged and returns None: the
JVMs then run without it.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
from pathlib import Path

from onceflow.config import Settings
from onceflow.runtime import launcher

log = logging.getLogger(__name__)

WORKLOAD = """
import sys
from pyspark.sql import SparkSession, functions as F
s = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
     .config("spark.sql.shuffle.partitions", "2").config("spark.sql.session.timeZone", "UTC").getOrCreate())
s.range(0, 20000).selectExpr("id % 97 AS k", "id").groupBy("k").count().collect()
rows = []
frame = (s.readStream.format("rate").option("rowsPerSecond", 200).load()
         .withWatermark("timestamp", "2 seconds")
         .groupBy(F.window("timestamp", "1 second"), (F.col("value") % 7).alias("k")).count())
q = (frame.writeStream.outputMode("append").option("checkpointLocation", sys.argv[1])
     .foreachBatch(lambda df, n: rows.extend(df.collect())).trigger(processingTime="1 second").start())
import time
deadline = time.monotonic() + 120
while (q.lastProgress or {}).get("batchId", -1) < 3 and time.monotonic() < deadline:
    time.sleep(0.5)
q.stop()
s.stop()
"""


def _java_version() -> str:
    proc = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=60)
    return proc.stderr


def archive_path(settings: Settings) -> Path:
    """Where the archive for this JVM and this pyspark lives: a new JVM or pyspark is a new name, never a stale
    archive."""
    import pyspark

    jars = sorted(p.name for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar"))
    key = hashlib.sha256("\n".join([_java_version(), pyspark.__version__, *jars]).encode()).hexdigest()[:16]
    return settings.jvm_dir / f"spark-classes-{key}.jsa"


def build(settings: Settings, timeout: float = 600) -> Path | None:
    """The archive's path, built first if missing; None if it could not be built."""
    try:
        out = archive_path(settings)
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("no class-data archive: %s", e)
        return None
    if out.exists():
        return out
    settings.jvm_dir.mkdir(parents=True, exist_ok=True)
    with open(settings.jvm_dir / ".spark-classes.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if out.exists():
            return out
        return _build(settings, out, timeout)


def _build(settings: Settings, out: Path, timeout: float) -> Path | None:
    work = out.with_suffix(".work")
    work.mkdir(parents=True, exist_ok=True)
    script = work / "workload.py"
    script.write_text(WORKLOAD)
    tmp = out.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    env = {
        **os.environ,
        **launcher.submit_env(settings),
        "SPARK_SUBMIT_OPTS": f"-XX:ArchiveClassesAtExit={tmp}",
    }
    cmd = [launcher.spark_submit(), "--master", "local[2]", str(script), str(work / "checkpoint")]
    log.info("building the class-data archive %s (once per JVM and pyspark)", out.name)
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=work)
    except subprocess.TimeoutExpired:
        log.warning("no class-data archive: its workload ran past %s s", timeout)
        return None
    except OSError as e:  # spark-submit missing or not runnable: the JVMs run without the archive
        log.warning("no class-data archive: %s", e)
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if proc.returncode != 0 or not tmp.exists():
        log.warning("no class-data archive (exit %s): %s", proc.returncode, proc.stderr[-2000:])
        tmp.unlink(missing_ok=True)
        return None
    tmp.rename(out)
    return out
