"""The operator's paths in a running Airflow, the way `make run` starts it (api-server, scheduler, dag-processor,
triggerer), with the schedules shortened through settings: scheduled runs of health, transaction watch, rotation
and reconciliation doing their work; a transaction timeout and a killed job handled by the scheduled runs, with one
alert and one resolution each at a webhook receiver; backfill, reconciliation and deploy triggered through the REST
API with the typed params the UI's trigger form sends; the DAG list and the backfill form in a real browser. A
second app instance of another kind (ip_networks) gets its own DAGs from the same files (ONCEFLOW_APPS), is
deployed through its deploy DAG, proven by its own scheduled reconciliation (the generic replay: no recount of its
own) and stopped again, beside the first.

One Airflow for the module, the first app's job and input stream throughout; the tests run in order and each waits on a condition
with a deadline."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest

from onceflow import config
from onceflow.kafka import reading as kafka_reading
from onceflow.kafka import topics
from onceflow.kafka.events import EventBus
from onceflow.operations import audit, recon_chain, savepoints
from onceflow.runtime import jobctl, procs
from onceflow_dev import airflow_local, postgres
from onceflow_dev.airflow_client import AirflowApiError
from onceflow_dev.webhook_receiver import Receiver
from tests.support.harness import app_settings, harness, produce

pytestmark = pytest.mark.integration

APP = "airflow_e2e"
NETS = "airflow_nets"  # the second instance, of ip_networks: its DAGs generated beside the first's (ONCEFLOW_APPS)
# The second instance's own pace and reconciliation schedule, as an operator sets one instance's
# (ONCEFLOW__<INSTANCE>__<SETTING>): a quarter of the first's input needs batches less often, and its proofs (the
# replay alone) are cheap enough to come every 90 s.
NETS_TRIGGER_S, NETS_RECONCILE_MINUTES = 10.0, 1.5
NETS_ENV = {
    f"ONCEFLOW__{config.instance_token(NETS)}__TRIGGER_INTERVAL_S": str(NETS_TRIGGER_S),
    f"ONCEFLOW__{config.instance_token(NETS)}__RECONCILE_INTERVAL_MINUTES": str(NETS_RECONCILE_MINUTES),
}
# Shortened through the same settings an operator would set (ONCEFLOW_*_INTERVAL_*), not through test code paths.
# The first app's chain every 3 min: each of its runs (a spark-submit, ip_count's recount with its GX suite, the
# replay) took 2-3 min on a slow 2-core machine, so at 45 s they ran back to back, a core's worth beside every test.
# Transaction watch every minute and rotation every two (each run an Airflow task process beside the job): health,
# whose runs bring the killed job back, every 30 s.
SCHEDULES = dict(
    health_interval_s=30.0, txn_watch_interval_s=60.0, rotation_interval_minutes=2.0, reconcile_interval_minutes=3.0
)
BACKGROUND: list[threading.Thread] = []  # the module's own threads, joined before Airflow stops
STOP = threading.Event()  # set by the module's teardown: its threads end
STALLED_BATCH = 6  # this batch's transaction is held past its timeout (fault injection, once)
SCREENSHOTS = config.REPO_ROOT / "var" / "screenshots"
CONSOLE_VIEWS = ("now", "batches", "transactions", "alerts", "savepoints", "proofs", "backfills")


@pytest.fixture(scope="module")
def platform(kafka, tmp_path_factory):
    base = kafka
    var = tmp_path_factory.mktemp("airflow-e2e")
    s = app_settings(
        base,
        APP,
        var_dir=var,
        airflow_port=procs.free_port(),
        alert_channels="webhook",
        transaction_timeout_ms=10_000,
        # the platform's default: each scheduled recount replays every batch since the last (about a second each,
        # onceflow.operations.replay), and at 2 s the recounts ran back to back beside the job
        trigger_interval_s=5.0,
        # each scheduled run proves at most 10 batches (the operator's ONCEFLOW_RECONCILE_MAX_BATCHES): with the
        # default (2000), the chain's third run took every batch committed while the first two ran, 70 batches of
        # replay (332 s beside everything else here), and a manual run waited behind it
        reconcile_max_batches=10,
        fault=f"stall_in_txn@{STALLED_BATCH}:16",
        # headroom over the input (200 records/s): beside Airflow, its schedules' recounts and a backfill, on 2 cores,
        # batches of 3000 took ~12 s at 300 records/s and the lag grew: an honest WARN, not what this module tests
        max_offsets_per_trigger=10_000,
        savepoint_keep=20,
        health_progress_threshold_s=90.0,
        restart_delay_s=2.0,
        apps=f"{APP}=ip_count,{NETS}=ip_networks",
        **SCHEDULES,
    )
    nets = second_instance(s)
    topics.ensure(s)
    topics.ensure(nets)
    if s.secured:  # make test-secured: this var's copy of the stack's secret store, the apps' principals and ACLs
        from onceflow_dev import credentials, stack

        credentials.path(s).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(credentials.path(base), credentials.path(s))
        stack.provision(s)
        stack.provision(nets)
    webhook = Receiver()
    extra = {
        **NETS_ENV,
        "AIRFLOW_CONN_ONCEFLOW_WEBHOOK": json.dumps(webhook.connection()),
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(procs.free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(procs.free_port()),
    }
    done = threading.Event()
    feeder = threading.Thread(
        target=produce,
        args=(s, var / "input.csv", done),
        daemon=True,
        kwargs=dict(
            count=10_000_000,
            rate=200,
            event_rate=200,
            start_ms=None,
            distinct_ips=300,
            late_fraction=0.01,
            malformed_fraction=0.01,
            out_of_order_fraction=0.02,
            seed=91,
        ),
    )
    # the second app's input: the same access-log records into its own source topic, at a quarter of the rate
    nets_feeder = threading.Thread(
        target=produce,
        args=(nets, var / "nets-input.csv", done),
        daemon=True,
        kwargs=dict(count=10_000_000, rate=50, event_rate=50, start_ms=None, distinct_ips=300, seed=92),
    )
    feeder.start()
    nets_feeder.start()
    try:
        info = airflow_local.up(s, trigger_deploy=True, timeout=420, extra_env=extra)
        api = airflow_local.client(s)
        # the second app is started the way an operator starts any app: its own deploy DAG, through the REST API
        NETS_DEPLOY.append(api.trigger(f"{NETS}_deploy", {"action": "start"}, note="the second app"))
        airflow_local.wait_job_started(s, timeout=420)
        yield s, api, webhook, info
    finally:
        done.set()
        feeder.join(60)
        nets_feeder.join(60)
        STOP.set()
        for t in BACKGROUND:
            t.join(60)
        airflow_local.down(s)
        jobctl.stop(s, timeout=60)
        jobctl.stop(nets, timeout=60)
        postgres.remove(s)  # its cluster may live under /var/tmp (onceflow_dev.postgres): nothing left behind
        webhook.close()


NETS_DEPLOY: list[dict] = []  # the second app's deploy run, triggered by the fixture


def second_instance(s):
    """The second instance's settings, as the control plane's DAG files read them from the same environment."""
    return config.load_instance(NETS, "ip_networks", env={**s.as_env(), **NETS_ENV})


def scheduled(api, dag_id: str, state: str | None = None) -> list[dict]:
    return api.runs(dag_id, run_type="scheduled", state=state)


def chain_results(s) -> list[dict]:
    return [r for r in recon_chain.recent_results(s) if r.get("mode") == "chain"]


def health_records(s) -> list[dict]:
    """The app's own health records (every instance of the control plane writes to one health topic)."""
    records = (json.loads(m.value) for m in kafka_reading.read_topic(s, s.health_topic))
    return [h for h in records if h.get("app") == s.app_id]


