#!/usr/bin/env bash
# docker-compose.yaml's one-shot `kafka-certs`: the brokers' CA and certificate, made with the JRE's keytool as
# onceflow_dev.tls makes them for the secured embedded stack. A private CA (basic constraints CA:true) signs one
# certificate, BROKER_DNAME (CN=onceflow-kafka), for both ends of a connection (serverAuth and clientAuth): brokers
# present it to clients, and to each other on the controller listener, where it is their identity (a super user).
# Its SAN (BROKER_SAN) names every broker as the others and the clients reach it, and localhost (the health check).
#
# Writes, in SECRETS_DIR (the brokers' volume, read-only there, nobody else mounts it):
#   broker.p12       the brokers' keystore (PKCS12: key, certificate, CA), password KEYSTORE_PASSWORD (read from
#                    the file KEYSTORE_PASSWORD_FILE names: the kafka_keystore_password Docker secret)
#   broker.password  that password: the apache/kafka image reads ssl.keystore.password and ssl.key.password from it
#                    (KAFKA_SSL_KEYSTORE_CREDENTIALS, KAFKA_SSL_KEY_CREDENTIALS)
#   ca.pem           the CA's certificate, the brokers' truststore
# and the CA's certificate alone in CA_DIR (the clients' volume: Airflow, the Spark workers).
# The CA's private key is deleted once it has signed. Runs as root (CA_DIR is a fresh, root-owned volume) and hands
# the brokers' files to the image's user. Kept across runs while KEYSTORE_PASSWORD opens the keystore and the
# certificate request (BROKER_DNAME, BROKER_SAN) is unchanged; made anew otherwise (the brokers then restart with it,
# clients read the new CA at their next connection). Passwords reach keytool through its environment (-storepass:env),
# never on a command line.
set -euo pipefail

: "${KEYSTORE_PASSWORD_FILE:?the file holding the keystore password (the kafka_keystore_password secret)}"
KEYSTORE_PASSWORD=$(cat "$KEYSTORE_PASSWORD_FILE")
: "${KEYSTORE_PASSWORD:?$KEYSTORE_PASSWORD_FILE is empty}"
export KEYSTORE_PASSWORD # for keytool's -storepass:env, in this process's environment only
: "${BROKER_DNAME:?the brokers distinguished name, e.g. CN=onceflow-kafka}"
: "${BROKER_SAN:?the brokers subject alternative names, e.g. dns:kafka-1,dns:localhost}"
: "${SECRETS_DIR:?where the brokers read their keystore}"
: "${CA_DIR:?where clients read the CA certificate}"
BROKER_USER=${BROKER_USER:-appuser} # the apache/kafka image's user
VALIDITY_DAYS=${VALIDITY_DAYS:-3650}

request="dname=$BROKER_DNAME san=$BROKER_SAN"
keystore=$SECRETS_DIR/broker.p12

if [[ -s $keystore && -s $SECRETS_DIR/ca.pem && -s $CA_DIR/ca.pem ]] \
    && [[ "$(cat "$SECRETS_DIR/broker.request" 2>/dev/null)" == "$request" ]] \
    && keytool -list -storetype PKCS12 -keystore "$keystore" -storepass:env KEYSTORE_PASSWORD >/dev/null 2>&1; then
    echo "kafka-certs: keeping the CA and the broker certificate in $SECRETS_DIR ($request)"
    exit 0
fi

umask 077
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pw=(-storepass:env KEYSTORE_PASSWORD -keypass:env KEYSTORE_PASSWORD)
key=(-storetype PKCS12 -keyalg RSA -keysize 2048 -validity "$VALIDITY_DAYS")

keytool -genkeypair -alias ca -dname CN=onceflow-ca -ext bc:c -keystore "$work/ca.p12" "${key[@]}" "${pw[@]}"
keytool -exportcert -rfc -alias ca -keystore "$work/ca.p12" -storepass:env KEYSTORE_PASSWORD -file "$work/ca.pem"
keytool -genkeypair -alias broker -dname "$BROKER_DNAME" -ext "SAN=$BROKER_SAN" \
    -keystore "$work/broker.p12" "${key[@]}" "${pw[@]}"
keytool -certreq -alias broker -keystore "$work/broker.p12" -storepass:env KEYSTORE_PASSWORD -file "$work/broker.csr"
keytool -gencert -alias ca -keystore "$work/ca.p12" -storepass:env KEYSTORE_PASSWORD -rfc -validity "$VALIDITY_DAYS" \
    -ext "SAN=$BROKER_SAN" -ext ku:c=digitalSignature,keyEncipherment -ext eku=serverAuth,clientAuth \
    -infile "$work/broker.csr" -outfile "$work/broker.pem"
keytool -importcert -noprompt -alias ca -file "$work/ca.pem" -keystore "$work/broker.p12" \
    -storepass:env KEYSTORE_PASSWORD
keytool -importcert -noprompt -alias broker -file "$work/broker.pem" -keystore "$work/broker.p12" \
    -storepass:env KEYSTORE_PASSWORD
printf '%s' "$KEYSTORE_PASSWORD" >"$work/broker.password" # no newline: the image reads it with $(cat ...)
printf '%s' "$request" >"$work/broker.request"
# $work/ca.p12, the CA's private key, goes with $work: it signs nothing more

for f in broker.p12 broker.password broker.request ca.pem; do
    cp "$work/$f" "$SECRETS_DIR/$f.new"
    chown "$BROKER_USER" "$SECRETS_DIR/$f.new"
    chmod 0400 "$SECRETS_DIR/$f.new"
    mv -f "$SECRETS_DIR/$f.new" "$SECRETS_DIR/$f"
done
chmod 0444 "$SECRETS_DIR/ca.pem"
cp "$work/ca.pem" "$CA_DIR/ca.pem.new"
chmod 0444 "$CA_DIR/ca.pem.new"
mv -f "$CA_DIR/ca.pem.new" "$CA_DIR/ca.pem"
chmod 0755 "$CA_DIR"
echo "kafka-certs: made a CA and the broker certificate ($request) in $SECRETS_DIR; CA certificate in $CA_DIR/ca.pem"
