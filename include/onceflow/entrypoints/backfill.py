"""A backfill as a Spark application (spark-submit): --spec is the JSON of onceflow.rules.backfill.Spec
(Spec.as_dict; validated by the caller, and again here), --out receives the report. Exit 0 when done, 2 when the
parameters are refused."""

from __future__ import annotations

import argparse
import json

from pyspark.sql import SparkSession

from onceflow import config
from onceflow.operations import backfill, batch_app
from onceflow.rules.backfill import BackfillError, Spec

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    spec = Spec.from_dict(json.loads(a.spec))
    batch_app.main(
        lambda: backfill.run(SparkSession.builder.getOrCreate(), config.load(), spec), a.out, (BackfillError,)
    )
