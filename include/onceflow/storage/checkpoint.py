"""Reading the checkpoint's files inside the job: the Hadoop FileSystem of its live SparkSession (any
Hadoop-compatible URI: HDFS, S3A, GCS, ... by configuration only). Without Spark, onceflow.storage.store.Store reads
the same files through fsspec. What the files mean is in onceflow.rules.checkpoint."""

from __future__ import annotations


class HadoopFS:
    """The Hadoop FileSystem of a live SparkSession (HDFS, S3A, GCS, ... by configuration only)."""

    def __init__(self, spark, uri: str):
        jvm = spark._jvm
        # The classes are looked up once: each segment of `jvm.org.apache...` is a class lookup that the JVM
        # answers by searching every jar on its class path (the job reads its offsets file on every batch).
        self._Path = jvm.org.apache.hadoop.fs.Path
        self._IOUtils = jvm.org.apache.commons.io.IOUtils
        self._root = self._Path(uri)
        self._fs = self._root.getFileSystem(spark._jsc.hadoopConfiguration())

    @property
    def implementation(self) -> str:
        """The Hadoop FileSystem class the checkpoint is read and written through (on this machine's file system:
        onceflow.runtime.local_fs's, where it could be built)."""
        return str(self._fs.getClass().getName())

    def _path(self, rel: str):
        return self._Path(self._root, rel)

    def list_names(self, rel: str) -> list[str]:
        """The names in directory `rel` (none when it does not exist), hidden ones included."""
        p = self._path(rel)
        if not self._fs.exists(p):
            return []
        return [st.getPath().getName() for st in self._fs.listStatus(p)]

    def delete(self, rel: str) -> None:
        self._fs.delete(self._path(rel), True)

    def read_text(self, rel: str) -> str | None:
        p = self._path(rel)
        if not self._fs.exists(p):
            return None
        stream = self._fs.open(p)
        try:
            return self._IOUtils.toString(stream, "UTF-8")
        finally:
            stream.close()
