"""One client session to one MCP server: its transport, its `ClientSession`, and the task that holds them.

The SDK's transports and `ClientSession` are anyio task groups, which must
be entered and left by one task: `run_session` is that task. It opens the
transport (`stdio_transport`, or the SDK's streamable HTTP client over rem's
bounded `httpx2` client), `initialize`s, lists the tools, marks the
`Connection` ready, and holds it until it is told to stop or its stdio server
is lost; calls from any other task use `Connection.session` meanwhile.
What ended it is kept on the `Connection` for the caller and for health: a
start that fails says what failed (no answer to `initialize`, a listing that
is not MCP or over the bound), never how the server then exited, since rem's
own teardown is what ends it. The session reads through a `SessionReader`
(`backend.tools.reader`: listings screened tool by tool, the server's log
notifications rate-limited by its `LogValve`).
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
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from backend.core import clock
from backend.tools.config import HttpServer, ServerConfig, StdioServer
from backend.tools.errors import ToolUnavailable
from backend.tools.health import ERROR_MAX, Limits, describe_error, leaf_error
from backend.tools.http import HttpState, bounded_client
from backend.tools.lines import OVERSIZE_KEY, oversize, unreadable, validation_line
from backend.tools.reader import SessionReader
from backend.tools.results import inert
from backend.tools.stdio import StdioState, stdio_transport
from backend.tools.valve import LogValve

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
    # the tools its listing held that the SDK cannot read, and why (`SessionReader` fills it)
    refused: list[tuple[str, str]] = field(default_factory=list)
    stdio: StdioState | None = None
    reader: SessionReader | None = None
    phase: str = "connect"  # what the start is doing: for the error when it fails
    http: HttpState = field(default_factory=HttpState)
    up: bool = False  # initialize and the first tools/list answered
    stale: bool = False  # the server said its tool list changed
    error: str | None = None
    task: asyncio.Task[None] | None = None
    valve: LogValve = field(init=False)  # what of its log notifications and stderr reaches rem's log

    def __post_init__(self) -> None:
        self.valve = LogValve(self.server)

    @property
    def lost(self) -> bool:
        """Its stdio server's process is gone (stdout closed or stdin broken)."""
        return self.stdio is not None and self.stdio.lost.is_set()

    @property
    def link_ended(self) -> bool:
        """The session stopped reading (the transport ended, or rem closed it), or its stdio server is gone."""
        return self.lost or (self.reader is not None and self.reader.closed)

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
            conn.reader = SessionReader(read, conn.valve, conn.refused)
            session = await stack.enter_async_context(
                ClientSession(
                    conn.reader,
                    write,
                    client_info=CLIENT_INFO,
                    message_handler=_on_message(conn),
                    logging_callback=_on_log(conn.server),
                )
            )
            conn.reader.session = session
            await _handshake(conn, session, limits)
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
        conn.valve.close()
        conn.ended.set()
        if conn.up and not conn.stop.is_set():
            on_death(conn)


async def _handshake(conn: Connection, session: ClientSession, limits: Limits) -> None:
    """`initialize` and the first listing, within the start timeout; a failure says which step and why."""
    try:
        with anyio.fail_after(limits.start_timeout_ms / 1000):
            conn.phase = "initialize"
            await session.initialize()
            conn.phase = "tools/list"
            conn.tools = await list_tools(conn)
    except Exception as exc:
        # said now, while the server still runs: rem's teardown is what ends it next (exit code 0),
        # unless it is already gone, in which case how it exited is the story
        if not conn.lost:
            conn.error = start_error(conn.phase, exc, limits.start_timeout_ms)
        raise


def start_error(phase: str, exc: BaseException, start_timeout_ms: int) -> str:
    """Why a start failed at `phase` (initialize, tools/list), in one inert line."""
    leaf = leaf_error(exc)
    if isinstance(leaf, TimeoutError):
        text = f"no answer to {phase} within {start_timeout_ms} ms (REM_TOOL_START_TIMEOUT_MS)"
    elif isinstance(leaf, ValidationError):
        text = f"its {phase} answer is not valid MCP ({validation_line(leaf)})"
    elif isinstance(leaf, MCPError):
        text = _start_answer_error(phase, leaf)
    else:
        text = f"{phase} failed: {describe_error(leaf, start_timeout_ms)}"
    text = inert(" ".join(text.split()))
    return text if len(text) <= ERROR_MAX else text[: ERROR_MAX - 3] + "..."


def _start_answer_error(phase: str, exc: MCPError) -> str:
    code, message, data = exc.error.code, exc.error.message or "", exc.error.data
    if oversize(code, message, data):
        size = data.get(OVERSIZE_KEY) if isinstance(data, dict) else None
        bound = f"{size} bytes" if isinstance(size, int) else "rem's message bound"
        return f"its {phase} answer was over {bound} (4x REM_TOOL_RESULT_MAX_BYTES); rem discarded it"
    why = unreadable(code, message, data)
    if why is not None:
        return f"its {phase} answer could not be read ({why})"
    return f"it answered {phase} with an error: {message[:200]} (MCP error {code})"


async def list_tools(conn: Connection) -> list[types.Tool]:
    """Every page of the server's tools/list (the tools it could not read are in `conn.refused`)."""
    assert conn.reader is not None
    session = conn.reader.session
    assert session is not None
    conn.refused.clear()
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
        conn.stdio = StdioState(name=config.name, valve=conn.valve)
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
        elif isinstance(message, Exception) and conn.valve.admit():
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
