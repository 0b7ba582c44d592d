"""Java sources compiled once into a jar with the JDK's `javac`, against pyspark's own jars: the platform's local file
system (onceflow.runtime.local_fs) and the JVM functions an app brings (App.java, onceflow.runtime.app_jars).

A jar is named by a digest of its sources and of the jars it was compiled against, so a changed source or another
pyspark builds a new one and an unchanged one is never built twice; processes building the same jar at once take
turns (onceflow.runtime.jvm.built_once).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from onceflow.config import Settings
from onceflow.runtime import jvm
from onceflow.wire import OnceflowError


class JavacError(OnceflowError):
    """Sources could not be compiled (no javac, or javac refused them); the message says which and why."""


def sources(roots: Iterable[Path]) -> list[Path]:
    """The `.java` files of `roots` (files, or directories searched below), in a stable order."""
    out: list[Path] = []
    for root in roots:
        root = Path(root)
        if root.is_dir():
            out += sorted(root.rglob("*.java"))
        elif root.suffix == ".java" and root.is_file():
            out.append(root)
        else:
            raise JavacError(f"{root} is neither a .java file nor a directory of them")
    if not out:
        raise JavacError(f"no .java file under {', '.join(str(r) for r in roots)}")
    return out


def classpath(patterns: Sequence[str]) -> list[Path]:
    """pyspark's jars matching any of `patterns` (globs, e.g. `spark-sql-api_*.jar`)."""
    return sorted({j for p in patterns for j in jvm.pyspark_jars().glob(p)})


def jar(settings: Settings, name: str, srcs: Sequence[Path], against: Sequence[Path]) -> Path:
    """The jar of `srcs` compiled against `against` (jars), built on first use under the JVM artifacts' directory
    (`<jvm_dir>/<name>/<name>-<digest>.jar`). Raises JavacError when it cannot be built."""
    h = hashlib.sha256()
    for f in srcs:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    for j in against:
        h.update(j.name.encode() + b"\0")
    out = settings.jvm_dir / name / f"{name}-{h.hexdigest()[:16]}.jar"
    javac = shutil.which("javac")
    if javac is None and not out.exists():
        raise JavacError(
            f"no javac on PATH: {name} is compiled from {len(srcs)} Java source(s) on first use, which needs a JDK "
            f"(install one, e.g. Debian's openjdk-17-jdk-headless)"
        )
    jvm.built_once(settings, name, out.exists, lambda: _build(str(javac), name, srcs, against, out))
    return out


def _build(javac: str, name: str, srcs: Sequence[Path], against: Sequence[Path], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"onceflow-{name}-") as tmp:
        classes = Path(tmp) / "classes"
        argv = [javac, "-nowarn", "--release", "17", "-encoding", "UTF-8", "-d", str(classes)]
        if against:
            argv += ["-cp", ":".join(str(j) for j in against)]
        proc = subprocess.run([*argv, *map(str, srcs)], capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise JavacError(f"{name}: javac refused the sources:\n{proc.stderr[-3000:]}")
        staged = Path(tmp) / out.name
        with zipfile.ZipFile(staged, "w", zipfile.ZIP_DEFLATED) as z:
            for f in sorted(classes.rglob("*.class")):
                z.write(f, f.relative_to(classes).as_posix())
        shutil.move(staged, out.with_suffix(".tmp"))
        out.with_suffix(".tmp").rename(out)  # whole or absent: a reader never sees half a jar
