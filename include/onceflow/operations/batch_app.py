"""The shell of onceflow's batch Spark applications (jobs/reconcile.py, jobs/backfill.py): logging, the result
file, exit codes (0 done, 2 parameters refused), and an exit that does not wait for the JVM gateway."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path


def main(body: Callable[[], object], out: str, refused: tuple[type[BaseException], ...]) -> None:
    """Run `body` (it returns the JSON-able result), write the result to `out`, exit."""
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        Path(out).write_text(json.dumps(body(), default=str))
        code = 0
    except refused as e:
        print(f"onceflow: {e}", file=sys.stderr)
        code = 2
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
