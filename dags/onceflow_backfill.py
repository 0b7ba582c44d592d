"""
### {app_id}_backfill

Manual only. Recomputes the app's results (for ip_count the 5 s windows per IP) over a range of its source
topics with a Spark batch job (`onceflow/entrypoints/backfill.py`, submitted through the Spark provider, detached)
and writes them exactly once to the target topic (default `{app_id}_backfill`, never the live sink). The `run`
task waits for it in Airflow's triggerer (no worker slot held) and shows its progress in its log: chunk k of n,
records, rate, ETA. One Kafka transaction per chunk of `chunk_size` results, with a ledger record (kind
`backfill`) and the backfill group's offsets carrying the chunk number. Re-running or resuming the same
`backfill_id` continues after the last committed chunk and never writes a chunk twice; the same id with other
parameters is refused. Every parameter is checked before anything is written (range order, offsets within the
sources' retention, topics exist, no overlap with a running backfill). `dry_run` reports what would be written.
How the backfill relates to the live sink: `docs/backfill.md`.
"""

from __future__ import annotations

import json
from datetime import timedelta

from airflow.sdk import DAG, Param, dag, get_current_context, task

from onceflow.control import orchestration, task_defaults
from onceflow.control.operators import WaitForBatchJob
from onceflow.operations import backfill


def build(app_id: str) -> DAG:
    """The backfill DAG of app instance `app_id` (ONCEFLOW_APPS; onceflow.control.orchestration.instances)."""
    defaults = task_defaults.default_args(timedelta(hours=7), app_id)  # the job itself is stopped at 6 h

    @dag(
        **task_defaults.dag_args(app_id, "backfill", __doc__, "backfill", max_active_runs=4),
        schedule=None,
        default_args=defaults,
        params={
            "backfill_id": Param(
                "backfill-1",
                type="string",
                pattern=backfill.ID_PATTERN,
                description="re-running the same id resumes it and writes nothing twice",
            ),
            "start_offsets": Param(
                None,
                type=["null", "object"],
                description='source range by offsets: {"0": 0, "1": 0, ...} (inclusive); an app of several '
                'source topics names each: {"topic:0": 0, ...}',
            ),
            "end_offsets": Param(None, type=["null", "object"], description="... to these offsets (exclusive)"),
            "since": Param(
                None,
                type=["null", "string"],
                description="or by time (Kafka record timestamps): from this ISO-8601 time",
            ),
            "until": Param(None, type=["null", "string"], description="... to this one (exclusive)"),
            # null, not "": a required string left empty would keep the UI's trigger button disabled
            "target_topic": Param(
                None, type=["null", "string"], description="the topic to write; empty: ONCEFLOW_BACKFILL_TOPIC"
            ),
            "chunk_size": Param(
                5000, type="integer", minimum=1, maximum=1_000_000, description="windows per transaction"
            ),
            "dry_run": Param(False, type="boolean", description="report what would be written; write nothing"),
        },
    )
    def dag_of_app():
        @task
        def validate() -> dict:
            p = get_current_context()["params"]
            s = orchestration.settings(app_id=app_id, role="backfill")
            spec = backfill.validate(
                s,
                backfill.spec_from(
                    s,
                    p["backfill_id"],
                    p["start_offsets"],
                    p["end_offsets"],
                    p["since"],
                    p["until"],
                    p["target_topic"] or None,
                    p["chunk_size"],
                    p["dry_run"],
                ),
            )
            return spec.as_dict() | {"spec_hash": spec.spec_hash()}

        @task
        def submit(spec: dict) -> dict:
            ctx = get_current_context()
            s = orchestration.settings(app_id=app_id, role="backfill")
            spec.pop("spec_hash", None)
            out = s.var_dir / "backfills" / f"{spec['id']}-{ctx['run_id'].replace(':', '_')}.json"
            argv = orchestration.batch_submit_argv(
                s, backfill.SCRIPT, ["--spec", json.dumps(spec, default=str), "--out", str(out)]
            )
            return backfill.submit(s, argv, out)

        @task
        def report(report: dict) -> dict:
            print(f"backfill {report['id']}: {report}")
            return report

        run = WaitForBatchJob(task_id="run", handle=submit(validate()))  # type: ignore[arg-type]
        report(run.output)  # type: ignore[arg-type]  # TaskFlow: each XComArg is a dict at run time

    return dag_of_app()


for _app_id in orchestration.instances():
    build(_app_id)
