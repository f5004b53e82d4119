"""One `tools/call` on a live session, and what each way it can end means for a durable caller.

The request carries the call's idempotency key as `_meta["rem/idempotency_key"]`
and the call's timeout (the SDK then sends `notifications/cancelled` when it
runs out). Its ending becomes exactly one of:

* a `ToolResult`: the server answered. That includes a tool error (`isError`),
  a JSON-RPC error answer (unknown tool, invalid arguments: `error_code` is
  set), an answer the SDK refused (it broke the tool's output schema), and an
  answer over the message bound (discarded unread: a tool error saying so);
* `ToolTimeout`: no answer within the timeout (sent: outcome unknown);
* `ToolConnectionLost`: the connection or the server died after the request
  left, or an HTTP server answered with an error status (outcome unknown);
* `ToolUnavailable`: the connection died and the transport knows the request
  never reached the server (stdin write failed, TCP connect failed);
* `SessionGone` (internal): an HTTP server answered 404 for rem's session, so
  it refused the request unprocessed; the caller opens a new session and resends.

Anything unexpected from the SDK after the request may have left is
`ToolConnectionLost` (logged with its traceback), never a raw exception.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import suppress
from typing import Any, cast

import anyio
import mcp_types as types
from mcp.shared.exceptions import MCPError

from backend.tools.connection import Connection
from backend.tools.errors import ToolConnectionLost, ToolTimeout, ToolUnavailable
from backend.tools.health import Limits
from backend.tools.lines import OVERSIZE_CODE, OVERSIZE_KEY
from backend.tools.results import ToolResult, bounded_result, call_result_text
from backend.tools.spec import KEY_META

log = logging.getLogger("rem.tools.calls")

SETTLE_S = 3.0
HTTP_STATUS_ERROR = "Server returned an error response"  # the SDK's stand-in for an HTTP error status


class SessionGone(Exception):
    """An HTTP server answered 404 for rem's session: it refused the request without running it."""


async def call_tool(
    conn: Connection, tool: str, arguments: dict[str, Any], key: str, timeout_ms: int, limits: Limits
) -> ToolResult:
    """Send one tools/call on `conn` and map its ending (see the module docstring)."""
    assert conn.session is not None
    started = time.monotonic()
    ending = _Ending(conn, key, timeout_ms, limits, started)
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
        return ending.of_error(exc)
    except (RuntimeError, ValueError) as exc:  # the SDK refused an answer the server did send
        return ending.result(f"rem refused the tool's answer: {exc}", True)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        await _settle(conn)
        raise ending.lost() from None
    except Exception as exc:
        log.exception("tool server %s: unexpected failure of a call", conn.server)
        raise ToolConnectionLost(
            f"tool server {conn.server!r} failed the call ({type(exc).__name__})"
        ) from None
    return ending.result(call_result_text(result), bool(result.is_error))


class _Ending:
    """Builds the ToolResult or the error for one call's ending."""

    def __init__(self, conn: Connection, key: str, timeout_ms: int, limits: Limits, started: float) -> None:
        self.conn = conn
        self.key = key
        self.timeout_ms = timeout_ms
        self.limits = limits
        self.started = started

    def result(self, text: str, is_error: bool, code: int | None = None) -> ToolResult:
        return bounded_result(
            text,
            is_error=is_error,
            max_bytes=self.limits.result_max_bytes,
            duration_ms=(time.monotonic() - self.started) * 1000,
            error_code=code,
        )

    def of_error(self, exc: MCPError) -> ToolResult:
        code, message, data = exc.error.code, exc.error.message or "", exc.error.data
        server = self.conn.server
        if self.key in self.conn.http.session_gone:
            raise SessionGone()
        if code == types.REQUEST_TIMEOUT:
            raise ToolTimeout(
                f"tool server {server!r} did not answer within {self.timeout_ms} ms (rem asked it to cancel)",
                timeout_ms=self.timeout_ms,
            )
        if _oversize(code, message, data):
            size = self.limits.message_max_bytes
            return self.result(
                f"rem: the tool's answer was over {size} bytes and was discarded unread", True, code
            )
        if code == types.CONNECTION_CLOSED:
            raise self.lost()
        if code == types.INTERNAL_ERROR and message == HTTP_STATUS_ERROR:
            raise ToolConnectionLost(f"tool server {server!r} answered with an HTTP error status")
        return self.result(f"MCP error {code}: {message}", True, code)

    def lost(self) -> ToolUnavailable | ToolConnectionLost:
        server, why = self.conn.server, self.conn.describe_end()
        if self.conn.never_sent(self.key):
            return ToolUnavailable(
                f"tool server {server!r} is down ({why}); the call was not sent", server=server
            )
        return ToolConnectionLost(
            f"tool server {server!r} died during the call ({why}); its outcome is unknown"
        )


def _oversize(code: int, message: str, data: Any) -> bool:
    """The answer was over the message bound: rem's stdio reader, its JSON cap, or the SDK's SSE event cap."""
    return (
        (code == OVERSIZE_CODE and isinstance(data, dict) and OVERSIZE_KEY in data)
        or OVERSIZE_KEY in message
        or (code == types.CONNECTION_CLOSED and "byte limit" in message)
    )


async def _settle(conn: Connection) -> None:
    """Give a dying stdio server's task a moment to learn how it ended (its exit status) for the error."""
    if conn.lost:
        with suppress(TimeoutError):
            await asyncio.wait_for(conn.ended.wait(), SETTLE_S)
