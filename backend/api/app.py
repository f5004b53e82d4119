"""The ASGI app of `rem serve`: FastAPI over one `Context`, its routers, its errors, its bounds.

`create_app(ctx)` wires; the routes are in their own modules. OpenAPI 3.1 is
served at `/v1/openapi.json`; the interactive docs pages are off (they load
scripts from a CDN, and rem makes no network call at run time).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.types import ASGIApp, Receive, Scope, Send

from backend.api import (
    attach,
    errors,
    events,
    fast_admission,
    mcp_http,
    routes_inputs,
    routes_sessions,
    routes_status,
    routes_tool_calls,
)
from backend.api.bounds import BoundedBody
from backend.api.hub import Hub
from backend.api.stats import ApiStats, Metered
from backend.runtime.context import Context

API_VERSION = "1"
# how long a write group smaller than the last waits for its clients' writes on their way (measured
# with 32 clients: groups of ~31 instead of ~18, throughput ratio 0.35 -> 0.60 busy, HISTORY.md)
GROUP_FILL_S = 0.001
SUMMARY = "The application API of rem: sessions, inputs, events, tool-call decisions, recall."


class RemApi(FastAPI):
    """FastAPI with rem's own ASGI layers: admission's hot path (`fast_admission`) in front of all,
    which answers most admissions before any other layer costs them anything, then the meter
    (outermost of FastAPI's stack: a 413 is counted too), the body bound, then FastAPI's stack."""

    fast: fast_admission.FastAdmission | None = None  # set by `create_app`

    def build_middleware_stack(self) -> ASGIApp:
        return Metered(BoundedBody(super().build_middleware_stack()), stats=self.state.stats)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        fast = self.fast
        if fast is not None and scope["type"] == "http" and scope["method"] == "POST":
            path = fast_admission.PATH.fullmatch(scope["path"])
            if path is not None:
                await fast(path[1], scope, receive, send, super().__call__)
                return
        await super().__call__(scope, receive, send)


def create_app(ctx: Context, *, version: str = "0") -> FastAPI:
    """The API over `ctx` (its store opened on startup, kept open for the process)."""

    mcp = mcp_http.mount(ctx)  # bodies kept to the app's bound before they reach it

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        (await ctx.db()).group_fill_s = GROUP_FILL_S
        try:
            async with mcp.run():
                yield
        finally:
            await hub.close()

    app = RemApi(
        title="rem",
        version=version,
        summary=SUMMARY,
        openapi_url="/v1/openapi.json",
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
        # rem counts its own requests (`stats.Metered`) and sends nothing anywhere; FastAPI's
        # OpenTelemetry hooks otherwise look for a configured provider on every request
        telemetry={"tracing": False, "metrics": False, "logs": False, "auto_configure": False},
    )
    app.state.ctx = ctx
    app.state.stats = ApiStats()
    app.fast = fast_admission.FastAdmission(ctx, app.state.stats)
    app.state.status_lock = asyncio.Lock()
    # the server's one listener on the journal: event streams and input waits subscribe to it. Its
    # reader is a connection beside the store's, within REM_DB_MAX_CONNECTIONS (its LISTEN is the one
    # every process has room for)
    app.state.hub = hub = Hub(ctx)
    ctx.spare_connections = max(ctx.spare_connections, 1)
    errors.install(app)
    for router in (
        routes_inputs.router,
        routes_sessions.router,
        routes_tool_calls.router,
        routes_status.router,
        routes_status.health,
        events.router,
        attach.router,
    ):
        app.include_router(router)
    app.router.routes.append(mcp.route)  # a plain route: MCP is no part of the OpenAPI document
    app.openapi = lambda: openapi_document(app)  # type: ignore[method-assign]
    return app


def openapi_document(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document, without FastAPI's 422 (every invalid request is a 400 in the one shape)."""
    if app.openapi_schema is None:
        document = get_openapi(
            title=app.title,
            version=app.version,
            summary=app.summary,
            routes=app.routes,
            openapi_version="3.1.0",
        )
        for item in document.get("paths", {}).values():
            for operation in item.values():
                operation.get("responses", {}).pop("422", None)
        schemas = document.get("components", {}).get("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
        app.openapi_schema = document
    return app.openapi_schema


def streams_open(app: FastAPI) -> int:
    """How many event streams the server holds open: serve-streams' hub says (`open_streams`), 0 without one."""
    hub = getattr(app.state, "hub", None)
    return int(getattr(hub, "open_streams", 0) or 0)
