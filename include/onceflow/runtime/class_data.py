"""A class-data archive (JDK CDS) of Spark's classes, which the Spark JVMs started on this machine can map instead of
loading and verifying the same ~15,000 classes again: the test session's many short JVMs (tests/conftest.py) and,
unless `ONCEFLOW_CLASS_DATA_SHARING` is off, the platform's own launches (the job's driver and its standby, its
executors on the embedded cluster, the batch jobs: onceflow.runtime.launcher), whose restarts pay that cost each
time.

A dynamic archive (`-XX:ArchiveClassesAtExit`) taken once from a small workload that loads what a job loads (a batch
aggregation, a stateful streaming query with a watermark through `foreachBatch`). A short Spark application measured
14-15 s of CPU without it and 7 s with it on this machine (docs/testing.md). Sharing class data cannot change what a
program computes; a JVM whose class path or build does not match the archive ignores it (`-Xshare:auto`) and starts
as before.

The archive is kept under `var/jvm/`, named by what it depends on (the JVM's version, pyspark's version and its
jars, the class path the jobs' drivers add), and built once, by `onceflow-dev stack up` or on first use: processes
building it at once take turns. A failed build is logged, recorded beside it (not tried again at every launch) and
returns None: the JVMs then run without it.

A JVM maps the archive only when the class path it was dumped with is a prefix of its own. The jobs' drivers and
executors put the platform's local file system first (onceflow.runtime.local_fs: `spark.*.extraClassPath`, which
Spark places before its own jars), so the workload is dumped with that class path too, and every other Spark JVM of
the test session is given it (tests/conftest.py). Dumped without it, no job's driver mapped the archive from
2026-11-29 to 2026-11-30: each logged "Unable to use shared archive" and loaded Spark's classes again.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from onceflow.config import Settings
from onceflow.runtime import local_fs

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
    """The JVM spark-submit runs (JAVA_HOME's, else the one on PATH), by its release file: no JVM started."""
    home = os.environ.get("JAVA_HOME")
    java = Path(home) / "bin" / "java" if home else Path(shutil.which("java") or "java")
    release = java.resolve().parent.parent / "release"
    return f"{java.resolve()}\n{release.read_text() if release.is_file() else ''}"


def driver_class_path(settings: Settings) -> str | None:
    """What the jobs' drivers put before Spark's jars on their class path (None: nothing), which the archive must be
    dumped with and every JVM that maps it must start with."""
    built = local_fs.jar(settings)
    return None if built is None else str(built)


def archive_path(settings: Settings) -> Path:
    """Where the archive for this JVM, this pyspark and the drivers' class path lives: a new JVM, pyspark or local
    file system jar is a new name, never a stale archive."""
    import pyspark

    jars = sorted(p.name for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar"))
    parts = [_java_version(), pyspark.__version__, *jars, driver_class_path(settings) or ""]
    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    return settings.jvm_dir / f"spark-classes-{key}.jsa"


def build(settings: Settings, spark_submit: str, env: Mapping[str, str], timeout: float = 600) -> Path | None:
    """The archive's path, built first if missing (the workload run by `spark_submit` in `env`, a launch's own);
    None if it could not be built."""
    try:
        out = archive_path(settings)
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("no class-data archive: %s", e)
        return None
    if out.exists():
        return out
    if _failed(out).exists():  # not again at every launch: a restart would wait for it each time
        return None
    settings.jvm_dir.mkdir(parents=True, exist_ok=True)
    with open(settings.jvm_dir / ".spark-classes.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if out.exists():
            return out
        if _failed(out).exists():
            return None
        return _build(settings, out, spark_submit, env, timeout)


def _failed(out: Path) -> Path:
    """Where a failed build of `out` is recorded, with its reason: delete it to have the next launch try again."""
    return out.with_name(f".{out.stem}.failed")


def _build(settings: Settings, out: Path, spark_submit: str, env: Mapping[str, str], timeout: float) -> Path | None:
    work = out.with_suffix(".work")
    work.mkdir(parents=True, exist_ok=True)
    script = work / "workload.py"
    script.write_text(WORKLOAD)
    tmp = out.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    env = {**env, "SPARK_SUBMIT_OPTS": f"-XX:ArchiveClassesAtExit={tmp}"}
    extra = driver_class_path(settings)
    cmd = [spark_submit, "--master", "local[2]"]
    cmd += ["--conf", f"spark.driver.extraClassPath={extra}"] if extra else []
    cmd += [str(script), str(work / "checkpoint")]
    log.info("building the class-data archive %s (once per JVM, pyspark and class path)", out.name)
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=work)
    except subprocess.TimeoutExpired:
        _no_archive(out, tmp, f"its workload ran past {timeout} s")
        return None
    except OSError as e:  # spark-submit missing or not runnable: the JVMs run without the archive
        _no_archive(out, tmp, str(e))
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if proc.returncode != 0 or not tmp.exists():
        _no_archive(out, tmp, f"exit {proc.returncode}: {proc.stderr[-2000:]}")
        return None
    tmp.rename(out)
    return out


def _no_archive(out: Path, tmp: Path, why: str) -> None:
    tmp.unlink(missing_ok=True)
    _failed(out).write_text(why)
    log.warning("no class-data archive (the JVMs start without it; delete %s to try again): %s", _failed(out), why)
