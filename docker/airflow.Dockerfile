# Airflow with onceflow installed (unverified by CI: no Docker engine on the development machines).
FROM apache/airflow:3.3.2-python3.11
USER root
# a JDK, not only a JRE: the shipped apps' JVM functions (App.java) and the checkpoint's local file system are compiled
# with javac on first use (onceflow.runtime.javac)
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jdk-headless maven curl \
    && rm -rf /var/lib/apt/lists/*
USER airflow
COPY --chown=airflow requirements.txt constraints.txt pyproject.toml /opt/onceflow/
# the runtime package only: development tooling (include/onceflow_dev) stays out of the image
COPY --chown=airflow include/onceflow /opt/onceflow/include/onceflow
# the apps that ship with onceflow (found through their `onceflow.apps` entry points once installed)
COPY --chown=airflow include/onceflow_apps /opt/onceflow/include/onceflow_apps
COPY --chown=airflow dags /opt/onceflow/dags
COPY --chown=airflow plugins /opt/onceflow/plugins
RUN pip install --no-cache-dir -r /opt/onceflow/requirements.txt -c /opt/onceflow/constraints.txt \
    && pip install --no-cache-dir --no-deps -e /opt/onceflow
