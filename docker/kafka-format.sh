#!/usr/bin/env bash
# docker-compose.yaml's one-shot `kafka-<n>-format`, run before node n's first start in the apache/kafka image with
# the node's own environment: formats its KRaft storage as onceflow_dev.broker.start_node formats an embedded node,
# with the cluster's CLUSTER_ID, the node's configuration, the options given here (kafka-storage.sh format
# options: `--feature ...`, `--ignore-formatted`) and the admin's SCRAM credential, `--add-scram`, written into the
# bootstrap metadata (KIP-900) so the brokers can authenticate to each other before any user could be created over
# the wire. The admin's password comes from the kafka_admin_password secret file (docker/kafka-admin.sh), never
# from the compose file: it is on kafka-storage.sh's command line inside this one-shot container only, for the
# seconds the format takes (the tool takes SCRAM credentials no other way).
#
# The configuration is the node's KAFKA_* environment translated as the image translates it when it starts
# (kafka.docker.KafkaDockerWrapper): "KAFKA_" removed, lower case, "_" -> ".", then "..." -> "-" and ".." -> "_",
# its launcher variables (KAFKA_OPTS, KAFKA_HEAP_OPTS, ...) left out. The image's start formats the storage too,
# without SCRAM; it finds it formatted here, says "already formatted" and starts the broker. (STORAGE_TOOL: another
# kafka-storage.sh, for tests/unit/test_compose.py.)
set -euo pipefail

: "${CLUSTER_ID:?CLUSTER_ID must be set, the same on every node}"
: "${KAFKA_NODE_ID:?KAFKA_NODE_ID must be set}"
launcher=" KAFKA_VERSION KAFKA_HEAP_OPTS KAFKA_LOG4J_OPTS KAFKA_OPTS KAFKA_JMX_OPTS KAFKA_JVM_PERFORMANCE_OPTS \
KAFKA_GC_LOG_OPTS KAFKA_LOG4J_ROOT_LOGLEVEL KAFKA_LOG4J_LOGGERS KAFKA_TOOLS_LOG4J_LOGLEVEL KAFKA_JMX_HOSTNAME "

source "$(dirname "${BASH_SOURCE[0]}")/kafka-admin.sh" # ADMIN_USER, ADMIN_PASSWORD, the listener's JAAS
umask 077 # the configuration holds the brokers' own password (the listener's JAAS configuration)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for name in $(compgen -e); do
    [[ $name == KAFKA_* && $launcher != *" $name "* ]] || continue
    key=${name//KAFKA_/}
    key=${key,,}
    key=${key//_/.}
    key=${key//.../-}
    key=${key//../_}
    printf '%s=%s\n' "$key" "${!name}"
done >"$work/server.properties"

scram="$KAFKA_SASL_MECHANISM_INTER_BROKER_PROTOCOL=[name=$ADMIN_USER,password=$ADMIN_PASSWORD]"
"${STORAGE_TOOL:-/opt/kafka/bin/kafka-storage.sh}" format --cluster-id "$CLUSTER_ID" --config "$work/server.properties" \
    "$@" --add-scram "$scram"
echo "kafka-format: node $KAFKA_NODE_ID of cluster $CLUSTER_ID formatted"
