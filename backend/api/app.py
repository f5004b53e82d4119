"""The ASGI app of `rem serve`: FastAPI over one `Context`, its routers, its errors, its bounds.

`create_app(ctx)` wires; the routes are in their own modules. OpenAPI 3.1 is
served at `/v1/openapi.json`; the interactive docs pages are off (they load
scripts from a CDN, and rem makes no network call at run time).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request

from backend.api import attach, errors, events, mcp_http
from backend.api.auth import Reader
from backend.api.hub import Hub
from backend.runtime.context import Context

# a request body's bound: an input's text is at most 256 KiB of UTF-8 (`sessions.MAX_TEXT_BYTES`), and
# JSON may spell a character in up to 6 bytes (`\uXXXX`); anything larger is refused before it is read
MAX_BODY_BYTES = 1536 * 1024
API_VERSION = "1"


def create_app(ctx: Context, *, version: str = "0") -> FastAPI:
    """The API over `ctx` (its store opened on startup, kept open for the process)."""

    mcp = mcp_http.mount(ctx)  # bodies kept to the app's bound before they reach it

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await ctx.db()
        try:
            async with mcp.run():
                yield
        finally:
            await hub.close()

    app = FastAPI(
        title="rem",
        version=version,
        summary="The application API of rem: sessions, inputs, events, tool-call decisions, recall.",
        openapi_url="/v1/openapi.json",
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
        max_body_size=MAX_BODY_BYTES,
    )
    app.state.ctx = ctx
    # the server's one listener on the journal: event streams and input waits subscribe to it
    app.state.hub = hub = Hub(ctx)
    errors.install(app)
    _health_routes(app)
    app.include_router(events.router)
    app.include_router(attach.router)
    app.router.routes.append(mcp.route)  # a plain route: MCP is no part of the OpenAPI document
    return app


def _health_routes(app: FastAPI) -> None:
    @app.get("/healthz", tags=["health"], summary="The process answers (no token, reads nothing).")
    async def healthz() -> dict[str, Any]:
        return {"ok": True}

    @app.get("/readyz", tags=["health"], summary="The state store answers.")
    async def readyz(request: Request, _who: Reader) -> dict[str, Any]:
        ctx: Context = request.app.state.ctx
        db = await ctx.db()
        await db.scalar("SELECT 1")
        return {"ok": True}
