#!/usr/bin/env bash
# docker-compose.yaml's Spark master and workers: spark-class with Spark's authentication and encryption on
# (spark.authenticate, spark.network.crypto.enabled), keyed by the spark_auth_secret Docker secret.
# Spark standalone does not read spark.authenticate.secret.file (SecurityManager allows secret files on
# Kubernetes only) and needs spark.authenticate.secret in its configuration: it is written here into
# $SPARK_CONF_DIR/spark-defaults.conf, 0600, which the master and the worker load at start (the worker hands the
# secret to its executors through their environment, never their command line). The same file the Airflow
# containers' entrypoint (docker/airflow-entrypoint.py) writes for the driver. umask 002: the executors' files on
# the shared onceflow-var volume stay writable by its group (0), which the driver (uid 50000) is in.
# (SPARK_HOME: another spark-class, for tests/unit/test_compose.py.)
set -euo pipefail
: "${SPARK_AUTH_SECRET_FILE:?the file holding the Spark shared secret (a Docker secret)}"
: "${SPARK_CONF_DIR:?where spark-defaults.conf is written}"
secret=$(cat "$SPARK_AUTH_SECRET_FILE")
if [[ -z $secret || $secret =~ [[:space:]] ]]; then
    echo "spark-run: $SPARK_AUTH_SECRET_FILE is empty or holds a space" >&2
    exit 1
fi
umask 077
mkdir -p "$SPARK_CONF_DIR"
printf '%s %s\n' spark.authenticate true spark.authenticate.secret "$secret" spark.network.crypto.enabled true \
    spark.hadoop.fs.permissions.umask-mode 002 >"$SPARK_CONF_DIR/spark-defaults.conf"
unset secret
umask 002
exec "${SPARK_HOME:-/opt/spark}/bin/spark-class" "$@"
