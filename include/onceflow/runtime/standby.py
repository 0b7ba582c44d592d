"""A warm standby driver: up to its Spark session, then waiting for its supervisor's word to take over.

With `standby` on, the supervisor (onceflow.runtime.supervisor) keeps one standby launch next to the active one:
the same spark-submit command, with STANDBY_ENV naming the supervisor. Its driver builds and warms its session,
says it is ready, and waits. When the active driver's process is lost, the supervisor writes the go file naming
the standby's process group; the standby then starts exactly as a fresh driver does from there on (preflight,
the app's lock, a transactional producer that fences the dead one, the query from the checkpoint). The protocol
does not change: a standby is a driver that started early, and until it holds the lock and the transactional id
it has written nothing. A standby whose supervisor is gone exits.
"""

from __future__ import annotations

import os
import threading

from onceflow.config import Settings
from onceflow.rules import clock
from onceflow.runtime import procs
from onceflow.runtime.run_files import StandbyGo, StandbyReady

STANDBY_ENV = "ONCEFLOW_STANDBY_OF"  # set on a standby launch: the pid of the supervisor it serves
POLL_S = 0.05


def go_file(settings: Settings):
    return settings.run_dir / f"{settings.app_id}.standby.go"


def ready_file(settings: Settings):
    return settings.run_dir / f"{settings.app_id}.standby.json"


def pidfile(settings: Settings):
    return settings.run_dir / f"{settings.app_id}.standby.pid"


def is_standby() -> bool:
    return bool(os.environ.get(STANDBY_ENV))


def signal_go(settings: Settings, launch_pid: int) -> None:
    """Tell the standby launched as `launch_pid` (the leader of its process group) to take over."""
    StandbyGo(pgid=launch_pid, ts_ms=clock.now_ms()).write(go_file(settings))


def clear(settings: Settings) -> None:
    for f in (go_file(settings), ready_file(settings), pidfile(settings)):
        f.unlink(missing_ok=True)


def ready(settings: Settings, launch_pid: int) -> StandbyReady | None:
    """The standby launched as `launch_pid` has its session up: when, and its driver's pid."""
    st = StandbyReady.read(ready_file(settings))
    return st if st and st.pgid == launch_pid else None


def told_to_go(settings: Settings) -> bool:
    """In the standby driver: its word to take over has come (left for `wait_for_turn` to consume)."""
    go = StandbyGo.read(go_file(settings))
    return bool(go and go.pgid == os.getpgid(0))


def wait_for_turn(settings: Settings, stop: threading.Event) -> bool:
    """In the standby driver, once its session is warm: True when this launch is told to take over; False when
    it is stopped or its supervisor is gone (it then exits without having touched anything)."""
    supervisor_pid = int(os.environ[STANDBY_ENV])
    me = os.getpgid(0)
    StandbyReady(pgid=me, pid=os.getpid(), ready_ms=clock.now_ms()).write(ready_file(settings))
    while not stop.is_set():
        if told_to_go(settings):
            go_file(settings).unlink(missing_ok=True)  # consumed: a later standby waits for its own word
            ready_file(settings).unlink(missing_ok=True)
            return True
        if not procs.pid_alive(supervisor_pid):
            return False
        stop.wait(POLL_S)
    return False
