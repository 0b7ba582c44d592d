"""Small, careful process helpers: pid files that survive pid reuse, detached starts, bounded waits."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import NamedTuple, TypeVar

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
    for _ in range(50):
        if pid <= 0 or not pid_alive(pid):
            return None
        # A process in the middle of an exec (spark-submit execs twice before its JVM runs) shows an empty cmdline
        # for a moment: read again rather than take it for dead.
        if cmd := cmdline(pid):
            return info if info.get("marker", "") in cmd else None
        time.sleep(0.002)
    return None


# Ports this process has handed out: a draw is free only until its server binds it, so two draws for one stack (a
# broker's client port and the Spark master's, say) could otherwise both land on the same still-unbound port.
_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()


def free_port() -> int:
    """A loopback port nobody listens on right now and this process has not handed out before (private brokers of
    tests, bench and chaos).

    Drawn below the kernel's ephemeral range: a port the kernel hands out itself (bind to 0) is also the local port
    of the next outgoing connection, and between this check and the server's bind a few seconds pass (a broker
    formats its storage first) in which another process's client connection can take it."""
    import random

    low = _ephemeral_low()
    drawn = (random.randrange(max(1024, low - 12000), low) for _ in range(200 if low > 2048 else 0))
    kernels = (_kernels_port() for _ in range(20))  # a crowded range: fall back to the kernel's choice
    with _handed_out_lock:
        for port in itertools.chain(drawn, kernels):
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
    raise RuntimeError("no free loopback port")


def _bindable(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _kernels_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default 32768 where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port_run(n: int, step: int, attempts: int = 50) -> int:
    """A loopback port p with p, p + step, ..., p + step * (n - 1) all free: the controller ports of n Kafka nodes,
    spaced as onceflow.config.Settings.kafka_nodes spaces them."""
    import socket

    def free(port: int) -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) != 0

    for _ in range(attempts):
        p = free_port()
        run = [p + step * i for i in range(n)]
        if p + step * n < 65535 and all(free(q) for q in run[1:]):
            with _handed_out_lock:
                if not _handed_out.intersection(run[1:]):
                    _handed_out.update(run)
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


def _live_stats() -> dict[int, list[str]]:
    """Every live process's /proc/<pid>/stat fields after "pid (comm) ": state, ppid, pgrp, ... (zombies left out)."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] != "Z":
            out[int(d)] = fields
    return out


def group_members(pgid: int) -> list[int]:
    """Live processes of process group `pgid` (from /proc), zombies excluded."""
    out = []
    for pid, fields in _live_stats().items():
        if int(fields[2]) == pgid:
            out.append(pid)
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


class Listener(NamedTuple):
    """A TCP socket a process listens on."""

    pid: int
    host: str  # as the kernel reports it: 127.0.0.1, 0.0.0.0, ::, ::1, ::ffff:127.0.0.1
    port: int


def listening_sockets(pids: Iterable[int]) -> list[Listener]:
    """The TCP sockets (IPv4 and IPv6) these processes listen on, from /proc: the kernel's tables of this network
    namespace (/proc/net/tcp, tcp6: state 0A, LISTEN) matched by inode against each process's file descriptors. A
    socket a child inherited is listed under each process holding it; a process that is gone or whose descriptors
    cannot be read (another user's) is left out."""
    listening: dict[str, tuple[str, int]] = {}  # socket inode -> (address, port)
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue  # no IPv6 in this kernel
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == "0A":
                addr, port = cols[1].split(":")
                listening[cols[9]] = (_kernel_address(addr), int(port, 16))
    out = []
    for pid in sorted(set(pids)):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        inodes = set()
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in listening:
                inodes.add(target[8:-1])
        out += sorted(Listener(pid, *listening[i]) for i in inodes)
    return out


def _kernel_address(hex_addr: str) -> str:
    """An address of /proc/net/tcp{,6}: hex of 32-bit words, each in the host's byte order."""
    import socket
    import sys

    raw = bytes.fromhex(hex_addr)
    if sys.byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw)


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1, or an IPv4-mapped loopback address (::ffff:127.0.0.1)."""
    import ipaddress

    addr = ipaddress.ip_address(host)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def beyond_loopback(pids: Iterable[int]) -> list[Listener]:
    """The TCP sockets these processes listen on at an address other than loopback."""
    return [x for x in listening_sockets(pids) if not is_loopback(x.host)]


def describe(pid: int, limit: int = 300) -> str:
    """A process's command line for a message: a JVM's without its class path (which would hide its main class)."""
    words = cmdline(pid).split()
    return " ".join(w for i, w in enumerate(words) if not (i and words[i - 1] in ("-cp", "-classpath")))[:limit]


def with_descendants(pids: Iterable[int]) -> set[int]:
    """These processes and every live process descending from them (by parent pid, from /proc). A process that
    renames itself (setproctitle, as Airflow's components do) overwrites the environment /proc shows for it: its
    descent still finds it."""
    children: dict[int, list[int]] = {}
    for pid, fields in _live_stats().items():
        children.setdefault(int(fields[1]), []).append(pid)
    out: set[int] = set()
    todo = list(pids)
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.add(pid)
            todo += children.get(pid, [])
    return out
