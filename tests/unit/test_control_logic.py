"""Pure control-plane logic: Burrow lag rules, alert deduplication, hanging transactions, health assessment."""
from onceflow import alerts, config, health, lag, txnwatch
from onceflow import events as ev
from onceflow.lag import Sample


def samples(pairs, t0=0, step=60_000, commit_ts=None):
    return [Sample(t0 + i * step, c, e, commit_ts) for i, (c, e) in enumerate(pairs)]


def test_burrow_rules():
    assert lag.evaluate(samples([(10, 10), (20, 30), (30, 50)])) == lag.OK          # lag was zero in the window
    assert lag.evaluate(samples([(10, 20), (20, 40), (30, 70)])) == lag.WARN        # moving, lag grows
    assert lag.evaluate(samples([(10, 20), (20, 25), (30, 32)])) == lag.OK          # moving, lag shrinks
    assert lag.evaluate(samples([(10, 20), (10, 25), (10, 30)])) == lag.STALL       # stuck with lag
    assert lag.evaluate(samples([(10, 20), (10, 25), (10, 30)], commit_ts=-10**9)) == lag.STOP
    assert lag.evaluate(samples([(10, 20), (5, 25), (12, 30)])) == lag.REWIND
    assert lag.evaluate(samples([(10, 20), (10, 25)])) == lag.OK                    # too few samples to judge
    assert lag.trend(samples([(0, 5), (0, 9)])) is lag.Trend.GROWING
    assert lag.worst([lag.OK, lag.WARN, lag.STALL]) == lag.STALL


def cond(key, one_off=False):
    return alerts.Condition(key, alerts.CRITICAL, f"summary {key}", "do something", one_off=one_off)


def test_alerts_fire_once_while_a_condition_persists_and_resolve_once():
    state = {}
    first = alerts.transitions([cond("h:down")], state, "app", "health", "h:")
    assert [(a.key, a.status) for a in first] == [("h:down", alerts.FIRING)]
    state = alerts.fold_state(first)
    assert alerts.transitions([cond("h:down")], state, "app", "health", "h:") == []
    resolved = alerts.transitions([], state, "app", "health", "h:")
    assert [(a.key, a.status) for a in resolved] == [("h:down", alerts.RESOLVED)]
    state = alerts.fold_state(first + resolved)
    assert alerts.transitions([], state, "app", "health", "h:") == []
    again = alerts.transitions([cond("h:down")], state, "app", "health", "h:")
    assert [a.status for a in again] == [alerts.FIRING]


def test_a_check_resolves_only_its_own_conditions():
    state = {"h:down": alerts.FIRING, "t:hanging:x": alerts.FIRING}
    out = alerts.transitions([], state, "app", "txn_watch", "t:")
    assert [(a.key, a.status) for a in out] == [("t:hanging:x", alerts.RESOLVED)]


def test_the_same_condition_twice_in_one_evaluation_is_one_alert():
    out = alerts.transitions([cond("t:event:1", one_off=True), cond("t:event:1", one_off=True)], {}, "a", "t", "t:")
    assert len(out) == 1


def test_one_off_alerts_fire_once_and_never_resolve():
    first = alerts.transitions([cond("t:event:1", one_off=True)], {}, "app", "t", "t:")
    state = alerts.fold_state(first)
    assert state == {"t:event:1": alerts.ONCE}
    assert alerts.transitions([cond("t:event:1", one_off=True)], state, "app", "t", "t:") == []
    assert alerts.transitions([], state, "app", "t", "t:") == []


def test_alert_json_roundtrip_and_text():
    a = alerts.transitions([cond("k")], {}, "app", "src", "k")[0]
    assert alerts.Alert.from_json(a.to_json()) == a
    assert "What to do: do something" in a.text()


