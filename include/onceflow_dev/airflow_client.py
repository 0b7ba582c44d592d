"""A small client of Airflow 3's public REST API (`/api/v2`), as an operator's script or the soak uses it: a token
from the auth manager, DAG runs triggered with the typed params the UI's trigger form sends, their states and
task instances. Standard library only."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from onceflow.wire import OnceflowError


class AirflowApiError(OnceflowError):
    def __init__(self, status: int, body: str, what: str):
        super().__init__(f"{what}: HTTP {status}: {body[:1000]}")
        self.status, self.body = status, body


@dataclass
class AirflowClient:
    base_url: str
    username: str
    password: str
    _token: str | None = None

    # ------------------------------------------------------------------ plumbing
    def token(self) -> str:
        if self._token is None:
            got = self._call("POST", "/auth/token", {"username": self.username, "password": self.password}, auth=False)
            self._token = got["access_token"]
        return self._token

    def _call(
        self,
        method: str,
        path: str,
        body: dict | None = None,
        auth: bool = True,
        query: dict | None = None,
        timeout: float = 30.0,
    ):
        url = self.base_url.rstrip("/") + path + (("?" + urllib.parse.urlencode(query, doseq=True)) if query else "")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token()}"
        req = urllib.request.Request(
            url, method=method, headers=headers, data=json.dumps(body).encode() if body is not None else None
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
                return json.loads(raw) if raw else None
        except urllib.error.HTTPError as e:
            raise AirflowApiError(e.code, e.read().decode(errors="replace"), f"{method} {path}") from None

    def get(self, path: str, **query):
        return self._call("GET", path, query=query or None)

    # ------------------------------------------------------------------ DAGs and runs
    def dag(self, dag_id: str) -> dict:
        return self.get(f"/api/v2/dags/{dag_id}")

    def dags(self) -> list[dict]:
        return self.get("/api/v2/dags", limit=100)["dags"]

    def unpause(self, dag_id: str) -> dict:
        return self._call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})

    def pause(self, dag_id: str) -> dict:
        return self._call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": True})

    def trigger(self, dag_id: str, conf: dict | None = None, note: str | None = None) -> dict:
        """A manual run with `conf` as the trigger form sends it (typed values; Airflow validates the DAG's
        Params and answers 400 before any run exists when they do not fit)."""
        body: dict = {"logical_date": None, "conf": conf or {}}
        if note:
            body["note"] = note
        return self._call("POST", f"/api/v2/dags/{dag_id}/dagRuns", body)

    def runs(self, dag_id: str, run_type: str | None = None, state: str | None = None, limit: int = 100) -> list[dict]:
        q: dict = {"limit": limit, "order_by": "-run_after"}
        if run_type:
            q["run_type"] = run_type
        if state:
            q["state"] = state
        return self.get(f"/api/v2/dags/{dag_id}/dagRuns", **q)["dag_runs"]

    def run(self, dag_id: str, run_id: str) -> dict:
        return self.get(f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id, safe='')}")

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, str]:
        got = self.get(f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id, safe='')}/taskInstances")
        return {ti["task_id"]: ti["state"] for ti in got["task_instances"]}

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value"):
        got = self.get(
            f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id, safe='')}/taskInstances/"
            f"{task_id}/xcomEntries/{key}",
            deserialize="true",
        )
        return got.get("value")

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        """A task try's whole log as the UI shows it (the worker's lines and the triggerer's), one event a line."""
        got = self.get(
            f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id, safe='')}/taskInstances/"
            f"{task_id}/logs/{try_number}",
            full_content="true",
        )
        content = got.get("content") or []
        return "\n".join(c if isinstance(c, str) else str(c.get("event", "")) for c in content)

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 600.0, interval: float = 3.0) -> dict:
        """Until the run is finished (success or failed); returns it."""
        deadline = time.monotonic() + timeout
        while True:
            r = self.run(dag_id, run_id)
            if r["state"] in ("success", "failed"):
                return r
            if time.monotonic() > deadline:
                raise TimeoutError(f"{dag_id} run {run_id} is still {r['state']} after {timeout:.0f} s")
            time.sleep(interval)
