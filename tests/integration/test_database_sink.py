"""Exactly-once into PostgreSQL (onceflow.protocol.database_sink), proven against a real server, a real broker and
real Spark: kill -9 of the driver at every step around the database commit, the server crashed mid-run, a lock held
by another session, a zombie driver fenced, tables the sink cannot write refused at start."""

import json
import threading

import psycopg
import pytest
from psycopg import sql

from onceflow import wire
from onceflow.control.console import readers
from onceflow.database import client
from onceflow.database.schema import SchemaError
from onceflow.faults import Injector
from onceflow.kafka import events as ev
from onceflow.operations import audit, reconcile, replay, savepoints
from onceflow.protocol.batch_sink import BatchNotCommitted, OutRecord
from onceflow.protocol.database_sink import DatabaseRefused, DatabaseSink, Fenced, StatementTimedOut
from onceflow.rules.ledger import BatchPlan, Committed, Decision
from onceflow.rules.reconciliation import Status
from onceflow.rules.sources import SourcePartition, on_topic
from onceflow.runtime import jobctl, procs
from onceflow_apps import ip_count_invariants as invariants
from onceflow_dev import postgres
from onceflow_dev.generator import KIND_MALFORMED
from tests.support.harness import end_offsets, events, fed_and_killed, final_window_end_ms, produce, truth

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pg_home(tmp_path_factory):
    """One PostgreSQL server for the module (Debian's binaries, its cluster under a directory of its own)."""
    from onceflow import config

    home = config.load(env={}, var_dir=tmp_path_factory.mktemp("pgvar"))
    yield home
    postgres.remove(home)


@pytest.fixture
def db_app(app, pg_home):
    """The test's app writing to its own schema on the module's server, as its job's role."""

    def make(**overrides):
        s = app(**overrides)
        job = postgres.provision_sink(s.replace(var_dir=pg_home.var_dir))
        return job.replace(var_dir=s.var_dir)

    return make


def _admin(pg_home, s):
    info = postgres.state(pg_home)
    return psycopg.connect(
        host="127.0.0.1",
        port=info["port"],
        user=info["user"],
        password=info["password"],
        dbname=s.postgres_database,
        autocommit=True,
    )


def _rows(s, table: str, columns: str) -> list[tuple]:
    with client.connect(s) as conn:
        return conn.execute(sql.SQL(f"SELECT {columns} FROM {{}}").format(client.table(s, table))).fetchall()


def _entries(s):
    with client.connect(s) as conn:
        return client.ledger_entries(conn, s)


def _wait_drained_into_the_table(s, sent, timeout: float) -> None:
    """Until the ledger table's newest batch ends where the input ends and its watermark closed the last window."""
    ends, target_wm = end_offsets(sent), final_window_end_ms(s, sent)

    def drained() -> bool:
        st = jobctl.status(s)
        if st.error and not st.running and not st.supervisor_pid:
            raise AssertionError(f"job failed: {st.error}")
        try:
            entries = _entries(s)
        except Exception:  # the server restarting
            return False
        return bool(entries) and entries[-1].end == ends and max(e.watermark_ms for e in entries) >= target_wm

    procs.wait_until(drained, timeout, interval=2.0, what="the job to drain into the table")


def _assert_exact_table(s, sent):
    """I1-I3 on the tables against the generator's record of what it sent; every window's row written once."""
    ends = end_offsets(sent)
    entries = _entries(s)
    results = _rows(s, "results", "key, value, writes")
    # each DLQ row's source record, its topic included (the table's src_topic)
    dlq = [(SourcePartition(t, p), o) for t, p, o in _rows(s, "dlq", "src_topic, src_partition, src_offset")]
    assert {p.topic for p, _ in dlq} == {s.source_topic}
    sink = [invariants.SinkRecord(k, v.encode(), 0, i) for i, (k, v, _) in enumerate(results)]
    rep = invariants.check(entries, ends, truth(sent), sink, dlq, s.window_s, starting={p: 0 for p in ends})
    assert rep.ok, json.dumps(rep.summary(), indent=1, default=str)
    valid = sum(1 for r in sent if r.kind != KIND_MALFORMED)
    assert rep.counted + rep.late + rep.pending == valid and rep.counted > 0
    assert len(dlq) == sum(1 for r in sent if r.kind == KIND_MALFORMED) == rep.ledger_dlq
    # each window's row was written by exactly one batch (an upsert would hide a second write, `writes` does not)
    assert {w for _, _, w in results} == {1}
    assert [e.batch for e in entries] == list(range(len(entries)))
    return entries, results, dlq


