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
  It lives in this process's memory; `on_change` is told each time it may
  have changed (the executor then records it in its worker row, for
  `rem status`: `backend.execution.tool_health`);
* **logged**: a failed start once per streak of them (WARNING: why, and when
  the next start is due), a death after being up each time, the start that
  ends a streak at INFO.

A call (`backend.tools.calls`) sends the idempotency key as
`_meta["rem/idempotency_key"]` and maps every way it can end to a `ToolResult`
or one error of `backend.tools.errors`, keeping "never sent"
(`ToolUnavailable`) apart from "sent, outcome unknown" (`ToolConnectionLost`,
`ToolTimeout`). A caller cancelled while a server starts does not count as a
failure of the server.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import mcp_types as types

from backend.core import clock
from backend.tools.calls import SessionGone, call_tool
from backend.tools.config import ServerConfig
from backend.tools.connection import Connection, list_tools, run_session
from backend.tools.errors import ToolUnavailable
from backend.tools.health import Limits, ServerHealth, ServerState, describe_error
from backend.tools.results import ToolResult

log = logging.getLogger("rem.tools.servers")

BACKOFF_BASE_MS = 500
BACKOFF_MAX_MS = 30_000
STABLE_MS = 10_000
STOP_WAIT_S = 8.0
START_GRACE_S = 5.0  # past the start timeout, for the session's task to report it


class McpServerSource:
    """The tools of one configured MCP server, and the session that reaches them."""

    def __init__(self, config: ServerConfig, limits: Limits) -> None:
        self.name = config.name
        self.config = config
        self.limits = limits
        self.kind = "mcp"
        self._lock = asyncio.Lock()
        self._conn: Connection | None = None
        self._tools: list[types.Tool] | None = None  # the last listing (kept while the server is down)
        self._unreadable: list[tuple[str, str]] = []  # tools of that listing the SDK could not read, and why
        self._state = ServerState.IDLE
        self._since = clock.now_ms()
        self._last_error: str | None = None
        self._starts = 0
        self._failures = 0
        self._retry_at: int | None = None
        self._closed = False
        self._start_failing = False  # a failed start was logged; the next log line is when it comes up
        self.on_change: Callable[[], None] | None = None  # told when the health may have changed

    async def listing(self) -> list[types.Tool]:
        """The server's tools, starting it if needed (raises ToolUnavailable when it cannot be reached)."""
        conn = await self._connection()
        if conn.stale and conn.session is not None:
            conn.tools, conn.stale = await list_tools(conn), False
            self._tools, self._unreadable = conn.tools, list(conn.refused)
        return conn.tools

    def cached_listing(self) -> list[types.Tool] | None:
        return self._tools

    def unreadable_tools(self) -> list[tuple[str, str]]:
        """The tools the last listing held that the SDK could not read: (name, why)."""
        return self._unreadable

    async def call(self, tool: str, arguments: dict[str, Any], key: str, timeout_ms: int) -> ToolResult:
        """Call `tool` once (sent again only when an HTTP server refused an expired session unprocessed)."""
        for _ in range(2):
            conn = await self._connection()
            try:
                result = await call_tool(conn, tool, arguments, key, timeout_ms, self.limits)
            except SessionGone:
                log.info("tool server %s no longer knows rem's session; opening a new one", self.name)
                await conn.close(STOP_WAIT_S)
                continue
            self._failures = 0  # it answered: healthy
            return result
        raise ToolUnavailable(f"tool server {self.name!r} refused rem's new session too", server=self.name)

    def health(self) -> ServerHealth:
        conn = self._conn
        state, since, error = self._state, self._since, self._last_error
        if (
            state == ServerState.UP and conn is not None and not conn.live
        ):  # it died; its task is winding down
            state, error = ServerState.DOWN, conn.describe_end()
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

    async def aclose(self) -> None:
        self._closed = True
        if self._conn is not None:
            await self._conn.close(STOP_WAIT_S)
        self._set_state(ServerState.CLOSED)

    # -- the session's life

    async def _connection(self) -> Connection:
        conn = self._conn
        if conn is not None and conn.live:
            return conn
        async with self._lock:
            conn = self._conn
            if conn is not None and conn.live:
                return conn
            if conn is not None:
                await conn.close(STOP_WAIT_S)
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

    async def _start(self) -> Connection:
        conn = Connection(server=self.name)
        self._conn = conn
        self._starts += 1
        self._set_state(ServerState.STARTING)
        conn.task = asyncio.create_task(run_session(conn, self.config, self.limits, self._died))
        try:
            await asyncio.wait_for(
                asyncio.shield(conn.ready), self.limits.start_timeout_ms / 1000 + START_GRACE_S
            )
        except asyncio.CancelledError:  # the caller gave up: not the server's failure
            await conn.close(STOP_WAIT_S)
            self._set_state(ServerState.IDLE if self._last_error is None else ServerState.DOWN)
            raise
        except Exception as exc:
            await conn.close(STOP_WAIT_S)
            why = conn.error or describe_error(exc, self.limits.start_timeout_ms)
            self._failed(f"cannot start: {why}")
            self._log_start_failure(why)
            raise ToolUnavailable(
                f"tool server {self.name!r} cannot start: {why}", server=self.name
            ) from None
        self._tools, self._unreadable = conn.tools, list(conn.refused)
        self._set_state(ServerState.UP)
        again = " again: it had failed to start" if self._start_failing else ""
        self._start_failing = False
        log.info("tool server %s is up (%d tools)%s", self.name, len(conn.tools), again)
        return conn

    def _log_start_failure(self, why: str) -> None:
        """One line per streak of failed starts: the first says why and when the next start is due."""
        if self._start_failing:
            return
        self._start_failing = True
        wait_s = max(0, (self._retry_at or 0) - clock.now_ms()) / 1000
        log.warning(
            "tool server %s cannot start: %s; its tools are unavailable, next start at its next use "
            "(in %.1f s at the earliest, backing off to %d s while it fails)",
            self.name,
            why,
            wait_s,
            BACKOFF_MAX_MS // 1000,
        )

    # -- health bookkeeping

    def _died(self, conn: Connection) -> None:
        lived = clock.now_ms() - conn.started_at
        if lived >= STABLE_MS:
            self._failures = 0
        why = conn.describe_end()
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
        if self.on_change is not None:
            self.on_change()
