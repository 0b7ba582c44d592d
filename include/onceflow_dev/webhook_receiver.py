"""A local webhook receiver: what the alert channel `webhook` posts to, in tests and the soak (loopback, a free
port, stopped by `close`)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer


class Receiver:
    def __init__(self) -> None:
        self.received: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.received.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def alerts(self, prefix: str = "") -> list[dict]:
        return [r["alert"] for r in self.received if (r.get("alert") or {}).get("key", "").startswith(prefix)]

    def connection(self) -> dict:
        """The Airflow connection (as AIRFLOW_CONN_ONCEFLOW_WEBHOOK JSON) that points the webhook channel here."""
        return {
            "conn_type": "http",
            "host": "127.0.0.1",
            "port": self.port,
            "schema": "http",
        }

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
