"""
### {app_id}_reconciliation

Proves that the `{app_id}` job's committed output is exact. **Scheduled** (every
`ONCEFLOW_RECONCILE_INTERVAL_MINUTES`, default 60): a gap-free chain. Each run reconciles every ledger batch
committed since the last batch a successful run proved, up to the newest one committed when it starts (at most
`ONCEFLOW_RECONCILE_MAX_BATCHES`; the rest goes to the next run), whatever the data interval says. A failed run
does not move the chain: the next run covers those batches again. A run with nothing new succeeds and says so.
`onceflow reconcile status` shows which batches are proven, pending or failed. **By hand**: a range of batches
(`first_batch`/`last_batch`) or of commit times (`since`/`until`), beside the chain; without a range, a manual
trigger runs the chain's next slice.

Every app:
* **I1 coverage**: the ledger's ranges are contiguous and non-overlapping per partition up to the group's
  committed offsets (gaps and overlaps with exact offsets);
* **replay**: the app's own plan, replayed over exactly the committed ranges batch by batch, computes exactly the
  results and DLQ records the sink and the DLQ hold, batch by batch, key by key (`docs/reconciliation.md`);
* **I4 visibility**: read_committed and read_uncommitted differ only by aborted or open transactions.

An app may declare an independent second check (`App.reference`): ip_count's recount adds **I2 accounting**
(counted + late + malformed + pending = source records, late checked against Spark's `numRowsDroppedByWatermark`),
**I3 results** (a recount written apart from its plan equals the sink for every (window, ip)), the DLQ record by
record, and a **Great Expectations** suite on the sink records (Data Docs under `var/reconciliation/<app>/gx`).

The recount runs as a Spark batch job (`onceflow/entrypoints/reconcile.py`) submitted through the Spark provider
(`spark_default`), detached; the `recount` task waits for it in Airflow's triggerer (no worker slot held) and shows
its progress in its log. Each result goes to the `onceflow_reconciliation` topic (a chain run's in one transaction with
the chain's move) and a JSON file; a failed check fails the run and alerts with the precise difference.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Param, dag, get_current_context, task

from onceflow.control import orchestration, reconciliation, task_defaults
from onceflow.control.operators import WaitForBatchJob

RECOUNT_TIMEOUT_S = 3600.0  # past it the recount is stopped and the run fails (the next run covers the same batches)


def build(app_id: str) -> DAG:
    """The reconciliation DAG of app instance `app_id` (ONCEFLOW_APPS; onceflow.control.orchestration.instances)."""
    s = orchestration.instance_settings(app_id)  # at parse time: the environment only, no connections
    defaults = task_defaults.default_args(timedelta(hours=2), app_id)  # the recount itself is stopped at 1 h

    @dag(
        **task_defaults.dag_args(app_id, "reconciliation", __doc__, "reconciliation"),
        schedule=timedelta(minutes=s.reconcile_interval_minutes),
        default_args=defaults,
        params={
            "first_batch": Param(
                None,
                type=["null", "integer"],
                minimum=0,
                description="by hand: the first ledger batch (with last_batch); empty: the chain",
            ),
            "last_batch": Param(None, type=["null", "integer"], minimum=0, description="by hand: the last batch"),
            "since": Param(
                None, type=["null", "string"], description="by hand: batches committed at or after this time (ISO-8601)"
            ),
            "until": Param(None, type=["null", "string"], description="by hand: ... and before this time"),
            "great_expectations": Param(True, type="boolean", description="run the GX suite on the sink range"),
        },
    )
    def dag_of_app():
        @task
        def submit() -> dict:
            ctx = get_current_context()
            s = orchestration.settings(app_id=app_id, role="reconcile")
            return reconciliation.submit_for_dag(
                s,
                ctx["params"],
                ctx["run_id"],
                lambda args: orchestration.batch_submit_argv(s, reconciliation.SCRIPT, args),
                timeout_s=RECOUNT_TIMEOUT_S,
            )

        @task
        def record(result: dict, handle: dict) -> dict:
            ctx = get_current_context()
            # the alerts are the control plane's to write
            sink = orchestration.alert_sink(orchestration.settings(app_id=app_id), ctx)
            return reconciliation.finish_for_dag(
                orchestration.settings(app_id=app_id, role="reconcile"), result, handle, sink
            )

        handle = submit()
        recount = WaitForBatchJob(task_id="recount", handle=handle)
        record(recount.output, handle)  # type: ignore[arg-type]  # TaskFlow: each XComArg is a dict at run time

    return dag_of_app()


for _app_id in orchestration.instances():
    build(_app_id)
