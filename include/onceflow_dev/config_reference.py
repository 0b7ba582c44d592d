"""docs/configuration.md, generated from onceflow.config: every setting with its environment variable, type,
default and what it does (the comments above each field in config.py), by section.

    python -m onceflow_dev.config_reference > docs/configuration.md     (make docs)

tests/unit/test_config_reference.py fails when the file differs from what this prints, so a setting cannot be
added without its line in the reference, nor without a comment that says what it does.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import sys
from pathlib import Path
from typing import Any

from onceflow import config
from onceflow.rules import names

SECTION = re.compile(r"#\s*---\s*(.+?)\s*---\s*$")

# Fields whose meaning the comment of the field above them carries (a group under one comment).
SHARED_COMMENT = {
    "sink_topic": "source_topic",
    "dlq_topic": "source_topic",
    "ledger_topic": "source_topic",
    "backfill_topic": "source_topic",
    "producer_batch_messages": "producer_linger_ms",
    "txn_watch_interval_s": "health_interval_s",
    "reconcile_interval_minutes": "health_interval_s",
}
# Fields whose name says it all, and nothing in config.py comments them.
FALLBACK = {
    "bootstrap_servers": "The Kafka bootstrap list (host:port, comma-separated).",
    "controller_port": "The embedded stack's KRaft controller port (node i: + 10 * (i - 1)).",
    "events_topic": "Shared by every app: savepoints, restores, quarantines, backfills.",
    "alerts_topic": "Shared by every app: alert records (raised and resolved).",
    "health_topic": "Shared by every app: the health checks' records.",
    "reconciliation_topic": "Shared by every app: the reconciliation runs' results.",
    "source_partitions": "Partitions of the source topic the platform creates.",
    "sink_partitions": "Partitions of the sink topic the platform creates.",
    "replication_factor": "Replication of the topics the platform creates (3 on a multi-node embedded stack).",
    "min_insync_replicas": "min.insync.replicas of those topics (2 on a multi-node embedded stack).",
    "broker_heap": "Heap of each embedded Kafka node's JVM.",
    "kafka_sasl_mechanism": "The SASL mechanism on a SASL_SSL cluster.",
    "kafka_username": "The principal's name on a SASL_SSL cluster (or the login of the Airflow connection).",
    "master": "Spark's master: local[N], spark://host:port, k8s://..., yarn.",
    "shuffle_partitions": "spark.sql.shuffle.partitions of the job (fixed by its checkpoint).",
    "min_batches_to_retain": "spark.sql.streaming.minBatchesToRetain: checkpoint batches kept.",
    "window_s": "The length of an event-time window (ip_count: tumbling).",
    "watermark_s": "How late an event may be (event time behind the watermark) before its window is final.",
    "starting_offsets": "Where a new app starts reading its source: earliest or latest.",
    "near_timeout_fraction": "A transaction open this share of its timeout is reported as near its timeout.",
    "driver_memory": "The Spark driver's memory.",
    "executor_memory": "Each Spark executor's memory (on a cluster).",
    "executor_cores": "Each Spark executor's cores (on a cluster).",
    "rotation_interval_minutes": "How often the rotation DAG takes a savepoint and prunes old ones.",
    "checkpoint_size_alert_bytes": "The checkpoint's size above which rotation alerts.",
    "restart_attempts": "Restarts of a crashed job by its supervisor before it gives up.",
    "restart_delay_s": "The supervisor's fixed delay before a restart.",
    "airflow_port": "The embedded Airflow's api-server port.",
    "alert_webhook_conn_id": "The Airflow connection of the webhook alert channel.",
    "alert_slack_conn_id": "The Airflow connection of the Slack alert channel.",
    "alert_smtp_conn_id": "The Airflow connection of the e-mail alert channel.",
    "alert_email_to": "Where e-mail alerts go (comma-separated addresses).",
    "health_restart_window_s": "The window over which health counts its restarts.",
    "k8s_namespace": "Kubernetes cluster mode: the namespace.",
    "k8s_service_account": "Kubernetes cluster mode: the driver's service account.",
    "k8s_kafka_secret_mount": "Kubernetes cluster mode: where the Kafka secret is mounted.",
    "app_root_in_image": "Kubernetes cluster mode: where onceflow is installed in the image.",
    "savepoint_uri": "Where savepoints go; empty: <var_dir>/savepoints/<app_id>.",
    "var_dir": "Where runtime state lives: checkpoints, savepoints, pid, status and log files, the embedded stack.",
    "trigger_interval_s": "The micro-batch trigger (with close-out batches, the pace between batches that close no window).",
    "checkpoint_freshness_threshold_s": "Health: the checkpoint not written for this long while the job runs is stale.",
    "fault": "Fault injection for tests (onceflow.faults); empty: off.",
}


def _comments(source: str) -> tuple[dict[str, str], dict[str, str]]:
    """Each field's comment (the contiguous comment lines right above it, then its inline comment) and its
    section."""
    lines = source.splitlines()
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == config.Settings.__name__)
    comments: dict[str, str] = {}
    sections: dict[str, str] = {}
    section = ""
    last_end = cls.lineno
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above: list[str] = []
        for text in lines[last_end : node.lineno - 1]:
            t = text.strip()
            m = SECTION.match(t)
            if m:
                section, above = m.group(1), []
            elif t.startswith("#"):
                above.append(t.lstrip("#").strip())
            else:
                above = []
        inline = lines[node.lineno - 1].split("#", 1)[1].strip() if "#" in lines[node.lineno - 1] else ""
        comments[node.target.id] = " ".join([*above, inline]).strip()
        sections[node.target.id] = section
        last_end = node.end_lineno or node.lineno
    return comments, sections


def _default(f: dataclasses.Field) -> str:
    value: Any = f.default if f.default is not dataclasses.MISSING else None
    if f.name == "kafka_password":
        return "(secret; never written anywhere)"
    if f.name in names.APP_TOPICS:
        return f"`<app_id>_{names.APP_TOPICS[f.name]}`"
    if f.name == "app_id":
        return "the app's name"
    if isinstance(value, Path):
        try:
            return f"`{value.relative_to(config.REPO_ROOT)}`"
        except ValueError:
            return f"`{value}`"
    if value == "":
        return "(empty)"
    return f"`{value}`"


def _type(f: dataclasses.Field) -> str:
    return f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))


def render() -> str:
    comments, sections = _comments(inspect.getsource(config))
    by_section: dict[str, list[dataclasses.Field]] = {}
    for f in dataclasses.fields(config.Settings):
        by_section.setdefault(sections.get(f.name, ""), []).append(f)
    out = [
        "# Configuration reference",
        "",
        "<!-- generated by `make docs` (onceflow_dev.config_reference) from include/onceflow/config.py: edit the",
        "comments there, not this file -->",
        "",
        "Every setting of onceflow lives in one typed place, `onceflow.config.Settings`, shared by the CLI, the job",
        "and the DAGs. Each is read from the environment variable `ONCEFLOW_<NAME>` (upper case); an app's",
        "declaration may give its own defaults for the settings in `APP_SETTINGS` (docs/apps.md), under the",
        "environment's. Values are checked when they are loaded: a misconfiguration fails at start with a message",
        "that says what to change (docs/troubleshooting.md).",
        "",
    ]
    for section, fs in by_section.items():
        out += [f"## {section[0].upper() + section[1:] if section else 'Other'}", ""]
        out += ["| setting | environment | type | default | what it does |", "|---|---|---|---|---|"]
        for f in fs:
            what = comments.get(f.name) or comments.get(SHARED_COMMENT.get(f.name, ""), "") or FALLBACK.get(f.name, "")
            if f.name in config.APP_SETTINGS:
                what += " An app may set its own default."
            what = what.replace("|", "\\|").strip()
            env = config.ENV_PREFIX + f.name.upper()
            out.append(f"| `{f.name}` | `{env}` | `{_type(f)}` | {_default(f)} | {what} |")
        out.append("")
    out += [
        "## Derived names",
        "",
        "Not settings: built from the app id by `onceflow.rules.names` (the ACLs grant exactly these).",
        "",
        "| name | value |",
        "|---|---|",
        f"| transactional id, consumer group | `{names.transactional_id('<app_id>')}` |",
        f"| read_committed readers' group | `{names.reader_group('<app_id>')}` |",
        f"| the ledger's reader | `{names.ledger_group('<app_id>')}` |",
        f"| the reconciliation chain | `{names.reconciliation_group('<app_id>')}` |",
        f"| a backfill | `{names.backfill_transactional_id('<app_id>', '<id>')}` |",
        f"| principals | `{names.username('<app_id>', '<role>')}` |",
        "| checkpoint | `<var_dir>/checkpoints/<app_id>` (or `checkpoint_uri`) |",
        "| savepoints | `<var_dir>/savepoints/<app_id>` (or `savepoint_uri`) |",
        "",
    ]
    return "\n".join(out)


def undocumented() -> list[str]:
    """Settings with nothing that says what they do."""
    comments, _ = _comments(inspect.getsource(config))
    return [
        f.name
        for f in dataclasses.fields(config.Settings)
        if not (comments.get(f.name) or comments.get(SHARED_COMMENT.get(f.name, "")) or FALLBACK.get(f.name))
    ]


if __name__ == "__main__":
    sys.stdout.write(render())
