"""The benches' Stamper: stamps each result of a sink with the moment it became visible, in a process of its own.

As a thread of the bench's own process it ran beside the live feeds' producer threads (two beside a second job),
and its stamps trailed the batches' commits by up to 3.6 s at the row's max; in a process of its own, by 0.6 s
(docs/performance.md, "Two jobs on one machine"). A subprocess (not multiprocessing:
its spawn leaves a resource tracker running, its fork copies the feeds' and clients' threads) that takes its
settings pickled on stdin, stamps until stdin closes, and writes the stamps pickled on stdout.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import threading
from typing import cast

from onceflow import config
from onceflow.kafka import clients as kafka_clients
from onceflow.rules import clock

Stamps = list[tuple[int, str]]  # (ms when it became visible, its anchor: a window's end or an event time)


def anchor(value: dict) -> str:
    """What a result's latency is measured from: its window's end (ip_count's windows), else the event time of the
    record it stands for (a stateless app's one result per record: ip_networks' `ts`)."""
    return value["window_end"] if "window_end" in value else value["ts"]


def arrived(c, wait_s: float, most: int = 5000) -> list:
    """The messages the consumer holds now, waiting up to `wait_s` for the first: the poll returns on the first
    message, the consume that follows takes what is queued without waiting. A single `consume(most, wait_s)` returns
    only once it has `most` messages or its timeout has passed: the last ones of a commit (fewer than `most`)
    waited out the timeout, and a window's last results were stamped 200-280 ms after its first (2026-12-04)."""
    first = c.poll(wait_s)
    return [] if first is None else [first, *c.consume(num_messages=most, timeout=0)]


def stamp_topics(s: config.Settings, stop: threading.Event) -> Stamps:
    """Read the sink's topics with read_committed; each result is stamped as it is seen."""
    seen: Stamps = []
    c = kafka_clients.read_committed_consumer(s, group_id=f"bench.stamper.{s.app_id}", **{"fetch.wait.max.ms": 50})
    c.subscribe(list(s.sink_topics))
    while not stop.is_set():
        for m in arrived(c, 0.2):
            if m.error() is None:
                v = json.loads(cast(bytes, m.value()))  # the sink's records always carry a value
                seen.append((clock.now_ms(), anchor(v)))
    c.close()
    return seen


def stamp_table(s: config.Settings, stop: threading.Event) -> Stamps:
    """A table sink: poll the results table every 200 ms (as a dashboard would) for the rows of batches not seen
    yet; each is visible from its transaction's commit."""
    from psycopg import sql

    from onceflow.database import client

    seen: Stamps = []
    last = -1
    with client.connect(s, "bench") as conn:
        conn.autocommit = True  # each poll sees what has committed since the last
        query = sql.SQL("SELECT batch, value FROM {} WHERE batch > %s").format(client.table(s, "results"))
        while not stop.wait(0.2):
            rows = conn.execute(query, (last,)).fetchall()
            now = clock.now_ms()
            for batch, value in rows:
                seen.append((now, anchor(json.loads(value))))
                last = max(last, batch)
    return seen


class Stamper:
    """start(), then stop(timeout): the stamps. A stamper that failed raises on stop rather than leave a latency
    row without results."""

    def __init__(self, s: config.Settings):
        self.s = s
        self._proc: subprocess.Popen | None = None

    def start(self) -> None:
        argv = [sys.executable, "-m", "onceflow_dev.stamper"]
        self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self._proc.stdin is not None
        self._proc.stdin.write(pickle.dumps(self.s))
        self._proc.stdin.flush()

    def discard(self) -> None:
        """Stop it without its stamps, on a path that is already failing: its own error would hide the first."""
        if self._proc is not None and self._proc.returncode is None:
            self._proc.kill()
            self._proc.communicate()

    def stop(self, timeout: float) -> Stamps:
        """Closing the process's stdin stops it; its stamps come back on its stdout."""
        p = self._proc
        assert p is not None, "stop() before start()"
        try:
            out, _ = p.communicate(timeout=timeout)  # closes stdin after sending nothing more
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            raise RuntimeError(f"the stamper of {self.s.app_id} did not stop within {timeout} s") from None
        if p.returncode != 0 or not out:
            raise RuntimeError(f"the stamper of {self.s.app_id} ended (exit {p.returncode}) without its stamps")
        return pickle.loads(out)


def main() -> int:
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # stdout carries the stamps alone
    s = pickle.load(sys.stdin.buffer)
    stop = threading.Event()

    def wait_for_eof() -> None:
        sys.stdin.buffer.read()  # the bench closes stdin to stop the stamper
        stop.set()

    threading.Thread(target=wait_for_eof, daemon=True).start()
    seen = (stamp_table if s.sink_kind == "postgres" else stamp_topics)(s, stop)
    out.write(pickle.dumps(seen))
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