def test_kill9_around_the_database_commit_and_a_crashed_server_lose_and_duplicate_nothing(
    db_app, pg_home, tmp_path, spark
):
    faults = "crash_before_produce@2,crash_after_produce@4,crash_after_commit@6,raise_after_commit@8"
    s = db_app(max_offsets_per_trigger=3000, fault=faults, restart_attempts=10)

    def crash_server(k: int) -> None:
        if k == 1:  # once, while the job runs: every session cut, open transactions lost
            postgres.crash_restart(pg_home)

    spec = dict(rate=2500, event_rate=2500, distinct_ips=400, out_of_order_fraction=0.05, late_fraction=0.01)
    # one kill -9 at a random moment besides the four protocol points (the plaintext Kafka sink's test kills at
    # random twice, `make chaos` many times), and the server's crash once the job runs again
    sent = fed_and_killed(
        s, tmp_path, kill_seed=3, kills=1, between=crash_server, count=30_000, malformed_fraction=0.02, tail_s=30,
        seed=4, **spec,
    )  # fmt: skip
    _wait_drained_into_the_table(s, sent, 420)
    assert jobctl.stop(s)
    entries, results, dlq = _assert_exact_table(s, sent)

    fired = {e["fault"] for e in events(s, wire.FAULT_INJECTED)}
    assert fired == set(faults.split(","))
    skipped = {e["batch"] for e in events(s, wire.BATCH_REPLAY_SKIPPED)}
    assert {6, 8} <= skipped, "a crash or an error after the commit must lead to a skipped replay"
    # the group's offsets are the ledger's cache: where the last batch ended
    ends = end_offsets(sent)
    assert audit.committed_offsets(s, ends) == ends

    # the platform's proofs read the table: the app's plan replayed over the committed ranges, and `onceflow audit`
    res = reconcile.run(spark, s)  # what `onceflow reconcile` and the reconciliation DAG run
    assert res.ok and res.check("replay").status == Status.PASS and res.check("I1_coverage").status == Status.PASS
    assert res.check("replay").figures["results"] == len(results) and res.check("replay").figures["dlq"] == len(dlq)
    assert audit.audit(s).ok
    # ... and they fail on a table changed behind the sink's back
    key, value, _ = results[0]
    with _admin(pg_home, s) as admin:
        admin.execute(
            sql.SQL("UPDATE {} SET value = %s WHERE key = %s").format(client.table(s, "results")),
            (value.replace('"count":', '"count":1'), key),
        )
    snap = audit.snapshot(s)
    res = replay.check(spark, s, s.declared_app(), snap.entries, snap.entries, audit.quarantined(snap.records))
    assert res.status == Status.FAIL and {d.get("key") for d in res.differences} == {key}, res.differences[:4]
    assert not audit.audit(s).ok


