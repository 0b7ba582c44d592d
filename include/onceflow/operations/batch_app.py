"""The shell of onceflow's batch Spark applications (onceflow/entrypoints/reconcile.py, onceflow/entrypoints/backfill.py): logging, the result
file, exit codes (0 done, 2 parameters refused), and an exit that does not wait for the JVM gateway."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from onceflow import logs


def main(body: Callable[[], object], out: str, refused: tuple[type[BaseException], ...]) -> None:
    """Run `body` (it returns the JSON-able result), write the result to `out`, exit."""
    logs.setup("INFO")
    try:
        Path(out).write_text(json.dumps(body(), default=str))
        code = 0
    except refused as e:
        print(f"onceflow: {e}", file=sys.stderr)
        code = 2
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
