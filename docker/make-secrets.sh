#!/usr/bin/env bash
# Makes docker-compose.yaml's secrets, one file each in DIR (default var/compose-secrets, git-ignored), keeping any
# that exists:   bash docker/make-secrets.sh [DIR]
# Random, 32 bytes each: hex (safe unescaped in JAAS strings, --add-scram, JSON and URLs), the Fernet key as
# url-safe base64. The directory is 0700 (the operator's alone); the files 0444, since compose mounts them
# read-only into containers running as other users (Airflow 50000, Spark 185, Kafka 1000, Postgres).
# To change one later: the Kafka admin's password is in the cluster's metadata (alter its SCRAM credential with
# kafka-configs.sh first), the roles' are re-applied by airflow-init, the keystore's makes a new CA; a new Fernet
# key makes stored connections unreadable (rotate with `airflow rotate-fernet-key`).
set -euo pipefail
dir=${1:-$(dirname "${BASH_SOURCE[0]}")/../var/compose-secrets}
umask 077
mkdir -p "$dir"
chmod 0700 "$dir"
hex() { head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
for name in kafka_admin_password kafka_job_password kafka_backfill_password kafka_control_password \
    kafka_reconcile_password kafka_keystore_password airflow_db_password airflow_api_secret_key \
    airflow_jwt_secret spark_auth_secret airflow_fernet_key postgres_sink_job_password \
    postgres_sink_reader_password; do
    [[ -s $dir/$name ]] && continue
    if [[ $name == airflow_fernet_key ]]; then
        head -c 32 /dev/urandom | base64 | tr '+/' '-_' >"$dir/$name.new"
    else
        hex >"$dir/$name.new"
    fi
    chmod 0444 "$dir/$name.new"
    mv "$dir/$name.new" "$dir/$name"
    echo "made $dir/$name"
done
