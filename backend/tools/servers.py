"""One MCP server as a source of tools: its client session, kept alive, restarted with backoff, and its health.

Each process keeps one `McpServerSource` per configured server, with at most
one live `ClientSession` (the official SDK's) at a time:

* **started on first use** (a listing or a call), under a lock, so concurrent
  callers share one start; the start (spawn or connect, `initialize`,
  `tools/list`) is bounded by `REM_TOOL_START_TIMEOUT_MS`;
* the session runs in its own task (the SDK's task groups must be entered and
  left by one task); calls from any task share it (JSON-RPC ids multiplex them);
* **restarted when it dies**: the next use starts a new one. The first
  restart after a death is immediate; consecutive failures (failed starts, or
  deaths within `STABLE_MS` of the start) back off 0.5 s, 1 s, 2 s ... up to
  30 s, and a use during the backoff fails at once with `ToolUnavailable`
  saying when the next start is due. A successful call resets the count;
* **health** (`health()`): state (idle, starting, up, down, closed), the last
  error in one line (for a stdio server, how it exited and its last stderr
  line), since when, how many restarts, its pid, its tools and refused tools.
  It lives in this process's memory, like the model-call buffer, for the
  status snapshot to read.

A call sends the idempotency key as `_meta["rem/idempotency_key"]` and maps
every way it can end to a `ToolResult` or one error of `backend.tools.errors`,
keeping "never sent" (`ToolUnavailable`) apart from "sent, outcome unknown"
(`ToolConnectionLost`, `ToolTimeout`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from backend.core import clock
from backend.tools.config import HttpServer, ServerConfig, StdioServer
from backend.tools.errors import ToolConnectionLost, ToolTimeout, ToolUnavailable
from backend.tools.health import Limits, ServerHealth, ServerState, describe_error
from backend.tools.http import bounded_client
from backend.tools.lines import OVERSIZE_CODE, OVERSIZE_KEY
from backend.tools.results import ToolResult, bounded_result, call_result_text, inert
from backend.tools.stdio import KEY_META, StdioState, stdio_transport

log = logging.getLogger("rem.tools.servers")

CLIENT_INFO = types.Implementation(name="rem", version="0.1.0")
BACKOFF_BASE_MS = 500
BACKOFF_MAX_MS = 30_000
STABLE_MS = 10_000
STOP_WAIT_S = 8.0
SETTLE_S = 3.0
LIST_PAGES_MAX = 50
SESSION_GONE = (
    "Session terminated"  # the SDK's error for HTTP 404 on a known session: the request was refused
)


@dataclass(eq=False)
class _Connection:
    """One live (or starting, or ended) client session to the server."""

    stop: anyio.Event = field(default_factory=anyio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    ready: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    session: ClientSession | None = None
    tools: list[types.Tool] = field(default_factory=list)
    stdio: StdioState | None = None
    unsent: set[str] = field(default_factory=set)
    started_at: int = 0
    error: str | None = None
    stale: bool = False  # the server said its tool list changed
    up: bool = False  # it started: initialize and the first tools/list answered
    task: asyncio.Task[None] | None = None

    @property
    def live(self) -> bool:
        return self.session is not None and not self.ended.is_set() and not self.lost

    @property
    def lost(self) -> bool:
        return self.stdio is not None and self.stdio.lost.is_set()

    def never_sent(self, key: str) -> bool:
        return key in self.unsent or (self.stdio is not None and key in self.stdio.unsent)


class McpServerSource:
    """The tools of one configured MCP server, and the session that reaches them."""

    def __init__(self, config: ServerConfig, limits: Limits) -> None:
        self.name = config.name
        self.config = config
        self.limits = limits
        self.kind = "mcp"
        self._lock = asyncio.Lock()
        self._conn: _Connection | None = None
        self._tools: list[types.Tool] | None = None  # the last listing (kept while the server is down)
        self._state = ServerState.IDLE
        self._since = clock.now_ms()
        self._last_error: str | None = None
        self._starts = 0
        self._failures = 0
        self._retry_at: int | None = None
        self._closed = False

    # -- what the registry asks

    async def listing(self) -> list[types.Tool]:
        """The server's tools, starting it if needed (raises ToolUnavailable when it cannot be reached)."""
        conn = await self._connection()
        if conn.stale and conn.session is not None:
            conn.tools = await self._list(conn.session)
            self._tools, conn.stale = conn.tools, False
        return conn.tools

    def cached_listing(self) -> list[types.Tool] | None:
        return self._tools

    def health(self) -> ServerHealth:
        conn = self._conn
        state, since, error = self._state, self._since, self._last_error
        if (
            state == ServerState.UP and conn is not None and not conn.live
        ):  # it died; its task is winding down
            state, since, error = ServerState.DOWN, clock.now_ms(), self._describe_end(conn)
        return {
            "server": self.name,
            "transport": self.config.transport,
            "state": str(state),
            "since": since,
            "last_error": error,
            "restarts": max(0, self._starts - 1),
            "retry_at": self._retry_at if state == ServerState.DOWN else None,
            "pid": conn.stdio.pid if conn is not None and conn.stdio is not None and conn.live else None,
            "tools": None if self._tools is None else len(self._tools),
            "refused": [],
        }

    async def call(self, tool: str, arguments: dict[str, Any], key: str, timeout_ms: int) -> ToolResult:
        """Call `tool` once (once more only when an HTTP server refused an expired session)."""
        for attempt in (1, 2):
            conn = await self._connection()
            started = time.monotonic()
            try:
                return await self._call_on(conn, tool, arguments, key, timeout_ms, started)
            except _SessionGone:
                log.info("tool server %s no longer knows rem's session; starting a new one", self.name)
                await self._stop(conn)
                if attempt == 2:
                    raise ToolUnavailable(
                        f"tool server {self.name!r} refused rem's session twice", server=self.name
                    ) from None
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        self._closed = True
        if self._conn is not None:
            await self._stop(self._conn)
        self._set_state(ServerState.CLOSED)

    # -- the call

    async def _call_on(
        self,
        conn: _Connection,
        tool: str,
        arguments: dict[str, Any],
        key: str,
        timeout_ms: int,
        started: float,
    ) -> ToolResult:
        assert conn.session is not None
        try:
            result = await conn.session.call_tool(
                tool,
                arguments,
                read_timeout_seconds=timeout_ms / 1000,
                meta=cast(types.RequestParamsMeta, {KEY_META: key}),
            )
        except MCPError as exc:
            if exc.error.code == types.CONNECTION_CLOSED:
                await _settle(conn)
            return self._answer_error(conn, exc, key, timeout_ms, started)
        except (
            RuntimeError,
            ValueError,
        ) as exc:  # the SDK refused the answer (schema): the server did answer
            return self._result(f"rem refused the tool's answer: {exc}", True, started)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            await _settle(conn)
            raise self._lost(conn, key) from None
        self._failures = 0
        return self._result(call_result_text(result), bool(result.is_error), started)

    def _answer_error(
        self, conn: _Connection, exc: MCPError, key: str, timeout_ms: int, started: float
    ) -> ToolResult:
        code, message = exc.error.code, exc.error.message or ""
        data = exc.error.data
        if code == types.REQUEST_TIMEOUT:
            raise ToolTimeout(
                f"tool server {self.name!r} did not answer within {timeout_ms} ms (rem asked it to cancel)",
                timeout_ms=timeout_ms,
            ) from None
        oversize = (
            (code == OVERSIZE_CODE and isinstance(data, dict) and OVERSIZE_KEY in data)
            or OVERSIZE_KEY in message
            or (code == types.CONNECTION_CLOSED and "byte limit" in message)
        )
        if oversize:
            size = self.limits.message_max_bytes
            text = f"rem: the tool's answer was over {size} bytes and was discarded unread"
            return self._result(text, True, started, code=code)
        if code == types.CONNECTION_CLOSED:
            raise self._lost(conn, key) from None
        if code == types.INVALID_REQUEST and message == SESSION_GONE:
            raise _SessionGone()
        if code == types.INTERNAL_ERROR and message == "Server returned an error response":
            raise ToolConnectionLost(
                f"tool server {self.name!r} answered with an HTTP error status"
            ) from None
        return self._result(f"MCP error {code}: {message}", True, started, code=code)

    def _result(self, text: str, is_error: bool, started: float, *, code: int | None = None) -> ToolResult:
        return bounded_result(
            text,
            is_error=is_error,
            max_bytes=self.limits.result_max_bytes,
            duration_ms=(time.monotonic() - started) * 1000,
            error_code=code,
        )

    def _lost(self, conn: _Connection, key: str) -> ToolUnavailable | ToolConnectionLost:
        why = self._describe_end(conn)
        if conn.never_sent(key):
            return ToolUnavailable(
                f"tool server {self.name!r} is down ({why}); the call was not sent", server=self.name
            )
        return ToolConnectionLost(
            f"tool server {self.name!r} died during the call ({why}); its outcome is unknown"
        )

    # -- the session's life

    async def _connection(self) -> _Connection:
        conn = self._conn
        if conn is not None and conn.live:
            return conn
        async with self._lock:
            conn = self._conn
            if conn is not None and conn.live:
                return conn
            if conn is not None:
                await self._stop(conn)
            self._refuse_while_backing_off()
            return await self._start()

    def _refuse_while_backing_off(self) -> None:
        if self._closed:
            raise ToolUnavailable(f"tool server {self.name!r} is closed", server=self.name)
        now = clock.now_ms()
        if self._retry_at is not None and now < self._retry_at:
            wait = self._retry_at - now
            raise ToolUnavailable(
                f"tool server {self.name!r} is down ({self._last_error}); next start in {wait / 1000:.1f} s",
                server=self.name,
                retry_in_ms=wait,
            )

    async def _start(self) -> _Connection:
        conn = _Connection(started_at=clock.now_ms())
        self._conn = conn
        self._starts += 1
        self._set_state(ServerState.STARTING)
        conn.task = asyncio.create_task(self._run(conn), name=f"rem-tools-{self.name}")
        try:
            await asyncio.wait_for(asyncio.shield(conn.ready), self.limits.start_timeout_ms / 1000 + 5)
        except BaseException as exc:
            await self._stop(conn)
            why = conn.error or describe_error(exc, self.limits.start_timeout_ms)
            self._failed(f"cannot start: {why}")
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise ToolUnavailable(
                f"tool server {self.name!r} cannot start: {why}", server=self.name
            ) from None
        self._tools = conn.tools
        self._set_state(ServerState.UP)
        log.info("tool server %s is up (%d tools)", self.name, len(conn.tools))
        return conn

    async def _run(self, conn: _Connection) -> None:
        """The session's task: open the transport and session, list the tools, wait for the end."""
        try:
            async with AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport(conn))
                session = await stack.enter_async_context(
                    ClientSession(
                        read,
                        write,
                        client_info=CLIENT_INFO,
                        message_handler=self._on_message(conn),
                        logging_callback=self._on_log,
                    )
                )
                with anyio.fail_after(self.limits.start_timeout_ms / 1000):
                    await session.initialize()
                    conn.tools = await self._list(session)
                conn.session, conn.up = session, True
                conn.ready.set_result(None)
                await _first(conn.stop, conn.stdio.lost if conn.stdio is not None else None)
        except BaseException as exc:  # anything ends the session; the caller and health get one line
            conn.error = conn.error or self._describe_failure(conn, exc)
            if not conn.ready.done():
                conn.ready.set_exception(ToolUnavailable(conn.error))
                conn.ready.exception()  # retrieved here: _start reports it
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            conn.ended.set()
            if conn.up and not conn.stop.is_set():
                self._died(conn)

    @asynccontextmanager
    async def _transport(self, conn: _Connection) -> AsyncIterator[tuple[Any, Any]]:
        config = self.config
        if isinstance(config, StdioServer):
            conn.stdio = StdioState(name=self.name)
            async with stdio_transport(
                config, conn.stdio, max_message_bytes=self.limits.message_max_bytes
            ) as streams:
                yield streams
            return
        assert isinstance(config, HttpServer)
        async with bounded_client(config.headers, self.limits.message_max_bytes, conn.unsent) as client:
            async with streamable_http_client(
                config.url, http_client=client, max_sse_event_size=self.limits.message_max_bytes
            ) as streams:
                yield streams

    async def _list(self, session: ClientSession) -> list[types.Tool]:
        tools: list[types.Tool] = []
        cursor: str | None = None
        for _ in range(LIST_PAGES_MAX):
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await session.list_tools(params=params)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        return tools

    def _on_message(self, conn: _Connection) -> Any:
        async def handle(message: Any) -> None:
            if isinstance(message, types.ToolListChangedNotification):
                conn.stale = True
            elif isinstance(message, Exception):
                log.info("tool server %s: %s", self.name, inert(str(message))[:300])
            await anyio.lowlevel.checkpoint()

        return handle

    async def _on_log(self, params: types.LoggingMessageNotificationParams) -> None:
        log.info("tool server %s (%s): %s", self.name, params.level, inert(str(params.data))[:1000])

    async def _stop(self, conn: _Connection) -> None:
        conn.stop.set()
        task = conn.task
        if task is None or task.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), STOP_WAIT_S)
        except BaseException:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    # -- health bookkeeping

    def _describe_end(self, conn: _Connection) -> str:
        if conn.stdio is not None and conn.lost:
            return conn.stdio.exit_description()
        return conn.error or "connection closed"

    def _describe_failure(self, conn: _Connection, exc: BaseException) -> str:
        if conn.stdio is not None and conn.lost:
            return conn.stdio.exit_description()
        return describe_error(exc, self.limits.start_timeout_ms)

    def _died(self, conn: _Connection) -> None:
        lived = clock.now_ms() - conn.started_at
        if lived >= STABLE_MS:
            self._failures = 0
        why = self._describe_end(conn)
        self._failed(why)
        log.warning("tool server %s went down after %.1f s: %s", self.name, lived / 1000, why)

    def _failed(self, why: str) -> None:
        self._failures += 1
        delay = 0 if self._failures <= 1 else min(BACKOFF_BASE_MS * 2 ** (self._failures - 2), BACKOFF_MAX_MS)
        self._retry_at = clock.now_ms() + delay
        self._last_error = why
        self._set_state(ServerState.DOWN)

    def _set_state(self, state: ServerState) -> None:
        if state != self._state:
            self._state, self._since = state, clock.now_ms()


async def _settle(conn: _Connection) -> None:
    """Give a dying stdio server's task a moment to learn how it ended (its exit status) for the error."""
    if conn.lost:
        with suppress(TimeoutError):
            await asyncio.wait_for(conn.ended.wait(), SETTLE_S)


class _SessionGone(Exception):
    """An HTTP server answered 404 for rem's session: it refused the request without running it."""


async def _first(*events: anyio.Event | None) -> None:
    """Return when the first of `events` is set."""
    async with anyio.create_task_group() as tasks:

        async def wait(event: anyio.Event) -> None:
            await event.wait()
            tasks.cancel_scope.cancel()

        for event in events:
            if event is not None:
                tasks.start_soon(wait, event)
