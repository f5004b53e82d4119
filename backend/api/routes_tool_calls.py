"""Tool calls waiting for a person, and the decisions on them: the same `backend.ops` functions as
`rem approve|deny|resolve` and the console, with the same refusals.

A decision is journaled (hash-chained, `operator.approve|deny|resolve`) with the token's name as
its operator; a refusal too (`operator.refused`). A call in another state than the decision
needs is a 409 `wrong_state` whose `error.state` is the state it is in; another project's call
is the 404 an unknown id gets.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request

from backend import ops
from backend.api.auth import Decider, Reader, acting, context_of
from backend.api.errors import ApiError
from backend.api.models import ERRORS, Decision, DenyIn, ErrorBody, ResolveIn, ToolCallsPage
from backend.ops.results import ToolDecision
from backend.ops.tool_decisions import ToolCallNotFound, WrongState, resolution_text

router = APIRouter(prefix="/v1", tags=["tool calls"], responses=ERRORS)

CallId = Annotated[
    str, Path(min_length=1, max_length=200, description="The call's id (`call_id` in GET /v1/tool-calls).")
]
CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorBody, "description": "wrong_state: the call is not in the state this needs."}
}


@router.get(
    "/tool-calls",
    response_model=ToolCallsPage,
    summary="Tool calls waiting for a person (oldest first): approvals asked for, unknown outcomes.",
    openapi_extra={"x-rem-scope": "read"},
)
async def list_tool_calls(
    request: Request,
    who: Reader,
    state: Annotated[
        Literal["awaiting_approval", "unknown"] | None, Query(description="Only calls in this state.")
    ] = None,
) -> dict[str, Any]:
    waiting = await ops.tool_calls_waiting(context_of(request), projects=who.projects)
    calls = [*waiting["awaiting_approval"], *waiting["unknown_outcome"]]
    calls.sort(key=lambda c: (c["since"], c["call_id"]))
    return {"tool_calls": [c for c in calls if state is None or c["state"] == state]}


async def _decided(call_id: str, decide: Callable[[], Awaitable[ToolDecision]]) -> dict[str, Any]:
    """A decision's record; its refusals in the API's words."""
    try:
        return {**await decide()}
    except WrongState as exc:
        raise ApiError(409, "wrong_state", str(exc), extra={"state": exc.state}) from None
    except ToolCallNotFound:
        raise ApiError(
            404, "not_found", f"no tool call {call_id[:200]!r}; GET /v1/tool-calls lists the calls waiting"
        ) from None


@router.post(
    "/tool-calls/{call_id}/approve",
    response_model=Decision,
    responses=CONFLICT,
    summary="Approve a call awaiting approval: it runs once, with its idempotency key.",
    openapi_extra={"x-rem-scope": "decide"},
)
async def approve(request: Request, call_id: CallId, who: Decider) -> dict[str, Any]:
    ctx = acting(context_of(request), who)
    return await _decided(call_id, lambda: ops.approve(ctx, call_id, projects=who.projects))


@router.post(
    "/tool-calls/{call_id}/deny",
    response_model=Decision,
    responses=CONFLICT,
    summary="Deny a call awaiting approval: it never runs; the model is told (and why).",
    openapi_extra={"x-rem-scope": "decide"},
)
async def deny(request: Request, call_id: CallId, who: Decider, body: DenyIn | None = None) -> dict[str, Any]:
    ctx, reason = acting(context_of(request), who), body.reason if body else None
    return await _decided(call_id, lambda: ops.deny(ctx, call_id, reason, projects=who.projects))


@router.post(
    "/tool-calls/{call_id}/resolve",
    response_model=Decision,
    responses=CONFLICT,
    summary="Decide a call whose outcome is unknown: done (with its result), retry, or fail (with why).",
    openapi_extra={"x-rem-scope": "decide"},
)
async def resolve(request: Request, call_id: CallId, who: Decider, body: ResolveIn) -> dict[str, Any]:
    ctx = acting(context_of(request), who)
    text = resolution_text(body.outcome, body.result, body.reason)
    return await _decided(
        call_id, lambda: ops.resolve(ctx, call_id, body.outcome, text, projects=who.projects)
    )
