"""`GET /v1/inputs/{input_id}?wait=SECONDS`: where an input stands, waiting (on the hub) for its answer.

200 with the reply once the input is answered, 202 while it is queued or
running. With `wait`, the request holds until the answer or the wait's end:
it subscribes to the session on the server's hub and looks again only when a
turn of that session completes, never on a timer. An input of a project the
token does not reach answers 404, exactly like one that does not exist.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from backend.api.auth import Reader, context_of
from backend.api.hub import Hub, StreamClosed, hub_of
from backend.api.models import ERRORS, ID_PATTERN
from backend.core.errors import NotFound
from backend.ops.inputs import input_status
from backend.ops.tokens import Principal
from backend.runtime.context import Context
from backend.store.stream import Scope

MAX_WAIT_S = 60.0
# the stream types after which an input's standing may have moved
MOVES = frozenset({"turn.completed"})

router = APIRouter(tags=["inputs"], responses=ERRORS)


class Reply(BaseModel):
    """The reply that answered an input: its message id and its text."""

    message_id: str | None
    text: str | None


class InputStatus(BaseModel):
    """Where an admitted input stands."""

    input_id: str
    session_id: str
    state: Literal["queued", "running", "answered"]
    reply: Reply | None


async def _status(ctx: Context, who: Principal, input_id: str) -> dict[str, Any]:
    status = await input_status(ctx, input_id, who.projects)
    if status is None:
        raise NotFound(f"no input {input_id[:200]!r}; an input id is the one its POST answered")
    return status


async def _wait(
    ctx: Context, hub: Hub, who: Principal, status: dict[str, Any], wait_s: float
) -> dict[str, Any]:
    """`status` once answered, or as it stands when `wait_s` runs out (woken by the session's turns)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    try:
        await hub.live_end()  # the hub reads from the live end, not from where it stopped while unfollowed
        while status["state"] != "answered" and loop.time() < deadline:
            status = await _wait_once(ctx, hub, who, status, deadline)
    except StreamClosed:  # the server stops: answer what is known
        pass
    return status


async def _wait_once(
    ctx: Context, hub: Hub, who: Principal, status: dict[str, Any], deadline: float
) -> dict[str, Any]:
    """One subscription's wait: until answered, the deadline, or the subscription closed as slow."""
    loop = asyncio.get_running_loop()
    sub = hub.subscribe(Scope(session_id=status["session_id"]))
    try:
        status = await _status(ctx, who, status["input_id"])  # subscribed first: no completion missed
        while status["state"] != "answered" and (left := deadline - loop.time()) > 0:
            frame = await sub.next(timeout=left)
            if frame is not None and frame.type in MOVES:
                status = await _status(ctx, who, status["input_id"])
    except StreamClosed as closed:
        if closed.reason != "slow":
            raise
        return await _status(ctx, who, status["input_id"])  # subscribe again, having looked
    finally:
        sub.close("gone")
    return status


@router.get(
    "/v1/inputs/{input_id}",
    response_model=InputStatus,
    responses={202: {"model": InputStatus, "description": "The input is queued or running."}},
    summary="Where an input stands; with `wait`, hold until it is answered (200) or the wait ends (202).",
    openapi_extra={"x-rem-scope": "read"},
)
async def get_input(
    request: Request,
    input_id: Annotated[str, Path(pattern=ID_PATTERN, max_length=100, description="The input's id.")],
    who: Reader,
    wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S, description="Seconds to wait for the answer.")] = 0,
) -> JSONResponse:
    ctx = context_of(request)
    status = await _status(ctx, who, input_id)
    if status["state"] != "answered" and wait > 0:
        status = await _wait(ctx, hub_of(request.app), who, status, wait)
    code = 200 if status["state"] == "answered" else 202
    return JSONResponse(InputStatus.model_validate(status).model_dump(mode="json"), status_code=code)
