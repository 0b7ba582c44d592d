"""Small, careful process helpers: pid files that survive pid reuse, detached starts, bounded waits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child (exited, not yet reaped) is not alive for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def write_pidfile(path: Path, pid: int, marker: str, **extra: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": pid, "marker": marker, "started": time.time(), **extra}))
    tmp.replace(path)


def read_pidfile(path: Path) -> dict | None:
    """The pid file's content if its process still runs (and is still ours: the marker is in its cmdline)."""
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    pid = int(info.get("pid", 0))
    if pid > 0 and pid_alive(pid) and info.get("marker", "") in cmdline(pid):
        return info
    return None


def free_port() -> int:
    """A loopback port nobody listens on right now (private brokers of tests, bench and chaos)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_run(n: int, step: int, attempts: int = 50) -> int:
    """A loopback port p with p, p + step, ..., p + step * (n - 1) all free: the controller ports of n Kafka nodes,
    spaced as onceflow.config.Settings.kafka_nodes spaces them."""
    import socket

    def free(port: int) -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) != 0

    for _ in range(attempts):
        p = free_port()
        if p + step * n < 65535 and all(free(p + step * i) for i in range(n)):
            return p
    raise RuntimeError(f"no {n} free loopback ports {step} apart after {attempts} tries")


def spawn_detached(
    argv: Sequence[str], log_file: Path, env: dict | None = None, cwd: Path | None = None
) -> subprocess.Popen:
    """Start a process in its own session (so a signal to its group reaches all its children)."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
            cwd=cwd,
            close_fds=True,
        )
    # Until the child has exec'd, /proc shows our own command line; a pid file written now would not be
    # recognised by its marker (read_pidfile) and the child would look dead. Wait for the exec (bounded).
    own = _raw_cmdline(os.getpid())
    deadline = time.monotonic() + 10
    while proc.poll() is None and _raw_cmdline(proc.pid) in (own, b"") and time.monotonic() < deadline:
        time.sleep(0.01)
    return proc


def _raw_cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def wait_until(cond: Callable[[], T | None], timeout: float, interval: float = 0.2, what: str = "condition") -> T:
    """Poll `cond` until it returns a truthy value or the deadline passes (TimeoutError)."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(os.getpgid(pid), sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def group_members(pgid: int) -> list[int]:
    """Live processes of process group `pgid` (from /proc), zombies excluded."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) "
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(d))
    return out


def stop_process(pid: int, timeout: float = 30.0, group: bool = True) -> bool:
    """SIGTERM, wait up to `timeout`, then SIGKILL. True if it stopped gracefully. With `group` (a process
    started by spawn_detached leads its own group), children that outlive the leader are stopped too: nothing
    it started is left running."""
    graceful = True
    if pid_alive(pid):
        (signal_group if group else os.kill)(pid, signal.SIGTERM)
        try:
            wait_until(lambda: not pid_alive(pid), timeout, what=f"pid {pid} to exit")
        except TimeoutError:
            graceful = False
            (signal_group if group else os.kill)(pid, signal.SIGKILL)
            wait_until(lambda: not pid_alive(pid), 10, what=f"pid {pid} to die")
    if group and group_members(pid):
        try:
            wait_until(lambda: not group_members(pid), 10, interval=0.2, what=f"process group {pid} to exit")
        except TimeoutError:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            wait_until(lambda: not group_members(pid), 10, interval=0.2, what=f"process group {pid} to die")
    return graceful
