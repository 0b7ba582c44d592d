"""Reading Spark's checkpoint: the planned range and watermark of batch N, from `offsets/N`.

Spark writes `offsets/N` before it runs batch N (the pre-commit record of the protocol) and `commits/N` after
foreachBatch returns. Files are read through a small filesystem interface: the Hadoop FileSystem of the running
Spark driver (any Hadoop-compatible URI), or plain files for `file:` URIs when no Spark is at hand.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

from .ledger import BatchPlan


class CheckpointError(RuntimeError):
    pass


class CheckpointFS(Protocol):
    def read_text(self, rel: str) -> str | None: ...


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


def parse_offsets_file(text: str, topic: str) -> tuple[dict, dict[int, int]]:
    """`offsets/N`: line 1 `v1`, line 2 the batch metadata JSON, then one offsets JSON per source."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines or not lines[0].startswith("v"):
        raise CheckpointError(f"unrecognised offsets file (first line {lines[:1]})")
    meta = json.loads(lines[1]) if len(lines) > 1 else {}
    for ln in lines[2:]:
        if ln.strip() == "-":
            continue
        src = json.loads(ln)
        if topic in src:
            return meta, {int(p): int(o) for p, o in src[topic].items()}
    raise CheckpointError(f"no offsets for topic {topic} in the offsets file")


def parse_initial_offsets(text: str, topic: str) -> dict[int, int]:
    """`sources/0/0`, the Kafka source's initial offsets (a leading NUL byte, `v1`, then JSON)."""
    body = text.lstrip("\x00")
    start = body.find("{")
    if start < 0:
        raise CheckpointError("unrecognised initial offsets file")
    src = json.loads(body[start:])
    return {int(p): int(o) for p, o in src.get(topic, {}).items()}


def batch_plan(fs: CheckpointFS, batch: int, topic: str) -> BatchPlan:
    cur = fs.read_text(f"offsets/{batch}")
    if cur is None:
        raise CheckpointError(f"offsets/{batch} is missing from the checkpoint")
    meta, end = parse_offsets_file(cur, topic)
    if batch > 0:
        prev = fs.read_text(f"offsets/{batch - 1}")
        if prev is None:
            raise CheckpointError(f"offsets/{batch - 1} is missing: cannot tell where batch {batch} starts")
        _, start = parse_offsets_file(prev, topic)
    else:
        init = fs.read_text("sources/0/0")
        if init is None:
            raise CheckpointError("sources/0/0 (the initial offsets) is missing from the checkpoint")
        start = parse_initial_offsets(init, topic)
    # A partition new in this batch starts at the offset Spark began reading it from (0 for a new partition).
    start = {p: start.get(p, 0) for p in end}
    return BatchPlan(batch=batch, topic=topic, start=start, end=end,
                     watermark_ms=int(meta.get("batchWatermarkMs", 0)),
                     batch_ts_ms=int(meta.get("batchTimestampMs", 0)))
