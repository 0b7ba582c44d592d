"""The secured stack (SASL/SCRAM over TLS, StandardAuthorizer, onceflow.kafka.acls): exactly-once under kill -9 with
every role on its least-privileged principal, and the refusals, each a clear error that loses nothing."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AclBindingFilter, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

from onceflow import config, wire
from onceflow.config import ConfigError
from onceflow.control.console import readers
from onceflow.kafka import acls, security, topics
from onceflow.kafka import reading as kafka_reading
from onceflow.kafka import transactional as tw
from onceflow.kafka.clients import transactional_producer
from onceflow.operations import backfill, reconcile, savepoints
from onceflow.protocol.exactly_once import ExactlyOnceSink
from onceflow.runtime import jobctl, launcher, preflight, procs
from onceflow_dev import broker, credentials, loopback, stack, tls
from tests.support.harness import app_settings, assert_exact, events, now_ms, produce, wait_drained
from tests.support.session import session_processes

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """A secured single-node KRaft broker of its own (the shared one stays plaintext)."""
    base = config.load(
        env={},
        var_dir=tmp_path_factory.mktemp("secured"),
        **loopback.kafka(),
        broker_txn_abort_check_interval_ms=1000,
        broker_transaction_max_timeout_ms=300_000,
        trigger_interval_s=1.0,
        restart_delay_s=1.0,
        restart_attempts=10,
        transaction_timeout_ms=60_000,
        kafka_security_protocol="SASL_SSL",
    )
    broker.start(base)
    yield base
    broker.stop(base)


@pytest.fixture
def make_app(secured):
    """make(stem, **overrides): an app on the secured broker; its job is stopped when the test ends, whatever the
    test did."""
    made: list[config.Settings] = []

    def make(stem: str, **overrides) -> dict[str, config.Settings]:
        a = new_app(secured, stem, **overrides)
        made.append(a["job"])
        return a

    yield make
    for s in made:
        jobctl.stop(s, timeout=60)


def new_app(base: config.Settings, stem: str, **overrides) -> dict[str, config.Settings]:
    """An app's topics (created by the admin) and its principals with their ACLs: settings per role, and `admin`."""
    name = f"{stem}_{uuid.uuid4().hex[:6]}"
    s = app_settings(
        base,
        name,
        **overrides,
    )
    admin = stack.provision(s)
    topics.ensure(admin)
    return {"admin": admin} | {r: credentials.as_role(s, r) for r in acls.ROLES}


def test_no_credentials_a_wrong_password_plaintext_or_a_foreign_ca_are_refused_clearly(make_app):
    a = make_app("refused")
    job = a["job"]
    with pytest.raises(ConfigError, match="ONCEFLOW_KAFKA_USERNAME and ONCEFLOW_KAFKA_PASSWORD"):
        preflight.check_job(job.replace(kafka_username="", kafka_password=""))
    with pytest.raises(preflight.PreflightError, match="refused to authenticate") as wrong:
        preflight.broker_reachable(job.replace(kafka_password="not-the-password"), timeout=8)
    assert job.kafka_password not in str(wrong.value)
    with pytest.raises(preflight.PreflightError, match="speaks TLS and this client plaintext"):
        preflight.broker_reachable(job.replace(kafka_security_protocol="PLAINTEXT"), timeout=8)
    # a CA that did not sign the brokers' certificate (another stack's)
    foreign_ca = tls.ensure(job.replace(var_dir=job.var_dir / "another-stack"))
    with pytest.raises(preflight.PreflightError, match="TLS handshake .* failed .*certificate verify failed"):
        preflight.broker_reachable(job.replace(kafka_ca_file=str(foreign_ca)), timeout=8)
    # an operator's start refuses before anything is launched or written
    with pytest.raises(preflight.PreflightError, match="refused to authenticate"):
        jobctl.start(job.replace(kafka_password="not-the-password"))
    assert not jobctl.status(job).running
    assert kafka_reading.read_topic(a["admin"], job.ledger_topic) == []


