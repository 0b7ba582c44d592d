"""onceflow.spark.driver_heap against a real JVM (the test session's): the old generation read and collected over
py4j, and the collectors the job leaves alone."""

from onceflow.spark import driver_heap


def _collections(jvm) -> int:
    return sum(
        int(b.getCollectionCount()) for b in jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    )


def test_the_drivers_old_generation_is_read_and_a_full_collection_runs(spark):
    jvm = spark.sparkContext._jvm
    pools = {p.getName(): p for p in jvm.java.lang.management.ManagementFactory.getMemoryPoolMXBeans()}
    ours = {c for c, name in driver_heap.OLD_POOLS.items() if name in pools}
    assert driver_heap.DriverHeap.of(spark, "g1") is None, "G1's pauses are short: the JVM collects alone"
    for collector in set(driver_heap.OLD_POOLS) - ours:  # a JVM under another collector has no such pool
        assert driver_heap.DriverHeap.of(spark, collector) is None
    # the session runs under whichever collector the JVM picked; the same calls on its old generation's pool
    heap = (
        driver_heap.DriverHeap.of(spark, ours.pop())
        if ours
        else driver_heap.DriverHeap(jvm, next(p for n, p in pools.items() if "Old" in n or "Tenured" in n))
    )
    assert heap is not None
    used, committed = heap.old_used()
    assert 0 <= used <= committed and committed > 0
    before = _collections(jvm)
    heap.collect()
    assert _collections(jvm) > before
