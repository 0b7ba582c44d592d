"""A DataFrame's rows on the driver a partition at a time: each partition is collected by a Spark job of its own and
is garbage once read; the next partition is collected while the current one is consumed.

Why not `DataFrame.toLocalIterator`: in pyspark 4.2 the driver JVM holds on to the partitions it has served until
the iteration ends. Measured (local[2], 2,000,000 output-like rows in 64 partitions, a consumer slower than Spark):
toLocalIterator runs a 512 MiB driver out of heap at partition 46 of 64, with or without prefetch; this stream
completes in the same 512 MiB. The driver holds at most two partitions (the one being consumed, as Python rows,
and the next one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

T = TypeVar("T")
# Up to this many rows (a few MB) a stored output is fetched by one Spark job, in one task.
WHOLE_ROWS = 50_000
_python_rdd: dict[int, Any] = {}  # per JVM gateway: PythonRDD's class


@contextmanager
def materialised(df: Any) -> Iterator[int]:
    """Compute every partition of `df` now, into the executors' block stores (memory, spilling to disk), and yield
    its row count; streaming it afterwards (`tuples`, `rows`) only reads the stored partitions. The exactly-once
    writer opens its transaction inside this block, so that the batch's compute (read, parse, shuffle, both
    branches of a union) runs before the transaction and only producing runs against its timeout. A lost block
    (a worker gone) is recomputed from the lineage, as any Spark task is. The blocks are dropped when the block
    ends."""
    from pyspark import StorageLevel

    df.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        yield df.count()
    finally:
        df.unpersist(blocking=False)


def rows(df: Any) -> Iterator[Any]:
    """Every row of `df` (pyspark Rows), partition by partition, in partition order; each partition is computed
    once (as toLocalIterator does, one job per partition: the stages before it run once and are reused)."""
    from pyspark.serializers import BatchedSerializer, CPickleSerializer

    jrdd = df._jdf.javaToPython()  # pickled rows, made in the executors' JVMs (no Python on the executors)
    serializer = BatchedSerializer(CPickleSerializer())
    yield from _stream(jrdd, lambda ps: list(_load(df, jrdd, ps, serializer)))


def tuples(df: Any, whole: bool = False) -> Iterator[tuple]:
    """As `rows`, as plain tuples, moved as Arrow record batches instead of pickled Rows: the executors' JVMs
    write Arrow, the driver reads each batch's columns at once (no Row object per row). `whole`: every partition
    in one Spark task (a small output: the stored partitions read by one task instead of a task each, whose every
    task would deserialise the batch's whole plan; a cached frame's `coalesce` reads its stored blocks)."""
    import pyarrow as pa
    from pyspark.serializers import NoOpSerializer
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(df.schema)
    if whole:
        df = df.coalesce(1)
    jrdd = df._jdf.toArrowBatchRdd().toJavaRDD()  # serialized Arrow record batches, no schema in them

    def collect(partitions: list[int]) -> list[tuple]:
        out: list[tuple] = []
        for blob in _load(df, jrdd, partitions, NoOpSerializer()):
            batch = pa.ipc.read_record_batch(pa.py_buffer(blob), schema)
            out.extend(zip(*(c.to_pylist() for c in batch.columns), strict=True))
        return out

    yield from _stream(jrdd, collect)


class Stored(Generic[T]):
    """The rows of a DataFrame being `materialised`, as `make(tuple)`, streamed (`tuples`) again on every iteration:
    from the stored partitions, not computed again (a stateful batch is not run twice). The exactly-once writer's
    second attempt after an unknown outcome (a commit timed out, a send_offsets that hung) reads the same rows in the
    same process, without failing the query for Spark to replay the batch after a restart."""

    def __init__(self, df: Any, make: Callable[[tuple], T], count: int | None = None):
        """`count`: the rows `materialised` found (none: no Spark job at all; a few: one job of one task)."""
        self._df, self._make, self._count = df, make, count

    def __iter__(self) -> Iterator[T]:
        if self._count == 0:
            return iter(())
        whole = self._count is not None and self._count <= WHOLE_ROWS
        return (self._make(t) for t in tuples(self._df, whole))


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


def _stream(jrdd: Any, collect: Any) -> Iterator[Any]:
    n = jrdd.getNumPartitions()
    if n == 0:
        return
    if n == 1:  # a small output coalesced to one partition (tuples' `whole`): nothing to fetch ahead
        yield from collect([0])
        return
    with ThreadPoolExecutor(1, thread_name_prefix="partition-prefetch") as pool:
        pending = pool.submit(collect, [0])
        for i in range(n):
            partition = pending.result()
            if i + 1 < n:
                pending = pool.submit(collect, [i + 1])
            yield from partition
            del partition
