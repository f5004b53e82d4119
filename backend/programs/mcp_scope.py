"""What a `rem mcp` client may see: the projects it was started with (`--project`), or every one.

Every tool keeps to its server's `Scope`: a project outside it is refused,
and a session, graph node or tool call outside it is not found (the client
learns nothing about it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from backend.core.errors import BadInput, SessionNotFound
from backend.runtime.context import Context


@dataclass(frozen=True)
class Scope:
    """The projects a client may see: `projects`, or every one when it is None (`--all-projects`)."""

    projects: frozenset[str] | None

    def describe(self) -> str:
        return "every project" if self.projects is None else "project(s) " + ", ".join(sorted(self.projects))

    def project(self, project: str | None) -> str | None:
        """The project a call names, checked against the scope (None: the scope's only project, if one)."""
        if self.projects is None:
            return project
        if project is None:
            if len(self.projects) == 1:
                return next(iter(self.projects))
            raise BadInput(f"name a project: this server serves {self.describe()}")
        if project not in self.projects:
            raise BadInput(f"project {project!r} is not served here: this server serves {self.describe()}")
        return project

    async def session(self, ctx: Context, session_id: str, hint: str = "") -> None:
        """Refuse a session outside the scope in the words a missing one is refused in (`hint`: what
        to do, the same for both)."""
        if self.projects is None:
            return
        db = await ctx.db()
        owner = await db.scalar("SELECT project FROM session WHERE id = ?", (session_id,))
        if owner not in self.projects:
            raise SessionNotFound(f"no session {session_id!r} in {self.describe()}{hint}")


# what a tool call runs on: the context (its operator is the journal's actor) and the scope it is kept
# to; `rem mcp` binds its own for the process, `rem serve`'s /mcp the request's token's
Bound = Callable[[], tuple[Context, Scope]]
