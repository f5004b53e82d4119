"""`rem mcp`: a Model Context Protocol server over stdio, on the official `mcp` SDK (MCPServer).

Tools (each a thin call into `backend.ops`, the same library the CLI uses):

* `recall(query, project, session, k, all_projects)`: ranked memory items;
* `get_session(session_id, limit)`: a session's transcript and state;
* `graph_neighbors(node, project, limit)`: the Dream graph around a node;
* `list_projects()`: projects with their session and turn counts;
* `add_memory(text, session_id, project)`: only with `--allow-writes`; admits
  an input through the normal path (`ops.send`: idempotent, journaled), so
  the executor answers it and the summarizer and Dream take it from there.
  Without `session_id` it starts a new session (an id rem makes) in `project`;
  on a server kept to projects, a `session_id` must name one of their sessions,
  and another project's answers exactly as a missing one does (a client that
  could start a session under any id it chose would learn which ids exist);
* `list_tool_calls_waiting`, `approve_tool_call`, `deny_tool_call`,
  `resolve_tool_call`: only with `--allow-writes --allow-decisions`, the
  operator's decisions on agent tool calls (`backend.programs.mcp_decisions`
  says why they need a flag of their own).

Scope: the server serves the projects it was started with (`--project`,
repeatable) or, only when asked in so many words, all of them
(`--all-projects`). Every tool keeps to that scope (`backend.programs.mcp_scope`):
a project outside it is refused, and a session, graph node or tool call
outside it is not found (the client learns nothing about it). What the server
journals names it: its actor is `rem mcp (OPERATOR)` (`mcp_operator`).

Read-only by default: the Context is read-only, so the library refuses any
write even if a tool tried one. stdout is the protocol; logs go to stderr.
Every request is answered: a failing tool returns one line of text
(`rem: error: ...`), with its traceback on stderr only under `--debug`; a
request the SDK could not read (not JSON, invalid UTF-8, a lone surrogate,
over `MAX_REQUEST_BYTES`, nested over `MAX_DEPTH` levels) is refused by `backend.programs.mcp_stdio` with a
one-line JSON-RPC error carrying its id.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field, ValidationError

from backend import ops
from backend.core.errors import BadInput, RemError
from backend.memory.warm import warm_recall
from backend.programs.mcp_decisions import add_decision_tools
from backend.programs.mcp_scope import Bound, Scope
from backend.programs.mcp_stdio import one_line, serve_stdio
from backend.runtime.context import Context
from backend.store.events import operator_name

log = logging.getLogger("rem.mcp")


async def answer(call: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    """A tool's result; a rem error becomes a tool error carrying its one line (not a traceback)."""
    try:
        return await call
    except RemError as exc:
        raise ToolError(one_line(f"rem: error: {exc}")) from None


class RemMCPServer(MCPServer[None]):
    """MCPServer whose tool failures all reach the client as one line of text."""

    debug = False

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            raise ToolError(self._one_line(name, exc)) from None

    def _one_line(self, name: str, exc: ToolError) -> str:
        cause = exc.__cause__
        if isinstance(cause, ValidationError):
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in cause.errors(include_url=False)
            )
            return one_line(f"rem: error: bad arguments for {name}: {problems}")
        if isinstance(cause, ToolError):  # the SDK wraps a tool's own ToolError: its cause is the line
            text = str(cause)
        elif isinstance(cause, RemError):
            text = f"rem: error: {cause}"
        elif cause is None:  # the SDK's own (an unknown tool, say)
            text = str(exc)
        else:
            return self._unexpected(name, cause)
        return one_line(text if text.startswith("rem: error: ") else f"rem: error: {text}")

    def _unexpected(self, name: str, cause: BaseException) -> str:
        """A failure that is not rem's own: one line to the client, the traceback only under --debug."""
        if self.debug:
            log.error("tool %s failed", name, exc_info=cause)
        return one_line(f"rem: error: {name} failed: {type(cause).__name__}: {cause}")


def _instructions(scope: Scope, allow_writes: bool, allow_decisions: bool) -> str:
    """What the server tells its client it is for, and what it may do."""
    return (
        "rem's long-term memory of agent sessions: recall turns, session summaries and graph facts "
        f"by meaning and by keyword, scoped by project. This server serves {scope.describe()}."
        + (" add_memory admits a message into a session." if allow_writes else " Read-only.")
        + (
            " approve_tool_call, deny_tool_call and resolve_tool_call take the operator's decisions on "
            "the agent tool calls list_tool_calls_waiting lists."
            if allow_decisions
            else ""
        )
    )


