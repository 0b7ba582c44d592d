"""The one logging setup of onceflow's processes: one line format to stderr, the chatty libraries quiet unless asked.

The streaming job's driver, the batch applications (backfill, recount), the CLI and the development tools call
`setup`; where the lines go from there is the process's own business (the job's stderr is its log file, the CLI
adds var/log/cli.log). Events, not log lines, are the platform's record of what happened (onceflow.kafka.events).
"""

from __future__ import annotations

import logging
import sys

FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
SHORT = "%(asctime)s %(message)s"  # the development tools' progress lines, read by a person at a terminal
NOISY = ("py4j", "great_expectations", "urllib3", "filelock")


def setup(level: int | str = logging.INFO, fmt: str = FORMAT, verbose: bool = False) -> logging.Handler:
    """Route the root logger to stderr at `level` (replacing any handler), the noisy libraries at WARNING (DEBUG
    when `verbose`). Returns the stderr handler, for a caller that filters it."""
    root = logging.getLogger()
    root.setLevel(level)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(fmt))
    root.handlers[:] = [handler]
    for name in NOISY:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.WARNING)
    return handler
