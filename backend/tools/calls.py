"""One `tools/call` on a live session, and what each way it can end means for a durable caller.

The request carries the call's idempotency key as `_meta["rem/idempotency_key"]`;
rem keeps the call's timeout itself (when it runs out the SDK sends
`notifications/cancelled`). Its ending becomes exactly one of:

* a `ToolResult`: the server answered. That includes a tool error (`isError`),
  a JSON-RPC error answer whatever its code (unknown tool, invalid arguments,
  a refusal in the server-error range -32000 to -32099: `error_code` is set,
  the message is the tool's error text), an answer the SDK refused (it broke
  the tool's output schema), and an answer over the message bound (discarded
  unread: a tool error saying so);
* `ToolTimeout`: no answer within the timeout (sent: outcome unknown);
* `ToolConnectionLost`: the connection or the server died after the request
  left, or an HTTP server answered with an error status (outcome unknown);
* `ToolAnswerUnreadable`: the server answered at once with a message rem
  cannot read (not JSON in UTF-8, not an MCP result: `backend.tools.lines`):
  the answer may have been a success, so the outcome is unknown, but nobody
  waits for the timeout to learn it;
* `ToolUnavailable`: the connection died and the transport knows the request
  never reached the server (stdin write failed, TCP connect failed);
* `SessionGone` (internal): an HTTP server answered 404 for rem's session, so
  it refused the request unprocessed; the caller opens a new session and resends.

The SDK reports a lost connection and a timeout as JSON-RPC errors of its own
(codes -32000 and -32001), which a server may send too. So rem does not read
those codes: a timeout is rem's own deadline running out, and a lost
connection is the SDK's "Connection closed" after the session stopped reading
(or its HTTP client's "SSE stream ..." for one request's stream). An error that
came while the session still read is the server's answer.

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
from pydantic import ValidationError

from backend.tools.connection import Connection
from backend.tools.errors import ToolAnswerUnreadable, ToolConnectionLost, ToolTimeout, ToolUnavailable
from backend.tools.health import Limits
from backend.tools.lines import oversize, unreadable, validation_line
from backend.tools.results import ToolResult, bounded_result, call_result_text, inert
from backend.tools.spec import KEY_META

log = logging.getLogger("rem.tools.calls")

SETTLE_S = 3.0
HTTP_STATUS_ERROR = "Server returned an error response"  # the SDK's stand-in for an HTTP error status
SDK_CLOSED = "Connection closed"  # the SDK's own error when the session's stream ended
SDK_STREAM_LOST = ("SSE stream ended", "SSE stream failed")  # its HTTP client's, for one request's stream


class SessionGone(Exception):
    """An HTTP server answered 404 for rem's session: it refused the request without running it."""


async def call_tool(
    conn: Connection, tool: str, arguments: dict[str, Any], key: str, timeout_ms: int, limits: Limits
) -> ToolResult:
    """Send one tools/call on `conn` and map its ending (see the module docstring)."""
    assert conn.session is not None
    ending = _Ending(conn, key, timeout_ms, limits, time.monotonic())
    result: Any = None
    try:
        with anyio.move_on_after(timeout_ms / 1000):  # cancelled, the SDK tells the server so
            result = await conn.session.call_tool(
                tool, arguments, meta=cast(types.RequestParamsMeta, {KEY_META: key})
            )
    except MCPError as exc:
        if ending.lost_link(exc):
            await _settle(conn)
        return ending.of_error(exc)
    except ValidationError as exc:  # an answer that is no MCP result, like `"result": 5` over stdio
        raise ending.unreadable(f"not an MCP tool result ({validation_line(exc)})") from None
    except (RuntimeError, ValueError) as exc:  # the SDK refused a result it read (its output schema)
        return ending.result(f"rem refused the tool's answer: {exc}", True)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        await _settle(conn)
        raise ending.lost() from None
    except Exception as exc:
        log.exception("tool server %s: unexpected failure of a call", conn.server)
        raise ToolConnectionLost(
            f"tool server {conn.server!r} failed the call ({type(exc).__name__})"
        ) from None
    if result is None:
        raise ToolTimeout(
            f"tool server {conn.server!r} did not answer within {timeout_ms} ms (rem asked it to cancel)",
            timeout_ms=timeout_ms,
        )
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

    def lost_link(self, exc: MCPError) -> bool:
        """The SDK's own word that the link ended before an answer, not a server's error answer."""
        code, message, data = exc.error.code, exc.error.message or "", exc.error.data
        if code != types.CONNECTION_CLOSED or data is not None:
            return False
        if message == SDK_CLOSED:
            return self.conn.link_ended
        return self.conn.stdio is None and message.startswith(SDK_STREAM_LOST)

    def of_error(self, exc: MCPError) -> ToolResult:
        code, message, data = exc.error.code, exc.error.message or "", exc.error.data
        server = self.conn.server
        if self.key in self.conn.http.session_gone:
            raise SessionGone()
        if oversize(code, message, data):
            size = self.limits.message_max_bytes
            return self.result(
                f"rem: the tool's answer was over {size} bytes and was discarded unread", True, code
            )
        why = unreadable(code, message, data)
        if why is not None:
            raise ToolAnswerUnreadable(
                f"tool server {server!r} answered with a message rem cannot read ({inert(why)})"
            )
        if self.lost_link(exc):
            raise self.lost()
        if self.conn.stdio is None and code == types.INTERNAL_ERROR and message == HTTP_STATUS_ERROR:
            raise ToolConnectionLost(f"tool server {server!r} answered with an HTTP error status")
        return self.result(f"MCP error {code}: {message}", True, code)

    def unreadable(self, why: str) -> ToolAnswerUnreadable:
        return ToolAnswerUnreadable(
            f"tool server {self.conn.server!r} answered with a message rem cannot read ({inert(why)})"
        )

    def lost(self) -> ToolUnavailable | ToolConnectionLost:
        server, why = self.conn.server, self.conn.describe_end()
        if self.conn.never_sent(self.key):
            return ToolUnavailable(
                f"tool server {server!r} is down ({why}); the call was not sent", server=server
            )
        return ToolConnectionLost(
            f"tool server {server!r} died during the call ({why}); its outcome is unknown"
        )


async def _settle(conn: Connection) -> None:
    """Give a dying stdio server's task a moment to learn how it ended (its exit status) for the error."""
    if conn.lost:
        with suppress(TimeoutError):
            await asyncio.wait_for(conn.ended.wait(), SETTLE_S)
