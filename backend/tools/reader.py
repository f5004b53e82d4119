"""The read side of one MCP session as rem hands it to the SDK: listings screened, log floods dropped, its end noted.

rem's transports (its own stdio one, the SDK's streamable HTTP one) yield the
stream of messages the SDK's `ClientSession` reads. `SessionReader` wraps it,
on the session's own read loop (no task, no copy), for three things the SDK
does not do:

* **one bad tool is one refused tool**: the SDK validates a `tools/list`
  answer as a whole, so one tool it cannot read (no name, an `inputSchema`
  that is not an object) would fail the listing and the server's start. Each
  tool of a listing (a result whose `tools` is a list) is validated alone, as
  the SDK would for the session's protocol version; one that fails is taken
  out and recorded in `refused` with why (`backend.tools.registry` shows it);
* **a log flood stops here**: a `notifications/message` the server's
  `LogValve` does not admit is dropped before the SDK spawns a task for it;
* **the end is known**: `closed` is set when the session stops reading (the
  transport ended, or rem closed the session), which the SDK does before it
  fails the calls in flight with "Connection closed". An error with that code
  (-32000) that came while the session still read was the server's answer.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import mcp_types as types
from mcp.client.session import ClientSession
from mcp.shared.message import SessionMessage
from mcp_types import methods
from pydantic import ValidationError

from backend.tools.lines import validation_line
from backend.tools.results import inert
from backend.tools.valve import LogValve

LOG_METHOD = "notifications/message"
NAME_MAX = 200
REFUSED_MAX = 1000  # of one listing, named with why (the rest are left out all the same)


class SessionReader:
    """A `ClientSession`'s read stream over a transport's: tools screened, log lines rate-limited."""

    def __init__(self, inner: Any, valve: LogValve, refused: list[tuple[str, str]]) -> None:
        self.inner = inner
        self.valve = valve
        self.refused = refused  # (tool name, why) of the tools taken out of listings: the caller's list
        self.session: ClientSession | None = None  # set once built: its negotiated version
        self.closed = False

    @property
    def last_context(self) -> Any:
        return getattr(self.inner, "last_context", None)  # the SDK reads the sender's context here

    async def receive(self) -> Any:
        while True:
            item = self._screened(await self.inner.receive())
            if item is not None:
                return item

    def __aiter__(self) -> SessionReader:
        return self

    async def __anext__(self) -> Any:
        while True:
            item = self._screened(await self.inner.__anext__())
            if item is not None:
                return item

    async def aclose(self) -> None:
        self.closed = True
        await self.inner.aclose()

    async def __aenter__(self) -> SessionReader:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def _screened(self, item: Any) -> Any:
        """The item as the session should see it; None to drop it."""
        if not isinstance(item, SessionMessage):
            return item
        message = item.message
        if isinstance(message, types.JSONRPCNotification) and message.method == LOG_METHOD:
            return item if self.valve.admit() else None
        if isinstance(message, types.JSONRPCResponse) and isinstance(message.result.get("tools"), list):
            message.result["tools"] = self._readable_tools(message.result["tools"])
        return item

    def _readable_tools(self, tools: list[Any]) -> list[Any]:
        kept = []
        for tool in tools:
            why = self._tool_problem(tool)
            if why is None:
                kept.append(tool)
                continue
            name = tool.get("name") if isinstance(tool, dict) else None
            shown = inert(name[:NAME_MAX]) if isinstance(name, str) and name else "(no name)"
            if len(self.refused) < REFUSED_MAX:
                self.refused.append((shown, why))
        return kept

    def _tool_problem(self, tool: Any) -> str | None:
        """Why the SDK could not read this one tool, or None when it can."""
        try:
            self._check_surface(tool)
            types.Tool.model_validate(tool, by_name=False)
        except ValidationError as exc:
            return f"is not a valid MCP tool ({validation_line(exc, within=('tools', 0))})"
        return None

    def _check_surface(self, tool: Any) -> None:
        """The check the SDK makes of a listing for the session's protocol version, on this tool alone."""
        version = self.session.protocol_version if self.session is not None else None
        if version is None:
            return
        try:
            methods.validate_server_result("tools/list", version, {"tools": [tool]})
        except ValidationError:
            raise
        except (KeyError, ValueError):  # a version or method the surface does not know: the model's check
            return
