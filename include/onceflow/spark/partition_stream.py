"""A DataFrame's rows on the driver a partition at a time: each partition is collected by a Spark job of its own and
is garbage once read; the next partition is collected while the current one is consumed.

Why not `DataFrame.toLocalIterator`: in pyspark 4.2 the driver JVM holds on to the partitions it has served until
the iteration ends. Measured (local[2], 2,000,000 output-like rows in 64 partitions, a consumer slower than Spark):
toLocalIterator runs a 512 MiB driver out of heap at partition 46 of 64, with or without prefetch; this stream
completes in the same 512 MiB. The driver holds at most two partitions (the one being consumed, as Python rows,
and the next one).

An output known to be small before it is computed (`collected`, the exactly-once writer's bound) skips the store:
one Spark job computes it and brings every partition to the driver at once, as Arrow batches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")
# Up to this many rows (a few MB) a stored output is fetched by one Spark job, in one task.
WHOLE_ROWS = 50_000
_python_rdd: dict[int, Any] = {}  # per JVM gateway: PythonRDD's class


@contextmanager
def materialised(df: Any) -> Iterator[Materialised]:
    """Compute every partition of `df` now, into the executors' block stores (memory, spilling to disk), and yield
    it with its row count; streaming it afterwards (`Stored`) only reads the stored partitions. The exactly-once
    writer opens its transaction inside this block, so that the batch's compute (read, parse, shuffle, both
    branches of a union) runs before the transaction and only producing runs against its timeout. A lost block
    (a worker gone) is recomputed from the lineage, as any Spark task is. The blocks are dropped when the block
    ends.

    One plan over the stored partitions is made and serves both the count and the reads: the rows are counted by
    a Spark job over that plan's partitions (a task each, which stores its partition), not by `DataFrame.count`,
    which plans an aggregate of its own with a second stage whose one task merges the counts, and each read
    planned the stored frame again (docs/performance.md, "One plan for the stored output")."""
    from pyspark import StorageLevel

    df.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        # a Dataset of its own, planned now that the cache holds df's plan: its scan reads (and first fills) the
        # stored partitions, whatever df's own plan was before it was cached
        scan = df.alias("_stored")._jdf
        yield Materialised(df, scan, scan.queryExecution().toRdd().count())
    finally:
        df.unpersist(blocking=False)


@dataclass(frozen=True)
class Materialised:
    df: Any  # the DataFrame, its schema and session
    scan: Any  # the JVM Dataset whose one plan reads the stored partitions
    count: int


def collected(df: Any, make: Callable[[tuple], T]) -> Collected[T]:
    """Compute `df` and bring its whole output to the driver in one Spark job: each partition's rows as Arrow
    batches, made in the executors, held by the driver (its JVM while the job runs, then this process) until the
    result is dropped. For an output known to be small: against `materialised` and `Stored` it saves the store (the
    cache's columnar copy and its plan) and the second Spark job that reads it back, 0.11-0.14 s of a small batch's
    0.45 s (docs/performance.md, "One Spark job for a small output"). Like `materialised`, every partition is
    computed before this returns, so a transaction opened after it runs no compute; iterating the result again
    decodes the same batches, computes nothing."""
    from pyspark.serializers import NoOpSerializer
    from pyspark.sql.pandas.types import to_arrow_schema

    jrdd = df._jdf.toArrowBatchRdd().toJavaRDD()  # serialized Arrow record batches, no schema in them
    n = jrdd.getNumPartitions()
    blobs = list(_load(df, jrdd, list(range(n)), NoOpSerializer())) if n else []
    return Collected(to_arrow_schema(df.schema), blobs, make)


class Collected(Generic[T]):
    """A `collected` output: its Arrow batches, as `make(tuple)` on every iteration."""

    def __init__(self, schema: Any, blobs: list[bytes], make: Callable[[tuple], T]):
        self._schema, self._blobs, self._make = schema, blobs, make

    def __iter__(self) -> Iterator[T]:
        return map(self._make, _decoded(self._blobs, self._schema))


def _decoded(blobs: Iterable[bytes], schema: Any) -> Iterator[tuple]:
    """The rows of serialized Arrow record batches (no schema in them), as tuples, a batch's columns at once."""
    import pyarrow as pa

    for blob in blobs:
        batch = pa.ipc.read_record_batch(pa.py_buffer(blob), schema)
        yield from zip(*(c.to_pylist() for c in batch.columns), strict=True)


def rows(df: Any) -> Iterator[Any]:
    """Every row of `df` (pyspark Rows), partition by partition, in partition order; each partition is computed
    once (as toLocalIterator does, one job per partition: the stages before it run once and are reused)."""
    from pyspark.serializers import BatchedSerializer, CPickleSerializer

    jrdd = df._jdf.javaToPython()  # pickled rows, made in the executors' JVMs (no Python on the executors)
    serializer = BatchedSerializer(CPickleSerializer())
    yield from _stream(jrdd, lambda ps: _load(df, jrdd, ps, serializer))


def tuples(df: Any) -> Iterator[tuple]:
    """As `rows`, as plain tuples, moved as Arrow record batches instead of pickled Rows: the executors' JVMs
    write Arrow, the driver reads each batch's columns at once (no Row object per row)."""
    yield from _arrow_tuples(df, df._jdf, whole=False)


def _arrow_tuples(df: Any, jds: Any, whole: bool) -> Iterator[tuple]:
    """The rows of `jds` (the JVM Dataset of `df`, or of a plan over its stored partitions) as tuples. `whole`:
    every partition in one Spark task (a small output: the stored partitions read by one task instead of a task
    each, whose every task would deserialise the batch's whole plan)."""
    from pyspark.serializers import NoOpSerializer
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(df.schema)
    jrdd = jds.toArrowBatchRdd().toJavaRDD()  # serialized Arrow record batches, no schema in them
    if whole:
        jrdd = jrdd.coalesce(1)  # the partitions' batches one after another, no shuffle

    def read(partitions: list[int]) -> Iterator[tuple]:
        return _decoded(_load(df, jrdd, partitions, NoOpSerializer()), schema)

    yield from _stream(jrdd, read)


class Stored(Generic[T]):
    """The rows of a `materialised` DataFrame, as `make(tuple)`, streamed again on every iteration: from the stored
    partitions, not computed again (a stateful batch is not run twice). The exactly-once writer's second attempt
    after an unknown outcome (a commit timed out, a send_offsets that hung) reads the same rows in the same process,
    without failing the query for Spark to replay the batch after a restart."""

    def __init__(self, stored: Materialised, make: Callable[[tuple], T]):
        self._stored, self._make = stored, make

    def __iter__(self) -> Iterator[T]:
        m = self._stored
        if m.count == 0:  # no Spark job at all
            return iter(())
        return map(self._make, _arrow_tuples(m.df, m.scan, whole=m.count <= WHOLE_ROWS))


def _load(df: Any, jrdd: Any, partitions: list[int], serializer: Any) -> Iterator[Any]:
    from pyspark.util import _load_from_socket

    sc = df.sparkSession.sparkContext
    # Looked up once: py4j resolves a short class name by trying each of pyspark's imports in turn, and each miss
    # makes the JVM search every jar on its class path.
    runner = _python_rdd.get(id(sc._gateway))
    if runner is None:
        runner = _python_rdd[id(sc._gateway)] = sc._jvm.PythonRDD
    # read at once: the JVM's one-connection server does not wait long for a reader
    sock_info = runner.runJob(sc._jsc.sc(), jrdd, partitions)
    with _load_from_socket(sock_info, serializer) as stream:
        yield from stream


def _stream(jrdd: Any, read: Callable[[list[int]], Iterator[Any]]) -> Iterator[Any]:
    """The rows of every partition of `jrdd`, `read` a partition at a time. One partition (a small output coalesced to
    one: `_arrow_tuples`' `whole`) is consumed as its batches arrive, the next batch decoded while the caller is busy
    with the rows before; several are each collected whole, the next one fetched while the caller consumes this one."""
    n = jrdd.getNumPartitions()
    if n == 0:
        return
    if n == 1:
        yield from read([0])
        return

    def collect(partitions: list[int]) -> list[Any]:
        return list(read(partitions))

    with ThreadPoolExecutor(1, thread_name_prefix="partition-prefetch") as pool:
        pending = pool.submit(collect, [0])
        for i in range(n):
            partition = pending.result()
            if i + 1 < n:
                pending = pool.submit(collect, [i + 1])
            yield from partition
            del partition