def test_job_cannot_write_another_apps_topic_nor_use_its_transactional_id(make_app):
    mine, other = make_app("mine"), make_app("other")
    job = mine["job"]
    # another app's transactional id: refused at init, as a configuration error (the job exits, no restart loop)
    with pytest.raises(tw.TxnConfigError, match="TRANSACTIONAL_ID_AUTHORIZATION_FAILED|may not use"):
        ExactlyOnceSink(job.replace(app_id=other["job"].app_id), bus=_NoBus(), init_timeout_s=20)
    # its own transactional id, a topic it does not own: the transaction cannot commit, nothing becomes visible
    w = tw.TransactionalWriter(
        lambda: transactional_producer(job, job.transactional_id), job.transactional_id, job.transaction_timeout_ms
    )
    with pytest.raises(tw.TxnConfigError, match="Topic authorization failed") as refused:
        w.begin()
        w.produce(other["job"].sink_topic, b"k", b"v")
        w.produce(job.sink_topic, b"k", b"v")
        w.commit()
    assert other["job"].sink_topic in str(refused.value) and "grant it WRITE on the topic" in str(refused.value)
    w.abort()
    w.close()
    assert kafka_reading.read_topic(other["admin"], other["job"].sink_topic) == []
    assert kafka_reading.read_topic(mine["admin"], job.sink_topic) == []  # its own record was aborted with it


def test_a_consumer_without_the_right_gets_an_authorization_error_not_an_empty_topic(make_app):
    mine, other = make_app("reader"), make_app("stranger")
    with pytest.raises(KafkaException) as no_describe:
        kafka_reading.read_topic(mine["job"], other["job"].sink_topic, timeout_s=20)
    assert no_describe.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    with pytest.raises(KafkaException) as no_watermarks:
        kafka_reading.watermarks(mine["reconcile"], other["job"].source_topic)
    assert no_watermarks.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # the job may write its sink, not read it back: WRITE implies DESCRIBE, not READ
    with pytest.raises(KafkaException) as write_only:
        kafka_reading.read_topic(mine["job"], mine["job"].sink_topic, timeout_s=20)
    assert write_only.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert kafka_reading.read_topic(mine["reconcile"], mine["job"].sink_topic) == []  # read-only role may


def test_preflight_names_the_missing_acl_and_the_job_does_not_start(make_app):
    a = make_app("lacking")
    job, admin = a["job"], a["admin"]
    assert preflight.acls_granted(job, "job") is None
    revoked = AclBindingFilter(
        ResourceType.TOPIC,
        job.dlq_topic,
        ResourcePatternType.LITERAL,
        acls.principal(job, "job"),
        "*",
        AclOperation.WRITE,
        AclPermissionType.ALLOW,
    )
    from onceflow.kafka import clients as kafka_clients

    client = kafka_clients.admin(admin)  # held while its futures are pending
    for _, fut in client.delete_acls([revoked]).items():
        assert len(fut.result(15)) == 1
    with pytest.raises(preflight.PreflightError) as e:
        jobctl.start(job)
    msg = str(e.value)
    assert f"WRITE on TOPIC '{job.dlq_topic}' for User:{job.kafka_username}" in msg, msg
    assert f"kafka-acls.sh --bootstrap-server {job.bootstrap_servers}" in msg and "--operation Write" in msg, msg
    assert not jobctl.status(job).running
    assert kafka_reading.read_topic(admin, job.ledger_topic) == []
    stack.provision(job)  # granted again: the check passes
    assert security.missing(job, "job") == []