@pytest.mark.long  # `make test-long`: the savepoint's claims on the Kafka sink are test_savepoints.py's, in `make test`
def test_a_savepoint_behind_a_table_sink_taken_under_load_and_restored_after_kill9_is_exact(db_app, tmp_path, spark):
    """The rotation DAG's savepoint and the deploy DAG's restore, on an app whose ledger is its table: the savepoint
    finds its batch's row in the ledger table, the restore catches up to the table's newest batch (not the group's
    cache of it), and the catch-up batch writes nothing (every window's row still written once)."""
    s = db_app(max_offsets_per_trigger=2500, restart_attempts=10)
    fed: dict = {}
    spec = dict(count=30_000, rate=2500, event_rate=2500, distinct_ips=500, late_fraction=0.01, tail_s=30, seed=41)
    feeder = threading.Thread(
        target=lambda: fed.update(sent=produce(s, tmp_path / "m.csv", malformed_fraction=0.02, **spec)), daemon=True
    )
    feeder.start()
    jobctl.start(s)

    def committed(at_least: int) -> int | None:
        entries = _entries(s)
        return entries[-1].batch if entries and entries[-1].batch >= at_least else None

    procs.wait_until(lambda: committed(2), 180, interval=0.5, what="batch 2 in the ledger table")
    m = savepoints.create(s)  # the job keeps committing meanwhile
    assert m.mode == "running" and m.ledger_entry["batch"] == m.ledger_batch
    assert savepoints.verify(s, m.id).compatible
    procs.wait_until(lambda: committed(m.ledger_batch + 3), 180, interval=0.5, what="three more batches")
    jobctl.kill(s, with_supervisor=True)  # kill -9 of the driver's whole process tree, maybe mid-transaction
    newest = _entries(s)[-1]
    sink_batch = newest.batch
    zombie = DatabaseSink(s, ev.EventBus(s), group=_Group())  # a driver of the app still alive somewhere

    plan = savepoints.restore(s, "latest", bus=ev.EventBus(s))
    assert plan.manifest.id == m.id and not plan.rewind
    # the restore fenced it: its next batch transaction fails before it writes anything
    nothing = BatchPlan(batch=sink_batch + 1, start=newest.end, end=newest.end)
    with pytest.raises(Fenced, match="another instance"):
        zombie.write_batch(nothing, [], decision=Decision.WRITE)
    zombie.close()
    assert (plan.catch_up.ledger_from, plan.catch_up.ledger_to) == (m.ledger_batch + 1, sink_batch)
    jobctl.start(s)
    feeder.join(timeout=300)
    _wait_drained_into_the_table(s, fed["sent"], 300)
    assert jobctl.stop(s)
    entries, _, _ = _assert_exact_table(s, fed["sent"])
    skipped = [e for e in events(s, wire.BATCH_REPLAY_SKIPPED) if e.get("decision") == "catch_up"]
    assert [(e["batch"], e["catch_up_from"]) for e in skipped][:1] == [(sink_batch, m.ledger_batch + 1)]
    [rec] = audit.restore_records(s)
    after = [e for e in entries if e.batch > sink_batch]
    assert after and after[0].epoch == rec.epoch and rec.sink_batch == sink_batch
    assert audit.audit(s).ok
    # the reconciliation of the whole history, across the restore: green (coverage from the ledger table), and the
    # replay of the plan over the ledger's history proves the table's rows across the restore too
    res = reconcile.run(spark, s, with_gx=False)  # (the GX suite on a table sink: the kill -9 test above)
    assert res.ok and res.check("I1_coverage").status == Status.PASS, [c.__dict__ for c in res.failures()]
    assert res.check("replay").status == Status.PASS, res.check("replay").summary
    assert res.check("replay").figures["committed_results"] == res.check("replay").figures["results"] > 0


def _plan(s, batch, start, end):
    return BatchPlan(batch=batch, start=on_topic(s.source_topic, {0: start}), end=on_topic(s.source_topic, {0: end}))


def _out(batch, n):
    return [OutRecord(wire.KIND_RESULT, f"k{batch}-{i}", json.dumps({"n": i}).encode()) for i in range(n)]


class _Group:
    """The offsets' Kafka cache, not under test here."""

    def commit(self, **_):
        pass

    def close(self):
        pass


