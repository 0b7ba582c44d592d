"""Checks that run before the job starts, so a misconfiguration fails at once with what to change."""

from __future__ import annotations

import socket

from confluent_kafka.admin import ConfigResource, ResourceType

from onceflow.config import ConfigError, Settings, check_transaction_timeout
from onceflow.kafka import clients as kafka_clients
from onceflow.kafka import topics
from onceflow.wire import OnceflowError


class PreflightError(OnceflowError):
    pass


class BrokerUnreachable(PreflightError):
    """Transient: a restarted job retries (a broker restart must not retire it); an operator's start refuses."""


def any_broker_listens(settings: Settings, timeout: float = 10.0) -> OSError | None:
    """None if one of the bootstrap brokers accepts a connection (one node of a cluster may be down), else the
    last error."""
    err: OSError | None = OSError("no bootstrap address")
    for host, port in settings.bootstrap_addresses:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return None
        except OSError as e:
            err = e
    return err


def broker_reachable(settings: Settings, timeout: float = 10.0) -> None:
    err = any_broker_listens(settings, timeout)
    if err is not None:
        raise BrokerUnreachable(
            f"cannot reach the Kafka broker at {settings.bootstrap_servers} ({err}): start it with "
            f"`onceflow-dev stack up`, or point ONCEFLOW_BOOTSTRAP_SERVERS at a running cluster"
        )
    refusals: list = []
    admin = kafka_clients.admin(settings, error_cb=refusals.append)  # a ConfigError (no credentials) goes up as is
    try:
        admin.list_topics(timeout=timeout)
    except Exception as e:
        admin.poll(1.0)  # serves the error callbacks: why the request went unanswered
        refused(settings, refusals)
        raise BrokerUnreachable(
            f"the broker at {settings.bootstrap_servers} does not answer metadata requests within {timeout:.0f} s: {e}"
        ) from None


def refused(settings: Settings, errors: list) -> None:
    """A secured cluster's refusal as what to change (librdkafka reports these to error_cb, and the request that
    waited on them just times out): wrong credentials, or a certificate the CA file does not vouch for."""
    from confluent_kafka import KafkaError

    for err in errors:
        if err.code() == KafkaError._AUTHENTICATION:
            raise PreflightError(
                f"Kafka at {settings.bootstrap_servers} refused to authenticate {settings.kafka_username or 'this client'}"
                f" ({err.str()}): check ONCEFLOW_KAFKA_USERNAME and ONCEFLOW_KAFKA_PASSWORD (or the login and password "
                f"of the Airflow connection), and that the user exists on the cluster"
            )
        if not settings.secured and err.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT):
            tls = next((f"{h}:{p}" for h, p in settings.bootstrap_addresses if _speaks_tls(h, p)), None)
            if tls:  # a plaintext client on a TLS listener only sees its connection dropped: say why
                raise PreflightError(
                    f"Kafka at {tls} speaks TLS and this client plaintext: the cluster is secured; set "
                    f"ONCEFLOW_KAFKA_SECURITY_PROTOCOL=SASL_SSL with the principal's credentials (docs/security.md)"
                )
        if err.code() == KafkaError._SSL or "SSL" in err.str():
            raise PreflightError(
                f"the TLS handshake with Kafka at {settings.bootstrap_servers} failed ({err.str()}): is the cluster "
                f"SASL_SSL (ONCEFLOW_KAFKA_SECURITY_PROTOCOL), and did the CA in {settings.kafka_ca} sign its "
                f"certificates (ONCEFLOW_KAFKA_CA_FILE)?"
            )


def _lacks(settings: Settings, resource: str, name: str, operation: str, role: str = "job") -> None:
    from onceflow.kafka import acls

    a = acls.Acl(f"User:{settings.kafka_username}", resource, name, "LITERAL", operation)
    raise PreflightError(
        f"{settings.kafka_username} lacks an ACL the {role} needs on {settings.bootstrap_servers} (docs/security.md):"
        f" {a} (grant: {a.command(settings.bootstrap_servers)})"
    )


def _speaks_tls(host: str, port: int, timeout: float = 3.0) -> bool:
    """Whether the listener completes a TLS handshake (certificate not checked: only the protocol is asked)."""
    import ssl

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw, ctx.wrap_socket(raw):
            return True
    except (OSError, ssl.SSLError):
        return False


def acls_granted(settings: Settings, role: str) -> None:
    """On a secured cluster, the ACLs the role needs on its topics and the cluster, named with the command that
    grants each missing one (docs/security.md)."""
    if not settings.secured:
        return
    from onceflow.kafka import security

    lacking = security.missing(settings, role)
    if lacking:
        raise PreflightError(
            f"{settings.kafka_username} lacks {len(lacking)} ACL(s) the {role} needs on {settings.bootstrap_servers} "
            f"(docs/security.md): "
            + "; ".join(f"{a} (grant: {a.command(settings.bootstrap_servers)})" for a in lacking)
        )


