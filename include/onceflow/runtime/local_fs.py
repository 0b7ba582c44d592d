"""The local file system a checkpoint on this machine is written through: Hadoop's own, except that it sets a file's
permission through java.nio instead of a forked `chmod` (resources/java/NioLocalFileSystem.java).

pip's pyspark ships no Hadoop native library, so Hadoop's local file system forks `chmod` for every file it creates:
a streaming job's offsets, commits and each state partition's delta, each with its checksum file, about five
processes a second for a job at 200 records/s (docs/performance.md, "When the stream is quiet"). The class is
compiled here with the JDK's `javac` against pyspark's own Hadoop jar, once per source and Hadoop version, into the
JVM artifacts' directory; where there is no `javac`, or the executors do not run on this machine (the jar would not
be on their class path), Hadoop's file system stays, as it is for every other scheme.
"""

from __future__ import annotations

import logging
from pathlib import Path

from onceflow import resources
from onceflow.config import Settings
from onceflow.runtime import javac

log = logging.getLogger(__name__)

CLASS = "dev.onceflow.hadoop.NioLocalFileSystem"
SOURCE = resources.JAVA / "NioLocalFileSystem.java"
_warned: set[str] = set()


def jar(settings: Settings) -> Path | None:
    """The compiled class's jar, built on first use (onceflow.runtime.javac), or None where it cannot be built
    (logged once per reason)."""
    api = javac.classpath(["hadoop-client-api-*.jar"])[:1]
    if not api:
        _once("pyspark ships no hadoop-client-api jar: Hadoop's local file system stays")
        return None
    try:
        return javac.jar(settings, "nio-local-fs", [SOURCE], api)
    except javac.JavacError as e:
        _once(f"the checkpoint's files are written through Hadoop's local file system, which forks chmod for each: {e}")
        return None


def _once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.info(message)


def conf(settings: Settings, executors_here: bool) -> dict[str, str]:
    """Spark settings that make `file:` paths go through the class: on the driver's and the executors' class path
    (they run on this machine: `executors_here`; cluster deploy mode never does, config allows it on Kubernetes and
    YARN only), and Hadoop's `fs.file.impl`. Empty where it cannot apply."""
    if not executors_here:
        return {}
    built = jar(settings)
    if built is None:
        return {}
    return {
        "spark.hadoop.fs.file.impl": CLASS,
        "spark.driver.extraClassPath": str(built),
        "spark.executor.extraClassPath": str(built),
    }
