"""The alert channels are the providers' notifiers (HTTP, Slack), posting for real to a receiver on loopback;
a failing task pages through them. Connections come from AIRFLOW_CONN_* variables, as Airflow reads them."""

import json
from datetime import timedelta
from types import SimpleNamespace

import pytest

from onceflow import config
from onceflow.control import alerts, notifiers, task_defaults
from onceflow_dev.webhook_receiver import Receiver


@pytest.fixture
def receiver(monkeypatch):
    r = Receiver()
    monkeypatch.setenv("AIRFLOW_CONN_ONCEFLOW_WEBHOOK", json.dumps(r.connection()))
    monkeypatch.setenv(
        "AIRFLOW_CONN_ONCEFLOW_SLACK",
        json.dumps({"conn_type": "slackwebhook", "password": f"http://127.0.0.1:{r.port}/services/T/B/x"}),
    )
    yield r
    r.close()


def alert(summary="consumer lag 12 batches", key="health:lag"):
    return alerts.Alert(
        key, alerts.Status.FIRING, alerts.Severity.CRITICAL, summary, "look", "ip_count", "health", 1, {"n": 1}
    )


def test_webhook_and_slack_channels_post_through_the_providers(receiver):
    s = config.load(env={}, alert_channels="webhook,slack", alert_webhook_endpoint="hooks/onceflow")
    kinds = [type(n).__name__ for n in notifiers.channel_notifiers(s, alert())]
    assert kinds == ["HttpNotifier", "SlackWebhookNotifier"]
    # a record's text is never rendered as a template: "{{ ... }}" arrives as it was written
    notifiers.airflow_notify(s)(alert(summary="ip {{ 7 * 7 }} is hot"))
    webhook, slack = receiver.received
    assert webhook["alert"]["key"] == "health:lag" and webhook["alert"]["details"] == {"n": 1}
    assert "ip {{ 7 * 7 }} is hot" in webhook["text"] and "49" not in webhook["text"]
    assert slack["text"].startswith("[CRITICAL FIRING] ip_count: ip {{ 7 * 7 }} is hot")


def test_an_unknown_channel_is_refused_when_the_settings_load():
    with pytest.raises(config.ConfigError, match="ONCEFLOW_ALERT_CHANNELS takes webhook, slack, smtp"):
        config.load(env={}, alert_channels="webhook,pager")


def test_a_failed_task_pages_and_is_recorded_even_when_kafka_is_what_failed(receiver, monkeypatch):
    monkeypatch.setenv("ONCEFLOW_ALERT_CHANNELS", "webhook")
    recorded: list = []

    def publish(self, got):
        recorded.extend(got)
        raise RuntimeError("alerts could not be recorded on the alerts topic")  # the broker is down

    monkeypatch.setattr(alerts.AlertSink, "publish", publish)
    ti = SimpleNamespace(dag_id="ip_count_backfill", task_id="run", run_id="manual__1", try_number=1)
    task_defaults.TaskFailureNotifier().notify({"ti": ti, "exception": TimeoutError("Timeout: 25200 s")})
    [got] = receiver.alerts("task:")
    assert got["key"] == "task:ip_count_backfill:run" and got["one_off"] and got["source"] == "airflow"
    assert "run of ip_count_backfill failed (run manual__1): Timeout: 25200 s" in got["summary"]
    assert [a.key for a in recorded] == ["task:ip_count_backfill:run"]


def test_every_dag_task_pages_on_failure_and_is_bounded():
    args = task_defaults.default_args(timedelta(minutes=3), retries=1)
    assert args["retries"] == 1 and args["execution_timeout"].total_seconds() == 180
    assert [type(c).__name__ for c in args["on_failure_callback"]] == ["TaskFailureNotifier"]
