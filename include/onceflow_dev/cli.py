"""`onceflow-dev`: the development tooling's own command line. `stack` (the embedded Kafka broker or cluster, Spark
workers, PostgreSQL on loopback under the var dir), `produce` (the NGINX access-log emulator), `airflow` (Airflow
standalone with the control-plane DAGs), `where` (what runs where) and `kafka` (Kafka's own tools, from the stack's
jars). None of it ships in a production image: the platform's own commands are `onceflow`'s. `onceflow stack
up|down|status`, `produce`, `airflow`, `where` and `kafka` still work there and come here."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from onceflow import cli, config
from onceflow_dev import airflow_local, generator, stack

PROG = "onceflow-dev"
EMBEDDED = ("up", "down", "status")  # what `stack` does here; `topics` and `provision` are the platform's
# Kafka's command-line tools (bin/kafka-<tool>.sh in its distribution, which the embedded stack does not install):
# the same classes, from the jars the stack's broker runs. The messages that name a tool name its script.
KAFKA_TOOLS = {
    "transactions": "org.apache.kafka.tools.TransactionsCommand",
    "topics": "org.apache.kafka.tools.TopicCommand",
    "consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "acls": "org.apache.kafka.tools.AclCommand",
    "configs": "kafka.admin.ConfigCommand",
    "dump-log": "org.apache.kafka.tools.DumpLogSegments",
}


def cmd_stack(args, s: config.Settings) -> int:
    if args.action not in EMBEDDED:  # on any cluster, from a production image too
        return cli.cmd_stack(args, s)
    if args.action == "down":
        # everything the stack started, whatever this shell exported: its remembered topology wins here
        s = config.load(env={**os.environ, **config.remembered_stack(s.var_dir)}, **cli.app_overrides(args))
    s = cli.stack_settings(args, s)  # --brokers, --secured
    if args.spark_workers and not s.on_standalone:
        s = s.replace(master=f"spark://127.0.0.1:{stack.DEFAULT_SPARK_MASTER_PORT}")
    if args.action == "up":
        info = stack.up(s, spark_workers=args.spark_workers or 0, with_postgres=args.postgres)
        if s.brokers > 1 or args.spark_workers or s.secured:
            info["export"] = stack.exports(s)  # what the job, Airflow and the CLI must be started with
        if args.postgres and s.sink_kind != "postgres":
            info["postgres_sink"] = "provisioned; ONCEFLOW_SINK_KIND=postgres makes the job write to it"
        cli.print_record(info, args.json)
    elif args.action == "down":
        cli.print_record(stack.down(s), args.json)
    else:
        st = stack.status(s) | {"remembered": config.remembered_stack(s.var_dir)}
        cli.print_record(st, args.json)
        return 0 if st["broker"]["running"] else 1
    return 0


def cmd_produce(args, s: config.Settings) -> int:
    if args.detach:
        from onceflow.runtime import procs

        argv = [sys.executable, "-m", __name__] + [a for a in args.argv if a != "--detach"]
        proc = procs.spawn_detached(argv, s.log_dir / "generator.log")
        procs.write_pidfile(generator.pidfile(s), proc.pid, __name__)
        cli.print_record({"generator_pid": proc.pid, "log": str(s.log_dir / "generator.log")}, args.json)
        return 0

    spec = generator.GeneratorSpec(
        count=None if args.duration else args.count,
        duration_s=args.duration,
        rate=args.rate,
        event_rate=args.event_rate,
        start_ms=cli.timestamp_ms(args.start) if args.start else None,
        distinct_ips=args.ips,
        ipv6_fraction=args.ipv6,
        skew=args.skew,
        out_of_order_fraction=args.out_of_order,
        late_fraction=args.late,
        malformed_fraction=args.malformed,
        json_fraction=args.json_fraction,
        future_fraction=args.future,
        tail_s=args.tail,
        seed=args.seed,
        watermark_s=s.watermark_s,
        max_ahead_ms=s.max_event_ahead_ms,
    )
    res = generator.generate(
        s, spec, Path(args.manifest) if args.manifest else None, progress_every=args.progress_every
    )
    cli.print_record(vars(res), args.json)
    return 0


def cmd_airflow(args, s: config.Settings) -> int:
    if args.action == "up":
        info = airflow_local.up(s, trigger_deploy=not args.no_deploy)
        if not args.no_deploy:
            airflow_local.wait_job_started(s)
        cli.print_record({k: v for k, v in info.items() if k != "password"}, args.json)  # where, not what
    else:
        cli.print_record({"stopped": airflow_local.down(s)}, args.json)
    return 0


def cmd_where(args, s: config.Settings) -> int:
    from onceflow.runtime import jobctl, procs

    st = jobctl.status(s)
    ui = (
        f"  Airflow UI           http://localhost:{s.airflow_port}  user {airflow_local.USER}, password in "
        f"{airflow_local.password_file(s)}\n                       DAGs: {', '.join(airflow_local.all_dags(s))}\n"
        if procs.read_pidfile(airflow_local.pidfile(s))
        else ""
    )
    print(f"""
