"""MCP over Streamable HTTP at `/mcp`: `rem mcp`'s tools, kept per request to the token's projects and scopes.

The tools are `rem mcp`'s own (`backend.programs.mcp_server.add_tools`: one set of definitions), on
the official SDK's Streamable HTTP transport. What differs is who a call is for: here every request
carries a bearer token, and each tool call runs bound to it (`Bound`):

* its projects: the call's `Scope` is the token's, so another project's session, graph node or tool
  call is not found, as with `rem mcp --project`;
* its scopes: `tools/list` lists only the tools the token's scopes allow (`TOOL_SCOPES`: reads need
  `read`, `add_memory` needs `write`, the tool-call decisions and their list need `decide`), and a
  call of any other tool is refused in one line naming the scope it needs;
* its name: a write or a decision runs on a view of the server's context whose operator is the
  token's name (`auth.acting`), so the journal says which token did it.

Before the SDK sees a request, `McpEndpoint` checks its Host and Origin headers (DNS rebinding, as
the MCP specification requires of a server on loopback: a foreign Host gets 421, a foreign Origin
403) and then its token (401 with the RFC 9728 challenge). Both refusals come first and read
nothing of the body.

Stateless, JSON responses: each POST is one exchange, with no `Mcp-Session-Id` and no session held
by the server (so a GET, for a stream of server messages, and a DELETE, to end a session, answer
405). Any `rem serve` replica on the store answers any request: a client needs no affinity and
loses nothing when one dies, nothing per client stays in memory, and the tools, which only answer,
need no stream (none asks the client anything, as sampling or elicitation would, or sends progress).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from contextvars import ContextVar
from types import MappingProxyType
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, EmptyResult, GetPromptResult, InputRequiredResult, SetLevelRequestParams
from mcp.types import Tool as MCPTool
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Send
from starlette.types import Scope as AsgiScope

from backend.api.auth import acting, principal
from backend.api.errors import ApiError
from backend.core.settings import settings
from backend.ops.tokens import Principal
from backend.programs.mcp_scope import Scope
from backend.programs.mcp_server import RemMCPServer, add_tools
from backend.runtime.context import Context

PATH = "/mcp"
# the scope each tool needs; a tool missing here is neither listed nor served (a new tool of
# `rem mcp` must be given one: tests/api/test_mcp_http.py checks every tool has)
TOOL_SCOPES: Mapping[str, str] = MappingProxyType(
    {
        "recall": "read",
        "get_session": "read",
        "graph_neighbors": "read",
        "list_projects": "read",
        "add_memory": "write",
        "list_tool_calls_waiting": "decide",
        "approve_tool_call": "decide",
        "deny_tool_call": "decide",
        "resolve_tool_call": "decide",
    }
)
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
INSTRUCTIONS = (
    "rem's long-term memory of agent sessions: recall turns, session summaries and graph facts by meaning "
    "and by keyword, scoped by project. Each request is kept to its bearer token's projects and scopes: "
    "tools/list lists the tools they allow (read: recall, get_session, graph_neighbors, list_projects; "
    "write: add_memory; decide: the operator's decisions on agent tool calls)."
)

# the token of the request being served, set by `bind_principal` around each MCP request
_principal: ContextVar[Principal | None] = ContextVar("rem_mcp_principal", default=None)
# what the tool being called runs on, set by `HttpMCPServer.call_tool`
_calling: ContextVar[tuple[Context, Scope] | None] = ContextVar("rem_mcp_calling", default=None)


def bound() -> tuple[Context, Scope]:
    """The context and scope of the tool call in progress (`HttpMCPServer.call_tool` binds them)."""
    calling = _calling.get()
    if calling is None:  # never: a tool runs only through call_tool
        raise RuntimeError("a rem MCP tool ran outside a request's call")
    return calling


def current_principal() -> Principal:
    """The token of the MCP request being served (`McpEndpoint` authenticated it)."""
    who = _principal.get()
    if who is None:  # never: McpEndpoint refuses a request without a live token
        raise RuntimeError("an MCP request reached the server without a token")
    return who


async def bind_principal(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    """Server middleware: the request's token (on the HTTP request's state) bound for the handler."""
    request = ctx.request
    who = getattr(getattr(request, "state", None), "principal", None)
    token = _principal.set(who if isinstance(who, Principal) else None)
    try:
        return await call_next(ctx)
    finally:
        _principal.reset(token)


class HttpMCPServer(RemMCPServer):
    """`rem mcp`'s server, its tools listed and called as the request's token allows."""

    def __init__(self, ctx: Context) -> None:
        # no `subscriptions/listen`: nothing here changes to announce, and each would hold a stream open
        super().__init__(
            name="rem",
            instructions=INSTRUCTIONS,
            log_level="WARNING",
            middleware=[bind_principal],
            subscriptions=False,
        )
        # a client may set a log level (older ones do as they connect): accepted; rem sends no log
        # message at any level
        self._lowlevel_server.add_request_handler("logging/setLevel", SetLevelRequestParams, _accept_level)
        self.ctx = ctx

    async def list_tools(self) -> list[MCPTool]:
        who = current_principal()
        return [t for t in await super().list_tools() if _permits(who, t.name)]

    async def get_prompt(
        self, name: str, arguments: dict[str, Any] | None = None, context: Any = None
    ) -> GetPromptResult | InputRequiredResult:
        """rem offers no prompt: any name is an unknown one, -32602 as the specification says (the SDK
        answered code 0 and logged a traceback for each)."""
        raise MCPError(INVALID_PARAMS, f"unknown prompt {name[:100]!r}: rem offers tools only")

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        who = current_principal()
        needed = TOOL_SCOPES.get(name)
        if needed is None:
            raise ToolError(f"rem: error: unknown tool {name[:100]!r}; tools/list lists this token's tools")
        if not who.may(needed):
            raise ToolError(
                f"rem: error: token {who.name!r} lacks the {needed!r} scope {name} needs; "
                f"create one with `rem token create NAME --scope {needed}`"
            )
        # reads run on the server's context; a write or a decision journals the token's name
        ctx = self.ctx if needed == "read" else acting(self.ctx, who)
        calling = _calling.set((ctx, Scope(who.projects)))
        try:
            return await super().call_tool(name, arguments, context)
        finally:
            _calling.reset(calling)


async def _accept_level(_ctx: ServerRequestContext[Any, Any], _params: SetLevelRequestParams) -> EmptyResult:
    return EmptyResult()


def _permits(who: Principal, tool: str) -> bool:
    needed = TOOL_SCOPES.get(tool)
    return needed is not None and who.may(needed)


def transport_security(extra: tuple[str, ...] = ()) -> TransportSecuritySettings:
    """The Host and Origin values /mcp answers: loopback (any port) and the names in `extra`
    (`REM_SERVE_HOSTS`: a TLS proxy's public name, say)."""
    hosts: list[str] = []
    origins: list[str] = []
    for name in (*LOOPBACK, *extra):
        has_port = not name.endswith("]") and ":" in name
        hosts += [name] if has_port else [name, f"{name}:*"]
        for scheme in ("http", "https"):
            origins += [f"{scheme}://{name}"] if has_port else [f"{scheme}://{name}", f"{scheme}://{name}:*"]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
    )


