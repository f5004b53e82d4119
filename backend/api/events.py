"""The event streams (SSE): `GET /v1/sessions/{id}/events` and `GET /v1/events?project=`.

Each event is `id:` (its durable cursor), `event:` (its type,
`backend.store.stream.EVENT_TYPES`) and `data:` (one JSON object holding at
least `session_id`). A stream opens with a priming block: `retry:` and, when
the stream has a position already, its `id:` (so a client that saw no event
yet still reconnects from there). A comment (`: ping`) keeps an idle stream
alive every 15 s.

Where a stream starts: at `Last-Event-ID` (a reconnecting EventSource sends
it; it wins over the URL's `?after=`, which the first connection carried),
else at `?after=`; without either, a session's stream starts at the
session's first event and the project stream at the live end. A well-formed
cursor this store cannot resume from (pruned, or never its own) answers a
`reset` event first, saying why, then the stream from its fresh start: never
a silent one. A malformed cursor is a 400 before the stream starts.

A stream ends when the server drains (its client resumes on another replica)
or when its client reads too slowly (`backend.api.hub`: resumed from its cursor).
A client going away ends only its stream: turns run in the executors, never here.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Send
from starlette.types import Scope as StarletteScope

from backend.api.auth import Reader, context_of
from backend.api.errors import ApiError
from backend.api.hub import Hub, StreamClosed, hub_of
from backend.api.models import ERRORS, ID_PATTERN, ErrorBody
from backend.api.pinger import PING, Pinger, direct_writer
from backend.api.scope import require_session
from backend.core.errors import RemError
from backend.ops.tokens import Principal
from backend.store.stream import MAX_CURSOR_CHARS, ORIGIN, STREAMED_TYPES, Position, Scope, parse_cursor

log = logging.getLogger("rem.api.events")

RETRY_MS = 1000
MAX_PROJECT_CHARS = 256

router = APIRouter(tags=["events"], responses=ERRORS)

STREAM_DOC: dict[int | str, dict[str, Any]] = {
    200: {
        "description": (
            "A stream of server-sent events (text/event-stream): `id:` a durable cursor, `event:` one of "
            + ", ".join(f"`{t}`" for t in (*STREAMED_TYPES, "reset"))
            + ", `data:` one JSON object holding at least `session_id`."
        ),
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    },
    503: {
        "model": ErrorBody,
        "description": "The server is stopping, or the store does not answer: reconnect.",
    },
}
SessionId = Annotated[str, Path(pattern=ID_PATTERN, max_length=100, description="The session's id.")]
After = Annotated[
    str | None,
    Query(max_length=MAX_CURSOR_CHARS, description="Resume after this cursor (`0`: the oldest kept)."),
]
LastEventId = Annotated[
    str | None, Header(alias="Last-Event-ID", max_length=MAX_CURSOR_CHARS, include_in_schema=False)
]


class EventStreamResponse(StreamingResponse):
    """A streaming response that hands its connection to its stream's heartbeats (`pinger`)."""

    media_type = "text/event-stream"
    pinger: Pinger | None = None

    async def __call__(self, scope: StarletteScope, receive: Receive, send: Send) -> None:
        if self.pinger is not None:
            self.pinger.write = direct_writer(scope)
        await super().__call__(scope, receive, send)


def _priming(cursor: str | None) -> bytes:
    return f"retry: {RETRY_MS}\n{f'id: {cursor}' + chr(10) if cursor else ''}\n".encode()


def _reset(reason: str, cursor: str, fresh: str, session_id: str | None) -> bytes:
    data = {"session_id": session_id, "reason": reason, "cursor": cursor, "resumes_at": fresh or None}
    return f"id: {fresh}\nevent: reset\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def _frames(
    hub: Hub, scope: Scope, start: Position, head: bytes, pinger: Pinger
) -> AsyncIterator[bytes]:
    yield head
    try:
        async for frame in hub.follow(scope, start, pinger):
            yield PING if frame is None else frame.payload
    except StreamClosed as closed:
        log.debug("event stream closed (%s)", closed.reason)
    except RemError as exc:  # the store went away mid-stream: the client resumes from its cursor
        log.warning("event stream ended: %s", exc)


async def _stream(
    hub: Hub, scope: Scope, given: str | None, *, session_id: str | None = None
) -> EventStreamResponse:
    """The response for `scope` from cursor `given` (None: the stream's own start)."""
    cursor = parse_cursor(given) if given else None  # a malformed one: 400, nothing streamed
    try:
        await hub.start()
        reset = await hub.check_cursor(cursor) if cursor is not None else None
    except StreamClosed:
        raise ApiError(
            503, "draining", "this server is stopping; reconnect (another replica answers)"
        ) from None
    if cursor is not None and reset is None:
        start, head = cursor.position, _priming(given)
    elif session_id is not None:  # a session's stream starts at its first event
        start, head = ORIGIN, _priming(None)
    else:  # the project stream starts at the live end, named so a reconnect resumes there
        start, end_cursor = await hub.live_end()
        head = _priming(end_cursor)
    if reset is not None:
        fresh = "" if session_id is not None else end_cursor
        head = _priming(None) + _reset(reset, str(given), fresh, session_id)
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    pinger = Pinger()
    response = EventStreamResponse(_frames(hub, scope, start, head, pinger), headers=headers)
    response.pinger = pinger
    return response


@router.get(
    "/v1/sessions/{session_id}/events",
    response_class=EventStreamResponse,
    responses=STREAM_DOC,
    summary="Follow one session's durable changes as server-sent events (resumable).",
    openapi_extra={"x-rem-scope": "read"},
)
async def session_events(
    request: Request,
    session_id: SessionId,
    who: Reader,
    after: After = None,
    last_event_id: LastEventId = None,
) -> EventStreamResponse:
    await require_session(context_of(request), who, session_id)
    scope = Scope(session_id=session_id)
    return await _stream(hub_of(request.app), scope, last_event_id or after, session_id=session_id)


@router.get(
    "/v1/events",
    response_class=EventStreamResponse,
    responses=STREAM_DOC,
    summary="Follow a project's durable changes (every project the token reaches without one).",
    openapi_extra={"x-rem-scope": "read"},
)
async def project_events(
    request: Request,
    who: Reader,
    project: Annotated[
        str | None, Query(min_length=1, max_length=MAX_PROJECT_CHARS, description="Follow this project only.")
    ] = None,
    after: After = None,
    last_event_id: LastEventId = None,
) -> EventStreamResponse:
    scope = Scope(projects=_projects(who, project))
    return await _stream(hub_of(request.app), scope, last_event_id or after)


def _projects(who: Principal, project: str | None) -> frozenset[str] | None:
    """The projects a project stream follows: the one asked for if the token reaches it, else all it reaches."""
    if project is None:
        return who.projects
    if not who.reaches(project):
        raise ApiError(404, "not_found", f"no project {project[:200]!r} this token reaches")
    return frozenset({project})
