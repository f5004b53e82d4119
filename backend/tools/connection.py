"""One client session to one MCP server: its transport, its `ClientSession`, and the task that holds them.

The SDK's transports and `ClientSession` are anyio task groups, which must
be entered and left by one task: `run_session` is that task. It opens the
transport (`stdio_transport`, or the SDK's streamable HTTP client over rem's
bounded `httpx2` client), `initialize`s, lists the tools, marks the
`Connection` ready, and holds it until it is told to stop or its stdio server
is lost; calls from any other task use `Connection.session` meanwhile.
What ended it is kept on the `Connection` for the caller and for health.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
from mcp.client.session import ClientSession, LoggingFnT, MessageHandlerFnT
from mcp.client.streamable_http import streamable_http_client

from backend.core import clock
from backend.tools.config import HttpServer, ServerConfig, StdioServer
from backend.tools.errors import ToolUnavailable
from backend.tools.health import Limits, describe_error
from backend.tools.http import HttpState, bounded_client
from backend.tools.results import inert
from backend.tools.stdio import StdioState, stdio_transport

log = logging.getLogger("rem.tools.servers")

CLIENT_INFO = types.Implementation(name="rem", version="0.1.0")
LIST_PAGES_MAX = 50


@dataclass(eq=False)
class Connection:
    """One client session to a server: starting, live, or ended (and why)."""

    server: str
    started_at: int = field(default_factory=clock.now_ms)
    stop: anyio.Event = field(default_factory=anyio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    ready: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    session: ClientSession | None = None
    tools: list[types.Tool] = field(default_factory=list)
    stdio: StdioState | None = None
    http: HttpState = field(default_factory=HttpState)
    up: bool = False  # initialize and the first tools/list answered
    stale: bool = False  # the server said its tool list changed
    error: str | None = None
    task: asyncio.Task[None] | None = None

    @property
    def lost(self) -> bool:
        """Its stdio server's process is gone (stdout closed or stdin broken)."""
        return self.stdio is not None and self.stdio.lost.is_set()

    @property
    def live(self) -> bool:
        return self.up and self.session is not None and not self.ended.is_set() and not self.lost

    def never_sent(self, key: str) -> bool:
        """The tools/call with this key provably never reached the server."""
        return key in self.http.unsent or (self.stdio is not None and key in self.stdio.unsent)

    def describe_end(self) -> str:
        if self.stdio is not None and self.lost:
            return self.stdio.exit_description()
        return self.error or "connection closed"

    async def close(self, wait_s: float) -> None:
        """Stop the session's task: cleanly within `wait_s`, else cancelled."""
        self.stop.set()
        task = self.task
        if task is None or task.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), wait_s)
        except BaseException:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def run_session(
    conn: Connection, config: ServerConfig, limits: Limits, on_death: Callable[[Connection], None]
) -> None:
    """The session's task: transport, session, initialize, tools/list; then wait for the end."""
    try:
        async with AsyncExitStack() as stack:
            read, write = await stack.enter_async_context(_transport(conn, config, limits))
            session = await stack.enter_async_context(
                ClientSession(
                    read,
                    write,
                    client_info=CLIENT_INFO,
                    message_handler=_on_message(conn),
                    logging_callback=_on_log(conn.server),
                )
            )
            with anyio.fail_after(limits.start_timeout_ms / 1000):
                await session.initialize()
                conn.tools = await list_tools(session)
            conn.session, conn.up = session, True
            conn.ready.set_result(None)
            await _first(conn.stop, conn.stdio.lost if conn.stdio is not None else None)
    except BaseException as exc:  # anything ends the session; the caller and health get one line
        if conn.error is None:
            conn.error = conn.describe_end() if conn.lost else describe_error(exc, limits.start_timeout_ms)
        if not conn.ready.done():
            conn.ready.set_exception(ToolUnavailable(conn.error))
            conn.ready.exception()  # retrieved: the starter reports it
        if isinstance(exc, asyncio.CancelledError):
            raise
    finally:
        conn.ended.set()
        if conn.up and not conn.stop.is_set():
            on_death(conn)


async def list_tools(session: ClientSession) -> list[types.Tool]:
    """Every page of the server's tools/list."""
    tools: list[types.Tool] = []
    cursor: str | None = None
    for _ in range(LIST_PAGES_MAX):
        page = await session.list_tools(
            params=types.PaginatedRequestParams(cursor=cursor) if cursor else None
        )
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


@asynccontextmanager
async def _transport(
    conn: Connection, config: ServerConfig, limits: Limits
) -> AsyncIterator[tuple[Any, Any]]:
    if isinstance(config, StdioServer):
        conn.stdio = StdioState(name=config.name)
        async with stdio_transport(config, conn.stdio, max_message_bytes=limits.message_max_bytes) as streams:
            yield streams
        return
    assert isinstance(config, HttpServer)
    async with bounded_client(config.headers, limits.message_max_bytes, conn.http) as client:
        async with streamable_http_client(
            config.url, http_client=client, max_sse_event_size=limits.message_max_bytes
        ) as streams:
            yield streams


def _on_message(conn: Connection) -> MessageHandlerFnT:
    async def handle(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            conn.stale = True
        elif isinstance(message, Exception):
            log.info("tool server %s: %s", conn.server, inert(str(message))[:300])
        await anyio.lowlevel.checkpoint()

    return handle


def _on_log(server: str) -> LoggingFnT:
    async def handle(params: types.LoggingMessageNotificationParams) -> None:
        log.info("tool server %s (%s): %s", server, params.level, inert(str(params.data))[:1000])

    return handle


async def _first(*events: anyio.Event | None) -> None:
    """Return when the first of `events` is set."""
    async with anyio.create_task_group() as tasks:

        async def wait(event: anyio.Event) -> None:
            await event.wait()
            tasks.cancel_scope.cancel()

        for event in events:
            if event is not None:
                tasks.start_soon(wait, event)
