"""`GET /v1/status` (`rem status --json`'s object, kept to the token's projects) and `POST /v1/recall`
(the items `rem recall --json` prints); the health probes and the protected-resource metadata."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Request

from backend import ops
from backend.api import scope
from backend.api.auth import METADATA_PATH, Caller, Reader, context_of
from backend.api.errors import ApiError
from backend.api.models import ERRORS, Health, RecallIn
from backend.memory.recall import KINDS
from backend.ops.tokens import SCOPES

router = APIRouter(prefix="/v1", tags=["status and memory"], responses=ERRORS)
health = APIRouter(tags=["health"])


@router.get(
    "/status",
    response_model=dict[str, Any],
    summary="`rem status --json`'s object; a token of named projects sees only their sessions' rows.",
    openapi_extra={"x-rem-scope": "read"},
)
async def status(request: Request, who: Reader) -> Any:
    # one snapshot at a time per server: under a burst of dashboards they queue here, not on the store
    lock: asyncio.Lock = request.app.state.status_lock
    async with lock:
        return await ops.status(context_of(request), projects=who.projects)


@router.post(
    "/recall",
    response_model=dict[str, Any],
    summary="Ranked memory items (turns, summaries, graph facts) for a query in one project or session.",
    openapi_extra={"x-rem-scope": "read"},
)
async def recall(request: Request, body: RecallIn, who: Reader) -> dict[str, Any]:
    with scope.one_answer(body.session_id or ""):
        return await ops.recall(
            context_of(request),
            body.query,
            project=body.project,
            session_id=body.session_id,
            k=body.k,
            all_projects=body.all_projects,
            kinds=tuple(body.kinds or KINDS),
            projects=who.projects,
        )


@health.get("/healthz", response_model=Health, summary="The process answers (no token; reads nothing).")
async def healthz() -> dict[str, Any]:
    return {"ok": True}


@health.get(
    "/readyz",
    response_model=Health,
    responses={k: ERRORS[k] for k in (401, 503)},
    summary="The state store answers and the server is not draining (any live token).",
)
async def readyz(request: Request, _who: Caller) -> dict[str, Any]:
    draining: asyncio.Event | None = getattr(request.app.state, "draining", None)
    if draining is not None and draining.is_set():
        raise ApiError(503, "draining", "this server is draining; use another replica")
    db = await context_of(request).db()
    await db.scalar("SELECT 1")
    return {"ok": True}


def resource_metadata(request: Request, path: str = "") -> dict[str, Any]:
    """The RFC 9728 document for the resource at `path` (the whole server when empty)."""
    base = str(request.base_url).rstrip("/")
    return {
        "resource": f"{base}/{path}" if path else base,
        # none: tokens come from `rem token create`, not from an authorization server
        "authorization_servers": [],
        "bearer_methods_supported": ["header"],
        "scopes_supported": list(SCOPES),
        "resource_name": "rem",
    }


@health.get(METADATA_PATH, summary="OAuth 2.0 protected-resource metadata (RFC 9728); no token.")
async def protected_resource(request: Request) -> dict[str, Any]:
    return resource_metadata(request)


@health.get(
    METADATA_PATH + "/{resource}",
    summary="The metadata of one resource path (RFC 9728 section 3.1): /mcp or /v1; no token.",
    responses={400: ERRORS[400]},
)
async def protected_resource_at(
    request: Request, resource: Annotated[Literal["mcp", "v1"], Path(description="The resource's path.")]
) -> dict[str, Any]:
    return resource_metadata(request, resource)
