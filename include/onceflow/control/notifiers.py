"""Alert channels as the Airflow providers' own notifiers, configured through Airflow connections:

- `webhook`: the HTTP provider's `HttpNotifier`, a JSON POST `{"alert": {...}, "text": "..."}` to the HTTP
  connection `ONCEFLOW_ALERT_WEBHOOK_CONN_ID` (its host, port and schema; its login and password as basic auth;
  its extra as headers) at `ONCEFLOW_ALERT_WEBHOOK_ENDPOINT`;
- `slack`: the Slack provider's `SlackWebhookNotifier` with the `slackwebhook` connection
  `ONCEFLOW_ALERT_SLACK_CONN_ID` (the incoming webhook's URL in its password);
- `smtp`: the SMTP provider's `SmtpNotifier` with its `smtp_default`-style connection.

`ONCEFLOW_ALERT_CHANNELS` (comma-separated) chooses which are used. The checks' alerts (health, transaction watch,
rotation, reconciliation) go through them (`airflow_notify`), and so does every task that fails, times out or dies
(onceflow.control.task_defaults).
"""

from __future__ import annotations

import json
from typing import cast

from airflow.sdk import BaseNotifier, Context

from onceflow.config import Settings
from onceflow.control.alerts import Alert


def _webhook(settings: Settings, alert: Alert) -> BaseNotifier:
    from airflow.providers.http.notifications import HttpNotifier

    return HttpNotifier(
        http_conn_id=settings.alert_webhook_conn_id,
        endpoint=settings.alert_webhook_endpoint or None,
        json={"alert": json.loads(alert.to_json()), "text": alert.text()},
        extra_options={"timeout": 10},  # the hook waits forever by default; a dead receiver must not hang the task
    )


def _slack(settings: Settings, alert: Alert) -> BaseNotifier:
    from airflow.providers.slack.notifications.slack_webhook import SlackWebhookNotifier

    return SlackWebhookNotifier(slack_webhook_conn_id=settings.alert_slack_conn_id, text=alert.text())


def _smtp(settings: Settings, alert: Alert) -> BaseNotifier:
    from airflow.providers.smtp.notifications.smtp import SmtpNotifier

    return SmtpNotifier(
        to=settings.alert_email_to,
        smtp_conn_id=settings.alert_smtp_conn_id,
        subject=f"[onceflow {alert.severity}] {alert.summary[:120]}",
        html_content="<pre>" + alert.text().replace("&", "&amp;").replace("<", "&lt;") + "</pre>",
    )


def channels(settings: Settings) -> list[str]:
    """The configured channels, in order (the settings refuse an unknown one when they load)."""
    return [c.strip() for c in settings.alert_channels.split(",") if c.strip()]


def channel_notifiers(settings: Settings, alert: Alert) -> list[BaseNotifier]:
    make = {"webhook": _webhook, "slack": _slack, "smtp": _smtp}
    return [make[ch](settings, alert) for ch in channels(settings)]


def send(notifier: BaseNotifier, context: Context) -> None:
    # A notifier's fields are templates; the alert's text comes from Kafka and from exceptions, so it is never
    # rendered as one (a "{{" in a record would be evaluated): notify() sends the fields as they are.
    notifier.notify(context)


def airflow_notify(settings: Settings, context: Context | None = None):
    """An AlertSink notifier that sends each alert through every configured channel."""

    def to_channels(alert: Alert) -> None:
        for n in channel_notifiers(settings, alert):
            send(n, context or cast(Context, {}))

    return to_channels