def test_hanging_transactions_are_those_older_than_the_timeout():
    mine = txnwatch.OpenTxn("sink", 1, 40, 45, first_ts_ms=1_000, app="ip_count", batch="7")
    fresh = txnwatch.OpenTxn("sink", 2, 10, 12, first_ts_ms=60_000, app="ip_count", batch="8")
    out = txnwatch.hanging([mine, fresh], now_ms=62_000, timeout_ms=60_000)
    assert len(out) == 1 and out[0].key == "txn_watch:hanging:sink:1"
    assert out[0].details["age_ms"] == 61_000 and "onceflow.ip_count" in out[0].summary
    assert "--start-offset 40" in out[0].action


def test_timeout_event_absorbs_its_near_timeout_warning():
    base = {"app": "a", "host": "h", "pid": 1, "transactional_id": "onceflow.a", "timeout_ms": 6000}
    evs = [dict(base, type=ev.TRANSACTION_NEAR_TIMEOUT, batch=3, txn_ms=4900, committed=False),
           dict(base, type=ev.TRANSACTION_TIMEOUT, batch=3, elapsed_ms=6100, action="raise it"),
           dict(base, type=ev.TRANSACTION_NEAR_TIMEOUT, batch=5, txn_ms=5000, committed=True)]
    out = txnwatch.event_conditions(evs)
    assert [c.key.split(":")[2] for c in out] == ["timeout", "near_timeout"]
    assert all(c.one_off for c in out) and out[0].severity == alerts.CRITICAL


def record(**kw):
    base = dict(app="a", ts_ms=1_000_000, running=True, job_pid=1, last_commit_age_s=5.0, partitions={},
                total_lag=0, checkpoint_age_s=5.0, desired="running")
    return health.HealthRecord(**(base | kw))


def test_health_assessment():
    s = config.load(env={}, app_id="a")
    assert health.assess(record(), s) == [] 
    down = health.assess(rec := record(running=False, job_pid=None), s)
    assert [c.key for c in down] == ["health:a:down"] and rec.status == health.FAILING
    stopped = health.assess(rec := record(running=False, job_pid=None, desired="stopped", total_lag=50), s)
    assert stopped == [] and rec.status == health.STOPPED  # stopped on purpose: not restarted, not alerted
    assert health.assess(record(running=False, job_pid=None, desired=None), s) == []  # never deployed
    stalled = health.assess(record(total_lag=500, last_commit_age_s=999.0), s)
    assert [c.key for c in stalled] == ["health:a:stalled"]
    idle = health.assess(record(total_lag=0, last_commit_age_s=9999.0, checkpoint_age_s=9999.0), s)
    assert idle == []  # no input waiting: an idle job is healthy
    warn = health.assess(rec := record(partitions={"0": {"status": lag.WARN, "lag": 9, "trend": "growing"}}), s)
    assert [c.severity for c in warn] == [alerts.WARNING] and rec.status == health.DEGRADED


def test_remediation_is_bounded(monkeypatch):
    s = config.load(env={}, app_id="a", health_restart_attempts=2, health_restart_window_s=600)
    started = []
    monkeypatch.setattr(health.jobctl, "stop", lambda *a, **k: False)
    lagging = record(partitions={"0": {"status": lag.WARN, "lag": 9, "trend": "growing"}})
    assert health.remediate(lagging, health.assess(lagging, s), s, 1_000_000, started.append) == []
    assert started == [] and lagging.action == "none"  # lag alone is alerted, not restarted
    rec = record(running=False, job_pid=None)
    found = health.assess(rec, s)
    assert health.remediate(rec, found, s, 1_000_000, started.append) == [] and rec.action == "restarted"
    assert health.remediate(rec, found, s, 1_100_000, started.append) == [] and len(started) == 2
    paged = health.remediate(rec, found, s, 1_200_000, started.append)
    assert [c.key for c in paged] == ["health:a:gave_up"] and len(started) == 2 and rec.action == "gave up"
    # outside the window the budget is back
    assert health.remediate(rec, found, s, 1_000_000 + 700_000 + 600_000, started.append) == []
    assert len(started) == 3
