"""Past one machine's defaults: a Kafka cluster of three KRaft nodes (a controller quorum of three, topics replicated
three ways with min.insync.replicas=2) and a Spark standalone cluster (a master and two workers, each worker with
its own executor JVM), the job submitted to it in client mode by the same launch spec as in local mode, with a
512 MiB driver. Faults: kill -9 of the broker that leads the sink's partitions while the job runs on, a Spark
worker killed in the middle of the job; and one batch whose output (two million windows) is far larger than the
driver's memory, committed once."""

from __future__ import annotations

import json
import threading

import pytest
from confluent_kafka import Producer, TopicPartition

from onceflow import config
from onceflow.control import reconciliation
from onceflow.kafka import clients as kafka_clients
from onceflow.kafka import cluster, topics
from onceflow.kafka import reading as kafka_reading
from onceflow.rules.names import private_topics
from onceflow.runtime import jobctl, launcher, preflight, procs, supervisor
from onceflow_dev import broker, loopback, spark_cluster, stack
from tests.support.harness import assert_exact, produce, wait_drained

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def topology(tmp_path_factory):
    var = tmp_path_factory.mktemp("cluster")
    base = config.load(
        env={},
        var_dir=var,
        **loopback.cluster(),
        driver_memory="512m",
        executor_memory="1500m",
        cores_max=2,  # one executor on each worker; their other cores stay free for the recount
        broker_txn_abort_check_interval_ms=1000,
        broker_transaction_max_timeout_ms=300_000,
        transaction_timeout_ms=300_000,
        trigger_interval_s=1.0,
        restart_delay_s=1.0,
        restart_attempts=10,
    )
    assert (base.replication_factor, base.min_insync_replicas) == (3, 2)
    try:
        # as a user brings it up: the command in a shell (free ports, and the brokers' transaction settings for the
        # tests' short timeouts, passed as the variables a user would export)
        up = _onceflow(
            var,
            "stack",
            "up",
            "--brokers",
            "3",
            "--spark-workers",
            "2",
            ONCEFLOW_BOOTSTRAP_SERVERS=base.bootstrap_servers,
            ONCEFLOW_CONTROLLER_PORT=str(base.controller_port),
            ONCEFLOW_MASTER=base.master,
            ONCEFLOW_BROKER_TXN_ABORT_CHECK_INTERVAL_MS=str(base.broker_txn_abort_check_interval_ms),
            ONCEFLOW_BROKER_TRANSACTION_MAX_TIMEOUT_MS=str(base.broker_transaction_max_timeout_ms),
        )
        assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-3000:]
        yield base
    finally:
        spark_cluster.stop(base)  # whatever the last test's `stack down` left (none: it checks)
        broker.stop(base)


