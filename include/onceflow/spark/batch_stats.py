"""What Spark knows about the running micro-batch that PySpark does not expose: the newest event time it read.

Spark computes the next watermark from the event-time statistics of the plan's `EventTimeWatermarkExec`
(an accumulator, complete once the batch's tasks finished) after foreachBatch returns; the job needs the same
number inside foreachBatch to decide whether to run a close-out batch at once (onceflow.rules.pacing). It is read
through the query's current IncrementalExecution over py4j: internal API, so any surprise yields None and the
job falls back to the plain trigger cadence. Only scheduling depends on it, never what is written.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)
_warned: list[bool] = []


def _find(node, simple_name: str, depth: int = 0):
    if depth > 64:
        return None
    if node.getClass().getSimpleName() == simple_name:
        return node
    children = node.children()
    for i in range(children.size()):
        found = _find(children.apply(i), simple_name, depth + 1)
        if found is not None:
            return found
    return None


def max_event_ms(query) -> int | None:
    """The newest event time (ms) the current batch of `query` read, or None (no valid event, or unknown)."""
    try:
        execution = query._jsq.streamingQuery().lastExecution()
        node = _find(execution.executedPlan(), "EventTimeWatermarkExec")
        if node is None:
            return None
        stats = node.eventTimeStats().value()
        return int(stats.max()) if int(stats.count()) > 0 else None
    except Exception as e:  # an internal API changed: pace by the trigger alone, say so once
        if not _warned:
            _warned.append(True)
            log.warning("cannot read the batch's event-time statistics (%s); close-out batches are off", e)
        return None