@pytest.mark.long  # `make test-long` (and the whole suite on least privilege: `make test-secured`)
def test_exactly_once_under_kill9_on_least_privilege_and_no_secret_written(make_app, spark, tmp_path, monkeypatch):
    faults = "crash_before_produce@2,crash_after_commit@5"
    a = make_app("eos", max_offsets_per_trigger=4000, fault=faults)
    job, admin, recon, control = a["job"], a["admin"], a["reconcile"], a["control"]
    produced: dict = {}
    # launched the way Airflow's tasks launch them: from a process holding every role's connection and Airflow's keys
    for role in acls.ROLES:
        uri = f"kafka://{a[role].kafka_username}:{a[role].kafka_password}@localhost"
        monkeypatch.setenv(f"AIRFLOW_CONN_ONCEFLOW_KAFKA_{role.upper()}", uri)
    monkeypatch.setenv("AIRFLOW__CORE__FERNET_KEY", "the-launchers-fernet-key")

    def feed():  # the upstream producer is another team's: here the admin
        produced["sent"] = produce(
            admin, tmp_path / "m.csv", count=30_000, rate=2000, event_rate=2000, distinct_ips=300,
            late_fraction=0.01, malformed_fraction=0.02, tail_s=30, seed=7,
        )  # fmt: skip

    jobctl.start(job)
    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    # one kill -9 at a random moment besides the two protocol points (the many random kills are the plaintext
    # suite's and make chaos's: what this test adds is the least-privileged principals under them)
    jobctl.wait_running(job, timeout=180)
    time.sleep(random.Random(3).uniform(0.5, 3.0))
    assert jobctl.kill(job)
    feeder.join(300)
    sent = produced["sent"]
    wait_drained(recon, sent, timeout=300)
    assert_exact(recon, sent)  # observed with the read-only principal
    assert {e["fault"] for e in events(admin, wire.FAULT_INJECTED)} == set(faults.split(","))
    res = reconcile.run(spark, recon, with_gx=False)  # the recount: reads all, writes nothing of the job's
    assert res.ok, [c.summary for c in res.failures()]

    # each process holds its own role only: the job's (supervisor, spark-submit, driver, Python workers) and a
    # backfill's (watched while it runs), read from /proc/<pid>/environ
    job_pids = procs.with_descendants([jobctl.status(job).supervisor_pid])
    assert len(job_pids) >= 3 and _environs(job_pids), job_pids
    _assert_own_role_only(a, "job", _environs(job_pids))
    ends = {p: hi for p, (_, hi) in kafka_reading.watermarks(admin, job.source_topic).items()}
    bf = a["backfill"]
    spec = backfill.spec_from(bf, "env", start={p: 0 for p in ends}, end={p: min(hi, 500) for p, hi in ends.items()})
    out = tmp_path / "backfill.json"
    argv = launcher.spec_argv(
        bf,
        launcher.batch_spec(bf, "backfill", backfill.SCRIPT),
        ["--spec", json.dumps(spec.as_dict(), default=str), "--out", str(out)],
    )
    seen: dict[int, str] = {}
    done = threading.Event()

    def watch():
        while not done.is_set():
            pids = [pid for pid, cmd in session_processes() if str(backfill.SCRIPT) in cmd]
            seen.update(_environs(procs.with_descendants(pids)))
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        report = backfill.submitted(bf, argv, out, timeout_s=300)
    finally:
        done.set()
        watcher.join(10)
    assert report["written_records"] > 0 and seen, (report, seen)
    _assert_own_role_only(a, "backfill", seen)

    # what the platform writes, while the job runs: files, topics, command lines, the CLI's and the console's output
    sp = savepoints.create(control)
    env = {**os.environ, **job.as_env(), "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "include")}
    cli = subprocess.run(
        [sys.executable, "-m", "onceflow.cli", "job", "status", "--json"], env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert cli.returncode == 0 and json.loads(cli.stdout)["running"], cli.stderr[-2000:]
    written = [cli.stdout, cli.stderr, sp.to_json()]
    for read in CONSOLE_SECTIONS:  # every section the console shows, read as the control plane's principal
        written.append(json.dumps(read(control), default=str))
    for topic in (
        job.events_topic,
        job.job_events_topic,
        job.ledger_topic,
        job.sink_topic,
        job.dlq_topic,
        job.reconciliation_topic,
    ):
        written += [repr(m) for m in kafka_reading.read_topic(admin, topic)]
    written += [cmd for _, cmd in session_processes()]
    for pid, _ in session_processes():
        written.append(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"))
    store = credentials.path(job)
    for f in job.var_dir.rglob("*"):
        # the stack's own secret store and the brokers' configuration (the admin's, not the roles' passwords)
        if f.is_file() and f != store and "tls" not in f.parts:
            written.append(f.read_bytes().decode(errors="replace"))
    text = "\n".join(written)
    assert len(text) > 10_000, "nothing was collected"
    for role in acls.ROLES:
        pw = a[role].kafka_password
        assert pw not in text, f"the {role}'s password is written somewhere the platform writes"
    assert jobctl.stop(job)


def test_only_the_jobs_own_records_carry_its_facts_a_forged_commit_blocks_no_start(make_app):
    """Issue 24: a `batch_committed` of the app written by another principal (a backfill's may write the shared
    events topic) is not another live driver: deploy's preflight starts the job. The job's own events topic, the
    only place its facts are read from, refuses every writer but the app's job: a backfill, the control plane,
    another app's job."""
    from onceflow.control import deploy
    from onceflow.kafka import clients as kafka_clients

    a = make_app("forged")
    job, admin = a["job"], a["admin"]
    forged = {
        "type": wire.BATCH_COMMITTED,
        "app": job.app_id,
        "ts_ms": now_ms(),
        "host": "elsewhere",
        "pid": 4242,
        "batch": 17,
    }

    def produce_as(s: config.Settings, topic: str) -> KafkaError | None:
        p, got = kafka_clients.idempotent_producer(s), []
        p.produce(
            topic, key=job.app_id.encode(), value=json.dumps(forged).encode(), on_delivery=lambda e, m: got.append(e)
        )
        p.flush(30)
        assert got, f"no delivery report for {topic}"
        return got[0]

    # the shared topic: a backfill may write it, and its forged commit blocks nothing
    assert produce_as(a["backfill"], job.events_topic) is None
    assert [json.loads(m.value)["batch"] for m in kafka_reading.read_topic(admin, job.events_topic)] == [17]
    assert jobctl.live_elsewhere(job) is None
    assert deploy.preflight_checks(job)["checkpoint"] == job.checkpoint
    # the job's own events topic: refused to every principal but the job's, and nothing of it is visible
    stranger = make_app("stranger")["job"]
    for who in (a["backfill"], a["control"], stranger):
        err = produce_as(who, job.job_events_topic)
        assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, (who.kafka_username, err)
    assert kafka_reading.read_topic(admin, job.job_events_topic) == []
    from onceflow.kafka import events as ev

    assert ev.read(a["control"], {wire.BATCH_COMMITTED}) == []  # the console's, health's, the watch's reader
    # the job's own record is the job's fact: another live driver
    assert produce_as(job, job.job_events_topic) is None
    assert jobctl.live_elsewhere(job)["batch"] == 17


CONSOLE_SECTIONS = (
    readers.read_now,
    lambda s: readers.read_batches(s, 50, None, {}),
    readers.read_charts,
    readers.read_transactions,
    readers.read_alerts,
    readers.read_savepoints,
    readers.read_proofs,
    readers.read_backfills,
)


class _NoBus:
    def emit(self, *a, **k):
        pass

    def flush(self, *a, **k):
        pass


def _environs(pids) -> dict[int, str]:
    """The environment of each live process, as /proc shows it (NUL-separated NAME=value)."""
    out = {}
    for pid in pids:
        try:
            out[pid] = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
        except OSError:
            pass  # gone
    return out


def _assert_own_role_only(a: dict[str, config.Settings], role: str, environs: dict[int, str]) -> None:
    for pid, raw in environs.items():
        env = dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)
        who = f"pid {pid} ({procs.describe(pid)})"
        assert not [k for k in env if k.startswith("AIRFLOW")], f"{who} holds Airflow's variables"
        for other in acls.ROLES:
            if other != role:
                assert a[other].kafka_password not in raw, f"{who}, a {role} process, holds the {other}'s password"
    assert any(a[role].kafka_password in raw for raw in environs.values()), f"the {role} runs without its own login"
