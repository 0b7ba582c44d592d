"""The operator console: a FastAPI app that Airflow mounts (plugins/onceflow_console.py), behind Airflow's own
authentication and authorization.

A FastAPI app mounted by an Airflow 3 plugin inherits none of the API server's dependencies: every route would be
open to anonymous callers. So the whole app depends on Airflow's `requires_access_dag` for the onceflow DAGs:
whoever may read an app instance's deploy DAG (`<app_id>_deploy`) may read that instance's pages; anonymous callers
get 401, users without that right 403, an app id this control plane does not run 404.

Every page and endpoint answers for the environment's own instance (ONCEFLOW_APP_ID) at the root, and for each
instance of the control plane (ONCEFLOW_APPS) under `/app/<app_id>/`; each page has an app selector.
Actions (take, verify or restore a savepoint, start a backfill) are not routes of this app: the page triggers the
deploy, rotation and backfill DAGs through Airflow's REST API as the logged-in operator, so Airflow records who did
what and checks the DAG's own permissions.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
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
APP_PREFIX = "/app/{app_id}"  # an instance's pages and endpoints; the root's are the environment's own instance


def instances() -> dict[str, str]:
    """The app instances of this control plane, app id -> app (ONCEFLOW_APPS), the environment's own first."""
    from onceflow.control import orchestration

    own = config.load()
    found = orchestration.instances()
    return {own.app_id: found.get(own.app_id, own.app)} | found


def app_of(request: Request) -> str:
    """The app instance a request is for: its `/app/<app_id>/` prefix, else the environment's own instance; 404 for
    an instance this control plane does not run."""
    app_id = request.path_params.get("app_id") or config.load().app_id
    known = instances()
    if app_id not in known:
        raise HTTPException(404, f"no app instance {app_id!r} here; instances: {', '.join(known)}")
    return app_id


def authorized(request: Request, user: GetUserDep) -> None:
    """Reading an instance's pages needs read access to its DAGs (its deploy DAG stands for all of them), checked
    by Airflow's own dependency once the caller is known (anonymous: 401, before anything else is said)."""
    app_id = app_of(request)
    requires_access_dag(method="GET", param_dag_id=names.dag_id(app_id, "deploy"))(request, user)


def section_of(dag_id: str) -> str:
    """The console page a DAG's tab opens."""
    return next((v for k, v in DAG_SECTIONS.items() if dag_id.endswith(f"_{k}")), "now")


def settings(app_id: str | None = None) -> config.Settings:
    """Instance `app_id`'s settings (None: the environment's own) as Airflow's processes run it (ONCEFLOW_*), Kafka
    from the connection."""
    from onceflow.control import orchestration

    return orchestration.settings(app_id=app_id)


def create_app() -> FastAPI:
    app = FastAPI(
        title="onceflow console", dependencies=[Depends(authorized)], docs_url=None, redoc_url=None, openapi_url=None
    )
    caches: dict[str, readers.Cache] = {}  # per app instance

    @app.middleware("http")
    async def headers(request: Request, call_next):
        """Every answer: no content sniffing, no referrer beyond the origin; JSON and files may not be framed or run
        as a page (the HTML pages and the Data Docs set their own policy)."""
        response = await call_next(request)
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "same-origin"
        response.headers.setdefault("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'")
        return response

    def ctx(request: Request) -> tuple[config.Settings, readers.Cache]:
        own = config.load().app_id
        app_id = app_of(request)
        s = settings(None if app_id == own else app_id)
        cache = caches.get(s.app_id)
        if cache is None:
            cache = caches[s.app_id] = readers.Cache(s)
        return s, cache

    def home(request: Request, app_id: str) -> str:
        """Where instance `app_id`'s pages are: the root for the environment's own instance."""
        root = request.scope.get("root_path", "")
        return root if app_id == config.load().app_id else f"{root}/app/{app_id}"

    def html_page(section: str, request: Request) -> HTMLResponse:
        nonce = secrets.token_urlsafe(18)  # per response: a script the page did not send cannot know it
        app_id = ctx(request)[0].app_id
        apps = [(a, name, f"{home(request, a)}/{section}") for a, name in instances().items()]
        body = page.render(section, home(request, app_id), app_id, nonce, apps)
        return HTMLResponse(body, headers={"Content-Security-Policy": page.csp(nonce), "Cache-Control": "no-store"})

    r = routes(ctx, html_page)  # served at the root (the environment's own instance) and under APP_PREFIX

    @app.get("/dag/{dag_id}")
    def dag_tab(dag_id: str, request: Request) -> RedirectResponse:
        """A DAG's "onceflow" tab: the page of that DAG's instance and kind (`<app_id>_<kind>`)."""
        owner = next(
            (a for a in sorted(instances(), key=len, reverse=True) if dag_id.startswith(f"{a}_")),
            config.load().app_id,
        )
        return RedirectResponse(f"{home(request, owner)}/{section_of(dag_id)}", status_code=307)

    app.include_router(r)
    app.include_router(r, prefix=APP_PREFIX)
    app.state.started_ms = clock.now_ms()
    return app


