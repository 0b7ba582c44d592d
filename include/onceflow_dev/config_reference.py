"""docs/configuration.md, generated from onceflow.config: every setting with its environment variable, type,
default and what it does (the comments above each field in config.py), by section (config.SECTIONS: each a class).

    python -m onceflow_dev.config_reference > docs/configuration.md     (make docs)
    python -m onceflow_dev.config_reference --out docs/configuration.md

tests/unit/config/test_config_reference.py fails when the file differs from what this prints, so a setting cannot be
added without its line in the reference, nor without something that says what it does. The output depends on the
source only: no environment, no path of this machine (defaults under the repository are shown relative to it).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import sys
import tokenize
from pathlib import Path
from typing import Any

from onceflow import config
from onceflow.rules import names

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
# What a setting is, where its comment in config.py gives only its default, a reason or the group it belongs to:
# put before that comment.
LEAD = {
    "source_topic": "The topic the job reads.",
    "sink_topic": "The topic the job commits its results to.",
    "dlq_topic": "Malformed records, with their provenance in headers.",
    "ledger_topic": "One record per committed batch (its source offset ranges): what a replay is decided from.",
    "backfill_topic": "Where backfills write their windows.",
    "events_topic": "The events of everyone but the job,",
    "checkpoint_uri": "The job's Spark checkpoint (any Hadoop-compatible URI: file://, hdfs://, s3a://);",
    "savepoint_uri": "Where savepoints are kept;",
    "max_offsets_per_trigger": "The most source records one micro-batch reads (Spark's maxOffsetsPerTrigger).",
    "transaction_timeout_ms": "transaction.timeout.ms of the job's transactional producer: the coordinator aborts a "
    "transaction open longer (the batch is then replayed).",
    "producer_linger_ms": "linger.ms of the job's transactional producer.",
    "producer_batch_messages": "batch.num.messages of the job's transactional producer.",
    "state_store_provider": "Spark's state store provider (spark.sql.streaming.stateStore.providerClass).",
    "health_interval_s": "How often the health DAG runs.",
    "txn_watch_interval_s": "How often the transaction-watch DAG runs.",
    "reconcile_interval_minutes": "How often the reconciliation DAG proves the next slice of its chain.",
    "alert_channels": "Where alerts go besides the alerts topic,",
    "health_progress_threshold_s": "Health:",
    "health_restart_attempts": "Health:",
    "health_batch_grace_s": "Health:",
    "savepoint_keep": "Rotation:",
    "savepoint_max_age_s": "Rotation:",
    "savepoint_incomplete_grace_s": "Rotation:",
}
# Fields that nothing in config.py comments: what they do, as the code that reads them uses them.
FALLBACK = {
    "bootstrap_servers": "The Kafka bootstrap list (host:port, comma-separated); any reachable broker serves.",
    "controller_port": "The embedded stack's KRaft controller port (node i: this + 10 * (i - 1)).",
    "alerts_topic": "Shared by every app: alert records (raised and resolved).",
    "health_topic": "Shared by every app: the health checks' records.",
    "reconciliation_topic": "Shared by every app: the reconciliation runs' results.",
    "source_partitions": "Partitions of the source topic the platform creates (and preflight expects).",
    "sink_partitions": "Partitions of the sink topic the platform creates (and preflight expects).",
    "replication_factor": "Replication of the topics the platform creates (min(3, brokers) on a multi-node "
    "embedded stack, unless set).",
    "min_insync_replicas": "min.insync.replicas of those topics (min(2, brokers) on a multi-node embedded stack, "
    "unless set); at most replication_factor.",
    "broker_heap": "Heap (-Xmx, -Xms) of each embedded Kafka node's JVM.",
    "kafka_sasl_mechanism": "The SASL mechanism on a SASL_SSL cluster: SCRAM-SHA-512 or SCRAM-SHA-256.",
    "kafka_username": "The principal's name on a SASL_SSL cluster (in Airflow: the login of the role's connection).",
    "master": "Spark's master: local[N], spark://host:port, k8s://..., yarn.",
    "shuffle_partitions": "spark.sql.shuffle.partitions of the job: the aggregation's partitions, fixed by the "
    "checkpoint when the query first starts; two of them must fit the driver's heap (docs/cluster.md).",
    "min_batches_to_retain": "spark.sql.streaming.minBatchesToRetain: the checkpoint batches Spark keeps.",
    "window_s": "The length of an event-time window (ip_count: tumbling, aligned to the epoch).",
    "watermark_s": "The watermark delay: the watermark trails the largest event time seen by this much; a window "
    "is emitted once the watermark passes its end, and a record whose window ended at or before the previous "
    "batch's watermark is late.",
    "starting_offsets": "Where a query with a new checkpoint starts reading its source: earliest or latest.",
    "near_timeout_fraction": "A transaction open this share of its timeout is reported (transaction_near_timeout) "
    "while still open.",
    "driver_memory": "The Spark driver's memory (spark.driver.memory).",
    "executor_memory": "Each Spark executor's memory (on a cluster).",
    "executor_cores": "Each Spark executor's cores (on a cluster).",
    "rotation_interval_minutes": "How often the rotation DAG takes a savepoint, verifies it and prunes old ones.",
    "checkpoint_size_alert_bytes": "The checkpoint's size above which rotation alerts.",
    "restart_attempts": "Restarts of a failed job by its supervisor in a row (a batch committed in between resets "
    "the count) before it gives up.",
    "restart_delay_s": "The supervisor's fixed delay before a restart.",
    "airflow_port": "The embedded Airflow's api-server port (its UI: http://localhost:<port>).",
    "alert_webhook_conn_id": "The Airflow connection of the webhook alert channel (HTTP; JSON POST).",
    "alert_slack_conn_id": "The Airflow connection of the Slack alert channel (an incoming webhook).",
    "alert_smtp_conn_id": "The Airflow connection of the e-mail alert channel.",
    "alert_email_to": "Where e-mail alerts go (comma-separated addresses); needed when smtp is a channel.",
    "health_restart_window_s": "Health: the window over which it counts its restarts.",
    "checkpoint_freshness_threshold_s": "Health: the checkpoint's commit log not written for this long while input "
    "waits is stale.",
    "k8s_namespace": "Kubernetes cluster mode: the namespace.",
    "k8s_service_account": "Kubernetes cluster mode: the driver's service account (allowed to create executor pods).",
    "k8s_kafka_secret_mount": "Kubernetes cluster mode: where the Kafka secret (the CA) is mounted.",
    "app_root_in_image": "Kubernetes cluster mode: where onceflow is installed in the image.",
    "var_dir": "Where runtime state lives: checkpoints, savepoints, pid, status and log files, Airflow's home, "
    "the embedded stack's data. The default is a source checkout's `var/`; installed from a wheel, "
    "`$XDG_STATE_HOME/onceflow` (`~/.local/state/onceflow`).",
    "trigger_interval_s": "The micro-batch trigger; with close-out batches on, the pace between batches that close "
    "no window.",
    "fault": "Fault injection for tests (onceflow.faults): point@batch[:seconds], comma-separated "
    "(docs/testing.md); empty: off.",
}


def _comments(source: str) -> dict[str, str]:
    """Each field of Settings: its comment (the contiguous comment lines right above it, then its inline
    comment), read from the section class that declares it (config.SECTIONS)."""
    lines = source.splitlines()
    by_name = {n.name: n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)}
    # line number -> the comment that ends it (tokenize: a '#' inside a string is not a comment)
    inline = {
        tok.start[0]: tok.string
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    }
    comments: dict[str, str] = {}
    for section_cls in config.SECTIONS:
        cls = by_name[section_cls.__name__]
        last_end = (cls.body[0].end_lineno or cls.lineno) if cls.body else cls.lineno  # after the docstring
        for node in cls.body:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            above: list[str] = []
            for text in lines[last_end : node.lineno - 1]:
                t = text.strip()
                above = [*above, t.lstrip("#").strip()] if t.startswith("#") else []
            end = node.end_lineno or node.lineno
            tail = inline.get(end, "") if not lines[end - 1].strip().startswith("#") else ""
            comments[node.target.id] = " ".join([*above, tail.lstrip("#").strip()]).strip()
            last_end = end
    return comments


def _what(name: str, comments: dict[str, str]) -> str:
    said = comments.get(name) or comments.get(SHARED_COMMENT.get(name, ""), "") or FALLBACK.get(name, "")
    return " ".join(x for x in (LEAD.get(name, ""), said) if x)


def _md(text: str) -> str:
    """Text for a table cell: `|` escaped; `<...>` outside code spans escaped (Markdown would take it for HTML)."""
    parts = text.replace("|", "\\|").split("`")
    for i in range(0, len(parts), 2):  # outside code spans
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def _default(f: dataclasses.Field) -> str:
    value: Any = f.default if f.default is not dataclasses.MISSING else None
    if config.field_rules()[f.name].secret:
        return "(empty; secret: never written anywhere)"
    if f.name in names.APP_TOPICS:
        return f"`{names.app_topic('<app_id>', f.name)}`"
    if f.name == "app_id":
        return "(empty: the app's name)"
    if isinstance(value, Path):
        try:
            return f"`{value.relative_to(config.REPO_ROOT).as_posix()}`"
        except ValueError:
            return f"`{value}`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value == "":
        return "(empty)"
    return f"`{value}`"


def _type(f: dataclasses.Field) -> str:
    """The setting's type with its own rule (range, choices, secret: onceflow.config.FieldRule)."""
    return config.field_rules()[f.name].describe()


def _doc(fn: Any) -> str:
    return " ".join((inspect.getdoc(fn) or "").split())


def render() -> str:
    comments = _comments(inspect.getsource(config))
    p = config.ENV_PREFIX
    out = [
        "# Configuration reference",
        "",
        "<!-- generated by `make docs` (onceflow_dev.config_reference) from include/onceflow/config.py: edit the",
        "comments there, not this file -->",
        "",
        "Every setting of onceflow lives in one typed place, `onceflow.config.Settings`, shared by the CLI, the job",
        f"and the DAGs. Each is read from the environment variable `{p}<NAME>` (the setting's name in upper case).",
        "What wins: an explicit value, then the environment, then the declared app's own default for the settings",
        "an app may set (marked below; [apps.md](apps.md)), then the default here. A multi-node embedded stack",
        f"(`{p}BROKERS` above 1) fills in the bootstrap list and the replication settings left unset, and the CLI",
        "takes what the shell does not export from the embedded stack's remembered topology (`var/stack.json`,",
        "[cluster.md](cluster.md)). In Airflow, the Kafka endpoint and credentials come from the connections",
        "([security.md](security.md)). Values are checked when they are loaded: a misconfiguration fails at start",
        "with a message that says what to change ([troubleshooting.md](troubleshooting.md#a-setting-is-refused)).",
        f"A control plane that runs several app instances (`{p}APPS`) gives one instance a setting of its own with",
        f"`{config.INSTANCE_PREFIX}<INSTANCE>__<NAME>` (the instance's id in upper case, `-` as `_`), over `{p}<NAME>`",
        "for that instance only: any setting of the sections of the job, Spark, the result sink, savepoints,",
        f"supervision and the control plane, and the app's topics and partitions, except {', '.join(f'`{n}`' for n in sorted(config.NOT_PER_INSTANCE))}",
        "([control-plane.md](control-plane.md)).",
        "Booleans take `true`/`false` (also `1`/`0`, `yes`/`no`, `on`/`off`); integers may use `_` (`500_000`).",
        "The settings come in sections, each a typed class of `onceflow.config` (`Settings.section(KafkaCluster)` gives",
        "one on its own); `Settings` is all of them in one record, so each setting is also `settings.<name>`.",
        "The type column carries each setting's own rule, part of its type in `config.py` (`int > 0`, `float in",
        "(0, 1)`, the choices of a `Literal`, `secret`), checked alike for every setting; the rules between settings",
        "(`min_insync_replicas` at most `replication_factor`, a topic named once) are `Settings.validate`'s.",
        "",
    ]
    for section in config.SECTIONS:
        title = (section.__doc__ or section.__name__).rstrip(".")
        out += [f"## {title[0].upper() + title[1:]}", "", f"The section `onceflow.config.{section.__name__}`.", ""]
        out += ["| setting | environment | type | default | what it does |", "|---|---|---|---|---|"]
        for f in dataclasses.fields(section):
            what = _what(f.name, comments)
            if f.name in config.APP_SETTINGS:
                what += " An app may set its own default."
            env = p + f.name.upper()
            out.append(f"| `{f.name}` | `{env}` | `{_type(f)}` | {_default(f)} | {_md(what.strip())} |")
        out.append("")
    app = "<app_id>"
    out += [
        "## Derived names",
        "",
        "Not settings: built from the app id by `onceflow.rules.names` (the ACLs grant exactly these); the first five",
        "are properties of `Settings`.",
        "",
        "| name | value | what it is |",
        "|---|---|---|",
        f"| `transactional_id` | `{names.transactional_id(app)}` | {_md(_doc(names.transactional_id))} |",
        f"| `group_id` | `{names.group_id(app)}` | {_md(_doc(names.group_id))} |",
        f"| `reader_group` | `{names.reader_group(app)}` | {_md(_doc(names.reader_group))} Spark's Kafka consumers: "
        f"`{names.spark_group_prefix(app)}...` |",
        f"| `checkpoint` | `checkpoint_uri`, else `<var_dir>/checkpoints/{app}` (`var/checkpoints/{app}`) | The job's "
        "Spark checkpoint, as a URI. |",
        f"| `savepoints` | `savepoint_uri`, else `<var_dir>/savepoints/{app}` (`var/savepoints/{app}`) | The root under "
        "which each savepoint is a directory. |",
        f"| the ledger's reader | `{names.ledger_group(app)}` | {_md(_doc(names.ledger_group))} |",
        f"| the reconciliation chain | `{names.reconciliation_group(app)}` | {_md(_doc(names.reconciliation_group))} |",
        f"| a backfill | `{names.backfill_transactional_id(app, '<id>')}` | {_md(_doc(names.backfill_transactional_id))} "
        "Its group has the same name. |",
        f"| the transaction watch | `{names.txn_watch_group(app)}` | The transaction-watch DAG's consumer group. |",
        f"| principals | `{names.username(app, '<role>')}` | {_md(_doc(names.username))} |",
        "",
    ]
    return "\n".join(out)


def undocumented() -> list[str]:
    """Settings with nothing that says what they do."""
    comments = _comments(inspect.getsource(config))
    return [f.name for f in dataclasses.fields(config.Settings) if not _what(f.name, comments)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write the reference to this file instead of stdout")
    args = ap.parse_args(argv)
    text = render()
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