def _closing(ctx: Context, scope: Scope) -> Callable[[MCPServer[None]], AbstractAsyncContextManager[None]]:
    """The server's lifespan: warms recall over `scope` before it answers, closes `ctx` when it stops."""

    @asynccontextmanager
    async def lifespan(_: MCPServer[None]) -> AsyncIterator[None]:
        try:
            # before the server answers `initialize`: the first query must not load the embedder
            await warm_recall(ctx, scope.projects)
            yield None
        finally:
            await ctx.close()

    return lifespan


def mcp_operator() -> str:
    """The actor `rem mcp` journals (its context's operator): `rem mcp (OPERATOR)`, OPERATOR as
    every command names it (`REM_OPERATOR`, else the OS user)."""
    return f"rem mcp ({operator_name()})"


def build_server(
    ctx: Context,
    *,
    allow_writes: bool = False,
    allow_decisions: bool = False,
    projects: Collection[str] | None = None,
    debug: bool = False,
) -> RemMCPServer:
    """The MCPServer with rem's tools bound to `ctx` and scoped to `projects` (None: every project);
    the decisions on tool calls only with both `allow_writes` and `allow_decisions`."""
    if allow_decisions and not allow_writes:
        raise BadInput(DECISIONS_NEED_WRITES)
    scope = Scope(None if projects is None else frozenset(projects))
    server = RemMCPServer(
        name="rem",
        instructions=_instructions(scope, allow_writes, allow_decisions),
        lifespan=_closing(ctx, scope),
        log_level="WARNING",
    )
    server.debug = debug
    add_tools(server, lambda: (ctx, scope), allow_writes=allow_writes, allow_decisions=allow_decisions)
    return server


def add_tools(server: RemMCPServer, bound: Bound, *, allow_writes: bool, allow_decisions: bool) -> None:
    """rem's tools on `server`, each call run on the context and scope `bound()` gives then (`rem mcp`:
    its own; `rem serve`'s /mcp: the request's token's, `backend.api.mcp_http`)."""
    _add_read_tools(server, bound)
    if allow_writes:
        _add_write_tools(server, bound)
    if allow_decisions:
        add_decision_tools(server, bound)


# the CLI refuses the flag alone before anything starts, in the same words
DECISIONS_NEED_WRITES = "--allow-decisions needs --allow-writes (a decision is a write): pass both"


# Every parameter described, and every tool annotated (MCP's ToolAnnotations), so a client shows
# more than bare names and can tell the read-only tools from the one that writes.
Query = Annotated[str, Field(description="What to look for, in plain words (a question or keywords).")]
Project = Annotated[
    str | None,
    Field(description="The project to search; may be left out when the server serves exactly one project."),
]
SessionId = Annotated[str, Field(description="A session's id, as recall items and get_session show it.")]
READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)


def _add_read_tools(server: RemMCPServer, bound: Bound) -> None:
    @server.tool(
        description="Ranked memory items (turns, session summaries, graph facts) for a query, each with its "
        "session, time, score and the retrievers that found it.",
        annotations=READ_ONLY.model_copy(update={"title": "Recall memory"}),
    )
    async def recall(
        query: Query,
        project: Project = None,
        session: Annotated[
            str | None,
            Field(description="Only this session's memory (a session id); its project is implied."),
        ] = None,
        k: Annotated[int, Field(description="How many items to return, 1 to 200.")] = 10,
        all_projects: Annotated[
            bool, Field(description="Search every project (only on a server started with --all-projects).")
        ] = False,
    ) -> dict[str, Any]:
        return await answer(_recall(*bound(), query, project, session, k, all_projects))

    @server.tool(
        description="A session's transcript (its newest `limit` messages), project and Dream state.",
        annotations=READ_ONLY.model_copy(update={"title": "Read a session"}),
    )
    async def get_session(
        session_id: SessionId,
        limit: Annotated[int, Field(description="How many of the newest messages to return.")] = 50,
    ) -> dict[str, Any]:
        return await answer(_get_session(*bound(), session_id, limit))

    @server.tool(
        description="The Dream memory graph around a node: its edges and the nodes they reach.",
        annotations=READ_ONLY.model_copy(update={"title": "Graph neighbours"}),
    )
    async def graph_neighbors(
        node: Annotated[
            str,
            Field(description="A node id such as entity:caroline or concept:payments, or a node's label."),
        ],
        project: Project = None,
        limit: Annotated[int, Field(description="How many edges to return at most, 1 to 500.")] = 25,
    ) -> dict[str, Any]:
        return await answer(_graph_neighbors(*bound(), node, project, limit))

    @server.tool(
        description="Every project served here with its session count, indexed turns and last activity.",
        annotations=READ_ONLY.model_copy(update={"title": "List projects"}),
    )
    async def list_projects() -> dict[str, Any]:
        ctx, scope = bound()
        return await answer(ops.list_projects(ctx, projects=scope.projects))


