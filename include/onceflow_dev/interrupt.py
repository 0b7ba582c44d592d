"""A long dev run (chaos, bench, soak) ended by SIGTERM stops what it started.

Python's default action on SIGTERM ends the process at once, without its `finally` blocks, so a chaos run
stopped by `kill` or `timeout` left the brokers, the Spark master and workers and the job of the seed it was on
running and listening. Here SIGTERM raises SystemExit in the main thread, as Ctrl-C raises KeyboardInterrupt, so
the run's own teardown stops them. A second SIGTERM while that teardown runs is ignored: it bounds itself (each
stop is SIGTERM then SIGKILL after a timeout), and SIGKILL still ends the run at once.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from typing import NoReturn

EXIT_CODE = 128 + signal.SIGTERM  # what a shell reports for a process ended by SIGTERM


def _on_sigterm(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(EXIT_CODE)


def run(main: Callable[[], int | None]) -> NoReturn:
    """Run a dev entry point's `main` with SIGTERM turned into SystemExit; exit with its return code."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    sys.exit(main())
