"""Heartbeat comments written straight onto an idle event stream's connection, in the hub's one pass.

An idle stream's heartbeat (`: ping`, every 15 s) used to wake the stream's
own task, which carried two bytes through the async generators of the hub and
the response and every ASGI layer's `send` before uvicorn wrote them: with
1 000 streams, 67 task wakeups a second and nothing to say. The hub's ticker
now writes the comment itself, as one HTTP/1.1 chunk on the connection, for
every stream whose task waits for its next frame (so it is not inside a
`send`, and a comment between two whole events is any SSE client's to skip).
It falls back to waking the stream whenever the direct write is not plainly
safe: not uvicorn's HTTP/1.1 cycle (another server, a test transport), a
response not started or done, a client gone, or the connection's writes paused
(a slow reader: the stream's own `send` waits for it, as before).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.types import Scope, Send

PING = b": ping\n\n"
# where `Metered`, the app's outermost layer, leaves the server's own `send` for the response
SERVER_SEND = "rem.server_send"

Write = Callable[[bytes], bool]


def direct_writer(scope: Scope) -> Write | None:
    """A synchronous write of one body chunk on the request's uvicorn connection, or None.

    The write returns False, writing nothing, whenever the stream's own path must carry it.
    """
    send: Send | None = scope.get(SERVER_SEND)
    cycle: Any = getattr(send, "__self__", None)  # uvicorn's RequestResponseCycle (uvicorn pinned)
    transport, flow = getattr(cycle, "transport", None), getattr(cycle, "flow", None)
    if transport is None or flow is None or not hasattr(cycle, "chunked_encoding"):
        return None

    def write(chunk: bytes) -> bool:
        if (
            cycle.disconnected
            or not cycle.response_started
            or cycle.response_complete
            or not cycle.chunked_encoding  # an event stream has no length: uvicorn sends it chunked
            or flow.write_paused
            or transport.is_closing()
        ):
            return False
        transport.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        return True

    return write


class Pinger:
    """A stream's way to its connection, filled in by its response once it starts (None until then)."""

    def __init__(self) -> None:
        self.write: Write | None = None
