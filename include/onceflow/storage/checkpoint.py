"""Reading the checkpoint's files: the Hadoop FileSystem of a live SparkSession (any Hadoop-compatible URI: HDFS,
S3A, GCS, ... by configuration only), or plain files for `file:` URIs when no Spark is at hand. What the files
mean is in onceflow.rules.checkpoint."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from onceflow.rules.checkpoint import CheckpointError


class LocalFS:
    def __init__(self, uri: str):
        u = urlparse(uri)
        if u.scheme not in ("", "file"):
            raise CheckpointError(f"{uri} is not a local path; read it through Spark's Hadoop FileSystem")
        self.root = Path(u.path)

    def read_text(self, rel: str) -> str | None:
        try:
            return (self.root / rel).read_text()
        except FileNotFoundError:
            return None


class HadoopFS:
    """The Hadoop FileSystem of a live SparkSession (HDFS, S3A, GCS, ... by configuration only)."""

    def __init__(self, spark, uri: str):
        jvm = spark._jvm
        self._jvm = jvm
        self._root = jvm.org.apache.hadoop.fs.Path(uri)
        self._fs = self._root.getFileSystem(spark._jsc.hadoopConfiguration())

    def read_text(self, rel: str) -> str | None:
        p = self._jvm.org.apache.hadoop.fs.Path(self._root, rel)
        if not self._fs.exists(p):
            return None
        stream = self._fs.open(p)
        try:
            return self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
        finally:
            stream.close()
