"""Sessions: a page of them, one session's state, a page of its transcript (`backend.ops.session_views`).

Each is kept to the token's projects inside its query: another project's session answers the
404 a missing one does, word for word. A `project` filter the token does not reach is a 403
(it says nothing of that project: the same answer whether it exists or not).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, Response

from backend import ops
from backend.api import scope
from backend.api.auth import Reader, context_of
from backend.api.models import ERRORS, ID_PATTERN, MessagesPage, SessionsPage, SessionState
from backend.core.errors import OutOfReach
from backend.ops.paging import MAX_CURSOR_CHARS
from backend.ops.session_views import DEFAULT_PAGE, MAX_PAGE

router = APIRouter(prefix="/v1", tags=["sessions"], responses=ERRORS)

SessionId = Annotated[str, Path(pattern=ID_PATTERN, max_length=100, description="The session's id.")]
Limit = Annotated[int, Query(ge=1, le=MAX_PAGE, description="Items per page.")]


@router.get(
    "/sessions",
    response_model=SessionsPage,
    summary="The sessions the token reaches, newest first, a page at a time.",
    openapi_extra={"x-rem-scope": "read"},
)
async def list_sessions(
    request: Request,
    response: Response,
    who: Reader,
    project: Annotated[
        str | None, Query(pattern=ID_PATTERN, max_length=100, description="Only this project's.")
    ] = None,
    cursor: Annotated[
        str | None, Query(max_length=MAX_CURSOR_CHARS, description="`next_cursor` of the previous page.")
    ] = None,
    limit: Limit = DEFAULT_PAGE,
) -> dict[str, Any]:
    if project is not None and not who.reaches(project):
        raise OutOfReach(f"token {who.name!r} does not reach project {project!r}; list without `project`")
    page = await ops.sessions_page(
        context_of(request), project=project, cursor=cursor, limit=limit, projects=who.projects
    )
    if page["next_cursor"]:
        following = request.url.include_query_params(cursor=page["next_cursor"])
        response.headers["Link"] = f'<{following.path}?{following.query}>; rel="next"'
    return page


@router.get(
    "/sessions/{session_id}",
    response_model=SessionState,
    summary="One session: idle, queued, running or held (and why), its usage and counts.",
    openapi_extra={"x-rem-scope": "read"},
)
async def get_session(request: Request, session_id: SessionId, who: Reader) -> dict[str, Any]:
    with scope.one_answer(session_id):
        return await ops.session_state(context_of(request), session_id, projects=who.projects)


@router.get(
    "/sessions/{session_id}/messages",
    response_model=MessagesPage,
    summary="The session's transcript with its streamed parts, in order, a page at a time.",
    openapi_extra={"x-rem-scope": "read"},
)
async def list_messages(
    request: Request,
    response: Response,
    session_id: SessionId,
    who: Reader,
    after: Annotated[
        int, Query(ge=0, le=2**62, description="The seq of the last message read (0: from the start).")
    ] = 0,
    limit: Limit = DEFAULT_PAGE,
) -> dict[str, Any]:
    with scope.one_answer(session_id):
        page = await ops.messages_page(
            context_of(request), session_id, after=after, limit=limit, projects=who.projects
        )
    if page["next_after"] is not None:
        following = request.url.include_query_params(after=page["next_after"])
        response.headers["Link"] = f'<{following.path}?{following.query}>; rel="next"'
    return page
