"""Batch Spark jobs (reconciliation recounts, backfills), run detached so that nobody has to sit in a process and
wait for them: `start` launches one and returns a `Handle` (plain data: a DAG hands it to the triggerer, which
polls it without holding a worker slot), `poll` says whether it ended and which progress lines it printed since
the last look, `outcome` reads its result. `run` does all three in the caller's process, for the CLI and tests.

The job runs in a process group of its own under a small shell that records its exit code in a file, so the exit
code survives the launcher. While it runs it is registered in `registry` (one pid file each), so whoever stops
the platform stops it too (`stop_all`)."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from onceflow.config import Settings
from onceflow.rules import json_records, progress
from onceflow.runtime import procs
from onceflow.wire import OnceflowError

log = logging.getLogger(__name__)

# $1: the exit-code file; the rest: the job's command. The code is written to a temporary name and moved, so a
# reader never sees half of it; a job killed with its group writes none (`poll` then reports it vanished).
_SHELL = 'rc="$1"; shift; "$@"; code=$?; echo "$code" > "$rc.tmp" && mv "$rc.tmp" "$rc"; exit "$code"'


class BatchJobError(OnceflowError):
    """A batch job failed, vanished or ran past its deadline."""


@dataclass(frozen=True)
class Handle:
    """Where a detached batch job's pieces are: its pid file in the registry, exit-code file, log and result."""

    what: str
    pidfile: str
    rc_file: str
    log_file: str
    out: str
    deadline: float  # wall-clock seconds; past it the job is stopped

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Handle:
        return json_records.from_json(cls, d)


@dataclass(frozen=True)
class Poll:
    finished: bool
    rc: int | None  # None while it runs, or when it vanished without an exit code (killed)
    lines: list[str]  # progress lines since `offset`
    offset: int  # where the next look at the log starts


def registry(settings: Settings) -> Path:
    """The batch jobs running now, one pid file each."""
    return settings.run_dir / "batch-jobs"


def start(settings: Settings, what: str, argv: list[str], out: Path, log_file: Path, timeout_s: float) -> Handle:
    """Launch `argv` (spark-submit of onceflow/entrypoints/reconcile.py or onceflow/entrypoints/backfill.py) detached, its output appended to
    `log_file`; it must write its JSON result to `out`."""
    from onceflow.runtime import launcher

    tag = f"{what}-{uuid.uuid4().hex[:12]}"
    rc_file = registry(settings) / f"{tag}.rc"
    rc_file.parent.mkdir(parents=True, exist_ok=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)  # a result left by an earlier run is not this run's
    # niced inside the shell: the shell, whose pid marks the job as ours, never execs again (/proc/<pid>/cmdline
    # is empty for a moment during an exec, and a poll then would take the job for dead)
    nice = ["nice", "-n", str(settings.batch_job_nice)] if settings.batch_job_nice else []
    proc = procs.spawn_detached(
        ["/bin/sh", "-c", _SHELL, "onceflow-batch", str(rc_file), *nice, *argv],
        log_file,
        env=launcher.submit_env(settings),
    )
    pidfile = registry(settings) / f"{tag}.json"
    procs.write_pidfile(pidfile, proc.pid, str(rc_file), what=what)  # the rc file's name marks the process as ours
    log.info("%s job started (pid %d, log %s)", what, proc.pid, log_file)
    return Handle(what, str(pidfile), str(rc_file), str(log_file), str(out), time.time() + timeout_s)


def _exit_code(h: Handle) -> int | None:
    try:
        return int(Path(h.rc_file).read_text().strip())
    except (OSError, ValueError):
        return None


def poll(h: Handle, offset: int) -> Poll:
    """Has the job ended, and what progress did it print past `offset` of its log (complete lines only)?"""
    lines: list[str] = []
    try:
        with open(h.log_file, "rb") as f:
            f.seek(offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1
        lines, offset = progress.extract(chunk[:end].decode(errors="replace")), offset + end
    except OSError:
        pass
    rc = _exit_code(h)
    if rc is not None:
        return Poll(True, rc, lines, offset)
    alive = procs.read_pidfile(Path(h.pidfile)) is not None
    if not alive:
        rc = _exit_code(h)  # it may have ended between the two looks
    return Poll(not alive, rc, lines, offset)


def stop(h: Handle, timeout_s: float = 10.0) -> None:
    info = procs.read_pidfile(Path(h.pidfile))
    if info:
        procs.stop_process(int(info["pid"]), timeout_s)
    _forget(h)


def _forget(h: Handle) -> None:
    for f in (h.pidfile, h.rc_file):
        Path(f).unlink(missing_ok=True)


def tail(h: Handle, n: int = 15) -> str:
    p = Path(h.log_file)
    return "\n".join(p.read_text(errors="replace").splitlines()[-n:]) if p.exists() else ""


def outcome(h: Handle, rc: int | None) -> dict:
    """The ended job's result, or the reason it has none (with the log's last lines)."""
    _forget(h)
    if rc is None:
        raise BatchJobError(f"the {h.what} job was stopped before it finished (log {h.log_file}):\n{tail(h)}")
    if rc != 0 or not Path(h.out).exists():
        raise BatchJobError(f"the {h.what} job exited with {rc} (log {h.log_file}):\n{tail(h)}")
    return dict(json.loads(Path(h.out).read_text()))


def timed_out(h: Handle) -> BatchJobError:
    return BatchJobError(f"the {h.what} job did not finish by its deadline and was stopped (log {h.log_file})")


def run(
    settings: Settings,
    what: str,
    argv: list[str],
    out: Path,
    log_file: Path,
    timeout_s: float,
    on_progress: Callable[[str], None] = progress.report,
    interval_s: float = 1.0,
) -> dict:
    """Start the job and wait for it here, relaying its progress lines; a timeout, or the caller being stopped
    (Airflow raises in the task on SIGTERM), stops all of it (spark-submit, the driver JVM, its Python workers)."""
    h = start(settings, what, argv, out, log_file, timeout_s)
    offset = 0
    try:
        while True:
            p = poll(h, offset)
            offset = p.offset
            for line in p.lines:
                on_progress(line)
            if p.finished:
                return outcome(h, p.rc)
            if time.time() > h.deadline:
                raise timed_out(h)
            time.sleep(interval_s)
    except BaseException:
        stop(h)
        raise


def stop_all(settings: Settings, timeout_s: float = 30.0) -> list[int]:
    """Stop every batch job still registered (their callers are gone: Airflow was stopped under them)."""
    stopped = []
    for f in sorted(registry(settings).glob("*.json")):
        info = procs.read_pidfile(f)
        if info:
            procs.stop_process(int(info["pid"]), timeout_s)
            stopped.append(int(info["pid"]))
        f.unlink(missing_ok=True)
        f.with_suffix(".rc").unlink(missing_ok=True)
    return stopped
