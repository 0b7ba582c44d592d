"""Files the platform needs at run time, shipped in the package: the Spark driver's log4j2 configuration and the
Maven description of Spark's Kafka connector (onceflow.runtime.jvm), with the settings that keep Maven on Maven
Central, and the Java source of the checkpoint's local file system (onceflow.runtime.local_fs)."""

from pathlib import Path

HERE = Path(__file__).resolve().parent
LOG4J = HERE / "log4j2-job.properties"
MAVEN_SETTINGS = HERE / "maven" / "settings.xml"
MAVEN_POMS = HERE / "maven"
JAVA = HERE / "java"
