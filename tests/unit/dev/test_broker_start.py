"""The embedded broker's start: ports drawn where no outgoing connection takes them, and a node that cannot come
up named with its own last errors (a CI log shows only the exception)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from onceflow import config
from onceflow.runtime import procs
from onceflow_dev import broker, loopback


def test_free_ports_lie_below_the_kernels_ephemeral_range():
    low = procs._ephemeral_low()
    ports = {procs.free_port() for _ in range(50)}
    assert all(1024 <= p < low for p in ports), sorted(p for p in ports if p >= low)
    assert len(ports) > 1  # drawn, not one fixed port every caller shares


def test_a_loopback_cluster_gets_a_port_of_its_own_for_every_node_and_the_master(tmp_path):
    s = config.load(env={}, var_dir=tmp_path, **loopback.cluster())
    nodes = s.kafka_nodes()
    ports = [client for _, _, client, _ in nodes] + [ctl for *_, ctl in nodes] + [int(s.master.rsplit(":", 1)[1])]
    assert len(nodes) == 3 and len(set(ports)) == 7, (nodes, s.master)
    assert s.on_standalone and all(h == "127.0.0.1" for _, h, _, _ in nodes)
    assert not config.load(env={}, var_dir=tmp_path, **loopback.kafka()).on_standalone  # local[2]


def test_two_draws_in_one_process_never_hand_out_the_same_port(monkeypatch):
    # A drawn port stays free until its server binds it, so a stack's draws (a broker's port, the master's) could
    # land on one port: CI saw the master drawn on broker 1's port. The draw repeats here on purpose.
    import random

    monkeypatch.setattr(procs, "_handed_out", set(), raising=False)
    low = procs._ephemeral_low()
    repeated = max(1024, low - 12000) + 7
    draws = iter([repeated, repeated, repeated, repeated + 1, repeated + 2])
    monkeypatch.setattr(random, "randrange", lambda *_: next(draws))
    assert [procs.free_port(), procs.free_port(), procs.free_port()] == [repeated, repeated + 1, repeated + 2]


def test_a_controller_run_does_not_take_a_port_already_handed_out(monkeypatch):
    import random

    monkeypatch.setattr(procs, "_handed_out", set(), raising=False)
    low = procs._ephemeral_low()
    base = max(1024, low - 12000) + 11
    client = base + config.NODE_PORT_STEP  # the second controller port of a run starting at base
    draws = iter([client, base, base + 1])
    monkeypatch.setattr(random, "randrange", lambda *_: next(draws))
    assert procs.free_port() == client
    run = procs.free_port_run(3, config.NODE_PORT_STEP)
    assert client not in {run + config.NODE_PORT_STEP * i for i in range(3)}, run


def _settings(tmp_path):
    return config.load(env={}, var_dir=tmp_path, **loopback.kafka())


def _bind_failure_log(s) -> None:
    n = broker.node(s)
    n.server_log.parent.mkdir(parents=True, exist_ok=True)
    n.server_log.write_text(
        "[2026-11-27 10:00:00,000] INFO starting (kafka.server.KafkaRaftServer)\n"
        "[2026-11-27 10:00:01,000] ERROR [KafkaRaftServer nodeId=1] Fatal error during startup. "
        "(kafka.server.KafkaRaftServer)\n"
        f"org.apache.kafka.common.KafkaException: Socket server failed to bind to {n.address}: "
        "Address already in use.\n"
        "[2026-11-27 10:00:02,000] INFO shutting down (kafka.server.KafkaRaftServer)\n"
    )


def test_a_launched_node_that_exits_fails_at_once_with_its_last_error(tmp_path):
    s = _settings(tmp_path)
    _bind_failure_log(s)
    exited = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    exited.wait()
    with pytest.raises(broker.BrokerError) as e:
        broker._wait_ready(s, timeout=30, launched={1: exited})
    assert "node 1 exited with code 1" in str(e.value)
    assert "Address already in use" in str(e.value)
    assert "INFO" not in str(e.value)


def test_a_node_that_never_listens_times_out_saying_what_was_seen(tmp_path):
    s = _settings(tmp_path)
    _bind_failure_log(s)
    n = broker.node(s)
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) as alive:
        try:
            procs.write_pidfile(n.pidfile, alive.pid, "time.sleep")
            with pytest.raises(TimeoutError) as e:
                broker._wait_ready(s, timeout=1)
        finally:
            alive.kill()
    assert f"nothing listens at {n.address}" in str(e.value)
    assert "Address already in use" in str(e.value)