def health_windows(s) -> list[tuple]:
    """What health saw, should it have alerted: per run, the job's state and each partition's last samples."""
    return [
        (
            h["ts_ms"],
            h["running"],
            h["status"],
            {p: (v["status"], v["samples"][-4:]) for p, v in h["partitions"].items()},
        )
        for h in health_records(s)
    ]


def test_a_second_app_has_its_own_dags_and_is_proven_by_them(platform):
    """ip_networks (stateless, keyed by IP, a reference table) beside ip_count in one control plane: deployed by its
    own deploy DAG, watched by its own scheduled health and transaction watch, proven batch by batch by its own
    scheduled reconciliation, which replays its plan (it has no recount of its own), and stopped by its deploy DAG;
    the first app's job went on committing throughout. First in the module: once proven, the second app is stopped and
    its DAGs paused, and the first app's scheduled runs, waited for next, no longer share the machine with them."""
    s, api, webhook, _ = platform
    nets = second_instance(s)
    run = _wait(api, f"{NETS}_deploy", NETS_DEPLOY[0])
    assert run["state"] == "success", api.task_instances(f"{NETS}_deploy", run["dag_run_id"])
    assert "first_batch" in api.xcom(f"{NETS}_deploy", run["dag_run_id"], "first_commit")
    first_app = jobctl.status(s).last_batch
    watching = airflow_local.watch_dags(nets)
    assert set(watching) == {f"{NETS}_{k}" for k in airflow_local.WATCH_KINDS}

    def proven():
        done = {d: len(scheduled(api, d, "success")) for d in watching}
        recorded = chain_results(nets)
        chain = [r for r in recorded if r["first_batch"] is not None]
        # one scheduled run that proved batches, and every recorded run finished (a run records its result before
        # its DAG run ends): the chain's contiguity across runs is the first app's test
        ok = (
            done[f"{NETS}_health"] >= 1
            and done[f"{NETS}_txn_watch"] >= 1
            and done[f"{NETS}_reconciliation"] >= len(recorded)
            and len(chain) >= 1
        )
        return chain if ok else None

    # the module's first test: its schedules' first runs come beside Airflow's and both jobs' starts (the same
    # deadline as the first app's scheduled runs are waited for with)
    chain = procs.wait_until(proven, 900, interval=10, what=f"{NETS}'s scheduled runs proving its batches")
    for dag_id in watching:
        assert not scheduled(api, dag_id, "failed"), dag_id
    assert all(r["ok"] for r in chain), [r for r in chain if not r["ok"]]
    assert chain[0]["first_batch"] == audit.ledger_entries(nets)[0].batch
    # the generic proof, not ip_count's: the replay of the app's own plan, and no recount step
    logs = [
        api.task_log(f"{NETS}_reconciliation", r["dag_run_id"], "recount")
        for r in scheduled(api, f"{NETS}_reconciliation", "success")
    ]
    assert [log for log in logs if "the replay done" in log], logs[0][-3000:]
    assert not [log for log in logs if "step 3 of 3" in log]
    # its own pace and schedule (NETS_ENV), not the first app's: its DAG's interval, and its job's batches paced
    assert api.dag(f"{NETS}_reconciliation")["timetable_summary"] == str(timedelta(minutes=NETS_RECONCILE_MINUTES))
    assert api.dag(f"{APP}_reconciliation")["timetable_summary"] == str(timedelta(minutes=s.reconcile_interval_minutes))
    paced = [e.batch_ts_ms for e in audit.ledger_entries(nets)]
    gaps = sorted(b - a for a, b in zip(paced, paced[1:]))
    assert gaps and gaps[len(gaps) // 2] >= 0.9 * NETS_TRIGGER_S * 1000 > s.trigger_interval_s * 1000, gaps
    # its health is its own: its record names it, with the partitions of both its source topics (App.sources)
    [*_, h] = procs.wait_until(lambda: health_records(nets), 120, what=f"{NETS}'s health record")
    theirs = {f"{t}:{p}" for t in nets.source_topic_list for p in range(nets.source_partitions)}
    assert len(nets.source_topic_list) == 2 and h["running"] and set(h["partitions"]) == theirs, h
    assert not webhook.alerts(f"health:{NETS}:")
    # the first app's job committed meanwhile, on its own ledger
    assert jobctl.status(s).last_batch > first_app or procs.wait_until(
        lambda: jobctl.status(s).last_batch > first_app, 120, what=f"{APP} committing beside {NETS}"
    )
    assert jobctl.status(s).running
    # stopped by its deploy DAG, and its watching DAGs paused (the rest of the module is about the first app)
    stop = _wait(api, f"{NETS}_deploy", api.trigger(f"{NETS}_deploy", {"action": "stop"}, note="done with it"))
    assert stop["state"] == "success", api.task_instances(f"{NETS}_deploy", stop["dag_run_id"])
    st = jobctl.status(nets)
    assert not st.running and st.desired_state == "stopped", st
    for dag_id in watching:
        BACKGROUND.append(pause_between_runs_in_background(airflow_local.client(s), dag_id))


def test_scheduled_runs_do_their_work(platform):
    s, api, webhook, _ = platform

    def enough():
        done = {d: len(scheduled(api, d, "success")) for d in airflow_local.watch_dags(s)}
        proving = [r for r in chain_results(s) if r["first_batch"] is not None and r["ok"]]
        ok = (
            done[f"{APP}_health"] >= 2
            and done[f"{APP}_txn_watch"] >= 2
            and done[f"{APP}_checkpoint_rotation"] >= 1
            and done[f"{APP}_reconciliation"] >= 2
            and len(proving) >= 2
        )
        return done if ok else None

    procs.wait_until(enough, 900, interval=10, what="scheduled runs of every watching DAG")
    for dag_id in airflow_local.watch_dags(s):
        failed = scheduled(api, dag_id, "failed")
        assert not failed, f"{dag_id}: failed scheduled runs {[r['dag_run_id'] for r in failed]}"
    # the chain: contiguous coverage across scheduled runs, each batch proven once
    proving = [r for r in chain_results(s) if r["first_batch"] is not None]
    assert all(r["ok"] for r in proving), [r["run_id"] for r in proving if not r["ok"]]
    assert proving[0]["first_batch"] == audit.ledger_entries(s)[0].batch
    for a, b in zip(proving, proving[1:]):
        assert b["first_batch"] == a["last_batch"] + 1, (a["coverage"], b["coverage"])
        assert b["coverage"]["commit_time_ms"][0] >= a["coverage"]["commit_time_ms"][1]
    # the chain stands where its newest run that proved left it (a run may have ended since the read above)
    position = recon_chain.position(s).batch
    assert position >= proving[-1]["last_batch"]
    assert position in {r["last_batch"] for r in chain_results(s) if r["ok"] and r["first_batch"] is not None}
    assert all(r["last_batch"] - r["first_batch"] < s.reconcile_max_batches for r in proving)
    # rotation: a savepoint taken and verified
    taken = [m for m in savepoints.list_all(s) if m.complete]
    assert taken and savepoints.verify(s, taken[-1].id).ok
    # health: its record, with the lag per partition, is on the health topic
    health = health_records(s)
    assert health and set(health[-1]["partitions"]) == {"0", "1", "2", "3"}, health[-1:]
    # the transaction held past its timeout: one alert from the scheduled watch, and its resolution once the job
    # committed that batch again
    procs.wait_until(
        lambda: len(webhook.alerts("txn_watch:event:timeout:")) >= 2,
        240,
        interval=5,
        what="the timeout's alert and its resolution",
    )
    got = webhook.alerts("txn_watch:event:timeout:")
    assert [a["status"] for a in got] == ["firing", "resolved"], got
    assert f"batch {STALLED_BATCH}" in got[0]["summary"] and got[0]["source"] == "txn_watch"
    assert s.transactional_id in got[0]["summary"] and got[0]["severity"] == "critical"
    assert "ONCEFLOW_TRANSACTION_TIMEOUT_MS" in got[0]["action"]
    # the timeout crashed the job and its supervisor restarted it: health left that restart alone, no alert
    assert not webhook.alerts(f"health:{s.app_id}:"), (webhook.alerts(f"health:{s.app_id}:"), health_windows(s))


def test_a_killed_job_is_brought_back_by_the_scheduled_health_check(platform):
    s, api, webhook, _ = platform
    jobctl.wait_running(s, timeout=240)
    before = jobctl.status(s).last_batch
    jobctl.kill(s, with_supervisor=True)  # the whole process tree, as when a machine loses it
    killed_ms = int(time.time() * 1000)
    key = f"health:{s.app_id}:down"

    def since_kill():
        return [a["status"] for a in webhook.alerts(key) if a["ts_ms"] >= killed_ms]

    procs.wait_until(
        lambda: since_kill() == ["firing", "resolved"],
        420,
        interval=5,
        what="health to page the dead job, restart it and resolve",
    )
    # a new batch committed (the first one after the restart may be the killed batch's replay, skipped: a kill
    # between its Kafka commit and Spark's commits/N)
    jobctl.wait_for_commit(s, after_ms=killed_ms, timeout=240)
    procs.wait_until(
        lambda: (jobctl.status(s).last_batch or -1) > before, 240, interval=2, what="a batch after the restart"
    )
    # one more scheduled health run after the resolution: still exactly one alert and one resolution
    resolved_ms = [a for a in webhook.alerts(key) if a["ts_ms"] >= killed_ms][-1]["ts_ms"]
    procs.wait_until(
        lambda: [r for r in scheduled(api, f"{APP}_health", "success") if _ms(r["run_after"]) > resolved_ms],
        240,
        interval=5,
        what="a scheduled health run after the resolution",
    )
    assert since_kill() == ["firing", "resolved"], "exactly one alert and one resolution"
    assert not scheduled(api, f"{APP}_health", "failed")


def _ms(iso: str) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def _wait(api, dag_id: str, run: dict, timeout: float = 600) -> dict:
    return api.wait_run(dag_id, run["dag_run_id"], timeout=timeout)


def test_operators_trigger_backfill_reconciliation_and_deploy_through_the_rest_api(platform):
    s, api, webhook, _ = platform
    starts, ends = newest_range(s)
    form = {
        "backfill_id": "e2e-1",
        "start_offsets": starts,
        "end_offsets": ends,
        "since": None,
        "until": None,
        "target_topic": None,
        "chunk_size": 2000,
        "dry_run": False,
    }
    # refused by the params' own schema, before any run exists
    for bad in ({"chunk_size": 0}, {"backfill_id": "no/slashes"}, {"dry_run": "yes"}):
        with pytest.raises(AirflowApiError) as e:
            api.trigger(f"{APP}_backfill", form | bad)
        assert e.value.status == 400
    with pytest.raises(AirflowApiError) as e:
        api.trigger(f"{APP}_reconciliation", {"first_batch": -1, "last_batch": 2})
    assert e.value.status == 400
    # Three runs at once, as operators would: a backfill refused by its own validation (an empty range), a good
    # backfill, and a reconciliation by range beside the chain.
    entries = audit.ledger_entries(s)
    a, b = entries[1].batch, entries[4].batch
    empty = form | {"backfill_id": "e2e-bad", "end_offsets": {p: 0 for p in ends}, "start_offsets": ends}
    runs = {
        "bad": (f"{APP}_backfill", api.trigger(f"{APP}_backfill", empty)),
        "good": (f"{APP}_backfill", api.trigger(f"{APP}_backfill", form, note="e2e backfill")),
        "recon": (
            f"{APP}_reconciliation",
            api.trigger(
                f"{APP}_reconciliation",
                {"first_batch": a, "last_batch": b, "since": None, "until": None, "great_expectations": False},
            ),
        ),
    }
    done = {k: _wait(api, dag, run) for k, (dag, run) in runs.items()}
    # the refused one failed in its first task, and wrote nothing
    assert done["bad"]["state"] == "failed"
    assert api.task_instances(f"{APP}_backfill", done["bad"]["dag_run_id"])["validate"] == "failed"
    assert not [e for e in audit.ledger_records(s) if getattr(e, "backfill_id", None) == "e2e-bad"]
    # and paged, through the task's on_failure_callback (task_defaults.TaskFailureNotifier), with the reason
    [page] = procs.wait_until(lambda: webhook.alerts(f"task:{APP}_backfill:validate"), 60, what="the task's page")
    assert done["bad"]["dag_run_id"] in page["summary"] and page["severity"] == "critical", page
    # the good one wrote every window of the range once
    assert done["good"]["state"] == "success", api.task_instances(f"{APP}_backfill", done["good"]["dag_run_id"])
    report = api.xcom(f"{APP}_backfill", done["good"]["dag_run_id"], "run")
    out = kafka_reading.read_topic(s, s.backfill_topic)
    assert report["written_records"] == report["windows"] == len(out) == len({m.key for m in out}) > 0
    # it was waited for in the triggerer, which put the job's progress into the task's log as it came
    log = api.task_log(f"{APP}_backfill", done["good"]["dag_run_id"], "run")
    assert "in the triggerer" in log, log[-3000:]
    n = report["chunks"]
    assert [f"chunk {k} of {n}," in log for k in range(1, n + 1)] == [True] * n, log[-3000:]
    # the reconciliation by range, recorded beside the chain
    assert done["recon"]["state"] == "success"
    manual = [r for r in recon_chain.recent_results(s) if r.get("mode") == "manual"]
    assert manual and (manual[-1]["first_batch"], manual[-1]["last_batch"]) == (a, b) and manual[-1]["ok"]
    log = api.task_log(f"{APP}_reconciliation", done["recon"]["dag_run_id"], "recount")
    assert f"reconciliation of batches {a}..{b}: step 3 of 3 done" in log, log[-3000:]  # ip_count's recount
    assert f"reconciliation of batches {a}..{b}: the replay done" in log, log[-3000:]

    # deploy: a second start refuses to launch a second driver; an upgrade (stop-with-savepoint, start). (Its restart
    # is a stop and a start: the second app's are its deploy DAG's, above.)
    pid = jobctl.status(s).job_pid
    dup = _wait(api, f"{APP}_deploy", api.trigger(f"{APP}_deploy", {"action": "start", "wait_timeout_s": 300}))
    tis = api.task_instances(f"{APP}_deploy", dup["dag_run_id"])
    assert dup["state"] == "failed" and tis["preflight"] == "failed" and tis["launch"] != "success", tis
    assert jobctl.status(s).job_pid == pid
    run = _wait(
        api,
        f"{APP}_deploy",
        api.trigger(
            f"{APP}_deploy",
            {"action": "upgrade", "savepoint_id": "latest", "allow_rewind": False, "wait_timeout_s": 300},
        ),
    )
    assert run["state"] == "success", api.task_instances(f"{APP}_deploy", run["dag_run_id"])
    first = api.xcom(f"{APP}_deploy", run["dag_run_id"], "first_commit")
    assert "first_batch" in first and "in the triggerer" in api.task_log(
        f"{APP}_deploy", run["dag_run_id"], "first_commit"
    )
    st = jobctl.status(s)
    assert st.running and st.job_pid != pid and st.desired_state == "running"
    assert [m for m in savepoints.list_all(s) if m.mode == "stop"], "the upgrade's stop-with-savepoint"
    with pytest.raises(AirflowApiError) as e:
        api.trigger(f"{APP}_deploy", {"action": "explode"})
    assert e.value.status == 400
    # The chain's scheduled and manual runs are proven above; from here on its recounts (each minutes of Spark beside
    # the job) would only slow the tests that follow. The reconciliation DAG is paused once its run in
    # progress finishes, while the next tests go on.
    BACKGROUND.append(pause_between_runs_in_background(airflow_local.client(s), f"{APP}_reconciliation"))


def kafka_watermarks(s):

    return kafka_reading.watermarks(s, s.source_topic)


def newest_range(s, per_partition: int = 3000) -> tuple[dict[str, int], dict[str, int]]:
    """A backfill range over the newest records of each source partition (start and end offsets, as the forms take
    them): input has flowed for minutes, and a backfill of all of it is minutes of Spark."""
    marks = kafka_watermarks(s)
    return (
        {str(p): max(lo, hi - per_partition) for p, (lo, hi) in marks.items()},
        {str(p): hi for p, (_, hi) in marks.items()},
    )


def test_the_live_audit_agrees_with_a_running_job(platform):
    """`onceflow audit` on a running job with input flowing: the same verdict as on a stopped one, on a consistent
    cut it names, twice in a row."""
    s, *_ = platform
    env = {**os.environ, **s.as_env()}
    for _ in range(2):
        before = jobctl.status(s).last_batch
        out = subprocess.run(
            [sys.executable, "-m", "onceflow.cli", "audit"], env=env, capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
        rep = json.loads(out.stdout)
        assert rep["ok"] and rep["snapshot_batch"] >= before, rep
        assert f"up to batch {rep['snapshot_batch']}" in out.stderr
        assert "INFO" not in out.stderr  # quiet: library log lines go to the log file
    assert jobctl.status(s).last_batch > before, "the job committed while the audits ran"


@contextlib.contextmanager
def logged_in_browser(s, info, height: int = 1800):
    """Debian's Chromium, headless, driven by Playwright (no browser download), logged in to Airflow."""
    from playwright.sync_api import sync_playwright

    base = f"http://127.0.0.1:{s.airflow_port}"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path="/usr/bin/chromium",
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": height})
            page.goto(f"{base}/auth/login/", wait_until="networkidle")
            page.fill("input[name=username]", info["user"])
            page.fill("input[name=password]", info["password"])
            page.keyboard.press("Enter")
            page.wait_for_url(lambda url: "/auth/login" not in url, timeout=60_000)
            yield page, base
        finally:
            browser.close()


def test_the_dag_list_and_the_backfill_form_in_a_real_browser(platform):
    s, api, _, info = platform
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with logged_in_browser(s, info) as (page, base):
        page.goto(f"{base}/dags", wait_until="networkidle")
        for dag_id in airflow_local.all_dags(s):
            page.get_by_text(dag_id, exact=True).first.wait_for(timeout=60_000)
        page.screenshot(path=str(SCREENSHOTS / "airflow-dag-list.png"), full_page=True)
        page.goto(f"{base}/dags/{APP}_backfill", wait_until="networkidle")
        page.get_by_role("button", name="Trigger").first.click()
        page.get_by_text("backfill_id").first.wait_for(timeout=60_000)
        for param in ("start_offsets", "target_topic", "chunk_size", "dry_run"):
            page.get_by_text(param).first.wait_for(timeout=30_000)
        # the form as it opens is valid: the operator can trigger (the backfill's own validation then asks for a
        # range, before any write)
        trigger = page.get_by_role("dialog").get_by_role("button", name="Trigger")
        trigger.wait_for(timeout=30_000)
        assert trigger.is_enabled(), "the trigger form opens invalid: its Trigger button is disabled"
        page.screenshot(path=str(SCREENSHOTS / "airflow-backfill-form.png"), full_page=True)
    assert (SCREENSHOTS / "airflow-dag-list.png").stat().st_size > 10_000
    assert (SCREENSHOTS / "airflow-backfill-form.png").stat().st_size > 10_000


def _http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _new_run(api, dag_id: str, seen: set, page, timeout: float = 120) -> dict:
    """The run of `dag_id` the console just triggered (one not in `seen`), once it exists; else what the console's
    flash line says (a refused trigger names its reason there)."""
    try:
        return procs.wait_until(
            lambda: next((r for r in api.runs(dag_id) if r["dag_run_id"] not in seen), None),
            timeout,
            interval=2,
            what=f"a run of {dag_id} triggered from the console",
        )
    except TimeoutError as e:
        raise AssertionError(f"{e}; the console says: {page.inner_text('#flash')!r}") from None


def test_the_operator_console_in_a_real_browser(platform):
    """The console, loaded as an Airflow plugin, with the job running: every page with live data, its actions
    triggering the DAGs through Airflow's API as the logged-in operator (Airflow records who), a rewind asking for
    confirmation, anonymous callers refused."""
    s, api, _, info = platform
    base = f"http://127.0.0.1:{s.airflow_port}"
    for path in ("/onceflow/now", "/onceflow/api/now", "/onceflow/api/batches", "/onceflow/data-docs/index.html"):
        assert _http_status(base + path) in (401, 403), path
    shots = {}
    with logged_in_browser(s, info, height=1400) as (page, base):
        # reached from Airflow's navigation, in Airflow's frame
        page.goto(f"{base}/dags", wait_until="networkidle")
        page.get_by_role("link", name="onceflow").first.wait_for(timeout=60_000)

        # live data: the batch shown was committed no earlier than the page was asked for, and no later than now
        before = jobctl.status(s).last_batch
        page.goto(f"{base}/onceflow/now", wait_until="networkidle")
        page.get_by_text("last committed batch").wait_for(timeout=60_000)
        page.wait_for_function("document.querySelector('#content').innerText.includes('Lag per partition')")
        shown = re.search(r"last committed batch\s+(\d+)", page.inner_text("#content"))
        assert shown, page.inner_text("#content")[:500]
        assert before <= int(shown.group(1)) <= jobctl.status(s).last_batch, (before, shown.group(1))
        shots["now"] = page.screenshot(path=str(SCREENSHOTS / "console-now.png"), full_page=True)

        page.goto(f"{base}/onceflow/batches", wait_until="networkidle")
        page.wait_for_function("document.querySelectorAll('#table tr').length > 5", timeout=60_000)
        assert "txn ms" in page.inner_text("#table") and page.locator("#charts svg").count() == 3
        shots["batches"] = page.screenshot(path=str(SCREENSHOTS / "console-batches.png"), full_page=True)
        # the second app's own batches (its pages under its prefix), each counted per output topic: ip_networks
        # writes its listed networks to its sink topic and the rest to its named output `unlisted`
        nets = second_instance(s)
        page.goto(f"{base}/onceflow/app/{NETS}/batches", wait_until="networkidle")
        page.wait_for_function("document.querySelectorAll('#table tr').length > 2", timeout=60_000)
        table = page.inner_text("#table")
        assert f"{nets.sink_topic} " in table and f"{nets.outputs['unlisted']} " in table, table[:1000]
        page.screenshot(path=str(SCREENSHOTS / "console-batches-ip-networks.png"), full_page=True)

        # a record with markup in its fields, as anyone who may write the job's events topic could write it: shown
        # as text, run never (escaped, typed, and the page's Content-Security-Policy would refuse it anyway)
        hostile = '<img src=x onerror="window.__xss=1">'
        bus = EventBus.for_job(harness(s))
        bus.emit("transaction_timeout", flush=True, host=hostile, error=hostile, elapsed_ms=hostile, batch=hostile)
        bus.close()
        resp = page.goto(f"{base}/onceflow/transactions", wait_until="networkidle")
        assert "script-src 'nonce-" in resp.headers["content-security-policy"]
        page.get_by_text("Alert history").wait_for(timeout=60_000)
        page.wait_for_function(f"document.querySelector('#content').innerText.includes({json.dumps(hostile)})")
        assert page.evaluate("window.__xss") is None and page.locator("#content img").count() == 0
        text = page.inner_text("#content")
        assert "transaction_timeout" in text and f"health:{s.app_id}:down" in text, text[:2000]
        shots["transactions"] = page.screenshot(path=str(SCREENSHOTS / "console-transactions.png"), full_page=True)

        page.goto(f"{base}/onceflow/proofs", wait_until="networkidle")
        page.get_by_text("Reconciliation runs").wait_for(timeout=60_000)
        proven = recon_chain.position(s).batch
        assert proven is not None and "proven" in page.inner_text("#content")
        assert "e2e-1" in page.inner_text("#content")  # the backfill run through the REST API earlier
        with page.expect_popup() as docs:
            page.get_by_role("link", name="Great Expectations Data Docs").click()
        docs.value.wait_for_load_state()
        assert "Data Docs" in docs.value.title() or "Expectation" in docs.value.content()
        shots["proofs"] = page.screenshot(path=str(SCREENSHOTS / "console-proofs.png"), full_page=True)
        # start a backfill from the console's form: a run of the app's backfill DAG, by the logged-in operator
        seen = {r["dag_run_id"] for r in api.runs(f"{APP}_backfill")}
        starts, ends = newest_range(s)
        page.fill("input[name=backfill_id]", "console-1")
        page.fill("input[name=start_offsets]", json.dumps(starts))
        page.fill("input[name=end_offsets]", json.dumps(ends))
        page.get_by_role("button", name="Start").click()
        page.get_by_text(f"of {APP}_backfill triggered").wait_for(timeout=60_000)
        backfill_run = _new_run(api, f"{APP}_backfill", seen, page)
        assert backfill_run["triggering_user_name"] == info["user"]
        assert "onceflow console" in (backfill_run.get("note") or "")
        # the second app reads two source topics: its form's example offsets name each position's topic
        page.goto(f"{base}/onceflow/app/{NETS}/proofs", wait_until="networkidle")
        page.get_by_text("Start a backfill").wait_for(timeout=60_000)
        example = json.loads(page.get_attribute("input[name=start_offsets]", "placeholder") or "{}")
        assert set(example) == {f"{t}:0" for t in nets.source_topic_list}, example

        page.goto(f"{base}/onceflow/savepoints", wait_until="networkidle")
        page.wait_for_function("document.querySelectorAll('[data-verify]').length >= 2", timeout=60_000)
        shots["savepoints"] = page.screenshot(path=str(SCREENSHOTS / "console-savepoints.png"), full_page=True)
        ids = page.eval_on_selector_all("[data-verify]", "els => els.map(e => e.dataset.verify)")
        # verify an older one: a rotation run with action=verify, and its verdict shows. The second newest, not the
        # oldest: the scheduled rotation keeps savepoint_keep and may delete the oldest while it is verified (a CI
        # run whose module ran long enough to hold that many failed so, "no savepoint sp-...")
        older = ids[1]
        seen = {r["dag_run_id"] for r in api.runs(f"{APP}_checkpoint_rotation")}
        page.click(f"[data-verify='{older}']")
        run = _new_run(api, f"{APP}_checkpoint_rotation", seen, page)
        assert api.wait_run(f"{APP}_checkpoint_rotation", run["dag_run_id"], timeout=300)["state"] == "success"
        assert savepoints.last_verification(s, older)["ok"]
        assert api.wait_run(f"{APP}_backfill", backfill_run["dag_run_id"], timeout=600)["state"] == "success"
        # a rewind asks first; dismissed, nothing is triggered (the list as it is now: rotation keeps running)
        ids = page.eval_on_selector_all("[data-restore]", "els => els.map(e => e.dataset.restore)")
        seen = {r["dag_run_id"] for r in api.runs(f"{APP}_deploy")}
        page.once("dialog", lambda d: d.dismiss() if "REWIND" in d.message else d.accept())
        page.click(f"[data-restore='{ids[-1]}']")
        page.get_by_text("restore cancelled").wait_for(timeout=30_000)
        assert {r["dag_run_id"] for r in api.runs(f"{APP}_deploy")} == seen
        # restoring the newest is confirmed: the deploy DAG stops, restores and starts the job. The operator pauses
        # the rotation first (and lets a running one finish): a savepoint it takes between the page and the restore
        # would make "the newest" a rewind, refused
        procs.wait_until(
            lambda: _paused_between_runs(api, f"{APP}_checkpoint_rotation"),
            300,
            interval=2,
            what="rotation paused between runs",
        )
        page.reload(wait_until="networkidle")
        page.wait_for_function("document.querySelectorAll('[data-restore]').length >= 2", timeout=60_000)
        ids = page.eval_on_selector_all("[data-restore]", "els => els.map(e => e.dataset.restore)")
        page.once("dialog", lambda d: d.accept())
        page.click(f"[data-restore='{ids[0]}']")
        run = _new_run(api, f"{APP}_deploy", seen, page)
        assert run["conf"]["action"] == "restore" and run["conf"]["savepoint_id"] == ids[0]
        assert not run["conf"]["allow_rewind"] and run["triggering_user_name"] == info["user"]
        assert api.wait_run(f"{APP}_deploy", run["dag_run_id"], timeout=600)["state"] == "success"
        assert jobctl.status(s).running
        api.unpause(f"{APP}_checkpoint_rotation")
    for name in shots:
        assert (SCREENSHOTS / f"console-{name}.png").stat().st_size > 10_000


def pause_between_runs_in_background(api, dag_id: str, timeout: float = 600) -> threading.Thread:
    """Pause `dag_id` between two of its runs (_paused_between_runs), from a thread: the tests go on meanwhile. A
    saving of the suite's time, not a claim: if no gap is caught, the DAG keeps running and nothing fails. The
    module's teardown sets STOP, so a thread still looking does not hold Airflow's shutdown."""

    def pause() -> None:
        deadline = time.monotonic() + timeout
        while not STOP.is_set() and time.monotonic() < deadline:
            if _paused_between_runs(api, dag_id):
                return
            STOP.wait(2)

    thread = threading.Thread(target=pause, daemon=True, name=f"pause-{dag_id}")
    thread.start()
    return thread


def _paused_between_runs(api, dag_id: str) -> bool:
    """Pause `dag_id` with none of its runs running. The scheduler does not schedule the remaining tasks of a paused
    DAG's running run, so a run caught by the pause would never finish: unpause, let it finish, pause again. A queued
    run is left queued: the scheduler starts none of a paused DAG's queued runs (`DagRun.get_queued_dag_runs_to_set_
    running`), and with the DAG's one active run at a time there is always one queued behind a recount that takes
    longer than the schedule's interval, so waiting for no queued run too found no gap in a whole module."""

    def running():
        return api.runs(dag_id, state="running")

    if running():
        api.unpause(dag_id)
        return False
    api.pause(dag_id)
    if running():  # one started just before the pause
        api.unpause(dag_id)
        return False
    return True


def test_no_kafka_password_where_airflow_and_the_platform_write(platform):
    """On the secured broker (make test-secured) the roles' passwords reach the DAGs and the job only through
    Airflow's connections: none in Airflow's database and task logs, the job's files and logs, status, events and
    savepoints, the console's answers, or a command line. Last in the module: everything above has written."""
    s, api, _, _ = platform
    if not s.secured:
        pytest.skip("a plaintext broker has no passwords (make test-secured runs this)")
    from onceflow.kafka import acls
    from onceflow_dev import credentials
    from tests.support.session import session_processes

    written = [json.dumps(api.get(f"/onceflow/api/{view}"), default=str) for view in CONSOLE_VIEWS]
    written += [Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace") for pid, _ in session_processes()]
    for topic in (
        s.events_topic,
        s.job_events_topic,
        s.ledger_topic,
        s.alerts_topic,
        s.health_topic,
        s.reconciliation_topic,
    ):
        written += [repr(m) for m in kafka_reading.read_topic(s, topic)]
    store = credentials.path(s)
    files = [f for f in s.var_dir.rglob("*") if f.is_file() and f != store and "tls" not in f.parts]
    assert any(f.suffix == ".log" for f in files), files[:20]
    written += [f.read_bytes().decode(errors="replace") for f in files]
    written.append(postgres.dump_text(s))  # Airflow's metadata database, every row of every table
    text = "\n".join(written)
    known = credentials.ensure(s)
    for role in acls.ROLES:
        assert known[acls.username(s, role)] not in text, f"the {role}'s Kafka password is written somewhere"


def test_airflow_keeps_its_metadata_in_the_embedded_postgresql(platform):
    """As `make run` sets it up: Airflow's runs are rows of the PostgreSQL server under var/, not of a SQLite file."""
    s, api, _, _ = platform
    dags = {d for (d,) in postgres.query(s, "SELECT dag_id FROM dag")}
    assert set(airflow_local.all_dags(s)) <= dags, dags
    runs = postgres.query(s, "SELECT count(*) FROM dag_run")[0][0]
    assert runs >= len(api.runs(f"{APP}_health")) > 0
    assert not (airflow_local.home(s) / "airflow.db").exists()


def test_nothing_the_platform_starts_listens_beyond_loopback(platform):
    """Started as `make run` starts it, with the job running: no process of this session (Airflow's api-server,
    scheduler, dag-processor, triggerer and their task processes, the job's supervisor, spark-submit, driver JVM and
    Python workers, the broker) listens on anything but loopback (ONCEFLOW_LISTEN_HOST would open them)."""
    s, _, _, _ = platform
    from tests.support.session import session_processes

    procs.wait_until(lambda: jobctl.status(s).running, 300, interval=2, what="the job to run")
    # (and their descendants: a process renamed by setproctitle, as Airflow's api-server is, loses the session's
    # token from the environment /proc shows)
    pids = procs.with_descendants(pid for pid, _ in session_processes()) - _harness_jvm()
    found = procs.listening_sockets(pids)
    # the listing sees the platform: the api-server, the broker, the job's driver JVM (spark-submit's)
    assert {s.airflow_port, s.bootstrap_host_port[1], postgres.state(s)["port"]} <= {x.port for x in found}, found
    assert any("org.apache.spark.deploy.SparkSubmit" in procs.cmdline(x.pid) for x in found), found
    beyond = [
        f"pid {x.pid} ({procs.describe(x.pid)}) listens on {x.host}:{x.port}" for x in procs.beyond_loopback(pids)
    ]
    assert not beyond, "listening beyond loopback:\n" + "\n".join(beyond)


def _harness_jvm() -> set[int]:
    """The JVM of this pytest process's own Spark session (tests.conftest's `spark` fixture, when an earlier module
    of the session started it): the test harness, not the platform."""
    import pyspark

    sc = pyspark.SparkContext._active_spark_context
    proc = getattr(getattr(sc, "_gateway", None), "proc", None)
    return {proc.pid} if proc is not None else set()


def test_the_jobs_processes_hold_their_own_role_and_none_of_airflows_secrets(platform):
    """The job as the deploy DAG started it (an Airflow task, which holds every role's connection and Airflow's own
    settings): its supervisor, spark-submit, driver JVM and Python workers got an allow-listed environment, with the
    job's settings and on the secured broker the job's password, and nothing of Airflow's (no AIRFLOW_CONN_*, no
    AIRFLOW__*) nor another role's password."""
    s, _, _, _ = platform
    st = procs.wait_until(
        lambda: (x := jobctl.status(s)).running and x.supervisor_pid and x, 300, what="the job to run"
    )
    pids = procs.with_descendants([st.supervisor_pid])
    assert len(pids) >= 3, pids  # the supervisor, spark-submit's JVM, the driver's Python
    others: dict[str, str] = {}
    if s.secured:
        from onceflow.kafka import acls
        from onceflow_dev import credentials

        known = credentials.ensure(s)
        others = {r: known[acls.username(s, r)] for r in acls.ROLES if r != "job"}
    for pid in pids:
        try:
            raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
        except OSError:
            continue  # gone since
        env = dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)
        airflow = sorted(k for k in env if k.startswith("AIRFLOW"))
        assert not airflow, f"pid {pid} ({procs.describe(pid)}) holds {airflow}"
        assert env.get("ONCEFLOW_APP_ID") == s.app_id, procs.describe(pid)
        for role, password in others.items():
            assert password not in raw, f"pid {pid} ({procs.describe(pid)}) holds the {role}'s password"
        assert postgres.state(s)["password"] not in raw, f"pid {pid} holds Airflow's database password"
