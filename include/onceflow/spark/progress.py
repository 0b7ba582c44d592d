"""Spark's streaming-query progress events in Python, as the JSON Spark writes for each (`StreamingQueryProgress.json`).

pyspark's own listener bridge converts each progress field by field over py4j, and every Java map it turns into a
dict (durations, event time, each operator's and source's metrics) ends its iteration on a Java exception, which
pyspark converts by asking the JVM for a dozen exception classes, by names the JVM looks up in every jar on the
class path and does not find. Measured on the job at 200 records/s (Java Flight Recorder, 120 s): the listener's
thread took a tenth of the driver JVM's CPU samples, nearly all in those lookups. Here each event crosses once, as
one string.
"""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener


class _Bridge:
    """The Java side's view of a JsonProgressListener (py4j implements the interface with this object)."""

    def __init__(self, listener: JsonProgressListener):
        self.listener = listener

    def onQueryStarted(self, jevent: Any) -> None:
        pass

    def onQueryProgress(self, jevent: Any) -> None:
        self.listener.on_progress(json.loads(jevent.progress().json()))

    def onQueryIdle(self, jevent: Any) -> None:
        self.listener.on_idle()

    def onQueryTerminated(self, jevent: Any) -> None:
        pass

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


class JsonProgressListener(StreamingQueryListener):
    """A listener that gets each progress report as Spark's JSON of it (a dict), and each idle notice; add it with
    `spark.streams.addListener`."""

    def on_progress(self, progress: dict[str, Any]) -> None:
        """A batch's progress report (Spark's `StreamingQueryProgress` as JSON)."""

    def on_idle(self) -> None:
        """The query is waiting for new data."""

    @property
    def _jlistener(self) -> Any:  # pyspark's addListener registers this object with the JVM
        if not hasattr(self, "_jlistenerobj"):
            from pyspark import SparkContext

            wrapper = SparkContext._jvm.PythonStreamingQueryListenerWrapper  # type: ignore[union-attr]
            self._jlistenerobj = wrapper(_Bridge(self))
        return self._jlistenerobj

    # pyspark's abstract methods: never called, the bridge above takes the events
    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        pass

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass
