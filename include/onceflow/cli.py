"""`onceflow`: the command line of the platform. `job` (start, stop, status of an app's stream), `app` (list,
validate, new), `savepoint`, `backfill`, `reconcile`, `quarantine`, `audit`, `show`, `db`, and `stack topics` and
`stack provision` on any cluster. `--app NAME` picks the app; `--json` prints JSON. The development tooling's
commands (the embedded stack, the generator, the local Airflow) are `onceflow-dev`'s (onceflow_dev.cli); typed
here, they go there."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

from onceflow import config, logs, wire
from onceflow.app import MAIN_OUTPUT
from onceflow.kafka import reading as kafka_reading
from onceflow.rules import clock, sources
from onceflow.rules.sources import SourcePartition


def print_record(obj, as_json: bool) -> None:
    if as_json:
        print(json.dumps(obj, indent=2, default=str, sort_keys=True))
    else:
        for k, v in obj.items():
            print(f"{k}: {json.dumps(v, default=str) if isinstance(v, (dict, list)) else v}")


def _dev(name: str):
    """A module of the development tooling (the embedded stack, the generator, the local Airflow): in the
    repository's environment, not in a production image."""
    import importlib

    try:
        return importlib.import_module(f"onceflow_dev.{name}")
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("onceflow_dev"):
            raise SystemExit(
                "onceflow: this command needs the development tooling (onceflow_dev), which ships "
                "with the repository and not with a production image"
            ) from None
        raise


def timestamp_ms(text: str) -> int:
    if text.isdigit():
        return int(text)
    return clock.parse_iso_ms(text)


def cmd_stack(args, s: config.Settings) -> int:
    """`topics` and `provision` work on any cluster, from a production image without the development tooling; the
    embedded stack's actions are `onceflow-dev stack`'s."""
    if args.action not in ("topics", "provision"):
        return _to_dev_tooling(args, s)
    s = stack_settings(args, s)
    if args.action == "topics":  # an existing cluster: create and check the topics only
        from onceflow.kafka import topics

        print_record({"created": topics.ensure(s), "bootstrap_servers": s.bootstrap_servers}, args.json)
        return 0
    # provision: an existing secured cluster, the app's principals and ACLs, as its admin
    from onceflow.kafka import acls, security

    passwords = {r: os.environ.get(f"ONCEFLOW_KAFKA_{r.upper()}_PASSWORD", "") for r in acls.ROLES}
    unset = [f"ONCEFLOW_KAFKA_{r.upper()}_PASSWORD" for r, pw in passwords.items() if not pw]
    if unset or not s.secured:
        raise config.ConfigError(
            "stack provision runs as the cluster's admin (ONCEFLOW_KAFKA_SECURITY_PROTOCOL=SASL_SSL, "
            "ONCEFLOW_KAFKA_USERNAME/PASSWORD of a super user) and needs each role's password in the "
            f"environment; unset: {unset or 'none'}"
        )
    print_record(security.provision(s, s, passwords), args.json)
    return 0


def stack_settings(args, s: config.Settings) -> config.Settings:
    """The settings as `stack`'s options change them: --brokers (with that topology's defaults: bootstrap list,
    replication) and --secured."""
    if args.brokers and args.brokers != s.brokers:
        s = config.load(env=config.with_remembered_stack(os.environ), brokers=args.brokers, **app_overrides(args))
    return s.replace(kafka_security_protocol="SASL_SSL") if args.secured else s


def _to_dev_tooling(args, s: config.Settings) -> int:
    """A development command typed as `onceflow ...`: its command line parsed and run by `onceflow-dev`'s."""
    dev = _dev("cli")
    dev_args = dev.parser().parse_args(args.argv)
    dev_args.argv = args.argv
    return dev_args.fn(dev_args, s)


def cmd_job(args, s: config.Settings) -> int:
    from onceflow.runtime import jobctl, supervisor

    if args.action == "run":
        return supervisor.supervise(s)
    if args.action == "start":
        info = jobctl.start(_with_sink_role(s))
        if args.wait:
            t0 = clock.now_ms()
            jobctl.wait_for_commit(s, after_ms=t0 - 1, timeout=args.wait)
        print_record(info | {"status": jobctl.status(s).as_dict()}, args.json)
    elif args.action == "stop":
        print_record({"stopped": jobctl.stop(s)}, args.json)
    elif args.action == "kill":
        print_record({"killed_pid": jobctl.kill(s)}, args.json)
    elif args.action == "stacks":
        return _print_stacks(s, args.json)
    else:
        st = jobctl.status(s)
        print_record(st.as_dict(), args.json)
        return 0 if st.running else 1
    return 0


def _print_stacks(s: config.Settings, as_json: bool) -> int:
    from onceflow.runtime import stacks

    got = stacks.dump(s)
    if got is None:
        print(f"onceflow: no running driver of {s.app_id} answered (see `onceflow job status`)", file=sys.stderr)
        return 1
    if as_json:
        print_record({"pid": got.pid, "log": str(got.log), "threads": got.threads}, True)
    else:
        print(f"# the driver's threads (pid {got.pid}), also written to {got.log}\n")
        print("\n\n".join(got.threads))
    return 0


def cmd_db(args, s: config.Settings) -> int:
    from onceflow.database import client, schema
    from onceflow.rules import names

    if args.action == "provision":
        job = args.job_role or names.db_role(s.app_id, "job")
        reader = args.reader_role or names.db_role(s.app_id, "reader")
        # as `stack provision` takes the Kafka roles' passwords: from the environment (docker-compose.yaml's
        # airflow-init fills it from secret files, docker/airflow-entrypoint.py), never from an argument
        names_ = {job: "ONCEFLOW_POSTGRES_JOB_PASSWORD", reader: "ONCEFLOW_POSTGRES_READER_PASSWORD"}
        passwords = {role: os.environ.get(var, "") for role, var in names_.items()}
        if any(passwords.values()):  # the database and the two login roles too
            if not all(passwords.values()):
                raise config.ConfigError(f"db provision: set both {' and '.join(names_.values())}, or neither")
            with client.connect(s.replace(postgres_database="postgres"), "provision") as server:
                server.autocommit = True  # CREATE DATABASE runs outside a transaction
                schema.ensure_database(server, s.postgres_database)
                for role, password in passwords.items():
                    schema.ensure_login_role(server, role, password)
        with client.connect(s, "provision") as conn:
            schema.provision(conn, s.database_schema, job, reader)
        print_record(
            {"schema": s.database_schema, "tables": list(schema.COLUMNS), "job_role": job, "reader_role": reader},
            args.json,
        )
        return 0
    s = _with_sink_role(s.replace(sink_kind="postgres"), "reader")
    with client.connect(s, "status") as conn:
        conn.read_only = True
        newest = client.newest_entry(conn, s)
        rows = client.row_counts(conn, s)
    print_record(
        {
            "schema": s.database_schema,
            "committed_batches": rows["ledger"],
            "last_batch": newest.batch if newest else None,
            "last_end_offsets": sources.keyed_to_json(newest.end, int) if newest else None,
            "results_rows": rows["results"],
            "dlq_rows": rows["dlq"],
        },
        args.json,
    )
    return 0


def _with_sink_role(s: config.Settings, purpose: str = "job") -> config.Settings:
    """A postgres-sink app's job (or, purpose `reader`, its audit and reconciliation) run from the CLI on the
    embedded stack gets its database role from the stack (the environment's ONCEFLOW_POSTGRES_PASSWORD wins)."""
    if s.sink_kind != "postgres" or s.postgres_password:
        return s
    postgres = _dev("postgres")
    if not postgres.serves_sinks(s):
        raise config.ConfigError(
            "ONCEFLOW_SINK_KIND=postgres: set ONCEFLOW_POSTGRES_HOST, _PORT, _USER and _PASSWORD of the job's role, "
            "or start the embedded server with `onceflow stack up --postgres`"
        )
    return postgres.sink_settings(s, purpose)


def cmd_show(args, s: config.Settings) -> int:

    if args.output is not None and args.what != "sink":
        raise config.ConfigError("--output is for `onceflow show sink`: which named output's topic to print")
    if args.output is not None and args.output not in s.outputs:
        raise config.ConfigError(f"app {s.app} has no output {args.output!r}; its outputs: {sorted(s.outputs)}")
    topic = {
        "sink": s.outputs[args.output or MAIN_OUTPUT],
        "dlq": s.dlq_topic,
        "ledger": s.ledger_topic,
        "source": s.source_topic,
    }.get(args.what)
    if topic is None:  # events: the job's own and the shared ones, merged by time
        both = (m for t in (s.job_events_topic, s.events_topic) for m in kafka_reading.read_topic(s, t))
        msgs = sorted(both, key=lambda m: m.timestamp_ms)
    else:
        msgs = kafka_reading.read_topic(s, topic)
    for m in msgs[-args.limit :] if args.limit else msgs:
        value = m.value.decode(errors="replace") if m.value is not None else None
        if args.what == "dlq":
            print(
                json.dumps(
                    {
                        "key": m.key.decode() if m.key is not None else None,
                        "reason": m.headers.get(wire.H_REASON, b"").decode(),
                        "value": value,
                    }
                )
            )
        else:
            print(value if args.what != "sink" else f"{m.key.decode() if m.key is not None else None}  {value}")
    return 0


def cmd_audit(args, s: config.Settings) -> int:
    from onceflow.operations import audit

    _progress(
        f"auditing app {s.app_id}: a consistent cut of its committed history (reading the source, sink, "
        f"DLQ and ledger) ..."
    )
    rep = audit.audit(_with_sink_role(s, "reader"))
    print_record(rep.summary(), True)
    what = (
        "I1-I4"
        if s.declared_app().audit is not None
        else "I1 and the ledger's accounting of every sink and DLQ record (the app declares no audit of its own; "
        "`onceflow reconcile` replays its plan key by key)"
    )
    print(
        f"{'OK' if rep.ok else 'VIOLATED'}: {what} on every batch up to batch {rep.snapshot_batch} "
        f"(the newest committed when the audit began)",
        file=sys.stderr,
    )
    return 0 if rep.ok else 1


