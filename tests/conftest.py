"""Shared fixtures: one local Spark session and one real Kafka broker (KRaft) for the whole run.

Each integration test gets its own app id and topics on the shared broker, so tests stay independent while
the suite pays for one broker start. What a test starts (the job of its app: supervisor, spark-submit, driver JVM,
Python driver) is stopped when the test ends; the broker and the Spark session when the session ends. Every
process the session starts carries a token in its environment: if any is still alive after the last fixture, the
session fails and names it (and kills it: nothing is left running).
"""

from __future__ import annotations

import gc
import os
import signal
import tempfile
import time
import uuid
from pathlib import Path

# Every process this session starts inherits the token (children of children too, detached or not); and the run's,
# which pytest-xdist's workers inherit from their controller (tests.support.session.RUN_ENV).
os.environ["PYTEST_ONCEFLOW_SESSION"] = uuid.uuid4().hex  # tests.support.session.SESSION_ENV
os.environ.setdefault("PYTEST_ONCEFLOW_RUN", uuid.uuid4().hex)  # tests.support.session.RUN_ENV

# Airflow reads its home at import time: give the test session its own, before anything imports airflow. Under
# pytest-xdist each worker is a session of its own: it gets its own home, not the one its controller inherited.
if "PYTEST_XDIST_WORKER" in os.environ or "AIRFLOW_HOME" not in os.environ:
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="onceflow-airflow-")
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(Path(__file__).resolve().parents[1] / "dags")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"

# Every Spark JVM the session starts (its own session, each job's driver, each recount and backfill, in Airflow's
# tasks too: spark-submit reads SPARK_SUBMIT_OPTS, and children keep SPARK_*) compiles with C1 only. The suite's
# JVMs live seconds to minutes, and C2 spent their CPU compiling code that never ran long enough to pay it back:
# a short Spark application measured 18.8 s of JVM CPU with both tiers, 10.5-12.9 s with C1 only (docs/testing.md).
# What the JIT does cannot change what a job writes; the benchmarks and long runs keep the JVM's defaults. A
# session that brings up Spark also shares one class-data archive across them (spark_class_archive, below).
# A caller's own options are left as they are. Ours are marked as ours: pytest-xdist's workers inherit them from the
# controller, and a worker that took them for a caller's went without the archive (every integration test on two
# workers did, until 2026-11-29: a job's start took 28-39 s to its Spark session on the loaded machine).
if "SPARK_SUBMIT_OPTS" not in os.environ:
    os.environ["SPARK_SUBMIT_OPTS"] = os.environ["ONCEFLOW_TEST_SPARK_SUBMIT_OPTS"] = "-XX:TieredStopAtLevel=1"
OWN_SPARK_SUBMIT_OPTS = os.environ["SPARK_SUBMIT_OPTS"] == os.environ.get("ONCEFLOW_TEST_SPARK_SUBMIT_OPTS")

import pytest

from onceflow import config
from onceflow.app import registry
from onceflow.kafka import topics
from onceflow.runtime import app_jars, jobctl, jvm, launcher
from onceflow_dev import broker, loopback
from tests.support.harness import app_settings
from tests.support.session import end_on_sigterm, pytest_unconfigure, session_processes  # noqa: F401 (a hook)

end_on_sigterm()  # a run ended by SIGTERM (`timeout`, CI) still stops what its fixtures started

# `make test-secured` runs the exactly-once suite on a SASL_SSL broker with ACLs (ONCEFLOW_TEST_KAFKA_SECURITY):
# the harness (creating topics, producing the input, reading the truth back) is the stack's admin, each app's job
# its own least-privileged principal (onceflow.kafka.acls).
SECURITY = os.environ.get("ONCEFLOW_TEST_KAFKA_SECURITY", "PLAINTEXT").upper()


