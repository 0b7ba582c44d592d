"""An app's JVM functions (App.java) in a Spark session: find a compiled class on the session's class path, and register
a Java UDF object made from it under a name the plan calls (`F.call_function(name, ...)`).

The object is made in Python with the arguments it needs (the access-log rules get their regular expressions from
rules.py), which `spark.udf.registerJavaFunction` cannot do: it makes the object itself, without arguments.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.types import DataType

from onceflow import wire


class NotOnClassPath(wire.OnceflowError):
    """The session was built without the app's jar: the message says how a session gets it. A misconfiguration:
    the job stops (exit 2) rather than restart into the same session."""

    exit_code = wire.EXIT_CONFIG


def java_class(spark: SparkSession, name: str) -> Any:
    """The class `name` (fully qualified) of the session's JVM, to call as a constructor."""
    from py4j.java_gateway import JavaClass

    jvm = spark._jvm
    assert jvm is not None  # a classic session's gateway (the platform runs no Spark Connect)
    found = jvm
    for part in name.split("."):
        found = getattr(found, part)
    if not isinstance(found, JavaClass):
        raise NotOnClassPath(
            f"{name} is not on this Spark session's class path: an app's JVM functions (App.java) are compiled and "
            f"added to the sessions onceflow builds (a launch's --jars, onceflow.runtime.launcher.local_session); a "
            f"session of your own needs the jar of onceflow.runtime.app_jars in spark.jars"
        )
    return found


def register(spark: SparkSession, name: str, function: Any, returns: DataType) -> str:
    """`function` (a Java UDF1..UDF22 object) as the session's function `name`, returning `returns`; `name` back.
    Registering a name again replaces it: each plan built in a session may register what it calls."""
    js = spark._jsparkSession
    js.udf().register(name, function, js.parseDataType(returns.json()))
    return name
