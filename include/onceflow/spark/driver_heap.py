"""The driver JVM's old generation, read and collected over py4j.

Under a stop-the-world collector (parallel or serial: Settings.jvm_gc) the old generation is collected when it
fills, in whichever batch is allocating at that moment: a pause of a few hundred milliseconds on that window's
result. The job waits seconds between a window's batches and the next (close-out pacing), so it asks for the same
collection there, before the JVM would take it (onceflow.runtime.driver_state.collect_while_idle decides,
onceflow.runtime.batch_writer waits). Read through the JVM's memory pool beans (public API); a JVM whose old
generation is not found gets no collections from the job.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

# The old generation's pool under the collectors the job runs its idle collections for (HotSpot's names)
OLD_POOLS = {"parallel": "PS Old Gen", "serial": "Tenured Gen"}


class DriverHeap:
    """The old generation's occupancy and a full collection of the driver JVM, `jvm` being py4j's view of it."""

    def __init__(self, jvm: Any, pool: Any):
        self.jvm, self.pool = jvm, pool

    @classmethod
    def of(cls, spark: Any, collector: str) -> DriverHeap | None:
        """The driver's heap under `collector` (Settings.jvm_gc), or None where the job leaves collections to the JVM:
        a collector with short pauses of its own (G1), or a JVM whose old generation is not found."""
        name = OLD_POOLS.get(collector)
        if name is None:
            return None
        jvm = spark.sparkContext._jvm
        for pool in jvm.java.lang.management.ManagementFactory.getMemoryPoolMXBeans():
            if pool.getName() == name:
                return cls(jvm, pool)
        log.info("the driver JVM has no memory pool %r: its old generation is collected by the JVM alone", name)
        return None

    def old_used(self) -> tuple[int, int]:
        """The old generation's used and committed bytes."""
        usage = self.pool.getUsage()
        return int(usage.getUsed()), int(usage.getCommitted())

    def collect(self) -> None:
        """A full collection now (System.gc(): a full stop-the-world collection under these collectors)."""
        self.jvm.java.lang.System.gc()
