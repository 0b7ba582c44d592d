"""A backfill as a Spark application (spark-submit): --spec is the JSON of onceflow.backfill_rules.Spec (already
validated by the caller; it is validated again here), --out receives the report. Exit 0 when done, 2 when the
parameters are refused, 1 on failure."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from onceflow import backfill, config
from onceflow.backfill_rules import BackfillError, Spec, parse_offsets


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    settings = config.load()
    d = json.loads(a.spec)
    spec = Spec(**(d | {"start": parse_offsets(d["start"]), "end": parse_offsets(d["end"])}))
    try:
        report = backfill.run(SparkSession.builder.getOrCreate(), settings, spec)
    except BackfillError as e:
        print(f"onceflow: {e}", file=sys.stderr)
        return 2
    Path(a.out).write_text(json.dumps(report, default=str))
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