def test_fencing_timeouts_a_crash_mid_batch_and_bad_tables(db_app, pg_home, tmp_path):
    s = db_app(postgres_lock_timeout_ms=2000)
    bus = ev.EventBus.for_job(s)

    def sink():
        return DatabaseSink(s, bus, group=_Group())

    a = sink()
    assert a.write_batch(_plan(s, 0, 0, 10), _out(0, 10)).decision is Decision.WRITE
    b = sink()  # a newer driver of the app: the older one is a zombie from now on
    with pytest.raises(Fenced, match="another instance"):
        a.write_batch(_plan(s, 1, 10, 20), _out(1, 10))
    assert b.decide(_plan(s, 0, 0, 10)) is Decision.SKIP  # a replay of the committed batch writes nothing
    assert b.write_batch(_plan(s, 1, 10, 20), _out(1, 10)).outputs == 10

    # a lock another session holds: the batch fails before its commit, saying which setting, and is written after
    with _admin(pg_home, s) as other:
        with other.transaction():
            other.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(client.table(s, "results")))
            with pytest.raises(StatementTimedOut, match="POSTGRES_LOCK_TIMEOUT_MS"):
                b.write_batch(_plan(s, 2, 20, 30), _out(2, 10))
    assert b.write_batch(_plan(s, 2, 20, 30), _out(2, 10)).outputs == 10
    # ... a statement past its timeout (the lock waited for longer than the statement may run): the same, named
    slow = s.replace(postgres_statement_timeout_ms=1500, postgres_lock_timeout_ms=30_000)
    with _admin(pg_home, s) as other:
        with other.transaction():
            # writes wait, reads do not: the batch is decided, then its ledger insert waits
            other.execute(sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(client.table(s, "ledger")))
            c = DatabaseSink(slow, bus, group=_Group())  # a newer driver again: b is fenced from here on
            with pytest.raises(StatementTimedOut, match="POSTGRES_STATEMENT_TIMEOUT_MS"):
                c.write_batch(_plan(s, 3, 30, 40), _out(3, 10))
    b.close()
    # a driver stalled inside its transaction past the transaction timeout: the server ends the transaction, as
    # Kafka's coordinator would; the sink decides again and writes the batch once, without a restart
    stalled = DatabaseSink(
        s.replace(transaction_timeout_ms=1000), bus, Injector("stall_in_txn@3:3", tmp_path / "faults"), group=_Group()
    )
    assert stalled.write_batch(_plan(s, 3, 30, 40), _out(3, 10)).outputs == 10
    assert [e["batch"] for e in events(s, wire.TRANSACTION_TIMEOUT)] == [3]
    stalled.close()
    c.close()
    b = sink()

    # the server crashes while the batch's rows stream in: the transaction is lost with its connection, the sink
    # reconnects, finds the batch not committed and writes it again from its stored rows
    def crash():  # the server stopped as a crash would, then started: every session of the sink's is cut
        postgres.crash_restart(pg_home)

    class CrashOnce(list):  # re-iterable, as the driver's stored output is
        crashed = False

        def __iter__(self):
            if not self.crashed:
                self.crashed = True
                crash()
            return super().__iter__()

    assert b.write_batch(_plan(s, 4, 40, 50), CrashOnce(_out(4, 10))).outputs == 10
    assert any(e["batch"] == 4 for e in events(s, wire.TRANSACTION_OUTCOME_UNKNOWN))

    def one_shot():  # ... a one-shot iterator cannot be read again: the query fails and Spark replays the batch
        crash()
        yield from _out(5, 10)

    with pytest.raises(BatchNotCommitted):
        b.write_batch(_plan(s, 5, 50, 60), one_shot())
    assert b.write_batch(_plan(s, 5, 50, 60), _out(5, 10)).outputs == 10

    # the server refuses the batch, the connection stays up: the transaction rolls back, nothing of the batch is
    # written, and the error says what happened and what to change; whether a restart can help is its exit code
    def refused(out, match, code):
        with pytest.raises(DatabaseRefused, match=match) as e:
            b.write_batch(_plan(s, 6, 60, 70), out)
        assert e.value.exit_code == code
        assert [x.batch for x in _entries(s)][-1] == 5 and len(_rows(s, "results", "key")) == 60

    full_disk = sql.SQL(
        "CREATE FUNCTION {s}.full_disk() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION "
        "'could not extend file: No space left on device' USING ERRCODE = 'disk_full'; END $$; "
        "CREATE TRIGGER full_disk BEFORE INSERT ON {t} FOR EACH ROW EXECUTE FUNCTION {s}.full_disk()"
    ).format(s=sql.Identifier(s.database_schema), t=client.table(s, "results"))
    with _admin(pg_home, s) as admin:  # a full disk, as the server reports it
        admin.execute(full_disk)
    refused(_out(6, 10), r"disk is full .*53100.* Free space .* restarts and writes the batch once", wire.EXIT_FAILED)
    with _admin(pg_home, s) as admin:
        admin.execute(sql.SQL("DROP TRIGGER full_disk ON {t}").format(t=client.table(s, "results")))
    # a value of the wrong type for the table (not UTF-8 text), a constraint someone added: the job stops
    bad = [OutRecord(wire.KIND_RESULT, "k6-bad", b"\xff\xfe")] + _out(6, 9)
    refused(bad, r"not UTF-8 text .*22021.*The job stops", wire.EXIT_CONFIG)
    with _admin(pg_home, s) as admin:
        admin.execute(sql.SQL("ALTER TABLE {t} ADD CONSTRAINT short CHECK (length(key) < 4) NOT VALID").format(
            t=client.table(s, "results")))  # fmt: skip
    refused(_out(6, 10), r"constraint .* refused a row .*23514.*drop the one that was added", wire.EXIT_CONFIG)
    with _admin(pg_home, s) as admin:
        admin.execute(sql.SQL("ALTER TABLE {t} DROP CONSTRAINT short").format(t=client.table(s, "results")))
    assert b.write_batch(_plan(s, 6, 60, 70), _out(6, 10)).outputs == 10  # once the cause is gone, written once
    b.close()
    a.close()

    assert [e.batch for e in _entries(s)] == [0, 1, 2, 3, 4, 5, 6]
    # the console's pages of the ledger table, newest first
    pages, before = [], None
    for _ in range(5):
        entries, before = readers.ledger_page(s, 2, before)
        pages.append([e.batch for e in entries])
        if before is None:
            break
    assert pages == [[6, 5], [4, 3], [2, 1], [0]]
    # the group holds no offsets of this app (its cache was a fake here, as if Kafka's offset retention had deleted
    # it): how far the app consumed comes from the ledger table (health's lag, savepoints)
    at = SourcePartition(s.source_topic, 0)
    assert audit.consumed_position(s, [at]) == Committed(offsets={at: 70}, batch=6)
    assert len(_rows(s, "results", "key")) == 70 and {w for (w,) in _rows(s, "results", "writes")} == {1}

    # a role per purpose: the readers' may not write, the job's may not change the tables
    reader = postgres.sink_settings(s.replace(var_dir=pg_home.var_dir), "reader")
    with client.connect(reader) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(sql.SQL("DELETE FROM {}").format(client.table(s, "results")))
    with client.connect(s) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(sql.SQL("ALTER TABLE {} DROP COLUMN writes").format(client.table(s, "results")))

    # tables the sink cannot write are refused at start, saying what is wrong
    with _admin(pg_home, s) as admin:
        admin.execute(sql.SQL("ALTER TABLE {} DROP COLUMN writes").format(client.table(s, "results")))
    with pytest.raises(SchemaError, match=r"results has no column writes"):
        sink()


