"""`rem mcp`: a Model Context Protocol server over stdio, on the official `mcp` SDK (MCPServer).

Tools (each a thin call into `backend.ops`, the same library the CLI uses):

* `recall(query, project, session, k, all_projects)`: ranked memory items;
* `get_session(session_id, limit)`: a session's transcript and state;
* `graph_neighbors(node, project, limit)`: the Dream graph around a node;
* `list_projects()`: projects with their session and turn counts;
* `add_memory(session_id, text, project)`: only with `--allow-writes`; admits
  an input through the normal path (`ops.send`: idempotent, journaled), so
  the executor answers it and the summarizer and Dream take it from there.

Read-only by default: the Context is read-only, so the library refuses any
write even if a tool tried one. stdout is the protocol; logs go to stderr.
A rem error comes back to the client as a tool error with its one line.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from backend import ops
from backend.core.errors import RemError
from backend.runtime.context import Context


async def answer(call: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    """A tool's result; a rem error becomes a tool error carrying its one line (not a traceback)."""
    try:
        return await call
    except RemError as exc:
        raise ToolError(f"rem: error: {exc}") from None


def build_server(ctx: Context, *, allow_writes: bool = False) -> MCPServer[None]:
    """The MCPServer with rem's tools bound to `ctx` (closed when the server stops)."""

    @asynccontextmanager
    async def lifespan(_: MCPServer[None]) -> AsyncIterator[None]:
        try:
            yield None
        finally:
            await ctx.close()

    server: MCPServer[None] = MCPServer(
        name="rem",
        instructions=(
            "rem's long-term memory of agent sessions: recall turns, session summaries and graph facts "
            "by meaning and by keyword, scoped by project."
            + (" add_memory admits a message into a session." if allow_writes else " Read-only.")
        ),
        lifespan=lifespan,
        log_level="WARNING",
    )

    @server.tool(description="Ranked memory items (turns, session summaries, graph facts) for a query.")
    async def recall(
        query: str,
        project: str | None = None,
        session: str | None = None,
        k: int = 10,
        all_projects: bool = False,
    ) -> dict[str, Any]:
        return await ops.recall(
            ctx, query, project=project, session_id=session, k=k, all_projects=all_projects
        )

    @server.tool(description="A session's transcript (newest `limit` messages), project and Dream state.")
    async def get_session(session_id: str, limit: int = 50) -> dict[str, Any]:
        return await answer(ops.show_session(ctx, session_id, limit=limit))

    @server.tool(description="The Dream graph around a node (id like entity:caroline, or a label).")
    async def graph_neighbors(node: str, project: str | None = None, limit: int = 25) -> dict[str, Any]:
        return await answer(ops.graph_neighbors(ctx, node, project=project, limit=limit))

    @server.tool(description="Every project with its session count, indexed turns and last activity.")
    async def list_projects() -> dict[str, Any]:
        return await answer(ops.list_projects(ctx))

    if allow_writes:

        @server.tool(description="Admit a message into a session (created on first use, in `project`).")
        async def add_memory(session_id: str, text: str, project: str | None = None) -> dict[str, Any]:
            return await answer(ops.send(ctx, session_id, text, project=project))

    return server


async def serve(ctx: Context, *, allow_writes: bool = False) -> None:
    """Serve MCP over stdio until the client closes it."""
    await build_server(ctx, allow_writes=allow_writes).run_stdio_async()
