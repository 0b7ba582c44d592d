"""The reconciliation recount as a Spark application (spark-submit): reconciles a range of committed batches of
the app in ONCEFLOW_* settings (or, with --chain, the scheduled chain's next slice) and writes the result as JSON
to --out. Exit 0 when it ran (whatever the verdict:
the caller records and alerts), 2 on bad parameters."""

from __future__ import annotations

import argparse

from pyspark.sql import SparkSession

from onceflow import config
from onceflow.operations import batch_app, reconcile
from onceflow.rules.reconciliation import ReconcileError

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--first", type=int)
    ap.add_argument("--last", type=int)
    ap.add_argument("--since-ms", type=int)
    ap.add_argument("--until-ms", type=int)
    ap.add_argument("--chain", action="store_true", help="the scheduled chain's next slice (no range)")
    ap.add_argument("--no-gx", action="store_true")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    def body() -> dict:
        spark, s = SparkSession.builder.getOrCreate(), config.load()
        if a.chain:
            return reconcile.run_chain(spark, s, with_gx=not a.no_gx).as_dict()
        return reconcile.run(spark, s, a.first, a.last, a.since_ms, a.until_ms, with_gx=not a.no_gx).as_dict()

    batch_app.main(body, a.out, (ReconcileError,))
