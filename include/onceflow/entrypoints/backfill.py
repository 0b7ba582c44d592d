"""A backfill as a Spark application (spark-submit): --spec is the JSON of onceflow.backfill_rules.Spec (validated
by the caller, and again here), --out receives the report. Exit 0 when done, 2 when the parameters are refused."""

from __future__ import annotations

import argparse
import json

from pyspark.sql import SparkSession

from onceflow import config
from onceflow.operations import backfill, batch_app
from onceflow.rules.backfill import BackfillError, Spec, parse_offsets

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    d = json.loads(a.spec)
    spec = Spec(**(d | {"start": parse_offsets(d["start"]), "end": parse_offsets(d["end"])}))
    batch_app.main(
        lambda: backfill.run(SparkSession.builder.getOrCreate(), config.load(), spec), a.out, (BackfillError,)
    )
