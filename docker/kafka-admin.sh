# Sourced (bash) by docker/kafka-run.sh, docker/kafka-format.sh and docker/kafka-health.sh in the apache/kafka
# image: the Kafka admin's SCRAM login (User:onceflow-admin, a super user; the brokers authenticate to each other as
# it), its password read from the Docker secret ADMIN_PASSWORD_FILE (/run/secrets/kafka_admin_password), never
# from the compose file's environment or a command line. Sets ADMIN_PASSWORD and ADMIN_JAAS_VAR, and exports the
# inter-broker listener's JAAS configuration as the image's wrapper reads it:
#   KAFKA_LISTENER_NAME_<listener, "_" as "__">_<mechanism, "-" as "___">_SASL_JAAS_CONFIG
#   -> listener.name.<listener>.<mechanism>.sasl.jaas.config (onceflow_dev.broker.secured_properties)
: "${ADMIN_USER:?the Kafka admin user name, e.g. onceflow-admin}"
: "${ADMIN_PASSWORD_FILE:?the file holding the Kafka admin password (a Docker secret)}"
: "${KAFKA_INTER_BROKER_LISTENER_NAME:?}" "${KAFKA_SASL_MECHANISM_INTER_BROKER_PROTOCOL:?}"
ADMIN_PASSWORD=$(cat "$ADMIN_PASSWORD_FILE")
# it goes unescaped into a JAAS string and kafka-storage.sh's --add-scram [name=...,password=...]
_bad='[]["\,=[:space:]]'
if [[ -z $ADMIN_PASSWORD || $ADMIN_PASSWORD =~ $_bad ]]; then
    echo "kafka-admin: $ADMIN_PASSWORD_FILE is empty or holds a quote, backslash, comma, '=', ']' or a space" >&2
    exit 1
fi
_listener=${KAFKA_INTER_BROKER_LISTENER_NAME//_/__}
_mechanism=${KAFKA_SASL_MECHANISM_INTER_BROKER_PROTOCOL//-/___}
ADMIN_JAAS_VAR=KAFKA_LISTENER_NAME_${_listener}_${_mechanism}_SASL_JAAS_CONFIG
export "$ADMIN_JAAS_VAR=org.apache.kafka.common.security.scram.ScramLoginModule required username=\"$ADMIN_USER\" password=\"$ADMIN_PASSWORD\";"
unset _listener _mechanism _bad