# add_memory only adds (nothing is overwritten or deleted); each call admits a new input
ADDS_ONLY = ToolAnnotations(
    title="Add to memory",
    read_only_hint=False,
    destructive_hint=False,
    idempotent_hint=False,
    open_world_hint=False,
)
SessionToAddTo = Annotated[
    str | None,
    Field(
        description="The session to add to; leave it out to start a new session in `project`, under an id "
        "rem makes (the result names it). On a server kept to projects (--project) it must be one of "
        "their sessions; with --all-projects a new id also starts a session."
    ),
]
MessageText = Annotated[str, Field(description="The message to admit, as a user turn of that session.")]
NewProject = Annotated[
    str | None, Field(description="The project of a new session (an existing session keeps its own).")
]


def _add_write_tools(server: RemMCPServer, bound: Bound) -> None:
    @server.tool(
        description="Admit a message into a session (or a new one, in `project`): an executor answers "
        "it, and the summarizer and Dream add it to memory. Only with rem mcp --allow-writes.",
        annotations=ADDS_ONLY,
    )
    async def add_memory(
        text: MessageText, session_id: SessionToAddTo = None, project: NewProject = None
    ) -> dict[str, Any]:
        return await answer(_add_memory(*bound(), session_id, text, project))


async def _recall(
    ctx: Context,
    scope: Scope,
    query: str,
    project: str | None,
    session: str | None,
    k: int,
    all_projects: bool,
) -> dict[str, Any]:
    if scope.projects is not None:
        if all_projects:
            raise BadInput(f"all_projects is refused: this server serves {scope.describe()}")
        if session is not None:
            await scope.session(ctx, session)
            if project is not None:
                scope.project(project)
        else:
            project = scope.project(project)
    return await ops.recall(ctx, query, project=project, session_id=session, k=k, all_projects=all_projects)


async def _graph_neighbors(
    ctx: Context, scope: Scope, node: str, project: str | None, limit: int
) -> dict[str, Any]:
    if project is not None:
        scope.project(project)
    return await ops.graph_neighbors(ctx, node, project=project, limit=limit, projects=scope.projects)


async def _get_session(ctx: Context, scope: Scope, session_id: str, limit: int) -> dict[str, Any]:
    await scope.session(ctx, session_id)
    return await ops.show_session(ctx, session_id, limit=limit)


async def _add_memory(
    ctx: Context, scope: Scope, session_id: str | None, text: str, project: str | None
) -> dict[str, Any]:
    if session_id is None:
        session_id = f"mcp-{uuid.uuid4().hex[:16]}"
        project = scope.project(project)
    elif scope.projects is not None:
        # a missing session and another project's answer alike, before anything else is looked at
        await scope.session(ctx, session_id, hint="; leave session_id out to start a new session")
        if project is not None:
            scope.project(project)  # a project outside the scope is refused, whatever the session
    return await ops.send(ctx, session_id, text, project=project)


async def serve(
    ctx: Context,
    *,
    allow_writes: bool = False,
    allow_decisions: bool = False,
    projects: Collection[str] | None = None,
    debug: bool = False,
) -> None:
    """Serve MCP over stdio until the client closes it."""
    server = build_server(
        ctx, allow_writes=allow_writes, allow_decisions=allow_decisions, projects=projects, debug=debug
    )
    lowlevel = server._lowlevel_server  # what MCPServer.run_stdio_async runs (mcp is pinned)
    await serve_stdio(lambda read, write: lowlevel.run(read, write, lowlevel.create_initialization_options()))
