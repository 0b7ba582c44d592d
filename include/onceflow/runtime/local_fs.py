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

import hashlib
import logging
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from onceflow import resources
from onceflow.config import Settings
from onceflow.runtime import jvm

log = logging.getLogger(__name__)

CLASS = "dev.onceflow.hadoop.NioLocalFileSystem"
SOURCE = resources.JAVA / "NioLocalFileSystem.java"
_warned: set[str] = set()


def jar(settings: Settings) -> Path | None:
    """The compiled class's jar, built on first use (processes building it at once take turns), or None where it
    cannot be built (logged once per reason)."""
    api = next(iter(sorted(jvm.pyspark_jars().glob("hadoop-client-api-*.jar"))), None)
    javac = shutil.which("javac")
    if api is None or javac is None:
        _once(
            "no javac on PATH: the checkpoint's files are written through Hadoop's local file system, which forks "
            "chmod for each (install a JDK, e.g. openjdk-17-jdk-headless, to avoid it)"
            if javac is None
            else "pyspark ships no hadoop-client-api jar: Hadoop's local file system stays"
        )
        return None
    digest = hashlib.sha256(SOURCE.read_bytes() + api.name.encode()).hexdigest()[:16]
    out = settings.jvm_dir / "local-fs" / f"nio-local-fs-{digest}.jar"
    jvm.built_once(settings, "local-fs", out.exists, lambda: _build(javac, api, out))
    return out if out.exists() else None


def _build(javac: str, api: Path, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="onceflow-local-fs-") as tmp:
        classes = Path(tmp) / "classes"
        proc = subprocess.run(
            [javac, "-nowarn", "--release", "17", "-cp", str(api), "-d", str(classes), str(SOURCE)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode != 0:
            _once(f"javac could not build {SOURCE.name}; Hadoop's local file system stays: {proc.stderr[-1500:]}")
            return
        staged = Path(tmp) / out.name
        with zipfile.ZipFile(staged, "w", zipfile.ZIP_DEFLATED) as z:
            for f in sorted(classes.rglob("*.class")):
                z.write(f, f.relative_to(classes).as_posix())
        shutil.move(staged, out.with_suffix(".tmp"))
        out.with_suffix(".tmp").rename(out)  # whole or absent: a reader never sees half a jar


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
