"""The reconciliation recount as a Spark application (spark-submit): reconciles a range of committed batches of
the app in ONCEFLOW_* settings and writes the result as JSON to --out. Exit 0 when it ran (whatever the verdict:
the caller records and alerts), 2 on bad parameters, 1 when it could not run."""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from onceflow import config, reconcile
from onceflow.recon_rules import ReconcileError


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--first", type=int)
    ap.add_argument("--last", type=int)
    ap.add_argument("--since-ms", type=int)
    ap.add_argument("--until-ms", type=int)
    ap.add_argument("--no-gx", action="store_true")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    settings = config.load()
    spark = SparkSession.builder.getOrCreate()
    try:
        res = reconcile.run(spark, settings, a.first, a.last, a.since_ms, a.until_ms, with_gx=not a.no_gx)
    except ReconcileError as e:
        print(f"onceflow: {e}", file=sys.stderr)
        return 2
    Path(a.out).write_text(json.dumps(res.as_dict(), default=str))
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    import os

    os._exit(code)