def _onceflow(var, *args: str, **env: str):
    """`onceflow ...` in a fresh shell: nothing exported but the var dir (a user's checkout has var/ already) and
    what `env` adds; the test session's token, so nothing it starts can outlive the session unnoticed."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    keep = ("PATH", "HOME", "LANG", "JAVA_HOME", "PYTEST_ONCEFLOW_SESSION")
    shell = {k: os.environ[k] for k in keep if k in os.environ} | {"ONCEFLOW_VAR_DIR": str(var)} | env
    exe = Path(sys.executable).parent / "onceflow"
    return subprocess.run([str(exe), *args], env=shell, capture_output=True, text=True, timeout=900)


def app_of(base: config.Settings, name: str, **kw) -> config.Settings:
    s = base.replace(app_id=name, **(private_topics(name) | kw))
    topics.ensure(s)
    return s


def test_three_brokers_replicate_every_topic_and_status_names_the_coordinators(topology):
    s = app_of(topology, "topo")
    st = stack.status(s)
    assert [n["running"] for n in st["broker"]["nodes"]] == [True, True, True]
    assert st["spark_cluster"]["alive_workers"] == 2 and st["spark_cluster"]["master"] == s.master
    c = st["cluster"]
    assert sorted(c["brokers"]) == ["1", "2", "3"] and c["controller"] in (1, 2, 3)
    for name in (s.source_topic, s.sink_topic, s.dlq_topic, s.ledger_topic):
        for part in c["topics"][name].values():
            assert sorted(part["replicas"]) == [1, 2, 3] and sorted(part["in_sync"]) == [1, 2, 3], (name, part)
    # __transaction_state is created by the first transactional producer: until then there is no coordinator
    assert c["transaction_coordinator"] is None or c["transaction_coordinator"]["broker"] in (1, 2, 3)
    p = Producer({**kafka_clients.base(s), "transactional.id": s.transactional_id})
    p.init_transactions(60)
    tc = procs.wait_until(
        lambda: cluster.describe(s)["transaction_coordinator"], 60, interval=1, what="the transaction coordinator"
    )
    assert tc["broker"] in (1, 2, 3)
    assert tc["partition"] == cluster.coordinator_partition(s.transactional_id, 4)
    # the coordinator by our hash is the one Kafka's own tool reports
    assert tc["broker"] == _kafka_tool_coordinator(s)


def test_the_job_on_spark_workers_loses_nothing_when_a_broker_and_a_worker_die(topology, tmp_path):
    s = app_of(topology, "topo_faults", max_offsets_per_trigger=3000)
    done = threading.Event()
    fed: dict = {}
    feeder = threading.Thread(
        target=lambda: fed.update(
            sent=produce(
                s,
                tmp_path / "m.csv",
                stop=done,  # input flows through every fault, until the last one has been survived
                count=1_000_000,
                rate=400,
                event_rate=400,
                distinct_ips=300,
                late_fraction=0.01,
                malformed_fraction=0.01,
                seed=101,
                start_ms=1_795_000_000_000,
                tail_s=30,  # when stopped: one record per partition 30 s later closes every window
            )
        ),
        daemon=True,
    )
    jobctl.start(s)
    try:
        jobctl.wait_running(s, timeout=300)
        feeder.start()
        jobctl.wait_for_commit(s, timeout=180)
        # everything runs (three brokers, the master, two workers, their executors, the driver): all on loopback
        assert not (beyond := _listening_beyond_loopback()), beyond
        # kill -9 the broker that leads the sink's first partition: the job keeps committing on the other two
        leader = cluster.describe(s)["topics"][s.sink_topic]["0"]["leader"]
        broker.kill(s, leader)
        down_since = jobctl.status(s).last_batch
        # a (re)start's preflight passes with a node down, before the controller has fenced it: the dead node is
        # still listed in the metadata and does not answer, the two others do
        assert preflight.check_job(s)["broker_transaction_max_timeout_ms"] == s.broker_transaction_max_timeout_ms
        # (if the killed broker also coordinated the app's group, librdkafka's send_offsets hangs: the writer gives
        # up on that producer after 45 s and the job restarts, docs/cluster.md)
        procs.wait_until(
            lambda: (jobctl.status(s).last_batch or -1) >= down_since + 3,
            360,
            interval=1,
            what="commits while a broker is down",
        )
        # kill -9 a Spark worker (its executor with it) in the middle of the job: tasks move to the other one
        assert spark_cluster.kill_worker(s, 1)
        after = jobctl.status(s).last_batch
        job_log = supervisor.job_log(s)
        procs.wait_until(
            lambda: "Lost executor" in job_log.read_text(errors="replace"), 120, what="the driver to lose the executor"
        )
        procs.wait_until(
            lambda: (jobctl.status(s).last_batch or -1) >= after + 3,
            240,
            interval=1,
            what="commits after an executor was lost",
        )
        done.set()
        feeder.join(60)
        assert not feeder.is_alive()
        broker.start_node(s, leader)
        spark_cluster.start(s, workers=2)  # the killed worker comes back
        sent = fed["sent"]
        wait_drained(s, sent, timeout=400)
        assert_exact(s, sent)
        # the reconciliation recount, spark-submitted to the same cluster by the launch spec the DAG uses
        entries = _entries(s)
        out = tmp_path / "recon.json"
        argv = launcher.spec_argv(
            s,
            launcher.batch_spec(s, "reconcile"),
            reconciliation.args_for({"first": entries[0].batch, "last": entries[-1].batch}, with_gx=False)
            + ["--out", str(out)],
        )
        assert argv[argv.index("--master") + 1] == s.master
        res = reconciliation.submitted(s, argv, out, timeout_s=600)
        assert res.ok, [c.summary for c in res.failures()]
        assert (res.first_batch, res.last_batch) == (entries[0].batch, entries[-1].batch)
    finally:
        done.set()
        jobctl.stop(s)


def test_a_batch_far_larger_than_the_driver_commits_exactly_once(topology):
    """2,010,000 source records, one per (window, IP): read in one batch, and the close-out batch after it emits
    2,000,000 windows, streamed from the executors through a 512 MiB driver into one transaction."""
    # The driver holds at most two output partitions (the one it produces, the next one prefetched): 2,000,000
    # windows in 64 partitions are ~31,000 rows each (docs/cluster.md: size partitions for the driver)
    s = app_of(
        topology,
        "topo_big",
        max_offsets_per_trigger=2_100_000,
        trigger_interval_s=2.0,
        executor_memory="2g",
        shuffle_partitions=64,
    )
    windows, ips = 402, 5000
    t0 = 1_795_000_000_000
    p = Producer(
        {
            **kafka_clients.base(s),
            "linger.ms": 50,
            "batch.num.messages": 10_000,
            "acks": "all",
            "enable.idempotence": True,
            "compression.type": "lz4",
        }
    )
    for w in range(windows):
        ts = t0 + w * 5000
        for i in range(ips):
            value = f'{{"ts":{ts},"ip":"10.{i // 65536}.{i // 256 % 256}.{i % 256}"}}'
            while True:
                try:
                    p.produce(s.source_topic, value=value, partition=i % 4)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    p.poll(0.1)
            if i % 20_000 == 0:
                p.poll(0)
    assert p.flush(120) == 0
    jobctl.start(s)
    try:
        # the watermark (the latest event time - 5 s) stays inside the second-to-last window: the last two stay open
        want = (windows - 2) * ips
        procs.wait_until(
            lambda: sum(e.outputs for e in _entries(s)) >= want, 900, interval=5, what=f"{want} windows committed"
        )
        biggest = max(_entries(s), key=lambda e: e.outputs)
        assert biggest.outputs >= 2_000_000, biggest  # one transaction, one ledger batch
        keys: set[bytes] = set()
        records = 0
        counts = set()
        c = kafka_clients.read_committed_consumer(s, **{"enable.partition.eof": True})
        try:
            start = [TopicPartition(s.sink_topic, p, 0) for p in range(s.sink_partitions)]
            for m in kafka_reading.consume_to_end(c, start, timeout_s=900):
                records += 1
                keys.add(m.key())
                if records <= 1000:
                    counts.add(json.loads(m.value())["count"])
        finally:
            c.close()
        assert records == len(keys) == want, (records, len(keys), want)  # each window once, none lost
        assert counts == {1}
        print(
            f"one transaction of {biggest.outputs} records took {biggest.txn_ms / 1000:.1f} s "
            f"({biggest.outputs / (biggest.txn_ms / 1000):,.0f} records/s)"
        )
    finally:
        jobctl.stop(s)


def _kafka_tool_coordinator(s) -> int:
    """kafka-transactions.sh describe --transactional-id: the CoordinatorId column."""
    import shutil
    import subprocess

    out = subprocess.run(
        [
            shutil.which("java") or "java",
            "-cp",
            broker.kafka_classpath(s),
            "org.apache.kafka.tools.TransactionsCommand",
            "--bootstrap-server",
            s.bootstrap_servers,
            "describe",
            "--transactional-id",
            s.transactional_id,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split("\n")
    header = out[0].split()
    return int(out[1].split()[header.index("CoordinatorId")])


def _entries(s):
    from onceflow.operations import audit

    return audit.ledger_entries(s)


def _listening_beyond_loopback() -> list[str]:
    """What this session's processes listen on beyond loopback, but the JVM of this pytest process's own Spark
    session (tests.conftest's `spark` fixture, the harness: alive when an earlier module started it)."""
    import pyspark

    from tests.support.session import session_processes

    harness = getattr(getattr(pyspark.SparkContext._active_spark_context, "_gateway", None), "proc", None)
    pids = procs.with_descendants(pid for pid, _ in session_processes()) - {harness.pid if harness else -1}
    return [f"pid {x.pid} ({procs.describe(x.pid)}) listens on {x.host}:{x.port}" for x in procs.beyond_loopback(pids)]


def test_a_fresh_shell_sees_the_cluster_and_stack_down_stops_all_it_started(topology):
    """Last in this module. After `onceflow-dev stack up --brokers 3 --spark-workers 2` (the fixture), what anyone types
    next, in a shell that exported nothing but the var dir: `stack status` sees the three brokers and the Spark
    cluster (the stack remembers its topology under var/), and `stack down` stops every process it started."""
    var = topology.var_dir
    st = _onceflow(var, "stack", "status", "--json")
    assert st.returncode == 0, st.stdout[-2000:] + st.stderr[-2000:]
    got = json.loads(st.stdout)
    assert [n["running"] for n in got["broker"]["nodes"]] == [True, True, True], got["broker"]
    assert got["spark_cluster"]["alive_workers"] == 2 and got["spark_cluster"]["master"] == topology.master
    started = [int(procs.read_pidfile(n.pidfile)["pid"]) for n in broker.nodes(topology)]
    started += [pid for pid in spark_cluster.status(topology)["processes"].values() if pid]
    assert len(started) == 6, started  # three nodes, a master and two workers

    down = _onceflow(var, "stack", "down", "--json")
    assert down.returncode == 0, down.stdout[-2000:] + down.stderr[-2000:]
    procs.wait_until(
        lambda: not [p for p in started if procs.pid_alive(p)], 120, interval=0.5, what="the stack's processes to end"
    )
    assert not (var / config.STACK_FILE).exists()
