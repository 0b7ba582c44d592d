"""What a benchmark ran on, beside its figures: cores, CPU model, and the CPU seconds of two fixed workloads.

Machines of one kind differ: the commit that read 11.1 CPU s a minute in `make bench-quiet` on 2026-11-27 read 26.1
on 2026-11-29 (docs/performance.md). CPU seconds from different days compare only with the machine's speed beside
them, so every results file carries it: a fixed pure-Python loop (the interpreter) and SHA-256 over 256 MiB of fixed
bytes (native code), each the best of three, in this process's CPU seconds (not wall time: another process's load
does not count, a slower core does)."""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

LOOP_N = 3_000_000  # about 0.25 s on this 2-core machine on 2026-11-29
HASH_MB = 256


def _loop() -> int:
    acc = 0
    for i in range(LOOP_N):
        acc = (acc + i * i) % 1_000_003
    return acc


def _hash() -> str:
    block, h = bytes(range(256)) * 4096, hashlib.sha256()  # 1 MiB
    for _ in range(HASH_MB):
        h.update(block)
    return h.hexdigest()


def cpu_s(work: Callable[[], object], tries: int = 3) -> float:
    """The fewest CPU seconds of this process `work` took in `tries` runs (the least disturbed one)."""
    best = float("inf")
    for _ in range(tries):
        t0 = time.process_time()
        work()
        best = min(best, time.process_time() - t0)
    return round(best, 3)


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The first `model name` of /proc/cpuinfo, or the platform's processor string where there is none."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def describe() -> dict:
    """The machine as a results file records it."""
    return {
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "cpu_model": cpu_model(),
        "calibration_cpu_s": {"python_loop": cpu_s(_loop), "sha256_256mb": cpu_s(_hash)},
    }
