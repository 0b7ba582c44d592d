"""Alert channels as Airflow notifiers, configured through Airflow connections.

- `webhook`: POST the alert as JSON to an HTTP connection (host, port, schema, optional path in the
  `endpoint` extra, optional bearer token in the password);
- `slack`: a Slack incoming webhook, the URL in an HTTP connection (host + `endpoint` extra, or the password);
- `smtp`: the SMTP provider's SmtpNotifier with its `smtp_default`-style connection.
`ONCEFLOW_ALERT_CHANNELS` (comma-separated) chooses which are used. Each notifier is a real Airflow
`BaseNotifier` (usable as a DAG or task callback); `as_alert_callable` adapts it to `AlertSink`.
"""

from __future__ import annotations

import json
import urllib.request
from typing import cast

from airflow.sdk import BaseHook, BaseNotifier, Context

from onceflow.config import Settings
from onceflow.control.alerts import Alert


def _url(conn) -> str:
    extra = conn.extra_dejson
    if extra.get("url"):
        return extra["url"]
    scheme = conn.schema or "http"
    port = f":{conn.port}" if conn.port else ""
    path = extra.get("endpoint", "")
    return f"{scheme}://{conn.host}{port}/{path.lstrip('/')}"


def _post(url: str, payload: dict, token: str | None = None, timeout: float = 10.0) -> None:
    req = urllib.request.Request(
        url,
        data=json.dumps(payload, default=str).encode(),
        method="POST",
        headers={"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})},
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        if resp.status >= 300:
            raise RuntimeError(f"webhook answered {resp.status}")


class WebhookNotifier(BaseNotifier):
    """POST {"alert": {...}, "text": "..."} to the connection's URL."""

    template_fields = ("text",)

    def __init__(self, conn_id: str, text: str = "{{ ti.task_id }} failed", alert: dict | None = None):
        super().__init__()
        self.conn_id, self.text, self.alert = conn_id, text, alert

    def notify(self, context) -> None:
        conn = BaseHook.get_connection(self.conn_id)
        _post(_url(conn), {"alert": self.alert, "text": self.text}, conn.password or None)


class SlackWebhookNotifier(BaseNotifier):
    """A Slack incoming webhook: {"text": ...}."""

    template_fields = ("text",)

    def __init__(self, conn_id: str, text: str = "{{ ti.task_id }} failed"):
        super().__init__()
        self.conn_id, self.text = conn_id, text

    def notify(self, context) -> None:
        conn = BaseHook.get_connection(self.conn_id)
        url = conn.password if conn.password and conn.password.startswith("http") else _url(conn)
        _post(url, {"text": self.text})


def _smtp(settings: Settings, alert: Alert) -> BaseNotifier:
    from airflow.providers.smtp.notifications.smtp import SmtpNotifier

    return SmtpNotifier(
        to=settings.alert_email_to,
        smtp_conn_id=settings.alert_smtp_conn_id,
        subject=f"[onceflow {alert.severity}] {alert.summary[:120]}",
        html_content="<pre>" + alert.text().replace("<", "&lt;") + "</pre>",
    )


def channel_notifiers(settings: Settings, alert: Alert) -> list[BaseNotifier]:
    out: list[BaseNotifier] = []
    for ch in [c.strip() for c in settings.alert_channels.split(",") if c.strip()]:
        if ch == "webhook":
            out.append(WebhookNotifier(settings.alert_webhook_conn_id, alert.text(), json.loads(alert.to_json())))
        elif ch == "slack":
            out.append(SlackWebhookNotifier(settings.alert_slack_conn_id, alert.text()))
        elif ch == "smtp":
            out.append(_smtp(settings, alert))
        else:
            raise ValueError(f"unknown alert channel {ch!r} in ONCEFLOW_ALERT_CHANNELS (webhook, slack, smtp)")
    return out


def airflow_notify(settings: Settings, context: Context | None = None):
    """An AlertSink notifier that sends each alert through every configured Airflow notifier."""

    def send(alert: Alert) -> None:
        for n in channel_notifiers(settings, alert):
            n.notify(context or cast(Context, {}))

    return send
