"""The operator console: a FastAPI app that Airflow mounts (plugins/onceflow_console.py), behind Airflow's own
authentication and authorization.

A FastAPI app mounted by an Airflow 3 plugin inherits none of the API server's dependencies: every route would be
open to anonymous callers. So the whole app depends on Airflow's `requires_access_dag` for the onceflow DAGs:
whoever may read the app instance's deploy DAG (`<app_id>_deploy`) may read the console; anonymous callers get 401, users without that right 403.
Actions (take, verify or restore a savepoint, start a backfill) are not routes of this app: the page triggers the
deploy, rotation and backfill DAGs through Airflow's REST API as the logged-in operator, so Airflow records who did
what and checks the DAG's own permissions.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from airflow.api_fastapi.core_api.security import requires_access_dag
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse

from onceflow import config
from onceflow.control.console import page, readers
from onceflow.rules import clock, names

SECTIONS = ("now", "batches", "transactions", "savepoints", "proofs")
# which console page a DAG's "onceflow" tab opens, by the DAG's kind (`<app_id>_<kind>`)
DAG_SECTIONS = {
    "deploy": "now",
    "health": "now",
    "txn_watch": "transactions",
    "checkpoint_rotation": "savepoints",
    "reconciliation": "proofs",
    "backfill": "proofs",
}
# Reading the console needs read access to the app instance's DAGs (its deploy DAG stands for all of them). The
# console shows the instance of Airflow's environment (ONCEFLOW_APP_ID).
authorized = requires_access_dag(method="GET", param_dag_id=names.dag_id(config.load().app_id, "deploy"))


def section_of(dag_id: str) -> str:
    """The console page a DAG's tab opens."""
    return next((v for k, v in DAG_SECTIONS.items() if dag_id.endswith(f"_{k}")), "now")


def settings() -> config.Settings:
    """The console's app: the settings Airflow's processes run with (ONCEFLOW_*), Kafka from the connection."""
    from onceflow.control import orchestration

    return orchestration.settings()


def create_app() -> FastAPI:
    app = FastAPI(
        title="onceflow console", dependencies=[Depends(authorized)], docs_url=None, redoc_url=None, openapi_url=None
    )
    state: dict[str, Any] = {}

    @app.middleware("http")
    async def headers(request: Request, call_next):
        """Every answer: no content sniffing, no referrer beyond the origin; JSON and files may not be framed or run
        as a page (the HTML pages and the Data Docs set their own policy)."""
        response = await call_next(request)
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "same-origin"
        response.headers.setdefault("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'")
        return response

    def html_page(section: str, request: Request) -> HTMLResponse:
        nonce = secrets.token_urlsafe(18)  # per response: a script the page did not send cannot know it
        body = page.render(section, request.scope.get("root_path", ""), ctx()[0].app_id, nonce)
        return HTMLResponse(body, headers={"Content-Security-Policy": page.csp(nonce), "Cache-Control": "no-store"})

    def ctx() -> tuple[config.Settings, readers.Cache]:
        s = settings()
        if state.get("app") != s.app_id:
            state.update(app=s.app_id, cache=readers.Cache(s))
        return s, state["cache"]

    @app.get("/", response_class=HTMLResponse)
    def index(request: Request) -> HTMLResponse:
        return html_page("now", request)

    @app.get("/dag/{dag_id}")
    def dag_tab(dag_id: str, request: Request) -> RedirectResponse:
        root = request.scope.get("root_path", "")
        return RedirectResponse(f"{root}/{section_of(dag_id)}", status_code=307)

    @app.get("/api/now")
    def now() -> dict[str, Any]:
        s, cache = ctx()
        return readers.section(cache, "now", s, lambda: readers.read_now(s))

    @app.get("/api/batches")
    def batches(
        size: int = Query(50, ge=1, le=500),
        before: int | None = Query(None, ge=0),
        batch_from: int | None = None,
        batch_to: int | None = None,
        min_txn_ms: float | None = None,
        with_dlq: bool = False,
        with_late: bool = False,
    ) -> dict[str, Any]:
        s, cache = ctx()
        filters = {
            "batch_from": batch_from,
            "batch_to": batch_to,
            "min_txn_ms": min_txn_ms,
            "with_dlq": with_dlq,
            "with_late": with_late,
        }
        key = f"batches:{size}:{before}:{sorted(filters.items())}"
        return readers.section(cache, key, s, lambda: readers.read_batches(s, size, before, filters))

    @app.get("/api/charts")
    def charts() -> dict[str, Any]:
        s, cache = ctx()
        return readers.section(cache, "charts", s, lambda: readers.read_charts(s))

    @app.get("/api/transactions")
    def transactions() -> dict[str, Any]:
        s, cache = ctx()
        return readers.section(cache, "transactions", s, lambda: readers.read_transactions(s))

    @app.get("/api/alerts")
    def alerts() -> dict[str, Any]:
        s, cache = ctx()
        return readers.section(cache, "alerts", s, lambda: readers.read_alerts(s))

    @app.get("/api/savepoints")
    def savepoint_list() -> dict[str, Any]:
        s, cache = ctx()
        return readers.section(cache, "savepoints", s, lambda: readers.read_savepoints(s), needs_kafka=False)

    @app.get("/api/proofs")
    def proofs() -> dict[str, Any]:
        s, cache = ctx()
        return readers.section(cache, "proofs", s, lambda: readers.read_proofs(s))

    @app.get("/api/backfills")
    def backfill_list() -> dict[str, Any]:
        s, cache = ctx()
        return readers.section(cache, "backfills", s, lambda: readers.read_backfills(s))

    @app.get("/data-docs/{rel:path}")
    def data_docs(rel: str) -> FileResponse:
        """The reconciliation's GX Data Docs site, served here (a file:// link does not open on another machine)."""
        root = readers.data_docs_root(ctx()[0]).resolve()
        target = (root / (rel or "index.html")).resolve()
        if not target.is_relative_to(root) or not target.is_file():
            raise HTTPException(404, "no such Data Docs page (has a reconciliation with the GX suite run yet?)")
        # GX's pages load scripts from public CDNs (unpinned): they run sandboxed, in an opaque origin that holds no
        # Airflow session and reaches none of Airflow's API; offline the pages still render (their tables are HTML)
        return FileResponse(target, headers={"Content-Security-Policy": DATA_DOCS_CSP})

    @app.get("/icon.svg")
    def icon() -> FileResponse:
        return FileResponse(ICON, media_type="image/svg+xml")

    @app.get("/{section}", response_class=HTMLResponse)
    def section_page(section: str, request: Request) -> HTMLResponse:
        if section not in SECTIONS:
            raise HTTPException(404, f"no console page {section!r}; pages: {', '.join(SECTIONS)}")
        return html_page(section, request)

    app.state.started_ms = clock.now_ms()
    return app


ICON = Path(__file__).with_name("icon.svg")
DATA_DOCS_CSP = "sandbox allow-scripts allow-popups; frame-ancestors 'self'"