def cmd_savepoint(args, s: config.Settings) -> int:
    from onceflow.control import rotation
    from onceflow.kafka import events as ev
    from onceflow.operations import savepoints
    from onceflow.runtime import jobctl

    s = _with_sink_role(s)  # a table sink's ledger is its table; a restore fences its drivers (the job's role)
    if args.action == "create":
        m = savepoints.create(s, stop=args.stop, bus=ev.EventBus(s))
        print_record(
            {
                "id": m.id,
                "batch": m.ledger_batch,
                "spark_batch": m.spark_batch,
                "mode": m.mode,
                "files": len(m.files),
                "size_bytes": m.total_size,
            },
            args.json,
        )
    elif args.action == "list":
        rows = [vars(x) for x in savepoints.list_all(s)]
        if args.json:
            print_record({"savepoints": rows}, True)
        for r in rows if not args.json else []:
            when = datetime.fromtimestamp(r["created_ms"] / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
            print(
                f"{r['id']:<36} {when}Z  batch {r['ledger_batch']!s:>6}  {r['mode'] or '-':<8} "
                f"{r['total_size'] or 0:>10} B  {'complete' if r['complete'] else r['error']}"
            )
    elif args.action == "verify":
        v = savepoints.verify(s, _need_id(args))
        print_record(v.as_dict(), args.json)
        return 0 if v.compatible else 1
    elif args.action == "restore":
        plan = savepoints.restore(
            s,
            _need_id(args),
            allow_rewind=args.allow_rewind,
            dry_run=args.dry_run,
            bus=None if args.dry_run else ev.EventBus(s),
        )
        out = plan.summary() | {"dry_run": args.dry_run}
        if args.start and not args.dry_run:
            out["job"] = jobctl.start(s)
        print_record(out, args.json)
    elif args.action == "delete":
        savepoints.delete(s, _need_id(args), bus=ev.EventBus(s))
        print_record({"deleted": args.id}, args.json)
    elif args.action == "prune":
        pruned = savepoints.prune(s, dry_run=args.dry_run)
        print_record({"kept": pruned.keep, "deleted": pruned.delete, "dry_run": args.dry_run}, args.json)
    elif args.action == "rotate":
        report = rotation.rotate(s)
        print_record(report.as_dict(), args.json)
        return 0 if report.ok else 1
    else:
        print_record(savepoints.checkpoint_stats(s), args.json)
    return 0


def _savepoint_id(value: str) -> str:
    """argparse type: refuse anything but a savepoint id (or 'latest') before any command runs (exit 2)."""
    from onceflow.rules.savepoints import SavepointIdError, check_id

    try:
        return check_id(value, allow_latest=True)
    except SavepointIdError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _need_id(args) -> str:
    if not args.id:
        raise SystemExit(f"onceflow savepoint {args.action}: give a savepoint id (or 'latest')")
    return args.id


def cmd_reconcile(args, s: config.Settings) -> int:
    from onceflow.control import reconciliation
    from onceflow.operations import audit, recon_chain

    if args.action == "status":
        st = recon_chain.status(s, audit.committed_position(s, _source_partitions(s)).batch)
        if args.json:
            print_record(st, True)
        else:
            print(f"proven   through batch {st['proven_through']} (run {st['proven_by_run']})")
            print(f"pending  {_ranges(st['pending'])}   (newest committed batch {st['newest_committed_batch']})")
            print(f"failed   {_ranges(st['failed'])}")
            for r in st["recent_runs"]:
                print(
                    f"  {r['mode']:<6} {r['run_id']}  batches {r['batches'][0]}..{r['batches'][1]}  {r['verdict']}"
                    + (f"  failed: {', '.join(r['failed_checks'])}" if r["failed_checks"] else "")
                )
        return 0
    rng = reconciliation.range_from(args.first, args.last, args.since, args.until)
    what = (
        "the chain's next slice"
        if args.chain
        else "every committed batch"
        if rng is None
        else ", ".join(f"{k}={v}" for k, v in rng.items())
    )
    _progress(f"reconciling {what} of app {s.app_id} (Spark; log: {s.log_dir / 'cli.log'}) ...")
    spark = _spark(s, "reconcile")
    from onceflow.operations import reconcile

    reader = _with_sink_role(s, "reader")  # a table sink is read as its reader role
    res = (
        reconcile.run_chain(spark, reader, with_gx=not args.no_gx)
        if args.chain
        else reconcile.run(spark, reader, **(rng or {}), with_gx=not args.no_gx)
    )
    info = reconciliation.record(s, res)
    if args.json:
        print_record(res.as_dict() | info, True)
    else:
        print(
            f"batches {res.first_batch}..{res.last_batch} (cut at batch {res.snapshot_batch})  "
            f"source offsets {res.coverage.get('source_offsets')}"
        )
        for c in res.checks:
            print(f"  {c.status.upper():<5} {c.name:<14} {c.summary}")
            for d in c.differences[:10]:
                print(f"        {json.dumps(d)}")
        print(
            f"{res.verdict.upper()}   result: {info['file']}"
            + (f"\nData Docs: {res.data_docs}" if res.data_docs else "")
        )
    return 0 if res.ok else 1


def _ranges(rs: list) -> str:
    return ", ".join(f"{a}..{b}" if a != b else str(a) for a, b in rs) or "none"


def _source_partitions(s: config.Settings) -> list[SourcePartition]:
    return sorted(kafka_reading.source_watermarks(s) or {})


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _spark(s: config.Settings, name: str):
    """The CLI's in-process Spark: its JVM's own output goes to the CLI's log file, not the terminal."""
    from onceflow.runtime import launcher

    return launcher.local_session(s, name, log_file=s.log_dir / "cli.log")


def cmd_backfill(args, s: config.Settings) -> int:
    from onceflow.operations import backfill

    spec = backfill.spec_from(
        s,
        args.id,
        args.start_offsets,
        args.end_offsets,
        args.since,
        args.until,
        args.target,
        args.chunk_size,
        args.dry_run,
    )
    spec = backfill.validate(s, spec)  # before Spark starts: bad parameters cost nothing
    _progress(
        f"backfill {spec.id}: {spec.positions(spec.start)} -> {spec.positions(spec.end)} into {spec.target_topic} "
        f"(Spark; log: "
        f"{s.log_dir / 'cli.log'}) ..."
    )
    report = backfill.run(_spark(s, "backfill"), s, spec)
    print_record(report, args.json)
    return 0


def cmd_quarantine(args, s: config.Settings) -> int:
    from onceflow.operations import quarantine

    s = _with_sink_role(s)  # a table sink's ledger is its table; a quarantine fences its drivers (the job's role)
    if args.action == "add":
        if args.partition is None or args.offset is None:
            raise SystemExit("onceflow quarantine add: give --partition and --offset (and --reason)")
        rec = quarantine.add(
            s,
            args.partition,
            args.offset,
            args.end if args.end is not None else args.offset + 1,
            args.reason or "",
            topic=args.topic,
        )
        print_record(json.loads(rec.to_json()), args.json)
    else:
        print_record(
            {
                "in_force": [vars(r) for r in quarantine.current(s)],
                "ledger": [json.loads(r.to_json()) for r in quarantine.records(s)],
            },
            args.json,
        )
    return 0


def cmd_app(args, s: config.Settings) -> int:
    from onceflow.app import registry, scaffold

    if args.action == "new":
        if not args.name:
            raise config.ConfigError("onceflow app new NAME: give the new app's name")
        root = scaffold.write(args.name, Path(args.dir))
        print_record(
            {"app": args.name, "written": str(root), "next": f"cd {root} && pip install -e . && pytest tests"},
            args.json,
        )
        return 0

    if args.action == "list":
        out = []
        for name, where in registry.declared(s.app_registry).items():
            try:
                app = registry.find(name, s.app_registry)
                out.append(
                    {
                        "app": name,
                        "declared_in": where,
                        "description": app.description,
                        "event_time": app.event_time,
                        "deterministic": app.deterministic,
                        "settings": dict(app.settings),
                        "dlq_reasons": sorted(app.reasons),
                        "outputs": dict(app.outputs),
                    }
                )
            except Exception as e:  # one broken declaration does not hide the others
                out.append({"app": name, "declared_in": where, "error": str(e)})
        if args.json:
            print_record(out, True)
        for a in [] if args.json else out:
            what = a.get("error") or f"{a['description']} (settings {json.dumps(a['settings'])})"
            print(f"{a['app']:<16} {a['declared_in']:<40} {what}")
        return 2 if any("error" in a for a in out) else 0
    app = s.declared_app()
    _progress(f"validating app {app.name}: its plan in a local Spark session ...")
    from onceflow.spark import app_plan

    spark = _spark(s.replace(master="local[1]"), "app-validate")
    frame = app_plan.output(app.transform, app_plan.empty_source(spark), s)
    app_plan.check_deterministic(app, frame)
    print_record({"app": app.name, "valid": True, "output_columns": frame.columns, "outputs": s.outputs}, args.json)
    return 0


def app_overrides(args) -> dict:
    """--app NAME: that app, as its own instance."""
    return {"app": args.app, "app_id": args.app} if getattr(args, "app", None) else {}


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("onceflow")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def add_global_arguments(p: argparse.ArgumentParser, prog: str = "onceflow") -> None:
    """-v, --version and --app: the same before any command of `onceflow` and `onceflow-dev`."""
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--version", action="version", version=f"{prog} {_version()}")
    p.add_argument(
        "--app",
        metavar="NAME",
        help="the declared app to work on, as its own instance (ONCEFLOW_APP and ONCEFLOW_APP_ID; default: the "
        "settings', ip_count on the embedded stack)",
    )


def add_stack_arguments(st: argparse.ArgumentParser) -> None:
    """`stack`'s arguments, one list for `onceflow stack` (topics, provision) and `onceflow-dev stack` (up, down,
    status), so either takes the other's command line."""
    st.add_argument(
        "action",
        choices=["up", "down", "status", "topics", "provision"],
        help="up, down, status: the embedded stack (onceflow-dev); topics: create the topics on the cluster "
        "ONCEFLOW_BOOTSTRAP_SERVERS names, start nothing; provision: on a secured cluster, as its admin, the app's "
        "principals and ACLs (docs/security.md)",
    )
    st.add_argument("--brokers", type=int, help="Kafka nodes (default ONCEFLOW_BROKERS, 1; 3: a quorum of three)")
    st.add_argument(
        "--spark-workers",
        type=int,
        help="up: also a Spark standalone master (ONCEFLOW_MASTER spark://..., default port 7077) and N workers",
    )
    st.add_argument(
        "--secured",
        action="store_true",
        help="SASL/SCRAM over TLS with ACLs (ONCEFLOW_KAFKA_SECURITY_PROTOCOL=SASL_SSL; docs/security.md)",
    )
    st.add_argument(
        "--postgres",
        action="store_true",
        help="up: also PostgreSQL on loopback under the var dir, each app's sink schema and its job and reader "
        "roles (docs/database-sink.md)",
    )
    st.add_argument("--json", action="store_true")


# The development tooling's commands other than `stack`: typed as `onceflow NAME ...`, run as `onceflow-dev NAME ...`
DEV_COMMANDS = {
    "produce": "emulate the NGINX access-log service",
    "airflow": "the embedded Airflow (standalone) with the control-plane DAGs",
    "where": "where everything runs and how to look at the results",
    "kafka": "Kafka's own tools (kafka-<tool>.sh) from the embedded stack's jars",
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="onceflow", description=__doc__)
    add_global_arguments(p)
    sub = p.add_subparsers(dest="command", required=True)

    st = sub.add_parser("stack", help="the app's topics and ACLs on a cluster; the embedded stack (onceflow-dev)")
    add_stack_arguments(st)
    st.set_defaults(fn=cmd_stack)

    for name, what in DEV_COMMANDS.items():
        # its arguments (--help too) are onceflow-dev's to parse
        dev = sub.add_parser(name, help=f"{what} (`onceflow-dev {name}`)", add_help=False)
        dev.set_defaults(fn=_to_dev_tooling, handed_on=True)

    sh = sub.add_parser("show", help="print committed records of a topic (read_committed)")
    sh.add_argument("what", choices=["sink", "dlq", "ledger", "events", "source"])
    sh.add_argument("--limit", type=int, default=20, help="the last N records (0 = all)")
    sh.add_argument("--output", help="sink: a named output's topic instead of the sink topic (App.outputs)")
    sh.set_defaults(fn=cmd_show)

    au = sub.add_parser("audit", help="check the invariants I1-I4 of the live job's committed history")
    au.set_defaults(fn=cmd_audit)

    sp = sub.add_parser("savepoint", help="savepoints of the job's checkpoint: take, list, verify, restore")
    sp.add_argument(
        "action",
        choices=["create", "list", "verify", "restore", "delete", "prune", "rotate", "stats"],
        help="create: copy the checkpoint at its latest committed batch (--stop: stop the job first); "
        "restore: replace the checkpoint with a savepoint (job stopped); prune: apply retention; "
        "rotate: create + verify + prune + report, as the rotation DAG does; stats: the "
        "checkpoint's size",
    )
    sp.add_argument("id", nargs="?", type=_savepoint_id, help="a savepoint id, or 'latest'")
    sp.add_argument("--stop", action="store_true", help="create: stop-with-savepoint")
    sp.add_argument(
        "--allow-rewind",
        action="store_true",
        help="restore: allow a savepoint older than the newest (see docs/savepoints.md)",
    )
    sp.add_argument("--dry-run", action="store_true", help="restore/prune: say what would happen, change nothing")
    sp.add_argument("--start", action="store_true", help="restore: start the job afterwards")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(fn=cmd_savepoint)

    rc = sub.add_parser(
        "reconcile",
        help="prove the committed output exact for a range of batches (I1-I4 + GX); "
        "`reconcile status`: which batches are proven, pending or failed",
    )
    rc.add_argument("action", nargs="?", choices=["run", "status"], default="run")
    rc.add_argument(
        "--chain",
        action="store_true",
        help="the scheduled chain's next slice (what the reconciliation DAG's scheduled runs do)",
    )
    rc.add_argument("--first", type=int, help="first ledger batch (with --last)")
    rc.add_argument("--last", type=int)
    rc.add_argument("--since", help="batches committed at or after this time (ISO-8601 or epoch ms)")
    rc.add_argument("--until", help="... and before this time")
    rc.add_argument("--no-gx", action="store_true", help="skip the Great Expectations suite")
    rc.add_argument("--json", action="store_true")
    rc.set_defaults(fn=cmd_reconcile)

    bf = sub.add_parser("backfill", help="recompute windows over a source range, written exactly once")
    bf.add_argument("--id", required=True, help="the backfill's id: re-running the same id resumes it")
    bf.add_argument(
        "--start-offsets",
        help='per partition, e.g. \'{"0": 0, "1": 0}\'; an app of several source topics: \'{"a:0": 0, "b:0": 0}\' '
        "(with --end-offsets)",
    )
    bf.add_argument("--end-offsets", help="per partition (or topic:partition), exclusive")
    bf.add_argument("--since", help="or a time range of Kafka record timestamps (ISO-8601 or epoch ms) ...")
    bf.add_argument("--until", help="... to this time, exclusive")
    bf.add_argument("--target", help="target topic (default ONCEFLOW_BACKFILL_TOPIC, not the live sink)")
    bf.add_argument("--chunk-size", type=int, default=5000, help="output records per transaction")
    bf.add_argument("--dry-run", action="store_true", help="report what would be written; write nothing")
    bf.add_argument("--json", action="store_true")
    bf.set_defaults(fn=cmd_backfill)

    qu = sub.add_parser(
        "quarantine",
        help="quarantine source records whose output can never be delivered "
        "(the way past a batch that cannot commit; see docs/operations.md)",
    )
    qu.add_argument("action", choices=["add", "list"])
    qu.add_argument("--topic", help="the source topic (default: the app's source topic; see App.sources)")
    qu.add_argument("--partition", type=int)
    qu.add_argument("--offset", type=int, help="the first offset to quarantine")
    qu.add_argument("--end", type=int, help="the offset after the last one (default: --offset + 1)")
    qu.add_argument("--reason", help="why (kept in the ledger)")
    qu.add_argument("--json", action="store_true")
    qu.set_defaults(fn=cmd_quarantine)

    jb = sub.add_parser("job", help="the streaming job")
    jb.add_argument(
        "action",
        choices=["start", "stop", "status", "run", "kill", "stacks"],
        help="start: detached under the supervisor; run: supervisor in the foreground; "
        "kill: kill -9 the job (the supervisor restarts it); stacks: where the running driver's threads wait "
        "(written to the job log too; the job runs on)",
    )
    jb.add_argument("--wait", type=float, default=0, help="with start: wait this long for a committed batch")
    jb.add_argument("--json", action="store_true")
    jb.set_defaults(fn=cmd_job)

    db = sub.add_parser("db", help="the app's PostgreSQL sink (docs/database-sink.md)")
    db.add_argument(
        "action",
        choices=["provision", "status"],
        help="provision: as a role that may create schemas (ONCEFLOW_POSTGRES_USER/PASSWORD), the app's schema and "
        "tables, granted to its job and reader roles (which must exist, unless ONCEFLOW_POSTGRES_JOB_PASSWORD and _READER_PASSWORD are set: then the database and both login roles are created too); status: the ledger's newest batch and the "
        "tables' rows",
    )
    db.add_argument("--job-role", help="provision: the job's role (default onceflow_<app_id>_job)")
    db.add_argument("--reader-role", help="provision: the readers' role (default onceflow_<app_id>_reader)")
    db.add_argument("--json", action="store_true")
    db.set_defaults(fn=cmd_db)

    ap = sub.add_parser("app", help="the declared apps (docs/apps.md)")
    ap.add_argument(
        "action",
        choices=["list", "validate", "new"],
        help="list: every declared app and where it is declared; validate: load the app (--app, default the "
        "settings' app), check its settings and build its plan in a local Spark session (determinism included); "
        "new NAME: a new app's package under --dir, with a test that passes",
    )
    ap.add_argument("name", nargs="?", help="new: the app's name")
    ap.add_argument("--dir", default=".", help="new: where to write the package (default: here)")
    ap.add_argument("--json", action="store_true")
    ap.set_defaults(fn=cmd_app)
    return p


# Loggers whose lines an operator at the terminal wants (onceflow's progress and warnings); everything else (GX,
# py4j, Spark, Airflow) goes to the log file only, unless -v.
CONSOLE_LOGGERS = ("onceflow", "onceflow_dev", "__main__")


class _OnlyOurs(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.name.split(".")[0] in CONSOLE_LOGGERS


def setup_logging(settings: config.Settings | None, verbose: bool, foreground_job: bool = False) -> None:
    """Quiet by default: the terminal gets onceflow's own log lines and the commands' progress and verdict; every
    library's log lines go to var/log/cli.log. -v sends everything to the terminal too."""
    console = logs.setup(logging.DEBUG if verbose else logging.INFO, verbose=verbose)
    if not verbose and not foreground_job:
        console.addFilter(_OnlyOurs())
    if settings is not None and not foreground_job:
        try:
            settings.log_dir.mkdir(parents=True, exist_ok=True)
            f = logging.FileHandler(settings.log_dir / "cli.log")
            f.setFormatter(logging.Formatter(logs.FORMAT))
            logging.getLogger().addHandler(f)
        except OSError:
            pass  # an unwritable var dir: the console still gets warnings


def run(p: argparse.ArgumentParser, argv: list[str]) -> int:
    """Parse, load the settings, set up logging and run the command: one frame for `onceflow` and `onceflow-dev`."""
    args, unknown = p.parse_known_args(argv)
    if unknown and not getattr(args, "handed_on", False):
        p.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.argv = argv  # what a development command typed here is handed on with
    try:
        # the shell's environment over the embedded stack's remembered topology (`stack up` wrote it under var/)
        settings = config.load(env=config.with_remembered_stack(os.environ), **app_overrides(args))
    except config.ConfigError as e:
        print(f"{p.prog}: {e}", file=sys.stderr)
        return 2
    # `job run` is the supervisor: its log is the job log, written as it is
    setup_logging(settings, args.verbose, foreground_job=args.command == "job" and args.action == "run")
    try:
        return args.fn(args, settings) or 0
    except Exception as e:  # one clear line for the operator; the traceback with -v
        if args.verbose:
            raise
        print(f"{p.prog}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    return run(parser(), sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    sys.exit(main())