def routes(
    ctx: Callable[[Request], tuple[config.Settings, readers.Cache]], html_page: Callable[[str, Request], HTMLResponse]
) -> APIRouter:
    """The pages and endpoints of one app instance: `ctx` gives a request's instance settings and cache, `html_page`
    renders a section's page for it."""
    r = APIRouter()

    @r.get("/", response_class=HTMLResponse)
    def index(request: Request) -> HTMLResponse:
        return html_page("now", request)

    @r.get("/api/now")
    def now(request: Request) -> dict[str, Any]:
        s, cache = ctx(request)
        return readers.section(cache, "now", s, lambda: readers.read_now(s))

    @r.get("/api/batches")
    def batches(
        request: Request,
        size: int = Query(50, ge=1, le=500),
        before: int | None = Query(None, ge=0),
        batch_from: int | None = None,
        batch_to: int | None = None,
        min_txn_ms: float | None = None,
        with_dlq: bool = False,
        with_late: bool = False,
    ) -> dict[str, Any]:
        s, cache = ctx(request)
        filters = {
            "batch_from": batch_from,
            "batch_to": batch_to,
            "min_txn_ms": min_txn_ms,
            "with_dlq": with_dlq,
            "with_late": with_late,
        }
        key = f"batches:{size}:{before}:{sorted(filters.items())}"
        return readers.section(cache, key, s, lambda: readers.read_batches(s, size, before, filters))

    @r.get("/api/charts")
    def charts(request: Request) -> dict[str, Any]:
        s, cache = ctx(request)
        return readers.section(cache, "charts", s, lambda: readers.read_charts(s))

    @r.get("/api/transactions")
    def transactions(request: Request) -> dict[str, Any]:
        s, cache = ctx(request)
        return readers.section(cache, "transactions", s, lambda: readers.read_transactions(s))

    @r.get("/api/alerts")
    def alerts(request: Request) -> dict[str, Any]:
        s, cache = ctx(request)
        return readers.section(cache, "alerts", s, lambda: readers.read_alerts(s))

    @r.get("/api/savepoints")
    def savepoint_list(request: Request) -> dict[str, Any]:
        s, cache = ctx(request)
        return readers.section(cache, "savepoints", s, lambda: readers.read_savepoints(s), needs_kafka=False)

    @r.get("/api/proofs")
    def proofs(request: Request) -> dict[str, Any]:
        s, cache = ctx(request)
        return readers.section(cache, "proofs", s, lambda: readers.read_proofs(s))

    @r.get("/api/backfills")
    def backfill_list(request: Request) -> dict[str, Any]:
        s, cache = ctx(request)
        return readers.section(cache, "backfills", s, lambda: readers.read_backfills(s))

    @r.get("/data-docs/{rel:path}")
    def data_docs(rel: str, request: Request) -> FileResponse:
        """The reconciliation's GX Data Docs site, served here (a file:// link does not open on another machine)."""
        root = readers.data_docs_root(ctx(request)[0]).resolve()
        target = (root / (rel or "index.html")).resolve()
        if not target.is_relative_to(root) or not target.is_file():
            raise HTTPException(404, "no such Data Docs page (has a reconciliation with the GX suite run yet?)")
        # GX's pages load scripts from public CDNs (unpinned): they run sandboxed, in an opaque origin that holds no
        # Airflow session and reaches none of Airflow's API; offline the pages still render (their tables are HTML)
        return FileResponse(target, headers={"Content-Security-Policy": DATA_DOCS_CSP})

    @r.get("/icon.svg")
    def icon() -> FileResponse:
        return FileResponse(ICON, media_type="image/svg+xml")

    @r.get("/{section}", response_class=HTMLResponse)
    def section_page(section: str, request: Request) -> HTMLResponse:
        if section not in SECTIONS:
            raise HTTPException(404, f"no console page {section!r}; pages: {', '.join(SECTIONS)}")
        return html_page(section, request)

    return r


ICON = Path(__file__).with_name("icon.svg")
DATA_DOCS_CSP = "sandbox allow-scripts allow-popups; frame-ancestors 'self'"