onceflow is running on the embedded stack.
{ui}
  Kafka (KRaft)        {s.bootstrap_servers}   topics: {s.source_topic} -> {s.sink_topic} (+ {s.dlq_topic}, {s.ledger_topic}, {s.job_events_topic}, {s.events_topic})
  job                  pid {st.job_pid}, last committed batch {st.last_batch}, checkpoint {s.checkpoint}
  job log              {st.log}
Look at the results:
  .venv/bin/onceflow show sink --limit 10      committed window counts (read_committed)
  .venv/bin/onceflow show ledger --limit 5     one record per committed batch
  .venv/bin/onceflow show dlq --limit 5        malformed input with its provenance
  .venv/bin/onceflow job status --json         progress, rates, watermark, offsets
  .venv/bin/onceflow audit                     check invariants I1-I4 now
Stop everything: make stop""")
    return 0


def cmd_kafka(args, s: config.Settings) -> int:
    from onceflow_dev import broker

    cmd = [broker.java(), "-cp", broker.kafka_classpath(s), KAFKA_TOOLS[args.tool], *args.tool_args]
    return subprocess.run(cmd, check=False).returncode


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__)
    cli.add_global_arguments(p, PROG)
    sub = p.add_subparsers(dest="command", required=True)

    st = sub.add_parser("stack", help="the embedded Kafka broker or cluster, Spark workers, PostgreSQL")
    cli.add_stack_arguments(st)
    st.set_defaults(fn=cmd_stack)

    pr = sub.add_parser("produce", help="emulate the NGINX access-log service")
    pr.add_argument("--count", type=int, default=10_000)
    pr.add_argument("--duration", type=float, help="seconds to run (needs --rate); overrides --count")
    pr.add_argument("--rate", type=float, default=0.0, help="records per second (0 = as fast as possible)")
    pr.add_argument(
        "--event-rate",
        type=float,
        help="records per second of event time (default: --rate, so event time follows the clock)",
    )
    pr.add_argument("--start", help="event time of the first record (epoch ms or ISO-8601; default now)")
    pr.add_argument("--ips", type=int, default=1000, help="distinct IPs")
    pr.add_argument("--ipv6", type=float, default=0.2, help="fraction of IPv6 addresses")
    pr.add_argument("--skew", type=float, default=0.0, help="Zipf exponent over IPs (0 = uniform)")
    pr.add_argument("--out-of-order", type=float, default=0.05)
    pr.add_argument("--late", type=float, default=0.01)
    pr.add_argument("--malformed", type=float, default=0.01)
    pr.add_argument(
        "--future",
        type=float,
        default=0.0,
        help="fraction of records from a client whose clock is a year ahead (quarantined by the job)",
    )
    pr.add_argument("--json-fraction", type=float, default=0.5, help="JSON records; the rest are log lines")
    pr.add_argument(
        "--tail",
        type=float,
        default=0.0,
        help="finish with one record per partition this many seconds later, to close windows",
    )
    pr.add_argument("--seed", type=int, default=1)
    pr.add_argument("--manifest", help="write what was sent (CSV) to this file")
    pr.add_argument("--progress-every", type=int, default=0)
    pr.add_argument("--detach", action="store_true", help="run in the background (stopped by `stack down`)")
    pr.add_argument("--json", action="store_true")
    pr.set_defaults(fn=cmd_produce)

    af = sub.add_parser("airflow", help="the embedded Airflow (standalone) with the control-plane DAGs")
    af.add_argument("action", choices=["up", "down"])
    af.add_argument("--no-deploy", action="store_true", help="do not trigger the app's deploy DAG (<app_id>_deploy)")
    af.add_argument("--json", action="store_true")
    af.set_defaults(fn=cmd_airflow)

    wh = sub.add_parser("where", help="where everything runs and how to look at the results")
    wh.set_defaults(fn=cmd_where)

    kf = sub.add_parser(
        "kafka",
        help="Kafka's own tools (kafka-<tool>.sh) from the stack's jars, e.g. `kafka transactions --bootstrap-server "
        "127.0.0.1:9092 find-hanging --broker-id 1`",
    )
    kf.add_argument("tool", choices=sorted(KAFKA_TOOLS))
    kf.add_argument("tool_args", nargs=argparse.REMAINDER, help="the tool's own arguments")
    kf.set_defaults(fn=cmd_kafka)
    return p


def main(argv: list[str] | None = None) -> int:
    return cli.run(parser(), sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    sys.exit(main())
