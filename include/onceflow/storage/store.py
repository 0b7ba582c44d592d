"""The one way onceflow reaches files on a store it does not own: the checkpoint, the savepoints, the quarantine
(`Store`, through fsspec); `onceflow.storage.checkpoint.HadoopFS` reads the checkpoint through a live SparkSession's
Hadoop FileSystem instead, inside the job. Both serve onceflow.rules.checkpoint.CheckpointFS."""

from __future__ import annotations

import fsspec


class Store:
    """A directory tree behind a URI, through fsspec (file://, hdfs://, s3://, ... whatever fsspec has a driver
    for). It reads a checkpoint's files too (onceflow.rules.checkpoint.CheckpointFS): the savepoints, the
    quarantine, health and the console judge a checkpoint on any store the same way."""

    def __init__(self, uri: str):
        self.uri = uri.rstrip("/")
        self.fs, self.root = fsspec.core.url_to_fs(self.uri)
        self.root = self.root.rstrip("/")

    def path(self, rel: str = "") -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def exists(self, rel: str = "") -> bool:
        return self.fs.exists(self.path(rel))

    def files(self, rel: str = "") -> dict[str, int]:
        """Every file under `rel`, relative to it, with its size."""
        base = self.path(rel)
        if not self.fs.exists(base):
            return {}
        out = {}
        for p, info in self.fs.find(base, detail=True, withdirs=False).items():
            out[p[len(base) :].lstrip("/")] = int(info.get("size") or 0)
        return out

    def read(self, rel: str) -> bytes:
        with self.fs.open(self.path(rel), "rb") as f:
            return f.read()

    def write(self, rel: str, data: bytes) -> None:
        parent = self.path(rel).rsplit("/", 1)[0]
        self.fs.makedirs(parent, exist_ok=True)
        with self.fs.open(self.path(rel), "wb") as f:
            f.write(data)

    def write_atomic(self, rel: str, data: bytes) -> None:
        self.write(rel + ".tmp", data)
        self.fs.mv(self.path(rel + ".tmp"), self.path(rel))

    def dirs(self) -> list[str]:
        if not self.fs.exists(self.root):
            return []
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False) if self.fs.isdir(p))

    def rm(self, rel: str = "") -> None:
        if self.fs.exists(self.path(rel)):
            self.fs.rm(self.path(rel), recursive=True)

    def read_text(self, rel: str) -> str | None:
        """A file's text, None when it does not exist (CheckpointFS)."""
        try:
            return self.read(rel).decode()
        except FileNotFoundError:
            return None

    def newest_mtime(self, rel: str) -> float | None:
        """The newest modification time (epoch seconds) of the files directly under `rel`; None when it has none."""
        base = self.path(rel)
        if not self.fs.exists(base):
            return None
        times = []
        for info in self.fs.ls(base, detail=True):
            if info.get("type") == "file":
                # a commit file is written once: where a store keeps no modification time, its creation is it
                m = info.get("mtime") or info.get("LastModified") or info.get("last_modified") or info.get("created")
                times.append(m.timestamp() if hasattr(m, "timestamp") else float(m) if m is not None else None)
        known = [t for t in times if t is not None]
        return max(known) if known else None