class McpEndpoint:
    """The ASGI app at /mcp: Host and Origin checked, then the token, then the SDK's transport."""

    def __init__(self, manager: StreamableHTTPSessionManager, security: TransportSecuritySettings) -> None:
        self.manager = manager
        self.guard = TransportSecurityMiddleware(security)

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        await self._refuse_foreign(request)
        await principal(request)  # a 401 with the challenge unless a live token; kept on request.state
        if request.method != "POST":
            # stateless: no session to end (DELETE), and no stream a server message could come on (GET)
            raise ApiError(
                405,
                "method_not_allowed",
                f"{request.method[:16]} /mcp is not served: every MCP message is a POST, answered on its response",
                {"Allow": "POST"},
            )
        await self.manager.handle_request(scope, receive, send)

    async def _refuse_foreign(self, request: Request) -> None:
        """421 for a Host, 403 for an Origin that is not this server's (a DNS rebinding attempt)."""
        refused = await self.guard.validate_request(request, is_post=False)
        if refused is None:
            return
        if refused.status_code == 403:
            origin = request.headers.get("origin", "")[:100]
            raise ApiError(
                403,
                "forbidden_origin",
                f"Origin {origin!r} is not this server's (DNS rebinding protection); a client that is not a "
                "web page sends none",
            )
        host = request.headers.get("host", "")[:100]
        raise ApiError(
            421,
            "misdirected_request",
            f"Host {host!r} is not a name this server answers to (DNS rebinding protection); reach it by "
            "127.0.0.1, or list the name in REM_SERVE_HOSTS",
        )


@dataclasses.dataclass
class McpMount:
    """The /mcp route and the SDK session manager it needs running (`run` in the app's lifespan)."""

    route: Route
    manager: StreamableHTTPSessionManager

    def run(self) -> AbstractAsyncContextManager[None]:
        return self.manager.run()


def mount(ctx: Context) -> McpMount:
    """The /mcp endpoint over `ctx`: rem mcp's every tool, served as each request's token allows."""
    server = HttpMCPServer(ctx)
    add_tools(server, bound, allow_writes=True, allow_decisions=True)
    security = transport_security(settings.serve_hosts)
    manager = StreamableHTTPSessionManager(
        app=server._lowlevel_server,  # what MCPServer.streamable_http_app serves (mcp is pinned)
        stateless=True,
        json_response=True,
        security_settings=security,  # (McpEndpoint refuses first; the SDK checks again)
    )
    endpoint: ASGIApp = McpEndpoint(manager, security)
    return McpMount(Route(PATH, endpoint=endpoint), manager)
