"""The jar of the JVM functions an app brings (App.java), compiled on first use and put on the class path of every Spark
session that runs the app's plan: spark-submit's `--jars` of the job, the recount and backfills
(onceflow.runtime.launcher), the in-process sessions of the CLI.

Compiled against every jar pyspark ships (Spark's SQL API for a UDF, Jackson, Hadoop), into one jar per content
(`<jvm_dir>/app-java/`): two apps that share their sources (ip_count and ip_networks share the access-log rules) share
the jar. Spark ships the jar to executors with the job, on this machine or a cluster's; in a Kubernetes image it is
built with the image (docker/airflow.Dockerfile).
"""

from __future__ import annotations

from pathlib import Path

from onceflow.app import App
from onceflow.config import Settings
from onceflow.runtime import javac
from onceflow.wire import OnceflowError

JAR_NAME = "app-java"


class AppJarError(OnceflowError):
    """An app's JVM functions could not be compiled: the message says what to change."""


def jars(settings: Settings) -> list[Path]:
    """The jars of the app `settings` runs (none when it brings no JVM functions)."""
    return jars_of(settings, settings.declared_app())


def jars_of(settings: Settings, app: App) -> list[Path]:
    if not app.java:
        return []
    roots = [Path(p) for p in app.java]
    try:
        return [javac.jar(settings, JAR_NAME, javac.sources(roots), javac.classpath(["*.jar"]))]
    except javac.JavacError as e:
        raise AppJarError(
            f"app {app.name} calls JVM functions of its own ({', '.join(map(str, roots))}): {e}"
        ) from None