# The modules measured slowest, slowest first (seconds of a serial clean-clone run on 2 cores, 2026-11-27). `make
# test-integration` runs the running-Airflow module alone, then the rest on two workers handing out whole modules in
# this order: longest first keeps both busy until the end instead of leaving one module of minutes running alone. A
# module not listed runs after these (keep new slow tests listed).
SLOWEST_FIRST = (
    "tests/airflow/test_running_airflow.py",  # ~560 (alone, before the others: the Makefile)
    "tests/topology/test_cluster.py",  # ~900 (make test-topology)
    "tests/topology/test_chaos.py",  # ~300 (make chaos-short)
    "tests/integration/test_reconcile.py",  # ~550
    "tests/bench/test_short_bench.py",  # ~600 (make bench-short)
    "tests/integration/test_exactly_once.py",  # ~350
    "tests/integration/test_security.py",  # ~205
    "tests/airflow/test_dags.py",  # ~185
    "tests/integration/test_protocol_edges.py",  # ~180
    "tests/integration/test_database_sink.py",  # ~230
    "tests/integration/test_savepoints.py",  # ~170
    "tests/integration/test_backfill.py",  # ~100
    "tests/integration/test_health.py",  # ~70
    "tests/integration/test_standby.py",  # ~65
    "tests/integration/test_apps.py",  # ~40
)
# Modules that bring up their own many-process topology (a running Airflow with PostgreSQL; three brokers with a
# Spark master and workers; a broker killed under a job with a warm standby): on a 2-core machine two of them at
# once starve each other past their deadlines (beside Airflow the cluster's first commit took over 3 min, and
# Airflow's task supervisor timed out on its own API server). They are one xdist scope, so they run one after
# another on one worker while the other worker takes the rest.
ONE_AT_A_TIME = (
    "tests/airflow/test_running_airflow.py",
    "tests/topology/test_cluster.py",
    "tests/topology/test_chaos.py",
    "tests/integration/test_standby.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {m: i for i, m in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable: in-module order kept


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Whole modules to a worker (as `--dist loadfile`), the ONE_AT_A_TIME modules as one scope. Not xdist's
    `loadgroup`: it renames the items' `_nodeid`, which pytest 9 no longer reads, so its groups are silently
    ignored and every test becomes its own scope."""
    from xdist.scheduler import LoadScopeScheduling

    class ModulesOneHeavyAtATime(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "one-at-a-time" if module in ONE_AT_A_TIME else module

    return ModulesOneHeavyAtATime(config, log)


@pytest.fixture(scope="session", autouse=True)
def spark_class_archive(request):
    """Before the session's first Spark JVM: one class-data archive of Spark's classes, mapped by every Spark JVM
    the session starts (onceflow.runtime.class_data: about half the CPU of a short Spark application). A session
    of unit tests only starts no JVM and builds nothing."""
    unit = Path(__file__).parent / "unit"
    if OWN_SPARK_SUBMIT_OPTS and any(unit not in Path(i.path).parents for i in request.session.items):
        from onceflow.runtime import class_data

        base = config.load(env={})
        archive = class_data.build(base, launcher.spark_submit(), {**os.environ, **launcher.submit_env(base)})
        if archive is not None:
            os.environ["SPARK_SUBMIT_OPTS"] += f" -XX:SharedArchiveFile={archive}"
    yield


@pytest.fixture(autouse=True)
def unit_tests_need_no_jvm(request):
    """The unit tier runs without a JVM (in seconds, first): a unit test that asks for Spark fails here, and belongs
    in tests/spark."""
    if "spark" in request.fixturenames and Path(__file__).parent / "unit" in Path(str(request.node.path)).parents:
        pytest.fail("a unit test needs no JVM: a test that builds a Spark plan belongs in tests/spark")


@pytest.fixture(scope="session")
def spark():
    """One local Spark session for the tests that build plans (tests/spark, and the integration tiers)."""
    from pyspark.sql import SparkSession

    base = config.load(env={})
    # the batch jobs' Kafka reads, and the JVM functions of every declared app (ip_count's parse among them)
    own = sorted({j for name in registry.declared() for j in app_jars.jars_of(base, registry.find(name))})
    jars = ",".join(str(j) for j in [*jvm.spark_kafka_jars(base), *own])
    builder = SparkSession.builder.master("local[2]").appName("onceflow-tests").config("spark.jars", jars)
    if OWN_SPARK_SUBMIT_OPTS:
        from onceflow.runtime import class_data

        # the jobs' drivers' class path, which the session's class-data archive was dumped with: a JVM whose class
        # path does not start with it does not map the archive
        extra = class_data.driver_class_path(base)
        builder = builder.config("spark.driver.extraClassPath", extra) if extra else builder
    s = (
        builder.config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.checkpointFileManagerClass", launcher.LOCAL_CHECKPOINT_MANAGER)  # as the jobs'
        .getOrCreate()
    )
    s.sparkContext.setLogLevel("ERROR")
    yield s
    gateway = s.sparkContext._gateway
    s.stop()
    # the gateway JVM outlives stop() until this process exits: end it here, it is this session's process
    gateway.shutdown()
    proc = getattr(gateway, "proc", None)
    if proc is not None and proc.poll() is None:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="session")
def kafka(tmp_path_factory):
    """A real single-node KRaft broker on free loopback ports, started once per test session."""
    var = tmp_path_factory.mktemp("var")
    base = config.load(
        env={},
        var_dir=var,
        **loopback.kafka(),
        broker_txn_abort_check_interval_ms=1000,
        broker_transaction_max_timeout_ms=300_000,
        trigger_interval_s=1.0,
        restart_delay_s=1.0,
        restart_attempts=5,
        transaction_timeout_ms=60_000,
        # two state partitions, one per core of local[2] (the platform's default is 4): the suite's batches are of a
        # few thousand records, where each state partition's task and store commit is a fixed cost per batch. A job
        # draining 30,000 records in batches of 2,500 used 48-50 s of CPU against 53-55 s with 4 (docs/testing.md).
        # Every state partition still sees every kill, restore and replay; more of them prove nothing more.
        shuffle_partitions=2,
        kafka_security_protocol=SECURITY,
    )
    broker.start(base)
    if base.secured:
        from onceflow_dev import credentials

        base = credentials.as_admin(base).replace(kafka_ca_file=base.kafka_ca)
    jvm.spark_kafka_jars(base)  # resolve Spark's connector once, up front (Maven on a fresh machine)
    yield base
    # Destroy clients still referenced from cycles while the broker is up, so none retries a dead port at exit.
    gc.collect()
    broker.stop(base)


def stop_apps(apps: list[config.Settings]) -> None:
    """Stop the jobs of these apps (supervisor first, then whatever of the job is left)."""
    for s in apps:
        jobctl.stop(s, timeout=60)


@pytest.fixture
def app(kafka, request):
    """Settings for one test's own app: its own topics, checkpoint and transactional id on the shared broker. The
    app's job is stopped when the test ends, whatever the test did. On the secured broker: the app's principals
    and ACLs are created, and the settings are the job's principal (tests.support.harness.harness is the
    admin's view)."""
    base = kafka
    created: list[config.Settings] = []
    name = request.node.name.replace("[", "_").replace("]", "").replace("-", "_")[:40] + "_" + uuid.uuid4().hex[:6]

    def make(instance: str = "", **overrides) -> config.Settings:
        """`instance`: a suffix for a second app instance of the same test (its own topics, ids and files)."""
        app_id = name + instance
        s = app_settings(
            base,
            app_id,
            **overrides,
        )
        topics.ensure(s)
        if s.secured:
            from onceflow_dev import credentials, stack

            stack.provision(s)
            s = credentials.as_role(s, "job")
        created.append(s)
        return s

    yield make
    stop_apps(created)


@pytest.fixture(scope="session", autouse=True)
def nothing_left_running():
    """Set up first, torn down last: after every other fixture has stopped what it started, nothing of this session
    may still run. A leak fails the session (with the processes named) and is killed."""
    yield
    deadline = time.monotonic() + 15  # a process that was just signalled may take a moment to exit
    while (left := session_processes()) and time.monotonic() < deadline:
        time.sleep(0.5)
    if left:
        for pid, _ in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        pytest.fail(
            "processes started by this test session were still running at its end (killed now): "
            + "; ".join(f"pid {pid}: {cmd}" for pid, cmd in left),
            pytrace=False,
        )
