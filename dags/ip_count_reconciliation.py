"""
### ip_count_reconciliation

Proves, every hour, that the `ip_count` job's committed output is exact for the batches it committed in the
run's data interval (or, triggered by hand, for a range of batches or commit times):

* **I1 coverage**: the ledger's ranges are contiguous and non-overlapping per partition up to the group's
  committed offsets (gaps and overlaps with exact offsets);
* **I2 accounting**: counted + late + malformed + pending = source records, each measured on its own (late by the
  ledger's watermarks and Spark's rule, checked against Spark's `numRowsDroppedByWatermark`; malformed by reading
  the DLQ, record by record);
* **I3 results**: an independent Spark recount of exactly the committed offsets equals the sink for every
  (window, ip): duplicates, missing keys, wrong counts listed;
* **I4 visibility**: read_committed and read_uncommitted differ only by aborted or open transactions;
* a **Great Expectations** suite on the sink records of the range (Data Docs under `var/reconciliation/<app>/gx`).

The recount runs as a Spark batch job (`jobs/reconcile.py`) submitted through the Spark provider
(`spark_default`). Each result goes to the `onceflow_reconciliation` topic and a JSON file; a failed check fails
the run and alerts with the precise difference.
"""
from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Param, dag, get_current_context, task

from onceflow import orchestration, reconcile

DEFAULT_ARGS = {"owner": "onceflow", "retries": 0, "retry_delay": timedelta(minutes=5)}


@dag(dag_id="ip_count_reconciliation", schedule=timedelta(hours=1), catchup=False, max_active_runs=1,
     doc_md=__doc__, default_args=DEFAULT_ARGS, tags=["onceflow", "ip_count", "reconciliation"],
     params={"first_batch": Param(None, type=["null", "integer"], minimum=0,
                                  description="by hand: the first ledger batch (with last_batch)"),
             "last_batch": Param(None, type=["null", "integer"], minimum=0, description="by hand: the last batch"),
             "since": Param(None, type=["null", "string"],
                            description="by hand: batches committed at or after this time (ISO-8601)"),
             "until": Param(None, type=["null", "string"], description="by hand: ... and before this time"),
             "great_expectations": Param(True, type="boolean", description="run the GX suite on the sink range")})
def ip_count_reconciliation():
    @task
    def reconcile_range() -> dict:
        ctx = get_current_context()
        p = ctx["params"]
        rng = reconcile.range_from(p["first_batch"], p["last_batch"], p["since"], p["until"],
                                   ctx.get("data_interval_start"), ctx.get("data_interval_end"))
        s = orchestration.settings()
        out = reconcile.home(s) / "runs" / f"pending-{ctx['run_id'].replace(':', '_')}.json"
        argv = orchestration.batch_submit_argv(s, reconcile.SCRIPT, reconcile.args_for(
            **rng, with_gx=p["great_expectations"]) + ["--out", str(out)])
        res = reconcile.submitted(s, argv, out)
        reconcile.record(s, res, orchestration.alert_sink(s, ctx))
        summary = {c.name: f"{c.status}: {c.summary}" for c in res.checks}
        print(f"reconciled batches {res.first_batch}..{res.last_batch}: {summary}")
        if not res.ok:
            raise RuntimeError("reconciliation failed: " + "; ".join(
                f"{c.name}: {c.summary} {c.differences[:5]}" for c in res.failures()))
        return {"batches": [res.first_batch, res.last_batch], "checks": summary, "data_docs": res.data_docs}

    reconcile_range()


ip_count_reconciliation()