def broker_transaction_max_timeout_ms(settings: Settings, timeout: float = 10.0) -> int:
    """The smallest transaction.max.timeout.ms among the brokers that answer. A broker that is down (still listed
    until the controller fences it) is skipped: one node out of a replicated cluster must not keep the job from
    starting, and it is checked again at the next start."""
    admin = kafka_clients.admin(settings)
    brokers = admin.list_topics(timeout=timeout).brokers
    res = {b: ConfigResource(ResourceType.BROKER, str(b)) for b in sorted(brokers)}
    # one call per broker (a broker's configs are asked of that broker), all in flight at once
    futures = {b: admin.describe_configs([r], request_timeout=timeout)[r] for b, r in res.items()}
    values, errors = [], []
    for b, f in futures.items():
        try:
            values.append(int(f.result(timeout + 1)["transaction.max.timeout.ms"].value))
        except Exception as e:
            errors.append(f"broker {b}: {e!r}")
    if not values and any("CLUSTER_AUTHORIZATION_FAILED" in e for e in errors):
        _lacks(settings, "CLUSTER", "kafka-cluster", "DESCRIBE_CONFIGS")
    if not values:
        raise BrokerUnreachable(
            f"no broker at {settings.bootstrap_servers} answered a describe-configs request within {timeout:.0f} s "
            f"({'; '.join(errors)})"
        )
    return min(values)


DLQ_OVERHEAD_BYTES = 8192  # the DLQ record's key and provenance headers, with room to spare


def dlq_fits(settings: Settings, timeout: float = 10.0) -> None:
    """A DLQ copy (capped at dlq_max_value_bytes) plus its provenance must fit the DLQ topic's record limit, or a
    large malformed record would fail its batch for good."""
    admin = kafka_clients.admin(settings)  # held: a collected client fails its pending futures
    res = ConfigResource(ResourceType.TOPIC, settings.dlq_topic)
    limit = int(admin.describe_configs([res])[res].result(timeout)["max.message.bytes"].value)
    need = settings.dlq_max_value_bytes + DLQ_OVERHEAD_BYTES
    if limit < need:
        raise PreflightError(
            f"the DLQ topic {settings.dlq_topic} accepts records up to {limit} bytes "
            f"(max.message.bytes), but a DLQ copy may need {need}: raise max.message.bytes on the "
            f"topic, or lower ONCEFLOW_DLQ_MAX_VALUE_BYTES to at most {limit - DLQ_OVERHEAD_BYTES}"
        )


def source_timestamp_types(settings: Settings, timeout: float = 10.0) -> dict[str, str]:
    """How each source topic stamps its records: `LogAppendTime` (the broker's clock; the platform creates its
    source topics so) or `CreateTime` (each producer's own clock). The skew rule judges an event time against this
    timestamp, so on CreateTime a producer whose clock runs ahead stamps both alike and passes it (docs/operations.md)."""
    admin = kafka_clients.admin(settings)  # held: a collected client fails its pending futures
    res = [ConfigResource(ResourceType.TOPIC, t) for t in settings.source_topic_list]
    futs = admin.describe_configs(res)
    return {r.name: str(futs[r].result(timeout)["message.timestamp.type"].value) for r in res}


CREATE_TIME_ADVICE = (
    "the source topic {topic} keeps its producers' timestamps (message.timestamp.type=CreateTime): a producer "
    "whose clock runs ahead stamps its records and their event times alike, the skew rule cannot see it, and its "
    "records move the watermark ahead of every honest one. Judge them against the broker's clock: "
    "kafka-configs.sh --bootstrap-server {servers} --alter --entity-type topics --entity-name {topic} "
    "--add-config message.timestamp.type=LogAppendTime (docs/operations.md)"
)


def check_job(settings: Settings) -> dict:
    """Everything the streaming job needs before it may start; raises PreflightError/ConfigError."""
    broker_reachable(settings)
    acls_granted(settings, "job")
    problems = topics.check(settings, only=topics.job_topics(settings))
    if problems:
        raise PreflightError("; ".join(problems))
    dlq_fits(settings)
    broker_max = broker_transaction_max_timeout_ms(settings)
    check_transaction_timeout(settings.transaction_timeout_ms, broker_max)
    stamps = source_timestamp_types(settings)
    create_time = sorted(t for t, kind in stamps.items() if kind != "LogAppendTime")
    return {
        "broker_transaction_max_timeout_ms": broker_max,
        # LogAppendTime only when every source topic is so stamped; else the first that is not (for the advice)
        "source_timestamp_type": "CreateTime" if create_time else "LogAppendTime",
        "source_create_time_topic": create_time[0] if create_time else "",
    }


__all__ = ["PreflightError", "BrokerUnreachable", "ConfigError", "check_job", "broker_reachable"]