def test_db_provision_creates_the_database_and_roles_with_the_environments_passwords(kafka, pg_home, tmp_path):
    """docker-compose.yaml's airflow-init path: `onceflow db provision` as the server's superuser, each role's
    password from the environment (there filled from secret files): a database of its own, both login roles, the
    tables; run again, it changes nothing but the passwords. The job's role then opens the sink, the reader's reads and may not write."""
    import os
    import subprocess
    import sys

    info = postgres.state(pg_home)
    env = {
        "PATH": os.environ["PATH"],
        "ONCEFLOW_VAR_DIR": str(tmp_path / "var"),
        "ONCEFLOW_APP_ID": "composed",
        "ONCEFLOW_POSTGRES_PORT": str(info["port"]),
        "ONCEFLOW_POSTGRES_DATABASE": "composed_db",
        "ONCEFLOW_POSTGRES_USER": info["user"],
        "ONCEFLOW_POSTGRES_PASSWORD": info["password"],
        "ONCEFLOW_POSTGRES_JOB_PASSWORD": "job-secret-job",
        "ONCEFLOW_POSTGRES_READER_PASSWORD": "reader-secret-reader",
    }
    argv = [sys.executable, "-m", "onceflow.cli", "db", "provision", "--json"]
    for _ in range(2):
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        assert json.loads(out.stdout)["job_role"] == "onceflow_composed_job"
    s = kafka.replace(
        app_id="composed", sink_kind="postgres", postgres_port=info["port"], postgres_database="composed_db"
    )
    job = s.replace(postgres_password="job-secret-job")
    sink = DatabaseSink(job, ev.EventBus.for_job(s), group=_Group())  # checks the tables, takes the writer row
    sink.close()
    reader = s.replace(postgres_user="onceflow_composed_reader", postgres_password="reader-secret-reader")
    with client.connect(reader) as conn:
        assert conn.execute(sql.SQL("SELECT count(*) FROM {}").format(client.table(s, "results"))).fetchone() == (0,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(sql.SQL("DELETE FROM {}").format(client.table(s, "results")))


def test_an_operator_runs_an_app_into_postgresql_from_a_fresh_shell(tmp_path):
    """The path docs/database-sink.md gives: `stack up --postgres`, the job started with ONCEFLOW_SINK_KIND=postgres,
    records in, `db status` showing them committed, `stack down` stopping everything, the server too; each command
    a process of its own with only the var dir in its environment (the stack remembers the rest). The job's process
    holds its own role's password and no other."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from onceflow import config
    from onceflow.runtime import supervisor

    var = tmp_path / "var"
    shell = {k: os.environ[k] for k in ("PATH", "HOME", "JAVA_HOME", "LANG") if k in os.environ}
    shell["ONCEFLOW_VAR_DIR"] = str(var)

    def cli(*args: str, timeout: float = 300, **env: str) -> dict:
        json_flag = [] if args[0] == "audit" else ["--json"]  # audit prints its verdict as JSON always
        out = subprocess.run(
            [sys.executable, "-m", "onceflow.cli", *args, *json_flag],
            env={**shell, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
        return json.loads(out.stdout)

    first = dict(
        ONCEFLOW_BOOTSTRAP_SERVERS=f"127.0.0.1:{procs.free_port()}",
        ONCEFLOW_CONTROLLER_PORT=str(procs.free_port()),
    )
    s = config.load(env={**shell, **first})
    try:
        up = cli("stack", "up", "--postgres", **first)
        assert up["postgres"]["running"] and up["postgres"]["roles"] == [
            "onceflow_ip_count_job",
            "onceflow_ip_count_reader",
        ]
        cli("job", "start", ONCEFLOW_SINK_KIND="postgres", ONCEFLOW_TRIGGER_INTERVAL_S="1")
        sent = cli("produce", "--count", "3000", "--tail", "12", "--seed", "3")["sent"]  # the tail's records too

        def committed() -> dict | None:
            st = cli("db", "status")
            done = st["last_end_offsets"] and sum(st["last_end_offsets"].values()) == sent and st["results_rows"] > 0
            return st if done else None

        st = procs.wait_until(committed, 240, interval=2.0, what="every record committed to the table")
        assert st["dlq_rows"] > 0  # --malformed 0.01 by default: rejects in the DLQ table, in the same transactions
        verdict = cli("audit", timeout=120, ONCEFLOW_SINK_KIND="postgres")  # as the reader role, on a running job
        assert verdict["ok"] and verdict["sink_records"] == st["results_rows"], verdict

        info = postgres.state(s)
        job_pid = procs.read_pidfile(supervisor.job_pidfile(s))["pid"]
        env = (Path("/proc") / str(job_pid) / "environ").read_bytes()
        assert info["roles"]["onceflow_ip_count_job"].encode() in env
        assert info["roles"]["onceflow_ip_count_reader"].encode() not in env and info["password"].encode() not in env
    finally:
        down = cli("stack", "down")
    assert down["job_stopped"] and down["postgres_stopped"] and down["broker_stopped"]
    assert not postgres.running(s)
    postgres.remove(s)
