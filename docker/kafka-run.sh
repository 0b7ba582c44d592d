#!/usr/bin/env bash
# docker-compose.yaml's brokers: the apache/kafka image's start (/etc/kafka/docker/run), with the admin's login
# (the inter-broker listener's JAAS configuration) built from the kafka_admin_password secret file by
# docker/kafka-admin.sh. The password is thus in the broker process's environment and the server.properties the
# image writes inside the container, as with any broker, but not in the compose file, `docker inspect` or a command
# line. (KAFKA_RUN: a stand-in start, for tests/unit/test_compose.py.)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/kafka-admin.sh"
unset ADMIN_PASSWORD
exec "${KAFKA_RUN:-/etc/kafka/docker/run}"
