"""onceflow's local file system (onceflow.runtime.local_fs), built by javac and loaded in a Spark JVM: a file it
creates gets Hadoop's permission without a forked `chmod`, where Hadoop's own local file system forks one per file
(without its native library, as pip's pyspark ships it). Counted by the CPU of the JVM's reaped children."""

import stat
import zipfile
from pathlib import Path

from onceflow import config
from onceflow.runtime import local_fs

FILES = 150


def _reaped_ticks(pid: int) -> int:
    """cutime + cstime: the CPU of the JVM's children that ended (a forked chmod is one)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[13]) + int(fields[14])


def _instance(spark, cls: str, jar: Path):
    gw, jvm = spark.sparkContext._gateway, spark._jvm
    urls = gw.new_array(jvm.java.net.URL, 1)
    urls[0] = jvm.java.io.File(str(jar)).toURI().toURL()
    loader = jvm.java.net.URLClassLoader(urls, jvm.java.lang.Thread.currentThread().getContextClassLoader())
    c = jvm.java.lang.Class.forName(cls, True, loader)
    fs = c.getDeclaredConstructor(gw.new_array(jvm.java.lang.Class, 0)).newInstance(
        gw.new_array(jvm.java.lang.Object, 0)
    )
    fs.initialize(jvm.java.net.URI("file:///"), spark._jsc.hadoopConfiguration())
    return fs


def _create(spark, fs, where: Path, n: int) -> None:
    Path_ = spark._jvm.org.apache.hadoop.fs.Path
    for i in range(n):
        out = fs.create(Path_(f"file://{where}/f{i}"), True)
        out.write(b"x")
        out.close()


def test_the_class_is_built_once_and_sets_permissions_without_forking(spark, tmp_path):
    s = config.load(env={}, jvm_dir=tmp_path / "jvm")
    jar = local_fs.jar(s)
    assert jar is not None and jar.is_file()
    names = set(zipfile.ZipFile(jar).namelist())
    assert {"dev/onceflow/hadoop/NioLocalFileSystem.class", "dev/onceflow/hadoop/NioLocalFileSystem$Raw.class"} <= names
    built = jar.stat().st_mtime_ns
    assert local_fs.jar(s) == jar and jar.stat().st_mtime_ns == built  # found, not built again

    pid = spark.sparkContext._gateway.proc.pid
    ours = _instance(spark, local_fs.CLASS, jar)
    hadoops = _instance(spark, "org.apache.hadoop.fs.LocalFileSystem", jar)
    runs = {}
    for name, fs in (("hadoop", hadoops), ("ours", ours)):
        where = tmp_path / name
        where.mkdir()
        before = _reaped_ticks(pid)
        _create(spark, fs, where, FILES)
        runs[name] = _reaped_ticks(pid) - before
        # the same files: each with its checksum file, with Hadoop's default permission (0666, umask 022)
        made = sorted(p.name for p in where.iterdir())
        assert len(made) == 2 * FILES and ".f0.crc" in made, made[:4]
        assert stat.S_IMODE((where / "f0").stat().st_mode) == 0o644
    # Hadoop's forks a chmod per file and checksum (each at least a millisecond of a child's CPU); ours forks none
    assert runs["hadoop"] >= 10 and runs["ours"] <= 1, runs

    # an explicit permission, as Spark's checkpoint manager sets one
    Path_ = spark._jvm.org.apache.hadoop.fs.Path
    FsPermission = spark._jvm.org.apache.hadoop.fs.permission.FsPermission
    ours.setPermission(Path_(f"file://{tmp_path}/ours/f1"), FsPermission("640"))
    assert stat.S_IMODE((tmp_path / "ours" / "f1").stat().st_mode) == 0o640
