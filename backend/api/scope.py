"""A token's reach inside a request: another project's session, input or call is a missing one.

Every by-id route asks `session_project` (one indexed read) and treats a
session outside the token's projects exactly as one that does not exist:
the same 404, the same message, so a token learns nothing about the rest.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from backend.core.errors import SessionNotFound
from backend.ops.tokens import Principal
from backend.runtime.context import Context


async def session_project(ctx: Context, session_id: str) -> str | None:
    """The project of `session_id`, or None when there is no such session."""
    db = await ctx.db()
    row = await db.fetchone("SELECT project FROM session WHERE id = ?", (session_id,))
    return None if row is None else str(row[0])


def not_found(session_id: str) -> SessionNotFound:
    """The one answer for a session that is missing or out of the token's reach."""
    return SessionNotFound(
        f"no session {session_id[:200]!r}; GET /v1/sessions lists the ones this token reaches"
    )


async def require_session(ctx: Context, who: Principal, session_id: str) -> str:
    """The session's project when `who` reaches it; else the 404 a missing session gets."""
    project = await session_project(ctx, session_id)
    if project is None or not who.reaches(project):
        raise not_found(session_id)
    return project


@contextmanager
def one_answer(session_id: str) -> Iterator[None]:
    """Any `SessionNotFound` the library raises for `session_id` (missing, or kept out by the token's
    projects) becomes the one answer a missing session gets here."""
    try:
        yield
    except SessionNotFound:
        raise not_found(session_id) from None
