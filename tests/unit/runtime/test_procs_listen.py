"""procs.listening_sockets: the TCP sockets a process listens on, read from /proc, told apart by address."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from onceflow.runtime import procs


def _listen(family: int, host: str) -> socket.socket:
    s = socket.socket(family, socket.SOCK_STREAM)
    if family == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s.bind((host, 0))
    s.listen()
    return s


def test_listening_sockets_names_loopback_and_wildcard_listeners_of_a_process():
    with (
        _listen(socket.AF_INET, "127.0.0.1") as lo,
        _listen(socket.AF_INET, "0.0.0.0") as anywhere,
        socket.socket() as bound_only,
        socket.create_connection(lo.getsockname()) as client,
    ):
        bound_only.bind(("127.0.0.1", 0))  # bound, not listening: not a listener
        found = procs.listening_sockets([os.getpid()])
        mine = {(h, p) for pid, h, p in found if pid == os.getpid()}
        assert ("127.0.0.1", lo.getsockname()[1]) in mine
        assert ("0.0.0.0", anywhere.getsockname()[1]) in mine
        assert bound_only.getsockname()[1] not in {p for _, p in mine}
        assert client.getsockname()[1] not in {p for _, p in mine}
        bad = [(h, p) for h, p in mine if not procs.is_loopback(h)]
        assert bad == [("0.0.0.0", anywhere.getsockname()[1])]


@pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6")
def test_listening_sockets_reads_ipv6_listeners():
    try:
        lo6 = _listen(socket.AF_INET6, "::1")
        any6 = _listen(socket.AF_INET6, "::")
    except OSError as e:
        pytest.skip(f"IPv6 not usable here: {e}")
    with lo6, any6:
        mine = {(h, p) for _, h, p in procs.listening_sockets([os.getpid()])}
        assert ("::1", lo6.getsockname()[1]) in mine
        assert ("::", any6.getsockname()[1]) in mine


def test_listening_sockets_of_another_process_and_of_a_gone_one():
    code = "import socket,sys,time; s=socket.socket(); s.bind(('0.0.0.0',0)); s.listen(); print(s.getsockname()[1]); sys.stdout.flush(); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        assert procs.Listener(child.pid, "0.0.0.0", port) in procs.listening_sockets([child.pid, 2**22 + 7])
    finally:
        child.kill()
        child.wait()
    assert procs.listening_sockets([child.pid]) == []


@pytest.mark.parametrize(
    "host, loopback",
    [
        ("127.0.0.1", True),
        ("127.3.2.1", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("::ffff:10.1.2.3", False),
    ],
)
def test_is_loopback(host, loopback):
    assert procs.is_loopback(host) is loopback


def test_kernel_addresses_decode_as_the_kernel_writes_them():
    if sys.byteorder != "little":
        pytest.skip("the fixtures are little-endian /proc lines")
    assert procs._kernel_address("0100007F") == "127.0.0.1"
    assert procs._kernel_address("00000000") == "0.0.0.0"
    assert procs._kernel_address("00000000000000000000000001000000") == "::1"
    assert procs._kernel_address("0000000000000000FFFF00000100007F") == "::ffff:127.0.0.1"


@pytest.mark.parametrize(
    "master, listen, expected",
    [
        ("local[*]", "127.0.0.1", {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}),
        ("local", "127.0.0.1", {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}),
        (
            "spark://127.0.0.1:7077",
            "127.0.0.1",
            {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"},
        ),
        (
            "spark://localhost:7077,127.0.0.2:7077",
            "127.0.0.1",
            {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"},
        ),
        ("local[2]", "0.0.0.0", {"spark.driver.bindAddress": "0.0.0.0"}),
        # executors elsewhere must reach the driver: Spark's defaults
        ("spark://10.0.0.5:7077", "127.0.0.1", {}),
        ("spark://127.0.0.1:7077,spark-master-2:7077", "127.0.0.1", {}),
        ("k8s://https://kubernetes.default.svc", "127.0.0.1", {}),
        ("yarn", "127.0.0.1", {}),
    ],
)
def test_the_driver_binds_the_listen_address_when_its_executors_are_on_this_machine(master, listen, expected):
    from onceflow import config
    from onceflow.runtime import launcher

    s = config.load(env={}, master=master, listen_host=listen)
    for conf in (launcher.spark_conf(s), launcher.batch_conf(s)):  # the job; the recount, backfills, local_session
        assert {k: v for k, v in conf.items() if k in ("spark.driver.host", "spark.driver.bindAddress")} == expected


def test_the_listen_address_is_an_ip_address():
    from onceflow import config

    assert config.load(env={}).listen_host == "127.0.0.1"
    assert config.load(env={"ONCEFLOW_LISTEN_HOST": "0.0.0.0"}).listen_host == "0.0.0.0"
    for bad in ("localhost", "example.org", "127.0.0.1:8080", ""):
        with pytest.raises(config.ConfigError, match="LISTEN_HOST"):
            config.load(env={}, listen_host=bad)


def test_with_descendants_finds_children_and_grandchildren():
    code = "import subprocess,sys; subprocess.run([sys.executable,'-c','import time; time.sleep(30)'])"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        grandchild = procs.wait_until(
            lambda: [p for p in procs.with_descendants([child.pid]) if p != child.pid], 10, what="the grandchild"
        )
        assert len(grandchild) == 1 and procs.pid_alive(grandchild[0])
        assert {os.getpid(), child.pid, grandchild[0]} <= procs.with_descendants([os.getpid()])
    finally:
        for p in procs.with_descendants([child.pid]):
            os.kill(p, 9)
        child.wait()


def test_a_pid_file_reads_its_process_as_running_through_each_exec(tmp_path):
    """spark-submit execs twice before its JVM runs, and an exec empties /proc/<pid>/cmdline for a moment: a pid
    file read then must not take the process for dead (a batch job was failed as vanished so)."""
    marker = f"marker-{os.getpid()}"
    argv = ["nice", "-n", "0"] * 40 + ["/bin/sh", "-c", "sleep 0.3", marker]
    proc = subprocess.Popen(argv, start_new_session=True)
    try:
        pidfile = tmp_path / "p.json"
        procs.write_pidfile(pidfile, proc.pid, marker)
        misses = 0
        while proc.poll() is None:
            if procs.read_pidfile(pidfile) is None and proc.poll() is None:
                misses += 1
        assert misses == 0
        assert procs.read_pidfile(pidfile) is None  # gone
    finally:
        proc.kill()
        proc.wait()
