#!/usr/bin/env bash
# docker-compose.yaml's brokers' health check: a client of the SASL_SSL listener (there is no other), as the admin
# (docker/kafka-admin.sh: its password from the secret file), checking the broker's certificate against the CA. A
# broker that answers has its TLS, its SCRAM credentials and its metadata. (KAFKA_BIN: another bin/, for tests.)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/kafka-admin.sh"
umask 077
client=$(mktemp)
trap 'rm -f "$client"' EXIT
printf '%s\n' security.protocol=SASL_SSL "sasl.mechanism=$KAFKA_SASL_MECHANISM_INTER_BROKER_PROTOCOL" \
    "ssl.truststore.type=$KAFKA_SSL_TRUSTSTORE_TYPE" "ssl.truststore.location=$KAFKA_SSL_TRUSTSTORE_LOCATION" \
    "sasl.jaas.config=${!ADMIN_JAAS_VAR}" >"$client"
"${KAFKA_BIN:-/opt/kafka/bin}/kafka-broker-api-versions.sh" --bootstrap-server localhost:9092 \
    --command-config "$client" >/dev/null
