"""JVM artifacts from Maven Central: Spark's Kafka connector (and, for the embedded stack, the Kafka broker).

Each set is described by a pom: the connector's ships in the package (onceflow.resources), the development tooling
passes its own directory of poms. Maven resolves a set with strict checksums (-C) and caches in ~/.m2; the resolved
jars are copied to `var/jvm/<name>/` with a stamp of the pom's hash, so a second call downloads and copies nothing.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from onceflow import resources
from onceflow.config import Settings
from onceflow.wire import OnceflowError

log = logging.getLogger(__name__)


class JvmResolveError(OnceflowError):
    pass


def _stamp(pom: Path) -> str:
    return hashlib.sha256(pom.read_bytes()).hexdigest()


def maven(pom: Path, *goals: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    """Maven on `pom`: batch mode, strict checksums (-C), Maven Central only (onceflow/resources/maven/settings.xml)."""
    cmd = ["mvn", "-B", "-q", "-C", "-s", str(resources.MAVEN_SETTINGS), "-f", str(pom), *goals]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def built_once(settings: Settings, name: str, ready: Callable[[], bool], build: Callable[[], object]) -> None:
    """Run `build` unless `ready()`. Processes building the same artifact at once (two test workers, a CLI command
    beside the job on a fresh machine) take turns on a lock in the artifacts' directory: the first builds, the
    others find it ready."""
    if ready():
        return
    settings.jvm_dir.mkdir(parents=True, exist_ok=True)
    with open(settings.jvm_dir / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not ready():
            build()


def resolve(name: str, settings: Settings, poms: Path = resources.MAVEN_POMS) -> Path:
    """Return the directory holding the resolved jars of `<poms>/<name>/pom.xml`, resolving them once."""
    pom = poms / name / "pom.xml"
    out = settings.jvm_dir / name
    built_once(settings, name, lambda: _resolved(pom, out), lambda: _resolve(name, pom, out))
    return out


def _resolved(pom: Path, out: Path) -> bool:
    stamp = out / ".pom.sha256"
    return stamp.exists() and stamp.read_text() == _stamp(pom) and any(out.glob("*.jar"))


def _resolve(name: str, pom: Path, out: Path) -> Path:
    stamp = out / ".pom.sha256"
    if shutil.which("mvn") is None:
        raise JvmResolveError("Maven (mvn) is needed to fetch the JVM artifacts: apt-get install maven")
    tmp = out.with_name(name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    log.info("resolving %s with Maven", name)
    proc = maven(
        pom, "dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={tmp}", timeout=1200
    )
    if proc.returncode != 0:
        raise JvmResolveError(f"Maven could not resolve {pom}:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    stamp.write_text(_stamp(pom))
    return out


_VERSION_SUFFIX = re.compile(r"-\d[\w.\-]*\.jar$")


def _artifact(jar: Path) -> str:
    return _VERSION_SUFFIX.sub("", jar.name)


def pyspark_jars() -> Path:
    """The directory of the jars pyspark ships (Spark's, Hadoop's client, Scala's)."""
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def spark_kafka_jars(settings: Settings) -> list[Path]:
    """The connector's jars that pyspark does not already ship (scala, slf4j, compression codecs stay pyspark's)."""
    bundled = {_artifact(j) for j in pyspark_jars().glob("*.jar")}
    jars = sorted(resolve("spark-kafka", settings).glob("*.jar"))
    return [j for j in jars if _artifact(j) not in bundled]
